package compute

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func TestSkipReason(t *testing.T) {
	tests := []struct {
		name string
		svc  *corev1.Service
		want string // "" when proxied; else a substring of the reason
	}{
		{name: "normal ClusterIP", svc: newService()},
		{name: "NodePort", svc: nodePortService()},
		{name: "LoadBalancer", svc: newService(withType(corev1.ServiceTypeLoadBalancer))},
		{
			name: "headless",
			svc:  newService(withClusterIPs(corev1.ClusterIPNone)),
			want: "headless",
		},
		{
			name: "ExternalName",
			svc: newService(withType(corev1.ServiceTypeExternalName), func(s *corev1.Service) {
				s.Spec.ExternalName = "example.com"
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			}),
			want: "ExternalName",
		},
		{
			// Even with a cluster IP, as upstream's ShouldSkipService.
			name: "ExternalName with a cluster IP",
			svc:  newService(withType(corev1.ServiceTypeExternalName)),
			want: "ExternalName",
		},
		{
			name: "service-proxy-name label",
			svc:  newService(withLabel(LabelServiceProxyName, "other-proxy")),
			want: LabelServiceProxyName,
		},
		{
			// kube-proxy selects Services with the requirement
			// "!service.kubernetes.io/service-proxy-name" (DoesNotExist):
			// the label's presence excludes a Service, whatever its value.
			name: "service-proxy-name label with an empty value",
			svc:  newService(withLabel(LabelServiceProxyName, "")),
			want: LabelServiceProxyName,
		},
		{
			name: "other labels",
			svc:  newService(withLabel("app", "web")),
		},
		{
			name: "no cluster IP",
			svc:  newService(withClusterIPs()),
			want: "no cluster IP",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SkipReason(tt.svc)
			switch {
			case tt.want == "" && got != "":
				t.Errorf("SkipReason = %q, want \"\" (proxied)", got)
			case tt.want != "" && !strings.Contains(got, tt.want):
				t.Errorf("SkipReason = %q, want a reason containing %q", got, tt.want)
			}
		})
	}
}

func TestKey(t *testing.T) {
	if got, want := Key("kube-system", "kube-dns"), "kube-system/kube-dns"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
	if got := mustBuild(t, newService()).Key; got != "default/web" {
		t.Errorf("Service.Key = %q, want %q", got, "default/web")
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name    string
		svc     *corev1.Service
		wantErr string // "" for a valid Service; else a substring of the error
	}{
		{name: "valid", svc: newService()},
		{
			name: "valid with everything",
			svc: newService(
				withType(corev1.ServiceTypeLoadBalancer),
				withClusterIPs("10.96.0.10", "fd00::10"),
				withExternalIPs("192.0.2.1"),
				withIngress(corev1.LoadBalancerIngress{IP: "198.51.100.1"}),
				withExternalLocal(),
				withInternalLocal(),
				withAffinity(ptr(int32(86400))),
				withPorts(
					svcPort("a", corev1.ProtocolTCP, 1, 30000),
					svcPort("b", corev1.ProtocolUDP, 65535, 32767),
					svcPort("c", corev1.ProtocolSCTP, 9000, 0),
				),
				func(s *corev1.Service) {
					s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "2001:db8::/32"}
					s.Spec.HealthCheckNodePort = 32000
				},
			),
		},
		{
			name:    "bad clusterIP",
			svc:     newService(withClusterIPs("10.96.0.300")),
			wantErr: "clusterIPs",
		},
		{
			name:    "bad secondary clusterIP",
			svc:     newService(withClusterIPs("10.96.0.10", "fd00::zz")),
			wantErr: "clusterIPs",
		},
		{
			name:    "bad clusterIP without clusterIPs",
			svc:     newService(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "garbage", nil }),
			wantErr: "clusterIPs",
		},
		{
			name:    "unknown type",
			svc:     newService(withType("Magic")),
			wantErr: "unknown type",
		},
		{
			name:    "unknown protocol",
			svc:     newService(withPorts(svcPort("http", "HTTP", 80, 0))),
			wantErr: "unknown protocol",
		},
		{
			name:    "port 0",
			svc:     newService(withPorts(svcPort("http", corev1.ProtocolTCP, 0, 0))),
			wantErr: "out of range",
		},
		{
			name:    "port above 65535",
			svc:     newService(withPorts(svcPort("http", corev1.ProtocolTCP, 65536, 0))),
			wantErr: "out of range",
		},
		{
			name:    "negative nodePort",
			svc:     nodePortService(withPorts(svcPort("http", corev1.ProtocolTCP, 80, -1))),
			wantErr: "nodePort",
		},
		{
			name:    "nodePort above 65535",
			svc:     nodePortService(withPorts(svcPort("http", corev1.ProtocolTCP, 80, 70000))),
			wantErr: "nodePort",
		},
		{
			name: "duplicate port names",
			svc: newService(withPorts(
				svcPort("http", corev1.ProtocolTCP, 80, 0),
				svcPort("http", corev1.ProtocolUDP, 80, 0),
			)),
			wantErr: "duplicate port name",
		},
		{
			name:    "port name not UTF-8",
			svc:     newService(withPorts(svcPort("\xff", corev1.ProtocolTCP, 80, 0))),
			wantErr: "UTF-8",
		},
		{
			name:    "affinity timeout 0",
			svc:     newService(withAffinity(ptr(int32(0)))),
			wantErr: "session affinity timeout",
		},
		{
			name:    "affinity timeout negative",
			svc:     newService(withAffinity(ptr(int32(-5)))),
			wantErr: "session affinity timeout",
		},
		{
			name:    "affinity timeout above a day",
			svc:     newService(withAffinity(ptr(int32(86401)))),
			wantErr: "session affinity timeout",
		},
		{
			name: "healthCheckNodePort out of range",
			svc: newService(withType(corev1.ServiceTypeLoadBalancer), withExternalLocal(), func(s *corev1.Service) {
				s.Spec.HealthCheckNodePort = 70000
			}),
			wantErr: "healthCheckNodePort",
		},
		{
			name:    "empty name",
			svc:     newService(func(s *corev1.Service) { s.Name = "" }),
			wantErr: "name",
		},
		{
			name:    "empty namespace",
			svc:     newService(func(s *corev1.Service) { s.Namespace = "" }),
			wantErr: "name",
		},
		{
			name:    "name not UTF-8",
			svc:     newService(func(s *corev1.Service) { s.Name = "web\xff" }),
			wantErr: "name",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Build(tt.svc, []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.1"))})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Build: %v, want success", err)
				}
				if s == nil {
					t.Fatal("Build returned a nil Service and no error")
				}
				return
			}
			if err == nil {
				t.Fatalf("Build succeeded, want an error containing %q", tt.wantErr)
			}
			if s != nil {
				t.Errorf("Build returned a Service with its error")
			}
			if !errors.Is(err, ErrInvalidService) {
				t.Errorf("Build error %q does not wrap ErrInvalidService", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Build error %q does not mention %q", err, tt.wantErr)
			}
			if key := Key(tt.svc.Namespace, tt.svc.Name); tt.svc.Name != "" && tt.svc.Namespace != "" && !strings.Contains(err.Error(), key) {
				t.Errorf("Build error %q does not name the Service %q", err, key)
			}

			// BuildReport skips the Service and reports why, once.
			s, problems := BuildReport(tt.svc, []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.1"))})
			if s != nil {
				t.Errorf("BuildReport returned a Service for an invalid one")
			}
			if len(problems) != 1 {
				t.Fatalf("BuildReport problems = %+v, want one", problems)
			}
			p := problems[0]
			if p.Kind != KindService || p.Namespace != tt.svc.Namespace || p.Name != tt.svc.Name || p.Reason != ReasonInvalidService {
				t.Errorf("BuildReport problem = %+v, want an %s on Service %s/%s", p, ReasonInvalidService, tt.svc.Namespace, tt.svc.Name)
			}
			if !strings.Contains(p.Message, tt.wantErr) || strings.Contains(p.Message, ErrInvalidService.Error()) {
				t.Errorf("BuildReport message %q: want the cause, mentioning %q, without the sentinel", p.Message, tt.wantErr)
			}
		})
	}
}

