package harness

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
)

// ControlPlane is a real etcd and kube-apiserver (the pinned builds that
// `make bench` links into $KUBEBUILDER_ASSETS), a kubeconfig for the
// binaries and a directory for their builds.
type ControlPlane struct {
	env        *envtest.Environment
	Cfg        *rest.Config // cluster admin
	Kubeconfig string       // for user, a member of system:masters
	// Dir is a temporary directory for builds, removed by Stop.
	Dir string
}

// StartControlPlane starts etcd and kube-apiserver with the CRDs of
// crdDirs installed; Stop stops them and removes Dir.
func StartControlPlane(user string, crdDirs ...string) (*ControlPlane, error) {
	return StartControlPlaneArgs(user, nil, crdDirs...)
}

// StartControlPlaneArgs is StartControlPlane with kube-apiserver flags
// (name without dashes: value) on top of envtest's.
func StartControlPlaneArgs(user string, apiServerArgs map[string]string, crdDirs ...string) (*ControlPlane, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set (run through `make bench`, which builds etcd and kube-apiserver)")
	}
	crlog.SetLogger(logr.Discard()) // envtest logs through controller-runtime
	env := &envtest.Environment{CRDDirectoryPaths: crdDirs, ErrorIfCRDPathMissing: len(crdDirs) > 0}
	for k, v := range apiServerArgs {
		env.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	cp := &ControlPlane{env: env, Cfg: cfg}
	u, err := env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		cp.Stop()
		return nil, err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		cp.Stop()
		return nil, err
	}
	if cp.Dir, err = os.MkdirTemp("", "sockscale-bench"); err != nil {
		cp.Stop()
		return nil, err
	}
	cp.Kubeconfig = filepath.Join(cp.Dir, "kubeconfig")
	if err := os.WriteFile(cp.Kubeconfig, kc, 0o600); err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

// Stop stops etcd and kube-apiserver and removes Dir.
func (cp *ControlPlane) Stop() {
	_ = cp.env.Stop()
	if cp.Dir != "" {
		_ = os.RemoveAll(cp.Dir)
	}
}

// ModuleDir is the module's root, found from this file's place in it.
func ModuleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// GoBuild builds the command pkg of this module into dir and returns the
// binary's path.
func GoBuild(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = ModuleDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", pkg, err, out)
	}
	return bin, nil
}

// Get returns the body of a GET of url.
func Get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// WaitHTTP polls url until it answers 200 OK, for at most timeout.
func WaitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not OK within %v", url, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ProcessCPU is a process's user and system time from /proc.
func ProcessCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis; utime and stime are
	// the 14th and 15th fields of the whole line.
	rest := string(data[strings.LastIndexByte(string(data), ')')+2:])
	f := strings.Fields(rest)
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100)
}

// ProcessRSS is a process's resident memory in bytes.
func ProcessRSS(pid int) int64 { return ProcStatusBytes(pid, "VmRSS:") }

// ProcStatusBytes reads a "<field> <n> kB" line of /proc/<pid>/status in
// bytes (0 if the process or the field is gone).
func ProcStatusBytes(pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// FreeAddrs returns n loopback addresses with ports free now.
func FreeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// PromSamples are a Prometheus text exposition's metric families by name.
type PromSamples map[string]*dto.MetricFamily

// ParseMetrics reads a Prometheus text exposition.
func ParseMetrics(r io.Reader) (PromSamples, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return families, nil
}

// Value is the sum of the samples of counter or gauge name (or the counts
// of a summary or histogram) whose labels include labels (name, value,
// name, value, ...); 0 if there are none, as a series not created yet is a
// count not started.
func (s PromSamples) Value(name string, labels ...string) float64 {
	f := s[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		case m.Summary != nil:
			sum += float64(m.GetSummary().GetSampleCount())
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// Percentile is the nearest-rank percentile of ds, p in (0, 1]: the
// smallest value at least a fraction p of ds are at or below (the p95 of
// 20 values is the 19th smallest). Zero for no values.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)) - 1e-9)) // 1-based; the epsilon keeps 0.95*20 at 19
	return s[min(max(rank, 1), len(s))-1]
}

// interruptCleanups run, latest first, when the bench is interrupted
// (OnInterrupt).
var (
	interruptMu       sync.Mutex
	interruptCleanups = map[int]func(){}
	interruptNext     int
)

// AtInterrupt registers f to run if the bench is interrupted; the
// returned func unregisters it.
func AtInterrupt(f func()) func() {
	interruptMu.Lock()
	defer interruptMu.Unlock()
	id := interruptNext
	interruptNext++
	interruptCleanups[id] = f
	return func() {
		interruptMu.Lock()
		defer interruptMu.Unlock()
		delete(interruptCleanups, id)
	}
}

// OnInterrupt runs the registered cleanups, latest first, on SIGINT or
// SIGTERM, then last and exits 130.
func OnInterrupt(last func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		interruptMu.Lock()
		ids := make([]int, 0, len(interruptCleanups))
		for id := range interruptCleanups {
			ids = append(ids, id)
		}
		sort.Sort(sort.Reverse(sort.IntSlice(ids)))
		for _, id := range ids {
			interruptCleanups[id]()
		}
		last()
		os.Exit(130)
	}()
}
