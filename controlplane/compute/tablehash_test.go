package compute

import (
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// TestAgentsRecomputeHashes checks that what an agent recomputes from the
// bytes it receives (package tablehash) is the hash the control plane
// sent: for entries with and without a local part, and for nodes with and
// without service CIDRs. A difference would make every agent NACK every
// table.
func TestAgentsRecomputeHashes(t *testing.T) {
	s := mustBuild(t, nodePortService(withExternalLocal(), withExternalIPs("192.0.2.7"), withAffinity(ptr(int32(60)))),
		httpSlice("web-a", ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-c")), ep("10.0.0.3", terminating(true))))
	for _, name := range []string{"node-a", "node-b"} {
		t.Run(name, func(t *testing.T) {
			e := s.EntryFor(testNode(name, ""))
			got, err := tablehash.Entry(s.Key, decode(t, e))
			if err != nil {
				t.Fatal(err)
			}
			if got != e.Hash {
				t.Errorf("agent's hash %#x, control plane's %#x", got, e.Hash)
			}
		})
	}
	cidrs := BuildServiceCIDRs(nil)
	node := BuildNode("node-a", &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "z1"}},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}},
	})
	for _, n := range []*Node{node, node.WithServiceCIDRs(cidrs)} {
		info := &pb.NodeInfo{}
		if err := proto.Unmarshal(n.Bytes, info); err != nil {
			t.Fatal(err)
		}
		if got, err := tablehash.Node(info); err != nil || got != n.Hash || info.GetHash() != n.Hash {
			t.Errorf("agent's node hash %#x (%v), control plane's %#x, sent %#x", got, err, n.Hash, info.GetHash())
		}
	}
}

// TestEntryHashPinned pins the entry hash function: agents and replicas of
// other versions must agree on it.
func TestEntryHashPinned(t *testing.T) {
	if got, want := entryHash("default/web", 1, 2), uint64(0xc61f1fe927401719); got != want {
		t.Errorf("entryHash = %#x, want %#x", got, want)
	}
}
