package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// entry returns a valid entry for key ("namespace/name") whose content
// is labelled by label (an endpoint's address holds it; labelOf reads it
// back), with the hash the control plane gives that content: Load
// recomputes hashes and refuses a cache whose hashes are not their
// content's.
func entry(key string, label uint64) *pb.ServiceEntry {
	ns, name, _ := strings.Cut(key, "/")
	s := &pb.Service{
		Namespace:  ns,
		Name:       name,
		Type:       pb.ServiceType_SERVICE_TYPE_CLUSTER_IP,
		ClusterIps: []string{"10.96.0.10", "fd00::10"},
		Ports:      []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, HasEndpoints: true}},
		ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{
			{Ip: "10.244.1.5", Port: 8080, Ready: true, Serving: true},
			{Ip: labelAddr(label).String(), Port: 8080, Ready: true, Serving: true},
		}}},
	}
	return &pb.ServiceEntry{Key: key, Hash: mustHash(key, s), Service: s}
}

// labelAddr is fd00::/64 with label as its interface identifier.
func labelAddr(label uint64) netip.Addr {
	b := [16]byte{0: 0xfd}
	binary.BigEndian.PutUint64(b[8:], label)
	return netip.AddrFrom16(b)
}

// labelOf returns the label entry gave e.
func labelOf(e *pb.ServiceEntry) uint64 {
	a, _ := netip.ParseAddr(e.GetService().GetClusterEndpoints()[0].GetEndpoints()[1].GetIp())
	b := a.As16()
	return binary.BigEndian.Uint64(b[8:])
}

// labels returns t's labels by key.
func labels(t *proxytable.Table) map[string]uint64 {
	out := make(map[string]uint64, len(t.Entries))
	for k, e := range t.Entries {
		out[k] = labelOf(e)
	}
	return out
}

func mustHash(key string, s *pb.Service) uint64 {
	h, err := tablehash.Entry(key, s)
	if err != nil {
		panic(err)
	}
	return h
}

// testNode is the node of every test table, with its real hash.
func testNode() *pb.NodeInfo {
	n := &pb.NodeInfo{Name: "node-a", Zone: "zone-1", PodCidrs: []string{"10.244.1.0/24"}, NodeIps: []string{"192.168.0.2", "fd00::2"}}
	h, err := tablehash.Node(n)
	if err != nil {
		panic(err)
	}
	n.Hash = h
	return n
}

// table builds a valid table holding entries, its version the sum of
// their hashes and the node's.
func table(t testing.TB, entries ...*pb.ServiceEntry) *proxytable.Table {
	t.Helper()
	node := testNode()
	sum := node.GetHash()
	for _, e := range entries {
		sum += e.GetHash()
	}
	tb, err := proxytable.FromEntries(fmt.Sprintf("%016x", sum), node, entries)
	if err != nil {
		t.Fatalf("building table: %v", err)
	}
	return tb
}

// tableOf builds a table from key=label pairs.
func tableOf(t testing.TB, labels map[string]uint64) *proxytable.Table {
	t.Helper()
	var entries []*pb.ServiceEntry
	for k, l := range labels {
		entries = append(entries, entry(k, l))
	}
	return table(t, entries...)
}

func equalTables(t testing.TB, got, want *proxytable.Table) {
	t.Helper()
	if got == nil || want == nil {
		if got != want {
			t.Fatalf("table = %v, want %v", got, want)
		}
		return
	}
	if got.Version != want.Version {
		t.Errorf("version = %q, want %q", got.Version, want.Version)
	}
	if got.ResourceVersion != want.ResourceVersion {
		t.Errorf("resource version = %d, want %d", got.ResourceVersion, want.ResourceVersion)
	}
	if !proto.Equal(got.Node, want.Node) {
		t.Errorf("node = %v, want %v", got.Node, want.Node)
	}
	if !slices.Equal(got.Keys(), want.Keys()) {
		t.Fatalf("keys = %v, want %v", got.Keys(), want.Keys())
	}
	for k, e := range want.Entries {
		if !proto.Equal(got.Entries[k], e) {
			t.Errorf("entry %s = %v, want %v", k, got.Entries[k], e)
		}
	}
}

// testLog returns a logger writing text to the returned buffer.
func testLog() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

