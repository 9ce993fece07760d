package sysctl

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// kernelDefaults are a fresh kernel's values on a machine with 8 GiB.
func kernelDefaults() map[string]int {
	return map[string]int{
		ConntrackMax:            65536,
		ConntrackHashsize:       16384,
		ConntrackTCPEstablished: 432000,
		ConntrackTCPCloseWait:   60,
		ConntrackTCPBeLiberal:   0,
		ConntrackUDP:            30,
		ConntrackUDPStream:      120,
	}
}

func TestMax(t *testing.T) {
	for _, tc := range []struct {
		name    string
		c       Conntrack
		cpus    int
		want    int
		comment string
	}{
		{"scaled", Conntrack{MaxPerCore: 32768, Min: 131072}, 8, 262144, "above min"},
		{"min", Conntrack{MaxPerCore: 32768, Min: 131072}, 2, 131072, "below min"},
		{"capped", Conntrack{MaxPerCore: 32768, Min: 131072}, 64, 1 << 20, "2Mi capped at 1Mi"},
		{"left", Conntrack{MaxPerCore: 0, Min: 131072}, 8, 0, "maxPerCore 0 leaves it and ignores min"},
	} {
		if got := tc.c.Max(tc.cpus); got != tc.want {
			t.Errorf("%s (%s): Max(%d) = %d, want %d", tc.name, tc.comment, tc.cpus, got, tc.want)
		}
	}
}

func TestApply(t *testing.T) {
	defaults := DefaultConntrack()
	for _, tc := range []struct {
		name     string
		c        Conntrack
		cpus     int
		files    map[string]int
		readOnly []string
		want     []string // writes, in any order
		wantErr  string
		wantLog  string
	}{
		{
			name: "upstream defaults on 8 CPUs", c: defaults, cpus: 8, files: kernelDefaults(),
			want: []string{
				ConntrackHashsize + "=65536",
				ConntrackMax + "=262144",
				ConntrackTCPCloseWait + "=3600",
				ConntrackTCPEstablished + "=86400",
			},
		},
		{
			name: "everything set", cpus: 2, files: kernelDefaults(),
			c: Conntrack{
				MaxPerCore: 1000, Min: 70000, TCPEstablishedTimeout: time.Hour, TCPCloseWaitTimeout: time.Minute * 2,
				TCPBeLiberal: true, UDPTimeout: 10 * time.Second, UDPStreamTimeout: 5 * time.Minute,
			},
			// 70000/4 = 17500 > 16384: the hashsize grows too.
			want: []string{
				ConntrackHashsize + "=17500",
				ConntrackMax + "=70000",
				ConntrackTCPBeLiberal + "=1",
				ConntrackTCPCloseWait + "=120",
				ConntrackTCPEstablished + "=3600",
				ConntrackUDP + "=10",
				ConntrackUDPStream + "=300",
			},
		},
		{
			name: "values already right are not written", c: defaults, cpus: 8,
			files: func() map[string]int {
				f := kernelDefaults()
				f[ConntrackMax], f[ConntrackHashsize], f[ConntrackTCPEstablished], f[ConntrackTCPCloseWait] = 262144, 65536, 86400, 3600
				return f
			}(),
			// The read-only mounts of an unprivileged container refuse
			// every write: none is needed.
			readOnly: []string{ConntrackMax, ConntrackHashsize, ConntrackTCPEstablished, ConntrackTCPCloseWait},
		},
		{
			name: "a small hashsize grows though nf_conntrack_max is right", c: Conntrack{MaxPerCore: 32768, Min: 131072}, cpus: 8,
			files: func() map[string]int { f := kernelDefaults(); f[ConntrackMax] = 262144; return f }(),
			// As upstream's SetMax, which checks the hashsize whatever
			// it wrote.
			readOnly: []string{ConntrackMax},
			want:     []string{ConntrackHashsize + "=65536"},
		},
		{
			name: "a large enough hashsize is kept", c: Conntrack{MaxPerCore: 32768, Min: 131072}, cpus: 2,
			files: func() map[string]int { f := kernelDefaults(); f[ConntrackHashsize] = 65536; return f }(),
			want:  []string{ConntrackMax + "=131072"},
		},
		{
			name: "zero leaves every value", c: Conntrack{}, cpus: 8, files: kernelDefaults(),
		},
		{
			name: "nf_conntrack_max read-only in a pod's network namespace", c: defaults, cpus: 8, files: kernelDefaults(),
			readOnly: []string{ConntrackMax},
			want:     []string{ConntrackTCPCloseWait + "=3600", ConntrackTCPEstablished + "=86400"},
			wantLog:  "belongs to the host's network namespace",
		},
		{
			name: "read-only /sys keeps the hashsize", c: defaults, cpus: 8, files: kernelDefaults(),
			readOnly: []string{ConntrackHashsize},
			want:     []string{ConntrackMax + "=262144", ConntrackTCPCloseWait + "=3600", ConntrackTCPEstablished + "=86400"},
			wantLog:  "/sys is read-only",
		},
		{
			name: "a namespaced sysctl that cannot be written fails", c: defaults, cpus: 8, files: kernelDefaults(),
			readOnly: []string{ConntrackTCPEstablished},
			want:     []string{ConntrackHashsize + "=65536", ConntrackMax + "=262144"},
			wantErr:  "nf_conntrack_tcp_timeout_established",
		},
		{
			name: "negative values are refused before any write", c: Conntrack{MaxPerCore: -1, UDPTimeout: -time.Second}, cpus: 8,
			files: kernelDefaults(), wantErr: "conntrack.maxPerCore must not be negative\nconntrack.udpTimeout",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newFakeKernel(tc.cpus, tc.files)
			for _, p := range tc.readOnly {
				k.readOnly[p] = true
			}
			var logs bytes.Buffer
			err := newSetter(k, slog.New(slog.NewTextHandler(&logs, nil))).Apply(context.Background(), tc.c)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Apply: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Apply = %v, want an error containing %q", err, tc.wantErr)
			}
			if got, want := k.sortedWrites(), slices.Sorted(slices.Values(tc.want)); !slices.Equal(got, want) {
				t.Errorf("writes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("logs %q lack %q", logs.String(), tc.wantLog)
			}
		})
	}
}

