package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// rootfsEpoch is the SOURCE_DATE_EPOCH mmdebstrap runs with (Debian 12's
// release day): fixed rather than --epoch, so that the cached root
// filesystem serves every commit, and files the packages' scripts create
// get a time that does not change from one build to the next.
const rootfsEpoch = 1686355200

// mergedUsrHook makes /bin, /sbin and /lib links into /usr, as Debian 12
// installs do, and installs usr-is-merged: without it apt satisfies
// init-system-helpers' dependency with the usrmerge package, which pulls
// in perl (50 MB).
const mergedUsrHook = "/usr/share/mmdebstrap/hooks/merged-usr"

// rootfsSpec is what the agent's root filesystem is made of.
type rootfsSpec struct {
	suite, mirror, arch string
	packages            []string
}

// args returns mmdebstrap's arguments to write the root filesystem to out.
func (r rootfsSpec) args(out string) []string {
	pkgs := slices.Sorted(slices.Values(r.packages))
	return []string{
		"--mode=root", "--format=tar",
		// Packages marked Essential (coreutils, bash, dpkg...) and those
		// named, without apt, Recommends or caches: the image installs
		// nothing once built.
		"--variant=essential",
		"--architectures=" + r.arch,
		"--hook-dir=" + mergedUsrHook,
		"--include=" + strings.Join(pkgs, ","),
		// Manuals and translations only; the licences stay.
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		r.suite, out, r.mirror,
	}
}

// key names the cached root filesystem: a digest of what makes it.
func (r rootfsSpec) key() string {
	h := sha256.New()
	_, _ = fmt.Fprintf(h, "%d\x00", rootfsEpoch)
	for _, a := range r.args("") {
		_, _ = fmt.Fprintf(h, "%s\x00", a)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// debianRootfs returns the path of a tarball of r, built with mmdebstrap
// into dir unless there already (refresh rebuilds it). Older root
// filesystems in dir are removed once a new one is written.
func debianRootfs(ctx context.Context, r rootfsSpec, dir string, refresh bool, log io.Writer) (string, error) {
	file := filepath.Join(dir, "nodeagent-rootfs-"+r.key()+".tar")
	if _, err := os.Stat(file); err == nil && !refresh {
		_, _ = fmt.Fprintf(log, "images: using the cached root filesystem %s (--refresh rebuilds it)\n", file)
		return file, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return "", errors.New("mmdebstrap is missing: apt-get install -y mmdebstrap (hack/install-image-deps.sh)")
	}
	if _, err := os.Stat(mergedUsrHook); err != nil {
		return "", fmt.Errorf("mmdebstrap's merged-usr hook is missing: %w", err)
	}
	if os.Geteuid() != 0 {
		return "", errors.New("building the agent's root filesystem needs root (mmdebstrap --mode=root)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := file + ".tmp"
	defer func() { _ = os.Remove(tmp) }()
	_, _ = fmt.Fprintf(log, "images: building the agent's root filesystem from Debian %s: %s\n", r.suite, strings.Join(r.packages, " "))
	cmd := exec.CommandContext(ctx, "mmdebstrap", r.args(tmp)...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", rootfsEpoch))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("running mmdebstrap %s: %w", strings.Join(r.args(tmp), " "), err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "nodeagent-rootfs-*.tar"))
	for _, f := range old {
		if f != file {
			_ = os.Remove(f)
		}
	}
	return file, nil
}

// layerOptions: gzip at its default level, a third smaller than
// go-containerregistry's BestSpeed for a few seconds more; each layer is
// compressed once however often it is read (the static base is in three
// images).
var layerOptions = []tarball.LayerOption{
	tarball.WithCompressionLevel(gzip.DefaultCompression),
	tarball.WithCompressedCaching,
}

// rootfsLayer is the root filesystem tarball at file as a layer, with what
// a layer must not hold removed: device nodes and FIFOs (the runtime makes
// /dev; unpacking them needs CAP_MKNOD, which a rootless or user-namespaced
// runtime lacks), the "./" prefix and the root directory's own entry, and
// access and change times.
func rootfsLayer(file string) (v1.Layer, error) {
	if _, err := os.Stat(file); err != nil {
		return nil, fmt.Errorf("opening the root filesystem: %w", err)
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		pr, pw := io.Pipe()
		go func() {
			err := cleanTar(pw, f)
			_ = f.Close()
			_ = pw.CloseWithError(err)
		}()
		return pr, nil
	}, layerOptions...)
}

// cleanTar copies the tar stream r to w as rootfsLayer describes.
func cleanTar(w io.Writer, r io.Reader) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the root filesystem: %w", err)
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			continue
		}
		h.Name = strings.TrimPrefix(h.Name, "./")
		if h.Name == "" {
			continue
		}
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(h.Linkname, "./")
		}
		h.AccessTime, h.ChangeTime = time.Time{}, time.Time{}
		delete(h.PAXRecords, "atime")
		delete(h.PAXRecords, "ctime")
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("writing %s: %w", h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("writing %s: %w", h.Name, err)
		}
	}
	return tw.Close()
}

// file is an entry of a layer made here.
type file struct {
	name     string // relative, a directory's ending in "/"
	mode     int64
	uid, gid int
	data     string
}

// staticBase are the files of the static images' base, as distroless'
// static image has them: root and nonroot users (Go's os/user and
// anything logging a user name read /etc/passwd), a writable /tmp.
var staticBase = []file{
	{name: "etc/", mode: 0o755},
	{name: "etc/group", mode: 0o644, data: fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot)},
	{name: "etc/passwd", mode: 0o644, data: fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)},
	{name: "home/", mode: 0o755},
	{name: "home/nonroot/", mode: 0o700, uid: nonroot, gid: nonroot},
	{name: "root/", mode: 0o700},
	{name: "tmp/", mode: 0o1777},
}

// staticBaseLayer is the layer of staticBase, every file at epoch.
func staticBaseLayer(epoch time.Time) (v1.Layer, error) {
	return filesLayer(staticBase, epoch)
}

// binaryLayer is the executable at src installed at dst (absolute), with
// its parent directories, every entry at epoch.
func binaryLayer(src, dst string, epoch time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	var files []file
	rel := strings.TrimPrefix(path.Clean(dst), "/")
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		files = append(files, file{name: d + "/", mode: 0o755})
	}
	slices.Reverse(files)
	files = append(files, file{name: rel, mode: 0o755, data: string(data)})
	return filesLayer(files, epoch)
}

// filesLayer is a layer of files in their order, owned as they say, at
// epoch.
func filesLayer(files []file, epoch time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch,
			Typeflag: tar.TypeReg, Size: int64(len(f.data)), Format: tar.FormatPAX,
		}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, layerOptions...)
}
