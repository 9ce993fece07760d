package adminclient

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/certs"
)

// Output formats.
const (
	OutputTable = "table"
	OutputJSON  = "json"
)

// Options are the flags every admin command shares: how to reach and
// trust the replicas, and the output format.
type Options struct {
	// Servers are the replicas' gRPC addresses (host:port).
	Servers []string
	// CAFile is the PEM bundle the replicas' serving certificates chain
	// to: the ConfigMap proxyplane-ca the control plane publishes.
	CAFile string
	// ServerName is the name the serving certificates must carry. The
	// replicas are dialled by pod address, which their certificates do
	// not name, so the Service's name is checked instead, as grpcurl's
	// -authority does.
	ServerName string
	// TokenFile holds a bearer token whose user may list EndpointSlices
	// in every namespace, which the admin RPCs require.
	TokenFile string
	// Insecure dials in plaintext, for control planes run with
	// --insecure (tests only); no token is sent.
	Insecure bool
	// Timeout bounds each replica's dial and answer.
	Timeout time.Duration
	// Output is OutputTable or OutputJSON.
	Output string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		// deploy/'s namespace, whose Service name every bootstrapped
		// certificate carries.
		ServerName: certs.ServerName("proxyplane-system"),
		// Long enough for a TLS handshake and a TokenReview on a busy
		// API server; short enough that one replica that does not answer
		// does not hold up the report for long (they are asked at once).
		Timeout: 10 * time.Second,
		Output:  OutputTable,
	}
}

// AddFlags adds the flags to fs. outputHelp describes --output's formats
// as the command prints them.
func (o *Options) AddFlags(fs *pflag.FlagSet, outputHelp string) {
	fs.StringSliceVar(&o.Servers, "server", o.Servers, "A control plane replica's gRPC address (host:port); repeat it, or separate with commas, to list every replica.")
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "CA bundle (PEM) the replicas' certificates chain to: ConfigMap proxyplane-ca's ca.crt.")
	fs.StringVar(&o.ServerName, "server-name", o.ServerName, "Name the replicas' serving certificates must carry.")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "File holding a bearer token whose user may list EndpointSlices in all namespaces.")
	fs.BoolVar(&o.Insecure, "insecure", o.Insecure, "Dial in plaintext without a token, for control planes run with --insecure (tests only).")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "Time allowed to each replica to answer.")
	fs.StringVarP(&o.Output, "output", "o", o.Output, outputHelp)
}

// Validate reports every flag mistake at once.
func (o *Options) Validate() error {
	var errs []error
	if len(o.Servers) == 0 {
		errs = append(errs, errors.New("--server: at least one replica address is required"))
	}
	for _, s := range o.Servers {
		if s == "" {
			errs = append(errs, errors.New("--server: empty address"))
		}
	}
	switch {
	case o.Insecure && (o.CAFile != "" || o.TokenFile != ""):
		errs = append(errs, errors.New("--insecure: a token is never sent in plaintext; drop --ca-file and --token-file"))
	case !o.Insecure && (o.CAFile == "" || o.TokenFile == ""):
		errs = append(errs, errors.New("--ca-file and --token-file are required (or --insecure against an insecure control plane)"))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout: %s is not positive", o.Timeout))
	}
	if o.Output != OutputTable && o.Output != OutputJSON {
		errs = append(errs, fmt.Errorf("--output: %q is neither %s nor %s", o.Output, OutputTable, OutputJSON))
	}
	return errors.Join(errs...)
}
