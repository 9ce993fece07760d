package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/failpoint"
)

type syncStream = grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]

// Sync implements TableService. See the proto for the protocol.
func (s *Server) Sync(stream syncStream) (err error) {
	ctx, cancel := s.streamContext(stream.Context())
	defer cancel(nil)
	// The first world and admission come first, before even the hello is
	// read: a stream that waits holds at most its flow-control window of
	// the hello (64 KiB), not the hello's hash of every entry (400 KB at
	// 10,000 Services) times every agent that reconnects to a replica
	// still syncing its informers. Callers are authenticated by now
	// (interceptors), so only agents take turns.
	if _, err := s.world(ctx); err != nil {
		return err
	}
	if err := s.admit.Wait(ctx); err != nil {
		metrics.StreamsClosedTotal.WithLabelValues("admission").Inc()
		return status.FromContextError(err).Err()
	}
	// The admission rate paces starts; the slots bound how many hellos are
	// held at once when their processing falls behind that pace (a CPU
	// saturated by a reconnect of every agent).
	select {
	case s.helloSlots <- struct{}{}:
	case <-ctx.Done():
		return toStatus(context.Cause(ctx))
	}
	inSlot := true
	releaseSlot := func() {
		if inSlot {
			<-s.helloSlots
			inSlot = false
		}
	}
	defer releaseSlot()
	in := make(chan inbound)
	start := make(chan *syncSession, 1)
	go receive(ctx, stream, in, start, cancel)

	hello, entries, err := s.awaitHello(ctx, in)
	if err != nil {
		return toStatus(err)
	}
	node := hello.GetNodeName()
	if s.opts.Authorize != nil {
		if err := s.opts.Authorize(ctx, node); err != nil {
			if status.Code(err) != codes.Unknown {
				return err
			}
			return status.Errorf(codes.PermissionDenied, "node %q: %v", node, err)
		}
	}
	// The node's own addresses are guarded before its first table is
	// taken: that table would otherwise capture one and be refused.
	if s.opts.NodeAddresses != nil {
		addrs, _ := helloNodeAddresses(hello) // validHello checked them
		if err := s.opts.NodeAddresses(ctx, node, addrs); err != nil {
			return toStatus(err)
		}
	}
	sub := s.store.Subscribe()
	w, _ := sub.Take()
	held := table.Held{Version: hello.GetVersion(), Entries: hello.GetEntryHashes(), NodeHash: hello.GetNodeHash()}
	if held.Entries == nil {
		held.LoadEntries = lazyEntries(entries)
	}
	cur, err := table.NewCursor(node, w, held, hello.GetCapabilities().GetDeltas(), s.store.MaxPending())
	if err != nil {
		return toStatus(fmt.Errorf("%w: hello: %w", errInvalid, err))
	}
	switch caps := hello.GetCapabilities(); {
	case caps.GetZstdEntriesUnhashed():
		cur.CompressSnapshotsUnhashed()
	case caps.GetZstdEntries():
		cur.CompressSnapshots()
	}
	// An agent holding a table this replica cannot place may hold one
	// newer than the replica's world: another replica's, made from events
	// this one has not seen yet. Serving it would roll the agent back.
	if held := hello.GetResourceVersion(); hello.GetVersion() != "" && !cur.Current() {
		if own := s.store.Current().ResourceVersion(); own < held {
			metrics.StreamsClosedTotal.WithLabelValues("behind").Inc()
			return status.Errorf(codes.Unavailable, "this replica has observed the cluster through resourceVersion %d, and the agent holds a table of resourceVersion %d that it cannot place: try another replica", own, held)
		}
	}
	if s.opts.Stale != nil && hello.GetVersion() != "" && !cur.Current() {
		if why := s.opts.Stale(); why != nil {
			metrics.StreamsClosedTotal.WithLabelValues("stale").Inc()
			return status.Errorf(codes.Unavailable, "this replica may be behind the cluster (%v) and the agent holds a table it cannot place: try another replica", why)
		}
	}
	releaseSlot()
	// Headers say the hello was accepted: an agent that is current gets
	// no table, and would otherwise hear nothing until the first
	// keepalive.
	if err := stream.SendHeader(nil); err != nil {
		return toStatus(err)
	}

	log := s.log.With("node", node, "peer", peerAddr(ctx))
	now := time.Now()
	ss := &syncSession{
		Server: s, cur: cur, stream: stream, connLog: log,
		lastHeard: now, dl: newDeadlines(now, s.opts.KeepaliveInterval),
	}
	st := &ss.st
	st.node, st.peer, st.caps, st.cancel = node, peerAddr(ctx), hello.GetCapabilities(), cancel
	s.reg.attach(st)
	defer func() {
		if st.detach() && s.conv != nil {
			// Its open changes stop waiting for it: another replica
			// serves it now, or none does.
			s.conv.leave(node)
		}
	}()
	if v, ok := cur.AckedVersion(); ok {
		st.acked(v, now)
	}
	log.Info("agent connected", "heldVersion", hello.GetVersion(), "current", cur.Current())
	started := time.Now()
	defer func() {
		metrics.StreamsClosedTotal.WithLabelValues(reason(err)).Inc()
		if _, ok := cur.InFlight(); ok {
			metrics.VersionsPendingAck.Dec()
		}
		log.Info("agent disconnected", "after", time.Since(started).Round(time.Millisecond), "reason", reason(err), "err", err)
	}()

	defer ss.close()
	ss.mu.Lock()
	err = ss.step()
	ss.mu.Unlock()
	if err != nil {
		return toStatus(err)
	}
	// From here the receiving goroutine handles the agent's messages
	// itself (receive), and this one the worlds and the timer.
	start <- ss
	for {
		select {
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if errors.Is(cause, io.EOF) {
				return nil // the agent closed its side
			}
			return toStatus(cause)
		case <-sub.Wake():
			if err := ss.update(sub.Take()); err != nil {
				return toStatus(err)
			}
		case now := <-ss.dl.C():
			if err := ss.tick(ctx, now); err != nil {
				return toStatus(err)
			}
		}
	}
}

