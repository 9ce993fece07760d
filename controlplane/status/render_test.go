package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
)

func lag(d time.Duration) *Seconds { s := Seconds(d); return &s }

func TestWriteTable(t *testing.T) {
	rep := &Report{Nodes: []Row{
		{Node: "node-0", Known: true, Connected: true, Replica: "10.0.0.5:9640", AckedVersion: "0d87f81ad851cfb5", CurrentVersion: "0d87f81ad851cfb5", Lag: lag(0)},
		{
			Node: "node-1", Known: true, Connected: true, Replica: "10.0.0.6:9640", AlsoConnected: []string{"10.0.0.5:9640"},
			AckedVersion: "0d87f81ad851cfb5", CurrentVersion: "21af2fdb213a065f", Lag: lag(83*time.Second + 400*time.Millisecond),
			NackedVersion: "21af2fdb213a065f", NackError: "applying:\n\tdefault/web: " + strings.Repeat("é", 100),
		},
		{Node: "node-2", Known: true, Replica: "10.0.0.5:9640", AckedVersion: "21af2fdb213a065f"},
		{Node: "node\t3", Connected: true, Replica: "10.0.0.5:9640", Lag: lag(1500 * time.Microsecond)},
	}}
	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	// The NACK's error is one line of 60 characters at most: 23 of
	// "applying: default/web: " and 37 of the rest.
	want := `NODE    REPLICA                             ACKED             LAG    LAST NACK
node-0  10.0.0.5:9640                       0d87f81ad851cfb5  0s     -
node-1  10.0.0.6:9640 (also 10.0.0.5:9640)  0d87f81ad851cfb5  1m23s  21af2fdb213a065f: applying: default/web: ` + strings.Repeat("é", 37) + `…
node-2  not connected                       21af2fdb213a065f  -      -
node 3  10.0.0.5:9640                       -                 2ms    -
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestWriteJSON(t *testing.T) {
	long := strings.Repeat("x", 200)
	rep := &Report{
		Replicas: []ReplicaResult{{Address: "a:9640", Connected: 1}, {Address: "b:9640", Error: "refused"}},
		Nodes: []Row{
			{Node: "node-0", Known: true, Connected: true, Replica: "a:9640", AckedVersion: "0d87f81ad851cfb5", Lag: lag(2500 * time.Millisecond), NackedVersion: "21af2fdb213a065f", NackError: long},
			{Node: "node-1", Known: true, AckedVersion: "0d87f81ad851cfb5"},
		},
	}
	var b bytes.Buffer
	if err := WriteJSON(&b, rep); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Replicas []map[string]any `json:"replicas"`
		Nodes    []map[string]any `json:"nodes"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if got.Replicas[1]["error"] != "refused" || got.Replicas[0]["connected"] != 1.0 {
		t.Errorf("replicas: %v", got.Replicas)
	}
	if got.Nodes[0]["lagSeconds"] != 2.5 || got.Nodes[0]["nackError"] != long {
		t.Errorf("node-0: %v; want lagSeconds 2.5 and the whole NACK error", got.Nodes[0])
	}
	if _, ok := got.Nodes[1]["lagSeconds"]; ok || got.Nodes[1]["connected"] != false {
		t.Errorf("node-1 (not connected): %v; want connected false and no lagSeconds", got.Nodes[1])
	}
}

// hostile is what a compromised agent can put in its node name and NACK
// text: a screen clear, a cursor move, a title change, an OSC 8 link, an
// 8-bit CSI (U+009B), DEL, a right-to-left override, a bell and a byte
// that is not UTF-8.
const (
	hostileNode = "node-\x1b[2Jx\u202e"
	hostileNack = "bad\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;http://evil/\x1b\\link\u009b31m\x7f\xff end"
)

// TestWriteTableIsTerminalSafe is the attack: the hostile text prints
// inert, every control sequence as a visible escape, and the table keeps
// its columns.
func TestWriteTableIsTerminalSafe(t *testing.T) {
	rep := &Report{Nodes: []Row{{
		Node: hostileNode, Known: true, Connected: true, Replica: "10.0.0.5:9640",
		AckedVersion: "0d87f81ad851cfb5", Lag: lag(0), NackedVersion: "21af2fdb213a065f", NackError: hostileNack,
	}}}
	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	// The NACK's text is cut at 60 characters after escaping.
	want := `NODE                 REPLICA        ACKED             LAG  LAST NACK
node-\x1b[2Jx\u202e  10.0.0.5:9640  0d87f81ad851cfb5  0s   21af2fdb213a065f: bad\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;http://evil/\x1b\lin…
`
	if b.String() != want {
		t.Errorf("table:\n%q\nwant:\n%q", b.String(), want)
	}
	for _, r := range b.String() {
		if r != '\n' && adminclient.UnsafeRune(r) {
			t.Errorf("the table holds control character %U", r)
		}
	}
	if !utf8.Valid(b.Bytes()) {
		t.Error("the table is not valid UTF-8")
	}
}

// TestWriteJSONIsTerminalSafe: the JSON output carries no control
// character either, and still decodes to exactly what the agent sent
// (the byte that is not UTF-8 aside, which encoding/json makes U+FFFD).
func TestWriteJSONIsTerminalSafe(t *testing.T) {
	rep := &Report{Nodes: []Row{{Node: hostileNode, Known: true, NackedVersion: "21af2fdb213a065f", NackError: hostileNack}}}
	var b bytes.Buffer
	if err := WriteJSON(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, r := range b.String() {
		if r != '\n' && adminclient.UnsafeRune(r) {
			t.Errorf("the JSON holds control character %U", r)
		}
	}
	var got Report
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, b.String())
	}
	if got.Nodes[0].Node != hostileNode || got.Nodes[0].NackError != strings.ToValidUTF8(hostileNack, "\uFFFD") {
		t.Errorf("decoded %q, %q; want what the agent sent", got.Nodes[0].Node, got.Nodes[0].NackError)
	}
}
