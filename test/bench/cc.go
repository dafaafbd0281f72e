package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

// ccSleep is the cc part's handler time: long next to either proxy's cost,
// so the limit, not the proxies, sets the pace (1/ccSleep per pod).
const ccSleep = 50 * time.Millisecond

// The cc part's pod servers: one behind the activator (also the direct
// mode's), one behind queue-proxy.
const (
	ccActivatorPort  = 8084
	ccQueueProxyPort = 8085
)

// ccLimit compares containerConcurrency 1 held by sockscale's activator
// with the same limit held by Knative's queue-proxy, for a handler of
// ccSleep at closed-loop concurrencies above 1. "activator": the real
// activator on this host, the target at containerConcurrency 1, forwarding
// to a server in the pod; "queue-proxy": queue-proxy with
// CONTAINER_CONCURRENCY=1 in the pod in front of an identical server;
// "direct 1": one client straight to the first server, the ideal both
// limits approach (one request at a time, nothing queued).
//
// Both limits leave the pod one request at a time, so both serve about
// 1/ccSleep and queue the other clients: the difference is what the pod's
// one slot waits between requests (the hand-off: for the activator a
// network hop each way, for queue-proxy loopback in the pod). The servers
// run in this process in the pod's network namespace (listenIn) because
// the pod's own servers do not say how many requests they had at once:
// these count the load's requests in flight, and the time they spent in
// the handler, from which the slot's idle time per request follows.
//
// Every slice starts with nothing queued and ends when the last queued
// request is answered (loadgen waits for them), so each slice is whole:
// a ramp of c requests and a drain of c. The modes take turns in a random
// order every round; the ratios are taken within a round, with a 95 %
// confidence interval over the rounds.
func (b *bench) ccLimit(slice time.Duration, rounds int, concurrencies []int, queueProxy string) error {
	if rounds < 2 {
		return fmt.Errorf("-cc-rounds %d: a confidence interval needs at least two rounds", rounds)
	}
	servers := map[string]*inFlightServer{}
	for _, mode := range []struct {
		name string
		port int
	}{{"activator", ccActivatorPort}, {"queue-proxy", ccQueueProxyPort}} {
		s, err := startInFlightServer(b.pod, mode.port)
		if err != nil {
			return fmt.Errorf("cc: pod server: %w", err)
		}
		defer s.close()
		servers[mode.name] = s
	}
	servers["direct 1"] = servers["activator"]

	const name = "cc1"
	a, stop, err := b.warmTarget(name, 1, netip.AddrPortFrom(b.pod.IP, ccActivatorPort))
	if err != nil {
		return err
	}
	defer stop()
	modes := []string{"direct 1", "activator"}
	if queueProxy != "" {
		// The other parts' queue-proxy has no limit and another backend:
		// this one replaces it until a part asks for that one again.
		if err := b.startQueueProxy(queueProxy, queueProxyConfig{cc: 1, userPort: ccQueueProxyPort}); err != nil {
			return err
		}
		modes = append(modes, "queue-proxy")
	}

	// What the machine does without our load (the control plane, and on a
	// shared machine other work) delays every mode's wake-ups alike.
	idle0, _ := machineStat()
	time.Sleep(time.Second)
	idle1, _ := machineStat()

	query := "?sleep=" + ccSleep.String()
	fmt.Printf("\ncontainerConcurrency 1: handler %v, keep-alive, closed loop; per c %d rounds, each mode %v per round and then its queue drained, modes taking turns\n",
		ccSleep, rounds, slice)
	fmt.Println("activator: the real sockscale-activator on this host, target at containerConcurrency 1; queue-proxy: Knative's in the pod, CONTAINER_CONCURRENCY=1;")
	fmt.Println("direct 1: one client to the pod, nothing queued (the ideal). max at pod: the most of the load's requests the pod's server had at once;")
	fmt.Println("idle/req: the time the pod's server was not in the handler, per request (slice / requests - handler time): the limit's hand-off.")
	fmt.Printf("A client answered 503 waits %v before its next request. The machine without our load: %.0f %% of a core busy before the table.\n",
		ccSleep, 100*(idle1-idle0).Seconds())
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c\tmode\tclients\trps\tp50\tp99\tmax\tidle/req\tmax at pod\tfailed\t")
	var versusQP, firstErrs []string
	for _, c := range concurrencies {
		clients := map[string]int{"direct 1": 1, "activator": c, "queue-proxy": c}
		urls := map[string]string{"direct 1": "http://" + b.pod.Addr(ccActivatorPort) + "/" + query,
			"activator": targetURL(name) + query, "queue-proxy": "http://" + b.pod.Addr(queueProxyPort) + "/" + query}
		loads := map[string]loadgen.Options{}
		for _, m := range modes {
			client := loadgen.NewClient(clients[m], true)
			if m == "activator" {
				client = a.client(clients[m], 0)
			}
			client.Transport = backOff{client.Transport, ccSleep}
			defer client.CloseIdleConnections()
			loads[m] = keepAliveLoop(urls[m], clients[m], client)
			closedLoop(loads[m], slice/4) // open the connections, warm the proxies
		}
		maxAt, failed, firstErr := map[string]int64{}, map[string]int64{}, map[string]error{}
		idle := map[string][]float64{} // per round, seconds per request
		rng := rand.New(rand.NewPCG(uint64(c), 4))
		rs, err := takeTurns(modes, rounds, rng, func(m string) (result, error) {
			s := servers[m]
			s.reset()
			r := closedLoop(loads[m], slice)
			if r.Completed == 0 {
				return r, fmt.Errorf("cc: %s c=%d: no request answered in %v (%d failed: %w)", m, clients[m], r.Elapsed, r.Failed, r.FirstError)
			}
			// Failures are counted, not fatal: queue-proxy answers 503
			// beyond its queue, and that is part of the comparison.
			maxAt[m] = max(maxAt[m], s.maxInFlight.Load())
			failed[m] += r.Failed
			if firstErr[m] == nil {
				firstErr[m] = r.FirstError
			}
			idle[m] = append(idle[m], (r.Elapsed.Seconds()-time.Duration(s.busy.Load()).Seconds())/float64(s.served.Load()))
			return r, nil
		})
		if err != nil {
			return err
		}
		for _, m := range modes {
			merged := merge(rs[m])
			var idleMean float64
			for _, v := range idle[m] {
				idleMean += v / float64(len(idle[m]))
			}
			fmt.Fprintf(w, "%d\t%s\t%d\t%.2f\t%v\t%v\t%v\t%.2fms\t%d\t%d\t\n", c, m, clients[m], merged.RPS(),
				merged.Percentile(0.5).Round(time.Millisecond), merged.Percentile(0.99).Round(time.Millisecond),
				merged.Percentile(1).Round(time.Millisecond), 1e3*idleMean, maxAt[m], failed[m])
			if firstErr[m] != nil {
				firstErrs = append(firstErrs, fmt.Sprintf("c=%d %s: %v", c, m, firstErr[m]))
			}
		}
		if queueProxy != "" {
			logRatios := func(of func(result) float64) []float64 {
				vs := make([]float64, rounds)
				for i := range vs {
					vs[i] = math.Log(of(rs["activator"][i]) / of(rs["queue-proxy"][i]))
				}
				return vs
			}
			idleDiff := make([]float64, rounds)
			for i := range idleDiff {
				idleDiff[i] = 1e3 * (idle["activator"][i] - idle["queue-proxy"][i])
			}
			mean, lo, hi := meanCI(idleDiff)
			versusQP = append(versusQP, fmt.Sprintf("c=%d: rps %s, p50 %s, p99 %s, idle/req %+.2fms [%+.2f..%+.2f]", c,
				ratioCI(meanCI(logRatios(func(r result) float64 { return r.RPS() }))),
				ratioCI(meanCI(logRatios(func(r result) float64 { return r.Percentile(0.5).Seconds() }))),
				ratioCI(meanCI(logRatios(func(r result) float64 { return r.Percentile(0.99).Seconds() }))),
				mean, lo, hi))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(firstErrs) > 0 {
		fmt.Println("First failure of each mode that had one:", strings.Join(firstErrs, "; "))
	}
	if len(versusQP) > 0 {
		fmt.Println("Activator over queue-proxy (per round, geometric mean over the rounds [95 % CI]; idle/req: activator's minus queue-proxy's, mean [95 % CI]):")
		fmt.Println("  " + strings.Join(versusQP, "\n  "))
	}
	return nil
}

// backOff is a client's transport that waits d after a 503 before it
// returns it: queue-proxy answers 503 at once to requests beyond its queue,
// and clients retrying at once would spin, taking the CPU the pod and the
// proxies need, where a real client would back off.
type backOff struct {
	next http.RoundTripper
	d    time.Duration
}

func (b backOff) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		time.Sleep(b.d)
	}
	return resp, err
}