// deadlines is a Sync stream's one timer for its keepalives and its ACK
// deadline. Two timers would add a case to the stream's select, which
// every wake-up of every stream pays for (it locks each case's channel),
// and the ACK timer's reset and stop on every response; this one is
// touched per response only when the ACK deadline comes before the next
// keepalive, which with the defaults (5 minutes against 15 s) it never
// does.
type deadlines struct {
	t        *time.Timer
	interval time.Duration
	next     time.Time // the next keepalive
	armed    time.Time // when t fires
}

func newDeadlines(now time.Time, interval time.Duration) *deadlines {
	next := alignUp(now.Add(interval), interval)
	return &deadlines{t: time.NewTimer(next.Sub(now)), interval: interval, next: next, armed: next}
}

// keepaliveEpoch anchors every stream's keepalives; a monotonic reading.
var keepaliveEpoch = time.Now()

// alignUp rounds t up to the next multiple of interval/16 since
// keepaliveEpoch, so that the streams' keepalives fire together, sixteen
// bursts an interval, rather than each stream on its own: every lone
// wake-up costs the runtime a thread wake and a round of the network
// poller, which at 5,000 agents was most of an idle control plane's CPU
// (docs/benchmarks.md, "Scenario L: memory and cold start"). A stream's
// keepalives stay at least interval apart, and less than 17/16 of it.
func alignUp(t time.Time, interval time.Duration) time.Time {
	tick := max(interval/16, time.Millisecond)
	d := t.Sub(keepaliveEpoch)
	return keepaliveEpoch.Add((d + tick - 1) / tick * tick)
}

// C fires at the earlier of the next keepalive and the ACK deadline.
func (d *deadlines) C() <-chan time.Time { return d.t.C }

