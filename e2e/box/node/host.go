package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// cgroupMount is where the cgroup hierarchies are mounted (v1 here: one
// directory per hierarchy, plus "unified").
const cgroupMount = "/sys/fs/cgroup"

// hostPaths are the host paths a kubelet, containerd or the CNI plugins
// create when not confined. Check fails if one that was absent before
// Start exists after Close.
var hostPaths = []string{
	"/var/lib/kubelet",
	"/var/lib/cni",
	"/var/lib/containerd",
	"/var/log/containers",
	"/var/log/pods",
	"/run/containerd",
	"/opt/containerd",
	"/usr/libexec/kubernetes",
	"/etc/cni",
	"/etc/kubernetes",
}

// hostState is what Start found on the host, for Close to restore and
// Check to compare against.
type hostState struct {
	sysctls map[string]string
	absent  []string
	links   []string
}

func snapshotHost(netns string) (hostState, error) {
	h := hostState{sysctls: map[string]string{}}
	for name := range sysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			return h, fmt.Errorf("reading sysctl: %w", err)
		}
		h.sysctls[name] = strings.TrimSpace(string(b))
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			h.absent = append(h.absent, p)
		}
	}
	links, err := linkNames(netns)
	if err != nil {
		return h, err
	}
	h.links = links
	return h, nil
}

// linkNames lists the links of network namespace ns.
func linkNames(ns string) ([]string, error) {
	out, err := exec.Command("ip", "-n", ns, "-o", "link", "show").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("listing links of %s: %w: %s", ns, err, out)
	}
	var names []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		// "3: eth0@if4: <...": the name, without the peer suffix.
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		names = append(names, name)
	}
	slices.Sort(names)
	return names, nil
}

// hierarchies lists the cgroup hierarchies mounted under cgroupMount.
func hierarchies() ([]string, error) {
	ents, err := os.ReadDir(cgroupMount)
	if err != nil {
		return nil, fmt.Errorf("listing cgroup hierarchies: %w", err)
	}
	var hs []string
	for _, e := range ents {
		if e.IsDir() {
			hs = append(hs, filepath.Join(cgroupMount, e.Name()))
		}
	}
	return hs, nil
}

// createCgroups creates root in every hierarchy: the kubelet refuses a
// cgroupRoot that does not exist. A new cpuset cgroup starts with no CPUs
// and no memory nodes, and so would its children: it gets its parent's.
func createCgroups(root string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				return fmt.Errorf("reading %s: %w", f, err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				return fmt.Errorf("writing %s of %s: %w", f, dir, err)
			}
		}
	}
	return nil
}

// cgroupPIDs returns every process in root or below, in any hierarchy.
func cgroupPIDs(root string) ([]int, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, h := range hs {
		err := filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil || !d.IsDir() {
				return err
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil //nolint:nilerr // removed while walking
			}
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walking cgroup %s: %w", filepath.Join(h, root), err)
		}
	}
	return pids, nil
}

// removeCgroups removes root and everything below it in every
// hierarchy, deepest first; rmdir on a cgroup removes its control files.
func removeCgroups(root string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// mntNSPIDs returns the processes in mount namespace ns (a
// /proc/PID/ns/mnt link's text).
func mntNSPIDs(ns string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && l == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killUntilGone sends SIGKILL to the processes list returns until it
// returns none, or ctx ends.
func killUntilGone(ctx context.Context, what string, list func() ([]int, error)) error {
	var last []int
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		pids, err := list()
		if err != nil {
			return false, err
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		last = pids
		return len(pids) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("killing %s (left: %v): %w", what, last, err)
	}
	return nil
}

// stop sends SIGTERM to cmd's process and waits for exited, then SIGKILL.
func stop(cmd *exec.Cmd, exited <-chan struct{}) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(stopTimeout):
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Close stops the node and undoes every change it made to the host, then
// checks that nothing is left (see Check). It is idempotent. Pods on the
// node are killed, not drained: delete them first for a graceful end.
func (n *Node) Close(ctx context.Context) error {
	if n.closed {
		return nil
	}
	n.closed = true
	ctx, cancel := context.WithTimeout(ctx, 2*stopTimeout)
	defer cancel()
	var errs []error
	// The kubelet first, so it does not restart what is killed next.
	stop(n.kubelet, n.kubeletExited)
	// The pods' processes: everything in the node's cgroups.
	if err := killUntilGone(ctx, "the pods' processes", func() ([]int, error) { return cgroupPIDs(n.cgroupRoot) }); err != nil {
		errs = append(errs, err)
	}
	stop(n.containerd, n.containerdExited)
	// The shims, and anything else left in the node's mount namespace;
	// when the last is gone, the namespace and every mount in it go too.
	if n.mntNS != "" {
		if err := killUntilGone(ctx, "the node's mount namespace", func() ([]int, error) { return mntNSPIDs(n.mntNS), nil }); err != nil {
			errs = append(errs, err)
		}
	}
	if n.mntNSRef != nil {
		// The namespace, and every mount in it, goes now: its number may
		// name another namespace from here on.
		_ = n.mntNSRef.Close()
		n.mntNSRef = nil
	}
	if err := removeCgroups(n.cgroupRoot); err != nil {
		errs = append(errs, err)
	}
	// The pods' veths went with their network namespaces; the bridge the
	// CNI plugin made stays unless removed.
	if out, err := exec.Command("ip", "-n", n.cfg.NetNS, "link", "del", cniBridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		errs = append(errs, fmt.Errorf("removing %s: %w: %s", cniBridge, err, out))
	}
	// A pod network namespace's veth goes when the namespace is freed,
	// which the kernel does asynchronously after its last process and
	// mount are gone.
	if err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		links, err := linkNames(n.cfg.NetNS)
		return err == nil && slices.Equal(links, n.host.links), nil
	}); err != nil {
		errs = append(errs, fmt.Errorf("waiting for the pods' links to go: %w", err))
	}
	for name, val := range n.host.sysctls {
		p := filepath.Join("/proc/sys", name)
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) != val {
			if err := os.WriteFile(p, []byte(val), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restoring sysctl %s: %w", name, err))
			}
		}
	}
	if err := os.RemoveAll(n.cfg.Dir); err != nil {
		errs = append(errs, fmt.Errorf("removing node dir: %w", err))
	}
	if err := n.Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Check reports everything of the node still on the host: processes in
