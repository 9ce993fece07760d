package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Protocol is a virtual server's transport protocol, as IPVS numbers it
// (the IP protocol number).
type Protocol uint16

// The protocols a Service port can have.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

// String returns "TCP", "UDP" or "SCTP".
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return "proto-" + strconv.Itoa(int(p))
}

// lower returns the protocol as ipset and iptables spell it.
func (p Protocol) lower() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// vsKey identifies a virtual server: what IPVS looks it up by.
type vsKey struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

// String is "TCP 10.96.0.10:80" (brackets around IPv6), as ipvsadm -Ln.
func (k vsKey) String() string {
	return k.proto.String() + " " + netip.AddrPortFrom(k.addr, k.port).String()
}

// compare orders keys by address, protocol, then port.
func (k vsKey) compare(o vsKey) int {
	if c := k.addr.Compare(o.addr); c != 0 {
		return c
	}
	if k.proto != o.proto {
		return int(k.proto) - int(o.proto)
	}
	return int(k.port) - int(o.port)
}

// VirtualServer is an IPVS virtual server (an "IPVS service"): an address,
// protocol and port that IPVS takes connections for.
type VirtualServer struct {
	Addr     netip.Addr
	Protocol Protocol
	Port     uint16
	// Scheduler is the scheduling algorithm ("rr", "wlc"...).
	Scheduler string
	// Persistent sends a client to the same real server for Timeout
	// seconds after its last connection ended: ClientIP session affinity.
	Persistent bool
	// Timeout is the persistence timeout in seconds.
	Timeout uint32
}

func (v *VirtualServer) key() vsKey { return vsKey{v.Addr, v.Protocol, v.Port} }

// RealServer is an IPVS real server ("destination") of a virtual server:
// one endpoint, reached by NAT (masquerading forwarding).
type RealServer struct {
	Addr netip.Addr
	Port uint16
	// Weight 0 takes no new connections: a real server being drained.
	Weight int
	// ActiveConns and InactiveConns are the kernel's connection counts,
	// read only (ipvsadm's ActiveConn and InActConn).
	ActiveConns, InactiveConns int
}

func (r *RealServer) addrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

// ipvsKernel is the IPVS table of one network namespace: virtual and real
// server CRUD as github.com/moby/ipvs's Handle offers it. Each call is one
// netlink request, atomic on its own. Not safe for concurrent use; the
// Dataplane's sync loop is its only caller.
type ipvsKernel interface {
	// VirtualServers lists every virtual server of both families, except
	// firewall-mark ones (which have no address and are never ours).
	VirtualServers() ([]VirtualServer, error)
	// AddVirtualServer creates vs; it fails (EEXIST) if it exists.
	AddVirtualServer(vs VirtualServer) error
	// UpdateVirtualServer changes vs's scheduler and persistence.
	UpdateVirtualServer(vs VirtualServer) error
	// DeleteVirtualServer deletes vs with its real servers and
	// connections.
	DeleteVirtualServer(vs VirtualServer) error
	// RealServers lists vs's real servers with their connection counts.
	RealServers(vs VirtualServer) ([]RealServer, error)
	// AddRealServer adds rs to vs; it fails (EEXIST) if it exists.
	AddRealServer(vs VirtualServer, rs RealServer) error
	// UpdateRealServer sets rs's weight.
	UpdateRealServer(vs VirtualServer, rs RealServer) error
	// DeleteRealServer removes rs from vs.
	DeleteRealServer(vs VirtualServer, rs RealServer) error
	// SetTimeouts sets the TCP, TCP FIN and UDP connection timeouts; 0
	// leaves one unchanged. Idempotent.
	SetTimeouts(tcp, tcpFin, udp time.Duration) error
}

// linkKernel manages the dummy link holding the service addresses, and
// lists the node's own addresses. Not safe for concurrent use.
type linkKernel interface {
	// EnsureLink creates the dummy link name unless it exists, and sets it
	// up. Idempotent. ErrNoDummyLink (wrapped) when the kernel has no
	// dummy link type.
	EnsureLink(name string) error
	// LinkAddrs lists the addresses of family on link name; none when the
	// link does not exist.
	LinkAddrs(name string, family dataplane.Family) ([]netip.Addr, error)
	// AddAddr binds a as a host address (/32 or /128) to link name.
	// Idempotent: an address already bound is not an error.
	AddAddr(name string, a netip.Addr) error
	// DelAddr removes a from link name. Idempotent.
	DelAddr(name string, a netip.Addr) error
	// NodeAddrs lists the node's addresses of family on every link but
	// except, without loopback and link-local ones: where NodePorts
	// answer.
	NodeAddrs(except string, family dataplane.Family) ([]netip.Addr, error)
}

// sysctlKernel reads /proc/sys values. It never writes them: the agent's
// /proc/sys is read-only (see Sysctls). Not safe for concurrent use.
type sysctlKernel interface {
	// ReadInt returns the integer in name, relative to /proc/sys
	// ("net/ipv4/vs/conntrack").
	ReadInt(name string) (int, error)
}

// ipsetRunner runs the ipset tool. Not safe for concurrent use.
type ipsetRunner interface {
	// Restore feeds data to `ipset restore`. Lines before a refused one
	// are applied (ipset restore is not atomic). A refused input is a
	// *xtables.RestoreError carrying the reported line.
	Restore(ctx context.Context, data []byte) error
	// Save returns `ipset save` output: every set and its members.
	Save(ctx context.Context) ([]byte, error)
}

// familyChecker returns nil when the kernel has IPVS, an error wrapping
// ErrNoIPVS when it has not, and another error when it cannot tell.
type familyChecker func() error

// kernelOp wraps err from op on object for key as a *KernelError.
func kernelOp(op, object, key string, err error) error {
	if err == nil {
		return nil
	}
	return &KernelError{Op: op, Object: object, Key: key, Err: err}
}

// describeRS names a real server of a virtual server for errors.
func describeRS(vs vsKey, rs netip.AddrPort) string {
	return fmt.Sprintf("%s -> %s", vs, rs)
}