func (d *deadlines) stop() { d.t.Stop() }

// ackBy makes the timer fire by the ACK deadline at if it would fire
// later.
func (d *deadlines) ackBy(at time.Time) {
	if at.Before(d.armed) {
		d.set(at)
	}
}

// keepaliveDue says whether a keepalive is due at now, and if so
// schedules the next one an interval later, as a ticker would.
func (d *deadlines) keepaliveDue(now time.Time) bool {
	if now.Before(d.next) {
		return false
	}
	d.next = alignUp(now.Add(d.interval), d.interval)
	return true
}

// rearm sets the timer, which has fired, for the next keepalive or the
// ACK deadline (when awaiting), whichever comes first.
func (d *deadlines) rearm(awaiting bool, ackBy time.Time) {
	at := d.next
	if awaiting && ackBy.Before(at) {
		at = ackBy
	}
	d.set(at)
}

func (d *deadlines) set(at time.Time) {
	d.armed = at
	d.t.Reset(time.Until(at))
}

// syncSession is the state of one Sync stream. Two goroutines share it,
// each taking its lock (mu) for all it does: the stream's own (Sync), which follows
// the worlds and the timer, and the receiving one (receive), which
// handles the agent's messages as they arrive. An ACK, the message of
// every response to every agent, is so handled where it is read, and the
// response it makes due (the world moved on while the previous was in
// flight) sent from there: no hand-off between goroutines, and one
// wake-up of a goroutine less per response than a receiver that passes
// each message on. The lock is the stream's own, so it is taken by
// turns, not contended. It is not the node status's (st.mu), which
// ListNodes and the registry take for every stream: should a write block
// after all (an agent that ACKs a table before reading it), only this
// stream waits.
//
// It writes to the stream itself, where a write cannot block: gRPC's
// SendMsg only queues while the stream's write quota (64 KiB of queued,
// unwritten bytes) is not spent, and with one table in flight, sent only
// once the agent answered the previous one, at most that table and a few
// keepalives are ever queued. Only a keepalive behind a large table that
// the agent has not read can block; it alone goes through a sender, a
// goroutine with a write deadline, started when first needed. Sending
// everything through one, as WatchTable does, would cost two goroutine
// hand-offs per agent per change.
type syncSession struct {
	mu sync.Mutex // guards the fields below st
	// st is the node's status, which the registry references, with a
	// lock of its own.
	st streamStatus

	*Server
	stream  syncStream
	connLog *slog.Logger // with the node and the peer

	// Guarded by mu.
	closed      bool // the stream's goroutine is returning: touch nothing
	sending     bool // a keepalive is in the sender: nothing else may be sent
	cur         *table.Cursor
	dl          *deadlines
	lastHeard   time.Time // when the agent's last message arrived
	out         *sender   // for keepalives behind a large table; nil until needed
	nonce       uint64    // of the last response sent; 0 before the first
	awaiting    bool      // the response with nonce awaits an answer
	inflight    uint64    // its version
	inflightLen int       // its encoded size
	ackBy       time.Time // its ACK deadline
	behind      bool      // as last recorded in st
	held        uint64    // the cursor's HeldRevision as last reported to the tracker
	trimLogged  bool      // a trimmed drift report was logged
	// frame is the response in flight's: the codec reads it only within
	// SendMsg, so one serves every response. Its head is allocated per
	// response: gRPC writes it after SendMsg returns, and an agent that
	// answered before reading it all must not make the next response
	// overwrite bytes still being written.
	frame frame
}

// errSessionClosed tells the receiving goroutine that the stream is
// ending: it stops without a cause of its own.
var errSessionClosed = errors.New("the stream is ending")

