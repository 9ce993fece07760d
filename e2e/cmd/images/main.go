// Command images builds proxyplane's container images without a registry
// or a container engine (`make images`, as root): the control plane and the
// node agent, as deploy/ names them, and the e2e backend and pause (pod
// sandbox) images the box's pods run. Each is written as a docker-archive
// tarball, OUT/NAME.tar, which `ctr -n k8s.io images import` loads (and
// `docker load`, `podman load`, `skopeo copy docker-archive:` read).
//
//   - nodeagent: a Debian root filesystem of the packages the agent
//     executes (mmdebstrap, --agent-packages; cached under OUT/cache) plus
//     /usr/local/bin/nodeagent, run as root, as deploy/Dockerfile.nodeagent
//     builds it;
//   - controlplane, backend, pause: one static binary on a base of
//     /etc/passwd, /etc/group, /tmp and the nonroot user's home, as
//     distroless' static image, run as nonroot (65532; pause as 65535,
//     upstream's).
//
// The binaries are built beforehand (static: CGO_ENABLED=0) into
// --bin-dir. Every file and the image configs carry --epoch (the commit's
// time, as SOURCE_DATE_EPOCH), so that the same commit, Debian packages and
// Go toolchain give the same image digests.
//
// It is a module of its own so that go-containerregistry and its
// dependencies stay out of proxyplane's and the e2e tests'.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

func main() {
	o := options{
		out:      ".bin/images",
		registry: "ghcr.io/proxyplane",
		tag:      "dev",
		arch:     runtime.GOARCH,
		suite:    "bookworm",
		mirror:   "http://deb.debian.org/debian",
	}
	if e, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		o.epoch = e
	}
	var packages string
	fs := pflag.NewFlagSet("images", pflag.ContinueOnError)
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding the static controlplane, nodeagent, backend and pause binaries (required)")
	fs.StringVar(&o.out, "out", o.out, "directory to write NAME.tar to; its cache/ keeps the agent's root filesystem")
	fs.StringVar(&o.registry, "registry", o.registry, "repository prefix of the image names")
	fs.StringVar(&o.tag, "tag", o.tag, "tag of every image")
	fs.StringVar(&o.arch, "arch", o.arch, "architecture: the binaries' and the Debian packages'")
	fs.Int64Var(&o.epoch, "epoch", o.epoch, "time of every file and image, in seconds since 1970 (default $SOURCE_DATE_EPOCH, else 0)")
	fs.StringVar(&packages, "agent-packages", "", "Debian packages of the agent's root filesystem, separated by spaces or commas (required unless --agent-rootfs)")
	fs.StringVar(&o.suite, "suite", o.suite, "Debian release of the agent's root filesystem")
	fs.StringVar(&o.mirror, "mirror", o.mirror, "Debian mirror")
	fs.StringVar(&o.rootfs, "agent-rootfs", "", "a root filesystem tarball to use for the agent instead of building one with mmdebstrap")
	fs.BoolVar(&o.refresh, "refresh", false, "rebuild the agent's root filesystem even when cached (to pick up Debian's updates)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	o.packages = strings.FieldsFunc(packages, func(r rune) bool { return r == ',' || r == ' ' })
	if err := o.validate(); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	built, err := build(ctx, &o, os.Stderr)
	if err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
	report(os.Stdout, built)
	fmt.Printf("built in %.1f s; load with: for f in %s/*.tar; do ctr -n k8s.io images import \"$f\"; done\n",
		time.Since(start).Seconds(), o.out)
}
