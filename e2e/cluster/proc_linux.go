package cluster

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill e2e-apiserver if the test
// process dies without running its cleanups (a test timeout panics, say),
// so no API server outlives the run holding its ports. Its own process
// group keeps a terminal's Ctrl-C (SIGINT to the foreground group) for
// the process that started it, which stops it in order.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
