package xtables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
)

// Saver dumps one table of one iptables backend, as iptables-save -t does.
type Saver interface {
	// Save returns the dump of table. Safe to call at any time: it only
	// reads.
	Save(ctx context.Context, table string) ([]byte, error)
}

// DetectBackend chooses between legacy and nft iptables the way the node
// already uses them, from the dumps of nft and legacy (nil when a backend's
// tools are not installed). Both backends can hold rules at once and both
// apply to every packet, so writing to the one the rest of the node
// (kubelet, the CNI plugin, the host firewall) does not use splits the
// ruleset in two and makes it unreadable to whoever runs "iptables-save".
//
// In order, as kube-proxy's iptables-wrapper plus one rule of our own:
//  1. the backend holding ours, the caller's own nat chain, from an earlier
//     run: switching would leave those rules in force in the other backend;
//  2. the backend holding kubelet's hint chains (KUBE-IPTABLES-HINT or
//     KUBE-KUBELET-CANARY in mangle), which name the backend kubelet chose;
//  3. the backend with more rules in nat, filter and mangle, nft on a tie
//     (and so on an empty node: nft is every current distribution's
//     default).
//
// A backend whose tools fail is taken as empty; only when every backend
// fails is there an error.
func DetectBackend(ctx context.Context, ours string, nft, legacy Saver) (Backend, error) {
	order := []Backend{BackendNFT, BackendLegacy}
	savers := map[Backend]Saver{BackendNFT: nft, BackendLegacy: legacy}
	type dump struct {
		ours, hint bool
		rules      int
		ok         bool
	}
	dumps := map[Backend]*dump{}
	var errs []error
	for _, b := range order {
		r := savers[b]
		if r == nil {
			continue
		}
		d := &dump{}
		for _, table := range []string{"nat", "filter", "mangle"} {
			out, err := r.Save(ctx, table)
			if err != nil {
				if ctx.Err() != nil {
					return "", fmt.Errorf("detecting the iptables backend: %w", ctx.Err())
				}
				errs = append(errs, fmt.Errorf("%s %s: %w", b, table, err))
				continue
			}
			d.ok = true
			chains, rules := ScanSave(out)
			d.rules += rules
			for _, c := range chains {
				switch {
				case table == "nat" && c == ours:
					d.ours = true
				case table == "mangle" && (c == "KUBE-IPTABLES-HINT" || c == "KUBE-KUBELET-CANARY"):
					d.hint = true
				}
			}
		}
		if d.ok {
			dumps[b] = d
		}
	}
	if len(dumps) == 0 {
		return "", fmt.Errorf("detecting the iptables backend: %w", errors.Join(errs...))
	}
	for _, pick := range []func(*dump) bool{
		func(d *dump) bool { return d.ours },
		func(d *dump) bool { return d.hint },
	} {
		for _, b := range order {
			if d := dumps[b]; d != nil && pick(d) {
				return b, nil
			}
		}
	}
	if nft, legacy := dumps[BackendNFT], dumps[BackendLegacy]; nft == nil || (legacy != nil && legacy.rules > nft.rules) {
		return BackendLegacy, nil
	}
	return BackendNFT, nil
}

// ScanSave returns the chains declared in an iptables-save dump, in
// order, and its number of rules.
func ScanSave(out []byte) (chains []string, rules int) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("-A ")):
			rules++
		case bytes.HasPrefix(line, []byte(":")):
			if i := bytes.IndexByte(line, ' '); i > 1 {
				chains = append(chains, string(line[1:i]))
			}
		}
	}
	return chains, rules
}
