package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// smallDisk mounts a tmpfs of size bytes on a new directory and returns
// it; the mount goes when the test ends. Root only.
func smallDisk(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("proxyplane-test", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// bigTable is a table of n entries of about 1 KB each.
func bigTable(t *testing.T, n int) []*pb.ServiceEntry {
	t.Helper()
	entries := make([]*pb.ServiceEntry, n)
	for i := range entries {
		e := entry(fmt.Sprintf("ns/svc-%04d", i), uint64(i)+1)
		for j := range 40 {
			e.Service.ClusterEndpoints[0].Endpoints = append(e.Service.ClusterEndpoints[0].Endpoints,
				&pb.Endpoint{Ip: fmt.Sprintf("10.244.%d.%d", i%250, j), Port: 8080, Ready: true})
		}
		entries[i] = e
	}
	return entries
}

// On a full disk Save fails with the kernel's error and the table saved
// before stays whole: the agent NACKs and keeps what it holds (agent
// tests cover that part).
func TestFullOrReadOnlyDisk(t *testing.T) {
	dir := smallDisk(t, 1<<20)
	path := filepath.Join(dir, "table.db")
	c, _ := mustOpen(t, path)
	small := table(t, entry("ns/a", 1), entry("ns/b", 2))
	if err := c.Save(small, nil, true); err != nil {
		t.Fatalf("Save of a small table: %v", err)
	}

	err := c.Save(table(t, bigTable(t, 4000)...), nil, true) // about 4 MB
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full disk = %v, want ENOSPC", err)
	}
	got, err := c.Load()
	if err != nil {
		t.Fatalf("Load after the failed save: %v", err)
	}
	equalTables(t, got, small)

	// A state directory read-only from the start (remounted by the kernel
	// after disk errors, or mounted so): Open says so, and the file is as
	// it was. The agent then exits before touching the kernel's rules.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting %s read-only: %v", dir, err)
	}
	if _, _, err := Open(path, slog.New(slog.DiscardHandler)); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("Open on a read-only disk = %v, want EROFS", err)
	}
	r, err := OpenReadOnly(path)
	if err != nil {
		t.Fatalf("OpenReadOnly on a read-only disk: %v", err)
	}
	defer func() { _ = r.Close() }()
	got, err = r.Load()
	if err != nil {
		t.Fatalf("Load on a read-only disk: %v", err)
	}
	equalTables(t, got, small)
}