// TestBuildReportDropsValues checks that an invalid external IP, load
// balancer ingress IP or source range is left out alone and reported, as
// upstream's newBaseServiceInfo filters them, while the rest of the
// Service is proxied; and that a Service left with none of its source
// ranges admits no one rather than everyone.
func TestBuildReportDropsValues(t *testing.T) {
	lb := func(opts ...svcOpt) *corev1.Service {
		return newService(append([]svcOpt{
			withType(corev1.ServiceTypeLoadBalancer),
			withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080)),
		}, opts...)...)
	}
	ranges := func(r ...string) svcOpt {
		return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = r }
	}
	lbFrontend := func(f func(*pb.Service)) *pb.Service {
		return wantFrontend(func(s *pb.Service) {
			s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
			s.Ports[0].NodePort = 30080
			s.Ports[0].HasEndpoints = true
			s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			if f != nil {
				f(s)
			}
		})
	}
	tests := []struct {
		name      string
		svc       *corev1.Service
		want      *pb.Service
		wantProbs []string // substrings of each ReasonInvalidValue message, in order
	}{
		{
			name: "bad externalIP dropped, the other kept",
			svc:  newService(withExternalIPs("192.0.2.1", "example.com", "2001:db8::1")),
			want: wantFrontend(func(s *pb.Service) {
				s.ExternalIps = []string{"192.0.2.1", "2001:db8::1"}
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
			wantProbs: []string{`externalIPs[1] "example.com"`},
		},
		{
			name: "every externalIP bad: a ClusterIP Service",
			svc:  newService(withExternalIPs("", "192.0.2.300")),
			want: wantFrontend(func(s *pb.Service) {
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
			wantProbs: []string{`externalIPs[0] ""`, `externalIPs[1] "192.0.2.300"`},
		},
		{
			name: "leading zeros read as decimal, as upstream's ParseIPSloppy",
			svc:  newService(withExternalIPs("192.0.2.010")),
			want: wantFrontend(func(s *pb.Service) {
				s.ExternalIps = []string{"192.0.2.10"}
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
		},
		{
			name: "externalIP with a zone dropped",
			svc:  newService(withExternalIPs("fe80::1%eth0")),
			want: wantFrontend(func(s *pb.Service) {
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
			wantProbs: []string{`externalIPs[0] "fe80::1%eth0"`},
		},
		{
			name: "bad ingress IP dropped, the other kept",
			svc: lb(withIngress(
				corev1.LoadBalancerIngress{IP: "1.2.3"},
				corev1.LoadBalancerIngress{IP: "198.51.100.1"},
			)),
			want:      lbFrontend(func(s *pb.Service) { s.LoadBalancerIps = []string{"198.51.100.1"} }),
			wantProbs: []string{`status.loadBalancer.ingress[0].ip "1.2.3"`},
		},
		{
			name: "bad source range dropped, the others kept",
			svc:  lb(withIngress(corev1.LoadBalancerIngress{IP: "198.51.100.1"}), ranges("10.0.0.0/33", " 192.168.0.0/16", "10.0.0.1", "2001:db8::/32")),
			want: lbFrontend(func(s *pb.Service) {
				s.LoadBalancerIps = []string{"198.51.100.1"}
				s.LoadBalancerSourceRanges = []string{"192.168.0.0/16", "2001:db8::/32"}
			}),
			wantProbs: []string{`loadBalancerSourceRanges[0] "10.0.0.0/33"`, `loadBalancerSourceRanges[2] "10.0.0.1"`},
		},
		{
			name: "source range with leading zeros read as decimal",
			svc:  lb(ranges("010.001.0.0/16")),
			want: lbFrontend(func(s *pb.Service) { s.LoadBalancerSourceRanges = []string{"10.1.0.0/16"} }),
		},
		{
			// Upstream would be left with no ranges and admit everyone.
			name: "every source range bad: the load balancer admits no one",
			svc:  lb(withIngress(corev1.LoadBalancerIngress{IP: "198.51.100.1"}), ranges("10.0.0.0/33", "")),
			want: lbFrontend(func(s *pb.Service) {
				s.LoadBalancerIps = []string{"198.51.100.1"}
				s.LoadBalancerSourceRanges = []string{ClosedSourceRange}
			}),
			wantProbs: []string{`loadBalancerSourceRanges[0] "10.0.0.0/33"`, `loadBalancerSourceRanges[1] ""`, "admits no one"},
		},
		{
			name: "all at once",
			svc: lb(withExternalIPs("192.0.2.1", "bad"), withIngress(corev1.LoadBalancerIngress{IP: "bad"}),
				ranges("bad", "10.0.0.0/8")),
			want: lbFrontend(func(s *pb.Service) {
				s.ExternalIps = []string{"192.0.2.1"}
				s.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
			}),
			wantProbs: []string{"externalIPs[1]", "status.loadBalancer.ingress[0].ip", "loadBalancerSourceRanges[0]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slices := []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.1"))}
			s, problems := BuildReport(tt.svc, slices)
			if s == nil {
				t.Fatalf("BuildReport left the Service out (%+v), want it proxied without the bad values", problems)
			}
			checkProto(t, "view", viewFor(t, s, testNode("node-a", "zone-a")), tt.want)
			if len(problems) != len(tt.wantProbs) {
				t.Fatalf("problems = %+v, want %d", problems, len(tt.wantProbs))
			}
			for i, p := range problems {
				if p.Kind != KindService || p.Namespace != testNamespace || p.Name != testName || p.Reason != ReasonInvalidValue {
					t.Errorf("problem %d = %+v, want a %s on Service %s/%s", i, p, ReasonInvalidValue, testNamespace, testName)
				}
				if !strings.Contains(p.Message, tt.wantProbs[i]) {
					t.Errorf("problem %d message %q does not mention %q", i, p.Message, tt.wantProbs[i])
				}
			}
			// Build, for callers that only need the Service, agrees.
			if b, err := Build(tt.svc, slices); err != nil || b == nil {
				t.Errorf("Build = %v, %v; want the Service", b, err)
			}
		})
	}
}

// TestBuildReportSlices checks that an invalid element of an EndpointSlice
// is left out and reported against its slice, while the rest of the slice,
// and the other slices, still count.
func TestBuildReportSlices(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	tcp := ptr(corev1.ProtocolTCP)
	problem := func(slice, message string) Problem {
		return Problem{Kind: KindEndpointSlice, Namespace: testNamespace, Name: slice, Reason: ReasonInvalidEndpoint, Message: message}
	}
	tests := []struct {
		name   string
		svc    *corev1.Service // newService() when nil
		slices []*discoveryv1.EndpointSlice
		want   []string  // the "http" endpoints kept, as ip:port
		wantP  []Problem // Message is a substring of the one reported
	}{
		{
			name:   "valid slices: no problems",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1")), httpSlice("web-b", ep("10.0.0.2"))},
			want:   []string{"10.0.0.1:8080", "10.0.0.2:8080"},
		},
		{
			name:   "address that does not parse",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"), ep("10.0.0.300"))},
			want:   []string{"10.0.0.1:8080"},
			wantP:  []Problem{problem("web-a", `endpoints[1]: address "10.0.0.300" is not an IP address`)},
		},
		{
			name:   "IPv6 address in an IPv4 slice",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("fd00::1"), ep("10.0.0.1"))},
			want:   []string{"10.0.0.1:8080"},
			wantP:  []Problem{problem("web-a", `endpoints[0]: address "fd00::1" is not of the slice's address type IPv4`)},
		},
		{
			name:   "IPv4 address in an IPv6 slice",
			svc:    newService(withClusterIPs("10.96.0.10", "fd00:96::10")),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v6, httpPort(), ep("fd00::1"), ep("10.0.0.1"))},
			want:   []string{"[fd00::1]:8080"},
			wantP:  []Problem{problem("web-a", `endpoints[1]: address "10.0.0.1" is not of the slice's address type IPv6`)},
		},
		{
			name:   "endpoint without an address",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", discoveryv1.Endpoint{}, ep("10.0.0.1"))},
			want:   []string{"10.0.0.1:8080"},
			wantP:  []Problem{problem("web-a", "endpoints[0]: no address")},
		},
		{
			name: "port 0",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{slicePort(ptr("http"), tcp, 0)}, ep("10.0.0.1")),
				httpSlice("web-b", ep("10.0.0.2")),
			},
			want:  []string{"10.0.0.2:8080"},
			wantP: []Problem{problem("web-a", `ports[0] "http": port 0 out of range`)},
		},
		{
			name: "port above 65535",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{slicePort(ptr("http"), tcp, 65536)}, ep("10.0.0.1")),
			},
			wantP: []Problem{problem("web-a", `ports[0] "http": port 65536 out of range`)},
		},
		{
			name: "port without a number",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: tcp}}, ep("10.0.0.1")),
			},
			wantP: []Problem{problem("web-a", `ports[0] "http": no port number`)},
		},
		{
			name: "port without a name",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{slicePort(nil, tcp, 9090), httpPort()[0]}, ep("10.0.0.1")),
			},
			want:  []string{"10.0.0.1:8080"},
			wantP: []Problem{problem("web-a", "ports[0]: no name")},
		},
		{
			name: "unknown protocol",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{
					slicePort(ptr("metrics"), ptr(corev1.Protocol("HTTP")), 9090), httpPort()[0],
				}, ep("10.0.0.1")),
			},
			want:  []string{"10.0.0.1:8080"},
			wantP: []Problem{problem("web-a", `ports[0] "metrics": unknown protocol "HTTP"`)},
		},
		{
			// Which target port would be right is anybody's guess, so
			// neither is used.
			name: "duplicate slice port names",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{
					slicePort(ptr("http"), tcp, 8080), slicePort(ptr("http"), tcp, 8081),
				}, ep("10.0.0.1")),
				httpSlice("web-b", ep("10.0.0.2")),
			},
			want: []string{"10.0.0.2:8080"},
			wantP: []Problem{
				problem("web-a", `ports[0]: duplicate port name "http"`),
				problem("web-a", `ports[1]: duplicate port name "http"`),
			},
		},
		{
			// The API server rejects a repeated name whatever the protocol.
			name: "duplicate slice port names with different protocols",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{
					slicePort(ptr("http"), ptr(corev1.ProtocolUDP), 8081), slicePort(ptr("http"), tcp, 8080),
				}, ep("10.0.0.1")),
			},
			wantP: []Problem{
				problem("web-a", `ports[0]: duplicate port name "http"`),
				problem("web-a", `ports[1]: duplicate port name "http"`),
			},
		},
		{
			name: "problems ordered by slice name, ports before endpoints",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-b", v4, []discoveryv1.EndpointPort{slicePort(ptr("x"), tcp, 0), httpPort()[0]}, ep("bad"), ep("10.0.0.2")),
				httpSlice("web-a", ep("fd00::1"), ep("10.0.0.1")),
			},
			want: []string{"10.0.0.1:8080", "10.0.0.2:8080"},
			wantP: []Problem{
				problem("web-a", "endpoints[0]"),
				problem("web-b", "ports[0]"),
				problem("web-b", "endpoints[0]"),
			},
		},
		{
			// Upstream ignores these slices without a word; so do we.
			name: "FQDN and other-family slices are not checked",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", discoveryv1.AddressTypeFQDN, httpPort(), ep("backend.example.com")),
				newSlice("web-b", v6, []discoveryv1.EndpointPort{slicePort(ptr("http"), tcp, 0)}, ep("10.0.0.1")),
				httpSlice("web-c", ep("10.0.0.3")),
			},
			want: []string{"10.0.0.3:8080"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newService()
			}
			s, problems := BuildReport(svc, tt.slices)
			if s == nil {
				t.Fatalf("BuildReport skipped the Service: %+v", problems)
			}
			var got []string
			for _, e := range viewFor(t, s, testNode("node-a", "")).GetClusterEndpoints() {
				for _, ep := range e.GetEndpoints() {
					got = append(got, netip.AddrPortFrom(netip.MustParseAddr(ep.GetIp()), uint16(ep.GetPort())).String())
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("endpoints = %v, want %v", got, tt.want)
			}
			if len(problems) != len(tt.wantP) {
				t.Fatalf("problems = %+v, want %d: %+v", problems, len(tt.wantP), tt.wantP)
			}
			for i, p := range problems {
				w := tt.wantP[i]
				if p.Kind != w.Kind || p.Namespace != w.Namespace || p.Name != w.Name || p.Reason != w.Reason || !strings.Contains(p.Message, w.Message) {
					t.Errorf("problem %d = %+v, want %+v", i, p, w)
				}
			}
			// Build agrees with BuildReport on what it keeps.
			if b := mustBuild(t, svc, tt.slices...); !b.Equal(s) {
				t.Errorf("Build and BuildReport built different Services")
			}
		})
	}
}

