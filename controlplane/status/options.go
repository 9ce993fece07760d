package status

import (
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
)

// Options are `controlplane status`'s flags.
type Options struct {
	// Options holds the flags every admin command shares: how to reach
	// and trust the replicas, and the output format.
	adminclient.Options
	// Changes is how many of the latest changes to show, with how far
	// each has converged; 0 shows none.
	Changes int
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Options: *adminclient.NewOptions(),
		// A screenful with the node table; a larger value for more, in
		// either output (each replica keeps its latest 64).
		Changes: 5,
	}
}

// AddFlags adds the flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.Options.AddFlags(fs, "Output format: table or json.")
	fs.IntVar(&o.Changes, "changes", o.Changes, "How many of the latest changes to the Services to show, with how far each has reached the agents (0: none).")
}

// Validate reports every flag mistake at once.
func (o *Options) Validate() error {
	var errs []error
	if err := o.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.Changes < 0 {
		errs = append(errs, fmt.Errorf("--changes: %d is negative", o.Changes))
	}
	return errors.Join(errs...)
}
