package table

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// Store publishes worlds and tells subscriptions what changed.
//
// A publish leaves a breadcrumb (what changed, and the state before) and
// closes the previous breadcrumb's channel: one close wakes every stream
// waiting on it, and a publish costs the same whether 10 or 5,000 agents
// are connected. Each subscription follows the crumbs from where it last
// was when its owner gets round to it. Crumbs hold changes, never worlds,
// so a stream that lags holds only the Services changed since, and one
// that lags too far is reset with a snapshot (Pending.Overflow).
type Store struct {
	maxPending int

	mu    sync.Mutex // serialises Publish
	head  atomic.Pointer[head]
	ready chan struct{} // closed by the first Publish
}

// head is the latest world and the crumb that stands for it.
type head struct {
	world *World
	crumb *crumb
}

// crumb stands for one world. Once the next world is published, changed
// holds what the next one changed, with each Service's state in this one,
// and next points to the next crumb; then done is closed.
type crumb struct {
	done    chan struct{}
	next    *crumb                      // set before done is closed
	changed map[string]*compute.Service // set before done is closed
	// published is when the world next leads to was published; set
	// before done is closed.
	published time.Time
}

// NewStore returns an empty store. A subscription whose agent falls behind
// by more than maxPending changed Services stops recording them and is
// reset with a snapshot instead.
func NewStore(maxPending int) *Store {
	return &Store{maxPending: maxPending, ready: make(chan struct{})}
}

// Ready is closed once the first world is published: before it, the store
// has seen no complete cluster and must serve nothing.
func (s *Store) Ready() <-chan struct{} { return s.ready }

// MaxPending is the lag limit given to NewStore.
func (s *Store) MaxPending() int { return s.maxPending }

// Current returns the latest world, or nil before the first Publish.
func (s *Store) Current() *World {
	if h := s.head.Load(); h != nil {
		return h.world
	}
	return nil
}

// Publish applies changes to Services and Nodes and publishes the
// resulting world, as Apply does with the service CIDRs unchanged.
func (s *Store) Publish(services map[string]*compute.Service, nodes map[string]*compute.Node) (changedServices, changedNodes int) {
	return s.Apply(Update{Services: services, Nodes: nodes})
}

// Update is one publication's changes.
type Update struct {
	// Services maps a key to its new state, or to nil for a removed
	// Service.
	Services map[string]*compute.Service
	// Nodes maps a name to its new state, or to nil for a removed Node.
	Nodes map[string]*compute.Node
	// ServiceCIDRs are the cluster's service CIDRs when SetServiceCIDRs;
	// otherwise they stay as they are.
	ServiceCIDRs    *compute.ServiceCIDRs
	SetServiceCIDRs bool
	// ControlPlaneAddresses are the control plane's replica addresses
	// when SetControlPlaneAddresses; otherwise they stay as they are.
	ControlPlaneAddresses    *compute.ControlPlaneAddresses
	SetControlPlaneAddresses bool
	// ResourceVersion, when not 0, says the caller has observed the
	// cluster through it: every change up to it is in this update or
	// already in the latest world. The world that results, new or not,
	// takes it as its ResourceVersion unless it has a higher one.
	ResourceVersion uint64
}

// Apply applies u and publishes the resulting world. Entries equal to the
// current state are ignored, and a publish that changes nothing makes no
// new world and wakes nobody (the first publish always makes one). A
// change of the service CIDRs or of the control plane addresses changes
// every node (they travel in NodeInfo) and counts as such. It returns the number of Services and
// Nodes that changed. Apply never blocks on subscribers.
func (s *Store) Apply(u Update) (changedServices, changedNodes int) {
	services := u.Services
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.head.Load()
	prev := &World{services: map[string]*compute.Service{}, nodes: map[string]*compute.Node{}}
	if h != nil {
		prev = h.world
	}
	cidrs := prev.cidrs
	if u.SetServiceCIDRs {
		cidrs = u.ServiceCIDRs
	}
	cp := prev.cp
	if u.SetControlPlaneAddresses {
		cp = u.ControlPlaneAddresses
	}
	// Both are cluster-wide facts every NodeInfo carries.
	clusterChanged := !cidrs.Equal(prev.cidrs) || !cp.Equal(prev.cp)
	oldServices := map[string]*compute.Service{}
	for k, svc := range services {
		if old := prev.services[k]; !old.Equal(svc) {
			oldServices[k] = old
		}
	}
	// Nodes are stored with the CIDRs and control plane addresses, so
	// that every stream reads a node's bytes as they are, encoded once
	// per change.
	nodes := make(map[string]*compute.Node, len(u.Nodes))
	changedNodeNames := map[string]bool{}
	for name, n := range u.Nodes {
		if n != nil {
			n = n.WithCluster(cidrs, cp)
		}
		nodes[name] = n
		if old := prev.nodes[name]; !old.Equal(n) {
			changedNodeNames[name] = true
		}
	}
	if clusterChanged {
		for name, n := range prev.nodes {
			if _, ok := nodes[name]; !ok {
				nodes[name] = n.WithCluster(cidrs, cp)
				changedNodeNames[name] = true
			}
		}
	}
	if h != nil && len(oldServices) == 0 && len(changedNodeNames) == 0 && !clusterChanged {
		// Only the latest world moves, and only under s.mu: a stream
		// still sending an older one never claims more than it holds.
		raise(&prev.rv, u.ResourceVersion)
		return 0, 0
	}

	next := &World{Revision: prev.Revision + 1, Published: time.Now(), services: prev.services, nodes: prev.nodes, cidrs: cidrs, cp: cp}
	next.rv.Store(max(prev.rv.Load(), u.ResourceVersion))
	if len(oldServices) > 0 || h == nil {
		// maps.Clone copies the table wholesale, about twice as fast as
		// inserting key by key.
		next.services = maps.Clone(prev.services)
		for k := range oldServices {
			if svc := services[k]; svc != nil {
				next.services[k] = svc
			} else {
				delete(next.services, k)
			}
		}
	}
	if len(changedNodeNames) > 0 || h == nil {
		next.nodes = maps.Clone(prev.nodes)
		for name := range changedNodeNames {
			if n := nodes[name]; n != nil {
				next.nodes[name] = n
			} else {
				delete(next.nodes, name)
			}
		}
	}

	c := &crumb{done: make(chan struct{})}
	if h == nil {
		s.head.Store(&head{world: next, crumb: c})
		close(s.ready)
		return len(oldServices), len(changedNodeNames)
	}
	// The old crumb is complete before the new head is visible, so a
	// subscription that sees the new head can walk up to it.
	h.crumb.changed, h.crumb.next, h.crumb.published = oldServices, c, next.Published
	s.head.Store(&head{world: next, crumb: c})
	close(h.crumb.done)
	return len(oldServices), len(changedNodeNames)
}

