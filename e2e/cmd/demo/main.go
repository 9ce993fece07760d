// Command demo runs proxyplane as a cluster in a box until interrupted:
// the README's first command, `make demo` (as root).
//
// It starts e2e/box: a real API server with deploy/ applied, two control
// plane replicas running as deploy/'s ServiceAccount, a node agent in each
// of three node namespaces and two backend pods per node. It then creates
// two sample Services, shows a request through a ClusterIP and a NodePort,
// prints every node's sync status and the commands to watch them
// (controlplane status, grpcurl), and waits. Ctrl-C removes everything it
// created.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// keepWritingAfterReaderGoes makes a write to a closed stdout or stderr
// fail with EPIPE instead of killing the process. Ctrl-C reaches a whole
// pipeline (`make demo 2>&1 | tee demo.log`): tee exits at once, and the
// Go runtime's default for a broken pipe on fd 1 or 2 is to die of
// SIGPIPE, which ended the teardown at its first line and left the box's
// namespaces behind. What the demo prints is for people; the teardown is
// not.
func keepWritingAfterReaderGoes() {
	signal.Ignore(syscall.SIGPIPE)
}

// startTimeout bounds bringing the box up; the API server alone takes a
// few seconds, the first tables a few more.
const startTimeout = 3 * time.Minute

func main() {
	os.Exit(run())
}

func run() (code int) {
	keepWritingAfterReaderGoes()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root: it creates network namespaces and programs iptables inside them (run `sudo make demo`)")
		return 1
	}
	tb := &programTB{}
	defer func() {
		if r := recover(); r != nil {
			stop, ok := r.(stopDemo)
			if !ok {
				panic(r)
			}
			fmt.Fprintln(os.Stderr, "demo:", stop.msg)
			code = 1
		}
		fmt.Println("\nremoving the box: processes, namespaces and rules ...")
		tb.runCleanups()
		if tb.failed {
			code = 1
		}
		fmt.Println("done")
	}()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	startCtx, startCancel := context.WithTimeout(ctx, startTimeout)
	defer startCancel()

	fmt.Println("starting a cluster in a box: API server, deploy/, 2 control planes, 3 node agents ...")
	b, err := box.Start(startCtx, tb, box.Options{})
	if err != nil {
		tb.Errorf("%v", err)
		return 1
	}
	if err := show(startCtx, os.Stdout, b); err != nil {
		tb.Errorf("%v", err)
		return 1
	}
	fmt.Println("\nrunning; press Ctrl-C to stop and remove everything")
	<-ctx.Done()
	return 0
}

