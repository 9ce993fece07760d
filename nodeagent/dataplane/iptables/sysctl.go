package iptables

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// sysctlRouteLocalnet lets packets to 127.0.0.0/8 be routed off the
// loopback interface: what a DNATed localhost NodePort connection needs,
// and what kube-proxy sets for iptables.localhostNodePorts.
const sysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"

// sysctls reads and writes the programmed namespace's sysctls, named as
// under /proc/sys. The real one is procSysctls; tests use a fake.
type sysctls interface {
	// Get returns the value, without the trailing newline.
	Get(ctx context.Context, name string) (string, error)
	// Set writes value. It is idempotent.
	Set(ctx context.Context, name, value string) error
}

// newSysctls returns the sysctls of the namespace that commands behind
// prefix run in: /proc/sys when there is no prefix (the agent's own
// namespace), else the sysctl tool behind the prefix, because /proc/sys/net
// shows the namespace of the process that opens it, not the one named.
func newSysctls(prefix []string) (sysctls, error) {
	if len(prefix) == 0 {
		return procSysctls{root: "/proc/sys"}, nil
	}
	t, err := tool.New(prefix, "sysctl")
	if err != nil {
		return nil, err
	}
	return toolSysctls{t}, nil
}

// procSysctls reads and writes files under root.
type procSysctls struct{ root string }

func (p procSysctls) Get(_ context.Context, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(p.root, name))
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (p procSysctls) Set(_ context.Context, name, value string) error {
	if err := os.WriteFile(filepath.Join(p.root, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s: %w", name, err)
	}
	return nil
}

// toolSysctls runs sysctl(8).
type toolSysctls struct{ t tool.Tool }

func (s toolSysctls) Get(ctx context.Context, name string) (string, error) {
	out, err := s.t.Run(ctx, nil, "-n", dotted(name))
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (s toolSysctls) Set(ctx context.Context, name, value string) error {
	if _, err := s.t.Run(ctx, nil, "-q", "-w", dotted(name)+"="+value); err != nil {
		return fmt.Errorf("setting sysctl %s: %w", name, err)
	}
	return nil
}

func dotted(name string) string { return strings.ReplaceAll(name, "/", ".") }

// ensureSysctl sets name to value unless it already is: writing the same
// value is harmless, but a read costs less than a write and leaves a
// value set by the operator alone.
func ensureSysctl(ctx context.Context, s sysctls, name, value string) error {
	cur, err := s.Get(ctx, name)
	if err != nil {
		return err
	}
	if cur == value {
		return nil
	}
	return s.Set(ctx, name, value)
}
