package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
)

// This file is the machinery the side-by-side tables share: closed loops
// with the machine's CPU, modes taking turns in slices, comparisons taken
// within a round, and their means with confidence intervals.

// result of one closed-loop measurement: the client's view and the
// machine's CPU.
type result struct {
	*loadgen.Result
	cpu      time.Duration // whole machine, busy time
	switches int64         // whole machine, context switches
	proc     time.Duration // the mode's proxy process alone, if it has one (see interleave)
}

func (r result) cpuPerRequest() time.Duration {
	if r.Completed == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.Completed)
}

// procPerRequest is the CPU time of the mode's proxy process per request.
func (r result) procPerRequest() time.Duration {
	if r.Completed == 0 {
		return 0
	}
	return r.proc / time.Duration(r.Completed)
}

// switchesPerRequest is how often the machine's CPUs switched tasks per
// request: at c = 1 a request is a chain of wake-ups, and a little latency
// can turn a runtime's spinning into sleeping and waking.
func (r result) switchesPerRequest() float64 {
	if r.Completed == 0 {
		return 0
	}
	return float64(r.switches) / float64(r.Completed)
}

// closedLoop runs the closed loop opts for d.
func closedLoop(opts loadgen.Options, d time.Duration) result {
	return runLoop(httpLoop(opts), d)
}

// A loop is a closed loop of c requests in flight: run drives it for d
// and returns the client's view. loadgen's HTTP loops are one kind
// (httpLoop); the gRPC client's calls are another (grpcClient). mayFail:
// a failed request is counted, not an error (a mode's known failures,
// which its table reports).
type loop struct {
	c       int
	run     func(d time.Duration) *loadgen.Result
	mayFail bool
}

// httpLoop is the loop of loadgen's opts.
func httpLoop(opts loadgen.Options) loop {
	return loop{c: opts.Concurrency, run: func(d time.Duration) *loadgen.Result { return loadgen.Run(opts, d) }}
}

// runLoop runs l for d, with the machine's CPU and switches meanwhile.
func runLoop(l loop, d time.Duration) result {
	cpu0, sw0 := machineStat()
	r := l.run(d)
	cpu1, sw1 := machineStat()
	return result{Result: r, cpu: cpu1 - cpu0, switches: sw1 - sw0}
}

// keepAliveLoop is the data path's load: c requests in flight against url
// over client's connections.
func keepAliveLoop(url string, c int, client *http.Client) loadgen.Options {
	return loadgen.Options{URLs: []string{url}, Concurrency: c, KeepAlive: true, Client: client}
}

// machineStat reads /proc/stat once for the machine's busy CPU time (all
// CPUs running something: not idle, not waiting, and not stolen by the
// hypervisor, since on a shared VM steal comes in bursts and is no cost of
// ours) and its context switches since boot.
func machineStat() (busy time.Duration, switches int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	lines := strings.Split(string(data), "\n")
	var ticks int64
	for i, f := range strings.Fields(lines[0])[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already in user and nice.
		if i == 3 || i == 4 || i >= 7 {
			continue
		}
		ticks += v
	}
	for _, line := range lines {
		if v, ok := strings.CutPrefix(line, "ctxt "); ok {
			switches, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return time.Duration(ticks) * (time.Second / 100), switches // USER_HZ
}

// processCPUTime is the time every thread of process pid has run on a
// CPU, user and system (the first field of each thread's schedstat, in
// ns: finer than the 10 ms ticks of /proc/<pid>/stat). Threads that
// ended are not counted; Go's runtime keeps its threads.
func processCPUTime(pid int) time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue
		}
		f := strings.Fields(string(data))
		if len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			total += time.Duration(ns)
		}
	}
	return total
}

// interleave runs rounds of the modes, each mode's closed loop loads[m]
// for one slice per round after an unmeasured lead-in of a tenth of a
// slice (the switch from the previous mode), in a new random order every
// round: whatever a mode leaves behind (warm caches of the server it used)
// then helps no mode in particular. It returns each mode's results by
// round; a failed request is an error. A mode with a process in procs (a
// proxy) also gets that process's own CPU time.
func interleave(modes []string, loads map[string]loadgen.Options, procs map[string]int, slice time.Duration, rounds int, rng *rand.Rand) (map[string][]result, error) {
	loops := make(map[string]loop, len(loads))
	for m, opts := range loads {
		loops[m] = httpLoop(opts)
	}
	return interleaveLoops(modes, loops, procs, slice, rounds, rng)
}

// interleaveLoops is interleave for loops of any kind.
func interleaveLoops(modes []string, loops map[string]loop, procs map[string]int, slice time.Duration, rounds int, rng *rand.Rand) (map[string][]result, error) {
	return takeTurns(modes, rounds, rng, func(m string) (result, error) {
		runLoop(loops[m], slice/10)
		pid, timed := procs[m]
		var p0 time.Duration
		if timed {
			p0 = processCPUTime(pid)
		}
		r := runLoop(loops[m], slice)
		if timed {
			r.proc = processCPUTime(pid) - p0
		}
		if r.Failed > 0 && !loops[m].mayFail {
			return r, fmt.Errorf("%s c=%d: %d requests failed, the first: %w", m, loops[m].c, r.Failed, r.FirstError)
		}
		return r, nil
	})
}

