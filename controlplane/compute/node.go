package compute

import (
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Node is what a table needs to know about its node. It is immutable.
type Node struct {
	// Name is the Node's name.
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
	// Hash is the content hash of the NodeInfo, part of the table version.
	Hash uint64
	// Bytes is the encoded NodeInfo, hash included.
	Bytes []byte
}

// TaintToBeDeleted is the taint the cluster autoscaler puts on a node it
// is about to delete; kube-proxy treats such a node as being deleted.
const TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// BuildNode describes the node called name. obj is its Node object, or nil
// when none exists: an agent may connect before its Node is registered, and
// gets a table without topology, as kube-proxy does without node labels.
func BuildNode(name string, obj *corev1.Node) *Node {
	// Names reach here from Node objects and from decoded hellos, both of
	// which are valid UTF-8; a name that is not would make the NodeInfo
	// unencodable, so it is made valid rather than trusted.
	name = strings.ToValidUTF8(name, "\uFFFD")
	info := &pb.NodeInfo{Name: name}
	if obj != nil {
		if zone := obj.Labels[corev1.LabelTopologyZone]; utf8.ValidString(zone) {
			info.Zone = zone
		}
		cidrs := obj.Spec.PodCIDRs
		if len(cidrs) == 0 && obj.Spec.PodCIDR != "" {
			cidrs = []string{obj.Spec.PodCIDR}
		}
		for _, c := range cidrs {
			// The API server validates podCIDRs; re-rendering a parsed
			// prefix guards the encoding anyway, and drops garbage.
			if p, err := netip.ParsePrefix(c); err == nil {
				info.PodCidrs = append(info.PodCidrs, p.String())
			}
		}
		// As kube-proxy's nodeEligible: a deletion under way or the
		// autoscaler's taint.
		info.ToBeDeleted = obj.DeletionTimestamp != nil || slices.ContainsFunc(obj.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == TaintToBeDeleted
		})
	}
	info.Hash = xxhash.Sum64(mustMarshal(info))
	return &Node{Name: name, Zone: info.Zone, Hash: info.Hash, Bytes: mustMarshal(info)}
}

// Equal reports whether two nodes carry the same information.
func (n *Node) Equal(o *Node) bool {
	return n == o || (n != nil && o != nil && n.Hash == o.Hash && n.Name == o.Name)
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// mustMarshal encodes m deterministically. Marshalling a message built
// here fails only on invalid UTF-8, which every string in it has been
// checked against, so a failure is a bug.
func mustMarshal(m proto.Message) []byte {
	b, err := deterministic.Marshal(m)
	if err != nil {
		panic("compute: marshal " + string(m.ProtoReflect().Descriptor().FullName()) + ": " + err.Error())
	}
	return b
}
