// Command controlplane is proxyplane's control plane: it watches Services,
// EndpointSlices and Nodes once and serves each node agent its proxy table
// over gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/app"
)

func main() {
	o := app.NewOptions()
	fs := pflag.NewFlagSet("controlplane", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: invalid flags:\n%v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: o.Level()}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, o, log); err != nil {
		log.Error("control plane failed", "err", err)
		os.Exit(1)
	}
}