// step sends the cursor's next response, if any, and makes the timer
// fire by its ACK deadline. Called with mu held. While a keepalive is
// in the sender, it sends nothing: the tick that waits for it steps
// once it is written.
func (ss *syncSession) step() error {
	if ss.sending {
		return nil
	}
	if err := ss.sendNext(); err != nil {
		return err
	}
	if ss.awaiting {
		ss.dl.ackBy(ss.ackBy)
	}
	return nil
}

// update records a newer world and sends what it makes due.
func (ss *syncSession) update(w *table.World, p table.Pending) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.cur.Update(w, p)
	return ss.step()
}

// tick handles the timer, which fired at now: the ACK deadline, and the
// keepalives each way.
func (ss *syncSession) tick(ctx context.Context, now time.Time) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.awaiting && !now.Before(ss.ackBy) {
		return errAckTimeout
	}
	if ss.dl.keepaliveDue(now) {
		if now.Sub(ss.lastHeard) > ss.opts.KeepaliveTimeout {
			return errKeepaliveTimeout
		}
		ka := &pb.SyncResponse{Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{SentAt: timestamppb.Now()}}}
		if err := ss.sendKeepalive(ctx, ka); err != nil {
			return err
		}
	}
	ss.dl.rearm(ss.awaiting, ss.ackBy)
	return nil
}

// received handles a message from the agent, on the receiving goroutine,
// and sends what it makes due. An error ends the stream.
func (ss *syncSession) received(m *syncMessage) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return errSessionClosed
	}
	if m.err != nil {
		return fmt.Errorf("%w: undecodable message: %w", errInvalid, m.err)
	}
	ss.lastHeard = time.Now()
	if err := ss.handle(m, ss.lastHeard); err != nil {
		ss.connLog.Warn("closing stream", "err", err)
		return err
	}
	return ss.step()
}

// quotaSafe is the largest table after which a keepalive is still
// written directly: well under gRPC's per-stream write quota of 64 KiB.
const quotaSafe = 16 << 10

// sendKeepalive sends a keepalive, through the sender when it may queue
// behind a large table the agent has not read. Called with mu held,
// which it releases while it waits for the sender: ListNodes and the
// registry read the status under it, and must not wait up to the write
// timeout for one agent. Meanwhile the receiving goroutine may handle
// the agent's messages, but sends nothing (step); once the keepalive is
// written, what they made due is sent.
func (ss *syncSession) sendKeepalive(ctx context.Context, ka *pb.SyncResponse) error {
	if ss.awaiting && ss.inflightLen > quotaSafe {
		if ss.out == nil {
			ss.out = newSender(ss.stream, ss.opts.WriteTimeout)
		}
		ss.sending = true
		ss.mu.Unlock()
		err := ss.out.send(ctx, ka)
		ss.mu.Lock()
		if err != nil {
			// The write may still be in progress: sending stays set, so
			// that nothing else is sent until the stream ends.
			return err
		}
		ss.sending = false
		return ss.step()
	}
	if err := ss.stream.SendMsg(ka); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	return nil
}

// close ends the session: the receiving goroutine touches nothing of it
// after, so the stream's goroutine may read the cursor unlocked.
func (ss *syncSession) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closed = true
	ss.dl.stop()
	if ss.out != nil {
		ss.out.close()
	}
}

// formatNonce renders a nonce as it goes on the wire.
func formatNonce(n uint64) string { return strconv.FormatUint(n, 10) }

// appendNonce appends nonce n as formatNonce renders it, without
// allocating a string.
func appendNonce(b []byte, n uint64) []byte { return strconv.AppendUint(b, n, 10) }

