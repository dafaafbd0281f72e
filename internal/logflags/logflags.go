package logflags

import (
	"fmt"
	"log/slog"
)

// ParseLevel parses --log-level: debug, info, warn or error. Its error
// names the flag and its value.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level=%q: want debug, info, warn or error", s)
	}
	return l, nil
}