// mustOpen opens path and registers its Close.
func mustOpen(t *testing.T, path string) (*Cache, *proxytable.Table) {
	t.Helper()
	log, buf := testLog()
	c, tb, err := Open(path, log)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if buf.Len() > 0 {
		t.Errorf("Open logged: %s", buf)
	}
	return c, tb
}

// reload closes c, reopens path and returns the table loaded from it:
// what an agent restarting now would see.
func reload(t *testing.T, c *Cache, path string) (*Cache, *proxytable.Table) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return mustOpen(t, path)
}

// stored returns the version and the raw key -> label contents of the
// cache file at path, read with bbolt alone, bypassing Load's validation.
func stored(t *testing.T, path string) (string, map[string]uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	defer func() { _ = db.Close() }()
	var version string
	out := map[string]uint64{}
	err = db.View(func(tx *bolt.Tx) error {
		version = string(tx.Bucket(bucketMeta).Get(keyVersion))
		return tx.Bucket(bucketEntries).ForEach(func(k, v []byte) error {
			e := &pb.ServiceEntry{}
			if err := proto.Unmarshal(v, e); err != nil {
				return err
			}
			out[string(k)] = labelOf(e)
			return nil
		})
	})
	if err != nil {
		t.Fatalf("reading raw entries: %v", err)
	}
	return version, out
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, got := mustOpen(t, path)
	if got != nil {
		t.Fatalf("new cache loaded %v, want nil", got)
	}
	if at, err := c.SavedAt(); err != nil || !at.IsZero() {
		t.Fatalf("SavedAt of an empty cache = %v, %v; want zero, nil", at, err)
	}

	want := table(t, entry("default/kubernetes", 1), entry("kube-system/kube-dns", 0xfedcba9876543210), entry("app/web", 42))
	want.ResourceVersion = 1 << 40
	before := time.Now()
	if err := c.Save(want, nil, true); err != nil {
		t.Fatalf("Save: %v", err)
	}
	c, got = reload(t, c, path)
	equalTables(t, got, want)
	at, err := c.SavedAt()
	if err != nil || at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Errorf("SavedAt = %v, %v; want about %v", at, err, before)
	}

	// Saving the empty table leaves a cache that loads as empty, not one
	// that fails validation on the next start.
	if err := c.Save(proxytable.Empty(), nil, true); err != nil {
		t.Fatalf("Save(Empty): %v", err)
	}
	_, got = reload(t, c, path)
	equalTables(t, got, nil)
}

func TestSave(t *testing.T) {
	for _, tc := range []struct {
		name    string
		base    map[string]uint64
		next    map[string]uint64
		changed []string
		full    bool
		// want is the stored key -> label afterwards; nil means next's.
		want map[string]uint64
	}{{
		name:    "upsert and remove",
		base:    map[string]uint64{"ns/a": 1, "ns/b": 2, "ns/c": 3},
		next:    map[string]uint64{"ns/a": 1, "ns/c": 30, "ns/d": 4},
		changed: []string{"ns/b", "ns/c", "ns/d"},
	}, {
		name:    "delta touches only changed keys",
		base:    map[string]uint64{"ns/a": 1, "ns/b": 2},
		next:    map[string]uint64{"ns/a": 10, "ns/b": 2, "ns/c": 3},
		changed: []string{"ns/c"},
		want:    map[string]uint64{"ns/a": 1, "ns/b": 2, "ns/c": 3},
	}, {
		name:    "removing an absent key is harmless",
		base:    map[string]uint64{"ns/a": 1},
		next:    map[string]uint64{"ns/a": 1},
		changed: []string{"ns/never"},
	}, {
		name: "full prunes stale keys",
		base: map[string]uint64{"ns/a": 1, "ns/b": 2, "ns/c": 3},
		next: map[string]uint64{"ns/a": 1, "ns/c": 30, "ns/d": 4},
		full: true,
	}, {
		name: "full ignores changed",
		base: map[string]uint64{"ns/a": 1, "ns/b": 2},
		next: map[string]uint64{"ns/c": 3},
		// A full save must not trust changed: it may be nil or partial.
		changed: []string{"ns/a"},
		full:    true,
	}, {
		name: "full to no entries",
		base: map[string]uint64{"ns/a": 1, "ns/b": 2},
		next: map[string]uint64{},
		full: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cache.db")
			c, _ := mustOpen(t, path)
			if err := c.Save(tableOf(t, tc.base), nil, true); err != nil {
				t.Fatalf("Save(base): %v", err)
			}
			next := tableOf(t, tc.next)
			if err := c.Save(next, tc.changed, tc.full); err != nil {
				t.Fatalf("Save(next): %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = tc.next
			}
			version, got := stored(t, path)
			if version != next.Version {
				t.Errorf("stored version = %q, want %q", version, next.Version)
			}
			if !maps.Equal(got, want) {
				t.Errorf("stored entries = %v, want %v", got, want)
			}
		})
	}
}

