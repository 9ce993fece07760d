package main

import (
	"context"
	"fmt"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// changeRec is one endpoint change as made.
type changeRec struct {
	// Trigger is the trigger time stamped on the slice: unique per change.
	Trigger time.Time `json:"trigger"`
	Service string    `json:"service"`
	Class   string    `json:"class"`
	// Zone is the zone whose agents must see it, "" for every agent.
	Zone string `json:"zone,omitempty"`
	// Write is how long the API server took to accept it.
	Write time.Duration `json:"write"`
}

// expects reports whether the agent of node i must receive the change.
func (c *changeRec) expects(i int) bool { return c.Zone == "" || zoneOf(i) == c.Zone }

// changer makes endpoint changes: each moves one endpoint of one Service
// to a new pod IP on the same node, and stamps the slice with the time of
// the change. The classes are mixed in the world's proportions, and the
// Services of a class are taken in turn.
type changer struct {
	w    *world
	cs   kubernetes.Interface
	next [3]int // next Service of each class
	// order is the class of each change, shuffled once.
	order []class
	made  int
	last  time.Time
}

func newChanger(w *world, cs kubernetes.Interface, total int) *changer {
	c := &changer{w: w, cs: cs}
	// The classes in the world's proportions, rounded.
	n := float64(len(w.services))
	nh := int(float64(total)*float64(len(w.byClass[hinted]))/n + 0.5)
	nl := int(float64(total)*float64(len(w.byClass[local]))/n + 0.5)
	for i := range total {
		cl := plain
		switch {
		case i < nh:
			cl = hinted
		case i < nh+nl:
			cl = local
		}
		c.order = append(c.order, cl)
	}
	w.rnd.Shuffle(len(c.order), func(i, j int) { c.order[i], c.order[j] = c.order[j], c.order[i] })
	return c
}

// run makes n changes, one per pace, and returns them. The schedule is
// absolute: a slow write delays the next change, never the ones after.
func (c *changer) run(ctx context.Context, n int, pace time.Duration) ([]changeRec, error) {
	out := make([]changeRec, 0, n)
	t0 := time.Now()
	for i := range n {
		if wait := time.Until(t0.Add(time.Duration(i) * pace)); wait > 0 {
			select {
			case <-ctx.Done():
				return out, fmt.Errorf("changes: %w", context.Cause(ctx))
			case <-time.After(wait):
			}
		}
		rec, err := c.one(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
	log.Printf("made %d changes in %v", n, time.Since(t0).Round(time.Millisecond))
	return out, nil
}

// maxConflicts bounds retries of a slice update that lost a race; nothing
// else writes the slices, so one is already unexpected.
const maxConflicts = 3

func (c *changer) one(ctx context.Context) (changeRec, error) {
	cl := c.order[c.made%len(c.order)]
	if len(c.w.byClass[cl]) == 0 {
		cl = plain
	}
	c.made++
	s := c.w.byClass[cl][c.next[cl]%len(c.w.byClass[cl])]
	c.next[cl]++
	k := s.changes % len(s.endpoints)
	s.changes++
	s.endpoints[k].ip = c.w.newIP()

	// Trigger times identify changes: strictly increasing, hence unique.
	now := time.Now()
	if !now.After(c.last) {
		now = c.last.Add(time.Nanosecond)
	}
	c.last = now
	rec := changeRec{Trigger: now, Service: s.name, Class: cl.String()}
	if cl == hinted && len(s.endpoints) >= len(zones) {
		// Every zone has its own endpoint and uses its hints: only the
		// moved endpoint's zone sees a new view. With fewer endpoints some
		// zone falls back to every endpoint, and so does everyone.
		rec.Zone = zoneOf(s.endpoints[k].node)
	}
	sl := s.slice.DeepCopy()
	sl.Endpoints = endpointsOf(s)
	sl.Annotations[corev1.EndpointsLastChangeTriggerTime] = now.UTC().Format(time.RFC3339Nano)
	var err error
	for range maxConflicts {
		var updated *discoveryv1.EndpointSlice
		updated, err = c.cs.DiscoveryV1().EndpointSlices(namespace).Update(ctx, sl, metav1.UpdateOptions{})
		if err == nil {
			s.slice = updated
			break
		}
		if !apierrors.IsConflict(err) {
			break
		}
		cur, gerr := c.cs.DiscoveryV1().EndpointSlices(namespace).Get(ctx, sl.Name, metav1.GetOptions{})
		if gerr != nil {
			return rec, fmt.Errorf("re-reading EndpointSlice %s: %w", sl.Name, gerr)
		}
		sl.ResourceVersion = cur.ResourceVersion
	}
	if err != nil {
		return rec, fmt.Errorf("updating EndpointSlice %s: %w", sl.Name, err)
	}
	rec.Write = time.Since(now)
	return rec, nil
}
