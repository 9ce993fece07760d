// Package failpoint kills a proxyplane process (the node agent or the
// control plane) at a named point of its work, for fault-injection tests:
// with PROXYPLANE_FAILPOINT=<name> in its environment, the process sends
// itself SIGKILL when it reaches that point, as a machine losing power
// would stop it. Without the variable (in production) Hit compares two
// strings and returns.
package failpoint

import (
	"os"
	"syscall"
)

// Env is the environment variable that arms a failpoint.
const Env = "PROXYPLANE_FAILPOINT"

// The node agent's points, in the order a table response meets them.
const (
	// AfterPersist is after a response's table was written to the cache,
	// before it is programmed.
	AfterPersist = "after-persist"
	// AfterProgram is after it was programmed, before the ACK is sent.
	AfterProgram = "after-program"
	// BeforeAck is as the ACK is about to be sent.
	BeforeAck = "before-ack"
	// MidSweep is after the agent, its own mode in force, removed the
	// first of the rules another mode left, before the rest.
	MidSweep = "mid-sweep"
)

// armed is read once: a failpoint is chosen when the process starts.
var armed = os.Getenv(Env)

// Hit kills the process if the failpoint name is armed; it does not
// return then.
func Hit(name string) {
	if armed == "" || armed != name {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// The control plane's point.
const (
	// AfterSend is after a table response was handed to an agent's
	// stream, before its ACK or NACK is read: the replica dies mid-stream.
	AfterSend = "after-send"
)
