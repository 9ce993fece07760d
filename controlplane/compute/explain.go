package compute

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Explain returns n's view of s, the Service message that EntryFor
// encodes for n, with the decisions behind each of its endpoint sets. It
// runs the code that builds the table (sharedView and localEndpoints, for
// n's class) with a trace that records what that code chose and which
// rule chose it: the endpoints explained are those of the table because
// they are computed once, by the same functions. It never touches the
// memo of encoded parts, so it costs nothing to the table path.
func (s *Service) Explain(n *Node) (*pb.Service, *pb.ServiceExplanation) {
	c, _ := s.classOf(n)
	tr := newTrace(s, n)
	view := s.sharedView(c, tr)
	// A node that hosts no endpoint a Local policy uses has the empty
	// local part, which is what localEndpoints finds for it: called for
	// every node so that the trace says why.
	view.LocalEndpoints = s.localEndpoints(n.Name, tr)
	return view, tr.out
}

// trace records Explain's decisions. A nil *trace records nothing, and
// the table passes nil: every method is a no-op on nil.
type trace struct {
	node *Node
	out  *pb.ServiceExplanation
}

// newTrace starts the explanation of s for n: the frontends of every
// port and family, and each endpoint set as empty, with why, until the
// computation records what it chose.
func newTrace(s *Service, n *Node) *trace {
	b := s.base
	out := &pb.ServiceExplanation{
		Type:                     b.GetType(),
		ExternalTrafficPolicy:    b.GetExternalTrafficPolicy(),
		InternalTrafficPolicy:    b.GetInternalTrafficPolicy(),
		HealthCheckNodePort:      b.GetHealthCheckNodePort(),
		SessionAffinity:          b.GetSessionAffinity(),
		LoadBalancerSourceRanges: b.GetLoadBalancerSourceRanges(),
	}
	for i := range s.ports {
		p, bp := &s.ports[i], b.GetPorts()[i]
		pe := &pb.PortExplanation{
			Name: p.name, Protocol: bp.GetProtocol(), Port: bp.GetPort(), NodePort: bp.GetNodePort(),
			UsesClusterEndpoints: p.usesCluster, UsesLocalEndpoints: p.usesLocal,
			Policy: portPolicy(b, bp),
		}
		for _, ip := range b.GetClusterIps() {
			v4 := netip.MustParseAddr(ip).Is4()
			fe := &pb.FamilyExplanation{
				Family: familyName(v4), ClusterIp: ip,
				LoadBalancerIps: ofFamily(b.GetLoadBalancerIps(), v4),
				ExternalIps:     ofFamily(b.GetExternalIps(), v4),
				Cluster:         &pb.EndpointChoice{Used: p.usesCluster, Topology: "none"},
				Local:           &pb.EndpointChoice{Used: p.usesLocal, Topology: "none"},
			}
			for _, ch := range []*pb.EndpointChoice{fe.Cluster, fe.Local} {
				if ch.Used {
					ch.Reason = "no endpoint of this family"
				} else {
					ch.Reason = "not used by this port (see its policy)"
				}
			}
			pe.Families = append(pe.Families, fe)
		}
		out.Ports = append(out.Ports, pe)
	}
	return &trace{node: n, out: out}
}

// family returns the explanation of port i's family f.
func (t *trace) family(i int, f *portFamily) *pb.FamilyExplanation {
	v4 := f.endpoints[0].addr.Is4() // a family is a non-empty run
	pe := t.out.Ports[i]
	for _, fe := range pe.Families {
		if fe.Family == familyName(v4) {
			return fe
		}
	}
	// Not reached: slices of other families than the cluster IPs' are
	// left out before endpoints are merged.
	fe := &pb.FamilyExplanation{Family: familyName(v4), Cluster: &pb.EndpointChoice{}, Local: &pb.EndpointChoice{}}
	pe.Families = append(pe.Families, fe)
	return fe
}

// cluster starts recording port i's Cluster-policy choice in family f.
func (t *trace) cluster(i int, f *portFamily) *choiceTrace {
	if t == nil {
		return nil
	}
	return &choiceTrace{t: t, f: f, out: t.family(i, f).Cluster}
}

