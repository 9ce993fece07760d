package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// identity is one static-token user of the test cluster.
type identity struct {
	user   string
	uid    string
	groups string // comma-separated, as the token file wants it
	token  string
}

const (
	adminUser = "admin"
	// controlplaneUser belongs to no privileged group, so only RBAC objects
	// that a test or deploy/ creates decide what the control plane may do.
	controlplaneUser = "proxyplane-controlplane"
)

// ensureTokens returns the admin and controlplane identities, creating the
// token file on first start. A restart must reuse the tokens: kubeconfig
// files handed out before the restart hold them.
func ensureTokens(path string) (admin, controlplane identity, err error) {
	ids, err := readTokens(path)
	if errors.Is(err, fs.ErrNotExist) {
		ids, err = writeTokens(path)
	}
	if err != nil {
		return identity{}, identity{}, err
	}
	for _, id := range ids {
		switch id.user {
		case adminUser:
			admin = id
		case controlplaneUser:
			controlplane = id
		}
	}
	if admin.token == "" || controlplane.token == "" {
		return identity{}, identity{}, fmt.Errorf("token file %s lacks %q or %q: remove it to regenerate", path, adminUser, controlplaneUser)
	}
	return admin, controlplane, nil
}

func readTokens(path string) ([]identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening token file: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	records, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading token file %s: %w", path, err)
	}
	ids := make([]identity, 0, len(records))
	for _, rec := range records {
		if len(rec) < 3 {
			return nil, fmt.Errorf("token file %s: record %q has fewer than 3 fields", path, rec)
		}
		id := identity{token: rec[0], user: rec[1], uid: rec[2]}
		if len(rec) > 3 {
			id.groups = rec[3]
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func writeTokens(path string) ([]identity, error) {
	ids := []identity{
		{user: adminUser, uid: "e2e-admin", groups: "system:masters"},
		{user: controlplaneUser, uid: "e2e-proxyplane-controlplane"},
	}
	records := make([][]string, 0, len(ids))
	for i := range ids {
		token, err := randomToken()
		if err != nil {
			return nil, err
		}
		ids[i].token = token
		rec := []string{token, ids[i].user, ids[i].uid}
		if ids[i].groups != "" {
			rec = append(rec, ids[i].groups)
		}
		records = append(records, rec)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating token file: %w", err)
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(records); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("writing token file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("closing token file %s: %w", path, err)
	}
	return ids, nil
}

func randomToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// ensureServiceAccountKey creates the key that signs service-account
// tokens on first start and keeps it afterwards, so tokens issued before a
// restart stay valid. kube-apiserver derives the verifying public key from
// the same private-key file.
func ensureServiceAccountKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checking service-account key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding service-account key: %w", err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing service-account key: %w", err)
	}
	return nil
}

// writeKubeconfig writes a kubeconfig for id that trusts the serving
// certificate in caFile. It is rewritten on every start because the URL
// changes when the ports are picked afresh.
func writeKubeconfig(path, serverURL, caFile string, id identity) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("reading serving certificate: %w", err)
	}
	const name = "e2e"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: ca}
	cfg.AuthInfos[id.user] = &clientcmdapi.AuthInfo{Token: id.token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: id.user}
	cfg.CurrentContext = name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}
