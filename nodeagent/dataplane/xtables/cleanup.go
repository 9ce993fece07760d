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
// uses it (kube-proxy's are KUBE-), so cleanup can recognise all of them.
const ChainPrefix = "PP-"

// IPVSChainPrefix starts the name of every chain of the IPVS dataplane;
// the iptables dataplane's are the other ChainPrefix chains. The split
// lets an agent switching between the two modes remove the other mode's
// chains and none of its own.
const IPVSChainPrefix = "PP-IPVS-"

// Owner tells whether a chain is one a cleanup removes: a dataplane's
// own, by name.
type Owner func(chain string) bool

// Cleanup removes from r's nat and filter tables every chain owns
// accepts and every rule of another chain that jumps to one, in one
// restore: the jumps go first, then the chains are flushed (so that none
// still refers to another) and deleted. It leaves every other chain and
// rule as it is, other proxyplane chains included, and a node without
// such chains untouched. Idempotent.
func Cleanup(ctx context.Context, r Runner, owns Owner) error {
	var in bytes.Buffer
	for _, table := range []string{"nat", "filter"} {
		out, err := r.Save(ctx, table)
		if err != nil {
			return fmt.Errorf("listing %s: %w", table, err)
		}
		jumps, chains := ours(out, owns)
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

// Leftovers lists what Cleanup would remove from r: each chain owns
// accepts, as "table/chain", and each rule jumping to one from another
// chain, as "table/chain -> target". Read-only.
func Leftovers(ctx context.Context, r Runner, owns Owner) ([]string, error) {
	var found []string
	for _, table := range []string{"nat", "filter"} {
		out, err := r.Save(ctx, table)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", table, err)
		}
		jumps, chains := ours(out, owns)
		for _, c := range chains {
			found = append(found, table+"/"+c)
		}
		for _, j := range jumps {
			// "-D CHAIN ... -j TARGET": name the hook and where it leads.
			f := strings.Fields(j)
			i := slices.IndexFunc(f, func(s string) bool { return s == "-j" || s == "-g" })
			found = append(found, table+"/"+f[1]+" -> "+f[i+1])
		}
	}
	return found, nil
}

// ours reads an iptables-save listing of one table: the rules of other
// chains that jump to a chain owns accepts, as -D lines, and those
// chains, sorted. Only ChainPrefix chains are ever taken, whatever owns
// says.
func ours(save []byte, owns Owner) (jumps, chains []string) {
	mine := func(c string) bool { return strings.HasPrefix(c, ChainPrefix) && owns(c) }
	for line := range strings.SplitSeq(string(save), "\n") {
		switch {
		case strings.HasPrefix(line, ":"+ChainPrefix):
			if f := strings.Fields(line[1:]); len(f) > 0 && mine(f[0]) {
				chains = append(chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || mine(f[1]) {
				continue // a chain of ours goes whole
			}
			if i := slices.IndexFunc(f, func(s string) bool { return s == "-j" || s == "-g" }); i >= 0 && i+1 < len(f) && mine(f[i+1]) {
				jumps = append(jumps, "-D"+line[2:])
			}
		}
	}
	slices.Sort(chains)
	return jumps, chains
}

// CleanupAll runs Cleanup with every runner: an earlier run may have used
// either backend. It returns every failure, joined.
func CleanupAll(ctx context.Context, runners map[Backend]Runner, owns Owner) error {
	var errs []error
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		if r := runners[b]; r != nil {
			if err := Cleanup(ctx, r, owns); err != nil {
				errs = append(errs, fmt.Errorf("%s iptables: %w", b, err))
			}
		}
	}
	return errors.Join(errs...)
}

// LeftoversAll runs Leftovers with every runner, each finding prefixed
// with its backend ("legacy nat/PP-SERVICES").
func LeftoversAll(ctx context.Context, runners map[Backend]Runner, owns Owner) ([]string, error) {
	var found []string
	var errs []error
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		r := runners[b]
		if r == nil {
			continue
		}
		f, err := Leftovers(ctx, r, owns)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s iptables: %w", b, err))
			continue
		}
		for _, s := range f {
			found = append(found, string(b)+" "+s)
		}
	}
	return found, errors.Join(errs...)
}
