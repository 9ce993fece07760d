// Command pause is the pod sandbox's process, shipped as the pause image
// (`make images`) for runtimes that cannot pull registry.k8s.io/pause: it
// holds the pod's namespaces open and does nothing else. As upstream's
// pause.c it exits 0 on SIGINT and SIGTERM and, running as the pod's PID 1
// when the pod shares its process namespace, reaps the orphans it
// inherits.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is what -v prints, as upstream's pause does.
const version = "proxyplane-pause"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println(version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: shutting down, got signal: %v\n", s)
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child: SIGCHLD coalesces, so one signal may
// stand for several.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
