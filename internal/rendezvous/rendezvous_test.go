package rendezvous

import (
	"fmt"
	"slices"
	"testing"
)

func addrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.0.%d:9443", i+1)
	}
	return out
}

// TestOrderIsThePreviousDialOrder pins the order nodeagent/client used
// before the function moved here: agents already running keep their
// replica across an upgrade.
func TestOrderIsThePreviousDialOrder(t *testing.T) {
	got := Order("node-1", []string{"a:1", "b:1", "c:1"})
	// Computed with the function as it was in nodeagent/client/dial.go.
	want := []string{"b:1", "c:1", "a:1"}
	if !slices.Equal(got, want) {
		t.Errorf("Order = %v, want %v", got, want)
	}
}

func TestOrderIgnoresInputOrder(t *testing.T) {
	a := addrs(5)
	r := slices.Clone(a)
	slices.Reverse(r)
	for i := range 100 {
		n := fmt.Sprintf("node-%d", i)
		if x, y := Order(n, a), Order(n, r); !slices.Equal(x, y) {
			t.Fatalf("%s: %v and %v", n, x, y)
		}
	}
	if !slices.Equal(a, addrs(5)) {
		t.Error("Order modified its input")
	}
}

// TestLosingOneSpreadsItsNodes: the nodes of a replica removed go to the
// others evenly, and no other node moves.
func TestLosingOneSpreadsItsNodes(t *testing.T) {
	const nodes = 6000
	a := addrs(4)
	lost := a[1]
	rest := slices.Delete(slices.Clone(a), 1, 2)
	moved := map[string]int{}
	for i := range nodes {
		n := fmt.Sprintf("fleet-node-%05d", i)
		before, after := Order(n, a)[0], Order(n, rest)[0]
		if before != lost && after != before {
			t.Fatalf("%s moved from %s to %s though %s stayed", n, before, after, before)
		}
		if before == lost {
			moved[after]++
			if want := Order(n, a)[1]; after != want {
				t.Fatalf("%s went to %s, not its second choice %s", n, after, want)
			}
		}
	}
	total := 0
	for _, c := range moved {
		total += c
	}
	even := float64(total) / 3
	for addr, c := range moved {
		if d := float64(c) - even; d > 0.1*even || d < -0.1*even {
			t.Errorf("%s took %d of %d, even is %.0f", addr, c, total, even)
		}
	}
}
