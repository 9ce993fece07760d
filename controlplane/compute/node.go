package compute

import (
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"

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

	// info is the NodeInfo without its hash, service CIDRs and control
	// plane addresses, from which WithServiceCIDRs and
	// WithControlPlaneAddresses build the node again.
	info *pb.NodeInfo
	// cidrs are the service CIDRs in Bytes.
	cidrs *ServiceCIDRs
	// cp are the control plane addresses in Bytes.
	cp *ControlPlaneAddresses
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
	info := &pb.NodeInfo{Name: name, Unregistered: obj == nil}
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
		info.NodeIps = primaryNodeIPs(obj.Status.Addresses)
		// As kube-proxy's nodeEligible: a deletion under way or the
		// autoscaler's taint.
		info.ToBeDeleted = obj.DeletionTimestamp != nil || slices.ContainsFunc(obj.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == TaintToBeDeleted
		})
	}
	return encodeNode(info, nil, nil)
}

// primaryNodeIPs picks the node's primary IPs from its addresses as
// upstream's GetNodeHostIPs (pkg/util/node) does: InternalIPs, then
// ExternalIPs, each parsed sloppily (leading zeros are decimal); the first
// of them, then the first of the other family. kube-proxy takes them as
// its node IPs (for nodePortAddresses "primary" and for the node's own
// traffic past source ranges) unless --bind-address overrides one.
func primaryNodeIPs(addrs []corev1.NodeAddress) []string {
	var first netip.Addr
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range addrs {
			if a.Type != typ {
				continue
			}
			ip, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(a.Address))
			if !ok {
				continue
			}
			ip = ip.Unmap()
			switch {
			case !first.IsValid():
				first = ip
			case ip.Is4() != first.Is4():
				return []string{first.String(), ip.String()}
			}
		}
	}
	if !first.IsValid() {
		return nil
	}
	return []string{first.String()}
}

// WithServiceCIDRs returns the node carrying the cluster's service CIDRs
// c instead of its own. The CIDRs are cluster-wide, but NodeInfo is where
// the table's non-Service facts travel: a change of them changes every
// node's hash, so each agent gets a delta with its node and no entries.
func (n *Node) WithServiceCIDRs(c *ServiceCIDRs) *Node { return n.WithCluster(c, n.cp) }

// ServiceCIDRs returns the service CIDRs the node carries.
func (n *Node) ServiceCIDRs() *ServiceCIDRs { return n.cidrs }

// WithControlPlaneAddresses returns the node carrying the control plane
// addresses a instead of its own. Like the service CIDRs they are
// cluster-wide and travel in NodeInfo, so a change reaches every agent.
func (n *Node) WithControlPlaneAddresses(a *ControlPlaneAddresses) *Node {
	return n.WithCluster(n.cidrs, a)
}

// WithCluster returns the node carrying both cluster-wide facts, the
// service CIDRs c and the control plane addresses a, encoded once: the
// store sets both on every node it rebuilds.
func (n *Node) WithCluster(c *ServiceCIDRs, a *ControlPlaneAddresses) *Node {
	if n.cidrs.Equal(c) && n.cp.Equal(a) {
		return n
	}
	return encodeNode(n.info, c, a)
}

// ControlPlaneAddresses returns the control plane addresses the node
// carries.
func (n *Node) ControlPlaneAddresses() *ControlPlaneAddresses { return n.cp }

// IPs returns the node's primary IPs as its NodeInfo carries them
// (node_ips, at most one per family): those an agent without
// --bind-address takes for the node's own. None for a nil node.
func (n *Node) IPs() []netip.Addr {
	if n == nil || n.info == nil {
		return nil
	}
	var out []netip.Addr
	for _, s := range n.info.GetNodeIps() {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// encodeNode encodes info, without hash, service CIDRs or control plane
// addresses, with c and a; the hash covers every other field, so a field
// added to NodeInfo is hashed as soon as it is set
// (TestNodeHashCoversNodeInfo).
func encodeNode(info *pb.NodeInfo, c *ServiceCIDRs, a *ControlPlaneAddresses) *Node {
	full := proto.CloneOf(info)
	full.ServiceCidrs = c.List()
	full.ControlPlaneAddresses = a.List()
	full.Hash = xxhash.Sum64(mustMarshal(full))
	return &Node{Name: info.Name, Zone: info.Zone, Hash: full.Hash, Bytes: mustMarshal(full), info: info, cidrs: c, cp: a}
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
