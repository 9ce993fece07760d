package cache

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

const (
	// schema is the layout version in meta/schema. A file with any other
	// value is treated as corrupt: after a downgrade the agent starts
	// empty and gets its table from the control plane, which is always
	// safe for a cache.
	schema = "1"

	// lockTimeout bounds the wait for the file lock. On a restart the old
	// agent may hold it for a moment while it exits; a second agent on the
	// node must fail with a clear error rather than hang.
	lockTimeout = 3 * time.Second

	// The cache is the agent's private state.
	fileMode = 0o600
	dirMode  = 0o700

	// asideFormat names moved-aside files; nanoseconds so that a crash
	// loop cannot rename one corrupt file over another.
	asideFormat = "20060102T150405.000000000Z"
)

var (
	bucketMeta    = []byte("meta")
	bucketEntries = []byte("entries")

	keySchema  = []byte("schema")
	keyVersion = []byte("version")
	keyNode    = []byte("node")
	keySavedAt = []byte("saved_at")
	// keyResourceVersion holds the table's ResourceVersion in decimal;
	// caches written before it existed lack it, which reads as 0.
	keyResourceVersion = []byte("resource_version")

	// Deterministic, so that an unchanged entry encodes to the bytes
	// already stored and Save can skip it.
	marshal = proto.MarshalOptions{Deterministic: true}
)

// Cache is the node agent's table cache: one bbolt file, locked while
// open. Its methods are safe for concurrent use.
type Cache struct {
	db *bolt.DB
}

// Open opens the cache at path, creating the file (mode 0600) and its
// directories if needed, and loads the table stored there: nil when the
// cache is empty.
//
// A file that cannot be read as a cache (see ErrCorrupt) is renamed to
// "<path>.corrupt-<UTC time>", reported on log at Error level, and
// replaced by an empty cache: Open then returns a nil table and no error.
// Open fails only when it cannot open a usable cache at all: for example
// when the directory is not writable, or with ErrLocked when another
// process holds the file (after a few seconds, not forever). A nil log
// means slog.Default().
func Open(path string, log *slog.Logger) (*Cache, *proxytable.Table, error) {
	return open(path, log, lockTimeout)
}

func open(path string, log *slog.Logger, timeout time.Duration) (*Cache, *proxytable.Table, error) {
	if log == nil {
		log = slog.Default()
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, nil, fmt.Errorf("opening cache: %w", err)
	}
	c, t, err := openAndLoad(path, timeout)
	if errors.Is(err, ErrCorrupt) {
		aside := path + ".corrupt-" + time.Now().UTC().Format(asideFormat)
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, nil, fmt.Errorf("moving corrupt cache aside: %w (it is corrupt: %w)", rerr, err)
		}
		log.Error("table cache is unreadable; moved it aside, starting empty and waiting for the control plane",
			"path", path, "movedTo", aside, "err", err)
		c, t, err = openAndLoad(path, timeout)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("opening cache %s: %w", path, err)
	}
	// bbolt fsyncs the file it creates but not the directory entry, which
	// a crash could otherwise lose along with every table saved in it.
	if err := syncDir(dir); err != nil {
		_ = c.Close()
		return nil, nil, fmt.Errorf("opening cache %s: %w", path, err)
	}
	return c, t, nil
}

// OpenReadOnly opens the cache at path for reading, for an operator
// command: Save on it fails. It never moves or creates the file.
//
// It takes bbolt's shared lock, which a running agent's exclusive lock
// excludes, so while the agent runs it fails with ErrLocked after a few
// seconds. Copying the file instead would be unsafe: bbolt's
// copy-on-write protects only the read transactions of its own process,
// and a page freed by one commit is reused by the next, so a copy racing
// two commits can mix pages of different tables. Load's version check
// would catch most such mixes, but not a changed Service under an
// unchanged hash. For a running agent, the control plane's WatchTable
// shows the node's table and ListNodes the version the agent acknowledged
// (and therefore had persisted).
func OpenReadOnly(path string) (*Cache, error) {
	return openReadOnly(path, lockTimeout)
}

