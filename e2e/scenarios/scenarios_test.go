package scenarios

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// scenarioTimeout bounds one scenario; each takes seconds on an idle
// machine.
const scenarioTimeout = 3 * time.Minute

// env is what the scenarios share: the box and the Service every
// scenario sends its traffic to.
type env struct {
	b *box.Box
	// web is a dual-stack Service with an endpoint in every pod, created
	// by the first scenario.
	web *corev1.Service
}

// TestScenarios starts one box and runs every scenario on it, in order.
// Each scenario starts by checking that the box is whole (every process
// running, every node current), so a failure does not cascade silently
// into the next.
func TestScenarios(t *testing.T) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	// E2E_INSECURE=1 runs the same scenarios in plaintext without tokens,
	// to compare their figures with what authentication costs; the
	// security scenarios then skip.
	insecure := os.Getenv("E2E_INSECURE") == "1"
	b, err := box.Start(ctx, t, box.Options{Insecure: insecure})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "box-start", "took=%s nodes=%d pods=%d replicas=%d", ms(time.Since(start)), len(b.Agents), b.Topology().Pods(), len(b.ControlPlanes))
	e := &env{b: b}
	// In order: each later scenario uses web, made by the second.
	t.Run("DeployApplied", e.testDeployApplied)
	t.Run("ServicesReachEveryNode", e.testServicesReachEveryNode)
	t.Run("EndpointChangeLatency", e.testEndpointChangeLatency)
	t.Run("Convergence", e.testConvergence)
	t.Run("GRPCurl", e.testGRPCurl)
	t.Run("Explain", e.testExplain)
	t.Run("ControlPlaneRestartSendsNothing", e.testControlPlaneRestart)
	t.Run("AgentMovesReplicaSendsNothing", e.testAgentMovesReplica)
	t.Run("ControlPlaneReplaced", e.testControlPlaneReplaced)
	t.Run("ControlPlaneDown", e.testControlPlaneDown)
	t.Run("APIServerRestart", e.testAPIServerRestart)
	t.Run("NodeBeingDeleted", e.testNodeBeingDeleted)
	t.Run("ControlPlaneAwayHealthy", e.testControlPlaneAwayHealthy)
	t.Run("AgentKilledMidApply", e.testAgentKilledMidApply)
	t.Run("ControlPlaneKilledMidStream", e.testControlPlaneKilledMidStream)
	t.Run("Cleanup", e.testCleanup)
	t.Run("Migration", e.testMigration)
	t.Run("MigrationNFT", e.testMigrationNFT)
	t.Run("ModeSwitch", e.testModeSwitch)
	t.Run("TenantFreeze", e.testTenantFreeze)
	if insecure {
		t.Log("E2E_INSECURE=1: the authentication scenarios are skipped")
	} else {
		t.Run("Authentication", e.testAuthentication)
		t.Run("AttackIdentity", e.testAttackIdentity)
		t.Run("AttackLimits", e.testAttackLimits)
		t.Run("AttackMetrics", e.testAttackMetrics)
		t.Run("CredentialsAppearLate", e.testCredentialsAppearLate)
		t.Run("CertificateRotation", e.testCertificateRotation)
		t.Run("ConnectCost", e.testConnectCost)
	}
	figure(t, "total", "took=%s", ms(time.Since(start)))
}

// begin starts a scenario: it checks that the box is whole and returns
// the scenario's context, bounded by scenarioTimeout.
func (e *env) begin(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), scenarioTimeout)
	t.Cleanup(cancel)
	whole(ctx, t, e.b)
	return ctx
}

// whole fails t unless every process of the box is running and every
// node is current: what each scenario starts from.
func whole(ctx context.Context, t *testing.T, b *box.Box) {
	t.Helper()
	for _, c := range b.ControlPlanes {
		if !c.Running() {
			t.Fatalf("box not whole: %s is not running (a previous scenario failed?)", c.Name())
		}
	}
	for _, a := range b.Agents {
		if !a.Running() {
			t.Fatalf("box not whole: %s is not running (a previous scenario failed?)", a.Name())
		}
	}
	if !b.APIServer().Running() {
		t.Fatal("box not whole: the API server is not running (a previous scenario failed?)")
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatalf("box not whole: %v", err)
	}
}

// figure logs one measured figure in the parseable form the package
// documents.
func figure(t *testing.T, name, format string, args ...any) {
	t.Helper()
	t.Logf("e2e-figure: %s %s", name, fmt.Sprintf(format, args...))
}

// ms rounds d for a figure.
func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// percentiles formats p50, p90 and max of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "samples=0"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("samples=%d p50=%s p90=%s max=%s", len(s), ms(at(0.5)), ms(at(0.9)), ms(s[len(s)-1]))
}

// hasEntry returns a WaitProgrammed check that the table holds Service
// key with exactly the IPv4 endpoints of pods (any order).
func hasEntry(e *env, key string, pods ...int) func(string, *pb.Snapshot) error {
	var want []string
	for _, i := range pods {
		want = append(want, e.b.Topology().PodIP(i).String())
	}
	slices.Sort(want)
	return func(_ string, s *pb.Snapshot) error {
		for _, en := range s.GetEntries() {
			if en.GetKey() != key {
				continue
			}
			var got []string
			for _, pe := range en.GetService().GetClusterEndpoints() {
				if pe.GetPortName() != "tcp" {
					continue
				}
				for _, ep := range pe.GetEndpoints() {
					if !strings.Contains(ep.GetIp(), ":") {
						got = append(got, ep.GetIp())
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s has endpoints %v, want %v", key, got, want)
			}
			return nil
		}
		return fmt.Errorf("no entry %s", key)
	}
}

// podOn returns the first pod of node k, whose namespace sends traffic
// through node k's rules.
func podOn(b *box.Box, k int) int { return b.Topology().Node(k).Pods()[0] }

// podName is nstest's backend name of pod i.
func podName(i int) string { return fmt.Sprintf("pod-%d", i) }
