// Package scenarios holds proxyplane's end-to-end scenarios, run on one
// cluster in a box (package box) as root: a real API server with deploy/
// applied, two control plane replicas as deploy/'s ServiceAccount, an
// agent per node, real packets.
//
// The scenarios share the box and run in order, each leaving it as it
// found it (every process running, every node current): starting a box
// costs seconds, a scenario less. Each reports its figures in one line
// per figure, "e2e-figure: <name> key=value ...", for a person or a
// script to collect; no figure is asserted, only behaviour is.
package scenarios
