package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// backdate is how far before now a certificate starts: a node whose clock
// is a little behind this replica's must not see a certificate from the
// future.
const backdate = 5 * time.Minute

// CA is a certificate authority: its certificate and key, and their PEM.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// CAValidity is the lifetime of a CA the control plane creates. Its key
// sits in a Secret, and whoever reads it can pose as the control plane to
// every agent until the CA leaves the agents' bundle: the lifetime bounds
// that. The control plane rotates its own CA automatically, with an
// overlap, once two thirds of it have passed (rotateCAAt), so a year means
// a rotation about every eight months with four months to spare for a
// control plane that is down when it falls due; a shorter lifetime would
// add rotations without shortening the exposure of a key that leaks
// (rotate at once then: deploy/README.md). It is the lifetime kubeadm and
// the kubelet give their certificates; client-go's ten years suit a CA
// that is rotated by hand.
const CAValidity = 365 * 24 * time.Hour

// NewCA generates a self-signed CA with an ECDSA P-256 key (small, fast
// to verify, supported by every TLS stack the agents and grpcurl use),
// valid for CAValidity from now.
func NewCA(commonName string) (*CA, error) {
	return newCA(commonName, time.Now(), CAValidity)
}

func newCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	// As client-go's cert.NewSelfSignedCACert, with a bounded lifetime.
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageKeyEncipherment | x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	crt, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	certPEM, err := cert.EncodeCertificates(crt)
	if err != nil {
		return nil, fmt.Errorf("encoding CA certificate: %w", err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, fmt.Errorf("encoding CA key: %w", err)
	}
	return &CA{Cert: crt, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCA parses a CA certificate and key and checks, before anything is
// signed with them or published for agents to trust, that:
//
//   - the key belongs to the certificate;
//   - the certificate is a CA (basic constraints, IsCA), not a leaf, and
//     its key usage includes CertSign;
//   - its extended key usage, if it has one, allows serving
//     certificates: agents would refuse every chain through it otherwise;
//   - a self-signed certificate's signature holds;
//   - the key is not weak (RSA under 2048 bits, an unusual curve);
//   - it is valid at now.
//
// A Secret planted before the install, or edited since, is used only if
// it passes every check.
func ParseCA(certPEM, keyPEM []byte, now time.Time) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate and key: %w", err)
	}
	crt := pair.Leaf
	if err := checkCACert(crt, now); err != nil {
		return nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("the CA key (%T) cannot sign", pair.PrivateKey)
	}
	return &CA{Cert: crt, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCACert parses a CA certificate without its key (a retired CA kept
// in the bundle) and makes ParseCA's checks on it.
func ParseCACert(certPEM []byte, now time.Time) (*x509.Certificate, error) {
	crts, err := cert.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	if len(crts) != 1 {
		return nil, fmt.Errorf("%d certificates, want one", len(crts))
	}
	if err := checkCACert(crts[0], now); err != nil {
		return nil, err
	}
	return crts[0], nil
}

func checkCACert(crt *x509.Certificate, now time.Time) error {
	if !crt.BasicConstraintsValid || !crt.IsCA {
		return errors.New("the certificate is not a CA (a leaf, or no basic constraints)")
	}
	if crt.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("the CA certificate's key usage does not include CertSign")
	}
	if len(crt.ExtKeyUsage) > 0 && !slices.Contains(crt.ExtKeyUsage, x509.ExtKeyUsageServerAuth) && !slices.Contains(crt.ExtKeyUsage, x509.ExtKeyUsageAny) {
		return errors.New("the CA certificate's extended key usage does not allow serving certificates (ServerAuth)")
	}
	if bytes.Equal(crt.RawSubject, crt.RawIssuer) {
		if err := crt.CheckSignatureFrom(crt); err != nil {
			return fmt.Errorf("the self-signed CA certificate's signature does not hold: %w", err)
		}
	}
	switch k := crt.PublicKey.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("the CA key is RSA of %d bits, want 2048 or more", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if c := k.Curve; c != elliptic.P256() && c != elliptic.P384() && c != elliptic.P521() {
			return fmt.Errorf("the CA key is on curve %s, want P-256, P-384 or P-521", c.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("the CA key is of unsupported type %T", crt.PublicKey)
	}
	if now.Before(crt.NotBefore) || !now.Before(crt.NotAfter) {
		return fmt.Errorf("%w: the CA certificate is valid from %s to %s", errCAExpired, crt.NotBefore.UTC().Format(time.RFC3339), crt.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// errCAExpired marks a CA that passes every check but its validity.
var errCAExpired = errors.New("the CA is not valid now")

// Issue signs a serving certificate for dnsNames and ips, valid from
// a little before now for validity, or until the CA expires if sooner.
// Its chain holds the leaf only: agents trust the CA itself.
func (ca *CA) Issue(dnsNames []string, ips []net.IP, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing serving certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
