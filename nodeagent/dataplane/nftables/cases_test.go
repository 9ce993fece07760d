package nftables

import (
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Addresses used across the unit tests. The node is 192.168.100.1 (and
// fd00:100::1); its pods are in 10.244.1.0/24, other nodes' pods in the
// rest of 10.244.0.0/16; clients outside the cluster are in 203.0.113.0/24.
const (
	nodeIP    = "192.168.100.1"
	nodeIP6   = "fd00:100::1"
	localPod  = "10.244.1.5"  // a pod on this node (a client)
	localEP   = "10.244.1.10" // an endpoint on this node
	remoteEP  = "10.244.2.10" // an endpoint on another node
	remoteEP2 = "10.244.3.10"
	client    = "203.0.113.7" // outside the cluster
	client2   = "203.0.113.8"
)

// testCase is a named table and configuration shared by the golden
// tests and the flow tests.
type testCase struct {
	name     string
	family   Family
	cfg      func(*Config)
	services func() []*pb.Service
}

func clusterIPTwoEndpoints() *pb.Service {
	s := svc("ns", "web", "10.96.0.10")
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080", remoteEP+":8080")}
	return s
}

func nodePortService() *pb.Service {
	s := svc("ns", "np", "10.96.0.20")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{port("", tcp, 80, 30080, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("", localEP+":8080", remoteEP+":8080")}
	return s
}

func noEndpointsService() *pb.Service {
	s := svc("ns", "empty", "10.96.0.30")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.ExternalIps = []string{"198.51.100.30"}
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 30030, false)}
	return s
}

// etpLocal is a LoadBalancer with eTP Local; withLocal says whether this
// node has one of its endpoints.
func etpLocal(withLocal bool) *pb.Service {
	s := svc("ns", "lb-local", "10.96.0.40")
	s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	s.LoadBalancerIps = []string{"198.51.100.40"}
	s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	s.HealthCheckNodePort = 32040
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 30040, true)}
	if withLocal {
		s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080", remoteEP+":8080")}
		s.LocalEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080")}
	} else {
		s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", remoteEP+":8080", remoteEP2+":8080")}
	}
	return s
}

// itpLocal is a ClusterIP Service with iTP Local.
func itpLocal(withLocal bool) *pb.Service {
	s := svc("ns", "internal-local", "10.96.0.50")
	s.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	s.Ports = []*pb.ServicePort{port("dns", udp, 53, 0, true)}
	if withLocal {
		s.LocalEndpoints = []*pb.PortEndpoints{eps("dns", localEP+":5353")}
	}
	return s
}

func affinityService() *pb.Service {
	s := svc("ns", "sticky", "10.96.0.60")
	s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 600}
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080", remoteEP+":8080", remoteEP2+":8080")}
	return s
}

func lbSourceRanges() *pb.Service {
	s := svc("ns", "lb-fw", "10.96.0.70")
	s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	s.LoadBalancerIps = []string{"198.51.100.70"}
	s.LoadBalancerSourceRanges = []string{"203.0.113.0/29", "192.168.100.0/24"}
	s.Ports = []*pb.ServicePort{port("https", tcp, 443, 30443, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("https", remoteEP+":8443")}
	return s
}

func externalIPService() *pb.Service {
	s := svc("ns", "ext", "10.96.0.80")
	s.ExternalIps = []string{"198.51.100.80"}
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", remoteEP+":8080")}
	return s
}

func sctpUDPService() *pb.Service {
	s := svc("ns", "multi-proto", "10.96.0.90")
	s.Ports = []*pb.ServicePort{port("sig", sctp, 3868, 0, true), port("dns", udp, 53, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{
		eps("sig", remoteEP+":3868"),
		eps("dns", localEP+":5353", remoteEP+":5353"),
	}
	return s
}

func dualStackService() *pb.Service {
	s := svc("ns", "dual", "10.96.0.100", "fd00:96::100")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 30100, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080", "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080")}
	return s
}

func multiPortService() *pb.Service {
	s := svc("ns", "multi", "10.96.0.110")
	s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	s.Ports = []*pb.ServicePort{port("http", tcp, 80, 30110, true), port("metrics", tcp, 9090, 0, false)}
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", localEP+":8080", remoteEP+":8080")}
	return s
}

func one(s func() *pb.Service) func() []*pb.Service {
	return func() []*pb.Service { return []*pb.Service{s()} }
}

var cases = []testCase{
	{name: "clusterip", family: IPv4, services: one(clusterIPTwoEndpoints)},
	{name: "nodeport", family: IPv4, services: one(nodePortService)},
	{name: "no-endpoints", family: IPv4, services: one(noEndpointsService)},
	{name: "etp-local", family: IPv4, services: func() []*pb.Service { return []*pb.Service{etpLocal(true)} }},
	{name: "etp-local-no-local-endpoints", family: IPv4, services: func() []*pb.Service { return []*pb.Service{etpLocal(false)} }},
	{name: "itp-local", family: IPv4, services: func() []*pb.Service { return []*pb.Service{itpLocal(true)} }},
	{name: "itp-local-no-local-endpoints", family: IPv4, services: func() []*pb.Service { return []*pb.Service{itpLocal(false)} }},
	{name: "affinity", family: IPv4, services: one(affinityService)},
	{name: "lb-source-ranges", family: IPv4, services: one(lbSourceRanges)},
	{name: "external-ip", family: IPv4, services: one(externalIPService)},
	{name: "sctp-udp", family: IPv4, services: one(sctpUDPService)},
	{name: "dual-stack-ipv4", family: IPv4, services: one(dualStackService)},
	{name: "dual-stack-ipv6", family: IPv6, services: one(dualStackService)},
	{name: "multi-port", family: IPv4, services: one(multiPortService)},
	{
		name: "nodeport-addresses", family: IPv4, services: one(nodePortService),
		cfg: func(c *Config) { c.NodePortAddresses = []string{"192.168.100.0/24", "fd00:100::/64"} },
	},
	{
		name: "no-local-detection", family: IPv4, services: func() []*pb.Service { return []*pb.Service{clusterIPTwoEndpoints(), etpLocal(true)} },
		cfg: func(c *Config) { c.LocalMode = LocalNone; c.NoRandomFully = true; c.ConntrackTCPBeLiberal = true },
	},
	{
		name: "masquerade-all-node-cidr", family: IPv4, services: one(clusterIPTwoEndpoints),
		cfg: func(c *Config) { c.MasqueradeAll = true; c.LocalMode = LocalNodeCIDR; c.MasqueradeBit = 5 },
	},
}

func (c testCase) config() Config {
	cfg := testConfig(c.family)
	if c.cfg != nil {
		c.cfg(&cfg)
	}
	return cfg
}