// local starts recording port i's Local-policy choice of node's
// endpoints in family f.
func (t *trace) local(i int, f *portFamily, node string) *choiceTrace {
	if t == nil {
		return nil
	}
	return &choiceTrace{t: t, f: f, out: t.family(i, f).Local, local: true, localNode: node}
}

// choiceTrace records one endpoint set's choice. Nil records nothing.
type choiceTrace struct {
	t         *trace
	f         *portFamily
	out       *pb.EndpointChoice
	local     bool
	localNode string
	mode      topologyMode
}

// topology records the topology mode that topologyMode chose, with the
// rule that decided it.
func (ct *choiceTrace) topology(m topologyMode) {
	if ct == nil {
		return
	}
	ct.mode = m
	ct.out.Topology, ct.out.TopologyReason = ct.topologyReason(m)
}

// fallback records that no endpoint qualified as ready, and whether
// serving-and-terminating ones were found instead.
func (ct *choiceTrace) fallback(found bool) {
	if ct == nil {
		return
	}
	ct.out.TerminatingFallback = found
}

// chose records the endpoints the set holds, and a verdict on every
// candidate.
func (ct *choiceTrace) chose(eps []*pb.Endpoint) {
	if ct == nil {
		return
	}
	ct.out.Endpoints = eps
	in := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		in[netip.AddrPortFrom(netip.MustParseAddr(e.GetIp()), uint16(e.GetPort()))] = true
	}
	ready := 0
	for i := range ct.f.endpoints {
		e := &ct.f.endpoints[i]
		if e.ready && (!ct.local || e.nodeName == ct.localNode) {
			ready++
		}
		used := in[netip.AddrPortFrom(e.addr, uint16(e.port))]
		ct.out.Candidates = append(ct.out.Candidates, &pb.EndpointVerdict{
			Endpoint: e.proto(), NodeName: e.nodeName,
			ZoneHints: slices.Clone(e.zoneHints), NodeHints: slices.Clone(e.nodeHints),
			Used: used, Reason: ct.verdict(e, used),
		})
	}
	ct.out.Reason = ct.summary(len(eps), ready)
}

// summary says in one sentence which rule produced a set of n endpoints,
// with ready the ready endpoints eligible (on the node, for the local
// set).
func (ct *choiceTrace) summary(n, ready int) string {
	where := ""
	if ct.local {
		where = " on this node"
	}
	switch {
	case n == 0 && ct.local:
		return "no ready or serving-and-terminating endpoint on this node: the traffic that must stay on this node is dropped here"
	case n == 0:
		return "no endpoint is ready, or serving and terminating: the traffic is rejected"
	case ct.out.TerminatingFallback:
		return fmt.Sprintf("no endpoint%s is ready: its %d serving-and-terminating endpoint(s) are used instead (upstream's terminating fallback)", where, n)
	case ct.mode == topologySameZone:
		return fmt.Sprintf("the %d ready endpoint(s) hinted for zone %s, of %d ready", n, ct.t.node.Zone, ready)
	case ct.mode == topologySameNode:
		return fmt.Sprintf("the %d ready endpoint(s) hinted for node %s, of %d ready", n, ct.t.node.Name, ready)
	}
	return fmt.Sprintf("every ready endpoint%s (%d)", where, n)
}

// verdict says why e is in the set or not.
func (ct *choiceTrace) verdict(e *endpoint, used bool) string {
	if ct.local && e.nodeName != ct.localNode {
		if e.nodeName == "" {
			return "names no node, so is local to none"
		}
		return "on node " + e.nodeName + ", not this one"
	}
	switch {
	case used && e.ready && ct.mode == topologySameZone:
		return "ready, hinted for zone " + ct.t.node.Zone
	case used && e.ready && ct.mode == topologySameNode:
		return "ready, hinted for node " + ct.t.node.Name
	case used && e.ready:
		return "ready"
	case used && ct.local:
		return "serving and terminating, used because no endpoint on this node is ready"
	case used:
		return "serving and terminating, used because no endpoint is ready"
	case e.ready && ct.mode == topologySameZone:
		return fmt.Sprintf("ready, but hinted for zone %s, not %s", strings.Join(e.zoneHints, ","), ct.t.node.Zone)
	case e.ready && ct.mode == topologySameNode:
		return fmt.Sprintf("ready, but hinted for node %s, not %s", strings.Join(e.nodeHints, ","), ct.t.node.Name)
	case e.usableTerminating():
		return "serving and terminating: used only while no endpoint is ready"
	case e.terminating:
		return "terminating and not serving: never used"
	case !e.serving:
		return "not ready, not serving"
	}
	return "not ready"
}

