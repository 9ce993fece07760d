package sysctl

import (
	"fmt"
	"io/fs"
	"maps"
	"slices"
)

// fakeKernel is a Kernel of files in a map. Files in readOnly refuse
// writes as the kernel does outside the host's network namespace.
type fakeKernel struct {
	files    map[string]int
	readOnly map[string]bool
	cpus     int
	writes   []string // "path=value", in order
}

func newFakeKernel(cpus int, files map[string]int) *fakeKernel {
	return &fakeKernel{files: maps.Clone(files), readOnly: map[string]bool{}, cpus: cpus}
}

func (k *fakeKernel) ReadInt(path string) (int, error) {
	v, ok := k.files[path]
	if !ok {
		return 0, fmt.Errorf("reading %s: %w", path, fs.ErrNotExist)
	}
	return v, nil
}

func (k *fakeKernel) WriteInt(path string, v int) error {
	if k.readOnly[path] {
		return fmt.Errorf("writing %s: %w: %w", path, ErrReadOnly, fs.ErrPermission)
	}
	if _, ok := k.files[path]; !ok {
		return fmt.Errorf("writing %s: %w", path, fs.ErrNotExist)
	}
	k.files[path] = v
	k.writes = append(k.writes, fmt.Sprintf("%s=%d", path, v))
	return nil
}

func (k *fakeKernel) NumCPU() int { return k.cpus }

func (k *fakeKernel) sortedWrites() []string { return slices.Sorted(slices.Values(k.writes)) }
