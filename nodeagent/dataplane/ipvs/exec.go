package ipvs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// execTool runs one tool, optionally behind a command prefix (ip netns
// exec NAME), which only switches namespaces: the tool still comes from
// this host's filesystem, so the lookup is the same.
type execTool struct {
	prefix []string
	name   string
}

func newExecTool(prefix []string, name string) (execTool, error) {
	for _, bin := range append(slices.Clone(prefix[:min(1, len(prefix))]), name) {
		if _, err := exec.LookPath(bin); err != nil {
			return execTool{}, &MissingBinaryError{Name: bin, Err: err}
		}
	}
	return execTool{prefix: slices.Clone(prefix), name: name}, nil
}

func (t execTool) command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(slices.Clone(t.prefix), t.name)
	argv = append(argv, args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// run runs the tool with stdin and returns stdout, or a *CommandError.
func (t execTool) run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := t.command(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, commandError(cmd, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func commandError(cmd *exec.Cmd, err error, stderr string) error {
	if errors.Is(err, exec.ErrNotFound) {
		return &MissingBinaryError{Name: cmd.Args[0], Err: err}
	}
	code := -1
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	return &CommandError{Args: cmd.Args, ExitCode: code, Stderr: stderr, Err: err}
}

// restoreError turns a failed restore's *CommandError into a
// *RestoreError carrying the line the tool blamed.
func restoreError(tool string, err error, lineRE *regexp.Regexp) error {
	var ce *CommandError
	if !errors.As(err, &ce) {
		return err
	}
	re := &RestoreError{Tool: tool, Stderr: ce.Stderr, Err: ce.Err}
	if m := lineRE.FindStringSubmatch(ce.Stderr); m != nil {
		re.Line, _ = strconv.Atoi(m[1])
	}
	return re
}

// execIPSet is ipsetRunner over the ipset tool.
type execIPSet struct{ t execTool }

// ipsetLineRE finds the line `ipset restore` blames: "Error in line 3:".
var ipsetLineRE = regexp.MustCompile(`Error in line (\d+)`)

// Restore implements ipsetRunner.
func (r execIPSet) Restore(ctx context.Context, data []byte) error {
	if _, err := r.t.run(ctx, data, "restore"); err != nil {
		return restoreError("ipset", err, ipsetLineRE)
	}
	return nil
}

// Save implements ipsetRunner.
func (r execIPSet) Save(ctx context.Context) ([]byte, error) { return r.t.run(ctx, nil, "save") }

// execIPTables is iptablesRunner over one family's and backend's tools,
// always called by their flavoured names (iptables-nft-restore...) so that
// the alternatives link cannot send rules to the other backend.
type execIPTables struct {
	restore, save, iptables execTool
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
	if r.restore, err = newExecTool(cfg.CommandPrefix, flavour+"-restore"); err != nil {
		return nil, err
	}
	if r.save, err = newExecTool(cfg.CommandPrefix, flavour+"-save"); err != nil {
		return nil, err
	}
	if r.iptables, err = newExecTool(cfg.CommandPrefix, flavour); err != nil {
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
	if _, err := r.restore.run(ctx, data, append(slices.Clone(flags), r.waitArgs()...)...); err != nil {
		return restoreError(r.restore.name, err, iptablesLineRE)
	}
	return nil
}

// Save implements iptablesRunner.
func (r *execIPTables) Save(ctx context.Context, table string) ([]byte, error) {
	return r.save.run(ctx, nil, "-t", table)
}

// EnsureRule implements iptablesRunner with a -C check and an -I 1.
func (r *execIPTables) EnsureRule(ctx context.Context, table, chain string, rule ...string) error {
	check := append(append(r.waitArgs(), "-t", table, "-C", chain), rule...)
	_, err := r.iptables.run(ctx, nil, check...)
	if err == nil {
		return nil
	}
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 1 {
		// Exit status 1 is "no such rule"; anything else is a failure.
		return err
	}
	_, err = r.iptables.run(ctx, nil, append(append(r.waitArgs(), "-t", table, "-I", chain, "1"), rule...)...)
	return err
}

// detectBackend chooses between legacy and nft iptables as the iptables
// dataplane does (see its README): the backend already holding our
// PP-IPVS-SERVICES chain, else the one holding kubelet's hint chains
// (KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY in mangle), else the one with
// more rules, nft on a tie. Both backends apply to every packet, so
// writing to the one nobody else uses splits the ruleset in two. A backend
// whose tools fail counts as empty; only when both fail is there an error.
func detectBackend(ctx context.Context, runners map[Backend]iptablesRunner) (Backend, error) {
	order := []Backend{BackendNFT, BackendLegacy}
	type dump struct {
		ours, hint bool
		rules      int
	}
	dumps := map[Backend]*dump{}
	var errs []error
	for _, b := range order {
		r := runners[b]
		if r == nil {
			continue
		}
		d, ok := &dump{}, false
		for _, table := range []string{"nat", "filter", "mangle"} {
			out, err := r.Save(ctx, table)
			if err != nil {
				if ctx.Err() != nil {
					return "", fmt.Errorf("detecting the iptables backend: %w", ctx.Err())
				}
				errs = append(errs, fmt.Errorf("%s %s: %w", b, table, err))
				continue
			}
			ok = true
			chains, rules := scanSave(out)
			d.rules += rules
			for _, c := range chains {
				d.ours = d.ours || (table == "nat" && c == chainServices)
				d.hint = d.hint || (table == "mangle" && (c == "KUBE-IPTABLES-HINT" || c == "KUBE-KUBELET-CANARY"))
			}
		}
		if ok {
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
	nft, legacy := dumps[BackendNFT], dumps[BackendLegacy]
	if nft == nil || (legacy != nil && legacy.rules > nft.rules) {
		return BackendLegacy, nil
	}
	return BackendNFT, nil
}

// scanSave returns the chains declared in an iptables-save dump and its
// number of rules.
func scanSave(out []byte) (chains []string, rules int) {
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
