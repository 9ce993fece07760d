package limit

import (
	"container/list"
	"net/netip"
	"sync"
	"time"
)

// Buckets holds a token bucket per source, forgetting the least recently
// seen past a bound (which only gives that source a fresh burst). Its
// methods are safe for concurrent use.
//
// The buckets are its own rather than golang.org/x/time/rate's: a token
// taken for an authentication that then succeeds must be given back, and
// rate.Reservation.Cancel restores tokens only for a reservation whose
// time has not come yet.
type Buckets struct {
	rate  float64 // tokens a second
	burst float64
	max   int

	mu sync.Mutex
	// m and lru (front: most recently seen) hold the buckets; mu guards
	// them and every bucket's fields.
	m   map[netip.Prefix]*list.Element
	lru *list.List
}

type bucket struct {
	src    netip.Prefix
	tokens float64
	last   time.Time
}

// NewBuckets returns buckets of burst tokens refilled at perSecond, for
// at most max sources.
func NewBuckets(perSecond float64, burst, max int) *Buckets {
	return &Buckets{rate: perSecond, burst: float64(burst), max: max, m: map[netip.Prefix]*list.Element{}, lru: list.New()}
}

// take takes a token from src's bucket at now if it has one; b.mu is held.
func (b *Buckets) take(src netip.Prefix, now time.Time) (*bucket, bool) {
	var k *bucket
	if e, ok := b.m[src]; ok {
		b.lru.MoveToFront(e)
		k = e.Value.(*bucket)
		if now.After(k.last) {
			k.tokens = min(b.burst, k.tokens+now.Sub(k.last).Seconds()*b.rate)
			k.last = now
		}
	} else {
		if b.lru.Len() >= b.max {
			old := b.lru.Back()
			b.lru.Remove(old)
			delete(b.m, old.Value.(*bucket).src)
		}
		k = &bucket{src: src, tokens: b.burst, last: now}
		b.m[src] = b.lru.PushFront(k)
	}
	if k.tokens < 1 {
		return k, false
	}
	k.tokens--
	return k, true
}

// Take takes a token from src's bucket at now, if it has one, and
// returns a refund that gives it back (for an outcome that should not
// count); calling refund is optional, and more than once gives back one.
func (b *Buckets) Take(src netip.Prefix, now time.Time) (refund func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.take(src, now)
	if !ok {
		return nil, false
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			k.tokens = min(b.burst, k.tokens+1)
		})
	}, true
}

// SourceBuckets limits each source address and, as a whole, each IPv6
// /64 (NetworkOf): whoever holds one address of a /64 usually holds all
// of it and could take a fresh bucket per call, so the /64 has a bucket
// too, share times an address's. Its methods are safe for concurrent
// use.
type SourceBuckets struct {
	addrs, nets *Buckets
}

// NewSourceBuckets returns buckets of burst tokens refilled at perSecond
// per address, share times both per /64, for at most max of each.
func NewSourceBuckets(perSecond float64, burst, share, max int) *SourceBuckets {
	return &SourceBuckets{
		addrs: NewBuckets(perSecond, burst, max),
		nets:  NewBuckets(float64(share)*perSecond, share*burst, max),
	}
}

// Take takes a token from src's bucket and from its network's at now, if
// both have one, and returns a refund that gives both back (see
// Buckets.Take). When the network has none, src's token is given back
// at once. limited names the bucket that had none: src or its network.
func (s *SourceBuckets) Take(src netip.Prefix, now time.Time) (refund func(), limited netip.Prefix, ok bool) {
	refundAddr, ok := s.addrs.Take(src, now)
	if !ok {
		return nil, src, false
	}
	net := NetworkOf(src)
	if net == src {
		return refundAddr, netip.Prefix{}, true
	}
	refundNet, ok := s.nets.Take(net, now)
	if !ok {
		refundAddr()
		return nil, net, false
	}
	return func() { refundAddr(); refundNet() }, netip.Prefix{}, true
}
