// Command nodeagent is proxyplane's node agent: it receives its node's
// proxy table from the control plane, caches it, programs the kernel and
// acknowledges each version.
//
//	nodeagent --control-plane=HOST:PORT [flags]   run the agent
//	nodeagent show-cache [--state-dir=DIR]        print the cached table
//	nodeagent --cleanup                           remove every rule it programs
//	nodeagent --init-only [--config=FILE]         set the conntrack sysctls
//	nodeagent --version                           print the version
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/internal/cli"
	"github.com/proxyplane/proxyplane/internal/memlimit"
	"github.com/proxyplane/proxyplane/nodeagent/app"
)

func main() {
	o := app.NewOptions()
	args := os.Args[1:]
	showCache := len(args) > 0 && args[0] == "show-cache"
	if showCache {
		args = args[1:]
	}
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	o.AddFlags(fs)
	if exit, code := cli.Parse(fs, args, app.BuildVersion(), os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	if showCache {
		if err := app.ShowCache(os.Stdout, o.CachePath()); err != nil {
			fmt.Fprintf(os.Stderr, "nodeagent show-cache: %v\n", err)
			os.Exit(1)
		}
		return
	}
	loaded, err := o.Complete(fs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodeagent: %v\n", err)
		os.Exit(1)
	}
	if err := o.Validate(); err != nil {
		os.Exit(cli.Usage(fs, os.Stderr, fmt.Errorf("invalid flags:\n%w", err)))
	}
	log := o.Logging.Logger(os.Stderr)
	loaded.Log(log)
	memlimit.Set(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.InitOnly {
		if err := app.InitOnly(ctx, o, log); err != nil {
			log.Error("init failed", "err", err)
			os.Exit(1)
		}
		return
	}
	if o.Cleanup {
		if err := app.Cleanup(ctx, o, log); err != nil {
			log.Error("cleanup failed", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := app.Run(ctx, o, log); err != nil {
		log.Error("node agent failed", "err", err)
		os.Exit(1)
	}
}
