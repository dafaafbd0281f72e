//go:build linux

package bpf

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// capabilityProbeEnv, when set to "cgroup:pindir", makes the test binary
// a capability probe: it does the agent's kernel work and exits.
const capabilityProbeEnv = "SOCKSCALE_CAPABILITY_PROBE"

// capabilityProbeMain loads, attaches, pins and reads the accounting as the
// agent does, then removes it; exit 0 only if all of it worked.
func capabilityProbeMain() {
	arg := os.Getenv(capabilityProbeEnv)
	if arg == "" {
		return
	}
	cgroup, pinDir, _ := strings.Cut(arg, ":")
	err := func() error {
		a, err := New(Options{CgroupRoot: cgroup, PinDir: pinDir})
		if err != nil {
			return err
		}
		defer a.Close()
		if err := a.AddPod(netip.MustParseAddr("10.213.250.2"), 1); err != nil {
			return fmt.Errorf("add pod: %w", err)
		}
		if _, err := a.Snapshot(); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return Uninstall(pinDir)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "capability probe:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestKernelCapabilities finds the agent's minimum capabilities by test,
// the set the chart grants (charts/sockscale values agent.capabilities):
// a root process whose capabilities are exactly BPF, NET_ADMIN and PERFMON
// loads the programs, attaches them to a cgroup, pins and reads them; with
// any one of the three missing it cannot.
func TestKernelCapabilities(t *testing.T) {
	testenv.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv") // util-linux: on every Debian
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed to run a process with fewer capabilities: %v", err)
	}
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	cgroup := filepath.Join(cg2, fmt.Sprintf("sockscale-caps-%d", os.Getpid()))
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cgroup) })
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sockscale-caps-%d", os.Getpid()))
	t.Cleanup(func() { _ = Uninstall(pinDir); _ = os.RemoveAll(pinDir) })

	all := []string{"bpf", "net_admin", "perfmon"}
	run := func(caps []string) (string, error) {
		// For a root process, exec makes the permitted and effective sets
		// equal to the bounding set: setpriv narrows it to caps.
		cmd := exec.Command(setpriv, "--bounding-set=-all,+"+strings.Join(caps, ",+"), "--", os.Args[0])
		cmd.Env = append(os.Environ(), capabilityProbeEnv+"="+cgroup+":"+pinDir)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run(all); err != nil {
		t.Fatalf("with exactly %v the agent's kernel work failed: %v: %s", all, err, out)
	}
	for i, missing := range all {
		caps := append(append([]string(nil), all[:i]...), all[i+1:]...)
		out, err := run(caps)
		if err == nil {
			t.Errorf("without %s (only %v) the agent's kernel work succeeded: the chart grants a capability it does not need", missing, caps)
			continue
		}
		first, _, _ := strings.Cut(out, "\n") // the verifier's log follows
		t.Logf("without %s: %s", missing, first)
	}
}