// takeTurns runs rounds of the modes, run(m) once for each mode per round
// in a new random order every round, and returns each mode's results by
// round; it stops at run's first error.
func takeTurns(modes []string, rounds int, rng *rand.Rand, run func(m string) (result, error)) (map[string][]result, error) {
	rs := map[string][]result{}
	for range rounds {
		order := slices.Clone(modes)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, m := range order {
			r, err := run(m)
			if err != nil {
				return nil, err
			}
			rs[m] = append(rs[m], r)
		}
	}
	return rs, nil
}

// versusBase are the comparisons of a mode with a table's baseline mode
// (off, direct) that the tables report, each taken within a round; index
// them with logRatio, extraCPU, extraSwitches, logCPURatio and extraProc.
var versusBase = [...]func(r, base result) float64{
	logRatio:      func(r, base result) float64 { return math.Log(r.RPS() / base.RPS()) }, // its mean is the log of the geometric mean
	extraCPU:      func(r, base result) float64 { return float64(r.cpuPerRequest() - base.cpuPerRequest()) },
	extraSwitches: func(r, base result) float64 { return r.switchesPerRequest() - base.switchesPerRequest() },
	logCPURatio: func(r, base result) float64 {
		return math.Log(r.cpuPerRequest().Seconds() / base.cpuPerRequest().Seconds())
	},
	extraProc: func(r, base result) float64 { return float64(r.procPerRequest() - base.procPerRequest()) },
}

const (
	logRatio = iota
	extraCPU
	extraSwitches
	logCPURatio
	extraProc // the process of result.proc, where a table has one
)

// comparison holds one value of each comparison in versusBase.
type comparison [len(versusBase)]float64

// roundMeans is, for each mode, the mean over the rounds of rs of each
// comparison with mode base in the same round.
func roundMeans(rs map[string][]result, modes []string, base string) map[string]comparison {
	means := map[string]comparison{}
	for _, m := range modes {
		var mean comparison
		for i, r := range rs[m] {
			for d, compare := range versusBase {
				mean[d] += compare(r, rs[base][i]) / float64(len(rs[m]))
			}
		}
		means[m] = mean
	}
	return means
}

// estimates collect, per mode, one value of each comparison per
// independent unit of a run (a block, or a pair of blocks); the tables
// give their means and confidence intervals.
type estimates map[string][]comparison

func (e estimates) add(means map[string]comparison) {
	for m, c := range means {
		e[m] = append(e[m], c)
	}
}

// ci is the mean and 95 % confidence interval of comparison d of mode m.
func (e estimates) ci(m string, d int) (mean, lo, hi float64) {
	vs := make([]float64, len(e[m]))
	for i, c := range e[m] {
		vs[i] = c[d]
	}
	return meanCI(vs)
}

// ratioCI formats the geometric mean of the ratios whose logs are vs, with
// its interval.
func ratioCI(mean, lo, hi float64) string {
	return fmt.Sprintf("%.3f [%.3f-%.3f]", math.Exp(mean), math.Exp(lo), math.Exp(hi))
}

// comparedHeader names the columns comparedCells fills, against mode base.
func comparedHeader(base string) string {
	return fmt.Sprintf("rps\trps vs %[1]s\tp50\tp99\tCPU/req\tCPU/req vs %[1]s\tswitches/req\tswitches/req vs %[1]s", base)
}

// comparedCells are mode m's columns: the client's rps and latency and
// the machine's CPU and switches per request over every slice merged, and
// the comparisons with the base mode with their intervals (none for the
// base itself).
func comparedCells(m string, merged result, est estimates, isBase bool) string {
	ratio, cpu, switches := "1", "0", "0"
	if !isBase {
		ratio = ratioCI(est.ci(m, logRatio))
		mean, lo, hi := est.ci(m, extraCPU)
		cpu = fmt.Sprintf("%+.1fµs [%+.1f..%+.1f]", mean/1e3, lo/1e3, hi/1e3)
		mean, lo, hi = est.ci(m, extraSwitches)
		switches = fmt.Sprintf("%+.2f [%+.2f..%+.2f]", mean, lo, hi)
	}
	return fmt.Sprintf("%.0f\t%s\t%v\t%v\t%v\t%s\t%.2f\t%s", merged.RPS(), ratio,
		merged.Percentile(0.5).Round(time.Microsecond), merged.Percentile(0.99).Round(time.Microsecond),
		merged.cpuPerRequest().Round(100*time.Nanosecond), cpu, merged.switchesPerRequest(), switches)
}

// meanCI returns the mean of vs and its 95 % confidence interval
// (Student's t).
func meanCI(vs []float64) (mean, lo, hi float64) {
	n := float64(len(vs))
	for _, v := range vs {
		mean += v
	}
	mean /= n
	var ss float64
	for _, v := range vs {
		ss += (v - mean) * (v - mean)
	}
	half := t975(len(vs)-1) * math.Sqrt(ss/(n-1)/n)
	return mean, mean - half, mean + half
}

// t975 is the 97.5th percentile of Student's t with df degrees of freedom:
// from the table up to 30, beyond it 1.96 + 2.4/df (within 0.003).
func t975(df int) float64 {
	table := [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df <= len(table) {
		return table[df-1]
	}
	return 1.96 + 2.4/float64(df)
}

func merge(rs []result) result {
	m := result{Result: &loadgen.Result{}}
	for _, r := range rs {
		m.Completed += r.Completed
		m.Elapsed += r.Elapsed
		m.Latencies = append(m.Latencies, r.Latencies...)
		m.cpu += r.cpu
		m.switches += r.switches
		m.proc += r.proc
	}
	return m
}
