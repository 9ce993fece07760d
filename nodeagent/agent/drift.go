package agent

import (
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// maxDriftDetail bounds the detail of a repair the control plane is told:
// it refuses more (see the server's drift report bounds).
const maxDriftDetail = 256

// DriftLog records the drift repairs of every dataplane family: rules
// someone else changed that a drift check found and a full sync put back.
// The client reports them to the control plane (client.Options.Drift),
// so that an operator learns of a node being tampered with or fought over
// without logging into it. Its Observe is a dataplane.Observer. Safe for
// concurrent use.
type DriftLog struct {
	mu sync.Mutex // guards the fields below
	// repairs is the latest report: replaced, never modified, so that a
	// reader may keep it.
	repairs []*pb.DriftRepair
	// changed is closed, and replaced, at each repair.
	changed chan struct{}
}

// NewDriftLog returns an empty log.
func NewDriftLog() *DriftLog { return &DriftLog{changed: make(chan struct{})} }

// Observe records r's repair, if it made one: a sync that found drift and
// succeeded. A failed sync repaired nothing; it is retried, and counted
// as a sync failure.
func (l *DriftLog) Observe(r dataplane.SyncResult) {
	if !r.Drifted || r.Err != nil {
		return
	}
	now := timestamppb.New(time.Now())
	family := r.Family.String()
	detail := strings.ToValidUTF8(r.DriftDetail, "")
	if len(detail) > maxDriftDetail {
		detail = strings.ToValidUTF8(detail[:maxDriftDetail-len("…")], "") + "…"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	next := make([]*pb.DriftRepair, 0, len(l.repairs)+1)
	found := false
	for _, old := range l.repairs {
		if old.GetDataplane() == r.Mode && old.GetIpFamily() == family {
			old = &pb.DriftRepair{
				Dataplane: r.Mode, IpFamily: family, Count: old.GetCount() + 1,
				FirstRepairedAt: old.GetFirstRepairedAt(), LastRepairedAt: now, Detail: detail,
			}
			found = true
		}
		next = append(next, old)
	}
	if !found {
		next = append(next, &pb.DriftRepair{Dataplane: r.Mode, IpFamily: family, Count: 1, FirstRepairedAt: now, LastRepairedAt: now, Detail: detail})
	}
	l.repairs = next
	close(l.changed)
	l.changed = make(chan struct{})
}

// Report returns the repairs so far (nil before the first), and a channel
// closed at the next repair. The report is shared: do not modify it.
func (l *DriftLog) Report() (*pb.DriftReport, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.repairs) == 0 {
		return nil, l.changed
	}
	return &pb.DriftReport{Repairs: l.repairs}, l.changed
}
