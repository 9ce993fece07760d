// Command fleet measures the real control plane binary at the scale of a
// large cluster, on one machine, against the real API server, and prints
// one Markdown table (and writes the raw figures as JSON).
//
// It starts e2e-apiserver (e2e/cluster), creates N Nodes in three zones
// and S Services with EndpointSlices shaped as the EndpointSlice
// controller writes them (10% topology-hinted, 5% externalTrafficPolicy
// Local by default), runs .bin/controlplane as a process of its own, and
// runs N simulated agents in another process (this binary again, `fleet
// agents`, internal/agentsim), each on its own TCP connection. Then it
// measures, phase by phase:
//
//   - cold start: every agent connects with an empty cache within about a
//     second; until every agent holds a valid table;
//   - steady changes: C endpoint changes at a pace, each stamped with its
//     own trigger time; until every agent that must see a change has ACKed
//     it;
//   - restart: the control plane is stopped (SIGTERM) and started again;
//     agents reconnect with their versions, as nodeagent does, and must
//     receive nothing;
//   - the gRPC floor: a minimal gRPC server with the control plane's
//     transport options and N clients with the agents', one small
//     message out and one reply back per round at the same pace
//     (internal/floor): what grpc-go itself costs for the steady
//     exchange, on this machine, in this run (--only-floor runs it alone);
//   - the peer: N' kube-proxy-style informer sets (`fleet peer`,
//     internal/peer) against the same API server, with the control plane
//     stopped: the API server's CPU and bytes for their initial sync and
//     per change.
//
// With --secure, the run is production's: the harness creates the
// namespace proxyplane-system, the agents' ServiceAccount, a Pod per node
// (Pending: nothing runs it) and a token bound to each (audience
// proxyplane, as the kubelet projects it); the control plane runs without
// --insecure, bootstraps its CA and serves TLS; the agents verify it
// against the published bundle and send their tokens, which it reviews.
// Without it, the control plane runs with --insecure. The table's header
// names the mode.
//
// For each: the CPU of every process (control plane, API server with its
// etcd, agents, peer, this harness: they share the machine's cores), the
// control plane's peak and steady RSS and heap, and bytes sent. Run it
// with `make bench-fleet FLEET_FLAGS='--nodes=1000 --services=1000'`.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/agentsim"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/floor"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/peer"
)

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	role, args := os.Getenv(roleEnv), os.Args[1:]
	if role == "" && len(args) > 0 && slices.Contains([]string{roleAgents, rolePeer, roleFloorServer, roleFloorClients}, args[0]) {
		role, args = args[0], args[1:]
	}
	if role != "" {
		if err := runRole(ctx, role, args); err != nil {
			log.Printf("fleet %s: %v", role, err)
			stop()
			os.Exit(1)
		}
		return
	}
	o := newOptions()
	fs := pflag.NewFlagSet("fleet", pflag.ExitOnError)
	o.AddFlags(fs)
	_ = fs.Parse(args)
	if err := o.Validate(); err != nil {
		log.Fatal(err)
	}
	res, err := run(ctx, o)
	if err != nil {
		log.Printf("fleet: %v", err)
		stop()
		os.Exit(1)
	}
	printTable(os.Stdout, res)
}

// runRole runs one of the child processes.
func runRole(ctx context.Context, role string, args []string) error {
	switch role {
	case roleAgents:
		return agentsim.Main(ctx, args, os.Stdout)
	case rolePeer:
		return peer.Main(ctx, args, os.Stdout)
	case roleFloorServer:
		return floor.ServerMain(ctx, args, os.Stdout)
	case roleFloorClients:
		return floor.ClientsMain(ctx, args, os.Stdout)
	default:
		return fmt.Errorf("unknown role %q (want %s, %s, %s or %s)", role, roleAgents, rolePeer, roleFloorServer, roleFloorClients)
	}
}