// Subscribe starts following changes for one agent. The first Take
// returns the current world with nothing pending. Call only after Ready.
// A subscription holds nothing the store must release: dropping it is
// enough.
func (s *Store) Subscribe() *Subscription {
	return &Subscription{store: s, at: s.head.Load().crumb}
}

// Subscription follows the store's crumbs for one stream. It is owned by
// that stream's goroutine and not safe for concurrent use.
type Subscription struct {
	store *Store
	at    *crumb // the crumb of the world last taken
}

// Pending is what changed since a base: the state of each changed Service
// at the base (nil where it did not exist), or Overflow when too much
// changed to keep track of.
type Pending struct {
	// Services holds each changed Service's state at the base. It may be
	// shared with other Pendings and the store: never modify it.
	Services map[string]*compute.Service
	// Overflow means the changes were not recorded: send a snapshot.
	Overflow bool
	// Published is when the earliest world after the base was published:
	// when the oldest of the changes became visible (zero when nothing
	// changed). A reader that takes several worlds at once dates the
	// change from here, not from the latest world.
	Published time.Time
	// shared says Services is borrowed (a crumb's, which every
	// subscription reads): add copies it before it writes to it.
	shared bool
}

// Len is the number of changed Services recorded.
func (p *Pending) Len() int { return len(p.Services) }

// merge folds newer changes into p. The older state of a Service wins: it
// is the one at p's base.
func (p *Pending) merge(newer Pending, limit int) {
	p.Overflow = p.Overflow || newer.Overflow
	p.Published = earliest(p.Published, newer.Published)
	if !p.Overflow {
		p.add(newer.Services, limit)
	}
	if p.Overflow {
		p.Services = nil
	}
}

// add folds one crumb's changes into p, as merge does. Into an empty p
// it borrows changed rather than copying it: every stream takes every
// world, nearly always one at a time, and two copies of each world's
// changes per stream and world would be a tenth of the control plane's
// allocations per response (docs/benchmarks.md).
func (p *Pending) add(changed map[string]*compute.Service, limit int) {
	if len(p.Services) == 0 {
		if len(changed) > 0 {
			p.Services, p.shared = changed, true
		}
	} else {
		for k, old := range changed {
			if _, seen := p.Services[k]; !seen {
				if p.shared {
					p.Services, p.shared = maps.Clone(p.Services), false
				}
				p.Services[k] = old
			}
		}
	}
	if len(p.Services) > limit {
		p.Overflow, p.Services = true, nil
	}
}

// Wake is closed when a world newer than the one last taken exists.
func (sub *Subscription) Wake() <-chan struct{} { return sub.at.done }

// Take returns the latest world and what changed since the previous Take
// (nothing on the first). A Node change makes a new world with no changed
// Services; the cursor compares its node itself.
func (sub *Subscription) Take() (*World, Pending) {
	h := sub.store.head.Load()
	var p Pending
	for c := sub.at; c != h.crumb; c = c.next {
		p.Published = earliest(p.Published, c.published)
		if !p.Overflow {
			p.add(c.changed, sub.store.maxPending)
		}
	}
	sub.at = h.crumb
	return h.world, p
}

// earliest is the earlier of a and b, ignoring a zero time.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// raise sets v to rv if rv is higher. Callers hold the store's lock.
func raise(v *atomic.Uint64, rv uint64) {
	if rv > v.Load() {
		v.Store(rv)
	}
}
