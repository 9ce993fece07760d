package ipvs

import (
	"context"
	"regexp"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// execIPSet is ipsetRunner over the ipset tool.
type execIPSet struct{ t tool.Tool }

// ipsetLineRE finds the line `ipset restore` blames: "Error in line 3:".
var ipsetLineRE = regexp.MustCompile(`Error in line (\d+)`)

// Restore implements ipsetRunner.
func (r execIPSet) Restore(ctx context.Context, data []byte) error {
	if _, err := r.t.Run(ctx, data, "restore"); err != nil {
		return tool.RestoreFailure("ipset restore", err, ipsetLineRE)
	}
	return nil
}

// Save implements ipsetRunner.
func (r execIPSet) Save(ctx context.Context) ([]byte, error) { return r.t.Run(ctx, nil, "save") }