// TestSaveAllOrNothing fails a Save part way through its transaction (a
// key longer than bbolt allows, written after the meta keys and the other
// entries) and checks that the cache still holds the previous table.
func TestSaveAllOrNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	old := table(t, entry("ns/a", 1), entry("ns/b", 2))
	if err := c.Save(old, nil, true); err != nil {
		t.Fatalf("Save: %v", err)
	}
	// No valid table has such a key (names are DNS labels): build it by
	// hand, as Save does not validate.
	huge := entry("ns/"+strings.Repeat("z", bolt.MaxKeySize), 3)
	bad := &proxytable.Table{Version: old.Version, Node: old.Node, Entries: map[string]*pb.ServiceEntry{"ns/a": entry("ns/a", 10), huge.GetKey(): huge}}
	for _, full := range []bool{true, false} {
		err := c.Save(bad, []string{"ns/a", "ns/b", huge.GetKey()}, full)
		if err == nil || !strings.HasPrefix(err.Error(), "saving table: ") {
			t.Fatalf("Save(full=%t) = %v, want a saving table error", full, err)
		}
	}
	c, got := reload(t, c, path)
	equalTables(t, got, old)

	// A closed cache refuses to save and leaves the file as it was.
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Save(table(t, entry("ns/c", 3)), nil, true); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Fatalf("Save on a closed cache = %v, want ErrDatabaseNotOpen", err)
	}
	_, got = mustOpen(t, path)
	equalTables(t, got, old)
}

// TestSaveSequence applies a long run of random deltas and snapshots, as
// an agent would, and checks that the file always loads as the last table
// saved: every version adds up, so no save was half-written.
func TestSaveSequence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	rng := rand.New(rand.NewPCG(1, 2))
	cur := proxytable.Empty()
	for i := range 60 {
		// Remove some keys and upsert others; changed lists both, as
		// Table.Apply would.
		hashes := labels(cur)
		var changed []string
		for range rng.IntN(20) {
			key := fmt.Sprintf("ns%d/svc%d", rng.IntN(3), rng.IntN(40))
			if _, ok := hashes[key]; ok && rng.IntN(3) == 0 {
				delete(hashes, key)
			} else {
				hashes[key] = rng.Uint64()
			}
			changed = append(changed, key)
		}
		next := tableOf(t, hashes)
		full := i%5 == 0
		if err := c.Save(next, changed, full); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
		if i%7 == 0 {
			var got *proxytable.Table
			c, got = reload(t, c, path)
			equalTables(t, got, next)
		} else {
			got, err := c.Load()
			if err != nil {
				t.Fatalf("load after save %d: %v", i, err)
			}
			equalTables(t, got, next)
		}
		cur = next
	}
}

