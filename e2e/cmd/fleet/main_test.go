package main

import (
	"context"
	"log"
	"os"
	"testing"
)

// TestMain lets the test binary be its own child processes: the harness
// re-executes os.Executable() with FLEET_ROLE set, which under go test is
// this binary.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		if err := runRole(context.Background(), role, os.Args[1:]); err != nil {
			log.Printf("fleet %s: %v", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
