package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
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

// NewCA generates a self-signed CA with an ECDSA P-256 key (small, fast
// to verify, supported by every TLS stack the agents and grpcurl use),
// valid for client-go's ten years.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	crt, err := cert.NewSelfSignedCACert(cert.Config{CommonName: commonName, NotBefore: time.Now().Add(-backdate)}, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
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

// ParseCA parses a CA certificate and key and checks that they belong
// together, that the certificate may sign others, and that it is valid
// at now.
func ParseCA(certPEM, keyPEM []byte, now time.Time) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate and key: %w", err)
	}
	crt := pair.Leaf
	if !crt.IsCA || crt.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("the certificate is not a CA that may sign certificates")
	}
	if now.Before(crt.NotBefore) || !now.Before(crt.NotAfter) {
		return nil, fmt.Errorf("the CA certificate is valid from %s to %s, not now", crt.NotBefore, crt.NotAfter)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("the CA key (%T) cannot sign", pair.PrivateKey)
	}
	return &CA{Cert: crt, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

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