func openReadOnly(path string, timeout time.Duration) (*Cache, error) {
	c, err := openDB(path, timeout, true)
	switch {
	case errors.Is(err, ErrLocked):
		return nil, fmt.Errorf("opening cache %s read-only: %w: a running agent holds it; stop the agent, or watch the node's table with the control plane's WatchTable", path, err)
	case err != nil:
		return nil, fmt.Errorf("opening cache %s read-only: %w", path, err)
	}
	return c, nil
}

// openAndLoad opens path read-write and loads its table.
func openAndLoad(path string, timeout time.Duration) (*Cache, *proxytable.Table, error) {
	c, err := openDB(path, timeout, false)
	if err != nil {
		return nil, nil, err
	}
	t, err := c.Load()
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return c, t, nil
}

// openDB opens the bbolt file. Errors opening or locking the file are
// returned as they are (ErrLocked for the lock); any other failure comes
// from the file's content and wraps ErrCorrupt.
func openDB(path string, timeout time.Duration, readOnly bool) (*Cache, error) {
	var f *os.File // bbolt's file, to release it if bbolt panics
	opts := &bolt.Options{
		Timeout:  timeout,
		ReadOnly: readOnly,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			var err error
			f, err = os.OpenFile(name, flag, perm)
			return f, err
		},
	}
	var db *bolt.DB
	err := guard(func() error {
		var err error
		db, err = bolt.Open(path, fileMode, opts)
		return err
	})
	var pathErr *fs.PathError
	switch {
	case err == nil:
		return &Cache{db: db}, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("%w (waited %s)", ErrLocked, timeout)
	case errors.Is(err, ErrCorrupt): // a panic: bbolt still holds the file and its lock
		if f != nil {
			_ = f.Close()
		}
		return nil, err
	case errors.As(err, &pathErr): // opening or reading the file, not its content
		return nil, err
	default:
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
}

// Save stores t, in one transaction: all of it or, on error, nothing.
// With full, the cache afterwards holds exactly t's entries. Otherwise
// only the keys in changed are written: those in t are stored, the others
// deleted; the caller guarantees that the other entries are unchanged
// (proxytable.Table.Apply returns such keys). Saving the empty table
// (Version "") empties the cache. Save returns once the transaction is on
// disk (fsynced).
func (c *Cache) Save(t *proxytable.Table, changed []string, full bool) error {
	if err := c.db.Update(func(tx *bolt.Tx) error { return write(tx, t, changed, full) }); err != nil {
		return fmt.Errorf("saving table: %w", err)
	}
	return nil
}

