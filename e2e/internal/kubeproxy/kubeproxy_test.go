package kubeproxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		want, not []string
	}{
		{
			name: "set values become flags",
			cfg: Config{
				Binary: "/bin/kube-proxy", Mode: "iptables", Kubeconfig: "/k", NodeName: "node-0",
				ClusterCIDR: "10.244.0.0/16", DetectLocalMode: "NodeCIDR",
				MasqueradeBit: 14, MetricsBindAddress: "127.0.0.1:10249", Extra: []string{"--v=2"},
			},
			want: []string{
				"--proxy-mode=iptables", "--kubeconfig=/k", "--hostname-override=node-0",
				"--cluster-cidr=10.244.0.0/16", "--detect-local-mode=NodeCIDR",
				"--iptables-masquerade-bit=14", "--metrics-bind-address=127.0.0.1:10249", "--conntrack-max-per-core=0",
			},
			not: []string{"--healthz-bind-address="},
		},
		{
			// An empty --cluster-cidr would be a list of one empty CIDR,
			// which kube-proxy refuses.
			name: "empty values are left to kube-proxy",
			cfg:  Config{Binary: "kp", Mode: "nftables", Kubeconfig: "/k", NodeName: "n"},
			not:  []string{"--cluster-cidr=", "--detect-local-mode=", "--iptables-masquerade-bit=0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.cfg.Args()
			if args[0] != tc.cfg.Binary {
				t.Errorf("args[0] = %q, want the binary %q", args[0], tc.cfg.Binary)
			}
			for _, w := range tc.want {
				if !slices.Contains(args, w) {
					t.Errorf("args lack %q: %v", w, args)
				}
			}
			for _, n := range tc.not {
				if slices.Contains(args, n) {
					t.Errorf("args hold %q: %v", n, args)
				}
			}
			if len(tc.cfg.Extra) > 0 && args[len(args)-1] != tc.cfg.Extra[len(tc.cfg.Extra)-1] {
				t.Errorf("extra flags are not last: %v", args)
			}
		})
	}
}

// The relay carries bytes both ways between a client of its listener and
// the address it dials, and closes everything when its context ends.
func TestRelay(t *testing.T) {
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = upstream.Close() }()
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					_, _ = fmt.Fprintf(c, "upstream got %s", line)
				}
			}()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var dialed []string
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed = append(dialed, addr)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	done := make(chan struct{})
	go func() { defer close(done); Relay(ctx, ln, dial, upstream.Addr().String()) }()

	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "hello\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if got != "upstream got hello\n" {
		t.Errorf("through the relay: %q", got)
	}
	_ = c.Close()

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Relay did not return within 10 s of its context ending")
	}
	if want := []string{upstream.Addr().String()}; !slices.Equal(dialed, want) {
		t.Errorf("dialed %v, want %v", dialed, want)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Error("the relay's listener still accepts after its context ended")
	}
}
