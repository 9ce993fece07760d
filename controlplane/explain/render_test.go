package explain

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// hostile is an answer whose every string a replica or an agent could
// have chosen carries terminal controls: an ESC sequence, a
// bidirectional override, a C1 CSI, a line break.
func hostile() Reply {
	evil := "x\x1b[2J\u202e\u009b\nend"
	choice := &pb.EndpointChoice{
		Used: true, Endpoints: []*pb.Endpoint{{Ip: evil, Port: 1}}, Topology: evil, TopologyReason: evil, Reason: evil,
		Candidates: []*pb.EndpointVerdict{{Endpoint: &pb.Endpoint{Ip: evil}, NodeName: evil, Used: true, Reason: evil}},
	}
	return Reply{Replica: evil, Resp: &pb.ExplainResponse{
		NodeName: evil, Zone: evil, Key: evil, Version: evil, EntryHash: evil, AckedVersion: evil,
		Service: &pb.ServiceExplanation{
			LoadBalancerSourceRanges: []string{evil},
			Source:                   &pb.SourceCheck{From: evil, Reason: evil},
			Ports: []*pb.PortExplanation{{
				Name: evil, Policy: evil,
				Families: []*pb.FamilyExplanation{{Family: evil, ClusterIp: evil, LoadBalancerIps: []string{evil}, ExternalIps: []string{evil}, Cluster: choice, Local: choice}},
			}},
		},
	}}
}

// TestWriteTextIsTerminalSafe checks that nothing an answer carries
// reaches the terminal as a control: every value is escaped, visibly.
func TestWriteTextIsTerminalSafe(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, hostile()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)) {
			t.Fatalf("output carries %U:\n%q", r, out)
		}
	}
	// Each value stays on its line, its controls shown.
	if !strings.Contains(out, `x\x1b[2J\u202e\x9b end`) {
		t.Errorf("escaped value not shown:\n%s", out)
	}
	if lines := strings.Count(out, "\n"); lines != 20 {
		t.Errorf("%d lines, want 20: a value broke a line?\n%s", lines, out)
	}
}

func TestWriteJSONIsTerminalSafeAndDecodes(t *testing.T) {
	var b bytes.Buffer
	r := hostile()
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, c := range b.String() {
		if c >= 0x7f && (unicode.IsControl(c) || unicode.Is(unicode.Bidi_Control, c)) {
			t.Fatalf("JSON carries %U", c)
		}
	}
	var got struct {
		Replica     string `json:"replica"`
		Explanation struct {
			NodeName string `json:"nodeName"`
		} `json:"explanation"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Replica != r.Replica || got.Explanation.NodeName != r.Resp.GetNodeName() {
		t.Errorf("decoded %q, %q; want the values as sent", got.Replica, got.Explanation.NodeName)
	}
}