// TestBuildFrontend checks everything in a view but the endpoint choice, on
// Services that every node sees alike.
func TestBuildFrontend(t *testing.T) {
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   *pb.Service
	}{
		{
			name:   "ClusterIP with ready endpoints, sorted",
			svc:    newService(),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.3"), ep("10.0.0.1"), ep("10.0.0.2"))},
			want: wantFrontend(func(s *pb.Service) {
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http",
					ready("10.0.0.1", 8080), ready("10.0.0.2", 8080), ready("10.0.0.3", 8080))}
			}),
		},
		{
			name:   "empty type means ClusterIP",
			svc:    newService(withType("")),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.1"))},
			want: wantFrontend(func(s *pb.Service) {
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
		},
		{
			name: "dual-stack, IPv4 primary",
			svc:  newService(withClusterIPs("10.96.0.10", "fd00::10")),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-v6", discoveryv1.AddressTypeIPv6, httpPort(), ep("fd00:1::2"), ep("fd00:1::1")),
				httpSlice("web-v4", ep("10.0.0.1")),
			},
			want: wantFrontend(func(s *pb.Service) {
				s.ClusterIps = []string{"10.96.0.10", "fd00::10"}
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http",
					ready("10.0.0.1", 8080), ready("fd00:1::1", 8080), ready("fd00:1::2", 8080))}
			}),
		},
		{
			name: "dual-stack, IPv6 primary, addresses canonicalised",
			svc:  newService(withClusterIPs("FD00:0::10", "10.96.0.10")),
			want: wantFrontend(func(s *pb.Service) { s.ClusterIps = []string{"fd00::10", "10.96.0.10"} }),
		},
		{
			name: "clusterIP alone when clusterIPs is unset",
			svc:  newService(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }),
			want: wantFrontend(nil),
		},
		{
			name: "NodePort with TCP, UDP and SCTP",
			svc: nodePortService(withPorts(
				svcPort("dns-tcp", corev1.ProtocolTCP, 53, 30053),
				svcPort("dns", corev1.ProtocolUDP, 53, 30054),
				svcPort("sig", corev1.ProtocolSCTP, 9000, 30090),
			)),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-1", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{
					slicePort(ptr("sig"), ptr(corev1.ProtocolSCTP), 9999),
					slicePort(ptr("dns"), ptr(corev1.ProtocolUDP), 5353),
					slicePort(ptr("dns-tcp"), ptr(corev1.ProtocolTCP), 5354),
				},
				ep("10.0.0.2"), ep("10.0.0.1"))},
			want: wantFrontend(func(s *pb.Service) {
				s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
				s.Ports = []*pb.ServicePort{
					{Name: "dns-tcp", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 53, NodePort: 30053, HasEndpoints: true},
					{Name: "dns", Protocol: pb.Protocol_PROTOCOL_UDP, Port: 53, NodePort: 30054, HasEndpoints: true},
					{Name: "sig", Protocol: pb.Protocol_PROTOCOL_SCTP, Port: 9000, NodePort: 30090, HasEndpoints: true},
				}
				s.ClusterEndpoints = []*pb.PortEndpoints{
					wantPort("dns-tcp", ready("10.0.0.1", 5354), ready("10.0.0.2", 5354)),
					wantPort("dns", ready("10.0.0.1", 5353), ready("10.0.0.2", 5353)),
					wantPort("sig", ready("10.0.0.1", 9999), ready("10.0.0.2", 9999)),
				}
			}),
		},
		{
			name: "empty protocol means TCP",
			svc:  newService(withPorts(svcPort("http", "", 80, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-1", discoveryv1.AddressTypeIPv4,
				[]discoveryv1.EndpointPort{slicePort(ptr("http"), nil, 8080)}, ep("10.0.0.1"))},
			want: wantFrontend(func(s *pb.Service) {
				s.Ports[0].HasEndpoints = true
				s.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))}
			}),
		},
		{
			name: "ClientIP affinity, default timeout",
			svc:  newService(withAffinity(nil)),
			want: wantFrontend(func(s *pb.Service) { s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 10800} }),
		},
		{
			name: "ClientIP affinity, config without clientIP",
			svc: newService(withAffinity(nil), func(s *corev1.Service) {
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
			}),
			want: wantFrontend(func(s *pb.Service) { s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 10800} }),
		},
		{
			name: "ClientIP affinity, explicit timeout",
			svc:  newService(withAffinity(ptr(int32(60)))),
			want: wantFrontend(func(s *pb.Service) { s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 60} }),
		},
		{
			name: "affinity None ignores its config",
			svc: newService(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(0))}}
			}),
			want: wantFrontend(nil),
		},
		{
			name: "eTP Local ignored for ClusterIP without externalIPs",
			svc:  newService(withExternalLocal()),
			want: wantFrontend(nil),
		},
		{
			name: "eTP Local kept for ClusterIP with externalIPs",
			svc:  newService(withExternalLocal(), withExternalIPs("192.0.2.1", "2001:DB8::1")),
			want: wantFrontend(func(s *pb.Service) {
				s.ExternalIps = []string{"192.0.2.1", "2001:db8::1"}
				s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
			}),
		},
		{
			name: "eTP Local on NodePort, no health check port",
			svc: nodePortService(withExternalLocal(), func(s *corev1.Service) {
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: wantFrontend(func(s *pb.Service) {
				s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
				s.Ports[0].NodePort = 30080
				s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
			}),
		},
		{
			name: "eTP Cluster on LoadBalancer ignores the health check port",
			svc: newService(withType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: wantFrontend(func(s *pb.Service) { s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER }),
		},
		{
			name: "LoadBalancer: VIP ingress kept, Proxy and hostname ingress dropped",
			svc: newService(
				withType(corev1.ServiceTypeLoadBalancer),
				withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080)),
				withExternalLocal(),
				withIngress(
					corev1.LoadBalancerIngress{IP: "198.51.100.1"},
					corev1.LoadBalancerIngress{IP: "198.51.100.2", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
					corev1.LoadBalancerIngress{IP: "198.51.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
					corev1.LoadBalancerIngress{Hostname: "lb.example.com"},
					corev1.LoadBalancerIngress{IP: "2001:db8::5"},
				),
				func(s *corev1.Service) {
					s.Spec.HealthCheckNodePort = 32000
					s.Spec.LoadBalancerSourceRanges = []string{" 192.168.1.0/24 ", "10.1.2.3/8", "2001:db8:1::1/48"}
				},
			),
			want: wantFrontend(func(s *pb.Service) {
				s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
				s.Ports[0].NodePort = 30080
				s.LoadBalancerIps = []string{"198.51.100.1", "198.51.100.2", "2001:db8::5"}
				s.LoadBalancerSourceRanges = []string{"192.168.1.0/24", "10.0.0.0/8", "2001:db8:1::/48"}
				s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
				s.HealthCheckNodePort = 32000
			}),
		},
		{
			name:   "iTP Local on ClusterIP: no cluster endpoints",
			svc:    newService(withInternalLocal()),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-1", ep("10.0.0.1"))},
			want: wantFrontend(func(s *pb.Service) {
				s.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
				s.Ports[0].HasEndpoints = true
			}),
		},
		{
			name: "explicit iTP Cluster",
			svc: newService(func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyCluster)
			}),
			want: wantFrontend(nil),
		},
		{
			name:   "no slices: has_endpoints false",
			svc:    newService(),
			slices: nil,
			want:   wantFrontend(nil),
		},
		{
			name:   "empty slice: has_endpoints false",
			svc:    newService(),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-1")},
			want:   wantFrontend(nil),
		},
		{
			name: "IPv4-mapped addresses unmapped",
			svc:  newService(withExternalIPs("::ffff:192.0.2.1")),
			want: wantFrontend(func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.1"} }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustBuild(t, tt.svc, tt.slices...)
			if !s.Uniform() {
				t.Errorf("Uniform() = false, want true")
			}
			checkProto(t, "view", viewFor(t, s, testNode("node-a", "zone-a")), tt.want)
		})
	}
}

