package agent

import (
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// changes counts what a table response changes, the agent's analogue of
// kube-proxy's service and endpoints change trackers (which count API
// events): services is the number of Services added, removed, or changed
// in anything but their endpoints; endpoints the number of Services whose
// endpoints changed (an added or removed Service with endpoints counts
// too). changed lists the keys a delta touched; nil (a snapshot) compares
// every key of both tables. It is pure.
func changes(cur, next *proxytable.Table, changed []string) (services, endpoints int) {
	count := func(k string) {
		s, e := entryChanges(cur.Entries[k], next.Entries[k])
		if s {
			services++
		}
		if e {
			endpoints++
		}
	}
	if changed != nil {
		for _, k := range changed {
			count(k)
		}
		return services, endpoints
	}
	for k := range next.Entries {
		count(k)
	}
	for k := range cur.Entries {
		if _, ok := next.Entries[k]; !ok {
			count(k)
		}
	}
	return services, endpoints
}

// entryChanges reports whether going from a to b (nil for absent) changes
// the Service and whether it changes its endpoints.
func entryChanges(a, b *pb.ServiceEntry) (service, endpoints bool) {
	switch {
	case a == nil && b == nil:
		return false, false
	case a == nil || b == nil:
		return true, hasEndpoints(a.GetService()) || hasEndpoints(b.GetService())
	case a == b || (a.GetHash() == b.GetHash() && proto.Equal(a, b)):
		return false, false
	}
	sa, sb := a.GetService(), b.GetService()
	endpoints = !endpointsEqual(sa, sb)
	service = !proto.Equal(withoutEndpoints(sa), withoutEndpoints(sb))
	return service, endpoints
}

func hasEndpoints(s *pb.Service) bool {
	return len(s.GetClusterEndpoints()) > 0 || len(s.GetLocalEndpoints()) > 0
}

// endpointsEqual compares what the endpoints decide: the endpoint sets
// and each port's has_endpoints.
func endpointsEqual(a, b *pb.Service) bool {
	if len(a.GetPorts()) != len(b.GetPorts()) {
		return false
	}
	for i, p := range a.GetPorts() {
		if p.GetHasEndpoints() != b.GetPorts()[i].GetHasEndpoints() {
			return false
		}
	}
	return listEqual(a.GetClusterEndpoints(), b.GetClusterEndpoints()) &&
		listEqual(a.GetLocalEndpoints(), b.GetLocalEndpoints())
}

func listEqual(a, b []*pb.PortEndpoints) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// withoutEndpoints returns a copy of s without what endpointsEqual
// compares. Only changed entries get here: a delta's few, or a
// snapshot's differences from the table in force.
func withoutEndpoints(s *pb.Service) *pb.Service {
	c := proto.CloneOf(s)
	if c == nil {
		return nil
	}
	c.ClusterEndpoints, c.LocalEndpoints = nil, nil
	for _, p := range c.GetPorts() {
		p.HasEndpoints = false
	}
	return c
}
