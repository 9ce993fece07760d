package auth

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAgentPodsWatched runs the Authenticator as the control plane does,
// its informer watching the agent Pods through the client: a Pod listed
// at the start and one created later are admitted; a Pod orphaned, and
// one deleted, through the API end their streams.
func TestAgentPodsWatched(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFakeAPI()
	listed := agentPod("node-1")
	if _, err := f.CoreV1().Pods(listed.Namespace).Create(ctx, listed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, err := New(f, Config{}, discard())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-a.Listed():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent Pods were not listed")
	}
	cc := serveHold(t, a)
	hour := time.Now().Add(time.Hour)
	ours := []string{DefaultAudience}

	first := open(t, cc, "Sync", f.podToken(listed, ours, hour), "node-1")
	later := agentPod("node-2")
	if _, err := f.CoreV1().Pods(later.Namespace).Create(ctx, later, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := open(t, cc, "Sync", f.podToken(later, ours, hour), "node-2")

	orphaned := listed.DeepCopy()
	orphaned.OwnerReferences = nil
	if _, err := f.CoreV1().Pods(orphaned.Namespace).Update(ctx, orphaned, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	first.wantEnd(t, codes.PermissionDenied)
	second.wantOpen(t)
	if err := f.CoreV1().Pods(later.Namespace).Delete(ctx, later.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second.wantEnd(t, codes.PermissionDenied)

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
