package conntrack

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// dnsTable is one dual-stack UDP Service with a NodePort and a TCP port.
func dnsTable(tb testing.TB) *proxytable.Table {
	tb.Helper()
	dns := svc("dns", "10.96.0.10", "fd00:96::10")
	dns.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	dns.Ports = []*pb.ServicePort{port("dns", udp, 53, 30053), port("dns-tcp", tcp, 53, 0)}
	dns.ClusterEndpoints = []*pb.PortEndpoints{
		eps("dns", "10.244.1.10:5353", "[fd00:244:1::10]:5353"),
		eps("dns-tcp", "10.244.1.10:5353"),
	}
	return newTable(tb, dns)
}

// Flows of the tests below.
var (
	live4      = udp4("10.96.0.10:53", "10.244.1.10:5353")
	stale4     = udp4("10.96.0.10:53", "10.244.1.99:5353")
	nodePort4  = udp4("192.168.100.1:30053", "10.244.1.99:5353")
	unNATed4   = udp4("10.96.0.10:53", "10.96.0.10:53")
	tcp4       = ctFlow(unix.IPPROTO_TCP, "192.168.100.100:40001", "10.96.0.10:53", "10.244.1.99:5353")
	elsewhere4 = udp4("8.8.8.8:53", "8.8.8.8:53")
	live6      = udp6("[fd00:96::10]:53", "[fd00:244:1::10]:5353")
	stale6     = udp6("[fd00:96::10]:53", "[fd00:244:1::99]:5353")
)

// remaining returns the fake's flows of family in a comparable form.
func remaining(k *fakeKernel, family netlink.InetFamily) []string {
	var out []string
	for _, f := range k.flows[family] {
		out = append(out, flowString(f))
	}
	slices.Sort(out)
	return out
}

func flowStrings(flows ...*netlink.ConntrackFlow) []string {
	var out []string
	for _, f := range flows {
		out = append(out, flowString(f))
	}
	slices.Sort(out)
	return out
}

func TestClean(t *testing.T) {
	k := newFakeKernel(live4, stale4, nodePort4, unNATed4, tcp4, elsewhere4, live6, stale6)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c4, c6 := newCleaner(dataplane.IPv4, k, log), newCleaner(dataplane.IPv6, k, log)
	tbl := dnsTable(t)
	ctx := context.Background()

	n, err := c4.Clean(ctx, tbl)
	if err != nil || n != 3 {
		t.Fatalf("IPv4 Clean = %d, %v; want 3 deleted", n, err)
	}
	if got, want := remaining(k, unix.AF_INET), flowStrings(live4, tcp4, elsewhere4); !slices.Equal(got, want) {
		t.Errorf("IPv4 flows left:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := remaining(k, unix.AF_INET6); len(got) != 2 {
		t.Errorf("the IPv4 Cleaner touched IPv6 flows: %v", got)
	}
	if !strings.Contains(logs.String(), "deleting stale conntrack flow") || !strings.Contains(logs.String(), "replySrc=10.244.1.99:5353") {
		t.Errorf("deleted flows not logged at debug level:\n%s", logs.String())
	}

	// Idempotent: nothing stale is left, so no delete request is made.
	lists, deletes := k.lists, k.deletes
	if n, err := c4.Clean(ctx, tbl); err != nil || n != 0 {
		t.Fatalf("second IPv4 Clean = %d, %v; want 0", n, err)
	}
	if k.lists != lists+1 || k.deletes != deletes {
		t.Errorf("second Clean made %d lists and %d deletes, want 1 and 0", k.lists-lists, k.deletes-deletes)
	}

	if n, err := c6.Clean(ctx, tbl); err != nil || n != 1 {
		t.Fatalf("IPv6 Clean = %d, %v; want 1 deleted", n, err)
	}
	if got, want := remaining(k, unix.AF_INET6), flowStrings(live6); !slices.Equal(got, want) {
		t.Errorf("IPv6 flows left %v, want %v", got, want)
	}
}

func TestCleanReadsNothingWithoutUDPFrontends(t *testing.T) {
	web := svc("web", "10.96.0.10")
	web.Ports = []*pb.ServicePort{port("http", tcp, 80, 0)}
	web.ClusterEndpoints = []*pb.PortEndpoints{eps("http", "10.244.1.10:8080")}
	for name, tbl := range map[string]*proxytable.Table{"nil": nil, "empty": proxytable.Empty(), "TCP only": newTable(t, web)} {
		t.Run(name, func(t *testing.T) {
			k := newFakeKernel(stale4)
			if n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), tbl); err != nil || n != 0 {
				t.Fatalf("Clean = %d, %v; want 0", n, err)
			}
			if k.lists+k.deletes != 0 {
				t.Errorf("Clean read the kernel's table (%d lists, %d deletes) with nothing to clean", k.lists, k.deletes)
			}
		})
	}
}

