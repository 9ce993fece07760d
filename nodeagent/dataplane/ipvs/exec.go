package ipvs

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// restoreError turns a failed restore's *CommandError into a
// *RestoreError carrying the line the tool blamed.
func restoreError(name string, err error, lineRE *regexp.Regexp) error {
	var ce *CommandError
	if !errors.As(err, &ce) {
		return err
	}
	re := &RestoreError{Tool: name, Stderr: ce.Stderr, Err: ce.Err}
	if m := lineRE.FindStringSubmatch(ce.Stderr); m != nil {
		re.Line, _ = strconv.Atoi(m[1])
	}
	return re
}

// execIPSet is ipsetRunner over the ipset tool.
type execIPSet struct{ t tool.Tool }

// ipsetLineRE finds the line `ipset restore` blames: "Error in line 3:".
var ipsetLineRE = regexp.MustCompile(`Error in line (\d+)`)

// Restore implements ipsetRunner.
func (r execIPSet) Restore(ctx context.Context, data []byte) error {
	if _, err := r.t.Run(ctx, data, "restore"); err != nil {
		return restoreError("ipset", err, ipsetLineRE)
	}
	return nil
}

// Save implements ipsetRunner.
func (r execIPSet) Save(ctx context.Context) ([]byte, error) { return r.t.Run(ctx, nil, "save") }

// execIPTables is iptablesRunner over one family's and backend's tools,
// always called by their flavoured names (iptables-nft-restore...) so that
// the alternatives link cannot send rules to the other backend.
type execIPTables struct {
	restore, save, iptables tool.Tool
	backend                 Backend
	lockWait                time.Duration
}

func newExecIPTables(cfg *Config, backend Backend) (*execIPTables, error) {
	base := "iptables"
	if cfg.Family == IPv6 {
		base = "ip6tables"
	}
	flavour := base + "-" + string(backend)
	r := &execIPTables{backend: backend, lockWait: cfg.LockWait}
	var err error
	if r.restore, err = tool.New(cfg.CommandPrefix, flavour+"-restore"); err != nil {
		return nil, err
	}
	if r.save, err = tool.New(cfg.CommandPrefix, flavour+"-save"); err != nil {
		return nil, err
	}
	if r.iptables, err = tool.New(cfg.CommandPrefix, flavour); err != nil {
		return nil, err
	}
	return r, nil
}

// waitArgs returns "-w N" for legacy tools: without it a legacy command
// that finds the xtables lock taken fails at once. nft takes no lock.
func (r *execIPTables) waitArgs() []string {
	if r.backend != BackendLegacy || r.lockWait <= 0 {
		return nil
	}
	return []string{"-w", strconv.Itoa(max(1, int(r.lockWait/time.Second)))}
}

// iptablesLineRE finds the line iptables-restore blames: "line 6 failed"
// or "Error occurred at line: 3".
var iptablesLineRE = regexp.MustCompile(`line:? (\d+)`)

// Restore implements iptablesRunner.
func (r *execIPTables) Restore(ctx context.Context, data []byte, flags ...string) error {
	if _, err := r.restore.Run(ctx, data, append(slices.Clone(flags), r.waitArgs()...)...); err != nil {
		return restoreError(r.restore.Name(), err, iptablesLineRE)
	}
	return nil
}

// Save implements iptablesRunner.
func (r *execIPTables) Save(ctx context.Context, table string) ([]byte, error) {
	return r.save.Run(ctx, nil, "-t", table)
}

// EnsureRule implements iptablesRunner with a -C check and an -I 1.
func (r *execIPTables) EnsureRule(ctx context.Context, table, chain string, rule ...string) error {
	check := append(append(r.waitArgs(), "-t", table, "-C", chain), rule...)
	_, err := r.iptables.Run(ctx, nil, check...)
	if err == nil {
		return nil
	}
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 1 {
		// Exit status 1 is "no such rule"; anything else is a failure.
		return err
	}
	_, err = r.iptables.Run(ctx, nil, append(append(r.waitArgs(), "-t", table, "-I", chain, "1"), rule...)...)
	return err
}
