package ipvs

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// noIPVSMessage is what an operator must read when the kernel lacks IPVS.
const noIPVSMessage = "the kernel has no IPVS (ip_vs module / CONFIG_IP_VS)"

func TestNewChecksIPVSFirst(t *testing.T) {
	opened := false
	open := func(*Config) (*seams, error) { opened = true; return nil, errors.New("must not be called") }
	noIPVS := func() error { return fmt.Errorf("%w: generic netlink family \"IPVS\" not found", ErrNoIPVS) }

	_, err := newChecked(DefaultConfig(dataplane.IPv4), nil, noIPVS, open)
	if !IsIPVSUnavailable(err) || !strings.Contains(err.Error(), noIPVSMessage) {
		t.Errorf("New error = %v, want one matching IsIPVSUnavailable and naming %q", err, noIPVSMessage)
	}
	if opened {
		t.Errorf("New opened the kernel interfaces of a kernel without IPVS")
	}

	// An invalid configuration is reported before the kernel is asked.
	bad := DefaultConfig(dataplane.IPv4)
	bad.Scheduler = "nope"
	if _, err := newChecked(bad, nil, noIPVS, open); !errors.Is(err, dataplane.ErrInvalidConfig) || IsIPVSUnavailable(err) {
		t.Errorf("New(invalid) = %v, want ErrInvalidConfig", err)
	}

	// A lookup that fails otherwise is not "no IPVS".
	perm := func() error { return fmt.Errorf("looking up the IPVS generic netlink family: %w", syscall.EPERM) }
	if _, err := newChecked(DefaultConfig(dataplane.IPv4), nil, perm, open); err == nil || IsIPVSUnavailable(err) {
		t.Errorf("New with EPERM = %v, want an error that is not IsIPVSUnavailable", err)
	}

	// With IPVS, New opens the kernel interfaces; their failure is
	// reported.
	ok := func() error { return nil }
	missing := func(*Config) (*seams, error) {
		return nil, &xtables.MissingBinaryError{Name: "ipset", Err: errors.New("not found")}
	}
	if _, err := newChecked(DefaultConfig(dataplane.IPv4), nil, ok, missing); !xtables.IsMissingBinary(err) || !strings.Contains(err.Error(), "install ipset") {
		t.Errorf("New without ipset = %v", err)
	}
	d, err := newChecked(DefaultConfig(dataplane.IPv4), nil, ok, func(*Config) (*seams, error) { return newFakeKernel().seams(dataplane.IPv4), nil })
	if err != nil || d == nil {
		t.Errorf("New = %v, %v", d, err)
	}
}

// TestNewOnThisKernel proves the clear failure on a kernel without IPVS,
// as the development machine's: New fails before touching anything, with
// an error naming the missing kernel feature. The lookup needs no
// privilege, so this runs as any user.
func TestNewOnThisKernel(t *testing.T) {
	switch err := checkIPVSFamily(); {
	case err == nil:
		t.Skip("this kernel has IPVS; the clear-error test is for kernels without it (the kernel tests cover this one)")
	case !IsIPVSUnavailable(err):
		t.Skipf("cannot tell whether the kernel has IPVS here (a sandbox denying generic netlink?): %v", err)
	}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		d, err := New(DefaultConfig(f), nil)
		if d != nil || !IsIPVSUnavailable(err) {
			t.Fatalf("New(%v) = %v, %v; want an error matching IsIPVSUnavailable", f, d, err)
		}
		want := fmt.Sprintf("IPVS %v dataplane: %s: generic netlink family \"IPVS\" not found", f, noIPVSMessage)
		if err.Error() != want {
			t.Errorf("New(%v) error = %q, want %q", f, err, want)
		}
	}
}