func write(tx *bolt.Tx, t *proxytable.Table, changed []string, full bool) error {
	if t.Version == "" {
		// Rather than a table that cannot validate, leave a cache that
		// loads as empty.
		for _, name := range [][]byte{bucketMeta, bucketEntries} {
			if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
		}
		return nil
	}
	node, err := marshal.Marshal(t.Node)
	if err != nil {
		return fmt.Errorf("encoding node: %w", err)
	}
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	for _, kv := range [][2][]byte{
		{keySchema, []byte(schema)},
		{keyVersion, []byte(t.Version)},
		{keyNode, node},
		{keySavedAt, []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		{keyResourceVersion, strconv.AppendUint(nil, t.ResourceVersion, 10)},
	} {
		if err := meta.Put(kv[0], kv[1]); err != nil {
			return fmt.Errorf("writing %s: %w", kv[0], err)
		}
	}
	entries, err := tx.CreateBucketIfNotExists(bucketEntries)
	if err != nil {
		return err
	}
	keys := changed
	if full {
		keys = t.Keys()
		// Collect first: deleting under a cursor can make it skip keys.
		var stale [][]byte
		if err := entries.ForEach(func(k, _ []byte) error {
			if _, ok := t.Entries[string(k)]; !ok {
				stale = append(stale, bytes.Clone(k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range stale {
			if err := entries.Delete(k); err != nil {
				return fmt.Errorf("deleting entry %q: %w", k, err)
			}
		}
	}
	for _, k := range keys {
		e, ok := t.Entries[k]
		if !ok {
			if err := entries.Delete([]byte(k)); err != nil {
				return fmt.Errorf("deleting entry %q: %w", k, err)
			}
			continue
		}
		v, err := marshal.Marshal(e)
		if err != nil {
			return fmt.Errorf("encoding entry %q: %w", k, err)
		}
		if bytes.Equal(entries.Get([]byte(k)), v) {
			continue // leave its page clean
		}
		if err := entries.Put([]byte(k), v); err != nil {
			return fmt.Errorf("writing entry %q: %w", k, err)
		}
	}
	return nil
}

// Load reads and validates the stored table: nil when the cache is empty.
// Every content problem, including a bbolt panic or memory fault on a
// damaged file, is an error wrapping ErrCorrupt (and
// proxytable.ErrInvalidTable when the table does not validate).
func (c *Cache) Load() (*proxytable.Table, error) {
	var t *proxytable.Table
	err := guard(func() error {
		return c.db.View(func(tx *bolt.Tx) error {
			var err error
			t, err = read(tx)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("loading table: %w", err)
	}
	return t, nil
}

func read(tx *bolt.Tx) (*proxytable.Table, error) {
	meta, entries := tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)
	switch {
	case meta == nil && entries == nil:
		return nil, nil
	case meta == nil:
		return nil, fmt.Errorf("%w: no %s bucket", ErrCorrupt, bucketMeta)
	case entries == nil:
		return nil, fmt.Errorf("%w: no %s bucket", ErrCorrupt, bucketEntries)
	}
	if s := meta.Get(keySchema); string(s) != schema {
		return nil, fmt.Errorf("%w: unknown schema %q, this agent reads %q", ErrCorrupt, s, schema)
	}
	version, nodeBytes := meta.Get(keyVersion), meta.Get(keyNode)
	if version == nil || nodeBytes == nil {
		return nil, fmt.Errorf("%w: meta lacks version or node", ErrCorrupt)
	}
	node := &pb.NodeInfo{}
	if err := proto.Unmarshal(nodeBytes, node); err != nil {
		return nil, fmt.Errorf("%w: node: %w", ErrCorrupt, err)
	}
	var list []*pb.ServiceEntry
	err := entries.ForEach(func(k, v []byte) error {
		e := &pb.ServiceEntry{}
		if err := proto.Unmarshal(v, e); err != nil { // copies: v lives only as long as tx
			return fmt.Errorf("%w: entry %q: %w", ErrCorrupt, k, err)
		}
		if e.GetKey() != string(k) {
			return fmt.Errorf("%w: entry stored under %q has key %q", ErrCorrupt, k, e.GetKey())
		}
		list = append(list, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var rv uint64
	if b := meta.Get(keyResourceVersion); b != nil {
		var err error
		if rv, err = strconv.ParseUint(string(b), 10, 64); err != nil {
			return nil, fmt.Errorf("%w: resource version: %w", ErrCorrupt, err)
		}
	}
	t, err := proxytable.FromEntries(string(version), node, list)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	// Whoever can write the state directory could otherwise plant an
	// entry under the hash of the honest one: every replica would take
	// it for current and never send the real one.
	if err := proxytable.VerifyHashes(t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	t.ResourceVersion = rv // t is new, and nobody else's yet
	return t, nil
}

// SavedAt returns when the stored table was saved: the zero time when the
// cache is empty, an error wrapping ErrCorrupt when the time is missing
// or does not parse.
func (c *Cache) SavedAt() (time.Time, error) {
	var at time.Time
	err := guard(func() error {
		return c.db.View(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if meta == nil {
				return nil
			}
			var err error
			if at, err = time.Parse(time.RFC3339Nano, string(meta.Get(keySavedAt))); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrCorrupt, keySavedAt, err)
			}
			return nil
		})
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("reading save time: %w", err)
	}
	return at, nil
}

// Close closes the file and releases its lock. Calling it again does
// nothing; the other methods fail after it.
func (c *Cache) Close() error {
	if err := c.db.Close(); err != nil {
		return fmt.Errorf("closing cache: %w", err)
	}
	return nil
}

// guard runs fn, which reads a bbolt file, and returns a panic in it as an
// error wrapping ErrCorrupt. bbolt trusts its pages: on a damaged file it
// may panic, or touch memory past the end of a truncated file, which
// without SetPanicOnFault would kill the process with SIGBUS.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: bbolt failed reading it: %v", ErrCorrupt, r)
		}
	}()
	return fn()
}

// syncDir fsyncs a directory, making the entries created in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return d.Close()
}
