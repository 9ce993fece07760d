package main

import (
	"context"
	"fmt"
	"log"
	"path/filepath"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/floor"
)

// The floor's message sizes: those of the steady phase's exchange.
const (
	// floorMessageBytes is about the control plane's delta for one
	// endpoint change, per agent reached.
	floorMessageBytes = 200
	// floorReplyBytes is about an agent's ACK: a version and a nonce.
	floorReplyBytes = 40
)

// floorFigures are the gRPC floor's raw figures.
type floorFigures struct {
	Clients, Rounds          int
	Pace                     time.Duration
	MessageBytes, ReplyBytes int
	// Expected is the replies each round waited for: the streams open at
	// the start, which must be Clients.
	Expected int `json:"expected"`
	// CPU is every process's over the rounds (the server's under
	// pFloorServer); Window is that measurement's.
	CPU    map[string]time.Duration `json:"cpu"`
	Window time.Duration            `json:"window"`
	// Replies per round; LastReply, each round's broadcast to its last
	// reply (0 for a round that did not complete), by the server's clock.
	Replies   []int           `json:"replies"`
	LastReply []time.Duration `json:"lastReply"`
	// Late rounds started after their tick, the previous one not done.
	Late int `json:"late"`
	// Missing is the client-round pairs without a reply.
	Missing int `json:"missing"`
	// ServerHeap is the server's heap in use after the rounds.
	ServerHeap uint64 `json:"serverHeap"`
}

// floor measures grpc-go's own cost for the steady phase's exchange
// (internal/floor): as many clients as agents, each on its own
// connection, one message out and one reply back per round, rounds at the
// steady phase's pace.
func (h *harness) floor(ctx context.Context) error {
	o := h.o
	f := &floorFigures{Clients: o.Nodes, Rounds: o.FloorRounds, Pace: o.Pace, MessageBytes: floorMessageBytes, ReplyBytes: floorReplyBytes}
	h.res.Floor = f
	srv, srvURL, err := startChild(ctx, roleFloorServer, []string{
		fmt.Sprintf("--message-bytes=%d", floorMessageBytes), fmt.Sprintf("--max-streams=%d", o.Nodes),
	}, filepath.Join(o.Dir, "floor-server.log"))
	if err != nil {
		return err
	}
	defer h.stopChild(srv, pFloorServer)
	h.m.set(pFloorServer, srv.pid())
	var rep floor.ServerReport
	if err := getJSON(ctx, srvURL+"/report", &rep); err != nil {
		return err
	}
	cl, clURL, err := startChild(ctx, roleFloorClients, []string{
		"--address=" + rep.Address, fmt.Sprintf("--clients=%d", o.Nodes), fmt.Sprintf("--reply-bytes=%d", floorReplyBytes),
	}, filepath.Join(o.Dir, "floor-clients.log"))
	if err != nil {
		return err
	}
	defer h.stopChild(cl, pFloorClients)
	h.m.set(pFloorClients, cl.pid())
	if err := poll(ctx, "every floor client's stream open", pollInterval, o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		err := getJSON(ctx, srvURL+"/report", &rep)
		return err == nil && rep.Streams == o.Nodes, err
	}); err != nil {
		var cr floor.ClientsReport
		_ = getJSON(ctx, clURL+"/report", &cr)
		return fmt.Errorf("%w (%d of %d open; client errors %v)", err, rep.Streams, o.Nodes, cr.Errors)
	}

	// One round unmeasured: a stream's first message also carries the
	// server's response headers, and its first round grows buffers and
	// stacks, which the control plane's streams did at the cold start.
	if rep, err = h.floorRun(ctx, srvURL, 1); err != nil {
		return fmt.Errorf("warm-up round: %w", err)
	}
	if rep.Run.Failure != "" {
		return fmt.Errorf("floor server, warm-up round: %s", rep.Run.Failure)
	}
	cpu0 := h.m.cpu()
	t0 := time.Now()
	rep, err = h.floorRun(ctx, srvURL, o.FloorRounds)
	f.CPU, f.Window = h.m.since(cpu0), time.Since(t0)
	if r := rep.Run; r != nil {
		f.Expected, f.Late, f.Replies = r.Expected, r.Late, r.Replies
		for i, n := range r.Replies {
			f.LastReply = append(f.LastReply, time.Duration(r.Last[i]))
			f.Missing += max(o.Nodes-n, 0)
		}
		f.Missing += (r.Rounds - len(r.Replies)) * o.Nodes
	}
	f.ServerHeap = rep.HeapInuse
	h.res.Checks.FloorMissing = f.Missing
	if err != nil {
		return err
	}
	if rep.Run.Failure != "" {
		return fmt.Errorf("floor server: %s", rep.Run.Failure)
	}
	if f.Expected != o.Nodes {
		return fmt.Errorf("floor: %d streams open at the start of the rounds, want %d", f.Expected, o.Nodes)
	}
	log.Printf("gRPC floor: %d rounds to %d clients, server CPU %v", o.FloorRounds, o.Nodes, f.CPU[pFloorServer])
	return nil
}