// sendNext sends the cursor's next response, if any.
func (ss *syncSession) sendNext() error {
	r := ss.cur.Next()
	// After Next, which settles whether the agent is current, and before
	// the send, so that ListNodes shows the lag once the agent can hold
	// the table.
	ss.noteBehind()
	ss.reportHeld()
	if r == nil {
		return nil
	}
	ss.nonce++
	ss.awaiting = true
	var nonce [20]byte
	head := protowire.AppendTag(make([]byte, 0, 32), wire.SyncResponseNonce, protowire.BytesType)
	head = protowire.AppendBytes(head, appendNonce(nonce[:0], ss.nonce))
	sent, bytes, field := metrics.DeltasSent, metrics.DeltaBytesSent, wire.SyncResponseDelta
	if r.Snapshot {
		sent, bytes, field = metrics.SnapshotsSent, metrics.SnapshotBytesSent, wire.SyncResponseSnapshot
	}
	ss.frame = frame{head: lengthPrefix(head, field, r.Body.Len()), body: r.Body}
	f := &ss.frame
	// r is in flight from here: the stream's exit decrements for it.
	metrics.VersionsPendingAck.Inc()
	if err := ss.stream.SendMsg(f); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	sent.Inc()
	bytes.Add(float64(f.size()))
	if r.LagReset {
		metrics.LagResetsTotal.Inc()
	}
	ss.st.sent(r.Version, ss.nonce, f.size())
	ss.inflight, ss.inflightLen = r.Version, f.size()
	ss.ackBy = time.Now().Add(ss.opts.AckTimeout)
	failpoint.Hit(failpoint.AfterSend)
	return nil
}

// noteBehind records in the node's status when the agent falls behind
// the latest world and when it catches up. It locks the status only on
// a change: at most twice per world.
func (ss *syncSession) noteBehind() {
	if behind := !ss.cur.Current(); behind != ss.behind {
		ss.behind = behind
		ss.st.behind(behind, time.Now())
	}
}

// reportHeld tells the convergence tracker when the agent is known to
// hold a later world: once per world at most. It never waits for the
// tracker, so a tracker that lags never delays a table.
func (ss *syncSession) reportHeld() {
	if rev := ss.cur.HeldRevision(); rev > ss.held && ss.conv != nil {
		ss.held = rev
		ss.conv.report(ss.st.node, rev)
	}
}

// handle processes one message from the agent, which arrived at now.
func (ss *syncSession) handle(sm *syncMessage, now time.Time) error {
	if sm.isAck {
		// An ACK and nothing else, decoded without protobuf (ackFields).
		if err := ss.checkNonce(sm.ack.nonceBytes()); err != nil {
			return err
		}
		return ss.acked(sm.ack.version, now)
	}
	m := sm.req
	if d := m.GetDrift(); d != nil {
		ss.noteDrift(d)
	}
	switch k := m.GetKind().(type) {
	case *pb.SyncRequest_Keepalive:
		return nil
	case *pb.SyncRequest_Ack:
		v, err := ss.settle(k.Ack.GetVersion(), k.Ack.GetNonce())
		if err != nil {
			return err
		}
		return ss.acked(v, now)
	case *pb.SyncRequest_Nack:
		version := k.Nack.GetVersion()
		if version == "" && ss.awaiting {
			// An agent that could not decode the response cannot say its
			// version; the nonce says which response it was.
			version = compute.FormatVersion(ss.inflight)
		}
		v, err := ss.settle(version, k.Nack.GetNonce())
		if err != nil {
			return err
		}
		if err := ss.record(v, ss.cur.Nack); err != nil {
			return err
		}
		detail := nackDetail(k.Nack)
		metrics.NacksTotal.Inc()
		ss.st.nacked(v, detail)
		ss.log.Warn("agent rejected table", "node", ss.st.node, "version", compute.FormatVersion(v), "error", detail)
		return nil
	case *pb.SyncRequest_Hello:
		return fmt.Errorf("%w: hello after the stream started", errInvalid)
	default:
		return fmt.Errorf("%w: empty request", errInvalid)
	}
}

// acked records the agent's ACK of version v, whose nonce was checked,
// received at now.
func (ss *syncSession) acked(v uint64, now time.Time) error {
	if err := ss.record(v, ss.cur.Ack); err != nil {
		return err
	}
	ss.st.acked(v, now)
	ss.reportHeld()
	return nil
}