// TestBuildEndpoints checks how endpoints are merged across slices and
// matched to service ports, on Services that every node sees alike.
func TestBuildEndpoints(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	twoPorts := withPorts(svcPort("http", corev1.ProtocolTCP, 80, 0), svcPort("https", corev1.ProtocolTCP, 443, 0))
	tests := []struct {
		name    string
		svc     *corev1.Service // newService() when nil
		slices  []*discoveryv1.EndpointSlice
		want    []*pb.PortEndpoints // cluster_endpoints
		wantHas []bool              // has_endpoints per port; false for a single port when nil
	}{
		{
			name: "multiple slices merged and sorted",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-b", ep("10.0.0.3"), ep("10.0.0.1")),
				httpSlice("web-a", ep("10.0.0.2")),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080), ready("10.0.0.2", 8080), ready("10.0.0.3", 8080))},
			wantHas: []bool{true},
		},
		{
			name:    "sorted numerically, not as text",
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.10"), ep("10.0.0.9"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.9", 8080), ready("10.0.0.10", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "duplicate: later ready copy wins over terminating",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.0.1", terminating(true))),
				httpSlice("web-b", ep("10.0.0.1")),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "duplicate: later terminating copy loses to ready",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.0.1")),
				httpSlice("web-b", ep("10.0.0.1", terminating(true))),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "duplicate: slices are ordered by name, not input order",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-b", ep("10.0.0.1")),
				httpSlice("web-a", ep("10.0.0.1", terminating(true))),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "duplicate: both terminating, one copy",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.0.1", terminating(true))),
				httpSlice("web-b", ep("10.0.0.1", terminating(true))),
			},
			want:    []*pb.PortEndpoints{wantPort("http", servingTerminating("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "duplicate within one slice",
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.0.1"), ep("10.0.0.1")),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "same IP with different target ports kept apart",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 9090)}, ep("10.0.0.1")),
				httpSlice("web-b", ep("10.0.0.1")),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080), ready("10.0.0.1", 9090))},
			wantHas: []bool{true},
		},
		{
			name: "FQDN slice ignored",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", discoveryv1.AddressTypeFQDN, httpPort(), ep("backend.example.com")),
			},
		},
		{
			name: "FQDN slice ignored next to an IPv4 slice",
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", discoveryv1.AddressTypeFQDN, httpPort(), ep("backend.example.com"), ep("10.0.0.2")),
				httpSlice("web-b", ep("10.0.0.1")),
			},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name:    "IPv6 address in an IPv4 slice ignored",
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("fd00::1"), ep("10.0.0.1"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name:    "IPv4 address in an IPv6 slice ignored",
			svc:     newService(withClusterIPs("fd00:96::10")),
			slices:  []*discoveryv1.EndpointSlice{newSlice("web-a", v6, httpPort(), ep("10.0.0.1"), ep("fd00::1"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("fd00::1", 8080))},
			wantHas: []bool{true},
		},
		{
			name:   "IPv6 slice ignored by an IPv4-only service",
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v6, httpPort(), ep("fd00::1"))},
		},
		{
			name:    "IPv4-mapped address in an IPv4 slice unmapped",
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("::ffff:10.0.0.7"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.7", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "garbage and missing addresses ignored",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("not-an-ip"), ep("10.0.0.256"), ep(""),
				discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
				ep("10.0.0.1"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "only the first address of an endpoint counts",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", func() discoveryv1.Endpoint {
				e := ep("10.0.0.1")
				e.Addresses = append(e.Addresses, "10.0.0.2")
				return e
			}())},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "unnamed port matches an empty slice port name",
			svc:  newService(withPorts(svcPort("", corev1.ProtocolTCP, 80, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr(""), ptr(corev1.ProtocolTCP), 8080)}, ep("10.0.0.1"))},
			want:    []*pb.PortEndpoints{wantPort("", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "slice port without a name ignored",
			svc:  newService(withPorts(svcPort("", corev1.ProtocolTCP, 80, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(nil, ptr(corev1.ProtocolTCP), 8080)}, ep("10.0.0.1"))},
		},
		{
			name: "mismatched port name",
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr("metrics"), ptr(corev1.ProtocolTCP), 9090)}, ep("10.0.0.1"))},
		},
		{
			name: "protocol mismatch",
			svc:  newService(withPorts(svcPort("dns", corev1.ProtocolUDP, 53, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr("dns"), ptr(corev1.ProtocolTCP), 5353)}, ep("10.0.0.1"))},
		},
		{
			// One slice cannot name a port twice (TestBuildReportSlices),
			// but two slices can.
			name: "same name, protocol picks the slice port",
			svc:  newService(withPorts(svcPort("dns", corev1.ProtocolUDP, 53, 0))),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{slicePort(ptr("dns"), ptr(corev1.ProtocolTCP), 5353)}, ep("10.0.0.1")),
				newSlice("web-b", v4, []discoveryv1.EndpointPort{slicePort(ptr("dns"), ptr(corev1.ProtocolUDP), 5354)}, ep("10.0.0.2")),
			},
			want:    []*pb.PortEndpoints{wantPort("dns", ready("10.0.0.2", 5354))},
			wantHas: []bool{true},
		},
		{
			name: "slice port without protocol means TCP",
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr("http"), nil, 8080)}, ep("10.0.0.1"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "slice port without a number ignored",
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP)}}, ep("10.0.0.1"))},
		},
		{
			name: "slice port 0 ignored",
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 0)}, ep("10.0.0.1"))},
		},
		{
			name: "each service port uses its own target port",
			svc:  newService(twoPorts),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{
					slicePort(ptr("https"), ptr(corev1.ProtocolTCP), 8443),
					slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080),
				}, ep("10.0.0.1"))},
			want: []*pb.PortEndpoints{
				wantPort("http", ready("10.0.0.1", 8080)),
				wantPort("https", ready("10.0.0.1", 8443)),
			},
			wantHas: []bool{true, true},
		},
		{
			name:    "a port without endpoints gets no list",
			svc:     newService(twoPorts),
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true, false},
		},
		{
			name:    "not-ready endpoints left out",
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"), ep("10.0.0.2", notReady()))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
		{
			name:   "only not-ready endpoints: has_endpoints false",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.2", notReady()))},
		},
		{
			name:    "unset conditions mean ready and serving",
			slices:  []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1", noConditions()))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.1", 8080))},
			wantHas: []bool{true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newService()
			}
			got := viewFor(t, mustBuild(t, svc, tt.slices...), testNode("node-a", "zone-a"))
			checkProto(t, "cluster_endpoints", &pb.Service{ClusterEndpoints: got.ClusterEndpoints}, &pb.Service{ClusterEndpoints: tt.want})
			wantHas := tt.wantHas
			if wantHas == nil {
				wantHas = []bool{false}
			}
			if len(got.Ports) != len(wantHas) {
				t.Fatalf("got %d ports, want %d", len(got.Ports), len(wantHas))
			}
			for i, p := range got.Ports {
				if p.HasEndpoints != wantHas[i] {
					t.Errorf("port %q: has_endpoints = %v, want %v", p.Name, p.HasEndpoints, wantHas[i])
				}
			}
		})
	}
}

