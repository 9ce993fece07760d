package cluster

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill e2e-apiserver if the test
// process dies without running its cleanups (a test timeout panics, say),
// so no API server outlives the run holding its ports.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
