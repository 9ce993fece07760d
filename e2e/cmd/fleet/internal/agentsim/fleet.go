// Package agentsim runs many simulated node agents in one process, each
// with its own gRPC connection to the control plane (plaintext, or TLS
// with its own bearer token, as nodeagent/client dials), as the fleet
// harness's agents' process. An agent says hello as nodeagent/client
// does, decodes every response into the generated types, validates it
// with the agent's own code (nodeagent/proxytable), ACKs or NACKs it, and
// answers keepalives; it keeps only versions and entry hashes, in tables
// shared by every agent holding the same entries (hashtable).
//
// The harness drives it over a local HTTP endpoint: POST /start connects
// every agent, spread over a time; GET /report returns the counts, each
// agent's state and what every agent saw of every change.
package agentsim

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/hashtable"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/rendezvous"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Options configures the agents' process.
type Options struct {
	// Addresses are the control plane replicas' gRPC addresses, on
	// 127.0.0.1. Each agent tries them in its rendezvous order
	// (internal/rendezvous), as nodeagent/client does with its configured
	// addresses: its first choice, and the next one after each stream
	// that ends.
	Addresses []string
	// Nodes is the number of agents; agent i is node contract.NodeName(NodePrefix, i).
	Nodes      int
	NodePrefix string
	// TrackAfter: entries with a trigger time after it (Unix nanoseconds)
	// are the harness's changes, and are tracked.
	TrackAfter int64
	// MaxChanges bounds the tracked changes (each costs 16 bytes per
	// agent).
	MaxChanges int
	// BackoffMin, BackoffMax and SilenceTimeout are nodeagent's.
	BackoffMin, BackoffMax, SilenceTimeout time.Duration
	// MaxRecvMessageBytes is nodeagent's bound on a response.
	MaxRecvMessageBytes int
	// Decoders bounds responses decoded and processed at once.
	Decoders int
	// ZstdEntries: the agents announce Capabilities.zstd_entries and
	// zstd_entries_unhashed, as nodeagent does, and inflate compressed
	// snapshots, computing the hashes of runs sent without, with
	// nodeagent/client's own Inflate.
	ZstdEntries bool
	// Lifetime bounds the process: it exits after this long whatever
	// happens.
	Lifetime time.Duration
	// CAFile, when set, makes the agents dial with TLS, trusting only
	// this PEM bundle and expecting ServerName, and send the tokens of
	// TokenFile (one line per agent, in agent order) as bearer tokens;
	// unset, they dial in plaintext and send none.
	CAFile, ServerName, TokenFile string
}

// NewOptions returns the defaults, nodeagent's where they are its.
func NewOptions() *Options {
	return &Options{
		NodePrefix: "fleet-node-",
		MaxChanges: 100000,
		// nodeagent/app's values.
		BackoffMin: 500 * time.Millisecond, BackoffMax: 30 * time.Second, SilenceTimeout: time.Minute,
		MaxRecvMessageBytes: 64 << 20,
		// Twice the cores of this machine: enough to keep them busy, few
		// enough that decoded 10,000-entry snapshots stay a few.
		Decoders: 4,
		Lifetime: 2 * time.Hour,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&o.Addresses, "address", o.Addresses, "Control plane gRPC address (127.0.0.1:port); repeated or comma-separated for replicas.")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "Number of agents.")
	fs.StringVar(&o.NodePrefix, "node-prefix", o.NodePrefix, "Node name prefix; agent i is <prefix><i, 5 digits>.")
	fs.Int64Var(&o.TrackAfter, "track-after", o.TrackAfter, "Track entries whose trigger time is after this (Unix nanoseconds).")
	fs.IntVar(&o.MaxChanges, "max-changes", o.MaxChanges, "Most changes tracked.")
	fs.DurationVar(&o.BackoffMin, "backoff-min", o.BackoffMin, "Reconnect backoff minimum (nodeagent's).")
	fs.DurationVar(&o.BackoffMax, "backoff-max", o.BackoffMax, "Reconnect backoff maximum (nodeagent's).")
	fs.DurationVar(&o.SilenceTimeout, "silence-timeout", o.SilenceTimeout, "End a stream silent for this long (nodeagent's).")
	fs.IntVar(&o.MaxRecvMessageBytes, "max-recv-message-bytes", o.MaxRecvMessageBytes, "Largest response accepted (nodeagent's).")
	fs.IntVar(&o.Decoders, "decoders", o.Decoders, "Responses decoded and processed at once.")
	fs.BoolVar(&o.ZstdEntries, "zstd-entries", o.ZstdEntries, "Announce compressed snapshots, hashed and unhashed, and inflate them (nodeagent's client does).")
	fs.DurationVar(&o.Lifetime, "lifetime", o.Lifetime, "Exit after this long in any case.")
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "Dial with TLS trusting only this PEM bundle (default: plaintext, no tokens).")
	fs.StringVar(&o.ServerName, "server-name", o.ServerName, "Name the control plane's certificate must carry (with --ca-file).")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "Bearer tokens, one line per agent in agent order (with --ca-file).")
}

