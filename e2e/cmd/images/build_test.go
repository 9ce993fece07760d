package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const testEpoch = 1700000000

// staticBinaries builds one tiny static program and installs it under
// every binary name the images take.
func staticBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	cmd := exec.Command("go", "build", "-o", filepath.Join(bin, "prog"), src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building a static program: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(filepath.Join(bin, "prog"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if err := os.WriteFile(filepath.Join(bin, s.binary), prog, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// fakeRootfs writes a tarball as mmdebstrap does: "./" names, device
// nodes, a hard link.
func fakeRootfs(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1686355200, 0)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "./usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./usr/sbin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./usr/sbin/xtables-nft-multi", Typeflag: tar.TypeReg, Mode: 0o755, Size: 4},
		{Name: "./usr/sbin/iptables-nft-restore", Typeflag: tar.TypeSymlink, Linkname: "xtables-nft-multi"},
		{Name: "./usr/sbin/ipset", Typeflag: tar.TypeLink, Linkname: "./usr/sbin/xtables-nft-multi"},
	} {
		h.ModTime, h.AccessTime, h.Format = mtime, mtime.Add(time.Hour), tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("ELF!")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func testOptions(t *testing.T, bin, rootfs string) *options {
	t.Helper()
	return &options{
		binDir: bin, out: t.TempDir(), registry: "example.test/pp", tag: "t1",
		arch: runtime.GOARCH, epoch: testEpoch, rootfs: rootfs,
	}
}

// layerFiles returns the headers of a layer's tar stream by name.
func layerFiles(t *testing.T, l v1.Layer) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestBuild(t *testing.T) {
	if _, ok := elfMachines[runtime.GOARCH]; !ok {
		t.Skipf("no images for %s", runtime.GOARCH)
	}
	bin, rootfs := staticBinaries(t), fakeRootfs(t)
	o := testOptions(t, bin, rootfs)
	built, err := build(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != len(specs) {
		t.Fatalf("built %d images, want %d", len(built), len(specs))
	}
	epoch := time.Unix(testEpoch, 0).UTC()
	for i, s := range specs {
		file := filepath.Join(o.out, s.name+".tar")
		tag, err := name.NewTag("example.test/pp/" + s.name + ":t1")
		if err != nil {
			t.Fatal(err)
		}
		// Read back from the file, as an importer does.
		img, err := tarball.ImageFromPath(file, &tag)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{s.path}) || cf.Config.User != s.user ||
			cf.Architecture != runtime.GOARCH || cf.OS != "linux" || !cf.Created.Equal(epoch) {
			t.Errorf("%s: entrypoint %v, user %q, platform %s/%s, created %v; want [%s], %q, linux/%s, %v",
				s.name, cf.Config.Entrypoint, cf.Config.User, cf.OS, cf.Architecture, cf.Created.Time, s.path, s.user, runtime.GOARCH, epoch)
		}
		want, _ := built[i].img.Digest()
		if got, _ := img.Digest(); got != want {
			t.Errorf("%s: read back as %v, built as %v", s.name, got, want)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("%s: %d layers (%v), want base and binary", s.name, len(layers), err)
		}
		base, top := layerFiles(t, layers[0]), layerFiles(t, layers[1])
		binPath := strings.TrimPrefix(s.path, "/")
		if h := top[binPath]; h == nil || h.Mode != 0o755 || !h.ModTime.Equal(epoch) || h.Uid != 0 {
			t.Errorf("%s: binary entry %+v, want %s, 0755, root, at the epoch", s.name, h, binPath)
		}
		if s.debian {
			for n, h := range base {
				if strings.HasPrefix(n, "./") || n == "" || h.Typeflag == tar.TypeChar || !h.AccessTime.IsZero() {
					t.Errorf("%s: root filesystem entry %q (type %c, atime %v) left in", s.name, n, h.Typeflag, h.AccessTime)
				}
			}
			if h := base["usr/sbin/ipset"]; h == nil || h.Linkname != "usr/sbin/xtables-nft-multi" {
				t.Errorf("%s: hard link %+v, want its target without ./", s.name, h)
			}
			if base["usr/sbin/iptables-nft-restore"] == nil || base["dev/"] == nil {
				t.Errorf("%s: root filesystem lost entries: %v", s.name, slices.Sorted(func(yield func(string) bool) {
					for n := range base {
						if !yield(n) {
							return
						}
					}
				}))
			}
		} else {
			if h := base["tmp/"]; h == nil || h.Mode != 0o1777 {
				t.Errorf("%s: /tmp %+v, want mode 1777", s.name, h)
			}
			if h := base["home/nonroot/"]; h == nil || h.Uid != nonroot {
				t.Errorf("%s: /home/nonroot %+v, want owned by %d", s.name, h, nonroot)
			}
		}
	}

	// Rebuilt elsewhere from the same inputs: the same images.
	o2 := testOptions(t, bin, rootfs)
	again, err := build(context.Background(), o2, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for i := range built {
		a, _ := built[i].img.Digest()
		b, _ := again[i].img.Digest()
		if a != b {
			t.Errorf("%s: %v, then %v from the same inputs", built[i].ref, a, b)
		}
	}
}

func TestBuildRefusesDynamicBinaries(t *testing.T) {
	if _, ok := elfMachines[runtime.GOARCH]; !ok {
		t.Skipf("no images for %s", runtime.GOARCH)
	}
	dynamic, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no dynamically linked program to try")
	}
	bin := staticBinaries(t)
	prog, err := os.ReadFile(dynamic)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "backend"), prog, 0o755); err != nil {
		t.Fatal(err)
	}
	if checkStatic(dynamic, elfMachines[runtime.GOARCH]) == nil {
		t.Skipf("%s is static here", dynamic)
	}
	_, err = build(context.Background(), testOptions(t, bin, fakeRootfs(t)), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("build with a dynamic backend: %v, want it refused as dynamically linked", err)
	}
}
