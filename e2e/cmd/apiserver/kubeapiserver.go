package main

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// serviceAccountIssuer is the issuer a real cluster uses by default; no
// test depends on its value, but kube-apiserver requires one.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// apiServerFiles are the files under --dir that kube-apiserver reads.
type apiServerFiles struct {
	certDir   string
	tokenFile string
	saKeyFile string
}

// apiServer is a configured kube-apiserver, not yet running.
type apiServer struct {
	opts options.CompletedOptions
	// caFile is the self-signed serving certificate (with its CA) that
	// clients must trust.
	caFile string
}

// newAPIServer configures kube-apiserver exactly as its own command does
// (kube-apiserver's NewAPIServerCommand), but without that command's
// signal handler, which may be installed only once per process and would
// exit before etcd is closed. It serves on ln, which the caller opened so
// that a free port is never released and re-bound.
func newAPIServer(ctx context.Context, ln net.Listener, etcdURL, serviceCIDR string, files apiServerFiles, extraArgs []string) (*apiServer, error) {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		// Left unset, the advertise address is the host's default-route
		// address, and start fails on a machine with no default route.
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// Certificates are generated here on first start and reused after,
		// so kubeconfig files stay valid across a restart.
		"--cert-dir=" + files.certDir,
		"--token-auth-file=" + files.tokenFile,
		// RBAC alone: the controlplane user must be allowed by RBAC objects
		// or not at all, as in a real cluster.
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + files.saKeyFile,
		"--service-account-signing-key-file=" + files.saKeyFile,
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-cluster-ip-range=" + serviceCIDR,
		// The endpoint reconciler would publish the advertise address,
		// 127.0.0.1, as the kubernetes Service's endpoint, which endpoint
		// validation rejects as loopback; nothing here needs that endpoint.
		"--endpoint-reconciler-type=none",
	}
	if err := fs.Parse(append(args, extraArgs...)); err != nil {
		return nil, fmt.Errorf("parsing kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln

	// The same steps, in the same order, as the command's PersistentPreRunE
	// and RunE.
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("setting kube-apiserver component globals: %w", err)
	}
	// kube-apiserver's loopback clients would log its own deprecation
	// warnings back at it.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	featureGate := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := logsapi.ValidateAndApply(s.Logs, featureGate); err != nil {
		return nil, fmt.Errorf("applying kube-apiserver logging options: %w", err)
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("completing kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("validating kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	return &apiServer{opts: completed, caFile: s.SecureServing.ServerCert.CertKey.CertFile}, nil
}

// run serves until ctx is done, then shuts down and returns.
func (a *apiServer) run(ctx context.Context) error {
	if err := app.Run(ctx, a.opts); err != nil {
		return fmt.Errorf("running kube-apiserver: %w", err)
	}
	return nil
}