func TestBuildDoesNotReorderInput(t *testing.T) {
	in := []*discoveryv1.EndpointSlice{httpSlice("web-b", ep("10.0.0.2")), httpSlice("web-a", ep("10.0.0.1"))}
	mustBuild(t, newService(), in...)
	if in[0].Name != "web-b" || in[1].Name != "web-a" {
		t.Errorf("Build reordered its input slices: %s, %s", in[0].Name, in[1].Name)
	}
}

func TestTriggerTime(t *testing.T) {
	tests := []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   string // RFC 3339; "" for the zero time
	}{
		{name: "no slices"},
		{
			name:   "no annotation",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a")},
		},
		{
			name:   "one slice",
			slices: []*discoveryv1.EndpointSlice{withTrigger(httpSlice("web-a"), "2024-05-01T10:00:00Z")},
			want:   "2024-05-01T10:00:00Z",
		},
		{
			name: "newest across slices",
			slices: []*discoveryv1.EndpointSlice{
				withTrigger(httpSlice("web-a"), "2024-05-01T10:00:00Z"),
				withTrigger(httpSlice("web-b"), "2024-05-01T10:00:02Z"),
				withTrigger(httpSlice("web-c"), "2024-05-01T10:00:01Z"),
				httpSlice("web-d"),
			},
			want: "2024-05-01T10:00:02Z",
		},
		{
			name: "compared as instants, with nanoseconds and offsets",
			slices: []*discoveryv1.EndpointSlice{
				withTrigger(httpSlice("web-a"), "2024-05-01T11:00:00.000000001+02:00"),
				withTrigger(httpSlice("web-b"), "2024-05-01T09:30:00.5Z"),
			},
			want: "2024-05-01T09:30:00.5Z",
		},
		{
			name: "garbage ignored",
			slices: []*discoveryv1.EndpointSlice{
				withTrigger(httpSlice("web-a"), "2024-05-01T10:00:00Z"),
				withTrigger(httpSlice("web-b"), "tomorrow"),
				withTrigger(httpSlice("web-c"), "2099-05-01 10:00:00"),
			},
			want: "2024-05-01T10:00:00Z",
		},
		{
			name:   "only garbage",
			slices: []*discoveryv1.EndpointSlice{withTrigger(httpSlice("web-a"), "")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want time.Time
			if tt.want != "" {
				var err error
				if want, err = time.Parse(time.RFC3339Nano, tt.want); err != nil {
					t.Fatal(err)
				}
			}
			got := mustBuild(t, newService(), tt.slices...).TriggerTime
			if !got.Equal(want) {
				t.Errorf("TriggerTime = %v, want %v", got, want)
			}
		})
	}
}