// show creates the sample Services and prints what a user wants to see.
func show(ctx context.Context, w io.Writer, b *box.Box) error {
	out := &printer{w: w}
	tp := b.Topology()
	web, _, err := b.CreateService(ctx, box.NewService("web"), allPods(tp)...)
	if err != nil {
		return err
	}
	np := box.NewService("web-nodeport")
	np.Spec.Type = corev1.ServiceTypeNodePort
	np, _, err = b.CreateService(ctx, np, 1, 3)
	if err != nil {
		return err
	}
	nodePort := int(np.Spec.Ports[0].NodePort)

	out.f("\nServices (in namespace %s):\n", box.Namespace)
	out.f("  web           ClusterIP %s  -> every pod\n", strings.Join(web.Spec.ClusterIPs, ", "))
	out.f("  web-nodeport  NodePort  %d      -> pod-1 (node-0), pod-3 (node-1)\n", nodePort)

	clusterAddr := box.ClusterAddr(web)
	nodeAddr := nstest.HostPort(tp.Node(1).IP(), nodePort)
	if err := b.WaitTraffic(ctx, tp.ClientNS(), clusterAddr, ""); err != nil {
		return err
	}
	if err := b.WaitTraffic(ctx, tp.ClientNS(), nodeAddr, ""); err != nil {
		return err
	}
	out.f("\nRequests (each answered by the pod's name and the source address it saw):\n")
	for _, req := range []struct{ from, fromNS, addr string }{
		{"pod-0", tp.PodNS(0), clusterAddr},
		{"client", tp.ClientNS(), clusterAddr},
		{"client", tp.ClientNS(), nodeAddr},
	} {
		r, err := tp.DialTCP(req.fromNS, req.addr, 2*time.Second)
		if err != nil {
			return fmt.Errorf("request from %s to %s: %w", req.from, req.addr, err)
		}
		out.f("  %-6s -> %-22s answered by %s, which saw %s\n", req.from, req.addr, r.Backend, r.SeenFrom)
	}

	// Once every agent has acknowledged its current table, so that the
	// versions below are the ones the replicas go on showing.
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		return err
	}
	on, statuses, err := b.Connections(ctx)
	if err != nil {
		return err
	}
	out.f("\nNodes (ListNodes on each replica):\n")
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	twOut := &printer{w: tw}
	twOut.f("  NODE\tZONE\tREPLICA\tACKED VERSION\tBYTES SENT\n")
	for k := range tp.Nodes() {
		name := tp.Node(k).Name()
		st, replica := statuses[name], "-"
		if c := on[name]; c != nil {
			replica = c.GRPCAddr()
		}
		twOut.f("  %s\t%s\t%s\t%s\t%d\n", name, b.Zone(name), replica, st.GetAckedVersion(), st.GetBytesSent())
	}
	if err := errors.Join(twOut.err, tw.Flush()); err != nil {
		return err
	}

	grpcurl := b.GRPCurl()
	if grpcurl == "" {
		grpcurl = "grpcurl"
	}
	cp := b.ControlPlanes[0].LocalGRPCAddr()
	in := "ip netns exec " + b.HostNS() + " "
	var replicas []string
	for _, c := range b.ControlPlanes {
		replicas = append(replicas, c.LocalGRPCAddr())
	}
	// TLS against the CA bundle the control plane published, for the
	// name its certificate carries, and the token of an identity allowed
	// to read tables (it may list EndpointSlices).
	auth := b.GRPCurlShellArgs()
	out.f("\nWatch it (as root, in another terminal; TLS and a token of %s, which may list EndpointSlices):\n", box.DebugServiceAccount)
	out.f("  %s%s   # every node: replica, acked version, lag, last NACK\n", in, statusCommand(b, replicas))
	for _, addr := range replicas {
		out.f("  %s%s %s %s proxyplane.v1.TableService/ListNodes\n", in, grpcurl, auth, addr)
	}
	out.f("  %s%s %s -d '{\"node_name\": \"node-0\"}' %s proxyplane.v1.TableService/WatchTable\n", in, grpcurl, auth, cp)
	out.f("  %s%s %s %s proxyplane.v1.TableService/ListEvents\n", in, grpcurl, auth, cp)
	out.f("  %s%s -cacert %s -authority %s %s proxyplane.v1.TableService/ListNodes   # no token: Unauthenticated\n", in, grpcurl, b.CAFile(), b.ServerName(), cp)
	out.f("  ip netns exec %s iptables-nft -t nat -S | grep PP-   # node-0's rules\n", tp.Node(0).NS())
	out.f("  ip netns exec %s bash -c 'exec 3<>/dev/tcp/%s/%d; echo hi >&3; head -1 <&3'   # a request from the client\n",
		tp.ClientNS(), web.Spec.ClusterIP, box.ServicePort)
	out.f("  %skubectl --kubeconfig %s get svc,endpointslices -n %s   # if kubectl is installed\n",
		in, b.APIServer().AdminKubeconfig(), box.Namespace)
	out.f("\nListNodes lists every node a replica knows (each Node object), connected or not:\n" +
		"a node whose agent streams from the other replica shows only \"known\": true there.\n")
	return out.err
}

// statusCommand is `controlplane status` against every replica, with the
// credentials the grpcurl lines use.
func statusCommand(b *box.Box, replicas []string) string {
	bin := "controlplane"
	if dir, err := box.FindBinDir(); err == nil {
		bin = filepath.Join(dir, "controlplane")
	}
	cmd := bin + " status --server " + strings.Join(replicas, ",")
	if b.Credentials().Insecure {
		return cmd + " --insecure"
	}
	return fmt.Sprintf("%s --ca-file %s --server-name %s --token-file %s", cmd, b.CAFile(), b.ServerName(), b.DebugTokenFile())
}

// printer writes formatted text and keeps the first error, so a long
// report checks its writes once.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func allPods(tp *nstest.Topology) []int {
	out := make([]int, tp.Pods())
	for i := range out {
		out[i] = i
	}
	return out
}

// programTB is nstest.TB for a program: cleanups run at exit, last first;
// Fatalf and Skip stop the demo with their message.
type programTB struct {
	cleanups []func()
	failed   bool
}

// stopDemo carries a Fatalf or Skip message up to run.
type stopDemo struct{ msg string }

func (p *programTB) Helper()          {}
func (p *programTB) Name() string     { return "demo" }
func (p *programTB) Cleanup(f func()) { p.cleanups = append(p.cleanups, f) }

func (p *programTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (p *programTB) Errorf(format string, args ...any) {
	p.failed = true
	fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
}

func (p *programTB) Fatalf(format string, args ...any) {
	p.failed = true
	panic(stopDemo{fmt.Sprintf(format, args...)})
}

// Skip is how nstest and the box say something is missing (root, a
// binary, a kernel feature): for the demo that is fatal.
func (p *programTB) Skip(args ...any) {
	p.failed = true
	panic(stopDemo{fmt.Sprint(args...)})
}

func (p *programTB) runCleanups() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		func() {
			defer func() {
				if r := recover(); r != nil {
					var stop stopDemo
					if s, ok := r.(stopDemo); ok {
						stop = s
					} else {
						stop = stopDemo{fmt.Sprint(r)}
					}
					fmt.Fprintln(os.Stderr, "demo: cleanup:", errors.New(stop.msg))
				}
			}()
			p.cleanups[i]()
		}()
	}
	p.cleanups = nil
}
