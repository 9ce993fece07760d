// Command demo runs proxyplane as a cluster in a box until interrupted:
// the README's first command, `make demo` (as root).
//
// It starts e2e/box on real nodes: a real API server, controller manager
// and scheduler, and three nodes each running containerd and a kubelet
// in a network namespace of its own, with deploy/ applied, so that the
// control plane runs as the Deployment's two pods and the agents as the
// DaemonSet's pods, from the images `make images` built. It then runs a
// backend Deployment behind two sample Services, shows a request through
// a ClusterIP and a NodePort, prints every node's sync status and the
// commands to look around (kubectl, controlplane status, grpcurl), and
// waits. Ctrl-C removes everything it created.
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

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

// startTimeout bounds bringing the box up: about a minute on an idle
// 2-core machine (nodes Ready in 15 s, deploy/'s pods in 35 s more).
const startTimeout = 6 * time.Minute

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

	fmt.Println("starting a cluster in a box: API server, controllers, 3 nodes with containerd and a kubelet, deploy/ applied ...")
	b, err := box.Start(startCtx, tb, box.Options{Kubelets: true})
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

// show runs the sample backends and Services and prints what a user
// wants to see.
func show(ctx context.Context, w io.Writer, b *box.Box) error {
	out := &printer{w: w}
	tp := b.Topology()
	admin := b.Admin()
	web := box.BackendDeployment("web", 3, "")
	labels := web.Spec.Selector.MatchLabels
	if _, err := admin.AppsV1().Deployments(box.Namespace).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the web Deployment: %w", err)
	}
	svc, err := admin.CoreV1().Services(box.Namespace).Create(ctx, service("web", corev1.ServiceTypeClusterIP, labels), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service web: %w", err)
	}
	np, err := admin.CoreV1().Services(box.Namespace).Create(ctx, service("web-nodeport", corev1.ServiceTypeNodePort, labels), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service web-nodeport: %w", err)
	}
	nodePort := int(np.Spec.Ports[0].NodePort)

	out.f("\nServices (in namespace %s), both in front of Deployment web's 3 pods:\n", box.Namespace)
	out.f("  web           ClusterIP %s\n", svc.Spec.ClusterIP)
	out.f("  web-nodeport  NodePort  %d\n", nodePort)

	clusterAddr := box.ClusterAddr(svc)
	nodeAddr := nstest.HostPort(tp.Node(1).IP(), nodePort)
	for _, addr := range []string{clusterAddr, nodeAddr} {
		if err := b.WaitTraffic(ctx, tp.ClientNS(), addr, ""); err != nil {
			return err
		}
	}
	out.f("\nRequests (each answered by the pod's name and the source address it saw):\n")
	for _, req := range []struct{ from, fromNS, addr string }{
		{"node-2", tp.Node(2).NS(), clusterAddr},
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

	kubeconfig, err := b.KubeconfigOnLoopback(ctx)
	if err != nil {
		return err
	}
	kubectl := "kubectl"
	if dir, err := box.FindBinDir(); err == nil && fileExists(filepath.Join(dir, "kubectl")) {
		kubectl = filepath.Join(dir, "kubectl")
	}
	out.f("\nLook around (in another terminal, as root):\n")
	out.f("  export KUBECONFIG=%s\n", kubeconfig)
	out.f("  %s get pods -A -o wide                 # the control plane and agent pods, the backends\n", kubectl)
	out.f("  %s -n %s logs ds/proxyplane-nodeagent   # an agent's log\n", kubectl, b.Deployment().Namespace)
	out.f("  %s get endpointslices -n %s\n", kubectl, box.Namespace)

	grpcurl := b.GRPCurl()
	if grpcurl == "" {
		grpcurl = "grpcurl"
	}
	// From host-0, a machine on the nodes' LAN, to the replicas' pods on
	// the control-plane nodes.
	in := "ip netns exec " + b.HostNS() + " "
	var replicas []string
	for _, c := range b.ControlPlanes {
		replicas = append(replicas, c.GRPCAddr())
	}
	cp := replicas[0]
	// TLS against the CA bundle the control plane published, for the
	// name its certificate carries, and the token of an identity allowed
	// to read tables (it may list EndpointSlices).
	auth := b.GRPCurlShellArgs()
	out.f("\nWatch the control plane (TLS and a token of %s, which may list EndpointSlices):\n", box.DebugServiceAccount)
	out.f("  %s%s   # every node: replica, acked version, lag, last NACK\n", in, statusCommand(b, replicas))
	out.f("  %s%s --node node-0 --service %s/web   # node-0's entry for web and why: endpoints, topology, policies, acknowledged\n",
		in, strings.Replace(statusCommand(b, replicas), " status ", " explain ", 1), box.Namespace)
	out.f("  %s%s %s %s proxyplane.v1.TableService/ListNodes\n", in, grpcurl, auth, cp)
	out.f("  %s%s %s -d '{\"node_name\": \"node-0\", \"namespace\": \"%s\", \"name\": \"web\"}' %s proxyplane.v1.TableService/Explain\n",
		in, grpcurl, auth, box.Namespace, cp)
	out.f("  %s%s %s -d '{\"node_name\": \"node-0\"}' %s proxyplane.v1.TableService/WatchTable\n", in, grpcurl, auth, cp)
	out.f("  %s%s %s %s proxyplane.v1.TableService/ListEvents\n", in, grpcurl, auth, cp)
	out.f("  %s%s -cacert %s -authority %s %s proxyplane.v1.TableService/ListNodes   # no token: Unauthenticated\n", in, grpcurl, b.CAFile(), b.ServerName(), cp)
	out.f("  ip netns exec %s iptables-nft -t nat -S | grep PP-   # node-0's rules\n", tp.Node(0).NS())
	out.f("  ip netns exec %s bash -c 'exec 3<>/dev/tcp/%s/%d; echo hi >&3; head -1 <&3'   # a request from the client\n",
		tp.ClientNS(), svc.Spec.ClusterIP, box.ServicePort)
	out.f("\nListNodes lists every node a replica knows (each Node object), connected or not:\n" +
		"a node whose agent streams from the other replica shows only \"known\": true there.\n")
	return out.err
}

// service is a sample Service of type typ in front of the pods labels
// select.
func service(name string, typ corev1.ServiceType, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: box.Namespace},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "tcp", Port: box.ServicePort, TargetPort: intstr.FromInt32(box.BackendPort), Protocol: corev1.ProtocolTCP}},
		},
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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