func TestEqual(t *testing.T) {
	base := func() []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{httpSlice("web-a",
			ep("10.0.0.1", onNode("node-a"), forZones("zone-a")),
			ep("10.0.0.2", onNode("node-b"), forZones("zone-b")),
		)}
	}
	edit := func(f func(*discoveryv1.EndpointSlice)) []*discoveryv1.EndpointSlice {
		s := base()
		f(s[0])
		return s
	}
	tests := []struct {
		name       string
		svcA, svcB *corev1.Service
		a, b       []*discoveryv1.EndpointSlice
		want       bool
	}{
		{
			name: "rebuilt from identical inputs",
			svcA: newService(), a: base(),
			svcB: newService(), b: base(),
			want: true,
		},
		{
			name: "slices in another order",
			svcA: newService(), a: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1")), httpSlice("web-b", ep("10.0.0.2"))},
			svcB: newService(), b: []*discoveryv1.EndpointSlice{httpSlice("web-b", ep("10.0.0.2")), httpSlice("web-a", ep("10.0.0.1"))},
			want: true,
		},
		{
			name: "endpoints moved between slices",
			svcA: newService(), a: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"), ep("10.0.0.2"))},
			svcB: newService(), b: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.2")), httpSlice("web-b", ep("10.0.0.1"))},
			want: true,
		},
		{
			// The trigger time only feeds a metric.
			name: "only the trigger time changed",
			svcA: newService(), a: []*discoveryv1.EndpointSlice{withTrigger(base()[0], "2024-05-01T10:00:00Z")},
			svcB: newService(), b: []*discoveryv1.EndpointSlice{withTrigger(base()[0], "2024-05-01T10:00:05Z")},
			want: true,
		},
		{
			name: "endpoint became terminating",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { terminating(true)(&s.Endpoints[1]) }),
		},
		{
			name: "endpoint stopped serving",
			svcA: newService(), a: edit(func(s *discoveryv1.EndpointSlice) { terminating(true)(&s.Endpoints[1]) }),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { terminating(false)(&s.Endpoints[1]) }),
		},
		{
			name: "endpoint not ready",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { notReady()(&s.Endpoints[0]) }),
		},
		{
			name: "endpoint added",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { s.Endpoints = append(s.Endpoints, ep("10.0.0.3")) }),
		},
		{
			name: "target port changed",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = ptr(int32(8081)) }),
		},
		{
			name: "zone hint changed",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].Hints.ForZones[0].Name = "zone-c" }),
		},
		{
			name: "node hint added",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { forNodes("node-b")(&s.Endpoints[1]) }),
		},
		{
			// Matters under a Local policy.
			name: "node name changed",
			svcA: newService(), a: base(),
			svcB: newService(), b: edit(func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].NodeName = ptr("node-c") }),
		},
		{
			name: "frontend changed",
			svcA: newService(), a: base(),
			svcB: newService(withAffinity(nil)), b: base(),
		},
		{
			name: "traffic policy changed",
			svcA: newService(), a: base(),
			svcB: newService(withInternalLocal()), b: base(),
		},
		{
			name: "another Service",
			svcA: newService(), a: base(),
			svcB: newService(func(s *corev1.Service) { s.Name = "web2" }), b: base(),
		},
		{
			// Endpoint records are concatenated without lengths, so a node
			// name ending in a digit can absorb the first digit of the next
			// endpoint's address: "...worker-1" + "192.168.0.5..." and
			// "...worker-11" + "92.168.0.5..." hash the same bytes.
			name: "different views with colliding input encodings",
			svcA: newService(withInternalLocal()),
			a: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.1", onNode("worker-1")), ep("192.168.0.5", onNode("worker-2")))},
			svcB: newService(withInternalLocal()),
			b: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.1", onNode("worker-11")), ep("92.168.0.5", onNode("worker-2")))},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := mustBuild(t, tt.svcA, tt.a...), mustBuild(t, tt.svcB, tt.b...)
			if got := a.Equal(b); got != tt.want {
				t.Errorf("a.Equal(b) = %v, want %v", got, tt.want)
			}
			if got := b.Equal(a); got != tt.want {
				t.Errorf("b.Equal(a) = %v, want %v", got, tt.want)
			}
			if tt.want {
				// Equal promises that every node sees the same view.
				for _, n := range []*Node{testNode("node-a", "zone-a"), testNode("node-b", "zone-b"), testNode("node-c", "")} {
					if ea, eb := a.EntryFor(n), b.EntryFor(n); ea.Hash != eb.Hash {
						t.Errorf("Equal builds give %s different entry hashes %x and %x", n.Name, ea.Hash, eb.Hash)
					}
				}
			}
		})
	}
}

