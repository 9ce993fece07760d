// Package xtables is what the iptables and IPVS dataplanes share of
// iptables: the choice between the legacy and nft backends (Backend,
// DetectBackend, and Tools, which detects once and then keeps the
// choice), one Runner of the iptables tools per family and backend (the
// real one behind NewRunners; tests put fakes in its place), the jumps
// that hook a dataplane's chains into the built-in ones, and the typed
// errors of all of it.
//
// What the rules say is each dataplane's own: this package never writes a
// rule of its own.
package xtables
