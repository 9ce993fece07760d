package explain

import (
	"testing"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	"github.com/proxyplane/proxyplane/controlplane/status"
)

// TestSharedFlags checks that explain and status register every shared
// flag (adminclient.Options), under the same names, and that explain
// takes none of status's report flags.
func TestSharedFlags(t *testing.T) {
	shared := pflag.NewFlagSet("shared", pflag.ContinueOnError)
	adminclient.NewOptions().AddFlags(shared, "")
	ex := pflag.NewFlagSet("explain", pflag.ContinueOnError)
	NewOptions().AddFlags(ex)
	st := pflag.NewFlagSet("status", pflag.ContinueOnError)
	status.NewOptions().AddFlags(st)
	n := 0
	shared.VisitAll(func(f *pflag.Flag) {
		n++
		for name, fs := range map[string]*pflag.FlagSet{"explain": ex, "status": st} {
			if g := fs.Lookup(f.Name); g == nil || g.Shorthand != f.Shorthand || g.DefValue != f.DefValue {
				t.Errorf("%s lacks shared flag --%s as adminclient defines it", name, f.Name)
			}
		}
	})
	if n < 7 {
		t.Errorf("adminclient registers %d flags, want the 7 connection and output flags", n)
	}
	if ex.Lookup("changes") != nil {
		t.Error("explain registers status's --changes")
	}
}