// its mount namespace, its cgroups, mounts under its Dir, host paths that
// did not exist before Start, sysctls changed since Start, links in its
// network namespace that were not there before Start. After Close it
// returns nil; its checks are the teardown's proof.
func (n *Node) Check() error {
	var errs []error
	// Once Close let the namespace go, its number may name another: Close
	// saw it empty before letting it go.
	if n.mntNS != "" && !n.closed {
		if pids := mntNSPIDs(n.mntNS); len(pids) > 0 {
			errs = append(errs, fmt.Errorf("processes left in the node's mount namespace: %v", pids))
		}
	}
	if hs, err := hierarchies(); err != nil {
		errs = append(errs, err)
	} else {
		for _, h := range hs {
			if _, err := os.Stat(filepath.Join(h, n.cgroupRoot)); err == nil {
				errs = append(errs, fmt.Errorf("cgroup left: %s", filepath.Join(h, n.cgroupRoot)))
			}
		}
	}
	if mounts, err := mountsUnder(n.cfg.Dir); err != nil {
		errs = append(errs, err)
	} else if len(mounts) > 0 {
		errs = append(errs, fmt.Errorf("mounts left under %s: %v", n.cfg.Dir, mounts))
	}
	if _, err := os.Lstat(n.cfg.Dir); err == nil {
		errs = append(errs, fmt.Errorf("node dir left: %s", n.cfg.Dir))
	}
	for _, p := range n.host.absent {
		if _, err := os.Lstat(p); err == nil {
			errs = append(errs, fmt.Errorf("host path created: %s", p))
		}
	}
	for name, val := range n.host.sysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			errs = append(errs, fmt.Errorf("reading sysctl: %w", err))
		} else if got := strings.TrimSpace(string(b)); got != val {
			errs = append(errs, fmt.Errorf("sysctl %s is %s, was %s", name, got, val))
		}
	}
	if links, err := linkNames(n.cfg.NetNS); err != nil {
		errs = append(errs, err)
	} else if !slices.Equal(links, n.host.links) {
		errs = append(errs, fmt.Errorf("links of %s are %v, were %v", n.cfg.NetNS, links, n.host.links))
	}
	return errors.Join(errs...)
}

// mountsUnder lists the host's mount points at or below dir.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only
	var found []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// Field 5 is the mount point.
		if fs := strings.Fields(s.Text()); len(fs) > 4 && (fs[4] == dir || strings.HasPrefix(fs[4], dir+"/")) {
			found = append(found, fs[4])
		}
	}
	return found, s.Err()
}

// Memory returns the resident memory, in bytes, of the node's processes
// by command name (kubelet, containerd, containerd-shim-runc-v2), and
// under "pods" the memory cgroup usage of its pods.
func (n *Node) Memory() (map[string]int64, error) {
	m := map[string]int64{}
	for _, pid := range mntNSPIDs(n.mntNS) {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			continue // exited
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				if err == nil {
					m[strings.TrimSpace(string(comm))] += kb * 1024
				}
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(cgroupMount, "memory", n.cgroupRoot, "memory.usage_in_bytes"))
	if err != nil {
		return m, fmt.Errorf("reading the pods' memory: %w", err)
	}
	pods, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return m, fmt.Errorf("parsing the pods' memory: %w", err)
	}
	m["pods"] = pods
	return m, nil
}
