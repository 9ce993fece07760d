package box

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/proxyplane/proxyplane/e2e/cluster"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// BinDirEnv names the environment variable that overrides where the
// box looks for controlplane, nodeagent and grpcurl; `make e2e` sets it.
const BinDirEnv = "E2E_BIN_DIR"

// Defaults of Options, each with its reason.
const (
	// DefaultNodes is three nodes in three zones: enough for topology
	// (zones, local endpoints), for cross-node traffic, and for one node
	// to be disturbed while the others carry a probe.
	DefaultNodes = 3
	// DefaultPodsPerNode is two, so a node has local endpoints to choose
	// between.
	DefaultPodsPerNode = 2
	// DefaultReplicas is deploy/'s replica count: enough for an agent to
	// fail over.
	DefaultReplicas = 2
	// firstGRPCPort is deploy/'s gRPC port; replica i adds 10i, and its
	// metrics port is one more.
	firstGRPCPort = 9640
	// serviceCIDRs are the ranges nstest routes to the nodes (and the
	// client routes via node-0), so ClusterIPs from the API server are
	// reachable the way a cluster's are.
	serviceCIDRs = "10.96.0.0/16,fd00:96::/112"
)

// Options configure Start. The zero value is the box the scenarios use.
type Options struct {
	// Dir holds all the box's state: the API server's data, kubeconfigs,
	// the rendered overlay, the agents' state directories and every log.
	// Empty means a new temporary directory, deleted by Close unless the
	// box failed.
	Dir string
	// Nodes is the number of nodes (zones zone-a, zone-b, ...); 0 means
	// DefaultNodes.
	Nodes int
	// PodsPerNode is the number of backend pods on each node; 0 means
	// DefaultPodsPerNode.
	PodsPerNode int
	// Replicas is the number of control plane replicas; 0 means
	// DefaultReplicas.
	Replicas int
	// BinDir holds controlplane, nodeagent and grpcurl; empty means
	// $E2E_BIN_DIR, else the nearest .bin above the working directory
	// that holds controlplane.
	BinDir string
	// APIServer is the e2e-apiserver binary; empty means
	// cluster.BinaryPath.
	APIServer string
	// DeployDir is the kustomize base to render and apply; empty means
	// FindDeployDir.
	DeployDir string
	// Config sets keys of deploy/config.env in the overlay, over the box's
	// own (CONTROL_PLANE_ADDRESSES and IPTABLES_BACKEND=nft).
	Config map[string]string
	// Kubelets runs every node as a real node (e2e/box/node: containerd,
	// runc, the CNI plugins and upstream's kubelet), and upstream's
	// kube-controller-manager and kube-scheduler beside the API server:
	// deploy/ is applied and proxyplane runs as its Deployment's and
	// DaemonSet's pods, from the images `make images` built. The box then
	// starts no backends: tests run them as pods. Replicas must not
	// exceed Nodes: nodes 0 to Replicas-1 are the control-plane nodes.
	// Insecure is ignored.
	Kubelets bool
	// Insecure runs the control planes and agents with --insecure
	// (plaintext, no tokens) and the box's clients in plaintext: only to
	// measure what authentication costs. Otherwise everything runs with
	// TLS and tokens, as deploy/ does.
	Insecure bool
}

// TB is what the box needs of a test: nstest's TB. A program that builds
// a box outside a test (the demo) passes its own and runs the cleanups on
// exit.
type TB = nstest.TB

// Box is a cluster in a box: a real API server, deploy/ applied to it,
// control plane replicas running as deploy/'s ServiceAccount, one node
// agent per node namespace and backend pods, all in network namespaces
// built by nstest. Its methods may be called from one test goroutine at a
// time.
type Box struct {
	tb   TB
	opts Options
	tp   *nstest.Topology
	dir  string
	// ownDir is true when Start created dir and Close should remove it.
	ownDir bool

	api     *cluster.Cluster
	adminRC *rest.Config
	admin   kubernetes.Interface
	cpRC    *rest.Config
	deploy  *Deployment

	// ControlPlanes are the replicas, by index.
	ControlPlanes []*ControlPlane
	// Agents are the node agents, by node index.
	Agents []*Agent
	// kubeProxies are upstream kube-proxies made by KubeProxy, by node
	// index; relays stop their API server relays.
	kubeProxies map[int]*KubeProxy
	relays      []func()

	zones   map[string]string // by node name
	grpcurl string
	// caFile, serverName, debugToken and debugTokenFile are what the box's
	// own clients authenticate with (Credentials).
	caFile, serverName         string
	debugToken, debugTokenFile string
	// kubelet writes the agents' tokens and CA bundle; stopKubelet ends
	// its goroutine and waits for it.
	kubelet     *kubelet
	stopKubelet func()
	// nodes are the real nodes and controllers (Options.Kubelets).
	nodes    *kubeletParts
	closeMu  sync.Mutex // guards closed
	closed   bool
	binaries struct{ controlplane, nodeagent string }
}

