package bpf

import (
	"os"
	"testing"
)

// requireBPF skips a test that loads BPF programs when not root, and fails
// it instead under CI=true, where a skipped privileged test hides a gap.
func requireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test loads BPF programs and needs root; CI=true forbids skipping it")
	}
	t.Skip("needs root to load BPF programs")
}
