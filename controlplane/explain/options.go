package explain

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Options are `controlplane explain`'s flags: those every admin command
// shares (how to reach and trust the replicas, the output format), and
// what to explain.
type Options struct {
	adminclient.Options
	// Node is the node whose table is explained.
	Node string
	// Service is "namespace/name".
	Service string
	// Port selects one port by name or number (port or node port); empty
	// for every port.
	Port string
	// From is a client IP address to check against
	// loadBalancerSourceRanges; empty for none.
	From string
}

// NewOptions returns the defaults.
func NewOptions() *Options { return &Options{Options: *adminclient.NewOptions()} }

// AddFlags adds the flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs, "Output format: table (for a person) or json.")
	fs.StringVar(&o.Node, "node", o.Node, "Node whose table to explain.")
	fs.StringVar(&o.Service, "service", o.Service, "Service to explain, as namespace/name.")
	fs.StringVar(&o.Port, "port", o.Port, "One port of the Service, by name or number (its port or node port); all ports when unset.")
	fs.StringVar(&o.From, "from", o.From, "A client IP address: say whether loadBalancerSourceRanges let it reach the load balancer IPs.")
}

// Validate reports every flag mistake at once.
func (o *Options) Validate() error {
	var errs []error
	if err := o.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.Node == "" {
		errs = append(errs, errors.New("--node is required"))
	}
	if ns, name, ok := strings.Cut(o.Service, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		errs = append(errs, fmt.Errorf("--service: %q is not namespace/name", o.Service))
	}
	if o.From != "" {
		if _, err := netip.ParseAddr(o.From); err != nil {
			errs = append(errs, fmt.Errorf("--from: %q is not an IP address", o.From))
		}
	}
	return errors.Join(errs...)
}

// Request is the Explain request the flags describe. Call it after
// Validate.
func (o *Options) Request() *pb.ExplainRequest {
	ns, name, _ := strings.Cut(o.Service, "/")
	return &pb.ExplainRequest{NodeName: o.Node, Namespace: ns, Name: name, Port: o.Port, From: o.From}
}
