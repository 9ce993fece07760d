package app

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // substring of the error; "" for valid
	}{
		{"defaults", nil, ""},
		{"bad grpc address", []string{"--grpc-address=9640"}, "--grpc-address"},
		{"keepalive timeout below interval", []string{"--keepalive-interval=1m", "--keepalive-timeout=30s"}, "must exceed"},
		{"zero write timeout", []string{"--write-timeout=0"}, "--write-timeout must be positive"},
		{"negative resync", []string{"--resync-period=-1s"}, "--resync-period"},
		{"no pending changes", []string{"--max-pending-changes=0"}, "--max-pending-changes"},
		{"tiny messages", []string{"--max-send-message-bytes=10"}, "at least 1 MiB"},
		{"bad log level", []string{"--log-level=loud"}, "--log-level"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestOptionsDefaultsAreConsistent(t *testing.T) {
	o := NewOptions()
	if o.KeepaliveTimeout < 2*o.KeepaliveInterval {
		t.Errorf("keepalive timeout %s allows fewer than two lost keepalives at interval %s", o.KeepaliveTimeout, o.KeepaliveInterval)
	}
	if o.AckTimeout < time.Minute {
		t.Errorf("ack timeout %s is shorter than a full kernel sync may take", o.AckTimeout)
	}
}
