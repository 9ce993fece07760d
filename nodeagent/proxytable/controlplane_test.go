package proxytable

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// TestControlPlaneAddresses checks which learned control plane addresses
// a table may carry: the agent dials them, so anything it could not dial,
// or would resolve by name, refuses the table.
func TestControlPlaneAddresses(t *testing.T) {
	tooMany := make([]string, maxControlPlaneAddresses+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("10.0.%d.%d:9640", i/250, i%250+1)
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		valid bool
	}{
		{"none", nil, true},
		{"both families", []string{"192.168.0.10:9640", "[fd00::10]:9640"}, true},
		{"loopback, for a one-node cluster", []string{"127.0.0.1:9640"}, true},
		{"no port", []string{"192.168.0.10"}, false},
		{"port 0", []string{"192.168.0.10:0"}, false},
		{"port out of range", []string{"192.168.0.10:65536"}, false},
		{"a name", []string{"cp.example.com:9640"}, false},
		{"IPv6 without brackets", []string{"fd00::10:9640"}, false},
		{"not canonical", []string{"[FD00::10]:9640"}, false},
		{"IPv4-mapped", []string{"[::ffff:192.168.0.10]:9640"}, false},
		{"zoned", []string{"[fe80::1%eth0]:9640"}, false},
		{"unspecified", []string{"0.0.0.0:9640"}, false},
		{"multicast", []string{"224.0.0.1:9640"}, false},
		{"twice", []string{"192.168.0.10:9640", "192.168.0.10:9640"}, false},
		{"too many", tooMany, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromSnapshot(withNode(snap(entry("a", 1)), func(n *pb.NodeInfo) { n.ControlPlaneAddresses = tc.addrs }))
			if tc.valid && err != nil {
				t.Errorf("refused: %v", err)
			}
			if !tc.valid && !errors.Is(err, ErrInvalidTable) {
				t.Errorf("accepted, or not as an invalid table: %v", err)
			}
		})
	}
}

// TestOlderAgentKeepsNodeHash checks that the field is backward
// compatible: an agent built before it holds the addresses as unknown
// bytes and still finds the node hash its content's.
func TestOlderAgentKeepsNodeHash(t *testing.T) {
	n := &pb.NodeInfo{Name: "node-1", NodeIps: []string{"192.168.0.2"}, ControlPlaneAddresses: []string{"192.168.0.10:9640", "[fd00::10]:9640"}}
	h, err := tablehash.Node(n)
	if err != nil {
		t.Fatal(err)
	}
	n.Hash = h
	b, err := proto.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	old := &pb.NodeInfo{}
	if err := proto.Unmarshal(b, old); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	for _, a := range old.GetControlPlaneAddresses() {
		raw = protowire.AppendTag(raw, 8, protowire.BytesType)
		raw = protowire.AppendString(raw, a)
	}
	old.ControlPlaneAddresses = nil
	old.ProtoReflect().SetUnknown(raw)
	if err := checkNodeHash(old); err != nil {
		t.Errorf("an older agent refuses the node: %v", err)
	}
}
