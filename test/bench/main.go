package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
	"github.com/sockscale/sockscale/test/bench/harness"
)

func main() {
	testpod.Main() // returns unless this process is a fake pod's server
	slice := flag.Duration("slice", 250*time.Millisecond, "how long each data-path mode runs per round")
	accuracyDuration := flag.Duration("accuracy-duration", 4*time.Second, "length of one accuracy measurement")
	footprintDuration := flag.Duration("footprint-duration", 8*time.Second, "length of one agent-footprint measurement")
	rounds := flag.Int("rounds", 120, "data-path rounds per concurrency, each running every mode for one slice (rounded down to whole pairs of blocks)")
	block := flag.Int("block", 10, "data-path rounds per block (the accounted twin changes every block)")
	families := flag.String("families", "ipv4,ipv6", "comma-separated address families of the data path, one table each: ipv4, ipv6 (the pod has both)")
	h2Rounds := flag.Int("h2-rounds", 60, "rounds per concurrency of the h2 part's data path, per protocol (rounded down to whole pairs of blocks)")
	h2Block := flag.Int("h2-block", 5, "rounds per block of the h2 part's data path")
	h2Protocols := flag.String("h2-protocols", "h2c,grpc", "comma-separated protocols of the h2 part's data path, one table each: h2c, grpc")
	concurrencies := flag.String("c", "1,16,64", "comma-separated closed-loop concurrencies of the data path and the activator's")
	queueProxy := flag.String("queue-proxy", os.Getenv("QUEUE_PROXY"), "path of Knative's queue-proxy binary (empty: skip that column)")
	activatorRounds := flag.Int("activator-rounds", 30, "rounds per concurrency of the data path through the activator (rounded down to whole blocks)")
	activatorBlock := flag.Int("activator-block", 5, "rounds per block of the data path through the activator (one estimate per block)")
	coldStarts := flag.Int("cold-starts", 30, "cold starts per probe period")
	coldPeriods := flag.String("cold-probe-periods", "25ms,15ms", "comma-separated activator --probe-period values, one cold-start row each (25ms is its default)")
	held := flag.Int("held", 10000, "requests held for one target by the hold part")
	connectRounds := flag.Int("connect-rounds", 40, "rounds per concurrency and load of the connect part (rounded down to whole blocks)")
	connectBlock := flag.Int("connect-block", 5, "rounds per block of the connect part (one estimate per block)")
	ccClients := flag.String("cc-c", "8,16", "comma-separated closed-loop concurrencies of the cc part (at containerConcurrency 1 queue-proxy admits 11 and answers 503 beyond)")
	ccRounds := flag.Int("cc-rounds", 10, "rounds per concurrency of the cc part, each running every mode for one slice")
	ccSlice := flag.Duration("cc-slice", 2*time.Second, "how long each mode of the cc part runs per round (its queue then drains)")
	splitConnects := flag.Int("split-connects", 20000, "new connections per case of the split part")
	activatorBin := flag.String("activator", "", "sockscale-activator binary of the activator parts (empty: build this tree's)")
	only := flag.String("only", strings.Join(parts, ","), "comma-separated parts: "+strings.Join(parts, ", "))
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (network namespaces, cgroups, BPF)")
		os.Exit(2)
	}
	cs, err := parseConcurrencies("-c", *concurrencies)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ccCs, err := parseConcurrencies("-cc-c", *ccClients)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	fams, err := parseFamilies(*families)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	periods, err := parseDurations(*coldPeriods)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: -cold-probe-periods:", err)
		os.Exit(2)
	}
	b, err := newBench()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	b.activatorBin = *activatorBin
	harness.OnInterrupt(b.close) // the pod, and the activator parts' control plane
	for _, part := range strings.Split(*only, ",") {
		switch part {
		case "datapath":
			err = b.dataPath(*slice, *rounds, *block, cs, fams, *queueProxy)
		case "accuracy":
			err = b.accuracy(*accuracyDuration)
		case "h2":
			err = b.h2DataPath(*slice, *h2Rounds, *h2Block, cs, strings.Split(*h2Protocols, ","), *queueProxy)
		case "h2-accuracy":
			err = b.h2Accuracy(*accuracyDuration)
		case "footprint":
			err = footprint(b.root, *footprintDuration)
		case "activator":
			err = b.activatorPath(*slice, *activatorRounds, *activatorBlock, cs, *queueProxy)
		case "cc":
			err = b.ccLimit(*ccSlice, *ccRounds, ccCs, *queueProxy)
		case "coldstart":
			err = b.coldStart(*coldStarts, periods)
		case "hold":
			err = b.hold(*held)
		case "connect":
			err = b.connectCost(*slice, *connectRounds, *connectBlock, cs)
		case "split":
			err = b.splitShares(*splitConnects)
		default:
			err = fmt.Errorf("unknown part %q: want one of %s", part, strings.Join(parts, ", "))
		}
		if err != nil {
			break
		}
	}
	b.close() // also on error: the pod, the control plane and their processes go
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// parts of the bench, in the order they run by default.
var parts = []string{"datapath", "accuracy", "h2", "h2-accuracy", "footprint", "activator", "cc", "coldstart", "hold", "connect", "split"}

