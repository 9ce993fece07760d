package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// Logging is a binary's logging flags: --log-level, and beside it the
// flags operators of Kubernetes components reach for, --v (klog's
// verbosity) and --logging-format. Logs are slog's, text or JSON.
type Logging struct {
	// Level is debug, info, warn or error.
	Level string
	// V is klog's verbosity: 4 and up logs at debug, 0 to 3 at info; -1
	// (unset) leaves Level alone.
	V int
	// Format is text or json.
	Format string
}

// DefaultLogging returns the defaults: info, as text.
func DefaultLogging() Logging { return Logging{Level: "info", V: -1, Format: "text"} }

// AddFlags adds the flags to fs.
func (l *Logging) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&l.Level, "log-level", l.Level, "Log level: debug, info, warn or error.")
	fs.IntVar(&l.V, "v", l.V, "klog-style verbosity, for Kubernetes habits: 4 or more logs at debug, 0 to 3 at info; unset leaves --log-level.")
	fs.StringVar(&l.Format, "logging-format", l.Format, "Log format: text or json.")
}

// Validate returns what is wrong with the flags, joined.
func (l *Logging) Validate() error {
	var errs []error
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(l.Level)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: %w", l.Level, err))
	}
	if l.V < -1 {
		errs = append(errs, fmt.Errorf("--v %d: want 0 or more", l.V))
	}
	if l.Format != "text" && l.Format != "json" {
		errs = append(errs, fmt.Errorf("--logging-format %q: want text or json", l.Format))
	}
	return errors.Join(errs...)
}

// Leveled returns the level the flags ask for.
func (l *Logging) Leveled() slog.Level {
	switch {
	case l.V >= 4:
		return slog.LevelDebug
	case l.V >= 0:
		return slog.LevelInfo
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(l.Level))
	return lvl
}

// Logger returns a logger writing to w as the flags ask.
func (l *Logging) Logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.Leveled()}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
