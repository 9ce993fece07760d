package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// checkIPVSFamily looks for the "IPVS" generic netlink family, which the
// ip_vs module registers. Families are global, not per namespace, and the
// lookup needs no privilege. github.com/moby/ipvs cannot be asked instead:
// without the family it sends its requests with family 0, which the kernel
// answers as a no-op, so every call "succeeds" (moby/ipvs#27).
func checkIPVSFamily() error {
	_, err := netlink.GenlFamilyGet("IPVS")
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: generic netlink family \"IPVS\" not found", ErrNoIPVS)
	}
	return fmt.Errorf("looking up the IPVS generic netlink family: %w", err)
}

// mobyKernel is ipvsKernel over github.com/moby/ipvs.
type mobyKernel struct {
	h *mobyipvs.Handle
}

// newMobyKernel opens an IPVS handle in the namespace at path ("" for our
// own). Only call it once checkIPVSFamily succeeded.
func newMobyKernel(path string) (*mobyKernel, error) {
	h, err := mobyipvs.New(path)
	if err != nil {
		return nil, fmt.Errorf("opening an IPVS handle: %w", err)
	}
	return &mobyKernel{h: h}, nil
}

// IPVS service flags (include/uapi/linux/ip_vs.h).
const (
	flagPersistent = 0x1
)

func toMobyService(vs VirtualServer) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address:   net.IP(vs.Addr.AsSlice()),
		Protocol:  uint16(vs.Protocol),
		Port:      vs.Port,
		SchedName: vs.Scheduler,
		Timeout:   vs.Timeout,
	}
	// The netmask groups clients for persistence: one client address per
	// group, as kube-proxy sets it.
	if vs.Addr.Is4() {
		s.AddressFamily, s.Netmask = unix.AF_INET, 0xffffffff
	} else {
		s.AddressFamily, s.Netmask = unix.AF_INET6, 128
	}
	if vs.Persistent {
		s.Flags |= flagPersistent
	}
	return s
}

func toMobyDest(rs RealServer) *mobyipvs.Destination {
	d := &mobyipvs.Destination{
		Address:         net.IP(rs.Addr.AsSlice()),
		Port:            rs.Port,
		Weight:          rs.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
	}
	d.AddressFamily = unix.AF_INET
	if rs.Addr.Is6() {
		d.AddressFamily = unix.AF_INET6
	}
	return d
}

func addrFromIP(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// VirtualServers implements ipvsKernel.
func (k *mobyKernel) VirtualServers() ([]VirtualServer, error) {
	svcs, err := k.h.GetServices()
	if err != nil {
		return nil, err
	}
	out := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		a, ok := addrFromIP(s.Address)
		if s.FWMark != 0 || !ok {
			continue
		}
		out = append(out, VirtualServer{
			Addr: a, Protocol: Protocol(s.Protocol), Port: s.Port,
			Scheduler: s.SchedName, Persistent: s.Flags&flagPersistent != 0, Timeout: s.Timeout,
		})
	}
	return out, nil
}

// AddVirtualServer implements ipvsKernel.
func (k *mobyKernel) AddVirtualServer(vs VirtualServer) error {
	return k.h.NewService(toMobyService(vs))
}

// UpdateVirtualServer implements ipvsKernel.
func (k *mobyKernel) UpdateVirtualServer(vs VirtualServer) error {
	return k.h.UpdateService(toMobyService(vs))
}

// DeleteVirtualServer implements ipvsKernel.
func (k *mobyKernel) DeleteVirtualServer(vs VirtualServer) error {
	return k.h.DelService(toMobyService(vs))
}

// RealServers implements ipvsKernel.
func (k *mobyKernel) RealServers(vs VirtualServer) ([]RealServer, error) {
	ds, err := k.h.GetDestinations(toMobyService(vs))
	if err != nil {
		return nil, err
	}
	out := make([]RealServer, 0, len(ds))
	for _, d := range ds {
		a, ok := addrFromIP(d.Address)
		if !ok {
			continue
		}
		out = append(out, RealServer{Addr: a, Port: d.Port, Weight: d.Weight, ActiveConns: d.ActiveConnections, InactiveConns: d.InactiveConnections})
	}
	return out, nil
}

// AddRealServer implements ipvsKernel.
func (k *mobyKernel) AddRealServer(vs VirtualServer, rs RealServer) error {
	return k.h.NewDestination(toMobyService(vs), toMobyDest(rs))
}

// UpdateRealServer implements ipvsKernel.
func (k *mobyKernel) UpdateRealServer(vs VirtualServer, rs RealServer) error {
	return k.h.UpdateDestination(toMobyService(vs), toMobyDest(rs))
}

