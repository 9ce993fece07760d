package certs

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// FileCheckInterval is how often, at most, FileSource looks at its files:
// a rotated certificate is served within seconds, and a busy handshake
// path reads two small files no more than once per interval.
const FileCheckInterval = 5 * time.Second

// FileSource serves a certificate and key read from files, and reloads
// them when their content changes. It checks on a handshake, at most once
// per interval, so an idle server does no work and needs no goroutine.
// Content is compared rather than modification times: a kubelet-updated
// Secret volume swaps a symlink, and two quick rewrites can share a
// timestamp.
type FileSource struct {
	certFile, keyFile string
	interval          time.Duration
	log               *slog.Logger
	now               func() time.Time

	cert atomic.Pointer[tls.Certificate]
	// next is when the files are due to be checked again, in UnixNano.
	next atomic.Int64
	// mu serializes reloads; a handshake that finds a reload under way
	// serves the current certificate instead of waiting.
	mu sync.Mutex
	// certPEM and keyPEM are the contents cert was built from; mu
	// protects them.
	certPEM, keyPEM []byte
}

// NewFileSource loads certFile and keyFile, failing if they do not hold a
// matching certificate and key: a bad file at start is a configuration
// error, while a bad file later (a rotation half written) keeps the last
// good certificate.
func NewFileSource(certFile, keyFile string, log *slog.Logger) (*FileSource, error) {
	return newFileSource(certFile, keyFile, FileCheckInterval, time.Now, log)
}

func newFileSource(certFile, keyFile string, interval time.Duration, now func() time.Time, log *slog.Logger) (*FileSource, error) {
	s := &FileSource{certFile: certFile, keyFile: keyFile, interval: interval, now: now, log: log}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.reloadLocked(); err != nil {
		return nil, err
	}
	s.next.Store(now().Add(interval).UnixNano())
	return s, nil
}

// GetCertificate returns the current certificate, for
// tls.Config.GetCertificate. It is safe for concurrent use and never
// fails once the source is built.
func (s *FileSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := s.now()
	if now.UnixNano() >= s.next.Load() && s.mu.TryLock() {
		s.next.Store(now.Add(s.interval).UnixNano())
		if changed, err := s.reloadLocked(); err != nil {
			s.log.Warn("keeping the current serving certificate: reloading it failed", "err", err)
		} else if changed {
			s.log.Info("serving certificate reloaded", "certFile", s.certFile, "notAfter", s.cert.Load().Leaf.NotAfter)
		}
		s.mu.Unlock()
	}
	return s.cert.Load(), nil
}

// reloadLocked reads both files and, if either changed, parses them and
// publishes the new certificate. s.mu must be held.
func (s *FileSource) reloadLocked() (changed bool, err error) {
	certPEM, err := os.ReadFile(s.certFile)
	if err != nil {
		return false, fmt.Errorf("reading certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(s.keyFile)
	if err != nil {
		return false, fmt.Errorf("reading private key: %w", err)
	}
	if bytes.Equal(certPEM, s.certPEM) && bytes.Equal(keyPEM, s.keyPEM) {
		return false, nil
	}
	// X509KeyPair checks that the key matches the certificate, so a
	// rotation caught between its two writes is refused, not served.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("loading %s and %s: %w", s.certFile, s.keyFile, err)
	}
	s.certPEM, s.keyPEM = certPEM, keyPEM
	s.cert.Store(&cert)
	return true, nil
}
