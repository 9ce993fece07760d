package main

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// options are the command's flags.
type options struct {
	binDir, out   string
	registry, tag string
	arch          string
	epoch         int64
	packages      []string
	suite, mirror string
	rootfs        string
	refresh       bool
}

func (o *options) validate() error {
	var errs []error
	if o.binDir == "" {
		errs = append(errs, errors.New("--bin-dir is required"))
	}
	if o.rootfs == "" && len(o.packages) == 0 {
		errs = append(errs, errors.New("--agent-packages is required (or --agent-rootfs)"))
	}
	if o.epoch < 0 {
		errs = append(errs, errors.New("--epoch must not be negative"))
	}
	if _, ok := elfMachines[o.arch]; !ok {
		errs = append(errs, fmt.Errorf("--arch %q: not one of amd64, arm64", o.arch))
	}
	return errors.Join(errs...)
}

// elfMachines maps the Go and Debian architecture names (the same for
// these) to the ELF machine of their binaries.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// Users of the images: nonroot as distroless', and the pause image's as
// upstream's (registry.k8s.io/pause runs as 65535).
const (
	nonroot = 65532
	pauseID = 65535
)

// spec describes one image.
type spec struct {
	// name is the repository's last element: REGISTRY/name:TAG.
	name string
	// binary is the file in --bin-dir, installed at path.
	binary, path string
	// debian says the image is the Debian root filesystem plus the
	// binary, rather than the static base.
	debian bool
	user   string
	ports  []string
	// why is the image's org.opencontainers.image.description.
	why string
}

// specs are the images built, in this order.
var specs = []spec{
	{
		name: "controlplane", binary: "controlplane", path: "/controlplane",
		user: fmt.Sprintf("%d:%d", nonroot, nonroot), ports: []string{"9640/tcp", "9641/tcp"},
		why: "proxyplane control plane",
	},
	{
		// Root: the DaemonSet grants NET_ADMIN and NET_RAW, which take
		// effect for root only, and the init container is privileged.
		name: "nodeagent", binary: "nodeagent", path: "/usr/local/bin/nodeagent", debian: true,
		ports: []string{"10256/tcp", "10249/tcp"},
		why:   "proxyplane node agent",
	},
	{
		name: "e2e-backend", binary: "backend", path: "/backend",
		user: fmt.Sprintf("%d:%d", nonroot, nonroot), ports: []string{"8080/tcp", "8080/udp", "8081/tcp"},
		why: "proxyplane e2e test backend (TCP, UDP and HTTP echo)",
	},
	{
		name: "pause", binary: "pause", path: "/pause",
		user: fmt.Sprintf("%d:%d", pauseID, pauseID),
		why:  "pod sandbox (pause) for proxyplane's e2e runtime",
	},
}

// built is an image written to a file.
type built struct {
	ref  name.Tag
	file string
	img  v1.Image
}

// build builds every image of specs into o.out, logging progress to log.
func build(ctx context.Context, o *options, log io.Writer) ([]built, error) {
	epoch := time.Unix(o.epoch, 0).UTC()
	for _, s := range specs {
		if err := checkStatic(filepath.Join(o.binDir, s.binary), elfMachines[o.arch]); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	rootfs := o.rootfs
	if rootfs == "" {
		var err error
		if rootfs, err = debianRootfs(ctx, rootfsSpec{
			suite: o.suite, mirror: o.mirror, arch: o.arch, packages: o.packages,
		}, filepath.Join(o.out, "cache"), o.refresh, log); err != nil {
			return nil, err
		}
	}
	debian, err := rootfsLayer(rootfs)
	if err != nil {
		return nil, err
	}
	base, err := staticBaseLayer(epoch)
	if err != nil {
		return nil, err
	}
	var out []built
	for _, s := range specs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ref, err := name.NewTag(o.registry + "/" + s.name + ":" + o.tag)
		if err != nil {
			return nil, fmt.Errorf("naming the %s image: %w", s.name, err)
		}
		bin, err := binaryLayer(filepath.Join(o.binDir, s.binary), s.path, epoch)
		if err != nil {
			return nil, err
		}
		first := addendum{base, "proxyplane static base: /etc/passwd, /etc/group, /tmp, /home/nonroot"}
		if s.debian {
			first = addendum{debian, fmt.Sprintf("mmdebstrap --variant=essential %s %v", o.suite, o.packages)}
			if o.rootfs != "" {
				first.createdBy = "root filesystem " + filepath.Base(o.rootfs)
			}
		}
		img, err := assemble(s, o.arch, epoch, first, addendum{bin, "COPY " + s.binary + " " + s.path})
		if err != nil {
			return nil, fmt.Errorf("assembling the %s image: %w", s.name, err)
		}
		file := filepath.Join(o.out, s.name+".tar")
		_, _ = fmt.Fprintf(log, "images: writing %s to %s\n", ref, file)
		if err := writeArchive(file, ref, img); err != nil {
			return nil, err
		}
		out = append(out, built{ref: ref, file: file, img: img})
	}
	return out, nil
}

// addendum is a layer and the history line saying what made it.
type addendum struct {
	layer     v1.Layer
	createdBy string
}

// assemble makes s's image from its layers, with its configuration.
func assemble(s spec, arch string, epoch time.Time, layers ...addendum) (v1.Image, error) {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	ports := map[string]struct{}{}
	for _, p := range s.ports {
		ports[p] = struct{}{}
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config: v1.Config{
			Entrypoint:   []string{s.path},
			User:         s.user,
			Env:          env,
			ExposedPorts: ports,
			WorkingDir:   "/",
			Labels: map[string]string{
				"org.opencontainers.image.title":       s.name,
				"org.opencontainers.image.description": s.why,
				"org.opencontainers.image.source":      "https://github.com/proxyplane/proxyplane",
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l.layer, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: l.createdBy}}
	}
	return mutate.Append(img, adds...)
}

// writeArchive writes img as a docker-archive tarball tagged ref to file,
// through a temporary file so that an interrupted build leaves no
// truncated archive to import.
func writeArchive(file string, ref name.Tag, img v1.Image) error {
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

// checkStatic fails unless path is a static ELF executable for machine:
// the static images have no libc and no loader, where a cgo binary would
// fail with a baffling "no such file or directory".
func checkStatic(path string, machine elf.Machine) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("checking %s: %w (build it first, CGO_ENABLED=0)", path, err)
	}
	defer func() { _ = f.Close() }()
	if f.Machine != machine {
		return fmt.Errorf("checking %s: built for %v, not %v", path, f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("checking %s: dynamically linked (it has a program interpreter); build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// report prints what was built: name, image ID (the config's digest, what
// `crictl images` shows), compressed size and file.
func report(w io.Writer, images []built) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "IMAGE\tID\tCOMPRESSED\tUNCOMPRESSED\tFILE")
	for _, b := range images {
		id, _ := b.img.ConfigName()
		var compressed, uncompressed int64
		if layers, err := b.img.Layers(); err == nil {
			for _, l := range layers {
				if n, err := l.Size(); err == nil {
					compressed += n
				}
				if n, err := uncompressedSize(l); err == nil {
					uncompressed += n
				}
			}
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.ref, id.Hex[:12], mib(compressed), mib(uncompressed), b.file)
	}
	_ = tw.Flush()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// uncompressedSize counts the bytes of l's tar stream.
func uncompressedSize(l v1.Layer) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer func() { _ = rc.Close() }()
	return io.Copy(io.Discard, rc)
}
