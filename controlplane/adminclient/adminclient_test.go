package adminclient

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestCellAndEscapeJSON(t *testing.T) {
	hostile := "node\x1b[2J\u202e\tx\xff"
	if got, want := Cell(hostile), `node\x1b[2J\u202e x\xff`; got != want {
		t.Errorf("Cell = %q, want %q", got, want)
	}
	b, err := json.Marshal(map[string]string{"n": "a\u202eb\u0085c"})
	if err != nil {
		t.Fatal(err)
	}
	out := EscapeJSON(b)
	for _, r := range string(out) {
		if UnsafeRune(r) {
			t.Errorf("EscapeJSON left %U in %s", r, out)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["n"] != "a\u202eb\u0085c" {
		t.Errorf("EscapeJSON changed the value: %q, %v", back["n"], err)
	}
}

func TestValidate(t *testing.T) {
	o := NewOptions()
	err := o.Validate()
	if err == nil || !strings.Contains(err.Error(), "--server") || !strings.Contains(err.Error(), "--ca-file and --token-file are required") {
		t.Errorf("defaults: Validate = %v, want --server and the credentials named", err)
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs, "Output.")
	if err := fs.Parse([]string{"--server=a:1", "--insecure", "-o", "json", "--timeout=2s"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("valid flags: Validate = %v", err)
	}
	o.Output, o.CAFile = "yaml", "ca.pem"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), `--output: "yaml"`) || !strings.Contains(err.Error(), "--insecure: a token is never sent") {
		t.Errorf("bad flags: Validate = %v, want both mistakes", err)
	}
}

func TestDialOptions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := (&Options{Insecure: true}).DialOptions(); err != nil {
		t.Errorf("insecure: %v", err)
	}
	for name, o := range map[string]*Options{
		"no CA file":  {CAFile: filepath.Join(dir, "missing"), TokenFile: write("tok", "t")},
		"CA not PEM":  {CAFile: write("ca", "not pem"), TokenFile: write("tok", "t")},
		"empty token": {CAFile: write("ca2", ""), TokenFile: write("empty", " \n")},
	} {
		if _, err := o.DialOptions(); err == nil {
			t.Errorf("%s: DialOptions succeeded", name)
		}
	}
}
