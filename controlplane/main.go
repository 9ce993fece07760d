// Command controlplane is proxyplane's control plane: it watches Services,
// EndpointSlices and Nodes once and serves each node agent its proxy table
// over gRPC.
//
//	controlplane [flags]                     run the control plane
//	controlplane status --server=HOST:PORT   print every node's sync state (controlplane status --help)
//	controlplane explain --server=HOST:PORT --node=N --service=NS/NAME
//	                                         what node N programs for a Service, and why (controlplane explain --help)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/app"
	"github.com/proxyplane/proxyplane/controlplane/explain"
	"github.com/proxyplane/proxyplane/controlplane/status"
	"github.com/proxyplane/proxyplane/internal/cli"
	"github.com/proxyplane/proxyplane/internal/memlimit"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "status" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := status.Main(ctx, os.Args[2:], cli.Version(""), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	if len(os.Args) > 1 && os.Args[1] == "explain" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := explain.Main(ctx, os.Args[2:], cli.Version(""), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	o := app.NewOptions()
	fs := pflag.NewFlagSet("controlplane", pflag.ContinueOnError)
	o.AddFlags(fs)
	if exit, code := cli.Parse(fs, os.Args[1:], cli.Version(""), os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	if err := o.Complete(fs); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
	if err := o.Validate(); err != nil {
		os.Exit(cli.Usage(fs, os.Stderr, fmt.Errorf("invalid flags:\n%w", err)))
	}
	log := o.Logging.Logger(os.Stderr)
	memlimit.Set(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, o, log); err != nil {
		log.Error("control plane failed", "err", err)
		os.Exit(1)
	}
}