// settle checks that an ACK or NACK answers the response in flight, and
// parses its version.
func (ss *syncSession) settle(version, nonce string) (uint64, error) {
	if err := ss.checkNonce([]byte(nonce)); err != nil {
		return 0, err
	}
	v, err := compute.ParseVersion(version)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errInvalid, err)
	}
	return v, nil
}

// checkNonce checks that an answer's nonce is the response in flight's.
func (ss *syncSession) checkNonce(nonce []byte) error {
	var buf [20]byte
	if ss.awaiting && string(nonce) == string(appendNonce(buf[:0], ss.nonce)) {
		return nil
	}
	inflight := "none"
	if ss.awaiting {
		inflight = strconv.Quote(formatNonce(ss.nonce))
	}
	return fmt.Errorf("%w: answer for nonce %q, but %s is in flight", errInvalid, nonce, inflight)
}

// record records an answer for version v in the cursor with record
// (Cursor.Ack or Cursor.Nack), and ends the wait. Nothing changes unless
// it succeeds.
func (ss *syncSession) record(v uint64, record func(uint64) error) error {
	if err := record(v); err != nil {
		return fmt.Errorf("%w: %w", errInvalid, err)
	}
	ss.awaiting = false
	metrics.VersionsPendingAck.Dec()
	return nil
}

// Bounds on a drift report: the registry keeps the last one per node.
const (
	maxDriftRepairs = 8
	maxDriftDetail  = 256
	// maxDriftAdded bounds the repairs one report adds to
	// drift_repairs_total: an agent reports each repair as it makes it,
	// and a report that claims many at once (an agent back from a long
	// absence, or one that served another replica meanwhile) must not
	// make the rate spike.
	maxDriftAdded = 16
)

// noteDrift records the agent's drift report in its node's status and
// counts the new repairs. A report beyond the bounds is trimmed, never
// refused: the agent sends it again on every stream, and refusing it
// would end each one before any table. An agent reports one repair per
// dataplane and family, which fits.
func (ss *syncSession) noteDrift(d *pb.DriftReport) {
	repairs, trimmed := boundDrift(d.GetRepairs())
	if trimmed {
		metrics.DriftReportsTrimmedTotal.Inc()
		if !ss.trimLogged {
			ss.trimLogged = true
			ss.log.Warn("agent's drift report exceeds the bounds: trimmed", "node", ss.st.node,
				"repairs", len(d.GetRepairs()), "maxRepairs", maxDriftRepairs, "maxDetail", maxDriftDetail)
		}
	}
	added := min(ss.st.drifted(repairs), maxDriftAdded)
	if added == 0 {
		return
	}
	metrics.DriftRepairsTotal.Add(float64(added))
	if ss.driftLog.Allow() {
		ss.log.Warn("agent repaired rules changed behind its back", "node", ss.st.node, "repairs", added)
	}
}

// boundDrift returns repairs within the bounds, and whether it had to
// trim them: at most maxDriftRepairs repairs, those with a dataplane or
// family name too long to be one dropped, details cut.
func boundDrift(repairs []*pb.DriftRepair) ([]*pb.DriftRepair, bool) {
	trimmed := false
	out := make([]*pb.DriftRepair, 0, min(len(repairs), maxDriftRepairs))
	for _, r := range repairs {
		if len(out) == maxDriftRepairs || len(r.GetDataplane()) > maxCapabilityLen || len(r.GetIpFamily()) > maxCapabilityLen {
			trimmed = true
			continue
		}
		if len(r.GetDetail()) > maxDriftDetail {
			trimmed = true
			r.Detail = strings.ToValidUTF8(r.GetDetail()[:maxDriftDetail-len("…")], "") + "…"
		}
		out = append(out, r)
	}
	return out, trimmed
}