// CloseIdleConnections closes next's, for http.Client's of the same name.
func (b backOff) CloseIdleConnections() {
	if c, ok := b.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// inFlightServer serves testpod's handler on the pod's address from this
// process and counts the load's requests (those with a query: not a
// proxy's probe) in flight, the most at once, and their time in the
// handler since the last reset.
type inFlightServer struct {
	srv                           *http.Server
	inFlight, maxInFlight, served atomic.Int64
	busy                          atomic.Int64 // ns in the handler
}

func startInFlightServer(pod *testpod.Pod, port int) (*inFlightServer, error) {
	// Every address, loopback too: queue-proxy dials its user port there.
	l, err := listenIn(pod.Name, ":"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	s := &inFlightServer{}
	h := testpod.Handler()
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "" {
			h.ServeHTTP(w, r)
			return
		}
		s.noteInFlight(s.inFlight.Add(1))
		t0 := time.Now()
		// The count drops before net/http sends the response (after the
		// handler returns): a proxy that waits for the response before
		// sending the next request can never make it look like two.
		defer func() {
			s.busy.Add(int64(time.Since(t0)))
			s.served.Add(1)
			s.inFlight.Add(-1)
		}()
		h.ServeHTTP(w, r)
	})}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// noteInFlight raises the most in flight at once to n if n is more.
func (s *inFlightServer) noteInFlight(n int64) {
	for {
		m := s.maxInFlight.Load()
		if n <= m || s.maxInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

// reset starts a new slice's counts; nothing is in flight between slices
// (every slice waits for its requests).
func (s *inFlightServer) reset() {
	s.maxInFlight.Store(s.inFlight.Load())
	s.served.Store(0)
	s.busy.Store(0)
}

func (s *inFlightServer) close() { _ = s.srv.Close() }
