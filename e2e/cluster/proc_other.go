//go:build !linux

package cluster

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; Cleanup still stops the process on a normal test exit.
func setParentDeathSignal(*exec.Cmd) {}