// floorRun runs rounds on the floor server and returns its report once
// they are done.
func (h *harness) floorRun(ctx context.Context, srvURL string, rounds int) (floor.ServerReport, error) {
	var rep floor.ServerReport
	if err := post(ctx, fmt.Sprintf("%s/run?rounds=%d&pace=%s&timeout=%s", srvURL, rounds, h.o.Pace, h.o.PhaseTimeout)); err != nil {
		return rep, err
	}
	// A long poll: the server answers when the rounds are done.
	err := poll(ctx, "every floor client replying in every round", pollInterval, h.o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if err := getJSON(ctx, srvURL+"/report?wait=30s", &rep); err != nil {
			return false, err
		}
		return rep.Run != nil && rep.Run.Done, nil
	})
	return rep, err
}

// stopChild stops a child and forgets its pid.
func (h *harness) stopChild(p *proc, name string) {
	if err := p.stop(); err != nil {
		log.Print(err)
	}
	h.m.set(name, 0)
}

// floorRows adds the floor's rows to the table, and with the steady
// phase's figures the ratio of the control plane's cost to the floor's.
func floorRows(t *table, r *Results) {
	f := r.Floor
	if f == nil {
		return
	}
	rounds := float64(max(f.Rounds, 1))
	perRound := float64(f.CPU[pFloorServer]) / rounds
	perClient := perRound / float64(max(f.Clients, 1))
	t.row("gRPC floor", "clients (own connection each), rounds, pace; message / reply bytes",
		fmt.Sprintf("%s, %d, %v; %d B / %d B", thousands(f.Clients), f.Rounds, f.Pace, f.MessageBytes, f.ReplyBytes))
	t.row("gRPC floor", "server CPU per round; per client", fmt.Sprintf("%s; **%s**", us(perRound), us(perClient)))
	t.row("gRPC floor", "last reply: p50 / p99 / max", "**"+percentiles(f.LastReply)+"**")
	t.row("gRPC floor", "clients' process CPU per round; per client",
		fmt.Sprintf("%s; %s", us(float64(f.CPU[pFloorClients])/rounds), us(float64(f.CPU[pFloorClients])/rounds/float64(max(f.Clients, 1)))))
	t.row("gRPC floor", "rounds started late; client-round replies missing; server heap", fmt.Sprintf("%d; %d; %s", f.Late, f.Missing, mib(f.ServerHeap)))
	if r.Secure {
		t.row("gRPC floor", "transport", "plaintext, unlike the control plane's run: the ratio below includes TLS records")
	}
	if !r.OnlyFloor {
		t.row("ratio", "CPU per change: control plane per agent reached / gRPC floor per client", "**"+ratio(cpPerAgentReached(r.Steady), perClient)+"**")
		// Per response sent: once the cores saturate, changes coalesce and
		// an agent reached by two changes gets one response, as a floor
		// client gets one message per round.
		perResp, netIdle := cpPerResponse(r.Steady, r.Idle)
		t.row("ratio", "CPU per message: control plane per response sent / gRPC floor per message", fmt.Sprintf("%s / %s = **%s** (net of idle: %s, %s)",
			us(perResp), us(perClient), ratio(perResp, perClient), us(netIdle), ratio(netIdle, perClient)))
	}
}
