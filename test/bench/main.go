// Command bench measures sockscale's data path and accounting on this
// machine and prints comparable tables: every ratio is measured side by
// side in one run, rounds interleaved, because shared machines are noisy;
// the paired table goes further and loads an accounted and an unaccounted
// pod at the same time.
//
//	go run ./test/bench [-duration 2s] [-rounds 7] [-queue-proxy PATH] [-only datapath,paired,accuracy,footprint]
//
// It needs root (network namespaces, cgroups, BPF). Traffic goes only to
// the fake pods it creates in network namespaces on this machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/cgroup2"
	"github.com/sockscale/sockscale/internal/loadgen"
	"github.com/sockscale/sockscale/internal/testpod"
)

func main() {
	testpod.Main() // returns unless this process is a fake pod's server
	duration := flag.Duration("duration", 2*time.Second, "length of one data-path measurement")
	accuracyDuration := flag.Duration("accuracy-duration", 4*time.Second, "length of one accuracy measurement")
	footprintDuration := flag.Duration("footprint-duration", 8*time.Second, "length of one agent-footprint measurement")
	rounds := flag.Int("rounds", 7, "rounds per data-path cell, each measuring every mode back to back")
	queueProxy := flag.String("queue-proxy", os.Getenv("QUEUE_PROXY"), "path of Knative's queue-proxy binary (empty: skip that column)")
	only := flag.String("only", "datapath,paired,accuracy,footprint", "comma-separated parts: datapath, paired, accuracy, footprint")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (network namespaces, cgroups, BPF)")
		os.Exit(2)
	}
	b, err := newBench()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	defer b.close()
	for _, part := range strings.Split(*only, ",") {
		switch part {
		case "datapath":
			err = b.dataPath(*duration, *rounds, *queueProxy)
		case "paired":
			err = b.dataPathPaired(*duration, *rounds)
		case "accuracy":
			err = b.accuracy(*accuracyDuration)
		case "footprint":
			err = footprint(b.root, *footprintDuration)
		default:
			err = fmt.Errorf("unknown part %q: want datapath, paired, accuracy or footprint", part)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
}

type bench struct {
	root string // cgroup the accounting attaches at
	pod  *testpod.Pod

	// A second pod outside root, never accounted: the reference that
	// dataPathPaired loads at the same time as pod.
	refCgroup string
	ref       *testpod.Pod
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
	pod, err := testpod.Create(testpod.Options{Subnet: 77, CgroupParent: root})
	if err != nil {
		return nil, err
	}
	b := &bench{root: root, pod: pod, refCgroup: root + "-ref"}
	if err := pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		b.close()
		return nil, err
	}
	if err := os.MkdirAll(b.refCgroup, 0o755); err != nil {
		b.close()
		return nil, err
	}
	if b.ref, err = testpod.Create(testpod.Options{Subnet: 79, CgroupParent: b.refCgroup}); err != nil {
		b.close()
		return nil, err
	}
	if err := b.ref.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	_ = b.pod.Delete()
	if b.ref != nil {
		_ = b.ref.Delete()
	}
	_ = os.Remove(b.root)
	_ = os.Remove(b.refCgroup)
}

// attach turns accounting on for the pod; the returned func turns it off.
func (b *bench) attach() (*bpf.Accounting, func(), error) {
	a, err := bpf.New(bpf.Options{CgroupRoot: b.root})
	if err != nil {
		return nil, nil, err
	}
	if err := a.AddPod(b.pod.IP, 1); err != nil {
		return nil, nil, errors.Join(err, a.Close())
	}
	return a, func() { _ = a.Close() }, nil
}

// result of one closed-loop measurement: the client's view, the machine's
// CPU, and the accounting programs' own run time where measured.
type result struct {
	*loadgen.Result
	cpu         time.Duration // whole machine, busy time
	bpf         time.Duration // run time of the accounting programs, in a timed run
	bpfRequests int64         // requests of that timed run
}

func (r result) cpuPerRequest() time.Duration {
	if r.Completed == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.Completed)
}

