package dptest

import (
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Addresses used across the feature cases. The node is 192.168.100.1 (and
// fd00:100::1); its pods are in 10.244.1.0/24, other nodes' pods in the
// rest of 10.244.0.0/16; clients outside the cluster are in 203.0.113.0/24.
const (
	NodeIP    = "192.168.100.1"
	NodeIP6   = "fd00:100::1"
	LocalPod  = "10.244.1.5"  // a pod on this node (a client)
	LocalEP   = "10.244.1.10" // an endpoint on this node
	RemoteEP  = "10.244.2.10" // an endpoint on another node
	RemoteEP2 = "10.244.3.10"
	Client    = "203.0.113.7" // outside the cluster
	Client2   = "203.0.113.8"
)

// Node is the node every feature case's table belongs to.
func Node() *pb.NodeInfo {
	return &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"10.244.1.0/24", "fd00:244:1::/64"}, Hash: 7}
}

// Case is a named table and configuration, one feature each: the
// dataplanes' goldens are named after the cases and their flow tests
// trace packets through them.
type Case struct {
	Name     string
	Family   dataplane.Family
	Services func() []*pb.Service
	// Config is how the case's configuration differs from the test
	// package's own.
	Config Tweaks
}

// Tweaks are changes to a dataplane's test configuration; the fields mean
// what the Config fields of the same names do. Zero values change
// nothing.
type Tweaks struct {
	NodePortAddresses     []string
	LocalMode             dataplane.LocalMode
	MasqueradeAll         bool
	MasqueradeBit         int
	NoRandomFully         bool
	ConntrackTCPBeLiberal bool
}

// ClusterIPTwoEndpoints is ns/web: a ClusterIP with a local and a remote
// endpoint.
func ClusterIPTwoEndpoints() *pb.Service {
	s := Svc("ns", "web", "10.96.0.10")
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080", RemoteEP+":8080")}
	return s
}

// NodePortService is ns/np: a NodePort with an unnamed port.
func NodePortService() *pb.Service {
	s := Svc("ns", "np", "10.96.0.20")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{Port("", TCP, 80, 30080, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("", LocalEP+":8080", RemoteEP+":8080")}
	return s
}

// NoEndpointsService is ns/empty: a NodePort with an external IP and no
// endpoint anywhere.
func NoEndpointsService() *pb.Service {
	s := Svc("ns", "empty", "10.96.0.30")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.ExternalIps = []string{"198.51.100.30"}
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30030, false)}
	return s
}

// ETPLocal is ns/lb-local, a LoadBalancer with eTP Local; withLocal says
// whether this node has one of its endpoints.
func ETPLocal(withLocal bool) *pb.Service {
	s := Svc("ns", "lb-local", "10.96.0.40")
	s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	s.LoadBalancerIps = []string{"198.51.100.40"}
	s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	s.HealthCheckNodePort = 32040
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30040, true)}
	if withLocal {
		s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080", RemoteEP+":8080")}
		s.LocalEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080")}
	} else {
		s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", RemoteEP+":8080", RemoteEP2+":8080")}
	}
	return s
}

// ITPLocal is ns/internal-local, a ClusterIP Service with iTP Local;
// withLocal says whether this node has its endpoint.
func ITPLocal(withLocal bool) *pb.Service {
	s := Svc("ns", "internal-local", "10.96.0.50")
	s.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	s.Ports = []*pb.ServicePort{Port("dns", UDP, 53, 0, true)}
	if withLocal {
		s.LocalEndpoints = []*pb.PortEndpoints{Eps("dns", LocalEP+":5353")}
	}
	return s
}

// AffinityService is ns/sticky: ClientIP affinity of 600 s over three
// endpoints.
func AffinityService() *pb.Service {
	s := Svc("ns", "sticky", "10.96.0.60")
	s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 600}
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080", RemoteEP+":8080", RemoteEP2+":8080")}
	return s
}

