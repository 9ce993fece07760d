package contract

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/procfs"
)

// ChildOptions are a child process's options.
type ChildOptions interface {
	AddFlags(fs *pflag.FlagSet)
	Validate() error
	// Limits returns how many connections the process holds at most and
	// how long it may live.
	Limits() (conns int, lifetime time.Duration)
}

// StartChild readies a child process: it parses args into o, checks them,
// raises the open-files limit to hold o's connections (plus headroom for
// the runtime and the control endpoint), and bounds ctx by o's lifetime.
func StartChild(ctx context.Context, name string, args []string, o ChildOptions) (context.Context, context.CancelFunc, error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("parsing flags: %w", err)
	}
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	conns, lifetime := o.Limits()
	if err := procfs.RaiseNoFile(uint64(conns) + 4096); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	return ctx, cancel, nil
}