// topologyReason names m and the rule of upstream's topologyModeFromHints
// that gave it for this node.
func (ct *choiceTrace) topologyReason(m topologyMode) (mode, why string) {
	f, n := ct.f, ct.t.node
	switch m {
	case topologySameNode:
		return "node", "every ready endpoint has node hints and some name node " + n.Name + ": only those are used"
	case topologySameZone:
		return "zone", "every ready endpoint has zone hints and some name zone " + n.Zone + ": only those are used"
	}
	var readyCount, nodeHinted, zoneHinted int
	var noNodeHint, noZoneHint string
	for i := range f.endpoints {
		e := &f.endpoints[i]
		if !e.ready {
			continue
		}
		readyCount++
		if len(e.nodeHints) > 0 {
			nodeHinted++
		} else if noNodeHint == "" {
			noNodeHint = e.addr.String()
		}
		if len(e.zoneHints) > 0 {
			zoneHinted++
		} else if noZoneHint == "" {
			noZoneHint = e.addr.String()
		}
	}
	switch {
	case readyCount == 0:
		return "none", "no endpoint is ready: topology applies only to ready endpoints"
	case nodeHinted == 0 && zoneHinted == 0:
		return "none", "no endpoint has topology hints"
	}
	var parts []string
	switch {
	case nodeHinted == 0:
	case nodeHinted < readyCount:
		parts = append(parts, "node hints ignored: ready endpoint "+noNodeHint+" has none (hints count only when every ready endpoint has them)")
	default:
		parts = append(parts, "no ready endpoint's node hints name node "+n.Name)
	}
	switch {
	case zoneHinted == 0:
	case zoneHinted < readyCount:
		parts = append(parts, "zone hints ignored: ready endpoint "+noZoneHint+" has none (hints count only when every ready endpoint has them)")
	case n.Zone == "":
		parts = append(parts, "the node has no zone label, so no zone hint names its zone")
	default:
		parts = append(parts, "no ready endpoint's zone hints name zone "+n.Zone)
	}
	return "none", strings.Join(parts, "; ") + ": every ready endpoint is used"
}

// portPolicy says which traffic to port bp uses which endpoint set, and
// which policy says so: the rule build applies when it sets a port's
// usesCluster and usesLocal (TestExplainPolicyMatchesPort holds them
// together).
func portPolicy(b *pb.Service, bp *pb.ServicePort) string {
	external := bp.GetNodePort() != 0 || len(b.GetExternalIps()) > 0 || len(b.GetLoadBalancerIps()) > 0
	var parts []string
	if b.GetInternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		parts = append(parts, "internalTrafficPolicy Local: cluster IP traffic uses this node's endpoints only")
	} else {
		parts = append(parts, "internalTrafficPolicy Cluster: cluster IP traffic uses cluster-wide endpoints")
	}
	switch {
	case !external:
		parts = append(parts, "no NodePort, external or load balancer IP: no external traffic")
	case b.GetExternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL:
		hc := ""
		if b.GetHealthCheckNodePort() != 0 {
			hc = fmt.Sprintf(" (health check on node port %d)", b.GetHealthCheckNodePort())
		}
		// Traffic from the cluster's own pods to these addresses goes to
		// the cluster-wide endpoints, as upstream short-circuits it: why
		// an externally reachable port always uses them.
		parts = append(parts, "externalTrafficPolicy Local: NodePort, external and load balancer IP traffic from outside uses this node's endpoints only, keeping the client's address"+hc+"; from this node's pods and the node itself it uses cluster-wide endpoints")
	default:
		parts = append(parts, "externalTrafficPolicy Cluster: NodePort, external and load balancer IP traffic uses cluster-wide endpoints, masqueraded")
	}
	return strings.Join(parts, "; ")
}