func nackDetail(n *pb.Nack) string {
	var b strings.Builder
	b.WriteString(n.GetError())
	for i, e := range n.GetEntryErrors() {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(n.GetEntryErrors())-i)
			break
		}
		fmt.Fprintf(&b, "; %s: %s", e.GetKey(), e.GetError())
	}
	return b.String()
}

// awaitHello waits for the first message, which must be a valid Hello.
// Its entry hashes come apart, encoded, to be decoded only if needed.
func (s *Server) awaitHello(ctx context.Context, in <-chan inbound) (*pb.Hello, []byte, error) {
	t := time.NewTimer(min(s.opts.KeepaliveTimeout, helloTimeout))
	defer t.Stop()
	select {
	case m := <-in:
		if m.err != nil {
			return nil, nil, m.err
		}
		h := m.req.GetHello()
		if h == nil {
			return nil, nil, fmt.Errorf("%w: the first message must be a hello", errInvalid)
		}
		return h, m.entries, validHello(h)
	case <-t.C:
		return nil, nil, fmt.Errorf("%w: no hello", errKeepaliveTimeout)
	case <-ctx.Done():
		return nil, nil, context.Cause(ctx)
	}
}

// inbound is the agent's hello, or the error that ended the stream
// before one.
type inbound struct {
	req     *pb.SyncRequest
	entries []byte // a hello's entry hashes, encoded (see decodeRequest)
	err     error
}

// receive reads the stream's messages until it ends. The first, the
// hello, goes to the stream's goroutine on in (or the error that ended
// the stream before one); once that goroutine has started the session
// (start), receive handles every later message itself (see syncSession).
// The error that ends the stream, the agent's or one of its messages',
// cancels the stream's context with that error as the cause: io.EOF when
// the agent closed its side.
//
// The codec decodes the messages (syncMessage): when grpc-go fails to
// decode, it ends the stream with Internal on its own, but a malformed
// message is the agent's error (InvalidArgument), and it must say so.
func receive(ctx context.Context, stream syncStream, in chan<- inbound, start <-chan *syncSession, cancel context.CancelCauseFunc) {
	var sm syncMessage // one per stream: its messages are handled in turn
	var first inbound
	if err := stream.RecvMsg(&sm); err != nil {
		first.err = err
	} else if sm.err != nil {
		first.err = fmt.Errorf("%w: undecodable message: %w", errInvalid, sm.err)
	} else {
		first.req, first.entries = sm.req, sm.entries
	}
	select {
	case in <- first:
	case <-ctx.Done():
		return
	}
	if first.err != nil {
		return
	}
	var ss *syncSession
	select {
	case ss = <-start:
	case <-ctx.Done():
		return
	}
	for {
		sm = syncMessage{}
		err := stream.RecvMsg(&sm)
		if err == nil {
			err = ss.received(&sm)
		}
		if err != nil {
			if !errors.Is(err, errSessionClosed) {
				cancel(err)
			}
			return
		}
	}
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// sender performs a stream's writes on its own goroutine, so that its
// owner can give up on a write that does not complete in time.
type sender struct {
	stream  grpc.ServerStream
	timeout time.Duration
	reqs    chan any
	done    chan error
}

func newSender(stream grpc.ServerStream, timeout time.Duration) *sender {
	s := &sender{stream: stream, timeout: timeout, reqs: make(chan any), done: make(chan error, 1)}
	go func() {
		for m := range s.reqs {
			s.done <- s.stream.SendMsg(m)
		}
	}()
	return s
}

// send writes m, waiting at most the write timeout. After an error the
// stream is unusable and its handler must return, which also unblocks a
// write still in progress.
func (s *sender) send(ctx context.Context, m any) error {
	select {
	case s.reqs <- m:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case err := <-s.done:
		if err != nil {
			return fmt.Errorf("sending: %w", err)
		}
		return nil
	case <-t.C:
		return errWriteTimeout
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// close ends the send goroutine once its current write, if any, returns.
func (s *sender) close() { close(s.reqs) }