func TestEqualNil(t *testing.T) {
	s := mustBuild(t, newService())
	var nilSvc *Service
	tests := []struct {
		name string
		a, b *Service
		want bool
	}{
		{"same pointer", s, s, true},
		{"nil and nil", nilSvc, nilSvc, true},
		{"value and nil", s, nilSvc, false},
		{"nil and value", nilSvc, s, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Equal(tt.b); got != tt.want {
				t.Errorf("Equal = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestBuildDeterministic checks that builds of the same input on any
// replica encode to the same bytes and hashes.
func TestBuildDeterministic(t *testing.T) {
	mk := func(order []int) *Service {
		all := []*discoveryv1.EndpointSlice{
			httpSlice("web-a", ep("10.0.0.3", onNode("node-a"), forZones("zone-a")), ep("10.0.0.1", onNode("node-b"), forZones("zone-b"))),
			httpSlice("web-b", ep("10.0.0.2", onNode("node-a"), forZones("zone-a", "zone-b"))),
			httpSlice("web-c", ep("10.0.0.4", onNode("node-c"), forZones("zone-c"))),
		}
		var in []*discoveryv1.EndpointSlice
		for _, i := range order {
			in = append(in, all[i])
		}
		return mustBuild(t, nodePortService(withExternalLocal()), in...)
	}
	a, b := mk([]int{0, 1, 2}), mk([]int{2, 0, 1})
	for _, n := range []*Node{testNode("node-a", "zone-a"), testNode("node-b", "zone-b"), testNode("node-c", "zone-c"), testNode("node-d", "")} {
		ea, eb := a.EntryFor(n), b.EntryFor(n)
		if ea.Hash != eb.Hash || !slices.Equal(ea.Shared.Bytes, eb.Shared.Bytes) || !slices.Equal(ea.Local.Bytes, eb.Local.Bytes) {
			t.Errorf("%s: builds of the same input differ: hashes %x and %x", n.Name, ea.Hash, eb.Hash)
		}
	}
}
