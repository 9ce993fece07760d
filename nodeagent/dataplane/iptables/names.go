package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// commentText returns s fit to stand in a rule comment of
// iptables-restore input, quoted or not: bytes outside the characters of
// Kubernetes names and their separators ([A-Za-z0-9._:/-]) become %XX, so
// no quote, backslash, space or line break of a hostile name can end the
// argument or the line and add a rule. proxytable refuses such names
// before they get here; this holds even if it did not. The mapping is
// injective ("%" is escaped too), so distinct names stay distinct where
// they are hashed into chain names, and the identity on every valid name,
// so valid names render as kube-proxy renders them.
func commentText(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !commentSafe(r) }) < 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c < 0x80 && commentSafe(rune(c)) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

func commentSafe(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == ':' || r == '/' || r == '-'
}

// Top-level chains. Every chain proxyplane owns starts with "PP-", so it
// never touches kube-proxy's KUBE-* chains (a node being migrated may run
// both for a while) and stale-chain pruning can recognise its own.
const (
	// chainServices (nat) dispatches ClusterIP, external IP and load
	// balancer traffic to per-service chains and ends with the NodePort
	// jump; (filter) rejects or drops ClusterIP traffic of services
	// without usable endpoints.
	chainServices = "PP-SERVICES"
	// chainNodePorts (nat) dispatches NodePort traffic; (filter) accepts
	// healthCheckNodePorts.
	chainNodePorts = "PP-NODEPORTS"
	// chainPostrouting (nat) masquerades marked packets.
	chainPostrouting = "PP-POSTROUTING"
	// chainMarkMasq (nat) sets the masquerade bit.
	chainMarkMasq = "PP-MARK-MASQ"
	// chainExternalServices (filter) rejects or drops traffic to external
	// addresses (external IPs, load balancer IPs, NodePorts) that has no
	// endpoint to go to.
	chainExternalServices = "PP-EXTERNAL-SERVICES"
	// chainForward (filter) accepts forwarded service traffic even under
	// a DROP FORWARD policy.
	chainForward = "PP-FORWARD"
	// chainFirewall (filter) drops load balancer traffic that a PP-FW-
	// chain did not let through.
	chainFirewall = "PP-FIREWALL"
	// chainLocalnet (filter) drops martian packets to 127.0.0.0/8 that
	// route_localnet lets in; only with localhost NodePorts.
	chainLocalnet = "PP-LOCALNET"
)

// Prefixes of per-service-port and per-endpoint chains, all in the nat
// table. The suffix is a hash (see portHash), so names fit iptables'
// 28-character limit and stay the same across restarts and replicas.
const (
	prefixSvc = "PP-SVC-" // Cluster-policy endpoints of a service port
	prefixSvl = "PP-SVL-" // Local-policy endpoints of a service port
	prefixExt = "PP-EXT-" // external traffic: eTP handling, masquerade
	prefixFw  = "PP-FW-"  // loadBalancerSourceRanges
	prefixSep = "PP-SEP-" // one endpoint: DNAT, hairpin masquerade, affinity
)

// isServiceChain reports whether name is a per-service or per-endpoint
// chain, the only chains full syncs may delete.
func isServiceChain(name string) bool {
	for _, p := range [...]string{prefixSvc, prefixSvl, prefixExt, prefixFw, prefixSep} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// portHash returns the first 16 characters of the base32 SHA-256 of its
// arguments concatenated. The input is exactly kube-proxy's (the service
// port name "ns/name" or "ns/name:port", the lower-case protocol and, for an
// endpoint chain, "ip:port"), so PP-SVC-X names the same service port as
// kube-proxy's KUBE-SVC-X, which helps operators compare the two. The
// family is not hashed: IPv4 and IPv6 chains live in different tables.
func portHash(parts ...string) string { return chainName("", parts...) }

// chainName returns prefix followed by portHash(parts...), allocating
// only the result: it runs for every endpoint at every full sync.
func chainName(prefix string, parts ...string) string {
	var in [256]byte // grows onto the heap only for very long names
	b := in[:0]
	for _, p := range parts {
		b = append(b, p...)
	}
	sum := sha256.Sum256(b)
	var enc [56]byte // base32 of 32 bytes
	base32.StdEncoding.Encode(enc[:], sum[:])
	var out [64]byte
	return string(append(append(out[:0], prefix...), enc[:16]...))
}
