package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// WriteText prints the explanation for a person:
//
//	Service default/web on node node-1 (zone zone-a), as replica 10.0.0.5:9640 computes it
//	version       0d87f81ad851cfb5 (resourceVersion 1234), entry 5e1f0b2a9c3d4e6f
//	acknowledged  yes, at 2026-11-27T08:00:00Z; the agent is connected to this replica
//	...
//	port http TCP 80, nodePort 30080
//	  policy: internalTrafficPolicy Cluster: ...
//	  IPv4  clusterIP 10.96.0.10  load balancer 192.0.2.10  external -
//	    cluster endpoints: 10.0.1.1:8080
//	      why: the 1 ready endpoint(s) hinted for zone zone-a, of 2 ready
//	      topology zone: every ready endpoint has zone hints and ...
//	      + 10.0.1.1:8080  node-1  ready, hinted for zone zone-a
//	      - 10.0.2.1:8080  node-2  ready, but hinted for zone zone-b, not zone-a
//
// "+" marks an endpoint in the set, "-" one left out. Every value from
// the replica is made terminal-safe (adminclient.Cell).
func WriteText(w io.Writer, r Reply) error {
	x := r.Resp
	s := x.GetService()
	var b strings.Builder
	c := adminclient.Cell
	zone := "no zone"
	if x.GetZone() != "" {
		zone = "zone " + c(x.GetZone())
	}
	registered := ""
	if !x.GetRegistered() {
		registered = ", no Node object"
	}
	fmt.Fprintf(&b, "Service %s on node %s (%s%s), as replica %s computes it\n", c(x.GetKey()), c(x.GetNodeName()), zone, registered, c(r.Replica))
	fmt.Fprintf(&b, "version       %s (resourceVersion %d), entry %s\n", c(x.GetVersion()), x.GetResourceVersion(), c(x.GetEntryHash()))
	fmt.Fprintf(&b, "acknowledged  %s\n", ackLine(x))
	fmt.Fprintf(&b, "type          %s\n", serviceType(s.GetType()))
	fmt.Fprintf(&b, "policies      externalTrafficPolicy %s, internalTrafficPolicy %s%s\n",
		policy(s.GetExternalTrafficPolicy()), policy(s.GetInternalTrafficPolicy()), healthCheck(s.GetHealthCheckNodePort()))
	affinity := "none"
	if a := s.GetSessionAffinity(); a != nil {
		affinity = fmt.Sprintf("ClientIP, %ds", a.GetTimeoutSeconds())
	}
	fmt.Fprintf(&b, "affinity      %s\n", affinity)
	fmt.Fprintf(&b, "sourceRanges  %s\n", list(s.GetLoadBalancerSourceRanges(), "none"))
	if src := s.GetSource(); src != nil {
		verdict := "dropped"
		if src.GetAllowed() {
			verdict = "allowed"
		}
		fmt.Fprintf(&b, "from %s  %s: %s\n", c(src.GetFrom()), verdict, c(src.GetReason()))
	}
	for _, p := range s.GetPorts() {
		writePort(&b, p)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writePort(b *strings.Builder, p *pb.PortExplanation) {
	c := adminclient.Cell
	name := c(p.GetName())
	if name == "" {
		name = "(unnamed)"
	}
	nodePort := ""
	if p.GetNodePort() != 0 {
		nodePort = fmt.Sprintf(", nodePort %d", p.GetNodePort())
	}
	fmt.Fprintf(b, "\nport %s %s %d%s\n", name, protocol(p.GetProtocol()), p.GetPort(), nodePort)
	fmt.Fprintf(b, "  policy: %s\n", c(p.GetPolicy()))
	for _, f := range p.GetFamilies() {
		fmt.Fprintf(b, "  %s  clusterIP %s  load balancer %s  external %s\n", c(f.GetFamily()), c(f.GetClusterIp()),
			list(f.GetLoadBalancerIps(), "-"), list(f.GetExternalIps(), "-"))
		writeChoice(b, "cluster", f.GetCluster())
		writeChoice(b, "local", f.GetLocal())
	}
}

func writeChoice(b *strings.Builder, set string, ch *pb.EndpointChoice) {
	c := adminclient.Cell
	if !ch.GetUsed() {
		fmt.Fprintf(b, "    %s endpoints: not used\n", set)
		return
	}
	eps := make([]string, 0, len(ch.GetEndpoints()))
	for _, e := range ch.GetEndpoints() {
		eps = append(eps, endpoint(e))
	}
	fmt.Fprintf(b, "    %s endpoints: %s\n", set, list(eps, "none"))
	fmt.Fprintf(b, "      why: %s\n", c(ch.GetReason()))
	if ch.GetTopologyReason() != "" {
		fmt.Fprintf(b, "      topology %s: %s\n", c(ch.GetTopology()), c(ch.GetTopologyReason()))
	}
	for _, v := range ch.GetCandidates() {
		mark := "-"
		if v.GetUsed() {
			mark = "+"
		}
		node := v.GetNodeName()
		if node == "" {
			node = "-"
		}
		fmt.Fprintf(b, "      %s %s  %s  %s\n", mark, endpoint(v.GetEndpoint()), c(node), c(v.GetReason()))
	}
}

func ackLine(x *pb.ExplainResponse) string {
	where := "the agent is not connected to this replica"
	if x.GetConnected() {
		where = "the agent is connected to this replica"
	}
	switch {
	case x.GetAcknowledged():
		at := ""
		if x.GetAckedAt() != nil {
			at = ", at " + x.GetAckedAt().AsTime().UTC().Format(time.RFC3339)
		}
		return "yes" + at + "; " + where
	case x.GetAckedVersion() != "":
		return "no: the agent last acknowledged " + adminclient.Cell(x.GetAckedVersion()) + "; " + where
	}
	return "no: nothing acknowledged; " + where
}

func endpoint(e *pb.Endpoint) string {
	ip := adminclient.Cell(e.GetIp())
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return ip + ":" + strconv.Itoa(int(e.GetPort()))
}

func list(items []string, empty string) string {
	if len(items) == 0 {
		return empty
	}
	return adminclient.Cell(strings.Join(items, ", "))
}

func healthCheck(port int32) string {
	if port == 0 {
		return ""
	}
	return fmt.Sprintf(", healthCheckNodePort %d", port)
}

func serviceType(t pb.ServiceType) string {
	switch t {
	case pb.ServiceType_SERVICE_TYPE_CLUSTER_IP:
		return "ClusterIP"
	case pb.ServiceType_SERVICE_TYPE_NODE_PORT:
		return "NodePort"
	case pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER:
		return "LoadBalancer"
	}
	return t.String()
}

func policy(p pb.TrafficPolicy) string {
	if p == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL {
		return "Local"
	}
	return "Cluster"
}

func protocol(p pb.Protocol) string { return strings.TrimPrefix(p.String(), "PROTOCOL_") }

// WriteJSON prints the replica asked and its answer, in the JSON mapping
// of ExplainResponse that grpcurl prints, indented, for scripts. As
// status.WriteJSON, every rune that could change what a terminal shows is
// written as a \u escape.
func WriteJSON(w io.Writer, r Reply) error {
	body, err := protojson.Marshal(r.Resp)
	if err != nil {
		return fmt.Errorf("encoding the explanation: %w", err)
	}
	out, err := json.MarshalIndent(struct {
		Replica     string          `json:"replica"`
		Explanation json.RawMessage `json:"explanation"`
	}{r.Replica, body}, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the explanation: %w", err)
	}
	_, err = w.Write(append(adminclient.EscapeJSON(out), '\n'))
	return err
}
