package app

import (
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
)

// ShowCache prints the table cached at path as JSON (the Snapshot message
// the agent would reconstruct), for an operator on a node whose control
// plane is down. It only reads.
func ShowCache(w io.Writer, path string) error {
	c, err := cache.OpenReadOnly(path)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	t, err := c.Load()
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if t == nil {
		_, err := fmt.Fprintf(w, "%s holds no table\n", path)
		return err
	}
	saved, err := c.SavedAt()
	if err != nil {
		return err
	}
	snap := &pb.Snapshot{Version: t.Version, Node: t.Node}
	for _, k := range t.Keys() {
		snap.Entries = append(snap.Entries, t.Entries[k])
	}
	out, err := protojson.MarshalOptions{Multiline: true}.Marshal(snap)
	if err != nil {
		return fmt.Errorf("rendering the table: %w", err)
	}
	_, err = fmt.Fprintf(w, "# %s: version %s, %d services, saved %s (%s ago)\n%s\n",
		path, t.Version, len(t.Entries), saved.Format(time.RFC3339), time.Since(saved).Round(time.Second), out)
	return err
}