// CheckSource says whether the node lets from reach the load balancer IPs
// of svc, a Service message as in a table: what the agent programs from
// load_balancer_source_ranges (table.proto). Only load balancer IPs are
// filtered; NodePorts, cluster and external IPs are not, as upstream.
// nodeIPs are the node's IPs (Node.IPs): when a range holds one, the load
// balancer IPs themselves are let in as sources too, as every dataplane
// programs it (upstream's allowFromNode): a load balancer IP local to the
// node makes the node's own requests to it loop back with it as source.
func CheckSource(svc *pb.Service, from netip.Addr, nodeIPs []netip.Addr) *pb.SourceCheck {
	from = from.Unmap()
	out := &pb.SourceCheck{From: from.String()}
	ranges := svc.GetLoadBalancerSourceRanges()
	lbNote := ""
	if len(svc.GetLoadBalancerIps()) == 0 {
		lbNote = " (the Service has no load balancer IP)"
	}
	if len(ranges) == 0 {
		out.Allowed = true
		out.Reason = "the Service has no loadBalancerSourceRanges: every source reaches its load balancer IPs" + lbNote
		return out
	}
	if slices.Equal(ranges, []string{ClosedSourceRange}) {
		out.Reason = "every loadBalancerSourceRanges entry is invalid: the load balancer IPs admit no one (see ListEvents)"
		return out
	}
	ofFam := 0
	var nodeRange string  // a range of from's family holding a node IP
	var nodeIP netip.Addr // that node IP
	for _, r := range ranges {
		p, err := netip.ParsePrefix(r)
		if err != nil || p.Addr().Is4() != from.Is4() {
			continue
		}
		ofFam++
		if p.Contains(from) {
			out.Allowed = true
			out.Reason = "in loadBalancerSourceRanges entry " + r + ": let in to the load balancer IPs" + lbNote
			return out
		}
		for _, ip := range nodeIPs {
			if ip = ip.Unmap().WithZone(""); nodeRange == "" && p.Contains(ip) {
				nodeRange, nodeIP = r, ip
			}
		}
	}
	if nodeRange != "" && slices.ContainsFunc(svc.GetLoadBalancerIps(), func(s string) bool {
		a, err := netip.ParseAddr(s)
		return err == nil && a.Unmap() == from
	}) {
		out.Allowed = true
		out.Reason = "a load balancer IP of the Service, let in as a source because loadBalancerSourceRanges entry " + nodeRange +
			" holds the node's IP " + nodeIP.String() + ": the node's own requests to a load balancer IP local to it come back from that IP (as upstream)"
		return out
	}
	if ofFam == 0 {
		out.Reason = fmt.Sprintf("no loadBalancerSourceRanges entry is %s: the load balancer IPs admit no %s source (NodePorts stay open)", familyName(from.Is4()), familyName(from.Is4()))
		return out
	}
	out.Reason = "in no loadBalancerSourceRanges entry: dropped before DNAT on the load balancer IPs (NodePorts stay open, as upstream)" + lbNote
	return out
}

func familyName(v4 bool) string {
	if v4 {
		return "IPv4"
	}
	return "IPv6"
}

// ofFamily returns the addresses of ips (valid, as frontend rendered
// them) of one family.
func ofFamily(ips []string, v4 bool) []string {
	var out []string
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() == v4 {
			out = append(out, ip)
		}
	}
	return out
}

// ExplainedEndpoints lays out the endpoint sets pe explains as a table
// entry holds them: the port's cluster_endpoints and local_endpoints
// entries (none for a set unused or empty), each joining the families'
// endpoints in the table's order (by address, so IPv4 first). For tests
// and tools that hold an explanation against a table.
func ExplainedEndpoints(pe *pb.PortExplanation) (cluster, local []*pb.PortEndpoints) {
	fams := slices.Clone(pe.GetFamilies())
	slices.SortStableFunc(fams, func(a, b *pb.FamilyExplanation) int { return strings.Compare(a.GetFamily(), b.GetFamily()) })
	join := func(pick func(*pb.FamilyExplanation) *pb.EndpointChoice) []*pb.PortEndpoints {
		var eps []*pb.Endpoint
		for _, f := range fams {
			if ch := pick(f); ch.GetUsed() {
				eps = append(eps, ch.GetEndpoints()...)
			}
		}
		if len(eps) == 0 {
			return nil
		}
		return []*pb.PortEndpoints{{PortName: pe.GetName(), Endpoints: eps}}
	}
	return join((*pb.FamilyExplanation).GetCluster), join((*pb.FamilyExplanation).GetLocal)
}
