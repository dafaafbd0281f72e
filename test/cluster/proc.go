package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// state is what `up` started and changed, written to <state-dir>/state.json
// as it goes, so `down` (or the next `up`) undoes exactly that.
type state struct {
	Nodes     int       `json:"nodes"`
	Processes []process `json:"processes"`
	// Sysctls holds the values `up` found before it changed them.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// MountedBPFFS says `up` mounted the host's bpffs, so `down` unmounts it.
	MountedBPFFS bool `json:"mountedBPFFS,omitempty"`
	// KubeFirewallBefore says the host had a KUBE-FIREWALL chain before
	// kube-proxy made one, so `down` leaves it.
	KubeFirewallBefore bool `json:"kubeFirewallBefore,omitempty"`
	// KubeFirewall6Before is KubeFirewallBefore for ip6tables.
	KubeFirewall6Before bool `json:"kubeFirewall6Before,omitempty"`
}

type process struct {
	Name string `json:"name"`
	PID  int    `json:"pid"`
	// Exe is the binary, checked against /proc/<pid>/exe before a kill so a
	// reused PID is never killed.
	Exe string `json:"exe"`
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

func loadState(dir string) (*state, error) {
	b, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return &state{}, nil
	}
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", statePath(dir), err)
	}
	return &s, nil
}

func (s *state) save(dir string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(dir))
}

// alive says whether p still runs the binary it was started with.
func (p process) alive() bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
	if err != nil {
		return false
	}
	want, err := filepath.EvalSymlinks(p.Exe)
	if err != nil {
		want = p.Exe
	}
	return strings.TrimSuffix(exe, " (deleted)") == want
}

// startDaemon starts bin in its own session and in its own cgroup under the
// cluster's control-plane subtree, stdout and stderr appended to
// <state-dir>/logs/<name>.log, and records it in the state file.
func (c *Cluster) startDaemon(name, bin string, args ...string) error {
	p, err := spawn(daemon{name: name, bin: bin, args: args, dir: c.opts.StateDir,
		logDir: filepath.Join(c.opts.StateDir, "logs"), cgroup: filepath.Join(c.cgroupDir, "control-plane", name)})
	if err != nil {
		return err
	}
	c.state.Processes = append(c.state.Processes, p)
	return c.state.save(c.opts.StateDir)
}

// daemon is a process to start in the background (spawn).
type daemon struct {
	name, bin string
	args      []string
	// env is added to this process's environment.
	env []string
	// dir is its working directory.
	dir string
	// logDir gets <name>.log, appended to.
	logDir string
	// cgroup is the cgroup v2 directory it starts in, made if missing.
	cgroup string
}

// spawn starts d in its own session and cgroup, stdout and stderr appended
// to its log.
func spawn(d daemon) (process, error) {
	if err := os.MkdirAll(d.logDir, 0o755); err != nil {
		return process{}, err
	}
	logf, err := os.OpenFile(filepath.Join(d.logDir, d.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return process{}, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- %s %s %s\n", time.Now().Format(time.RFC3339), d.bin, strings.Join(d.args, " "))
	if err := os.MkdirAll(d.cgroup, 0o755); err != nil {
		return process{}, fmt.Errorf("cgroup for %s: %w", d.name, err)
	}
	cgfd, err := os.Open(d.cgroup)
	if err != nil {
		return process{}, err
	}
	defer cgfd.Close()
	cmd := exec.Command(d.bin, d.args...)
	cmd.Dir = d.dir
	if len(d.env) > 0 {
		cmd.Env = append(os.Environ(), d.env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: int(cgfd.Fd())}
	if err := cmd.Start(); err != nil {
		return process{}, fmt.Errorf("start %s: %w", d.name, err)
	}
	// Reaps it if it ends while this process lives; after `up` returns it
	// is init's.
	go func() { _ = cmd.Wait() }()
	return process{Name: d.name, PID: cmd.Process.Pid, Exe: d.bin}, nil
}

// run runs a command and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// output runs a command and returns its stdout.
func output(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// killCgroupTree kills every process in dir and below (cgroup.kill, 5.14+),
// waits until they are gone, and removes the directories bottom-up.
func killCgroupTree(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	var errs []error
	deadline := time.Now().Add(10 * time.Second)
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := os.Remove(dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w (pids: %v)", dirs[i], err, cgroupPIDs(dirs[i])))
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// cgroupPIDs lists the processes directly in a cgroup.
func cgroupPIDs(dir string) []int {
	f, err := os.Open(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var pids []int
	s := bufio.NewScanner(f)
	for s.Scan() {
		if pid, err := strconv.Atoi(s.Text()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