// Limits implements contract.ChildOptions: one connection per simulated agent.
func (o *Options) Limits() (int, time.Duration) { return o.Nodes, o.Lifetime }

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if len(o.Addresses) == 0 {
		errs = append(errs, errors.New("--address: at least one"))
	}
	for _, a := range o.Addresses {
		if host, _, err := net.SplitHostPort(a); err != nil || host != "127.0.0.1" {
			errs = append(errs, fmt.Errorf("--address %q: want 127.0.0.1:port", a))
		}
	}
	// Source addresses are 127.16.0.1 onwards (sourceAddr).
	if o.Nodes < 1 || o.Nodes > 1<<20 {
		errs = append(errs, fmt.Errorf("--nodes %d: between 1 and %d", o.Nodes, 1<<20))
	}
	if o.MaxChanges < 1 || o.Decoders < 1 || o.MaxRecvMessageBytes < 1<<20 {
		errs = append(errs, errors.New("--max-changes and --decoders must be positive, --max-recv-message-bytes at least 1 MiB"))
	}
	if o.BackoffMin <= 0 || o.BackoffMax < o.BackoffMin || o.SilenceTimeout <= 0 || o.Lifetime <= 0 {
		errs = append(errs, errors.New("--backoff-min, --silence-timeout and --lifetime must be positive, --backoff-max at least --backoff-min"))
	}
	if o.CAFile != "" && (o.ServerName == "" || o.TokenFile == "") {
		errs = append(errs, errors.New("--ca-file needs --server-name and --token-file"))
	}
	if o.CAFile == "" && (o.ServerName != "" || o.TokenFile != "") {
		errs = append(errs, errors.New("--server-name and --token-file need --ca-file: plaintext sends no token"))
	}
	return errors.Join(errs...)
}

// fleet is what the agents share.
type fleet struct {
	opts     *Options
	agents   []*agent
	slots    chan struct{}
	interner *hashtable.Interner
	tracker  *tracker
	creds    *credentialSet
	started  atomic.Int64

	counters struct {
		snapshots, deltas, keepalives, snapshotBytes, deltaBytes, wire atomic.Uint64
		acks, nacks, sessions, reconnects, failures                    atomic.Uint64
	}
	mu         sync.Mutex // guards nackErrors and ends
	nackErrors []string
	ends       map[string]uint64
}

func newFleet(o *Options, creds *credentialSet) *fleet {
	f := &fleet{
		opts:     o,
		creds:    creds,
		slots:    make(chan struct{}, o.Decoders),
		interner: hashtable.NewInterner(),
		tracker:  newTracker(o.TrackAfter, o.Nodes, o.MaxChanges),
		ends:     map[string]uint64{},
	}
	f.agents = make([]*agent, o.Nodes)
	for i := range f.agents {
		name := contract.NodeName(o.NodePrefix, i)
		f.agents[i] = &agent{idx: i, name: name, f: f, order: rendezvous.Order(name, o.Addresses)}
	}
	return f
}

// fromSnapshot validates a snapshot as the agent does
// (proxytable.FromSnapshot: every entry, and that they add up to the
// version) and returns what the agent keeps of it.
func (f *fleet) fromSnapshot(s *pb.Snapshot) (held, error) {
	if _, err := proxytable.FromSnapshot(s); err != nil {
		return held{}, fmt.Errorf("snapshot: %w", err)
	}
	return held{
		version: s.GetVersion(), nodeHash: s.GetNode().GetHash(), nodeName: s.GetNode().GetName(),
		table: f.interner.Snapshot(s.GetEntries()),
	}, nil
}

// applyDelta validates a delta as proxytable.Table.Apply does, on the
// hashes the agent keeps instead of the entries: it must apply to the
// version held, remove only held entries, carry only valid entries
// (proxytable.ValidateEntry), and add up to its version.
func (f *fleet) applyDelta(h held, d *pb.Delta) (held, error) {
	if d.GetBaseVersion() != h.version {
		return held{}, &proxytable.ValidationError{Table: []error{fmt.Errorf("delta applies to %q, the agent holds %q", d.GetBaseVersion(), h.version)}}
	}
	ve := &proxytable.ValidationError{}
	for _, e := range d.GetUpserts() {
		if err := proxytable.ValidateEntry(e); err != nil {
			ve.Entries = append(ve.Entries, err)
		}
	}
	t, err := f.interner.Apply(h.table, d.GetUpserts(), d.GetRemovals())
	if err != nil {
		ve.Table = append(ve.Table, err)
		return held{}, ve
	}
	next := held{version: d.GetVersion(), nodeHash: h.nodeHash, nodeName: h.nodeName, table: t}
	if n := d.GetNode(); n != nil {
		next.nodeHash, next.nodeName = n.GetHash(), n.GetName()
	}
	if next.nodeName == "" {
		ve.Table = append(ve.Table, errors.New("no node info"))
	}
	if want, ok := versionSum(d.GetVersion()); !ok || want != t.Sum()+next.nodeHash {
		ve.Table = append(ve.Table, fmt.Errorf("entries add up to version %016x, not %q", t.Sum()+next.nodeHash, d.GetVersion()))
	}
	if len(ve.Entries)+len(ve.Table) > 0 {
		return held{}, ve
	}
	return next, nil
}

// tracked returns the entries carrying one of the harness's changes.
func (f *fleet) tracked(entries []*pb.ServiceEntry) []seen {
	var out []seen
	for _, e := range entries {
		tt := e.GetTriggerTime()
		if tt == nil {
			continue
		}
		if t := tt.GetSeconds()*int64(time.Second) + int64(tt.GetNanos()); t > f.tracker.after {
			out = append(out, seen{key: e.GetKey(), trigger: t})
		}
	}
	return out
}

// maxNackErrors bounds the NACK messages kept for the report.
const maxNackErrors = 10

func (f *fleet) noteNack(err error) {
	f.counters.nacks.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.nackErrors) < maxNackErrors {
		f.nackErrors = append(f.nackErrors, err.Error())
	}
}

// maxEndReasons bounds the distinct session-end reasons kept.
const maxEndReasons = 20

// noteEnd counts why a session ended, for the report.
func (f *fleet) noteEnd(err error) {
	msg := "ended without error"
	if err != nil {
		msg = err.Error()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.ends[msg]; ok || len(f.ends) < maxEndReasons {
		f.ends[msg]++
	}
}
