package compute

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func serviceCIDR(name string, ready bool, cidrs ...string) *networkingv1.ServiceCIDR {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	return &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
		Status: networkingv1.ServiceCIDRStatus{Conditions: []metav1.Condition{{
			Type: networkingv1.ServiceCIDRConditionReady, Status: status,
		}}},
	}
}

func TestBuildServiceCIDRs(t *testing.T) {
	deleting := serviceCIDR("old", true, "10.100.0.0/16")
	deleting.DeletionTimestamp = &metav1.Time{}
	tests := []struct {
		name string
		objs []*networkingv1.ServiceCIDR
		want []string
	}{
		{name: "none", want: nil},
		{name: "object without CIDRs", objs: []*networkingv1.ServiceCIDR{serviceCIDR("x", true)}, want: nil},
		{
			name: "default dual-stack, IPv4 first",
			objs: []*networkingv1.ServiceCIDR{serviceCIDR("kubernetes", true, "fd00:10:96::/112", "10.96.0.0/12")},
			want: []string{"10.96.0.0/12", "fd00:10:96::/112"},
		},
		{
			// Upstream takes spec.cidrs whatever the status: a CIDR not
			// yet Ready, or being deleted, may still hold ClusterIPs.
			name: "union of every object, whatever its status",
			objs: []*networkingv1.ServiceCIDR{
				serviceCIDR("kubernetes", true, "10.96.0.0/16"),
				serviceCIDR("extra", false, "10.97.0.0/16"),
				deleting,
			},
			want: []string{"10.96.0.0/16", "10.97.0.0/16", "10.100.0.0/16"},
		},
		{
			name: "the same CIDR in two objects once",
			objs: []*networkingv1.ServiceCIDR{
				serviceCIDR("a", true, "10.96.0.0/16"), serviceCIDR("b", true, "10.96.0.0/16"),
			},
			want: []string{"10.96.0.0/16"},
		},
		{
			name: "canonical form, garbage left out",
			objs: []*networkingv1.ServiceCIDR{serviceCIDR("a", true, "FD00:0::/64", "10.96.0.1/16", "nope", "10.0.0.0/33")},
			want: []string{"10.96.0.0/16", "fd00::/64"},
		},
		{
			name: "nested prefixes by length",
			objs: []*networkingv1.ServiceCIDR{serviceCIDR("a", true, "10.96.0.0/24", "10.96.0.0/16")},
			want: []string{"10.96.0.0/16", "10.96.0.0/24"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := BuildServiceCIDRs(tt.objs).List(); !slices.Equal(got, tt.want) {
				t.Errorf("BuildServiceCIDRs = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestNodeWithServiceCIDRs checks that a node carries the CIDRs in its
// encoding and its hash, and keeps everything else.
func TestNodeWithServiceCIDRs(t *testing.T) {
	base := BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24"))
	cidrs := BuildServiceCIDRs([]*networkingv1.ServiceCIDR{serviceCIDR("kubernetes", true, "10.96.0.0/12")})
	n := base.WithServiceCIDRs(cidrs)
	if n.Hash == base.Hash || n.Equal(base) {
		t.Error("adding service CIDRs left the node hash unchanged")
	}
	var got pb.NodeInfo
	if err := proto.Unmarshal(n.Bytes, &got); err != nil {
		t.Fatalf("decoding Bytes: %v", err)
	}
	want := &pb.NodeInfo{Name: "node-a", Zone: "zone-a", PodCidrs: []string{"10.244.1.0/24"}, ServiceCidrs: []string{"10.96.0.0/12"}}
	if h := got.Hash; h != n.Hash || h != xxhashOf(want) {
		t.Errorf("encoded hash %x, Hash %x, want both the xxhash of the hashless encoding %x", h, n.Hash, xxhashOf(want))
	}
	got.Hash = 0
	checkProto(t, "NodeInfo", &got, want)

	if again := n.WithServiceCIDRs(BuildServiceCIDRs([]*networkingv1.ServiceCIDR{serviceCIDR("k", true, "10.96.0.0/12")})); again != n {
		t.Error("the same CIDRs again built a new node")
	}
	if back := n.WithServiceCIDRs(nil); !back.Equal(base) || !slices.Equal(back.Bytes, base.Bytes) {
		t.Error("removing the CIDRs did not give back the node without them")
	}
}