// FindBinDir returns the directory holding the box's binaries:
// $E2E_BIN_DIR if set, otherwise the nearest .bin above the working
// directory that holds controlplane.
func FindBinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, nil
	}
	return findUp(func(dir string) (string, bool) {
		p := filepath.Join(dir, ".bin")
		_, err := os.Stat(filepath.Join(p, "controlplane"))
		return p, err == nil
	}, ".bin/controlplane")
}

// Requirements skips tb, saying what to build or run, unless the box can
// start: root (network namespaces), e2e-apiserver, and the controlplane
// and nodeagent binaries. It returns the options with the binaries found.
func Requirements(tb TB, opts Options) Options {
	tb.Helper()
	nstest.RequireRoot(tb)
	if opts.APIServer == "" {
		p, err := cluster.BinaryPath()
		if err != nil {
			tb.Skip(fmt.Sprintf("e2e-apiserver is not built (%v): run `make e2e-apiserver`, or `make e2e` to build and run everything", err))
		}
		opts.APIServer = p
	}
	if opts.BinDir == "" {
		d, err := FindBinDir()
		if err != nil {
			tb.Skip(fmt.Sprintf("controlplane and nodeagent are not built (%v): run `make build`, or `make e2e`", err))
		}
		opts.BinDir = d
	}
	for _, b := range []string{"controlplane", "nodeagent"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			tb.Skip(fmt.Sprintf("%s is not built (%v): run `make build`, or `make e2e`", b, err))
		}
	}
	return opts
}

