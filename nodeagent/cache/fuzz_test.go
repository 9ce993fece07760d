package cache

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// fuzzCacheFile returns the bytes of a cache holding a valid table of two
// Services.
func fuzzCacheFile(f *testing.F) []byte {
	f.Helper()
	path := filepath.Join(f.TempDir(), "table.db")
	c, _, err := Open(path, slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	if err := c.Save(table(f, entry("default/a", 1), entry("default/b", 2)), nil, true); err != nil {
		f.Fatal(err)
	}
	if err := c.Close(); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// checkOpen opens the cache at path as the agent does at start: it must
// not fail or panic whatever the file holds, and a table it returns must
// validate (a corrupt cache is moved aside and the agent starts empty).
func checkOpen(t *testing.T, path string) {
	t.Helper()
	c, tbl, err := Open(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() { _ = c.Close() }()
	if tbl == nil {
		return
	}
	if _, err := proxytable.FromEntries(tbl.Version, tbl.Node, slices.Collect(maps.Values(tbl.Entries))); err != nil {
		t.Fatalf("Open returned a table that does not validate: %v", err)
	}
}

// FuzzOpenFile opens arbitrary bytes as the cache file.
func FuzzOpenFile(f *testing.F) {
	f.Add(fuzzCacheFile(f))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "table.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		checkOpen(t, path)
	})
}

// FuzzStoredValues writes arbitrary values under the keys a cache holds
// (the version, the node, one entry) in an otherwise valid file: the
// damage bbolt's checksums do not see, from a bug or an older agent.
func FuzzStoredValues(f *testing.F) {
	valid := fuzzCacheFile(f)
	e := entry("default/a", 1)
	eb, err := proto.Marshal(e)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("0000000000000003"), []byte{}, "default/a", eb)
	f.Add([]byte("zz"), []byte{0xff}, "default/c", []byte{0x0a, 0x01})
	f.Fuzz(func(t *testing.T, version, node []byte, key string, value []byte) {
		if key == "" {
			return // bbolt refuses an empty key
		}
		path := filepath.Join(t.TempDir(), "table.db")
		if err := os.WriteFile(path, valid, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			meta, entries := tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)
			if err := meta.Put(keyVersion, version); err != nil {
				return err
			}
			if len(node) > 0 {
				if err := meta.Put(keyNode, node); err != nil {
					return err
				}
			}
			return entries.Put([]byte(key), value)
		})
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Skip("bbolt refused the write:", err)
		}
		checkOpen(t, path)
	})
}
