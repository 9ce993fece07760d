package compute

import (
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// inputHash lists what it hashes by hand. A field it misses makes Equal
// report a changed Service as unchanged, so the change is never published.
// The tables below hold every field of the structs that views are computed
// from, either with a change that inputHash must notice or with the reason
// it need not; the tests fail on a field in neither.

// hashedInputs changes, in a build of inputHashService, one field that
// inputHash covers.
var hashedInputs = map[reflect.Type]map[string]func(*Service){
	reflect.TypeFor[Service](): {
		"base": func(s *Service) {
			b := proto.CloneOf(s.base)
			b.HealthCheckNodePort++
			s.base = b
		},
		"ports": func(s *Service) { s.ports = append(slices.Clip(s.ports), servicePort{name: "extra"}) },
	},
	reflect.TypeFor[servicePort](): {
		"name":        func(s *Service) { s.ports[0].name += "x" },
		"usesCluster": func(s *Service) { s.ports[0].usesCluster = !s.ports[0].usesCluster },
		"usesLocal":   func(s *Service) { s.ports[0].usesLocal = !s.ports[0].usesLocal },
		"endpoints": func(s *Service) {
			p := &s.ports[0]
			extra := p.endpoints[0]
			extra.addr = extra.addr.Next()
			p.endpoints = append(slices.Clip(p.endpoints), extra)
		},
	},
	reflect.TypeFor[endpoint](): {
		"addr":        func(s *Service) { e := testEndpoint(s); e.addr = e.addr.Next() },
		"port":        func(s *Service) { testEndpoint(s).port++ },
		"ready":       func(s *Service) { e := testEndpoint(s); e.ready = !e.ready },
		"serving":     func(s *Service) { e := testEndpoint(s); e.serving = !e.serving },
		"terminating": func(s *Service) { e := testEndpoint(s); e.terminating = !e.terminating },
		"nodeName":    func(s *Service) { testEndpoint(s).nodeName += "x" },
		"zoneHints":   func(s *Service) { e := testEndpoint(s); e.zoneHints = append(slices.Clip(e.zoneHints), "zone-b") },
		"nodeHints":   func(s *Service) { e := testEndpoint(s); e.nodeHints = append(slices.Clip(e.nodeHints), "node-b") },
	},
}

// unhashedInputs says why inputHash leaves a field out.
var unhashedInputs = map[reflect.Type]map[string]string{
	reflect.TypeFor[Service](): {
		"Key":         "Equal compares it itself",
		"TriggerTime": "it feeds a latency metric only: no entry hash or version depends on it, and a change of it alone is not worth a publish (TestEqual)",
		"others":      "derived from base and ports by index",
		"topo":        "derived from base and ports by index, and memos of views derived from them",
	},
	reflect.TypeFor[servicePort](): {
		"families":             "derived from endpoints by classify",
		"hasEndpointsAnywhere": "derived from endpoints by classify",
	},
}

// protoSources names, for each field of the messages a view is built of
// besides base, the input field it is computed from. Service fields not
// named here are copied from base.
var protoSources = map[protoreflect.FullName]inputField{
	"proxyplane.v1.Service.cluster_endpoints": {reflect.TypeFor[servicePort](), "endpoints"},
	"proxyplane.v1.Service.local_endpoints":   {reflect.TypeFor[servicePort](), "endpoints"},
	"proxyplane.v1.PortEndpoints.port_name":   {reflect.TypeFor[servicePort](), "name"},
	"proxyplane.v1.PortEndpoints.endpoints":   {reflect.TypeFor[servicePort](), "endpoints"},
	"proxyplane.v1.Endpoint.ip":               {reflect.TypeFor[endpoint](), "addr"},
	"proxyplane.v1.Endpoint.port":             {reflect.TypeFor[endpoint](), "port"},
	"proxyplane.v1.Endpoint.ready":            {reflect.TypeFor[endpoint](), "ready"},
	"proxyplane.v1.Endpoint.serving":          {reflect.TypeFor[endpoint](), "serving"},
	"proxyplane.v1.Endpoint.terminating":      {reflect.TypeFor[endpoint](), "terminating"},
}

// inputField is one field of an input struct.
type inputField struct {
	typ   reflect.Type
	field string
}

// inputHashService builds a Service whose one port has one endpoint with
// every field set.
func inputHashService(t *testing.T) *Service {
	t.Helper()
	s := mustBuild(t, newService(), httpSlice("web-a",
		ep("10.0.0.1", onNode("node-a"), forZones("zone-a"), forNodes("node-a"))))
	if len(s.ports) != 1 || len(s.ports[0].endpoints) != 1 {
		t.Fatalf("want one port with one endpoint, got %+v", s.ports)
	}
	return s
}

// testEndpoint is the endpoint of inputHashService.
func testEndpoint(s *Service) *endpoint { return &s.ports[0].endpoints[0] }

// TestInputHashCoversEveryField walks the input structs from Service
// through every hashed field and checks that each field is either hashed,
// and inputHash notices a change of it, or left out for a stated reason.
func TestInputHashCoversEveryField(t *testing.T) {
	seen := map[reflect.Type]bool{}
	queue := []reflect.Type{reflect.TypeFor[Service]()}
	for len(queue) > 0 {
		typ := queue[0]
		queue = queue[1:]
		if seen[typ] {
			continue
		}
		seen[typ] = true
		hashed, unhashed := hashedInputs[typ], unhashedInputs[typ]
		for f := range typ.Fields() {
			mutate, isHashed := hashed[f.Name]
			_, isUnhashed := unhashed[f.Name]
			switch {
			case isHashed && isUnhashed:
				t.Errorf("%s.%s is both hashed and not", typ.Name(), f.Name)
			case !isHashed && !isUnhashed:
				t.Errorf("%s.%s is an input of the views that inputHash does not cover: hash it and add it to hashedInputs, or say in unhashedInputs why it need not be", typ.Name(), f.Name)
			case isHashed:
				s := inputHashService(t)
				before := s.inputHash()
				mutate(s)
				if s.inputHash() == before {
					t.Errorf("changing %s.%s leaves inputHash unchanged", typ.Name(), f.Name)
				}
				if inner := structOf(f.Type); inner != nil {
					queue = append(queue, inner)
				}
			}
		}
	}
	for _, table := range []map[reflect.Type][]string{keysOf(hashedInputs), keysOf(unhashedInputs)} {
		for typ, names := range table {
			if !seen[typ] {
				t.Errorf("%s is listed but no hashed field holds it", typ.Name())
			}
			for _, n := range names {
				if _, ok := typ.FieldByName(n); !ok {
					t.Errorf("%s has no field %s", typ.Name(), n)
				}
			}
		}
	}
}

// TestInputHashCoversMessages walks the descriptors of the messages that
// views are built of and checks that each field comes from a hashed input,
// so that a field added to the proto, and to a view, is hashed too.
func TestInputHashCoversMessages(t *testing.T) {
	for _, m := range []protoreflect.MessageDescriptor{
		(&pb.Service{}).ProtoReflect().Descriptor(),
		(&pb.PortEndpoints{}).ProtoReflect().Descriptor(),
		(&pb.Endpoint{}).ProtoReflect().Descriptor(),
	} {
		for i := range m.Fields().Len() {
			fd := m.Fields().Get(i)
			src, ok := protoSources[fd.FullName()]
			if !ok {
				if m.FullName() != "proxyplane.v1.Service" {
					t.Errorf("%s: no input named in protoSources", fd.FullName())
				}
				continue
			}
			if hashedInputs[src.typ][src.field] == nil {
				t.Errorf("%s comes from %s.%s, which inputHash does not cover", fd.FullName(), src.typ.Name(), src.field)
			}
		}
	}
	for name := range protoSources {
		parent := name.Parent()
		found := false
		for _, m := range []proto.Message{&pb.Service{}, &pb.PortEndpoints{}, &pb.Endpoint{}} {
			d := m.ProtoReflect().Descriptor()
			found = found || (d.FullName() == parent && d.Fields().ByName(name.Name()) != nil)
		}
		if !found {
			t.Errorf("protoSources names %s, which does not exist", name)
		}
	}
}

// TestEndpointProtoSources checks that each Endpoint field changes with the
// input protoSources says it comes from.
func TestEndpointProtoSources(t *testing.T) {
	fields := (&pb.Endpoint{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		src := protoSources[fd.FullName()]
		mutate := hashedInputs[src.typ][src.field]
		if mutate == nil {
			continue // TestInputHashCoversMessages reports it
		}
		s := inputHashService(t)
		before := testEndpoint(s).proto().ProtoReflect().Get(fd)
		mutate(s)
		if after := testEndpoint(s).proto().ProtoReflect().Get(fd); after.Equal(before) {
			t.Errorf("changing endpoint.%s leaves %s at %v", src.field, fd.FullName(), after)
		}
	}
}

// nodeInput is what a Node is built from: BuildNode's arguments, the
// cluster's service CIDRs and the control plane's addresses.
type nodeInput struct {
	name  string
	obj   *corev1.Node
	cidrs *ServiceCIDRs
	cp    *ControlPlaneAddresses
}

func (in *nodeInput) build() *Node {
	return BuildNode(in.name, in.obj).WithServiceCIDRs(in.cidrs).WithControlPlaneAddresses(in.cp)
}

// nodeInfoSources changes, for each NodeInfo field but the hash, the input
// it is built from. A field added to NodeInfo and not listed fails
// TestNodeHashCoversNodeInfo: the node hash, and so the table version,
// must change with it, or agents never receive the change.
var nodeInfoSources = map[protoreflect.Name]func(*nodeInput){
	"name":          func(in *nodeInput) { in.name += "x"; in.obj.Name = in.name },
	"zone":          func(in *nodeInput) { in.obj.Labels[corev1.LabelTopologyZone] += "x" },
	"pod_cidrs":     func(in *nodeInput) { in.obj.Spec.PodCIDRs = []string{"10.244.9.0/24"} },
	"to_be_deleted": func(in *nodeInput) { in.obj.DeletionTimestamp = &metav1.Time{} },
	"unregistered":  func(in *nodeInput) { in.obj = nil },
	"node_ips": func(in *nodeInput) {
		in.obj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.2"}}
	},
	"service_cidrs": func(in *nodeInput) {
		in.cidrs = BuildServiceCIDRs([]*networkingv1.ServiceCIDR{{Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/16"}}}})
	},
	"control_plane_addresses": func(in *nodeInput) {
		in.cp = BuildControlPlaneAddresses(controlPlaneService(), []*discoveryv1.EndpointSlice{
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("192.168.0.10", true)),
		}, ControlPlanePortName)
	},
}

// TestNodeHashCoversNodeInfo checks that every NodeInfo field changes, in
// the encoding and in the hash, when its input does.
func TestNodeHashCoversNodeInfo(t *testing.T) {
	fresh := func() *nodeInput {
		return &nodeInput{
			name: "node-a", obj: k8sNode("node-a", "zone-a", "10.244.1.0/24"),
			cidrs: BuildServiceCIDRs([]*networkingv1.ServiceCIDR{{Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}),
		}
	}
	decode := func(n *Node) *pb.NodeInfo {
		var info pb.NodeInfo
		if err := proto.Unmarshal(n.Bytes, &info); err != nil {
			t.Fatalf("decoding NodeInfo: %v", err)
		}
		return &info
	}
	fields := (&pb.NodeInfo{}).ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() == "hash" {
			continue
		}
		mutate, ok := nodeInfoSources[fd.Name()]
		if !ok {
			t.Errorf("%s: no input named in nodeInfoSources", fd.FullName())
			continue
		}
		in := fresh()
		before := in.build()
		mutate(in)
		after := in.build()
		if after.Hash == before.Hash {
			t.Errorf("changing the input of %s leaves the node hash unchanged", fd.FullName())
		}
		b, a := decode(before).ProtoReflect().Get(fd), decode(after).ProtoReflect().Get(fd)
		if a.Equal(b) {
			t.Errorf("changing the input of %s leaves it at %v", fd.FullName(), a)
		}
	}
	for name := range nodeInfoSources {
		if fields.ByName(name) == nil {
			t.Errorf("nodeInfoSources names %s, which NodeInfo lacks", name)
		}
	}
}

// structOf is the struct of package compute that t holds, if any.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[Service]().PkgPath() {
		return t
	}
	return nil
}

func keysOf[V any](m map[reflect.Type]map[string]V) map[reflect.Type][]string {
	out := map[reflect.Type][]string{}
	for typ, fields := range m {
		for n := range fields {
			out[typ] = append(out[typ], n)
		}
	}
	return out
}
