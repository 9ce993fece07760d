package table

import (
	"maps"
	"sync"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// Store publishes worlds and fans out what changed to subscriptions.
type Store struct {
	maxPending int

	mu      sync.Mutex // guards the fields below
	current *World
	subs    map[*Subscription]struct{}
	ready   chan struct{} // closed by the first Publish
}

// NewStore returns an empty store. A subscription whose agent falls behind
// by more than maxPending changed Services stops recording them and is
// reset with a snapshot instead.
func NewStore(maxPending int) *Store {
	return &Store{maxPending: maxPending, subs: map[*Subscription]struct{}{}, ready: make(chan struct{})}
}

// Ready is closed once the first world is published: before it, the store
// has seen no complete cluster and must serve nothing.
func (s *Store) Ready() <-chan struct{} { return s.ready }

// MaxPending is the lag limit given to NewStore.
func (s *Store) MaxPending() int { return s.maxPending }

// Current returns the latest world, or nil before the first Publish.
func (s *Store) Current() *World {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// Publish applies changes and publishes the resulting world. services maps
// a key to its new state, or to nil for a removed Service; nodes maps a
// name to its new state, or to nil for a removed Node. Entries equal to the
// current state are ignored, and a publish that changes nothing makes no
// new world and wakes nobody (the first publish always makes one). It
// returns the number of Services and Nodes that changed. Publish must be
// called from one goroutine at a time; it never blocks on subscribers.
func (s *Store) Publish(services map[string]*compute.Service, nodes map[string]*compute.Node) (changedServices, changedNodes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.current
	if prev == nil {
		prev = &World{services: map[string]*compute.Service{}, nodes: map[string]*compute.Node{}}
	}
	oldServices := map[string]*compute.Service{}
	for k, svc := range services {
		if old := prev.services[k]; !old.Equal(svc) {
			oldServices[k] = old
		}
	}
	changedNodeNames := map[string]bool{}
	for name, n := range nodes {
		if old := prev.nodes[name]; !old.Equal(n) {
			changedNodeNames[name] = true
		}
	}
	if s.current != nil && len(oldServices) == 0 && len(changedNodeNames) == 0 {
		return 0, 0
	}

	next := &World{Revision: prev.Revision + 1, services: prev.services, nodes: prev.nodes}
	if len(oldServices) > 0 || s.current == nil {
		// maps.Clone copies the table wholesale, about twice as fast as
		// inserting key by key; at 10,000 Services the copy is most of a
		// change's publish cost.
		next.services = maps.Clone(prev.services)
		for k := range oldServices {
			if svc := services[k]; svc != nil {
				next.services[k] = svc
			} else {
				delete(next.services, k)
			}
		}
	}
	if len(changedNodeNames) > 0 || s.current == nil {
		next.nodes = maps.Clone(prev.nodes)
		for name := range changedNodeNames {
			if n := nodes[name]; n != nil {
				next.nodes[name] = n
			} else {
				delete(next.nodes, name)
			}
		}
	}

	if s.current == nil {
		close(s.ready)
	}
	s.current = next
	for sub := range s.subs {
		sub.record(next, oldServices, changedNodeNames[sub.node], s.maxPending)
	}
	return len(oldServices), len(changedNodeNames)
}

// Subscribe starts recording changes for the agent of node. The first Take
// returns the current world with nothing pending. Call only after Ready.
func (s *Store) Subscribe(node string) *Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := &Subscription{node: node, wake: make(chan struct{}, 1), world: s.current, store: s}
	s.subs[sub] = struct{}{}
	return sub
}

// Subscribers is the number of open subscriptions.
func (s *Store) Subscribers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}

// Subscription records, for one agent, the Services that changed since its
// owner last took them. It is the only state shared between the store and
// a stream goroutine.
type Subscription struct {
	node  string
	wake  chan struct{} // capacity 1: wakes coalesce
	store *Store

	mu      sync.Mutex // guards world and pending
	world   *World
	pending Pending
}

// Pending is what changed since a base: the state of each changed Service
// at the base (nil where it did not exist), or Overflow when too much
// changed to keep track of.
type Pending struct {
	// Services holds each changed Service's state at the base.
	Services map[string]*compute.Service
	// Overflow means the changes were not recorded: send a snapshot.
	Overflow bool
}

// Len is the number of changed Services recorded.
func (p *Pending) Len() int { return len(p.Services) }

// merge folds newer changes into p. The older state of a Service wins: it
// is the one at p's base.
func (p *Pending) merge(newer Pending, limit int) {
	p.Overflow = p.Overflow || newer.Overflow
	if !p.Overflow {
		for k, old := range newer.Services {
			if _, seen := p.Services[k]; !seen {
				if p.Services == nil {
					p.Services = map[string]*compute.Service{}
				}
				p.Services[k] = old
			}
		}
		p.Overflow = len(p.Services) > limit
	}
	if p.Overflow {
		p.Services = nil
	}
}

func (sub *Subscription) record(w *World, changed map[string]*compute.Service, nodeChanged bool, limit int) {
	if len(changed) == 0 && !nodeChanged {
		return
	}
	sub.mu.Lock()
	sub.world = w
	sub.pending.merge(Pending{Services: changed}, limit)
	sub.mu.Unlock()
	select {
	case sub.wake <- struct{}{}:
	default: // already awake: the owner will take everything at once
	}
}

// Wake is signalled when Take has something new.
func (sub *Subscription) Wake() <-chan struct{} { return sub.wake }

// Take returns the latest world and what changed since the previous Take.
func (sub *Subscription) Take() (*World, Pending) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	p := sub.pending
	sub.pending = Pending{}
	return sub.world, p
}

// Close stops recording. It is idempotent.
func (sub *Subscription) Close() {
	sub.store.mu.Lock()
	defer sub.store.mu.Unlock()
	delete(sub.store.subs, sub)
}
