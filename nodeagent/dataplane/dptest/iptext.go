package dptest

import (
	"net/netip"
	"strings"
)

// These read iptables rule text as the fakes hold it: a restore line
// without its "-A CHAIN" prefix.

// Tokenize splits rule text on spaces, keeping double-quoted strings
// (without their quotes) whole.
func Tokenize(s string) []string {
	var out []string
	var cur strings.Builder
	in, has := false, false
	for _, r := range s {
		switch {
		case r == '"':
			in, has = !in, true
		case r == ' ' && !in:
			if has || cur.Len() > 0 {
				out = append(out, cur.String())
			}
			cur.Reset()
			has = false
		default:
			cur.WriteRune(r)
		}
	}
	if has || cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// RuleTarget returns the -j target of rule text.
func RuleTarget(rule string) string {
	args := Tokenize(rule)
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" {
			return args[i+1]
		}
	}
	return ""
}

// QuoteArgs double-quotes the arguments holding a space, as they appear
// in rule text.
func QuoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsRune(a, ' ') {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return out
}

// PrefixOf parses an address match: a CIDR, or an address as its host
// prefix.
func PrefixOf(s string) netip.Prefix {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p
	}
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}