// DeleteRealServer implements ipvsKernel.
func (k *mobyKernel) DeleteRealServer(vs VirtualServer, rs RealServer) error {
	return k.h.DelDestination(toMobyService(vs), toMobyDest(rs))
}

// SetTimeouts implements ipvsKernel.
func (k *mobyKernel) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	return k.h.SetConfig(&mobyipvs.Config{TimeoutTCP: tcp, TimeoutTCPFin: tcpFin, TimeoutUDP: udp})
}

// netlinkLinks is linkKernel over github.com/vishvananda/netlink.
type netlinkLinks struct {
	h *netlink.Handle
}

// newNetlinkLinks opens a route netlink handle in the namespace at path
// ("" for our own).
func newNetlinkLinks(ns string) (*netlinkLinks, error) {
	if ns == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, fmt.Errorf("opening a netlink handle: %w", err)
		}
		return &netlinkLinks{h: h}, nil
	}
	nsh, err := netns.GetFromPath(ns)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", ns, err)
	}
	defer func() { _ = nsh.Close() }()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink handle in %s: %w", ns, err)
	}
	return &netlinkLinks{h: h}, nil
}

func nlFamily(f dataplane.Family) int {
	if f == dataplane.IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// EnsureLink implements linkKernel. The link is set up, unlike
// kube-proxy's kube-ipvs0: an IPv6 address on a down link stays tentative
// and gets no local route, so IPv6 service addresses would not be local.
// A dummy link has NOARP, so being up makes it answer nothing new.
func (l *netlinkLinks) EnsureLink(name string) error {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("creating %s: %w: %w", name, ErrNoDummyLink, err)
			}
			return fmt.Errorf("creating dummy link %s: %w", name, err)
		}
		if link, err = l.h.LinkByName(name); err != nil {
			return fmt.Errorf("finding %s after creating it: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if link.Type() != "dummy" {
		// Every address on it is ours to delete: refuse someone else's.
		return fmt.Errorf("link %s exists and is a %s, not a dummy link", name, link.Type())
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := l.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("setting %s up: %w", name, err)
		}
	}
	return nil
}

// LinkAddrs implements linkKernel.
func (l *netlinkLinks) LinkAddrs(name string, family dataplane.Family) ([]netip.Addr, error) {
	link, err := l.h.LinkByName(name)
	var missing netlink.LinkNotFoundError
	if errors.As(err, &missing) {
		return nil, nil // a link that is not there holds no address
	}
	if err != nil {
		return nil, fmt.Errorf("finding link %s: %w", name, err)
	}
	addrs, err := l.h.AddrList(link, nlFamily(family))
	if err != nil {
		return nil, fmt.Errorf("listing addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := addrFromIP(a.IP); ok {
			out = append(out, ip)
		}
	}
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: netlink.NewIPNet(net.IP(a.AsSlice()))}
	if a.Is6() {
		// No duplicate address detection: the address is for local
		// delivery only and must be usable at once.
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

// AddAddr implements linkKernel.
func (l *netlinkLinks) AddAddr(name string, a netip.Addr) error {
	link, err := l.h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if err := l.h.AddrAdd(link, hostAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// DelAddr implements linkKernel.
func (l *netlinkLinks) DelAddr(name string, a netip.Addr) error {
	link, err := l.h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if err := l.h.AddrDel(link, hostAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENXIO) {
		return err
	}
	return nil
}

// NodeAddrs implements linkKernel.
func (l *netlinkLinks) NodeAddrs(except string, family dataplane.Family) ([]netip.Addr, error) {
	skip := -1
	if link, err := l.h.LinkByName(except); err == nil {
		skip = link.Attrs().Index
	}
	addrs, err := l.h.AddrList(nil, nlFamily(family))
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.LinkIndex == skip {
			continue
		}
		if ip, ok := addrFromIP(a.IP); ok && family.Has(ip) && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out, nil
}

// procSysctl is sysctlKernel over /proc/sys, read in the namespace at
// path ns when set: /proc/sys/net shows the namespace of the thread that
// opens it.
type procSysctl struct {
	ns string
}

// ReadInt implements sysctlKernel.
func (p procSysctl) ReadInt(name string) (int, error) {
	var v int
	err := inNetNS(p.ns, func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		if err != nil {
			return err
		}
		v, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return v, err
}

// inNetNS runs f on a thread in the namespace at path ns ("" runs it
// here). If the
// thread cannot be switched back it stays locked, so the Go runtime
// discards it rather than reusing it in the wrong namespace.
func inNetNS(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	target, err := netns.GetFromPath(ns)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", ns, err)
	}
	defer func() { _ = target.Close() }()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- fmt.Errorf("getting the current network namespace: %w", err)
			return
		}
		defer func() { _ = orig.Close() }()
		if err := netns.Set(target); err != nil {
			done <- fmt.Errorf("entering network namespace %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
