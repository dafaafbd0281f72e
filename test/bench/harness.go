package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
)

// This file is what the parts that run sockscale's real binaries share: a
// control plane, builds, and reading processes and endpoints.

// controlPlane is a real etcd and kube-apiserver (the pinned builds that
// `make bench` links into $KUBEBUILDER_ASSETS), a kubeconfig for the
// binaries and a directory for their builds.
type controlPlane struct {
	env        *envtest.Environment
	cfg        *rest.Config // cluster admin
	kubeconfig string       // for user, a member of system:masters
	dir        string
}

// startControlPlane starts etcd and kube-apiserver with the CRDs of
// crdDirs installed; stop stops them and removes dir.
func startControlPlane(user string, crdDirs ...string) (*controlPlane, error) {
	return startControlPlaneArgs(user, nil, crdDirs...)
}

// startControlPlaneArgs is startControlPlane with kube-apiserver flags
// (name without dashes: value) on top of envtest's.
func startControlPlaneArgs(user string, apiServerArgs map[string]string, crdDirs ...string) (*controlPlane, error) {
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
	cp := &controlPlane{env: env, cfg: cfg}
	u, err := env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		cp.stop()
		return nil, err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		cp.stop()
		return nil, err
	}
	if cp.dir, err = os.MkdirTemp("", "sockscale-bench"); err != nil {
		cp.stop()
		return nil, err
	}
	cp.kubeconfig = filepath.Join(cp.dir, "kubeconfig")
	if err := os.WriteFile(cp.kubeconfig, kc, 0o600); err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

func (cp *controlPlane) stop() {
	_ = cp.env.Stop()
	if cp.dir != "" {
		_ = os.RemoveAll(cp.dir)
	}
}

// moduleDir is the module's root, found from this file's place in it.
func moduleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// goBuild builds the command pkg of this module into dir and returns the
// binary's path.
func goBuild(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = moduleDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", pkg, err, out)
	}
	return bin, nil
}

func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func waitHTTP(url string, timeout time.Duration) error {
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

// processCPU is a process's user and system time from /proc.
func processCPU(pid int) time.Duration {
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

// processRSS is a process's resident memory in bytes.
func processRSS(pid int) int64 { return procStatusBytes(pid, "VmRSS:") }

// procStatusBytes reads a "<field> <n> kB" line of /proc/<pid>/status in
// bytes (0 if the process or the field is gone).
func procStatusBytes(pid int, field string) int64 {
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