func TestTCPBeLiberal(t *testing.T) {
	k := newFakeKernel(1, kernelDefaults())
	s := newSetter(k, slog.New(slog.DiscardHandler))
	if s.TCPBeLiberal() {
		t.Error("TCPBeLiberal with the sysctl at 0")
	}
	k.files[ConntrackTCPBeLiberal] = 1
	if !s.TCPBeLiberal() {
		t.Error("not TCPBeLiberal with the sysctl at 1")
	}
	delete(k.files, ConntrackTCPBeLiberal)
	if s.TCPBeLiberal() {
		t.Error("TCPBeLiberal without the sysctl (no conntrack in the kernel)")
	}
}

func TestCountCPUList(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-3": 4, "0-3,8,10-11": 7, "": 0, "0-x": 0, "3-1": 0} {
		if got := countCPUList(in); got != want {
			t.Errorf("countCPUList(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestSet(t *testing.T) {
	const (
		vsConntrack = "/proc/sys/net/ipv4/vs/conntrack"
		vsExpire    = "/proc/sys/net/ipv4/vs/expire_nodest_conn"
		forward     = "/proc/sys/net/ipv4/ip_forward"
	)
	k := newFakeKernel(8, map[string]int{vsConntrack: 0, vsExpire: 1, forward: 0})
	s := newSetter(k, slog.New(slog.DiscardHandler))
	if err := s.Set(context.Background(), []Setting{{vsConntrack, 1}, {vsExpire, 1}, {forward, 1}}); err != nil {
		t.Fatal(err)
	}
	if want := []string{forward + "=1", vsConntrack + "=1"}; !slices.Equal(k.sortedWrites(), want) {
		t.Errorf("writes = %v, want only the differing ones %v", k.sortedWrites(), want)
	}

	// A read-only /proc/sys fails, naming the file; one already right
	// needs no write.
	k = newFakeKernel(8, map[string]int{vsConntrack: 1, forward: 0})
	k.readOnly[vsConntrack], k.readOnly[forward] = true, true
	s = newSetter(k, slog.New(slog.DiscardHandler))
	if err := s.Set(context.Background(), []Setting{{vsConntrack, 1}}); err != nil {
		t.Errorf("Set of a value already right on a read-only file: %v", err)
	}
	err := s.Set(context.Background(), []Setting{{forward, 1}})
	if !IsReadOnly(err) || !strings.Contains(err.Error(), forward) {
		t.Errorf("Set on a read-only file: %v, want a read-only error naming %s", err, forward)
	}
}
