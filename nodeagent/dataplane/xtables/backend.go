package xtables

import (
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Backend names the iptables implementation: the legacy x_tables kernel
// API or the nf_tables one behind iptables-nft. Both can be loaded at once
// and both apply to every packet, so a dataplane must write to the one the
// rest of the node uses.
type Backend string

const (
	// BackendAuto detects the backend the node already uses (see
	// DetectBackend).
	BackendAuto Backend = "auto"
	// BackendNFT uses iptables-nft-restore and friends.
	BackendNFT Backend = "nft"
	// BackendLegacy uses iptables-legacy-restore and friends.
	BackendLegacy Backend = "legacy"
)

// DefaultLockWait bounds how long legacy iptables waits for the xtables
// lock (/run/xtables.lock, shared by every namespace on the host): long
// enough to ride out another writer's restore, short enough that a stuck
// holder turns into a reported error and a retried sync.
const DefaultLockWait = 5 * time.Second

// Binaries names the tools of one family and backend.
type Binaries struct {
	Restore, Save, IPTables string
}

// BinariesOf returns the tool names of family and backend (nft or
// legacy): the explicitly flavoured ones (iptables-nft-restore,
// ip6tables-legacy-save...), which Debian, Ubuntu, Fedora and the
// iptables-wrapper images all install, so that the plain names'
// alternatives setting cannot send the rules to the wrong backend.
func BinariesOf(family dataplane.Family, backend Backend) Binaries {
	base := "iptables"
	if family == dataplane.IPv6 {
		base = "ip6tables"
	}
	flavour := base + "-" + string(backend)
	return Binaries{Restore: flavour + "-restore", Save: flavour + "-save", IPTables: flavour}
}

// AllBinaries returns every binary a runner may execute, for both families and
// both backends: what an image must ship.
func AllBinaries() []string {
	var out []string
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		for _, b := range []Backend{BackendNFT, BackendLegacy} {
			bin := BinariesOf(f, b)
			out = append(out, bin.Restore, bin.Save, bin.IPTables)
		}
	}
	return out
}
