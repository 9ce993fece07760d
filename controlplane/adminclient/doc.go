// Package adminclient is what the control plane's admin commands
// (`controlplane status`, `controlplane explain`) share: the flags that
// say how to reach and trust the replicas and how to print (Options),
// the gRPC dial options they make, and the escaping that keeps what
// agents and replicas report from changing what a terminal shows (Cell,
// EscapeJSON). Each command registers Options' flags beside its own.
package adminclient