func TestOpenCorrupt(t *testing.T) {
	good := func(t *testing.T, path string) {
		t.Helper()
		c, _, err := Open(path, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer func() { _ = c.Close() }()
		if err := c.Save(table(t, entry("ns/a", 1), entry("ns/b", 2)), nil, true); err != nil {
			t.Fatalf("Save: %v", err)
		}
	}
	// edit saves a good table, then changes the file with fn.
	edit := func(fn func(tx *bolt.Tx) error) func(*testing.T, string) {
		return func(t *testing.T, path string) {
			t.Helper()
			good(t, path)
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatalf("bolt.Open: %v", err)
			}
			defer func() { _ = db.Close() }()
			if err := db.Update(fn); err != nil {
				t.Fatalf("editing the cache: %v", err)
			}
		}
	}
	put := func(bucket, key, value []byte) func(*testing.T, string) {
		return edit(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(key, value) })
	}

	for _, tc := range []struct {
		name    string
		prepare func(*testing.T, string)
		reason  string // in the log line
	}{{
		name: "garbage",
		prepare: func(t *testing.T, path string) {
			t.Helper()
			garbage := make([]byte, 64<<10)
			for i := range garbage {
				garbage[i] = byte(i*7 + 3)
			}
			if err := os.WriteFile(path, garbage, 0o600); err != nil {
				t.Fatal(err)
			}
		},
		reason: "invalid database",
	}, {
		name: "short garbage",
		prepare: func(t *testing.T, path string) {
			t.Helper()
			if err := os.WriteFile(path, []byte("not a database"), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		reason: "corrupt cache",
	}, {
		name: "truncated",
		prepare: func(t *testing.T, path string) {
			t.Helper()
			good(t, path)
			// Keep the meta pages, lose the data pages they point to.
			if err := os.Truncate(path, 2*int64(os.Getpagesize())+100); err != nil {
				t.Fatal(err)
			}
		},
		reason: "corrupt cache",
	}, {
		name:    "garbage entry",
		prepare: put(bucketEntries, []byte("ns/a"), []byte{0xff, 0xff, 0xff, 0xff}),
		reason:  `entry \"ns/a\"`,
	}, {
		name:    "entry under another key",
		prepare: put(bucketEntries, []byte("ns/z"), mustMarshal(t, entry("ns/a", 1))),
		reason:  `stored under \"ns/z\"`,
	}, {
		// A forged Service under the hash of the honest one: its version
		// adds up, and every replica would take it for current.
		name: "forged entry under its honest hash",
		prepare: put(bucketEntries, []byte("ns/a"), mustMarshal(t, func() *pb.ServiceEntry {
			e := entry("ns/a", 1)
			e.Service.ClusterEndpoints[0].Endpoints[0].Ip = "203.0.113.66"
			return e
		}())),
		reason: "is not its content",
	}, {
		// A planted node under the honest node's hash: its own replica
		// addresses and service CIDRs would steer and cut the agent off.
		name: "forged node under its honest hash",
		prepare: put(bucketMeta, keyNode, mustMarshal(t, func() *pb.NodeInfo {
			n := testNode()
			n.ControlPlaneAddresses = []string{"203.0.113.66:9640"}
			n.ServiceCidrs = []string{"10.0.0.0/8"}
			return n
		}())),
		reason: "node info hash",
	}, {
		name:    "version does not add up",
		prepare: put(bucketMeta, keyVersion, []byte("00000000000000ff")),
		reason:  "add up to version",
	}, {
		name:    "unknown schema",
		prepare: put(bucketMeta, keySchema, []byte("2")),
		reason:  "unknown schema",
	}, {
		name:    "no meta",
		prepare: edit(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketMeta) }),
		reason:  "no meta bucket",
	}, {
		name:    "no node",
		prepare: edit(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyNode) }),
		reason:  "lacks version or node",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cache.db")
			tc.prepare(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}

			log, buf := testLog()
			c, got, err := Open(path, log)
			if err != nil {
				t.Fatalf("Open = %v, want an empty cache", err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if got != nil {
				t.Errorf("Open loaded %v, want nil", got)
			}

			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files = %v, want one", aside)
			}
			if moved, err := os.ReadFile(aside[0]); err != nil || !bytes.Equal(moved, before) {
				t.Errorf("moved-aside file differs from the corrupt one (err %v)", err)
			}
			line := buf.String()
			for _, want := range []string{"level=ERROR", "path=" + path, "movedTo=" + aside[0], tc.reason} {
				if !strings.Contains(line, want) {
					t.Errorf("log lacks %q:\n%s", want, line)
				}
			}

			// The fresh cache works.
			want := table(t, entry("ns/fresh", 5))
			if err := c.Save(want, nil, true); err != nil {
				t.Fatalf("Save to the fresh cache: %v", err)
			}
			_, got = reload(t, c, path)
			equalTables(t, got, want)
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoadCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	if err := c.Save(table(t, entry("ns/a", 1)), nil, true); err != nil {
		t.Fatal(err)
	}
	if err := c.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyVersion, []byte("0000000000000000"))
	}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Load()
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, proxytable.ErrInvalidTable) {
		t.Errorf("Load = %v, want ErrCorrupt and ErrInvalidTable", err)
	}
}