// closedLoop keeps c requests in flight against url for d.
func closedLoop(url string, c int, keepAlive bool, d time.Duration, spans bool) result {
	cpu0 := machineBusy()
	r := loadgen.Run(loadgen.Options{URLs: []string{url}, Concurrency: c, KeepAlive: keepAlive, Spans: spans}, d)
	return result{Result: r, cpu: machineBusy() - cpu0}
}

// machineBusy is the CPU time all CPUs spent running something, from
// /proc/stat: not idle, not waiting, and not stolen by the hypervisor (on a
// shared VM steal comes in bursts and is no cost of ours).
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)[1:]
	var busy int64
	for i, f := range fields {
		v, _ := strconv.ParseInt(f, 10, 64)
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already in user and nice.
		if i == 3 || i == 4 || i >= 7 {
			continue
		}
		busy += v
	}
	return time.Duration(busy) * (time.Second / 100) // USER_HZ
}

type mode struct {
	name string
	url  string
	on   bool // accounting attached
}

// dataPath compares the same pod and load with the accounting off, on, and
// through queue-proxy, with a second off as a control. This machine's speed
// drifts by several percent over seconds (shared vCPUs), so every round
// measures each mode back to back (in a rotating order) and a ratio is taken
// within the round; the table shows the median of those per-round ratios and
// their range, not a ratio of totals that one slow second could skew.
func (b *bench) dataPath(d time.Duration, rounds int, queueProxy string) error {
	direct := "http://" + b.pod.Addr(testpod.HTTPPort) + "/"
	// "off again" is the control: the same setup as off, so its ratio to
	// off shows how far this machine's noise alone moves a ratio.
	modes := []mode{{"off", direct, false}, {"off again", direct, false}, {"on", direct, true}}
	if queueProxy != "" {
		if err := startQueueProxy(b.pod, queueProxy); err != nil {
			return fmt.Errorf("queue-proxy: %w", err)
		}
		modes = append(modes, mode{"queue-proxy", "http://" + b.pod.Addr(queueProxyPort) + "/", false})
	}
	concurrencies := []int{1, 16, 64}
	// results[c][mode name][round]
	results := map[int]map[string][]result{}
	for _, c := range concurrencies {
		results[c] = map[string][]result{}
		for round := range rounds {
			for _, m := range rotate(modes, round) {
				r, err := b.measure(m, c, d, round == 0)
				if err != nil {
					return err
				}
				results[c][m.name] = append(results[c][m.name], r)
			}
		}
	}
	fmt.Printf("\nData path: trivial handler, keep-alive, closed loop; per cell %d rounds of %v per mode, modes back to back\n", rounds, d)
	fmt.Println("Ratios and differences are taken within each round: median [min-max] over the rounds.")
	fmt.Println("CPU is the whole machine's (load generator included), so differences between rows are the cost;")
	fmt.Println("BPF run time is what the kernel measured for the accounting programs themselves (kernel.bpf_stats).")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c\tmode\trps\trps vs off\tp50\tp99\tCPU/req\tCPU/req vs off\tBPF run time/req\t")
	for _, c := range concurrencies {
		off := results[c]["off"]
		for _, m := range modes {
			rs := results[c][m.name]
			var ratios, extraCPU []float64
			for i, r := range rs {
				ratios = append(ratios, r.RPS()/off[i].RPS())
				extraCPU = append(extraCPU, float64(r.cpuPerRequest()-off[i].cpuPerRequest()))
			}
			all := merge(rs)
			bpfPerReq := "-"
			if m.on {
				bpfPerReq = (all.bpf / time.Duration(all.bpfRequests)).String()
			}
			ratio, cpu := "1", "0"
			if m.name != "off" {
				ratio = spread(ratios, func(v float64) string { return fmt.Sprintf("%.3f", v) })
				cpu = spread(extraCPU, func(v float64) string { return fmt.Sprintf("%+.1fµs", v/1e3) })
			}
			fmt.Fprintf(w, "%d\t%s\t%.0f\t%s\t%v\t%v\t%v\t%s\t%s\t\n", c, m.name, all.RPS(), ratio,
				all.Percentile(0.5).Round(time.Microsecond), all.Percentile(0.99).Round(time.Microsecond),
				all.cpuPerRequest().Round(100*time.Nanosecond), cpu, bpfPerReq)
		}
	}
	return w.Flush()
}

