package status

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	"github.com/proxyplane/proxyplane/internal/cli"
)

// Main runs `controlplane status` with args (those after "status") and
// returns its exit status: 0 when at least one replica answered, 1 when
// none did or the report could not be printed, 2 on a flag mistake.
// Replicas that did not answer are named on stderr.
func Main(ctx context.Context, args []string, version string, stdout, stderr io.Writer) int {
	o := NewOptions()
	fs := pflag.NewFlagSet("controlplane status", pflag.ContinueOnError)
	o.AddFlags(fs)
	if exit, code := cli.Parse(fs, args, version, stdout, stderr); exit {
		return code
	}
	if err := o.Validate(); err != nil {
		return cli.Usage(fs, stderr, fmt.Errorf("invalid flags:\n%w", err))
	}
	if err := run(ctx, o, stdout, stderr); err != nil {
		_, _ = fmt.Fprintf(stderr, "controlplane status: %v\n", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, o *Options, stdout, stderr io.Writer) error {
	replies, err := Query(ctx, o)
	if err != nil {
		return err
	}
	rep := Merge(replies)
	rep.Changes = rep.Changes[:min(len(rep.Changes), o.Changes)]
	for _, r := range rep.Replicas {
		if r.Error != "" {
			// The error carries the replica's own status message:
			// made terminal-safe as the table's cells are.
			_, _ = fmt.Fprintf(stderr, "controlplane status: replica %s did not answer: %s\n", adminclient.Cell(r.Address), adminclient.Cell(r.Error))
		}
	}
	if rep.Answered() == 0 {
		return errNoReplica
	}
	if rep.Answered() < len(rep.Replicas) {
		_, _ = fmt.Fprintln(stderr, "controlplane status: nodes shown not connected may be connected to a replica that did not answer")
	}
	if o.Output == adminclient.OutputJSON {
		return WriteJSON(stdout, rep)
	}
	return WriteTable(stdout, rep)
}
