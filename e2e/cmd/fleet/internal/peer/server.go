package peer

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// Main runs the peer's process: it starts every set at once (spread over
// Options.Spread), prints the ready line on stdout, and serves /report
// until ctx ends or the lifetime passes.
func Main(ctx context.Context, args []string, stdout io.Writer) error {
	o := NewOptions()
	ctx, cancel, err := contract.StartChild(ctx, "peer", args, o)
	if err != nil {
		return err
	}
	defer cancel()
	p, err := newPeer(o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, _ *http.Request) { contract.WriteJSON(w, p.report()) })
	go p.startAll(ctx)
	return contract.Serve(ctx, stdout, ln, mux)
}

func (p *peer) startAll(ctx context.Context) {
	t0 := time.Now()
	p.started.Store(t0.UnixNano())
	n := len(p.sets)
	for i, s := range p.sets {
		if wait := time.Until(t0.Add(p.opts.Spread * time.Duration(i) / time.Duration(n))); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		go func() {
			if err := p.run(ctx, s); err != nil && ctx.Err() == nil {
				p.noteError(err)
			}
		}()
	}
}

func (p *peer) report() contract.PeerReport {
	r := contract.PeerReport{
		Sets: len(p.sets), Started: p.started.Load(),
		WireBytes: p.wire.Load(), BodyBytes: p.body.Load(), Events: p.events.Load(),
	}
	for i, s := range p.sets {
		if t := s.synced.Load(); t != 0 {
			r.Synced++
			r.SyncedMax = max(r.SyncedMax, t)
		}
		u := s.sliceUpdates.Load()
		if i == 0 || u < r.SliceUpdatesMin {
			r.SliceUpdatesMin = u
		}
	}
	p.mu.Lock()
	r.Errors = append([]string(nil), p.errors...)
	p.mu.Unlock()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapInuse = ms.HeapInuse
	r.Now = time.Now().UnixNano()
	return r
}
