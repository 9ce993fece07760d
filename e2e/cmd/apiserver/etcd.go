package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd starts a single-member etcd with its data in dataDir and waits
// until it serves clients. The caller must Close the result.
func startEtcd(ctx context.Context, dataDir string, clientPort, peerPort int) (*embed.Etcd, error) {
	clientURL := loopbackURL(clientPort)
	peerURL := loopbackURL(peerPort)

	cfg := embed.NewConfig()
	cfg.Name = "e2e"
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// etcd's info logs would drown kube-apiserver's in the shared stderr;
	// warnings still show a slow disk or a failed member.
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd in %s: %w", dataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed while starting: %w", err)
	case <-ctx.Done():
		// StartEtcd returns before the member has joined its cluster; a
		// member that never does (say, a corrupt data dir) would otherwise
		// block here forever.
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("waiting for etcd to be ready: %w", context.Cause(ctx))
	}
}

func loopbackURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

// freeLoopbackPort asks the kernel for an unused port on 127.0.0.1. etcd
// binds its own listeners from URLs, so the port is released before etcd
// takes it; nothing else on a test machine races for ephemeral ports often
// enough for that to matter, and a loss shows as a clear bind error.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("releasing port %d: %w", port, err)
	}
	return port, nil
}
