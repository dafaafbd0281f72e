package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

// The rollout scene's clients run on the nodes: this binary run again
// (clientEnv set) through `ip netns exec` in a client pod's network
// namespace and cloned into the pod's cgroup, as `kubectl exec` would put
// a process there, so that the node's connect4 program (kept by the node's
// agent) sees its connects and splits them. It writes a line per
// connection to stdout and stops when its stdin closes.
const (
	clientEnv     = "SOCKSCALE_DEMO_CLIENT"
	clientConn    = "conn "
	clientRunning = "running"
	// clientsInFlight bounds the connections one client has open at
	// once: a slow answer must not slow the pace, a stuck cluster must
	// not open thousands.
	clientsInFlight = 64
)

// clientConfig is what an in-node client does: a new connection to Addr
// every Every, one GET Path on it, until its stdin closes.
type clientConfig struct {
	Addr    netip.AddrPort
	Path    string
	Every   time.Duration
	Timeout time.Duration
}

// conn is one connection of an in-node client.
type conn struct {
	Node string    `json:",omitempty"` // set by the demo, not the client
	At   time.Time // connect() about to be called
	// Dest is the socket's real destination (its line in
	// /proc/self/net/tcp): a Revision's public Service when the kernel
	// split the connect, the Route's address when it did not.
	Dest netip.AddrPort `json:",omitzero"`
	Pod  string         `json:",omitempty"` // the pod that answered 200
	Took time.Duration
	Err  string `json:",omitempty"`
}

// revision is the Revision of the pod that answered (its Deployment is
// <revision>-deployment), "" when none did.
func (c conn) revision() string {
	rev, _, ok := strings.Cut(c.Pod, "-deployment-")
	if !ok {
		return ""
	}
	return rev
}

// runClient is the in-node client's process: cfgJSON is clientEnv's
// value; it runs until in ends.
func runClient(cfgJSON string, in io.Reader, out io.Writer) error {
	var cfg clientConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return fmt.Errorf("$%s: %w", clientEnv, err)
	}
	if cfg.Every <= 0 || cfg.Timeout <= 0 {
		return fmt.Errorf("$%s: every %s, timeout %s: want both above zero", clientEnv, cfg.Every, cfg.Timeout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, in)
		cancel()
	}()
	var mu sync.Mutex
	emit := func(c conn) {
		b, _ := json.Marshal(c)
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "%s%s\n", clientConn, b)
	}
	fmt.Fprintln(out, clientRunning)
	sem := make(chan struct{}, clientsInFlight)
	var wg sync.WaitGroup
	for next := time.Now(); ctx.Err() == nil; {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			emit(oneConn(cfg))
		})
		next = next.Add(cfg.Every)
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		} else {
			next = time.Now() // behind: go on from now, not in a burst
		}
	}
	wg.Wait()
	return nil
}

// oneConn connects to cfg.Addr, sends one GET and reads the answer: an
// error unless a pod answered 200.
func oneConn(cfg clientConfig) conn {
	c := conn{At: time.Now()}
	d := net.Dialer{Timeout: cfg.Timeout, Control: func(string, string, syscall.RawConn) error {
		c.At = time.Now() // as close to connect() as Go lets us
		return nil
	}}
	fail := func(err error) conn {
		c.Err, c.Took = err.Error(), time.Since(c.At)
		return c
	}
	nc, err := d.Dial("tcp4", cfg.Addr.String())
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	if c.Dest, err = stack.SocketDest(nc.(*net.TCPConn)); err != nil {
		return fail(err)
	}
	_ = nc.SetDeadline(c.At.Add(cfg.Timeout))
	req := "GET " + cfg.Path + " HTTP/1.1\r\nHost: " + cfg.Addr.String() + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodGet})
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fail(err)
	}
	c.Took = time.Since(c.At)
	// The app answers "pod <name>: ...".
	pod, _, ok := strings.Cut(strings.TrimPrefix(string(body), "pod "), ":")
	if resp.StatusCode != http.StatusOK || !ok || !strings.HasPrefix(string(body), "pod ") {
		c.Err = fmt.Sprintf("%s: %q", resp.Status, strings.TrimSpace(string(body)))
		return c
	}
	c.Pod = pod
	return c
}

// connLog is the connections of the in-node clients, added as they end.
type connLog struct {
	mu   sync.Mutex
	list []conn
}

