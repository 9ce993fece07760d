package compute

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// k8sNode is a Node object called name with zone label zone ("" for none)
// and the given pod CIDRs.
func k8sNode(name, zone string, podCIDRs ...string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDRs: podCIDRs},
	}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	if zone != "" {
		n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
	}
	return n
}

func TestBuildNode(t *testing.T) {
	tests := []struct {
		name string
		obj  *corev1.Node
		want *pb.NodeInfo // without hash; Name is always "node-a"
	}{
		{
			name: "nil node",
			want: &pb.NodeInfo{Name: "node-a", Unregistered: true},
		},
		{
			name: "no labels, no CIDRs",
			obj:  &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
			want: &pb.NodeInfo{Name: "node-a"},
		},
		{
			name: "zone label",
			obj:  k8sNode("node-a", "us-east-1a"),
			want: &pb.NodeInfo{Name: "node-a", Zone: "us-east-1a"},
		},
		{
			name: "other labels ignored",
			obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
				"failure-domain.beta.kubernetes.io/zone": "legacy", corev1.LabelTopologyRegion: "us-east-1",
			}}},
			want: &pb.NodeInfo{Name: "node-a"},
		},
		{
			name: "zone label not UTF-8 dropped",
			obj:  k8sNode("node-a", "zone-\xff"),
			want: &pb.NodeInfo{Name: "node-a"},
		},
		{
			name: "dual-stack podCIDRs",
			obj:  k8sNode("node-a", "zone-a", "10.244.1.0/24", "fd00:10:244:1::/64"),
			want: &pb.NodeInfo{Name: "node-a", Zone: "zone-a", PodCidrs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		},
		{
			name: "legacy podCIDR alone",
			obj: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec:       corev1.NodeSpec{PodCIDR: "10.244.2.0/24"},
			},
			want: &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"10.244.2.0/24"}},
		},
		{
			name: "podCIDRs preferred over podCIDR",
			obj: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec:       corev1.NodeSpec{PodCIDR: "10.244.9.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
			},
			want: &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"10.244.1.0/24"}},
		},
		{
			name: "garbage CIDR dropped",
			obj:  k8sNode("node-a", "", "10.244.1.0/24", "not-a-cidr", "10.0.0.0/40", "fd00::/64"),
			want: &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"10.244.1.0/24", "fd00::/64"}},
		},
		{
			name: "garbage legacy podCIDR dropped",
			obj: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec:       corev1.NodeSpec{PodCIDR: "garbage"},
			},
			want: &pb.NodeInfo{Name: "node-a"},
		},
		{
			name: "being deleted",
			obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{
				Name: "node-a", DeletionTimestamp: &metav1.Time{Time: time.Unix(1, 0)},
			}},
			want: &pb.NodeInfo{Name: "node-a", ToBeDeleted: true},
		},
		{
			name: "autoscaler's taint",
			obj: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec: corev1.NodeSpec{Taints: []corev1.Taint{
					{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule},
					{Key: TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule},
				}},
			},
			want: &pb.NodeInfo{Name: "node-a", ToBeDeleted: true},
		},
		{
			name: "other taints ignored",
			obj: &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule}}},
			},
			want: &pb.NodeInfo{Name: "node-a"},
		},
		{
			name: "node IPs: InternalIP first, then the other family's first",
			obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeHostName, Address: "node-a"},
				{Type: corev1.NodeExternalIP, Address: "2001:db8::9"},
				{Type: corev1.NodeExternalIP, Address: "203.0.113.9"},
				{Type: corev1.NodeInternalIP, Address: "192.168.0.2"},
				{Type: corev1.NodeInternalIP, Address: "192.168.0.3"},
				{Type: corev1.NodeInternalIP, Address: "fd00::2"},
				{Type: corev1.NodeInternalIP, Address: "fd00::3"},
			}}},
			want: &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.0.2", "fd00::2"}},
		},
		{
			name: "node IPs: an ExternalIP stands in for the missing family",
			obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeExternalIP, Address: "2001:DB8::9"},
				{Type: corev1.NodeInternalIP, Address: "not-an-ip"},
				{Type: corev1.NodeInternalIP, Address: "192.168.000.002"},
			}}},
			want: &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.0.2", "2001:db8::9"}},
		},
		{
			name: "node IPs: ExternalIP alone, hostnames and DNS names ignored",
			obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalDNS, Address: "10.0.0.1"},
				{Type: corev1.NodeExternalIP, Address: "::ffff:203.0.113.9"},
			}}},
			want: &pb.NodeInfo{Name: "node-a", NodeIps: []string{"203.0.113.9"}},
		},
		{
			name: "IPv6 CIDR canonicalised",
			obj:  k8sNode("node-a", "", "FD00:0:0::/64"),
			want: &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"fd00::/64"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := BuildNode("node-a", tt.obj)
			if n.Name != "node-a" {
				t.Errorf("Name = %q, want %q", n.Name, "node-a")
			}
			if n.Zone != tt.want.Zone {
				t.Errorf("Zone = %q, want %q", n.Zone, tt.want.Zone)
			}
			var got pb.NodeInfo
			if err := proto.Unmarshal(n.Bytes, &got); err != nil {
				t.Fatalf("decoding Bytes: %v", err)
			}
			if got.Hash != n.Hash {
				t.Errorf("encoded hash %x, want Hash %x", got.Hash, n.Hash)
			}
			// The hash covers the message without its hash field.
			if want := xxhash.Sum64(mustMarshal(tt.want)); n.Hash != want {
				t.Errorf("Hash = %x, want xxhash of the hashless encoding %x", n.Hash, want)
			}
			got.Hash = 0
			checkProto(t, "NodeInfo", &got, tt.want)
		})
	}
}