// dataPathPaired measures the throughput cost with less of the machine's
// drift: the accounted pod and a reference pod outside the accounting's
// cgroup are loaded at the same time, so what the machine does to one it
// mostly does to the other (under saturation they also compete for it). Each round measures the pair twice, with the accounting
// detached and attached; the cost is how much the pod's share moves:
//
//	(pod/ref attached) / (pod/ref detached)
//
// The detached ratio's own spread over the rounds is the control.
func (b *bench) dataPathPaired(d time.Duration, rounds int) error {
	podURL := "http://" + b.pod.Addr(testpod.HTTPPort) + "/"
	refURL := "http://" + b.ref.Addr(testpod.HTTPPort) + "/"
	pair := func(c int, d time.Duration) (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		pod := loadgen.Start(ctx, loadgen.Options{URLs: []string{podURL}, Concurrency: c, KeepAlive: true})
		ref := loadgen.Start(ctx, loadgen.Options{URLs: []string{refURL}, Concurrency: c, KeepAlive: true})
		<-ctx.Done()
		p, r := pod.Stop(), ref.Stop()
		if p.Failed+r.Failed > 0 {
			return 0, fmt.Errorf("c=%d: %d requests failed", c, p.Failed+r.Failed)
		}
		return p.RPS() / r.RPS(), nil
	}
	concurrencies := []int{1, 16, 64}
	fmt.Printf("\nData path, paired: the pod and an unaccounted reference pod under the same load at the same time; %d rounds of %v per cell\n", rounds, d)
	fmt.Println("rps share = the pod's rps / the reference's; on vs off = share attached / share detached, per round: median [min-max].")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c per pod\tshare detached (control)\tshare attached\ton vs off\t")
	for _, c := range concurrencies {
		var detached, attached, cost []float64
		for round := range rounds {
			var off, on float64
			for _, attach := range rotate([]bool{false, true}, round) {
				var detach func()
				if attach {
					_, det, err := b.attach()
					if err != nil {
						return err
					}
					detach = det
				}
				if _, err := pair(c, d/4); err != nil { // warm up
					return err
				}
				share, err := pair(c, d)
				if detach != nil {
					detach()
				}
				if err != nil {
					return err
				}
				if attach {
					on = share
				} else {
					off = share
				}
			}
			detached, attached, cost = append(detached, off), append(attached, on), append(cost, on/off)
		}
		f := func(v float64) string { return fmt.Sprintf("%.3f", v) }
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t\n", c, spread(detached, f), spread(attached, f), spread(cost, f))
	}
	return w.Flush()
}

// measure runs one closed loop of d at concurrency c in mode m, after a
// warm-up. With timed, an accounting-on run is followed by a shorter one
// with the kernel timing the programs (the timing itself costs, so the run
// that measures throughput goes without it).
func (b *bench) measure(m mode, c int, d time.Duration, timed bool) (result, error) {
	var acct *bpf.Accounting
	if m.on {
		a, detach, err := b.attach()
		if err != nil {
			return result{}, err
		}
		defer detach()
		acct = a
	}
	closedLoop(m.url, c, true, d/4, false) // warm up connections and caches
	r := closedLoop(m.url, c, true, d, false)
	if r.Failed > 0 {
		return r, fmt.Errorf("%s c=%d: %d requests failed", m.name, c, r.Failed)
	}
	if acct != nil && timed {
		var err error
		if r.bpf, r.bpfRequests, err = timedRun(acct, m.url, c, d); err != nil {
			return r, err
		}
	}
	return r, nil
}

// spread formats the median of vs and their range.
func spread(vs []float64, format func(float64) string) string {
	s := slices.Sorted(slices.Values(vs))
	median := s[len(s)/2]
	if len(s)%2 == 0 {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%s [%s..%s]", format(median), format(s[0]), format(s[len(s)-1]))
}

// timedRun measures the accounting programs' own run time over a closed
// loop of d: the kernel times BPF programs only while asked to.
func timedRun(acct *bpf.Accounting, url string, c int, d time.Duration) (time.Duration, int64, error) {
	stats, err := bpf.EnableRunTimeStats()
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = stats.Close() }()
	t0, _, err := acct.RunTime()
	if err != nil {
		return 0, 0, err
	}
	r := closedLoop(url, c, true, d, false)
	t1, _, err := acct.RunTime()
	return t1 - t0, r.Completed, err
}