func (l *connLog) add(c conn) {
	l.mu.Lock()
	l.list = append(l.list, c)
	l.mu.Unlock()
}

// all are the connections so far, in the order of their starts.
func (l *connLog) all() []conn {
	l.mu.Lock()
	out := slices.Clone(l.list)
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b conn) int { return a.At.Compare(b.At) })
	return out
}

// clientPodPrefix names the client pods: <prefix>-<node>.
const clientPodPrefix = "rollout-client"

// clientPod is the pod whose sandbox an in-node client runs in on node:
// the test app, which the node simulator runs like any pod.
func clientPod(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: clientPodPrefix + "-" + node, Labels: map[string]string{"app": clientPodPrefix}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name: "app", Image: stack.AppImage, Args: []string{"--port=8080", "--shutdown-delay=0s"},
			}},
		},
	}
}

// sandbox waits until the client pod runs and returns its network
// namespace and cgroup.
func sandbox(ctx context.Context, s *stack.Stack, pod *corev1.Pod, timeout time.Duration) (netns, cgroup string, err error) {
	deadline := time.Now().Add(timeout)
	for {
		err = func() error {
			if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return err
			}
			if pod.Status.PodIP == "" || len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
				return fmt.Errorf("phase %s, IP %q, containers %d", pod.Status.Phase, pod.Status.PodIP, len(pod.Status.ContainerStatuses))
			}
			if netns, cgroup, err = cluster.PodSandbox(pod); err != nil {
				return err
			}
			for _, p := range []string{"/run/netns/" + netns, cgroup} {
				if _, err := os.Stat(p); err != nil {
					return err
				}
			}
			return nil
		}()
		if err == nil {
			return netns, cgroup, nil
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("client pod %s/%s not running with a sandbox after %s: %w", pod.Namespace, pod.Name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// nodeClient is a running in-node client.
type nodeClient struct {
	node  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	read  chan struct{} // closed when its stdout is read to the end
	// stderr is written by exec's copier until Wait returns.
	stderr bytes.Buffer
	once   sync.Once
	err    error
}

// startClient runs an in-node client in the sandbox (netns, cgroup) of a
// pod on node; each connection it reports goes to log.
func startClient(node, netns, cgroup string, cfg clientConfig, log *connLog) (*nodeClient, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		return nil, err
	}
	defer cg.Close()
	c := &nodeClient{node: node, read: make(chan struct{})}
	c.cmd = exec.Command("ip", "netns", "exec", netns, self)
	c.cmd.Env = append(os.Environ(), clientEnv+"="+string(js))
	c.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the in-node client on %s: %w", node, err)
	}
	running := make(chan struct{})
	go func() {
		defer close(c.read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == clientRunning {
				close(running)
				continue
			}
			var r conn
			if rest, ok := strings.CutPrefix(line, clientConn); ok && json.Unmarshal([]byte(rest), &r) == nil {
				r.Node = node
				log.add(r)
			}
		}
	}()
	select {
	case <-running:
		return c, nil
	case <-c.read:
		err := c.cmd.Wait()
		if err == nil {
			err = errors.New("exit status 0")
		}
		return nil, fmt.Errorf("the in-node client on %s ended before it ran: %w: %s", node, err, strings.TrimSpace(c.stderr.String()))
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.read
		_ = c.cmd.Wait()
		return nil, fmt.Errorf("the in-node client on %s did not start within 30 s: %s", node, strings.TrimSpace(c.stderr.String()))
	}
}

// stop ends the client (its connections in flight finish) and says what
// went wrong with it, if anything; it may be called again.
func (c *nodeClient) stop() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		select {
		case <-c.read:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.read
			c.err = fmt.Errorf("the in-node client on %s did not stop within 30 s: killed", c.node)
		}
		if err := c.cmd.Wait(); err != nil && c.err == nil {
			c.err = fmt.Errorf("the in-node client on %s: %w: %s", c.node, err, strings.TrimSpace(c.stderr.String()))
		}
	})
	return c.err
}

// deletePods deletes the client pods, at once.
func deletePods(s *stack.Stack, pods []*corev1.Pod) error {
	var errs []error
	for _, p := range pods {
		if err := s.Client.Delete(context.Background(), p, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete client pod %s: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}
