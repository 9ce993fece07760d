package dptest

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Mutate makes one random change to services (eight at most, "ns/s0" to
// "ns/s7", dual-stack): add, remove, or change a Service's endpoints,
// policies, addresses or affinity. Services share external addresses now
// and then, so conflicts are exercised too. A changed Service is a copy:
// the previous table keeps the old one.
func Mutate(rng *rand.Rand, services map[string]*pb.Service) {
	name := "s" + strconv.Itoa(rng.IntN(8))
	n := int(name[1] - '0')
	s, ok := services[name]
	if ok {
		s = proto.CloneOf(s)
		services[name] = s
	}
	if !ok || rng.IntN(6) == 0 {
		if ok && rng.IntN(2) == 0 {
			delete(services, name)
			return
		}
		s = Svc("ns", name, AddrAt("10.96.1.0", n+1), "fd00:96::1:"+strconv.Itoa(n+1))
		s.Ports = []*pb.ServicePort{Port("a", TCP, 80, 0, true), Port("b", UDP, 53, 0, true)}
		services[name] = s
	}
	// Rebuild the endpoint sets from scratch with random choices.
	pick := func() []string {
		var out []string
		for i := range 4 {
			if rng.IntN(2) == 0 {
				out = append(out, AddrAt("10.244.1.0", 10+i)+":8080", "[fd00:244:1::"+strconv.Itoa(10+i)+"]:8080")
			}
		}
		for i := range 3 {
			if rng.IntN(2) == 0 {
				out = append(out, AddrAt("10.244.2.0", 10+i)+":8080", "[fd00:244:2::"+strconv.Itoa(10+i)+"]:8080")
			}
		}
		return out
	}
	switch rng.IntN(6) {
	case 0:
		s.ExternalTrafficPolicy = pb.TrafficPolicy(1 + rng.IntN(2))
		s.InternalTrafficPolicy = pb.TrafficPolicy(1 + rng.IntN(2))
	case 1:
		s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
		s.LoadBalancerIps = []string{AddrAt("198.51.100.0", n+1), "2001:db8::" + strconv.Itoa(n+1)}
		s.Ports[0].NodePort = int32(30000 + n)
		if rng.IntN(2) == 0 {
			s.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "2001:db8:1::/48"}
		} else {
			s.LoadBalancerSourceRanges = nil
		}
	case 2:
		if s.SessionAffinity == nil {
			s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: int32(60 * (1 + rng.IntN(2)))}
		} else {
			s.SessionAffinity = nil
		}
	case 3:
		// Shared by two Services at most, as a conflict would be.
		s.ExternalIps = []string{AddrAt("198.51.100.200", n/2), "2001:db8::c8:" + strconv.Itoa(n/2)}
	}
	s.ClusterEndpoints, s.LocalEndpoints = nil, nil
	for _, p := range s.Ports {
		all := pick()
		p.HasEndpoints = len(all) > 0
		if len(all) > 0 {
			s.ClusterEndpoints = append(s.ClusterEndpoints, Eps(p.Name, all...))
		}
		var local []string
		for _, a := range all {
			if strings.HasPrefix(a, "10.244.1.") || strings.HasPrefix(a, "[fd00:244:1::") {
				local = append(local, a)
			}
		}
		if len(local) > 0 && (s.InternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL || s.ExternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL) {
			s.LocalEndpoints = append(s.LocalEndpoints, Eps(p.Name, local...))
		}
	}
}

// Converge makes 200 random changes (Mutate, drawn from rng) to a table
// that starts empty and syncs each, partially but every 50th fully,
// calling check after each: partial syncs must leave the kernel as a full
// sync of the same table would.
func Converge(tb testing.TB, rng *rand.Rand, sync func(full bool, services ...*pb.Service) error, check func()) {
	tb.Helper()
	services := map[string]*pb.Service{}
	for step := range 200 {
		Mutate(rng, services)
		if err := sync(step%50 == 49, Sorted(services)...); err != nil {
			tb.Fatalf("step %d: %v", step, err)
		}
		check()
	}
}
