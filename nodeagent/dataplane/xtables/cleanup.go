package xtables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ChainPrefix starts the name of every chain a proxyplane dataplane
// creates: PP-SERVICES, PP-SVC-..., PP-IPVS-.... Nothing else on a node
// uses it (kube-proxy's are KUBE-), so cleanup can take all of them.
const ChainPrefix = "PP-"

// Cleanup removes from r's nat and filter tables every chain named with
// ChainPrefix and every rule of another chain that jumps to one, in one
// restore per table: the jumps go first, then the chains are flushed (so
// that none still refers to another) and deleted. A node without them is
// left as it is. Idempotent.
func Cleanup(ctx context.Context, r Runner) error {
	var in bytes.Buffer
	for _, table := range []string{"nat", "filter"} {
		out, err := r.Save(ctx, table)
		if err != nil {
			return fmt.Errorf("listing %s: %w", table, err)
		}
		jumps, chains := ours(out)
		if len(jumps)+len(chains) == 0 {
			continue
		}
		fmt.Fprintf(&in, "*%s\n", table)
		for _, j := range jumps {
			in.WriteString(j + "\n")
		}
		for _, c := range chains {
			fmt.Fprintf(&in, ":%s - [0:0]\n", c)
		}
		for _, c := range chains {
			fmt.Fprintf(&in, "-X %s\n", c)
		}
		in.WriteString("COMMIT\n")
	}
	if in.Len() == 0 {
		return nil
	}
	// --noflush: the tables hold everyone else's rules.
	return r.Restore(ctx, in.Bytes(), "--noflush")
}

// ours reads an iptables-save listing of one table: the rules of other
// chains that jump to a proxyplane chain, as -D lines, and the proxyplane
// chains, sorted.
func ours(save []byte) (jumps, chains []string) {
	for line := range strings.SplitSeq(string(save), "\n") {
		switch {
		case strings.HasPrefix(line, ":"+ChainPrefix):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				chains = append(chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || strings.HasPrefix(f[1], ChainPrefix) {
				continue // a chain of ours goes whole
			}
			if i := slices.IndexFunc(f, func(s string) bool { return s == "-j" || s == "-g" }); i >= 0 && i+1 < len(f) && strings.HasPrefix(f[i+1], ChainPrefix) {
				jumps = append(jumps, "-D"+line[2:])
			}
		}
	}
	slices.Sort(chains)
	return jumps, chains
}

// CleanupAll runs Cleanup with every runner: an earlier run may have used
// either backend. It returns every failure, joined.
func CleanupAll(ctx context.Context, runners map[Backend]Runner) error {
	var errs []error
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		if r := runners[b]; r != nil {
			if err := Cleanup(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("%s iptables: %w", b, err))
			}
		}
	}
	return errors.Join(errs...)
}
