package agentsim

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// Main runs the agents' process: it parses args, prints the ready line
// on stdout, and serves its control endpoint until ctx ends or the
// lifetime passes.
func Main(ctx context.Context, args []string, stdout io.Writer) error {
	o := NewOptions()
	ctx, cancel, err := contract.StartChild(ctx, "agents", args, o)
	if err != nil {
		return err
	}
	defer cancel()
	creds, err := loadCredentials(o)
	if err != nil {
		return err
	}
	f := newFleet(o, creds)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	return contract.Serve(ctx, stdout, ln, f.handler(ctx))
}

// handler serves the control endpoint; agents run under ctx.
func (f *fleet) handler(ctx context.Context) http.Handler {
	var once sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("POST /start", func(w http.ResponseWriter, r *http.Request) {
		spread, err := time.ParseDuration(r.URL.Query().Get("spread"))
		if err != nil || spread < 0 {
			http.Error(w, "spread: a duration", http.StatusBadRequest)
			return
		}
		started := false
		once.Do(func() { started = true; go f.start(ctx, spread) })
		if !started {
			http.Error(w, "already started", http.StatusConflict)
		}
	})
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		since, _ := strconv.ParseInt(q.Get("since"), 10, 64)
		contract.WriteJSON(w, f.report(since, q.Get("bitmaps") == "1", q.Get("versions") == "1"))
	})
	return mux
}

// start starts agent i at i*spread/n: the fleet's agents connecting
// within spread, evenly.
func (f *fleet) start(ctx context.Context, spread time.Duration) {
	t0 := time.Now()
	f.started.Store(t0.UnixNano())
	n := len(f.agents)
	for i, a := range f.agents {
		if wait := time.Until(t0.Add(spread * time.Duration(i) / time.Duration(n))); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		go a.run(ctx)
	}
}

func (f *fleet) report(since int64, bitmaps, versions bool) contract.AgentsReport {
	r := contract.AgentsReport{Agents: len(f.agents), Started: f.started.Load()}
	if versions {
		r.Versions = make(map[string]string, len(f.agents))
		r.SessionStarts = make(map[string]int64, len(f.agents))
		r.Addresses = make(map[string]string, len(f.agents))
	}
	r.Replicas = make(map[string]int, len(f.opts.Addresses))
	allAcked := true
	for _, a := range f.agents {
		if s := a.sessionStart.Load(); s != 0 {
			r.Connected++
			r.SessionStartMax = max(r.SessionStartMax, s)
			if versions {
				r.SessionStarts[a.name] = s
			}
		}
		if addr := a.addr.Load(); addr != nil {
			r.Replicas[*addr]++
			if versions {
				r.Addresses[a.name] = *addr
			}
		}
		v := a.version.Load()
		if v != nil {
			r.Valid++
			if versions {
				r.Versions[a.name] = *v
			}
		}
		first := a.firstAck.Load()
		allAcked = allAcked && first != 0
		r.FirstAckMax = max(r.FirstAckMax, first)
		r.LastAckMax = max(r.LastAckMax, a.lastAck.Load())
	}
	if !allAcked {
		r.FirstAckMax = 0
	}
	c := &f.counters
	r.Counters = contract.Counters{
		Snapshots: c.snapshots.Load(), Deltas: c.deltas.Load(), Keepalives: c.keepalives.Load(),
		SnapshotBytes: c.snapshotBytes.Load(), DeltaBytes: c.deltaBytes.Load(), WireBytes: c.wire.Load(),
		Acks: c.acks.Load(), Nacks: c.nacks.Load(),
		Sessions: c.sessions.Load(), Reconnects: c.reconnects.Load(), Failures: c.failures.Load(),
		TrackDropped: f.tracker.dropped.Load(),
	}
	f.mu.Lock()
	r.NackErrors = append([]string(nil), f.nackErrors...)
	r.SessionEnds = make(map[string]uint64, len(f.ends))
	for k, v := range f.ends {
		r.SessionEnds[k] = v
	}
	f.mu.Unlock()
	s := f.interner.Stats()
	r.Tables = contract.TableStats{
		Built: s.TablesBuilt, Shared: s.TablesShared, BucketsBuilt: s.BucketsBuilt,
		BucketsShared: s.BucketsShared, Live: s.LiveTables, LiveBuckets: s.LiveBuckets,
	}
	r.Changes = f.tracker.report(since, bitmaps)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapInuse = ms.HeapInuse
	r.Now = time.Now().UnixNano()
	return r
}
