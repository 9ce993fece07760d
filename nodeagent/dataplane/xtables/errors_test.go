package xtables

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

func TestErrorPredicates(t *testing.T) {
	re := &RestoreError{Tool: "iptables-restore", Line: 3, Key: "ns/a", Err: errors.New("exit status 1")}
	wrapped := errors.Join(errors.New("x"), re)
	if !IsRestoreFailed(wrapped) || IsLockHeld(wrapped) || IsMissingBinary(wrapped) || IsCommandFailed(wrapped) {
		t.Errorf("predicates on a RestoreError are wrong")
	}
	if got, want := re.Error(), "iptables-restore failed at line 3 (service ns/a): exit status 1"; got != want {
		t.Errorf("RestoreError = %q, want %q", got, want)
	}
	le := &LockError{Err: &CommandError{Args: []string{"iptables-legacy"}, ExitCode: 4, Err: errors.New("exit status 4")}}
	if !IsLockHeld(le) || !IsCommandFailed(le) {
		t.Errorf("predicates on a LockError are wrong")
	}
	if !IsMissingBinary(&MissingBinaryError{Name: "iptables-nft-restore", Err: errors.New("not found")}) {
		t.Errorf("IsMissingBinary false")
	}
}

// TestClassify checks how a failed command becomes a typed error: the
// line iptables-restore blames, and the lock timeout told apart from
// other resource problems by its message.
func TestClassify(t *testing.T) {
	for stderr, want := range map[string]int{
		"iptables-restore: line 6 failed\n":                      6,
		"Bad argument\nError occurred at line: 3\nTry `iptables": 3,
		"iptables-nft-restore: line 12 failed: No chain":         12,
		"something else": 0,
	} {
		err := tool.RestoreFailure("iptables-restore", &CommandError{ExitCode: 1, Stderr: stderr, Err: errors.New("exit status 1")}, lineRE)
		var re *RestoreError
		if !errors.As(err, &re) || re.Line != want {
			t.Errorf("restore failure with stderr %q = %v, want a RestoreError at line %d", stderr, err, want)
		}
	}
	lock := &CommandError{ExitCode: exitLockHeld, Stderr: "Another app is currently holding the xtables lock. Stopped waiting after 5s.", Err: errors.New("exit status 4")}
	if err := classify(lock); !IsLockHeld(err) || !IsCommandFailed(err) {
		t.Errorf("classify(lock timeout) = %v, want a LockError", err)
	}
	other := &CommandError{ExitCode: exitLockHeld, Stderr: "Memory allocation problem", Err: errors.New("exit status 4")}
	if err := classify(other); IsLockHeld(err) || !IsCommandFailed(err) {
		t.Errorf("classify(other resource problem) = %v, want the CommandError", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, b := range []Backend{"", BackendAuto, BackendNFT, BackendLegacy} {
		if err := (Options{Backend: b}).Validate(); err != nil {
			t.Errorf("Validate(%q) = %v", b, err)
		}
	}
	err := Options{Backend: "iptables", LockWait: -time.Second}.Validate()
	if err == nil || !strings.Contains(err.Error(), `backend "iptables"`) || !strings.Contains(err.Error(), "lock wait -1s is negative") {
		t.Errorf("Validate(bad) = %v, want both problems", err)
	}
}

func TestBinariesOf(t *testing.T) {
	if got := BinariesOf(dataplane.IPv6, BackendLegacy); got != (Binaries{Restore: "ip6tables-legacy-restore", Save: "ip6tables-legacy-save", IPTables: "ip6tables-legacy"}) {
		t.Errorf("BinariesOf(IPv6, legacy) = %+v", got)
	}
	if got := BinariesOf(dataplane.IPv4, BackendNFT).Restore; got != "iptables-nft-restore" {
		t.Errorf("BinariesOf(IPv4, nft).Restore = %q", got)
	}
}