// rotate changes the order of modes every round so no mode always runs
// first (or right after another's warm-up).
func rotate[T any](modes []T, round int) []T {
	out := slices.Clone(modes)
	k := round % len(out)
	return append(out[k:], out[:k]...)
}

func merge(rs []result) result {
	m := result{Result: &loadgen.Result{}}
	for _, r := range rs {
		m.Completed += r.Completed
		m.Elapsed += r.Elapsed
		m.Latencies = append(m.Latencies, r.Latencies...)
		m.cpu += r.cpu
		m.bpf += r.bpf
		m.bpfRequests += r.bpfRequests
	}
	return m
}

func (b *bench) accuracy(d time.Duration) error {
	a, detach, err := b.attach()
	if err != nil {
		return err
	}
	defer detach()
	// Long enough that the client's own scheduling on a busy 2-core machine
	// stays small next to a request.
	const sleep = 100 * time.Millisecond
	url := "http://" + b.pod.Addr(testpod.HTTPPort) + "/?sleep=" + sleep.String()
	fmt.Printf("\nAccuracy: handler sleeping %v, closed loop for %v; measured = growth of the kernel's in-flight integral / time\n", sleep, d)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "keep-alive\toffered\tmeasured\terror\tclient-side (Little)\terror vs client\t")
	for _, keepAlive := range []bool{true, false} {
		for _, c := range []int{1, 8, 64} {
			type snap struct {
				area time.Duration
				at   time.Duration
				wall time.Time
			}
			read := func() (snap, error) {
				s, err := a.Snapshot()
				return snap{s.Pods[b.pod.IP].Requests.Area, s.At, time.Now()}, err
			}
			var s0, s1 snap
			var errs [2]error
			done := make(chan result)
			go func() { done <- closedLoop(url, c, keepAlive, d, true) }()
			time.Sleep(d / 8)
			s0, errs[0] = read()
			time.Sleep(d * 3 / 4)
			s1, errs[1] = read()
			r := <-done
			if err := errors.Join(errs[:]...); err != nil {
				return err
			}
			measured := (s1.area - s0.area).Seconds() / (s1.at - s0.at).Seconds()
			client := r.InFlightArea(s0.wall, s1.wall).Seconds() / s1.wall.Sub(s0.wall).Seconds()
			fmt.Fprintf(w, "%v\t%d\t%.3f\t%+.2f%%\t%.3f\t%+.2f%%\t\n", keepAlive, c, measured,
				100*(measured-float64(c))/float64(c), client, 100*(measured-client)/client)
		}
	}
	return w.Flush()
}

const queueProxyPort = 8012

// startQueueProxy runs Knative's queue-proxy in the pod's network namespace
// in front of the pod's server, as a Knative revision would.
func startQueueProxy(pod *testpod.Pod, bin string) error {
	cmd := exec.Command("ip", "netns", "exec", pod.Name, bin)
	cmd.Env = append(os.Environ(), queueProxyEnv(pod)...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	pod.Adopt(cmd)
	return pod.WaitListening(queueProxyPort, 10*time.Second)
}

func queueProxyEnv(pod *testpod.Pod) []string {
	// The variables queue-proxy v0.50.0 requires (pkg/queue/sharedmain), set
	// as a revision with containerConcurrency 0 would have them.
	env := map[string]string{
		"SERVING_NAMESPACE": "bench", "SERVING_SERVICE": "bench", "SERVING_CONFIGURATION": "bench",
		"SERVING_REVISION": "bench-00001", "SERVING_POD": "bench-pod", "SERVING_POD_IP": pod.IP.String(),
		"QUEUE_SERVING_PORT": strconv.Itoa(queueProxyPort), "QUEUE_SERVING_TLS_PORT": "8112",
		"USER_PORT": strconv.Itoa(testpod.HTTPPort), "CONTAINER_CONCURRENCY": "0",
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
