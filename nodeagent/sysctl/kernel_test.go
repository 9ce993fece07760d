package sysctl

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestKernel applies a configuration to the real kernel in a network
// namespace the test creates on a locked thread, and reads it back: the
// timeouts and tcp_be_liberal are the namespace's own. nf_conntrack_max is
// the host's and read-only there, so Apply must leave it (and never reach
// the global hashsize). It needs root.
func TestKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and writes its sysctls")
	}
	runtime.LockOSThread()
	host, err := netns.Get()
	if err != nil {
		t.Fatalf("getting this thread's namespace: %v", err)
	}
	defer func() { _ = host.Close() }()
	ns, err := netns.New() // enters it too
	if err != nil {
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	defer func() {
		_ = ns.Close()
		// A thread left in the test's namespace must die with the test
		// rather than run other goroutines there.
		if err := netns.Set(host); err == nil {
			runtime.UnlockOSThread()
		}
	}()
	if _, err := os.Stat(ConntrackTCPEstablished); err != nil {
		t.Skipf("no conntrack sysctls in this kernel: %v", err)
	}
	k := procFS{}
	if err := k.WriteInt(ConntrackMax, 1); !IsReadOnly(err) {
		// Never go on where the host's table size could be written.
		t.Fatalf("nf_conntrack_max is writable in a new network namespace (err %v): this test would change the host's", err)
	}
	globalMax, err := k.ReadInt(ConntrackMax)
	if err != nil {
		t.Fatal(err)
	}

	c := Conntrack{
		MaxPerCore: globalMax + 1, Min: 1, // asks for a different size: refused here, left
		TCPEstablishedTimeout: 2 * time.Hour, TCPCloseWaitTimeout: 90 * time.Second,
		TCPBeLiberal: true, UDPTimeout: 17 * time.Second, UDPStreamTimeout: 170 * time.Second,
	}
	s := newSetter(k, slog.New(slog.DiscardHandler))
	if err := s.Apply(context.Background(), c); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for path, want := range map[string]int{
		ConntrackTCPEstablished: 7200, ConntrackTCPCloseWait: 90, ConntrackTCPBeLiberal: 1,
		ConntrackUDP: 17, ConntrackUDPStream: 170, ConntrackMax: globalMax,
	} {
		if got, err := k.ReadInt(path); err != nil || got != want {
			t.Errorf("%s = %d (%v), want %d", path, got, err, want)
		}
	}
	if !s.TCPBeLiberal() {
		t.Error("TCPBeLiberal is false after setting it")
	}
}
