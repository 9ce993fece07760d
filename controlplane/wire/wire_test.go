package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	_ "google.golang.org/protobuf/types/known/timestamppb" // registers google.protobuf.Timestamp

	_ "github.com/proxyplane/proxyplane/gen/proxyplane/v1" // registers the messages checked
)

// handField is what the hand-written code assumes of one field.
type handField struct {
	name    string                // the constant's name in wire.go
	num     protowire.Number      // the constant
	message protoreflect.FullName // the message it belongs to
	field   protoreflect.Name     // the field's name in the .proto
	kind    protoreflect.Kind
	// typ is the wire type the hand-written code writes or expects. Kind
	// alone would not catch a change between kinds of one wire type with
	// different encodings (int64 and sint64, say), so both are checked.
	typ      protowire.Type
	repeated bool // written more than once per message (or a map)
	// elem is the message type of a message field: the hand-written code
	// splices bytes of exactly this type.
	elem protoreflect.FullName
}

// handFields is every constant of wire.go and what the code that uses it
// assumes.
var handFields = []handField{
	{"SyncRequestHello", SyncRequestHello, "proxyplane.v1.SyncRequest", "hello", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Hello"},
	{"HelloEntryHashes", HelloEntryHashes, "proxyplane.v1.Hello", "entry_hashes", protoreflect.MessageKind, protowire.BytesType, true, "proxyplane.v1.Hello.EntryHashesEntry"},

	{"SyncResponseNonce", SyncResponseNonce, "proxyplane.v1.SyncResponse", "nonce", protoreflect.StringKind, protowire.BytesType, false, ""},
	{"SyncResponseSnapshot", SyncResponseSnapshot, "proxyplane.v1.SyncResponse", "snapshot", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Snapshot"},
	{"SyncResponseDelta", SyncResponseDelta, "proxyplane.v1.SyncResponse", "delta", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Delta"},
	{"WatchTableResponseSnapshot", WatchTableResponseSnapshot, "proxyplane.v1.WatchTableResponse", "snapshot", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Snapshot"},
	{"WatchTableResponseDelta", WatchTableResponseDelta, "proxyplane.v1.WatchTableResponse", "delta", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Delta"},

	{"SnapshotVersion", SnapshotVersion, "proxyplane.v1.Snapshot", "version", protoreflect.StringKind, protowire.BytesType, false, ""},
	{"SnapshotNode", SnapshotNode, "proxyplane.v1.Snapshot", "node", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.NodeInfo"},
	{"SnapshotEntries", SnapshotEntries, "proxyplane.v1.Snapshot", "entries", protoreflect.MessageKind, protowire.BytesType, true, "proxyplane.v1.ServiceEntry"},
	{"SnapshotResourceVersion", SnapshotResourceVersion, "proxyplane.v1.Snapshot", "resource_version", protoreflect.Uint64Kind, protowire.VarintType, false, ""},
	{"SnapshotZstdEntries", SnapshotZstdEntries, "proxyplane.v1.Snapshot", "zstd_entries", protoreflect.BytesKind, protowire.BytesType, true, ""},
	{"SnapshotZstdEntriesUnhashed", SnapshotZstdEntriesUnhashed, "proxyplane.v1.Snapshot", "zstd_entries_unhashed", protoreflect.BytesKind, protowire.BytesType, true, ""},

	{"DeltaBaseVersion", DeltaBaseVersion, "proxyplane.v1.Delta", "base_version", protoreflect.StringKind, protowire.BytesType, false, ""},
	{"DeltaVersion", DeltaVersion, "proxyplane.v1.Delta", "version", protoreflect.StringKind, protowire.BytesType, false, ""},
	{"DeltaNode", DeltaNode, "proxyplane.v1.Delta", "node", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.NodeInfo"},
	{"DeltaUpserts", DeltaUpserts, "proxyplane.v1.Delta", "upserts", protoreflect.MessageKind, protowire.BytesType, true, "proxyplane.v1.ServiceEntry"},
	{"DeltaRemovals", DeltaRemovals, "proxyplane.v1.Delta", "removals", protoreflect.StringKind, protowire.BytesType, true, ""},
	{"DeltaResourceVersion", DeltaResourceVersion, "proxyplane.v1.Delta", "resource_version", protoreflect.Uint64Kind, protowire.VarintType, false, ""},

	{"ServiceEntryKey", ServiceEntryKey, "proxyplane.v1.ServiceEntry", "key", protoreflect.StringKind, protowire.BytesType, false, ""},
	{"ServiceEntryHash", ServiceEntryHash, "proxyplane.v1.ServiceEntry", "hash", protoreflect.Fixed64Kind, protowire.Fixed64Type, false, ""},
	{"ServiceEntryService", ServiceEntryService, "proxyplane.v1.ServiceEntry", "service", protoreflect.MessageKind, protowire.BytesType, false, "proxyplane.v1.Service"},
	{"ServiceEntryTriggerTime", ServiceEntryTriggerTime, "proxyplane.v1.ServiceEntry", "trigger_time", protoreflect.MessageKind, protowire.BytesType, false, "google.protobuf.Timestamp"},

	{"TimestampSeconds", TimestampSeconds, "google.protobuf.Timestamp", "seconds", protoreflect.Int64Kind, protowire.VarintType, false, ""},
	{"TimestampNanos", TimestampNanos, "google.protobuf.Timestamp", "nanos", protoreflect.Int32Kind, protowire.VarintType, false, ""},
}

// assembled are the messages that the control plane writes itself, field
// by field: a field of one that no constant names is never sent, so each
// such field must be listed here with the reason it need not be.
var assembled = map[protoreflect.FullName]map[protoreflect.Name]string{
	"proxyplane.v1.SyncResponse": {
		"keepalive": "keepalives carry no table and go through the generated type (server/sync.go)",
	},
	"proxyplane.v1.WatchTableResponse": {},
	"proxyplane.v1.Snapshot":           {},
	"proxyplane.v1.Delta":              {},
	"proxyplane.v1.ServiceEntry":       {},
	"google.protobuf.Timestamp":        {},
}

// TestFieldNumbers checks each hand-written field number against the
// generated descriptors.
func TestFieldNumbers(t *testing.T) {
	for _, h := range handFields {
		t.Run(h.name, func(t *testing.T) {
			f := lookupField(t, h.message, h.field)
			if f == nil {
				return
			}
			if f.Number() != h.num {
				t.Errorf("%s = %d, but %s is field %d", h.name, h.num, f.FullName(), f.Number())
			}
			if f.Kind() != h.kind {
				t.Errorf("%s: %s is %v, the hand-written code handles %v", h.name, f.FullName(), f.Kind(), h.kind)
			}
			if typ, ok := wireType(f.Kind()); !ok || typ != h.typ {
				t.Errorf("%s: %s (%v) is not encoded as wire type %d, which the hand-written code uses", h.name, f.FullName(), f.Kind(), h.typ)
			}
			if got := f.Cardinality() == protoreflect.Repeated; got != h.repeated {
				t.Errorf("%s: %s repeated = %v, the hand-written code assumes %v", h.name, f.FullName(), got, h.repeated)
			}
			var elem protoreflect.FullName
			if m := f.Message(); m != nil {
				elem = m.FullName()
			}
			if elem != h.elem {
				t.Errorf("%s: %s holds message %q, the hand-written code splices %q", h.name, f.FullName(), elem, h.elem)
			}
		})
	}
}

// TestAssembledMessagesComplete fails when a message the control plane
// writes by hand gains a field that nothing writes.
func TestAssembledMessagesComplete(t *testing.T) {
	written := map[protoreflect.FullName]bool{}
	for _, h := range handFields {
		written[h.message.Append(h.field)] = true
	}
	for name, skipped := range assembled {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			t.Errorf("message %s: %v", name, err)
			continue
		}
		fields := d.(protoreflect.MessageDescriptor).Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			_, skip := skipped[f.Name()]
			switch {
			case written[f.FullName()] && skip:
				t.Errorf("%s is both written and listed as not written", f.FullName())
			case !written[f.FullName()] && !skip:
				t.Errorf("%s (field %d) is never written by the hand encoder: add a constant to wire.go, write it, and add a row to handFields (or list it in assembled with the reason it needs none)", f.FullName(), f.Number())
			}
		}
		for n := range skipped {
			if fields.ByName(n) == nil {
				t.Errorf("%s has no field %s, listed as not written", name, n)
			}
		}
	}
}

// TestEveryConstantChecked fails when wire.go declares a field number that
// handFields does not check.
func TestEveryConstantChecked(t *testing.T) {
	file, err := parser.ParseFile(token.NewFileSet(), "wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, h := range handFields {
		rows[h.name]++
	}
	declared := map[string]bool{}
	for _, decl := range file.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			for _, id := range spec.(*ast.ValueSpec).Names {
				declared[id.Name] = true
				if rows[id.Name] != 1 {
					t.Errorf("constant %s has %d rows in handFields, want 1", id.Name, rows[id.Name])
				}
			}
		}
	}
	for name := range rows {
		if !declared[name] {
			t.Errorf("handFields names %s, which wire.go does not declare", name)
		}
	}
}

func lookupField(t *testing.T, message protoreflect.FullName, field protoreflect.Name) protoreflect.FieldDescriptor {
	t.Helper()
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(message)
	if err != nil {
		t.Errorf("message %s: %v", message, err)
		return nil
	}
	m, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		t.Errorf("%s is a %T, not a message", message, d)
		return nil
	}
	f := m.Fields().ByName(field)
	if f == nil {
		t.Errorf("message %s has no field %s", message, field)
	}
	return f
}

// wireType is the wire type of a non-packed field of kind k.
func wireType(k protoreflect.Kind) (protowire.Type, bool) {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind,
		protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType, true
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type, true
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type, true
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType, true
	case protoreflect.GroupKind:
		return protowire.StartGroupType, true
	}
	return 0, false
}