// Start builds and starts a box, and registers its Close with tb. It
// skips tb when Requirements would, and returns an error when any part
// fails to start (nstest fails tb itself when the kernel refuses a
// namespace). ctx bounds the start only.
func Start(ctx context.Context, tb TB, opts Options) (*Box, error) {
	tb.Helper()
	opts = Requirements(tb, opts)
	if opts.Nodes == 0 {
		opts.Nodes = DefaultNodes
	}
	if opts.PodsPerNode == 0 {
		opts.PodsPerNode = DefaultPodsPerNode
	}
	if opts.Replicas == 0 {
		opts.Replicas = DefaultReplicas
	}
	if opts.Nodes > 26 || opts.Replicas > 9 {
		return nil, fmt.Errorf("box: at most 26 nodes (zones zone-a to zone-z) and 9 replicas, got %d and %d", opts.Nodes, opts.Replicas)
	}
	if opts.Kubelets {
		kubeletRequirements(tb, opts)
		if opts.Replicas > opts.Nodes {
			return nil, fmt.Errorf("box: %d replicas need as many control-plane nodes, got %d nodes", opts.Replicas, opts.Nodes)
		}
		opts.Insecure = false
	}
	if opts.DeployDir == "" {
		d, err := FindDeployDir()
		if err != nil {
			return nil, err
		}
		opts.DeployDir = d
	}
	b := &Box{tb: tb, opts: opts, zones: map[string]string{}}
	b.binaries.controlplane = filepath.Join(opts.BinDir, "controlplane")
	b.binaries.nodeagent = filepath.Join(opts.BinDir, "nodeagent")
	if p := filepath.Join(opts.BinDir, "grpcurl"); fileExists(p) {
		b.grpcurl = p
	}
	b.dir = opts.Dir
	if b.dir == "" {
		d, err := os.MkdirTemp("", "proxyplane-box-")
		if err != nil {
			return nil, fmt.Errorf("creating the box's directory: %w", err)
		}
		b.dir, b.ownDir = d, true
	}
	// nstest bounds its own waits; it takes no context.
	b.tp = nstest.New(tb, nstest.Options{Nodes: opts.Nodes, Pods: opts.PodsPerNode, Hosts: 1}) //nolint:contextcheck
	// Registered after nstest's: cleanups run last-in first-out, so the
	// processes stop before their namespaces go. ctx bounds only the
	// start, so the stop gets a deadline of its own.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute) // real nodes take up to 40 s each
		defer cancel()
		if err := b.Close(ctx); err != nil {
			tb.Errorf("closing the box: %v", err)
		}
	})
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// criticalPodsLimited is the API server's admission configuration: pods
// of the system-node-critical and system-cluster-critical priority
// classes are admitted only in a namespace with a ResourceQuota covering
// that class, as GKE and hardened clusters configure it (kube-system
// ships one). deploy/quota.yaml is that quota for proxyplane's namespace;
// without it the box's agent Pods are refused.
const criticalPodsLimited = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: [system-node-critical, system-cluster-critical]
`

func (b *Box) start(ctx context.Context) error {
	for _, d := range []string{"logs", "agents"} {
		if err := os.MkdirAll(filepath.Join(b.dir, d), 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	host := b.tp.HostNS(0)
	admission := filepath.Join(b.dir, "admission.yaml")
	if err := os.WriteFile(admission, []byte(criticalPodsLimited), 0o600); err != nil {
		return fmt.Errorf("writing the API server's admission configuration: %w", err)
	}
	apiDir := filepath.Join(b.dir, "apiserver")
	var extraArgs []string
	if b.opts.Kubelets {
		var err error
		if extraArgs, err = b.seedAPIServer(apiDir); err != nil {
			return err
		}
	}
	api, err := cluster.New(ctx, cluster.Config{
		Binary: b.opts.APIServer,
		Dir:    apiDir,
		// Inside host-0, where the control planes run: its 127.0.0.1 is
		// theirs, and nothing of it touches the machine's own network.
		CommandPrefix: []string{"ip", "netns", "exec", host},
		// Dual-stack, in the ranges nstest routes; parsed after the
		// binary's own --service-cluster-ip-range, so it wins. Privileged
		// containers allowed, as on every real cluster (kubeadm sets it;
		// kube-proxy's DaemonSet needs it): the agent's init container
		// is one. Critical priority classes limited to namespaces with
		// a quota for them, as on GKE (criticalPodsLimited).
		APIServerArgs: append([]string{
			"--service-cluster-ip-range=" + serviceCIDRs, "--allow-privileged=true",
			"--admission-control-config-file=" + admission,
		}, extraArgs...),
	})
	if err != nil {
		return fmt.Errorf("starting the API server: %w", err)
	}
	b.api = api
	rc, err := api.AdminConfig()
	if err != nil {
		return err
	}
	b.adminRC = inNamespace(rc, b.tp, host)
	if b.admin, err = kubernetes.NewForConfig(b.adminRC); err != nil {
		return fmt.Errorf("creating the admin client: %w", err)
	}

	config := map[string]string{
		// nstest's namespaces start with no rules at all; nft is what
		// "auto" would pick there, named so the box never depends on a
		// probe of both backends.
		"IPTABLES_BACKEND": "nft",
	}
	if b.opts.Kubelets {
		return b.startOnKubelets(ctx, config)
	}
	var addrs []string
	for i := range b.opts.Replicas {
		addrs = append(addrs, b.tp.HostIP(0).String()+":"+strconv.Itoa(firstGRPCPort+10*i))
	}
	config["CONTROL_PLANE_ADDRESSES"] = strings.Join(addrs, ",")
	for k, v := range b.opts.Config {
		config[k] = v
	}
	if b.deploy, err = renderDeploy(b.opts.DeployDir, filepath.Join(b.dir, "overlay"), config); err != nil {
		return err
	}
	if err := b.deploy.apply(ctx, b.adminRC); err != nil {
		return fmt.Errorf("applying deploy/: %w", err)
	}
	if err := writeFiles(b.controlplaneMounts(), b.deploy.ControlplaneFiles); err != nil {
		return err
	}
	cpKubeconfig := filepath.Join(b.dir, "controlplane.kubeconfig")
	if err := serviceAccountKubeconfig(ctx, b.admin, b.deploy.ServiceAccount, api.URL(), api.Info().CAFile, cpKubeconfig); err != nil {
		return err
	}
	cpRC, err := restConfigFrom(cpKubeconfig)
	if err != nil {
		return err
	}
	b.cpRC = inNamespace(cpRC, b.tp, host)
	if err := b.waitGrant(ctx); err != nil {
		return err
	}
	b.caFile = filepath.Join(b.dir, "ca.crt")
	b.debugTokenFile = filepath.Join(b.dir, "debug.token")
	b.serverName = "proxyplane-controlplane." + b.deploy.Namespace + ".svc"
	if !b.opts.Insecure {
		if err := b.setUpDebugIdentity(ctx); err != nil {
			return err
		}
	}
	if _, err := b.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}
	for k := range b.tp.Nodes() {
		n := b.tp.Node(k)
		b.zones[n.Name()] = zoneName(k)
		if _, err := b.admin.CoreV1().Nodes().Create(ctx, nodeObject(n, zoneName(k)), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating Node %s: %w", n.Name(), err)
		}
	}

	for i := range b.opts.Replicas {
		grpcPort := firstGRPCPort + 10*i
		// Outside a pod: the kubeconfig stands for the projected token,
		// and the replicas, sharing host-0, need ports of their own.
		// pflag keeps the last value of a repeated flag.
		argv := b.controlplaneArgv("--kubeconfig="+cpKubeconfig,
			// Metrics on loopback: plaintext and open, as the box scrapes
			// them (on any other address they are HTTPS behind the API
			// server's authorization).
			"--grpc-address=:"+strconv.Itoa(grpcPort), "--metrics-address=127.0.0.1:"+strconv.Itoa(grpcPort+1))
		// The box polls ListNodes and WatchTable from host-0's loopback
		// many times a second (every wait in the box does), far above the
		// per-address limit sized for an operator's grpcurl and an
		// agent's reconnects, so it lifts that limit; the control plane's
		// own tests cover it.
		argv = append(argv, "--peer-rate=0")
		if b.opts.Insecure {
			argv = append(argv, "--insecure")
		}
		name := "controlplane-" + strconv.Itoa(i)
		b.ControlPlanes = append(b.ControlPlanes, &ControlPlane{
			Process: newProcess(name, host, filepath.Join(b.dir, "logs", name+".log"), argv, b.deploy.ControlplaneEnv),
			Index:   i, GRPCPort: grpcPort, MetricsPort: grpcPort + 1,
			tp: b.tp, ns: host, ip: b.tp.HostIP(0).String(), creds: b.Credentials,
		})
	}
	if err := b.StartControlPlanes(ctx); err != nil {
		return err
	}

	for i := range b.tp.Pods() {
		b.tp.ServeTCP(i, BackendPort)
		b.tp.ServeUDP(i, BackendPort)
	}
	for k := range b.tp.Nodes() {
		n := b.tp.Node(k)
		stateDir := filepath.Join(b.dir, "agents", n.Name())
		mounts := filepath.Join(b.dir, "mounts", n.Name())
		a := &Agent{
			Node: n, StateDir: stateDir, tp: b.tp,
			TokenFile: hostPath(mounts, b.deploy.AgentMounts.TokenPath),
			CAFile:    hostPath(mounts, b.deploy.AgentMounts.CAPath),
		}
		// The DaemonSet's hostPath and volumes, per node here since the
		// nodes share this machine's filesystem.
		if err := writeFiles(mounts, b.deploy.NodeagentFiles); err != nil {
			return err
		}
		nodeArgv := func(args []string) []string {
			argv := []string{b.binaries.nodeagent}
			for _, arg := range args {
				argv = append(argv, strings.ReplaceAll(arg, "$(NODE_NAME)", n.Name()))
			}
			return append(argv, hostArgs(args, b.deploy.NodeagentFiles, mounts)...)
		}
		nodeEnv := func(environ []string) []string {
			var env []string
			for _, e := range environ {
				env = append(env, strings.ReplaceAll(e, "$(NODE_NAME)", n.Name()))
			}
			return env
		}
		// The init containers run once, before the agent's first start,
		// as for a new pod; a restart of the agent's process is one of
		// its container.
		for _, c := range b.deploy.NodeagentInit {
			name := "nodeagent-" + n.Name() + "-" + c.Name
			p := newProcess(name, n.NS(), filepath.Join(b.dir, "logs", name+".log"), nodeArgv(c.Args), nodeEnv(c.Env))
			if err := p.Run(ctx); err != nil {
				return fmt.Errorf("init container %s on %s: %w", c.Name, n.Name(), err)
			}
		}
		argv := nodeArgv(b.deploy.NodeagentArgs)
		argv = append(argv, "--state-dir="+stateDir)
		if b.opts.Insecure {
			argv = append(argv, "--insecure")
		} else {
			argv = append(argv, "--token-file="+a.TokenFile, "--ca-file="+a.CAFile)
			// The pod the DaemonSet controller would create, so that the
			// token is bound to it and names its node.
			if a.Pod, err = b.CreateAgentPod(ctx, nodeagentDaemonSet+"-"+n.Name(), n.Name()); err != nil {
				return err
			}
		}
		name := "nodeagent-" + n.Name()
		a.Process = newProcess(name, n.NS(), filepath.Join(b.dir, "logs", name+".log"), argv, nodeEnv(b.deploy.NodeagentEnv))
		b.Agents = append(b.Agents, a)
	}
	if !b.opts.Insecure {
		b.kubelet = &kubelet{b: b, renew: map[string]time.Time{}, written: map[string]string{}, held: map[string]bool{}}
		// The replicas publish the bundle as they become ready.
		if err := b.waitCA(ctx); err != nil {
			return err
		}
		kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); b.kubelet.run(kctx) }()
		b.stopKubelet = func() { cancel(); <-done }
	}
	for _, a := range b.Agents {
		if err := a.Start(); err != nil {
			return err
		}
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		return err
	}
	return nil
}

// waitGrant waits until the control plane's identity may list what it
// watches.
func (b *Box) waitGrant(ctx context.Context) error {
	if err := waitCanList(ctx, b.cpRC); err != nil {
		return fmt.Errorf("waiting for deploy/'s RBAC to admit the control plane's ServiceAccount: %w", err)
	}
	return nil
}

// waitCanList waits until rc's identity may list what a proxy watches
// (Services, EndpointSlices, Nodes): the RBAC authorizer learns of new
// bindings through an informer, a moment after they are created.
func waitCanList(ctx context.Context, rc *rest.Config) error {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	return Eventually(ctx, func() error {
		if _, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		if _, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
}

// WaitProgrammed waits until every node's table satisfies check (nil
// accepts any) on every running replica, the running replicas agree on
// its version, a replica reports the node's agent connected with that
// version acknowledged (the agent acknowledges only what it has
// programmed), and the agent's metrics report no other version in force.
// It returns each node's version. With no replica running it fails at
// once.
func (b *Box) WaitProgrammed(ctx context.Context, check func(node string, s *pb.Snapshot) error) (map[string]string, error) {
	versions := map[string]string{}
	err := Eventually(ctx, func() error {
		running := b.runningControlPlanes()
		if len(running) == 0 {
			return Permanent(errors.New("no control plane replica is running"))
		}
		statuses := map[string]*pb.NodeStatus{}
		for _, c := range running {
			resp, err := c.ListNodes(ctx)
			if err != nil {
				return err
			}
			for _, st := range resp.GetNodes() {
				if st.GetConnected() {
					statuses[st.GetNodeName()] = st
				}
			}
		}
		for _, a := range b.Agents {
			node := a.Node.Name()
			version := ""
			for _, c := range running {
				s, err := c.Table(ctx, node)
				if err != nil {
					return err
				}
				if check != nil {
					if err := check(node, s); err != nil {
						return fmt.Errorf("%s's table on %s: %w", node, c.Name(), err)
					}
				}
				if version != "" && s.GetVersion() != version {
					return fmt.Errorf("replicas disagree on %s's table: %s and %s", node, version, s.GetVersion())
				}
				version = s.GetVersion()
			}
			st := statuses[node]
			if st == nil {
				return fmt.Errorf("%s is connected to no running replica", node)
			}
			if st.GetAckedVersion() != version {
				return fmt.Errorf("%s has acknowledged %q, its table is %s", node, st.GetAckedVersion(), version)
			}
			state, err := a.State(ctx)
			if err != nil {
				return err
			}
			// An agent restarted from its cache reports no version until
			// its table next changes (proxyplane_agent_applied_version_info
			// is set only when the version in force changes, and the cached
			// table is in force from the start). The acknowledgement above
			// already says what it holds; a version it reports must agree.
			if state.Version != version && state.Version != "" {
				return fmt.Errorf("%s's agent has %q in force, its table is %s", node, state.Version, version)
			}
			versions[node] = version
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for every node's table to be programmed: %w", err)
	}
	return versions, nil
}

// StartControlPlanes starts every replica that is not running and waits
// until all are ready.
func (b *Box) StartControlPlanes(ctx context.Context) error {
	for _, c := range b.ControlPlanes {
		if c.Running() {
			continue
		}
		if err := c.Start(); err != nil {
			return err
		}
	}
	for _, c := range b.ControlPlanes {
		if err := c.WaitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// StopControlPlanes stops every replica gracefully, all at once: each
// takes its shutdown grace to let its streams go, and in turn they would
// take that many times as long.
func (b *Box) StopControlPlanes(ctx context.Context) error {
	errs := make([]error, len(b.ControlPlanes))
	var wg sync.WaitGroup
	for i, c := range b.ControlPlanes {
		wg.Go(func() { errs[i] = c.Stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// KillControlPlanes kills every replica (SIGKILL), as a crash of all
// would.
func (b *Box) KillControlPlanes() {
	for _, c := range b.ControlPlanes {
		c.Kill()
	}
}

func (b *Box) runningControlPlanes() []*ControlPlane {
	var out []*ControlPlane
	for _, c := range b.ControlPlanes {
		if c.Running() {
			out = append(out, c)
		}
	}
	return out
}

// Connections returns, for every node, the replica its agent is
// connected to and that replica's status for it, from every running
// replica's ListNodes.
func (b *Box) Connections(ctx context.Context) (map[string]*ControlPlane, map[string]*pb.NodeStatus, error) {
	on := map[string]*ControlPlane{}
	statuses := map[string]*pb.NodeStatus{}
	for _, c := range b.runningControlPlanes() {
		resp, err := c.ListNodes(ctx)
		if err != nil {
			return nil, nil, err
		}
		for _, st := range resp.GetNodes() {
			if st.GetConnected() {
				on[st.GetNodeName()], statuses[st.GetNodeName()] = c, st
			}
		}
	}
	return on, statuses, nil
}

// Admin returns a client acting as the API server's admin
// (system:masters).
func (b *Box) Admin() kubernetes.Interface { return b.admin }

// AdminConfig returns a copy of the admin's client configuration; it
// dials the API server inside host-0.
func (b *Box) AdminConfig() *rest.Config { return rest.CopyConfig(b.adminRC) }

// ControlplaneConfig returns a copy of the client configuration the
// control planes use: deploy/'s ServiceAccount, with its token.
func (b *Box) ControlplaneConfig() *rest.Config { return rest.CopyConfig(b.cpRC) }

// APIServer returns the API server, to stop, kill or restart it.
func (b *Box) APIServer() *cluster.Cluster { return b.api }

// Deployment returns deploy/ as rendered and applied.
func (b *Box) Deployment() *Deployment { return b.deploy }

// Dir returns the directory holding the box's state and logs.
func (b *Box) Dir() string { return b.dir }

// GRPCurl returns the path of grpcurl, or "" when it is not built.
func (b *Box) GRPCurl() string { return b.grpcurl }

// HostNS returns the namespace of host-0, where the API server and the
// control planes run.
func (b *Box) HostNS() string { return b.tp.HostNS(0) }

// Zone returns node's zone.
func (b *Box) Zone(node string) string { return b.zones[node] }

// Close stops every agent, control plane and the API server, gracefully
// and then by force, and deletes the box's directory when Start created
// it and tb has not failed; when tb has, it logs the end of every log
// first. nstest deletes the namespaces in its own cleanup. Closing twice
// does nothing.
func (b *Box) Close(ctx context.Context) error {
	b.closeMu.Lock()
	defer b.closeMu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	failed := b.failed()
	if failed {
		b.logTails()
	}
	if b.stopKubelet != nil {
		b.stopKubelet()
	}
	var errs []error
	for _, kp := range b.kubeProxies {
		errs = append(errs, kp.Stop(ctx))
	}
	for _, stop := range b.relays {
		stop()
	}
	for _, a := range b.Agents {
		errs = append(errs, a.Stop(ctx))
	}
	errs = append(errs, b.StopControlPlanes(ctx))
	if b.nodes != nil {
		errs = append(errs, b.closeKubelets(ctx))
	}
	if b.api != nil {
		errs = append(errs, b.api.Stop(ctx))
	}
	if b.ownDir && !failed {
		errs = append(errs, os.RemoveAll(b.dir))
	} else {
		b.tb.Logf("box: state and logs kept in %s", b.dir)
	}
	return errors.Join(errs...)
}

// failed reports whether tb has failed, when it can tell.
func (b *Box) failed() bool {
	f, ok := b.tb.(interface{ Failed() bool })
	return ok && f.Failed()
}

// logTails logs the end of every process's log.
func (b *Box) logTails() {
	const lines = 40
	if b.api != nil {
		b.tb.Logf("last lines of %s:\n%s", b.api.LogPath(), b.api.LogTail(lines))
	}
	if b.nodes != nil {
		b.nodes.logTails(b.tb, lines)
		return
	}
	for _, c := range b.ControlPlanes {
		b.tb.Logf("last lines of %s:\n%s", c.LogPath(), c.LogTail(lines))
	}
	for _, a := range b.Agents {
		b.tb.Logf("last lines of %s:\n%s", a.LogPath(), a.LogTail(lines))
	}
	for _, kp := range b.kubeProxies {
		b.tb.Logf("last lines of %s:\n%s", kp.LogPath(), kp.LogTail(lines))
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// controlplaneMounts is the directory standing for the control plane
// containers' root, where the box writes the files of their ConfigMap
// volumes; the replicas share it, as they share the Deployment's
// ConfigMaps.
func (b *Box) controlplaneMounts() string { return filepath.Join(b.dir, "mounts", "controlplane") }

// controlplaneArgv is the Deployment's command line with its file
// arguments pointed at the box's copies, then args, which win over both
// (pflag keeps the last value of a repeated flag).
func (b *Box) controlplaneArgv(args ...string) []string {
	argv := append([]string{b.binaries.controlplane}, b.deploy.ControlplaneArgs...)
	argv = append(argv, hostArgs(b.deploy.ControlplaneArgs, b.deploy.ControlplaneFiles, b.controlplaneMounts())...)
	return append(argv, args...)
}

// metricsBeyondLoopback reports whether the last --metrics-address of
// args (pflag keeps the last) is on an address other than loopback,
// where the control plane serves HTTPS.
func metricsBeyondLoopback(args []string) bool {
	beyond := false
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-address="); ok {
			host, _, err := net.SplitHostPort(v)
			ip := net.ParseIP(host)
			beyond = err == nil && host != "localhost" && (ip == nil || !ip.IsLoopback())
		}
	}
	return beyond
}

// HTTPClient returns an HTTP client whose connections start in network
// namespace ns (a client, a node or a pod of the box), with tlsConfig
// for https URLs; each request has its own connection.
func (b *Box) HTTPClient(ns string, tlsConfig *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: dialIn(b.tp, ns), TLSClientConfig: tlsConfig, DisableKeepAlives: true}}
}

// Dial opens a TCP connection from network namespace ns to addr.
func (b *Box) Dial(ctx context.Context, ns, addr string) (net.Conn, error) {
	return dialIn(b.tp, ns)(ctx, "tcp", addr)
}

// StartExtraControlPlane starts one more replica, name, on port (gRPC;
// metrics on port+1) in host-0, with the Deployment's arguments and args
// after them, and waits until it is ready. No agent lists its address and
// the box's waits ignore it, so a scenario can open streams to it for any
// node without displacing that node's agent. It is stopped with the box.
func (b *Box) StartExtraControlPlane(ctx context.Context, name string, port int, args ...string) (*ControlPlane, error) {
	argv := b.controlplaneArgv(append([]string{
		"--kubeconfig=" + filepath.Join(b.dir, "controlplane.kubeconfig"),
		"--grpc-address=:" + strconv.Itoa(port), "--metrics-address=127.0.0.1:" + strconv.Itoa(port+1), "--peer-rate=0",
	}, args...)...)
	c := &ControlPlane{
		Process: newProcess(name, b.HostNS(), filepath.Join(b.dir, "logs", name+".log"), argv, b.deploy.ControlplaneEnv),
		Index:   -1, GRPCPort: port, MetricsPort: port + 1, MetricsHTTPS: metricsBeyondLoopback(args),
		tp: b.tp, ns: b.HostNS(), ip: b.tp.HostIP(0).String(), creds: b.Credentials,
	}
	b.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			b.tb.Errorf("stopping %s: %v", name, err)
		}
	})
	if err := c.StartReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}
