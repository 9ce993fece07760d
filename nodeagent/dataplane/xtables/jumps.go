package xtables

import (
	"context"
	"fmt"
)

// Jump is a rule in a built-in chain that sends packets into one of a
// dataplane's chains. Jumps are not part of a restore input: a restore
// would have to own (and so flush) PREROUTING, INPUT and the rest, which
// belong to everyone on the node. They are ensured one by one instead,
// idempotently, at the top of the built-in chain so that a later
// "-A INPUT -j DROP" from a host firewall cannot shadow them.
type Jump struct {
	Table, From, To string
	// Match comes before the comment; nil for every packet.
	Match   []string
	Comment string
}

// Rule returns the rule's arguments as iptables takes them.
func (j Jump) Rule() []string {
	out := append([]string{}, j.Match...)
	return append(out, "-m", "comment", "--comment", j.Comment, "-j", j.To)
}

// EnsureJumps installs every jump with r, in order: each goes to position
// 1, so in the kernel they end up in reverse order. The chains jumped to
// must exist (a restore created them) or the kernel refuses the jump.
// Idempotent.
func EnsureJumps(ctx context.Context, r Runner, jumps []Jump) error {
	for _, j := range jumps {
		if err := r.EnsureRule(ctx, j.Table, j.From, j.Rule()...); err != nil {
			return fmt.Errorf("ensuring %s %s jumps to %s: %w", j.Table, j.From, j.To, err)
		}
	}
	return nil
}