// LBSourceRanges is ns/lb-fw: a LoadBalancer whose source ranges admit
// 203.0.113.0/29 and the node's network.
func LBSourceRanges() *pb.Service {
	s := Svc("ns", "lb-fw", "10.96.0.70")
	s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	s.LoadBalancerIps = []string{"198.51.100.70"}
	s.LoadBalancerSourceRanges = []string{"203.0.113.0/29", "192.168.100.0/24"}
	s.Ports = []*pb.ServicePort{Port("https", TCP, 443, 30443, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("https", RemoteEP+":8443")}
	return s
}

// ExternalIPService is ns/ext: a ClusterIP with an external IP.
func ExternalIPService() *pb.Service {
	s := Svc("ns", "ext", "10.96.0.80")
	s.ExternalIps = []string{"198.51.100.80"}
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", RemoteEP+":8080")}
	return s
}

// SCTPUDPService is ns/multi-proto: an SCTP and a UDP port.
func SCTPUDPService() *pb.Service {
	s := Svc("ns", "multi-proto", "10.96.0.90")
	s.Ports = []*pb.ServicePort{Port("sig", SCTP, 3868, 0, true), Port("dns", UDP, 53, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{
		Eps("sig", RemoteEP+":3868"),
		Eps("dns", LocalEP+":5353", RemoteEP+":5353"),
	}
	return s
}

// DualStackService is ns/dual: a dual-stack NodePort.
func DualStackService() *pb.Service {
	s := Svc("ns", "dual", "10.96.0.100", "fd00:96::100")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30100, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080", "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080")}
	return s
}

// MultiPortService is ns/multi: a NodePort port with endpoints and a port
// without.
func MultiPortService() *pb.Service {
	s := Svc("ns", "multi", "10.96.0.110")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30110, true), Port("metrics", TCP, 9090, 0, false)}
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", LocalEP+":8080", RemoteEP+":8080")}
	return s
}

func one(s func() *pb.Service) func() []*pb.Service {
	return func() []*pb.Service { return []*pb.Service{s()} }
}

// Cases are the feature cases, in golden order.
var Cases = []Case{
	{Name: "clusterip", Family: dataplane.IPv4, Services: one(ClusterIPTwoEndpoints)},
	{Name: "nodeport", Family: dataplane.IPv4, Services: one(NodePortService)},
	{Name: "no-endpoints", Family: dataplane.IPv4, Services: one(NoEndpointsService)},
	{Name: "etp-local", Family: dataplane.IPv4, Services: func() []*pb.Service { return []*pb.Service{ETPLocal(true)} }},
	{Name: "etp-local-no-local-endpoints", Family: dataplane.IPv4, Services: func() []*pb.Service { return []*pb.Service{ETPLocal(false)} }},
	{Name: "itp-local", Family: dataplane.IPv4, Services: func() []*pb.Service { return []*pb.Service{ITPLocal(true)} }},
	{Name: "itp-local-no-local-endpoints", Family: dataplane.IPv4, Services: func() []*pb.Service { return []*pb.Service{ITPLocal(false)} }},
	{Name: "affinity", Family: dataplane.IPv4, Services: one(AffinityService)},
	{Name: "lb-source-ranges", Family: dataplane.IPv4, Services: one(LBSourceRanges)},
	{Name: "external-ip", Family: dataplane.IPv4, Services: one(ExternalIPService)},
	{Name: "sctp-udp", Family: dataplane.IPv4, Services: one(SCTPUDPService)},
	{Name: "dual-stack-ipv4", Family: dataplane.IPv4, Services: one(DualStackService)},
	{Name: "dual-stack-ipv6", Family: dataplane.IPv6, Services: one(DualStackService)},
	{Name: "multi-port", Family: dataplane.IPv4, Services: one(MultiPortService)},
	{
		Name: "nodeport-addresses", Family: dataplane.IPv4, Services: one(NodePortService),
		Config: Tweaks{NodePortAddresses: []string{"192.168.100.0/24", "fd00:100::/64"}},
	},
	{
		Name: "no-local-detection", Family: dataplane.IPv4, Services: func() []*pb.Service { return []*pb.Service{ClusterIPTwoEndpoints(), ETPLocal(true)} },
		Config: Tweaks{LocalMode: dataplane.LocalNone, NoRandomFully: true, ConntrackTCPBeLiberal: true},
	},
	{
		Name: "masquerade-all-node-cidr", Family: dataplane.IPv4, Services: one(ClusterIPTwoEndpoints),
		Config: Tweaks{MasqueradeAll: true, LocalMode: dataplane.LocalNodeCIDR, MasqueradeBit: 5},
	},
}

// CaseNamed returns the case called name.
func CaseNamed(tb testing.TB, name string) Case {
	tb.Helper()
	for _, c := range Cases {
		if c.Name == name {
			return c
		}
	}
	tb.Fatalf("no case %q", name)
	return Case{}
}

// CaseServices is every case's Services, each once, in case order.
func CaseServices() []*pb.Service {
	var all []*pb.Service
	seen := map[string]bool{}
	for _, c := range Cases {
		for _, s := range c.Services() {
			if k := s.Namespace + "/" + s.Name; !seen[k] {
				seen[k] = true
				all = append(all, s)
			}
		}
	}
	return all
}