// parseFamilies reads -families: ipv4 and ipv6, comma-separated, each
// once; true stands for IPv6.
func parseFamilies(flagValue string) ([]bool, error) {
	var out []bool
	seen := map[string]bool{}
	for _, f := range strings.Split(flagValue, ",") {
		f = strings.TrimSpace(f)
		if f != "ipv4" && f != "ipv6" || seen[f] {
			return nil, fmt.Errorf("-families %q: %q is not a family or comes twice; want ipv4, ipv6 or ipv4,ipv6", flagValue, f)
		}
		seen[f] = true
		out = append(out, f == "ipv6")
	}
	return out, nil
}

// parseDurations reads a comma-separated list of positive durations.
func parseDurations(flagValue string) ([]time.Duration, error) {
	var ds []time.Duration
	for _, f := range strings.Split(flagValue, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q: %q is not a positive duration; want e.g. 25ms,15ms", flagValue, f)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// parseConcurrencies reads flag name's value (-c, -cc-c): positive
// integers separated by commas.
func parseConcurrencies(name, flagValue string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(flagValue, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return nil, fmt.Errorf("%s %q: %q is not a concurrency; want positive integers separated by commas, e.g. 1,16,64", name, flagValue, f)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

type bench struct {
	root string // cgroup the accounting attaches at for accuracy
	pod  *testpod.Pod
	// The data path's servers (see dataPath), each in a cgroup of its own
	// outside root: the twins the accounting attaches to in turn, and
	// queue-proxy's backend.
	twins        [2]server
	proxyBackend server
	// queueProxy is Knative's queue-proxy running in the pod as
	// queueProxyConf says (startQueueProxy), and queueProxyPid its pid; 0:
	// not started.
	queueProxy     *exec.Cmd
	queueProxyConf queueProxyConfig
	queueProxyPid  int
	// rig runs the activator parts' control plane (activatorRig), and
	// activatorBin is their activator (empty: built from this tree).
	rig          *activatorRig
	activatorBin string
	// grpcStarted: the h2 parts' gRPC servers run (startGRPCServers).
	grpcStarted bool
}

// server is one of the pod's servers besides its own.
type server struct {
	cgroup string
	port   int
}

func newBench() (*bench, error) {
	cg2, err := cgroup2.Root()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-bench-%d", os.Getpid()))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	// Dual-stack: the data path is measured over either family.
	pod, err := testpod.Create(testpod.Options{Subnet: 77, CgroupParent: root, DualStack: true})
	if err != nil {
		return nil, err
	}
	b := &bench{root: root, pod: pod,
		twins:        [2]server{{root + "-twin-a", 8081}, {root + "-twin-b", 8082}},
		proxyBackend: server{root + "-proxied", 8083},
	}
	if err := pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		b.close()
		return nil, err
	}
	for _, srv := range []server{b.twins[0], b.twins[1], b.proxyBackend} {
		if err := os.MkdirAll(srv.cgroup, 0o755); err != nil {
			b.close()
			return nil, err
		}
		if err := pod.StartIn(srv.cgroup, testpod.RoleHTTP, srv.port); err != nil {
			b.close()
			return nil, err
		}
	}
	return b, nil
}

func (b *bench) close() {
	if b.rig != nil {
		b.rig.close()
	}
	_ = b.pod.Delete() // stops every server
	for _, dir := range []string{b.root, b.twins[0].cgroup, b.twins[1].cgroup, b.proxyBackend.cgroup} {
		_ = os.Remove(dir)
	}
}

// attach turns accounting on for the pod's sockets below cgroup; the
// returned func turns it off.
func (b *bench) attach(cgroup string) (*bpf.Accounting, func(), error) {
	a, err := bpf.New(bpf.Options{CgroupRoot: cgroup})
	if err != nil {
		return nil, nil, err
	}
	// Both of the pod's addresses, one slot each, as the agent does.
	for _, ip := range b.pod.IPs {
		if err := a.AddPod(ip, 1); err != nil {
			return nil, nil, errors.Join(err, a.Close())
		}
	}
	return a, func() { _ = a.Close() }, nil
}

// dataPath compares the same pod and load with and without accounting, and
// behind queue-proxy.
//
// The pod runs two identical servers, twins, each in a cgroup of its own
// outside the pod's: the accounting is attached at one twin's cgroup, so
// "on" is that twin and "off" the other, over the same network namespace
// and address. Two processes are never quite alike (here they differed by
// up to 5 % at c = 1 with nothing attached), so the twins swap roles from
// one block of rounds to the next, with fresh connections for the sockets
// to be accounted from their start, and each estimate is the mean of a
// block pair, one of each assignment: the twins' own difference cancels.
// "queue-proxy" is Knative's queue-proxy in the pod in front of a third
// server.
//
// This machine's speed moves by ±10 % and more within a second (shared
// vCPUs), so within a block the modes take turns in short slices, in a
// random order every round, and each ratio is taken within a round. The
// table gives the geometric mean of the ratios and its 95 % confidence
// interval over the block pairs; the last line says how far apart the
// twins were.
func (b *bench) dataPath(slice time.Duration, rounds, block int, concurrencies []int, families []bool, queueProxy string) error {
	if err := checkBlocks("", rounds, block); err != nil {
		return err
	}
	pairs := rounds / (2 * block)
	for i, ipv6 := range families {
		family := map[bool]string{false: "IPv4", true: "IPv6"}[ipv6]
		fmt.Printf("\nData path over %s: trivial handler, keep-alive, closed loop; per c %d pairs of %d-round blocks, each mode %v per round, modes taking turns\n", family, pairs, block, slice)
		if i == 0 {
			printDataPathLegend()
		}
		if err := b.dataPathTable(dataPathTarget{twins: b.twins, backend: b.proxyBackend, client: http1Client, ipv6: ipv6}, slice, pairs, block, concurrencies, queueProxy); err != nil {
			return err
		}
	}
	return nil
}

// checkBlocks says whether rounds make at least two pairs of blocks of
// block rounds, which a confidence interval over the pairs needs; prefix
// is that of their flags' names ("", "h2-").
func checkBlocks(prefix string, rounds, block int) error {
	if block < 1 || rounds < 4*block {
		return fmt.Errorf("-%srounds %d, -%sblock %d: a confidence interval needs at least two pairs of blocks of at least one round", prefix, rounds, prefix, block)
	}
	return nil
}

// printDataPathLegend explains the columns of dataPathTable.
func printDataPathLegend() {
	fmt.Println("Ratios and differences are per round, averaged over each block pair (twins in both roles):")
	fmt.Println("geometric mean (ratios) or mean (differences) over the pairs [95 % confidence interval].")
	fmt.Println("CPU is the whole machine's (load generator included), so differences between rows are the cost;")
	fmt.Println("Switches are the whole machine's context switches (/proc/stat ctxt).")
	fmt.Println("BPF run time is what the kernel measured for the accounting programs themselves (kernel.bpf_stats).")
}

// A dataPathTarget is what a data-path table drives for one protocol: the
// twins, the server behind queue-proxy, and the protocol's client.
// queueProxyMayFail: queue-proxy's failed requests are counted and
// reported under the table, not an error (see grpcTarget).
type dataPathTarget struct {
	twins             [2]server
	backend           server
	client            newClient
	queueProxyMayFail bool
	ipv6              bool // the clients dial the pod's IPv6 address
}

// addr is the pod's address for target's clients with port.
func (b *bench) addr(target dataPathTarget, port int) string {
	if target.ipv6 {
		return b.pod.Addr6(port)
	}
	return b.pod.Addr(port)
}

// A newClient opens a client of its own to the server at addr (host:port)
// for closed loops of c requests in flight, its connections kept from one
// loop to the next; close closes them.
type newClient func(addr string, c int) (l loop, close func(), err error)

// http1Client is the HTTP/1.x data path's client: keep-alive, one
// connection per request in flight.
func http1Client(addr string, c int) (loop, func(), error) {
	client := loadgen.NewClient(c, true)
	return httpLoop(keepAliveLoop("http://"+addr+"/", c, client)), client.CloseIdleConnections, nil
}

// dataPathTable prints the table of dataPath for target: the twins off
// and on, and queue-proxy in front of target.backend unless queueProxy is
// empty, over pairs of blocks at each concurrency.
func (b *bench) dataPathTable(target dataPathTarget, slice time.Duration, pairs, block int, concurrencies []int, queueProxy string) error {
	modes := []string{"off", "on"}
	if queueProxy != "" {
		if err := b.startQueueProxy(queueProxy, queueProxyConfig{userPort: target.backend.port}); err != nil {
			return err
		}
		modes = append(modes, "queue-proxy")
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c\tmode\t"+comparedHeader("off")+"\tBPF run time/req\t")
	var twinGaps, failures []string
	for _, c := range concurrencies {
		// all[mode] merges every slice; est holds one value of each
		// comparison with off per block pair, twinGap one per pair (log of
		// twin a's rps over twin b's, the accounting's share cancelled).
		all := map[string][]result{}
		est := estimates{}
		var twinGap []float64
		var bpfTime time.Duration
		var bpfRequests int64
		rng := rand.New(rand.NewPCG(uint64(c), 1))
		for range pairs {
			var blockMeans [2]map[string]comparison // per block, each comparison's mean over its rounds
			var aOverB [2]float64                   // log of twin a's rps over twin b's, per block
			for k, onTwin := range rng.Perm(2) {    // which twin is accounted first: random
				addrs := map[string]string{"off": b.addr(target, target.twins[1-onTwin].port), "on": b.addr(target, target.twins[onTwin].port), "queue-proxy": b.addr(target, queueProxyPort)}
				rs, t, n, err := b.runBlock(target, onTwin, modes, addrs, c, slice, block, rng)
				if err != nil {
					return err
				}
				bpfTime, bpfRequests = bpfTime+t, bpfRequests+n
				for _, m := range modes {
					all[m] = append(all[m], rs[m]...)
				}
				blockMeans[k] = roundMeans(rs, modes, "off")
				aOverB[k] = blockMeans[k]["on"][logRatio]
				if onTwin == 1 {
					aOverB[k] = -aOverB[k] // a is off: a/b = off/on
				}
			}
			pair := map[string]comparison{}
			for _, m := range modes {
				var mean comparison
				for d := range mean {
					mean[d] = (blockMeans[0][m][d] + blockMeans[1][m][d]) / 2
				}
				pair[m] = mean
			}
			est.add(pair)
			// With a on: log(a/b) = gap + cost; with b on: log(a/b) = gap - cost.
			twinGap = append(twinGap, (aOverB[0]+aOverB[1])/2)
		}
		for _, m := range modes {
			bpfCol := "-"
			if m == "on" && bpfRequests > 0 {
				bpfCol = (bpfTime / time.Duration(bpfRequests)).String()
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t\n", c, m, comparedCells(m, merge(all[m]), est, m == "off"), bpfCol)
			if f := failed(all[m]); f != "" {
				failures = append(failures, fmt.Sprintf("c=%d %s: %s", c, m, f))
			}
		}
		twinGaps = append(twinGaps, fmt.Sprintf("c=%d %s", c, ratioCI(meanCI(twinGap))))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("Twin a's rps over twin b's, the accounting's share cancelled (the difference the swap removes):", strings.Join(twinGaps, ", "))
	if len(failures) > 0 {
		fmt.Println("Failed (not in rps or latency):\n  " + strings.Join(failures, "\n  "))
	}
	return nil
}

// failed says how many of rs's requests failed and how the first did; ""
// if none did.
func failed(rs []result) string {
	var completed, failed int64
	var first error
	for _, r := range rs {
		completed, failed = completed+r.Completed, failed+r.Failed
		if first == nil {
			first = r.FirstError
		}
	}
	if failed == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d requests, the first: %v", failed, completed+failed, first)
}

// runBlock attaches the accounting at target's twin onTwin's cgroup and
// runs block rounds of the modes, each with a new client of target's to
// addrs[mode] (so the accounted connections are tracked from their
// start). It returns each mode's results by round, and the accounting
// programs' run time and requests in a timed run after them.
func (b *bench) runBlock(target dataPathTarget, onTwin int, modes []string, addrs map[string]string, c int, slice time.Duration, block int, rng *rand.Rand) (map[string][]result, time.Duration, int64, error) {
	a, detach, err := b.attach(target.twins[onTwin].cgroup)
	if err != nil {
		return nil, 0, 0, err
	}
	defer detach()
	loops := map[string]loop{}
	for _, m := range modes {
		l, closeClient, err := target.client(addrs[m], c)
		if err != nil {
			return nil, 0, 0, err
		}
		defer closeClient()
		l.mayFail = m == "queue-proxy" && target.queueProxyMayFail
		loops[m] = l
		runLoop(l, slice) // warm up connections and caches
	}
	rs, err := interleaveLoops(modes, loops, nil, slice, block, rng)
	if err != nil {
		return nil, 0, 0, err
	}
	bpfTime, bpfRequests, err := timedRun(a, target.client, addrs["on"], c, slice)
	return rs, bpfTime, bpfRequests, err
}

// timedRun measures the accounting programs' own run time over a closed
// loop of d by a new client of newClient, its connections closed before
// the end: the kernel times BPF programs only while asked to.
func timedRun(acct *bpf.Accounting, newClient newClient, addr string, c int, d time.Duration) (time.Duration, int64, error) {
	l, closeClient, err := newClient(addr, c)
	if err != nil {
		return 0, 0, err
	}
	defer closeClient()
	stats, err := bpf.EnableRunTimeStats()
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = stats.Close() }()
	t0, _, err := acct.RunTime()
	if err != nil {
		return 0, 0, err
	}
	r := runLoop(l, d)
	closeClient()
	t1, _, err := acct.RunTime()
	return t1 - t0, r.Completed, err
}

func (b *bench) accuracy(d time.Duration) error {
	a, detach, err := b.attach(b.root)
	if err != nil {
		return err
	}
	defer detach()
	url := "http://" + b.pod.Addr(testpod.HTTPPort) + "/?sleep=" + accuracySleep.String()
	fmt.Printf("\nAccuracy: handler sleeping %v, closed loop for %v; measured = growth of the kernel's in-flight integral / time\n", accuracySleep, d)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "keep-alive\toffered\tmeasured\terror\tclient-side (Little)\terror vs client\t")
	for _, keepAlive := range []bool{true, false} {
		for _, c := range []int{1, 8, 64} {
			l := httpLoop(loadgen.Options{URLs: []string{url}, Concurrency: c, KeepAlive: keepAlive, Spans: true})
			m, err := b.measureConcurrency(a, l, d)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%v\t%d\t%s\t\n", keepAlive, c, m.cells(c))
		}
	}
	return w.Flush()
}

// accuracySleep is how long the accuracy tables' handler takes: long
// enough that the client's own scheduling on a busy 2-core machine stays
// small next to a request.
const accuracySleep = 100 * time.Millisecond

// concurrency is one accuracy row's measurement of one window: the
// kernel's average concurrency of the pod, the client's (Little's law),
// the kernel's count of the pod's connections at the window's end (those
// followed as HTTP/2 apart), and the client's failed requests over the
// whole loop.
type concurrency struct {
	measured, client float64
	conns, h2Conns   int64
	failed           int64
}

// cells are the accuracy columns of m against the offered c: measured,
// its error, client-side and the error against it.
func (m concurrency) cells(c int) string {
	return fmt.Sprintf("%.3f\t%+.2f%%\t%.3f\t%+.2f%%", m.measured, 100*(m.measured-float64(c))/float64(c), m.client, 100*(m.measured-m.client)/m.client)
}

// measureConcurrency runs the closed loop l (with spans) for d and
// measures the pod's concurrency over its middle three quarters: the
// growth of a's in-flight integral over the window, and the client's
// requests in flight over the same window.
func (b *bench) measureConcurrency(a *bpf.Accounting, l loop, d time.Duration) (concurrency, error) {
	type snap struct {
		pod  bpf.PodCounters
		at   time.Duration
		wall time.Time
	}
	read := func() (snap, error) {
		s, err := a.Snapshot()
		return snap{s.Pods[b.pod.IP], s.At, time.Now()}, err
	}
	var s0, s1 snap
	var errs [2]error
	done := make(chan result)
	go func() { done <- runLoop(l, d) }()
	time.Sleep(d / 8)
	s0, errs[0] = read()
	time.Sleep(d * 3 / 4)
	s1, errs[1] = read()
	r := <-done
	if err := errors.Join(errs[:]...); err != nil {
		return concurrency{}, err
	}
	return concurrency{
		measured: (s1.pod.Requests.Area - s0.pod.Requests.Area).Seconds() / (s1.at - s0.at).Seconds(),
		client:   r.InFlightArea(s0.wall, s1.wall).Seconds() / s1.wall.Sub(s0.wall).Seconds(),
		conns:    s1.pod.ConnsInFlight,
		h2Conns:  s1.pod.H2ConnsInFlight,
		failed:   r.Failed,
	}, nil
}

const queueProxyPort = 8012

// queueProxyConfig is what a table needs of queue-proxy: the revision's
// containerConcurrency (0: no limit) and the pod's port it proxies to.
type queueProxyConfig struct {
	cc       int
	userPort int
}

// startQueueProxy runs Knative's queue-proxy bin in the pod's network
// namespace in front of the pod's server on conf's port, as a Knative
// revision would, and keeps it for every table that compares with the
// same conf. queue-proxy binds fixed ports (serving, admin, metrics), so
// two cannot share the pod: a table that needs another conf restarts it.
// It stays in this process's cgroup, outside the accounting's root.
func (b *bench) startQueueProxy(bin string, conf queueProxyConfig) error {
	if b.queueProxyPid != 0 {
		if b.queueProxyConf == conf {
			return nil
		}
		b.stopQueueProxy()
	}
	// `ip netns exec`, as testpod starts its processes (see Pod.StartIn).
	cmd := exec.Command("ip", "netns", "exec", b.pod.Name, bin)
	cmd.Env = append(os.Environ(), queueProxyEnv(b.pod, conf)...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("queue-proxy: %w", err)
	}
	b.pod.Adopt(cmd)
	if err := b.pod.WaitListening(queueProxyPort, 10*time.Second); err != nil {
		return fmt.Errorf("queue-proxy: %w", err)
	}
	b.queueProxy, b.queueProxyConf = cmd, conf
	b.queueProxyPid = cmd.Process.Pid // ip netns exec execs queue-proxy in place
	return nil
}

// stopQueueProxy kills the running queue-proxy and waits for it to exit,
// so that the next one can bind the same ports.
func (b *bench) stopQueueProxy() {
	_ = b.queueProxy.Process.Kill()
	_ = b.queueProxy.Wait()
	b.queueProxy, b.queueProxyConf, b.queueProxyPid = nil, queueProxyConfig{}, 0
}

func queueProxyEnv(pod *testpod.Pod, conf queueProxyConfig) []string {
	// The variables queue-proxy v0.50.0 requires (pkg/queue/sharedmain), set
	// as a revision with containerConcurrency conf.cc would have them.
	env := map[string]string{
		"SERVING_NAMESPACE": "bench", "SERVING_SERVICE": "bench", "SERVING_CONFIGURATION": "bench",
		"SERVING_REVISION": "bench-00001", "SERVING_POD": "bench-pod", "SERVING_POD_IP": pod.IP.String(),
		"QUEUE_SERVING_PORT": strconv.Itoa(queueProxyPort), "QUEUE_SERVING_TLS_PORT": "8112",
		"USER_PORT": strconv.Itoa(conf.userPort), "CONTAINER_CONCURRENCY": strconv.Itoa(conf.cc),
		"REVISION_TIMEOUT_SECONDS": "300", "SERVING_LOGGING_CONFIG": "", "SERVING_LOGGING_LEVEL": "error",
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}
