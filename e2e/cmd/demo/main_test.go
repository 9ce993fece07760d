package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// childEnv makes the test binary play the demo's teardown: write to a
// stdout nobody reads any more, then finish the job.
const childEnv = "DEMO_TEST_BROKEN_PIPE_MARKER"

func TestMain(m *testing.M) {
	if marker := os.Getenv(childEnv); marker != "" {
		keepWritingAfterReaderGoes()
		// The reader is gone before this write, as tee is after Ctrl-C.
		fmt.Println("\nremoving the box: processes, namespaces and rules ...")
		if err := os.WriteFile(marker, []byte("done"), 0o600); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTeardownOutlivesItsReader runs the teardown's first write against a
// pipe whose reader has exited, as under `make demo | tee` and Ctrl-C: the
// write must fail quietly and the teardown go on to its end.
func TestTeardownOutlivesItsReader(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "finished")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil { // the reader is gone
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+marker)
	cmd.Stdout = w
	err = cmd.Run()
	_ = w.Close()
	if err != nil {
		t.Fatalf("teardown died writing to a broken pipe: %v (state %v)", err, cmd.ProcessState)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("teardown did not finish: %v", err)
	}
}