// TestNodeHash checks what the node hash, and so the table version,
// depends on.
func TestNodeHash(t *testing.T) {
	tests := []struct {
		name     string
		a, b     *Node
		wantSame bool
	}{
		{
			name:     "same inputs",
			a:        BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24")),
			b:        BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24")),
			wantSame: true,
		},
		{
			// The agent's /healthz tells them apart (nodeEligible).
			name: "nil and unlabelled Node",
			a:    BuildNode("node-a", nil),
			b:    BuildNode("node-a", k8sNode("node-a", "")),
		},
		{
			name:     "unrelated label changed",
			a:        BuildNode("node-a", k8sNode("node-a", "zone-a")),
			b:        BuildNode("node-a", func() *corev1.Node { n := k8sNode("node-a", "zone-a"); n.Labels["app"] = "x"; return n }()),
			wantSame: true,
		},
		{
			name: "zone changed",
			a:    BuildNode("node-a", k8sNode("node-a", "zone-a")),
			b:    BuildNode("node-a", k8sNode("node-a", "zone-b")),
		},
		{
			name: "zone added",
			a:    BuildNode("node-a", k8sNode("node-a", "")),
			b:    BuildNode("node-a", k8sNode("node-a", "zone-a")),
		},
		{
			name: "pod CIDR changed",
			a:    BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24")),
			b:    BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.2.0/24")),
		},
		{
			name: "pod CIDR added",
			a:    BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24")),
			b:    BuildNode("node-a", k8sNode("node-a", "zone-a", "10.244.1.0/24", "fd00::/64")),
		},
		{
			name: "name changed",
			a:    BuildNode("node-a", nil),
			b:    BuildNode("node-b", nil),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Hash == tt.b.Hash; got != tt.wantSame {
				t.Errorf("hashes equal = %v (%x, %x), want %v", got, tt.a.Hash, tt.b.Hash, tt.wantSame)
			}
			if got := tt.a.Equal(tt.b); got != tt.wantSame {
				t.Errorf("Equal = %v, want %v", got, tt.wantSame)
			}
		})
	}
}

func TestNodeEqualNil(t *testing.T) {
	n := BuildNode("node-a", nil)
	var nilNode *Node
	tests := []struct {
		name string
		a, b *Node
		want bool
	}{
		{"same pointer", n, n, true},
		{"nil and nil", nilNode, nilNode, true},
		{"value and nil", n, nilNode, false},
		{"nil and value", nilNode, n, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a.Equal(tt.b); got != tt.want {
				t.Errorf("Equal = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFormatVersion(t *testing.T) {
	tests := []struct {
		sum  uint64
		want string
	}{
		{0, "0000000000000000"},
		{1, "0000000000000001"},
		{0xdeadbeef, "00000000deadbeef"},
		{0x0123456789abcdef, "0123456789abcdef"},
		{math.MaxUint64, "ffffffffffffffff"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			got := FormatVersion(tt.sum)
			if got != tt.want {
				t.Errorf("FormatVersion(%#x) = %q, want %q", tt.sum, got, tt.want)
			}
			back, err := ParseVersion(got)
			if err != nil {
				t.Fatalf("ParseVersion(%q): %v", got, err)
			}
			if back != tt.sum {
				t.Errorf("ParseVersion(FormatVersion(%#x)) = %#x", tt.sum, back)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    uint64
		wantErr string // "" for success; else a substring of the error
	}{
		{name: "lower case", in: "00000000000000ff", want: 0xff},
		{name: "upper case", in: "00000000000000FF", want: 0xff},
		{name: "empty", in: "", wantErr: "16 hex digits"},
		{name: "too short", in: "ff", wantErr: "16 hex digits"},
		{name: "15 digits", in: "000000000000000", wantErr: "16 hex digits"},
		{name: "17 digits", in: "00000000000000000", wantErr: "16 hex digits"},
		{name: "not hex", in: "000000000000000g", wantErr: "invalid syntax"},
		{name: "0x prefix", in: "0x00000000000000", wantErr: "invalid syntax"},
		{name: "sign", in: "+000000000000001", wantErr: "invalid syntax"},
		{name: "spaces", in: " 00000000000001 ", wantErr: "invalid syntax"},
		{name: "underscores", in: "0000_00000000001", wantErr: "invalid syntax"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVersion(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseVersion(%q): %v", tt.in, err)
				}
				if got != tt.want {
					t.Errorf("ParseVersion(%q) = %#x, want %#x", tt.in, got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseVersion(%q) = %#x, want an error", tt.in, got)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseVersion(%q) error %q does not mention %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

func xxhashOf(m proto.Message) uint64 { return xxhash.Sum64(mustMarshal(m)) }
