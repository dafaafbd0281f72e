package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
)

// splitService is the Route address the split part dials: on loopback,
// like connectService, so a connect the program did not rewrite stays on
// this machine (and finds nothing listening on port 80).
var splitService = netip.MustParseAddrPort("127.78.0.20:80")

// splitCases are the percents the split part sets, as a Route's status
// would: a canary, an a/b test, three revisions, a rollout's steps.
var splitCases = [][]uint32{{99, 1}, {70, 30}, {50, 50}, {45, 37, 18}, {98, 2}}

// splitShares measures how close the kernel's per-connection split (a
// Route's address -> its revisions' addresses, weight = percent, the entry
// an agent writes from status.traffic) comes to the percents: n new
// connections per case from a client cgroup under the redirect program,
// each backend a listener on its own loopback address that counts what it
// accepts. Reported per backend: the percent, the measured share, the
// difference in percentage points and in binomial standard deviations
// (sqrt(n p (1-p)); a fair draw stays within 3 sd 997 times in 1,000).
func (b *bench) splitShares(n int) error {
	if n < 100 {
		return fmt.Errorf("-split-connects %d: want at least 100", n)
	}
	if err := loopbackOnly(splitService.Addr()); err != nil {
		return err
	}
	home, err := cgroup2.Own()
	if err != nil {
		return err
	}
	root := b.root + "-split"
	client := filepath.Join(root, "client")
	if err := os.MkdirAll(client, 0o755); err != nil {
		return err
	}
	defer func() {
		for _, dir := range []string{client, root} {
			_ = os.Remove(dir)
		}
	}()
	r, err := redirect.New(redirect.Options{CgroupRoot: root})
	if err != nil {
		return err
	}
	defer func() { _ = r.Close() }()

	// One listener per backend; what each accepted is its count.
	var backends []*splitBackend
	defer func() {
		for _, s := range backends {
			_ = s.ln.Close()
		}
	}()
	for i := range 3 {
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 78, 1, byte(i + 1)}), 18080)
		ln, err := net.Listen("tcp", addr.String())
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		s := &splitBackend{addr: addr, ln: ln}
		go s.serve()
		backends = append(backends, s)
	}

	if err := moveProcess(client); err != nil {
		return err
	}
	defer func() {
		if err := moveProcess(home); err != nil {
			fmt.Fprintln(os.Stderr, "bench: split:", err)
		}
	}()
	fmt.Printf("\nSplit: a Route's address %s split per new connection by the kernel (weights = percents), %d connects per case from a client cgroup\n", splitService, n)
	fmt.Println("sd: binomial standard deviation of the count, sqrt(n p (1-p)); worst: the largest |measured - percent| of the case")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "percents\tbackend\tpercent\tmeasured\tdiff (pp)\tdiff (sd)\t")
	var summary []string
	for _, weights := range splitCases {
		set := make([]redirect.Backend, len(weights))
		for i, wt := range weights {
			set[i] = redirect.Backend{Addr: backends[i].addr, Weight: wt}
			backends[i].reset()
		}
		if err := r.Set(splitService, set); err != nil {
			return err
		}
		if err := dialMany(splitService, n, 8); err != nil {
			return err
		}
		// A dial returns once the handshake is done, before the listener
		// accepts: wait until every connect is counted.
		counts, err := acceptedAll(backends[:len(weights)], n)
		if err != nil {
			return fmt.Errorf("split %v: %w", weights, err)
		}
		worst := 0.0
		for i, wt := range weights {
			p := float64(wt) / 100
			got := float64(counts[i]) / float64(n)
			sd := math.Sqrt(float64(n) * p * (1 - p))
			diff := (got - p) * 100
			worst = max(worst, math.Abs(diff))
			fmt.Fprintf(w, "%s\t%d\t%d %%\t%.2f %%\t%+.2f\t%+.1f\t\n", pcts(weights), i+1, wt, got*100, diff, (float64(counts[i])-p*float64(n))/sd)
		}
		summary = append(summary, fmt.Sprintf("%s: %.2f pp", pcts(weights), worst))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("worst difference per case:", strings.Join(summary, ", "))
	return nil
}

func pcts(ws []uint32) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = fmt.Sprint(w)
	}
	return strings.Join(s, "/")
}

// splitBackend counts the connections its listener accepts.
type splitBackend struct {
	addr netip.AddrPort
	ln   net.Listener
	mu   sync.Mutex
	n    int
}

func (s *splitBackend) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		_ = c.Close()
		s.mu.Lock()
		s.n++
		s.mu.Unlock()
	}
}

func (s *splitBackend) reset() {
	s.mu.Lock()
	s.n = 0
	s.mu.Unlock()
}

func (s *splitBackend) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// acceptedAll waits (up to 10 s) until the backends have accepted n
// connections in all, and returns each one's count.
func acceptedAll(backends []*splitBackend, n int) ([]int, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		counts, total := make([]int, len(backends)), 0
		for i, b := range backends {
			counts[i] = b.count()
			total += counts[i]
		}
		switch {
		case total == n:
			return counts, nil
		case total > n || time.Now().After(deadline):
			return nil, fmt.Errorf("the backends accepted %d of %d connects", total, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dialMany makes n connections to addr, c at a time, each closed at once.
func dialMany(addr netip.AddrPort, n, c int) error {
	var wg sync.WaitGroup
	errs := make(chan error, c)
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				conn, err := net.Dial("tcp", addr.String())
				if err != nil {
					errs <- fmt.Errorf("dial %s: %w", addr, err)
					return
				}
				_ = conn.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(func() []error {
		var out []error
		for err := range errs {
			out = append(out, err)
		}
		return out
	}()...)
}