func TestCleanListFails(t *testing.T) {
	k := newFakeKernel(stale4)
	k.listErrs = []error{syscall.EPERM}
	n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
	if !IsListFailed(err) || IsInterrupted(err) || !errors.Is(err, syscall.EPERM) || n != 0 {
		t.Fatalf("Clean = %d, %v; want a ListError wrapping EPERM", n, err)
	}
	if k.deletes != 0 || len(k.flows[unix.AF_INET]) != 1 {
		t.Errorf("Clean deleted after a failed list")
	}
	t.Logf("error: %v", err)
}

func TestCleanInterruptedDump(t *testing.T) {
	t.Run("retried", func(t *testing.T) {
		k := newFakeKernel(live4, stale4)
		k.listErrs = []error{netlink.ErrDumpInterrupted}
		n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
		if err != nil || n != 1 || k.lists != 2 {
			t.Fatalf("Clean = %d, %v after %d lists; want 1 deleted, no error, 2 lists", n, err, k.lists)
		}
	})
	t.Run("always interrupted", func(t *testing.T) {
		k := newFakeKernel(live4, stale4)
		k.listErrs = slices.Repeat([]error{netlink.ErrDumpInterrupted}, maxListAttempts)
		n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
		if !IsInterrupted(err) || !IsListFailed(err) || n != 1 || k.lists != maxListAttempts {
			t.Fatalf("Clean = %d, %v after %d lists; want the flows read cleaned (1) and an interrupted ListError after %d lists",
				n, err, k.lists, maxListAttempts)
		}
	})
	t.Run("interrupted with nothing stale", func(t *testing.T) {
		k := newFakeKernel(live4)
		k.listErrs = slices.Repeat([]error{netlink.ErrDumpInterrupted}, maxListAttempts)
		n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
		if !IsInterrupted(err) || n != 0 || k.deletes != 0 {
			t.Fatalf("Clean = %d, %v, %d deletes; want 0, interrupted, no delete", n, err, k.deletes)
		}
	})
}

func TestCleanDeleteFails(t *testing.T) {
	k := newFakeKernel(live4, stale4, nodePort4)
	k.undeletable[nodePort4] = true
	n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
	if !IsDeleteFailed(err) || IsListFailed(err) || n != 1 {
		t.Fatalf("Clean = %d, %v; want 1 deleted and a DeleteError", n, err)
	}
	t.Logf("error: %v", err)
}

func TestCleanJudgesFlowsWhenDeleting(t *testing.T) {
	// Between the list and the delete, the client's next datagram after
	// the old flow expired made a new flow (DNATed by the new rules to a
	// live endpoint), and another flow went stale. The delete judges what
	// it finds.
	k := newFakeKernel(stale4)
	fresh := udp4("10.96.0.10:53", "10.244.1.10:5353")
	late := udp4("192.168.100.1:30053", "10.244.1.98:5353")
	k.beforeDelete = func() {
		k.flows[unix.AF_INET] = []*netlink.ConntrackFlow{fresh, late}
	}
	n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(context.Background(), dnsTable(t))
	if err != nil || n != 1 {
		t.Fatalf("Clean = %d, %v; want 1", n, err)
	}
	if got, want := remaining(k, unix.AF_INET), flowStrings(fresh); !slices.Equal(got, want) {
		t.Errorf("flows left %v, want %v", got, want)
	}
}

func TestCleanCanceled(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		k := newFakeKernel(stale4)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(ctx, dnsTable(t))
		if !errors.Is(err, context.Canceled) || n != 0 || k.lists != 0 {
			t.Fatalf("Clean = %d, %v after %d lists; want context.Canceled without reading the table", n, err, k.lists)
		}
	})
	t.Run("while deleting", func(t *testing.T) {
		k := newFakeKernel(stale4, nodePort4)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		k.beforeDelete = cancel
		n, err := newCleaner(dataplane.IPv4, k, discard()).Clean(ctx, dnsTable(t))
		if !errors.Is(err, context.Canceled) || n != 0 || len(k.flows[unix.AF_INET]) != 2 {
			t.Fatalf("Clean = %d, %v with %d flows left; want context.Canceled and nothing deleted after it",
				n, err, len(k.flows[unix.AF_INET]))
		}
	})
}

func TestCleanInvalidFamily(t *testing.T) {
	k := newFakeKernel(stale4)
	if n, err := newCleaner(dataplane.Family(5), k, discard()).Clean(context.Background(), dnsTable(t)); err == nil || n != 0 || k.lists != 0 {
		t.Fatalf("Clean with family 5 = %d, %v; want an error and no kernel access", n, err)
	}
}
