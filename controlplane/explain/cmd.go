package explain

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	"github.com/proxyplane/proxyplane/internal/cli"
)

// errNoReplica is Pick's error when no replica was asked.
var errNoReplica = errors.New("no replica answered")

// Main runs `controlplane explain` with args (those after "explain") and
// returns its exit status: 0 when a replica explained, 1 when none did
// (the node or Service unknown, the caller without rights, no replica
// reachable) or the answer could not be printed, 2 on a flag mistake.
func Main(ctx context.Context, args []string, version string, stdout, stderr io.Writer) int {
	o := NewOptions()
	fs := pflag.NewFlagSet("controlplane explain", pflag.ContinueOnError)
	o.AddFlags(fs)
	if exit, code := cli.Parse(fs, args, version, stdout, stderr); exit {
		return code
	}
	if err := o.Validate(); err != nil {
		return cli.Usage(fs, stderr, fmt.Errorf("invalid flags:\n%w", err))
	}
	if err := run(ctx, o, stdout, stderr); err != nil {
		// The error carries a replica's own status message: made
		// terminal-safe as everything printed is.
		_, _ = fmt.Fprintf(stderr, "controlplane explain: %s\n", adminclient.Cell(err.Error()))
		return 1
	}
	return 0
}

func run(ctx context.Context, o *Options, stdout, stderr io.Writer) error {
	replies, err := Query(ctx, o)
	if err != nil {
		return err
	}
	r := Pick(replies)
	if r.Err != nil {
		return r.Err
	}
	for _, other := range replies {
		if other.Err != nil && !decisive(other.Err) {
			_, _ = fmt.Fprintf(stderr, "controlplane explain: replica %s did not answer: %s\n", adminclient.Cell(other.Replica), adminclient.Cell(other.Err.Error()))
		}
	}
	if !r.Resp.GetConnected() && len(replies) > 1 {
		_, _ = fmt.Fprintln(stderr, "controlplane explain: the node's agent is connected to none of the replicas that answered: what it acknowledged is as last seen by this one")
	}
	if o.Output == adminclient.OutputJSON {
		return WriteJSON(stdout, r)
	}
	return WriteText(stdout, r)
}