// A cache written before tables carried a resource version loads with 0
// (unknown); one that does not parse is corrupt.
func TestLoadResourceVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	if err := c.Save(table(t, entry("ns/a", 1)), nil, true); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		write func(*bolt.Bucket) error
		want  uint64
		err   bool
	}{
		{"absent", func(b *bolt.Bucket) error { return b.Delete(keyResourceVersion) }, 0, false},
		{"garbage", func(b *bolt.Bucket) error { return b.Put(keyResourceVersion, []byte("12a")) }, 0, true},
		{"present", func(b *bolt.Bucket) error { return b.Put(keyResourceVersion, []byte("12")) }, 12, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.db.Update(func(tx *bolt.Tx) error { return tc.write(tx.Bucket(bucketMeta)) }); err != nil {
				t.Fatal(err)
			}
			got, err := c.Load()
			if tc.err {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Load = %v, want ErrCorrupt", err)
				}
				return
			}
			if err != nil || got.ResourceVersion != tc.want {
				t.Fatalf("Load = resource version %d, %v; want %d", got.ResourceVersion, err, tc.want)
			}
		})
	}
}

func TestOpenLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	want := table(t, entry("ns/a", 1))
	if err := c.Save(want, nil, true); err != nil {
		t.Fatal(err)
	}

	const timeout = 200 * time.Millisecond
	log, buf := testLog()
	start := time.Now()
	_, _, err := open(path, log, timeout)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) {
		t.Errorf("second Open = %v, want ErrLocked naming the path", err)
	}
	if d := time.Since(start); d > 10*timeout {
		t.Errorf("second Open took %v", d)
	}
	_, err = openReadOnly(path, timeout)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "WatchTable") {
		t.Errorf("OpenReadOnly while the agent runs = %v, want ErrLocked pointing to WatchTable", err)
	}

	// A locked cache is in use, not corrupt: it stays where it is.
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) > 0 || buf.Len() > 0 {
		t.Errorf("locked cache moved aside: %v; log: %s", aside, buf)
	}
	got, err := c.Load()
	if err != nil {
		t.Fatal(err)
	}
	equalTables(t, got, want)
}

func TestOpenReadOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	if _, err := OpenReadOnly(path); err == nil {
		t.Fatal("OpenReadOnly of a missing file succeeded")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenReadOnly created the file: %v", err)
	}

	c, _ := mustOpen(t, path)
	want := table(t, entry("ns/a", 1), entry("ns/b", 2))
	if err := c.Save(want, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// Two readers share the lock.
	r1, err := OpenReadOnly(path)
	if err != nil {
		t.Fatalf("OpenReadOnly: %v", err)
	}
	defer func() { _ = r1.Close() }()
	r2, err := OpenReadOnly(path)
	if err != nil {
		t.Fatalf("second OpenReadOnly: %v", err)
	}
	defer func() { _ = r2.Close() }()
	got, err := r2.Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	equalTables(t, got, want)
	if err := r1.Save(table(t), nil, true); !errors.Is(err, berrors.ErrDatabaseReadOnly) {
		t.Errorf("Save on a read-only cache = %v, want ErrDatabaseReadOnly", err)
	}
}

func TestOpenCreatesDirectories(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "lib", "proxyplane")
	path := filepath.Join(dir, "cache.db")
	c, got := mustOpen(t, path)
	if got != nil {
		t.Errorf("new cache loaded %v", got)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode = %v, want %v", p, fi.Mode(), want)
		}
	}
	if err := c.Save(table(t, entry("ns/a", 1)), nil, true); err != nil {
		t.Fatal(err)
	}
}

func TestOpenUnwritableDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root ignores directory permissions")
	}
	dir := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	_, _, err := Open(filepath.Join(dir, "cache.db"), slog.New(slog.DiscardHandler))
	if !errors.Is(err, os.ErrPermission) {
		t.Errorf("Open in a read-only directory = %v, want a permission error", err)
	}
}
