package server

import (
	"cmp"
	"context"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// The convergence SLI (docs/metrics.md): for each change to the Services
// this replica publishes, how long until 50%, 90%, 99% and 100% of the
// agents that must receive it have acknowledged a table that contains it.
//
// A change is a world that alters at least one Service. The agents that
// must receive it are those connected to this replica when it is
// published whose table it alters, less those that leave this replica
// before they hold it (counted as left). An agent holds a change once its
// stream knows it holds the table of that world or a later one
// (Cursor.HeldRevision): it acknowledged a response built from such a
// world, or the stream found nothing to send it in one.
//
// Memory is bounded whatever the change rate and node count: at most
// maxChanges changes are kept, each with two bit sets of one bit per node
// this replica tracks (nodes connected to it, or named by a kept change),
// a fixed array of quantile times and at most maxChangeServices Service
// keys; per tracked node one nodeState. At 5,000 agents and 64 changes
// that is 80 KB of bit sets. Streams' reports wait in a mailbox of one
// slot per node, the latest report winning: a report never blocks a
// stream, however far behind the tracker is, and the mailbox holds at
// most one entry per node that reported or left since the tracker last
// emptied it. A change evicted before it reached a quantile counts in
// convergence_incomplete_total.

// quantiles are the shares of a change's nodes whose convergence times
// are recorded, in increasing order.
var quantiles = [...]float64{0.5, 0.9, 0.99, 1}

// quantileLabels are quantiles as metric label values.
var quantileLabels = [len(quantiles)]string{"0.5", "0.9", "0.99", "1"}

const (
	// maxChanges is how many changes the tracker keeps: the open ones and
	// the latest complete ones, for ListNodes. At one change a second an
	// agent has a minute to converge before its change is evicted.
	maxChanges = 64
	// maxChangeServices bounds the Service keys a change lists.
	maxChangeServices = 5
	// maxPendingListed bounds the nodes a change names as pending.
	maxPendingListed = 10
	// pruneSlack is how many nodes beyond the connected ones the tracker
	// keeps before it looks for some to forget (see prune).
	pruneSlack = 256
)

// tracker owns the convergence bookkeeping. Its run goroutine owns every
// field below mailbox; streams leave their news in the mailbox, and
// ListNodes asks through queries.
type tracker struct {
	store *table.Store
	reg   *registry

	// kick wakes run when the mailbox has news; it holds one wake-up.
	kick    chan struct{}
	queries chan chan []*pb.Convergence

	// The mailbox: per node that reported or left since the last drain,
	// its news, in inbox at its index in slot. drain takes the inbox
	// whole and deletes its nodes' slots one by one: clearing or
	// iterating the map would cost a pass over every slot it ever
	// grew to (one per agent), on every drain, which comes as often as
	// the tracker wakes: for a few reports each when agents ACK one by
	// one.
	mu    sync.Mutex       // guards inbox and slot
	inbox []heldReport     // the news not yet applied
	slot  map[string]int32 // node -> its index in inbox

	// Owned by run.
	spare   []heldReport // an empty inbox, swapped for the full one
	nodes   map[string]*nodeState
	byIndex []*nodeState // by nodeState.index; nil where free
	free    []int32      // free indices
	changes []*change    // oldest first; at most maxChanges
	now     func() time.Time
}

// heldReport says that node's agent holds the table of world revision rev
// (Cursor.HeldRevision), as of at (nothing when rev is 0), and whether it
// left this replica since.
type heldReport struct {
	node string
	rev  uint64
	at   time.Time
	left bool
}

// nodeState is what the tracker knows of one node.
type nodeState struct {
	name  string
	index int32     // its bit in every change's sets
	held  uint64    // highest revision reported held
	at    time.Time // when held was reported
}

// change is one change's progress.
type change struct {
	rev         uint64
	services    []string // at most maxChangeServices, sorted
	nServices   int      // -1 when unknown (too many changed to track)
	start       time.Time
	fromTrigger bool
	required    bitset // nodes that must receive it, less those that left
	converged   bitset // those that have
	nodes, done int
	left        int       // nodes that left before converging
	lastAt      time.Time // when the last converged node did
	reached     [len(quantiles)]time.Duration
	nReached    int // quantiles reached, in order
}

func newTracker(store *table.Store, reg *registry) *tracker {
	return &tracker{
		store: store, reg: reg,
		kick: make(chan struct{}, 1), queries: make(chan chan []*pb.Convergence),
		slot:  map[string]int32{},
		nodes: map[string]*nodeState{}, now: time.Now,
	}
}

// report tells the tracker that node's agent holds revision rev. It never
// blocks on the tracker: the node's latest report waits in the mailbox.
func (t *tracker) report(node string, rev uint64) {
	now := time.Now()
	t.mu.Lock()
	r := t.post(node)
	r.left = false // a stream reports: the node is back
	if rev > r.rev {
		r.rev, r.at = rev, now
	}
	t.mu.Unlock()
	t.wake()
}

// post returns node's news in the mailbox, made empty if it had none.
// Called with mu held.
func (t *tracker) post(node string) *heldReport {
	i, ok := t.slot[node]
	if !ok {
		i = int32(len(t.inbox))
		t.slot[node] = i
		t.inbox = append(t.inbox, heldReport{node: node})
	}
	return &t.inbox[i]
}

// leave tells the tracker that node's agent left this replica: it no
// longer counts in the changes it has not converged to. Never blocks.
func (t *tracker) leave(node string) {
	t.mu.Lock()
	t.post(node).left = true
	t.mu.Unlock()
	t.wake()
}

// wake makes sure run looks at the mailbox.
func (t *tracker) wake() {
	select {
	case t.kick <- struct{}{}:
	default: // a wake-up is already waiting
	}
}

// list returns the kept changes, newest first, with their pending nodes
// named but without reasons (ListNodes adds them).
func (t *tracker) list(ctx context.Context) ([]*pb.Convergence, error) {
	reply := make(chan []*pb.Convergence, 1)
	select {
	case t.queries <- reply:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case out := <-reply:
		return out, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run follows the store's worlds and the streams' reports until ctx ends.
func (t *tracker) run(ctx context.Context) {
	select {
	case <-t.store.Ready():
	case <-ctx.Done():
		return
	}
	sub := t.store.Subscribe()
	sub.Take() // the first world is where agents start, not a change
	for {
		select {
		case <-ctx.Done():
			return
		case <-sub.Wake():
			t.drain() // first: a report of the new world finds its node current
			w, p := sub.Take()
			t.publish(w, p, t.reg.connected())
		case <-t.kick:
			t.drain()
		case reply := <-t.queries:
			t.drain() // what the streams said before the query, shown
			reply <- t.snapshot()
		}
	}
}

// drain applies the mailbox's news in the order it happened: reports,
// then departures, so that a node that converged before it left counts as
// converged.
func (t *tracker) drain() {
	t.mu.Lock()
	batch := t.inbox
	t.inbox, t.spare = t.spare, nil
	for _, r := range batch {
		delete(t.slot, r.node)
	}
	t.mu.Unlock()
	slices.SortFunc(batch, func(a, b heldReport) int { return a.at.Compare(b.at) })
	for _, r := range batch {
		if r.rev > 0 {
			t.apply(r)
		}
	}
	for _, r := range batch {
		if r.left {
			t.applyLeft(r.node)
		}
	}
	clear(batch) // drop the names
	t.spare = batch[:0]
}

// publish starts tracking the change from the previous world taken to w,
// whose Services' earlier states p holds, for the connected nodes.
func (t *tracker) publish(w *table.World, p table.Pending, connected []string) {
	if !p.Overflow && p.Len() == 0 {
		return // Nodes or cluster facts only: not a change to Services
	}
	// Worlds taken together date from the first: a tracker that lags must
	// not measure from the latest.
	published := w.Published
	if !p.Published.IsZero() {
		published = p.Published
	}
	c := &change{rev: w.Revision, start: published, nServices: -1}
	var alt *alteration
	if !p.Overflow {
		changed := make([]string, 0, p.Len())
		for k := range p.Services {
			changed = append(changed, k)
		}
		slices.Sort(changed)
		c.nServices = len(changed)
		c.services = slices.Clone(changed[:min(len(changed), maxChangeServices)])
		c.start, c.fromTrigger = changeStart(published, w, p, changed)
		alt = newAlteration(w, p, changed)
	}
	var early []time.Time // when the nodes that held it already reported
	for _, name := range connected {
		if alt != nil && !alt.alters(w.Node(name)) {
			continue
		}
		st := t.node(name)
		c.required.set(st.index)
		c.nodes++
		if st.held >= c.rev {
			// The stream reported before the tracker took the world.
			c.converged.set(st.index)
			c.done++
			early = append(early, st.at)
		}
	}
	if c.nodes == 0 {
		t.prune(connected)
		return
	}
	if len(t.changes) == maxChanges {
		evicted(t.changes[0])
		t.changes = slices.Delete(t.changes, 0, 1)
	}
	t.changes = append(t.changes, c)
	slices.SortFunc(early, time.Time.Compare)
	c.catchUp(early)
	metrics.ConvergenceOpen.Set(float64(t.open()))
	t.prune(connected)
}

// catchUp records the quantiles reached by the nodes that held c before
// the tracker saw it, which reported at the sorted times ats: each
// quantile when the node that completed it reported.
func (c *change) catchUp(ats []time.Time) {
	for c.nReached < len(quantiles) {
		k := need(quantiles[c.nReached], c.nodes)
		if k > len(ats) {
			break
		}
		c.record(ats[k-1])
	}
	if len(ats) > 0 {
		c.lastAt = ats[len(ats)-1]
	}
}

// changeStart is when the change to the Services changed started: the
// earliest start among them, where a Service that brings a newer trigger
// time than it had starts then, and any other when the first world of the
// change was published. A trigger time after that (a clock ahead of
// ours) counts as the publication.
func changeStart(published time.Time, w *table.World, p table.Pending, changed []string) (time.Time, bool) {
	start, fromTrigger := published, false
	for _, k := range changed {
		svc, old := w.Service(k), p.Services[k]
		if svc == nil || svc.TriggerTime.IsZero() || !svc.TriggerTime.Before(start) {
			continue
		}
		if old != nil && !svc.TriggerTime.After(old.TriggerTime) {
			continue // the annotation is an earlier change's
		}
		start, fromTrigger = svc.TriggerTime, true
	}
	return start, fromTrigger
}

// alteration finds the nodes whose table a change alters: those for which
// a changed Service's entry differs between its earlier state in p and its
// state in w (a Service added or removed alters every node). A node sees
// a Service as every node of its zone does unless it is Special in it, so
// the entries are compared once per zone, and per node only for the nodes
// Special in a changed Service: at 5,000 agents and 2,000 changed
// Services, two Special nodes each, that is 4,000 comparisons per zone
// and 8,000 per node named, not 10 million.
type alteration struct {
	w       *table.World
	p       table.Pending
	changed []string
	// special holds, for each node Special in a changed Service before or
	// after, the indices in changed of those Services, increasing.
	special map[string][]int
	// zones holds, per zone seen, the indices in changed of the Services
	// whose zone entry differs, increasing.
	zones map[string][]int
}

func newAlteration(w *table.World, p table.Pending, changed []string) *alteration {
	a := &alteration{w: w, p: p, changed: changed, special: map[string][]int{}, zones: map[string][]int{}}
	for i, k := range changed {
		for _, svc := range []*compute.Service{p.Services[k], w.Service(k)} {
			if svc == nil {
				continue
			}
			for _, name := range svc.SpecialNodes() {
				if s := a.special[name]; len(s) == 0 || s[len(s)-1] != i {
					a.special[name] = append(s, i)
				}
			}
		}
	}
	return a
}

// alters reports whether the change alters node n's table.
func (a *alteration) alters(n *compute.Node) bool {
	special := a.special[n.Name]
	for _, i := range special {
		k := a.changed[i]
		oldHash, hadOld := entryHash(a.p.Services[k], n)
		newHash, hasNew := entryHash(a.w.Service(k), n)
		if hadOld != hasNew || oldHash != newHash {
			return true
		}
	}
	// The Services n sees as its zone does: does one's zone entry differ?
	differ, ok := a.zones[n.Zone]
	if !ok {
		differ = a.zoneDiffers(n.Zone)
		a.zones[n.Zone] = differ
	}
	for _, i := range differ {
		if _, found := slices.BinarySearch(special, i); !found {
			return true
		}
	}
	return false
}

// zoneDiffers returns the indices of the changed Services whose entry for
// the nodes of zone that are not Special in them differs.
func (a *alteration) zoneDiffers(zone string) []int {
	var out []int
	for i, k := range a.changed {
		old, cur := a.p.Services[k], a.w.Service(k)
		if (old == nil) != (cur == nil) || old != nil && old.ZoneEntry(zone).Hash != cur.ZoneEntry(zone).Hash {
			out = append(out, i)
		}
	}
	return out
}

// entryHash is the hash of n's entry of svc, and whether svc exists.
func entryHash(svc *compute.Service, n *compute.Node) (uint64, bool) {
	if svc == nil {
		return 0, false
	}
	return svc.EntryFor(n).Hash, true
}

// node returns the state of the node called name, tracking it.
func (t *tracker) node(name string) *nodeState {
	if st := t.nodes[name]; st != nil {
		return st
	}
	st := &nodeState{name: name}
	if n := len(t.free); n > 0 {
		st.index, t.free = t.free[n-1], t.free[:n-1]
		t.byIndex[st.index] = st
	} else {
		st.index = int32(len(t.byIndex))
		t.byIndex = append(t.byIndex, st)
	}
	t.nodes[name] = st
	return st
}

// apply records a stream's report: its node converged to every change it
// must receive up to r.rev.
func (t *tracker) apply(r heldReport) {
	st := t.nodes[r.node]
	if st == nil {
		// A stream that has reported nothing yet, or a node forgotten by
		// prune: only its revision matters, for the next change.
		st = t.node(r.node)
	}
	if r.rev <= st.held {
		return
	}
	from := st.held
	st.held, st.at = r.rev, r.at
	closed := false
	// The changes are in revision order: those after from up to r.rev
	// are the ones this report can complete, usually just the latest,
	// where a scan would visit every kept change for every report.
	first, _ := slices.BinarySearchFunc(t.changes, from+1, func(c *change, rev uint64) int { return cmp.Compare(c.rev, rev) })
	for _, c := range t.changes[first:] {
		if c.rev > r.rev {
			break
		}
		if !c.required.has(st.index) || c.converged.has(st.index) {
			continue
		}
		c.converged.set(st.index)
		c.done++
		c.lastAt = later(c.lastAt, r.at)
		c.advance(c.lastAt)
		closed = closed || c.done == c.nodes
	}
	if closed {
		metrics.ConvergenceOpen.Set(float64(t.open()))
	}
}

// applyLeft drops the node called name from the changes it has not
// converged to: its agent left this replica, and whether it converges elsewhere is
// another replica's to measure. The quantiles its departure completes are
// reached when the last converged node reported: with one node gone, the
// one that completes a share of the others is the last to have converged.
func (t *tracker) applyLeft(name string) {
	st := t.nodes[name]
	if st == nil {
		return
	}
	closed := false
	for _, c := range t.changes {
		if !c.required.has(st.index) || c.converged.has(st.index) {
			continue
		}
		c.required.clear(st.index)
		c.nodes--
		c.left++
		metrics.ConvergenceLeftTotal.Inc()
		if c.done > 0 {
			c.advance(c.lastAt)
		}
		closed = closed || c.done == c.nodes
	}
	if closed {
		metrics.ConvergenceOpen.Set(float64(t.open()))
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// advance records the quantiles c has reached by at, observing each once.
func (c *change) advance(at time.Time) {
	for c.nReached < len(quantiles) && c.done >= need(quantiles[c.nReached], c.nodes) {
		c.record(at)
	}
}

// record records that c reached its next quantile at at.
func (c *change) record(at time.Time) {
	d := max(at.Sub(c.start), 0)
	c.reached[c.nReached] = d
	metrics.ConvergenceSeconds.WithLabelValues(quantileLabels[c.nReached]).Observe(d.Seconds())
	c.nReached++
}

// need is how many of n nodes make up share q: at least one.
func need(q float64, n int) int {
	return max(1, int(math.Ceil(q*float64(n)-1e-9)))
}

// evicted counts the quantiles a change dropped before reaching. A
// change every node of which left needed no one: it counts nowhere.
func evicted(c *change) {
	if c.nodes == 0 {
		return
	}
	for i := c.nReached; i < len(quantiles); i++ {
		metrics.ConvergenceIncompleteTotal.WithLabelValues(quantileLabels[i]).Inc()
	}
}

// open counts the kept changes that have not fully converged.
func (t *tracker) open() int {
	n := 0
	for _, c := range t.changes {
		if c.done < c.nodes {
			n++
		}
	}
	return n
}

// prune forgets nodes that are neither connected to this replica nor
// required by a kept change, once there are pruneSlack more of them than
// connected nodes: tracked nodes stay bounded by the connected ones, the
// ones the kept changes require and pruneSlack.
func (t *tracker) prune(connected []string) {
	if len(t.nodes) <= len(connected)+pruneSlack {
		return
	}
	keep := make(map[string]bool, len(connected))
	for _, name := range connected {
		keep[name] = true
	}
	for name, st := range t.nodes {
		if keep[name] || t.required(st.index) {
			continue
		}
		delete(t.nodes, name)
		t.byIndex[st.index] = nil
		t.free = append(t.free, st.index)
	}
}

// required reports whether a kept change requires the node at index i.
func (t *tracker) required(i int32) bool {
	for _, c := range t.changes {
		if c.required.has(i) {
			return true
		}
	}
	return false
}

// snapshot renders the kept changes, newest first.
func (t *tracker) snapshot() []*pb.Convergence {
	out := make([]*pb.Convergence, 0, len(t.changes))
	for i := len(t.changes) - 1; i >= 0; i-- {
		c := t.changes[i]
		m := &pb.Convergence{
			Revision: c.rev, Services: c.services, StartedAt: timestamppb.New(c.start),
			FromTriggerTime: c.fromTrigger, Nodes: uint32(c.nodes), Converged: uint32(c.done),
			Left: uint32(c.left),
		}
		if c.nServices >= 0 {
			m.ServicesChanged = uint32(c.nServices)
		}
		for q := range c.nReached {
			m.Reached = append(m.Reached, &pb.QuantileReached{Quantile: quantiles[q], After: durationpb.New(c.reached[q])})
		}
		if c.done < c.nodes {
			var names []string
			c.required.each(func(i int32) {
				if !c.converged.has(i) {
					if st := t.byIndex[i]; st != nil {
						names = append(names, st.name)
					}
				}
			})
			slices.Sort(names)
			for _, name := range names[:min(len(names), maxPendingListed)] {
				m.Pending = append(m.Pending, &pb.PendingNode{NodeName: name, Reason: "pending"})
			}
		}
		out = append(out, m)
	}
	return out
}

// bitset is a set of small non-negative integers.
type bitset []uint64

func (b *bitset) set(i int32) {
	w := int(i / 64)
	if w >= len(*b) {
		*b = append(*b, make([]uint64, w+1-len(*b))...)
	}
	(*b)[w] |= 1 << (i % 64)
}

func (b bitset) clear(i int32) {
	if w := int(i / 64); w < len(b) {
		b[w] &^= 1 << (i % 64)
	}
}

func (b bitset) has(i int32) bool {
	w := int(i / 64)
	return w < len(b) && b[w]&(1<<(i%64)) != 0
}

// each calls f for every member, in increasing order.
func (b bitset) each(f func(int32)) {
	for w, word := range b {
		for word != 0 {
			i := bits.TrailingZeros64(word)
			f(int32(w*64 + i))
			word &^= 1 << i
		}
	}
}
