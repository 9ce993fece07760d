package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"
)

// Shared chains, maps and sets. The table is ours alone, so the names
// carry no prefix; they are kube-proxy's nftables names where the object
// does the same job, so that operators read both alike.
const (
	chainFilterPrerouting    = "filter-prerouting"
	chainFilterInput         = "filter-input"
	chainFilterForward       = "filter-forward"
	chainFilterOutput        = "filter-output"
	chainFilterOutputPost    = "filter-output-post-dnat"
	chainNATPrerouting       = "nat-prerouting"
	chainNATOutput           = "nat-output"
	chainNATPostrouting      = "nat-postrouting"
	chainServices            = "services"
	chainMasquerading        = "masquerading"
	chainMarkMasq            = "mark-for-masquerade"
	chainServiceEndpoints    = "service-endpoints-check"
	chainNodePortEndpoints   = "nodeport-endpoints-check"
	chainReject              = "reject-chain"
	chainFirewallCheck       = "firewall-check"
	chainClusterIPsCheck     = "cluster-ips-check"
	mapServiceIPs            = "service-ips"
	mapServiceNodePorts      = "service-nodeports"
	mapNoEndpointServices    = "no-endpoint-services"
	mapNoEndpointNodePorts   = "no-endpoint-nodeports"
	mapFirewallIPs           = "firewall-ips"
	setClusterIPs            = "cluster-ips"
	setHairpin               = "hairpin-connections"
	prefixClusterPolicyChain = "service-"
	prefixLocalPolicyChain   = "local-"
	prefixExternalChain      = "external-"
	prefixFirewallChain      = "firewall-"
	prefixEndpointChain      = "endpoint-"
	prefixAffinitySet        = "affinity-"
	prefixEndpointsMap       = "endpoints-"
	prefixLocalEndpointsMap  = "local-endpoints-"
)

// nameMax is the longest object name nf_tables takes (NFT_NAME_MAXLEN
// without its NUL); nameBaseMax leaves room for the longest prefix, 16
// characters ("local-endpoints-"), which TestNamePrefixesFit checks of
// every prefix* constant of this file.
const (
	nameMax     = 255
	nameBaseMax = nameMax - 16
)

// hashName prefixes name with 8 characters of its base32 SHA-256, as
// kube-proxy's nftables mode does: the hash keeps names unique if the
// readable part must be truncated and tells apart names that differ in one
// digit at a glance. Names are stable across restarts and replicas, so a
// full sync after a restart finds the same objects.
//
// The readable part keeps only the characters nft's identifiers take
// ([A-Za-z0-9_./-]); any other byte becomes "_". proxytable refuses names
// with such bytes before they get here; this holds even if it did not, so
// that no name can break a line of the nft script rendering (goldens,
// errors, the operator's view) or be cut short by a NUL in the kernel.
// The hash, of the name as given, keeps such names apart.
func hashName(name string) string {
	sum := sha256.Sum256([]byte(name))
	name = base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + identifierText(name)
	if len(name) > nameBaseMax {
		name = name[:nameBaseMax-3] + "..."
	}
	return name
}

// identifierText returns s with every byte outside [A-Za-z0-9_./-] made
// "_"; the identity on every name a valid table gives.
func identifierText(s string) string {
	safe := func(c byte) bool {
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-'
	}
	for i := range len(s) {
		if !safe(s[i]) {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if !safe(b[j]) {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return s
}

// portNameBase is the base of a service port's chain names,
// "HASH-ns/name/proto/port": kube-proxy's, so the same service port gets
// the same suffix in both. nf_tables identifiers take [A-Za-z0-9_./-],
// and "/" never occurs in a Kubernetes name, so the parts stay apart.
func portNameBase(key, proto, portName string) string {
	return hashName(key + "/" + proto + "/" + portName)
}

// endpointNameBase is the base of an endpoint chain's name,
// "HASH-ns/name/proto/port__ip/port", with an IPv6 address's colons made
// dots (a colon is not allowed in a name).
func endpointNameBase(key, proto, portName, ip string, port int32) string {
	return hashName(key + "/" + proto + "/" + portName + "__" + strings.ReplaceAll(ip, ":", ".") + "/" + strconv.Itoa(int(port)))
}

// affinityNameBase names an endpoint's affinity set. The timeout is part of
// the name: a Service whose timeout changes gets new sets (its chains are
// rewritten in the same transaction) rather than relying on the kernel to
// update a set's timeout in place, which older kernels refuse.
func affinityNameBase(key, proto, portName, ip string, port, timeout int32) string {
	return hashName(key + "/" + proto + "/" + portName + "__" + strings.ReplaceAll(ip, ":", ".") + "/" + strconv.Itoa(int(port)) +
		"/" + strconv.Itoa(int(timeout)) + "s")
}

// isServiceObject reports whether a chain or set name belongs to a
// Service: every such name holds a "/", no shared name does.
func isServiceObject(name string) bool { return strings.Contains(name, "/") }
