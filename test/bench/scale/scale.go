package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/test/bench/harness"
)

// scaleOptions are the command's flags.
type scaleOptions struct {
	targets        []int
	cold           int
	warmup, window time.Duration
	steadyTimeout  time.Duration
	// controller is the sockscale-controller binary (empty: build this
	// tree's).
	controller string
	// profileDir receives each point's CPU profiles of every controller
	// replica and of the API server, and the replicas' heap profiles
	// (empty: none taken; see profileFile).
	profileDir string
	// replicas are the controller replica counts each target count is
	// measured with; with more than one, they split the targets into
	// buckets (0: twice the replicas).
	replicas []int
	buckets  int
	// others is how many other workloads (a Deployment and an
	// EndpointSlice each, setupOthers) the cluster also runs.
	others int
}

// wantStable is a warm target's load: its stable value if every report
// is counted once.
const wantStable = podsPerTarget * perPodConcurrency

// scaleRow is one scale point's results.
type scaleRow struct {
	targets, nodes     int
	others             int
	replicas, buckets  int
	setup, steady      time.Duration
	interval, duration histogram
	decisionsPerSec    float64
	pokes              []time.Duration
	pokeMissed         int
	// scaleWrite is the API server's duration of the /scale writes while
	// the pokes ran (apiserver_request_duration_seconds); pokeDecided the
	// controllers' own account of the pokes, from the poke's arrival to
	// the end of the decision it woke (its /scale write included).
	scaleWrite, pokeDecided   histogram
	ctrlCPU, apiCPU, fleetCPU float64 // cores; ctrlCPU of every replica
	// ctrlCPUMax is the busiest replica's CPU; ctrlRSS and ctrlPeak are
	// the largest replica's.
	ctrlCPUMax        float64
	ctrlRSS, ctrlPeak int64
	writes, reviews   float64
	writesBy          string
	ingest            []time.Duration
	posts             int
	drops, dropSample string
	controllerLog     string
	// stable is the median of the warm targets' stable values at the
	// window's end (want wantStable).
	stable float64
	// notSteady says why the point never reached steady state ("": it did).
	notSteady string
}

// parseTargets reads -targets.
func parseTargets(flagValue string) ([]int, error) {
	return parseCounts("-targets", flagValue, 2, "1000,3000,10000")
}

// parseCounts reads a comma-separated list of integers >= least.
func parseCounts(flagName, flagValue string, least int, example string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(flagValue, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s %q: %q is not a count; want integers >= %d separated by commas, e.g. %s", flagName, flagValue, f, least, example)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func scale(o scaleOptions) error {
	fmt.Printf("\nControl-plane scale: real sockscale-controller, kube-apiserver and etcd; per target %d pods on %d-pod nodes (nodes = targets/2),\n", podsPerTarget, podsPerNode)
	fmt.Printf("each pod at concurrency %.1f (desired = current = %d); %d cold targets at zero poked once each after the window;\n", perPodConcurrency, podsPerTarget, o.cold)
	fmt.Printf("agents and %d activators POST every 1 s over HTTPS with pod-bound tokens; warm-up %v, window %v.\n", scaleActivators, o.warmup, o.window)
	var rows []scaleRow
	var errs []error
	for _, n := range o.targets {
		for _, replicas := range o.replicas {
			row, err := scalePoint(n, replicas, o)
			if err != nil {
				errs = append(errs, fmt.Errorf("%d targets, %d replicas: %w", n, replicas, err))
				fmt.Fprintf(os.Stderr, "scale: %d targets, %d replicas: %v\n", n, replicas, err)
				continue
			}
			rows = append(rows, row)
			if len(o.targets)*len(o.replicas) > 1 {
				// The next point takes minutes (10,000 targets: half an
				// hour of setup): a run stopped there keeps this one.
				printScale([]scaleRow{row})
			}
		}
	}
	if len(rows) > 1 {
		fmt.Println("\nAll points:")
	}
	printScale(rows)
	return errors.Join(errs...)
}

func printScale(rows []scaleRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Println("\nDecision interval: time between two decisions of one target (goal p99 <= 2.2 s), from the controller's histogram over the window;")
	fmt.Println("poke: an activator's first report for a target at zero -> Deployment watch shows spec.replicas >= 1 (goal p99 <= 50 ms);")
	fmt.Println("CPU in cores over the window (controller goal <= 2 a replica, RSS <= 2 GB): all replicas and the busiest; writes/s: the API server's write requests over the window (all the controller's);")
	fmt.Println("ingest: round trip of the fleet's POSTs; drops: non-2xx by status, transport errors, skipped periods.")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "targets\treplicas (buckets)\tagents\tpods\tsetup\tsteady\tinterval p50\tp99\tmax\tdecisions/s\tdecide p99\tstable (want %.0f)\tpoke p50\tp99\tmax\tctrl CPU (busiest)\tctrl RSS (peak)\twrites/s\treviews/s\tingest p50\tp99\tmax\tposts\tdrops\tapiserver+etcd CPU\tfleet CPU\t\n", wantStable)
	for _, r := range rows {
		poke := func(p float64) string {
			if len(r.pokes) == 0 {
				return "-"
			}
			return fmtMs(harness.Percentile(r.pokes, p))
		}
		steady := r.steady.Round(time.Second).String()
		if r.notSteady != "" {
			steady = "never"
		}
		intervalMax := r.interval.seconds(r.interval.max())
		if !strings.HasPrefix(intervalMax, ">") && intervalMax != "-" {
			intervalMax = "<=" + intervalMax // the highest bucket's bound
		}
		pokeMax := poke(1)
		if r.pokeMissed > 0 {
			pokeMax = fmt.Sprintf("%s (%d >%v)", pokeMax, r.pokeMissed, pokeWait)
		}
		targets := strconv.Itoa(r.targets)
		if r.others > 0 {
			targets += fmt.Sprintf(" (+%d others)", r.others)
		}
		fmt.Fprintf(w, "%s\t%d (%d)\t%d\t%d\t%v\t%v\t%s\t%s\t%s\t%.0f\t%s\t%.1f\t%s\t%s\t%s\t%.2f (%.2f)\t%s (%s)\t%.2f\t%.2f\t%s\t%s\t%s\t%d\t%s\t%.2f\t%.2f\t\n",
			targets, r.replicas, r.buckets, r.nodes, r.targets*podsPerTarget, r.setup.Round(time.Second), steady,
			r.interval.seconds(r.interval.quantile(0.5)), r.interval.seconds(r.interval.quantile(0.99)), intervalMax,
			r.decisionsPerSec, r.duration.seconds(r.duration.quantile(0.99)), r.stable,
			poke(0.5), poke(0.99), pokeMax, r.ctrlCPU, r.ctrlCPUMax, mib(r.ctrlRSS), mib(r.ctrlPeak), r.writes, r.reviews,
			fmtMs(harness.Percentile(r.ingest, 0.5)), fmtMs(harness.Percentile(r.ingest, 0.99)), fmtMs(harness.Percentile(r.ingest, 1)), r.posts, r.drops,
			r.apiCPU, r.fleetCPU)
	}
	_ = w.Flush()
	for _, r := range rows {
		fmt.Printf("%d targets: writes by resource: %s\n", r.targets, r.writesBy)
		if r.dropSample != "" {
			fmt.Printf("%d targets: transport errors, e.g.: %s\n", r.targets, r.dropSample)
		}
		if r.notSteady != "" {
			fmt.Printf("%d targets: never steady: %s\n", r.targets, r.notSteady)
		}
		if n := r.scaleWrite.total(); n > 0 {
			fmt.Printf("%d targets: during the pokes the API server took p50 %s, p99 %s for %.0f /scale writes (of each poke's time)\n",
				r.targets, r.scaleWrite.seconds(r.scaleWrite.quantile(0.5)), r.scaleWrite.seconds(r.scaleWrite.quantile(0.99)), n)
		}
		if n := r.pokeDecided.total(); n > 0 {
			fmt.Printf("%d targets: the controller's part of the pokes (arrival -> decision written): p50 %s, p99 %s of %.0f\n",
				r.targets, r.pokeDecided.seconds(r.pokeDecided.quantile(0.5)), r.pokeDecided.seconds(r.pokeDecided.quantile(0.99)), n)
		}
		fmt.Printf("%d targets, %d replicas: controller log: %s\n", r.targets, r.replicas, r.controllerLog)
	}
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
func mib(b int64) string           { return fmt.Sprintf("%dMiB", b>>20) }

// scalePoint runs one scale point on a fresh control plane and stops
// everything it started, also on error.
func scalePoint(n, replicas int, o scaleOptions) (row scaleRow, err error) {
	shape := newScaleShape(n, o.cold)
	buckets := 1
	if replicas > 1 {
		if buckets = o.buckets; buckets == 0 {
			buckets = 2 * replicas
		}
	}
	row = scaleRow{targets: n, nodes: shape.nodes, replicas: replicas, buckets: buckets, others: o.others}
	fmt.Printf("\n%d targets, %d nodes, %d controller replicas (%d buckets): starting etcd and kube-apiserver\n", n, shape.nodes, replicas, buckets)
	// Every target has two Services with a cluster IP (public and
	// private): envtest's default range, a /24, holds 254.
	cp, err := harness.StartControlPlaneArgs("sockscale-controller", map[string]string{"service-cluster-ip-range": "10.96.0.0/12"},
		filepath.Join(harness.ModuleDir(), "charts", "sockscale", "files", "crds"))
	if err != nil {
		return row, err
	}
	defer cp.Stop()
	// Interrupted (^C, or a timeout's SIGTERM), the point still stops its
	// controller and control plane, which would outlive this process.
	var ctrlOnExit atomic.Pointer[[]*controllerProc]
	defer harness.AtInterrupt(func() {
		if ps := ctrlOnExit.Load(); ps != nil {
			for _, p := range *ps {
				p.stop()
			}
		}
		cp.Stop()
	})()
	cfg := rest.CopyConfig(cp.Cfg)
	cfg.QPS, cfg.Burst = 2000, 4000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return row, err
	}
	scheme := kruntime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), v1alpha1.AddToScheme(scheme)); err != nil {
		return row, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return row, err
	}
	ctx := context.Background()
	sc := &scaleCluster{shape: shape, cs: cs, c: c}
	start := time.Now()
	if err := sc.setupFleet(ctx); err != nil {
		return row, err
	}
	fmt.Printf("  nodes, agents, activators and tokens: %v\n", time.Since(start).Round(time.Second))
	if err := sc.setupOthers(ctx, o.others); err != nil {
		return row, err
	}
	if o.others > 0 {
		fmt.Printf("  + %d other workloads (a Deployment and a %d-pod EndpointSlice each): %v\n", o.others, otherSlicePods, time.Since(start).Round(time.Second))
	}
	ctrls, err := startControllers(cp, o.controller, o.profileDir != "", replicas, buckets)
	if err != nil {
		return row, err
	}
	ctrl := ctrls[0]
	var logs []string
	for _, c := range ctrls {
		logs = append(logs, c.log)
		defer c.stop()
	}
	row.controllerLog = strings.Join(logs, " ")
	ctrlOnExit.Store(&ctrls)
	if err := sc.setupTargets(ctx); err != nil {
		return row, err
	}
	fmt.Printf("  + targets: %v\n", time.Since(start).Round(time.Second))
	// The controller makes the private Services at 7 to 12 a second
	// (one ServerlessService worker): 3,000 took more than 5 minutes.
	if err := sc.setupEndpoints(ctx, max(5*time.Minute, time.Duration(n)*200*time.Millisecond)); err != nil {
		return row, err
	}
	row.setup = time.Since(start)
	fmt.Printf("  + endpoints: %v; controller RSS %s\n", row.setup.Round(time.Second), mib(harness.ProcessRSS(ctrl.pid())))
	var statsURLs []string
	for _, c := range ctrls {
		statsURLs = append(statsURLs, c.statsURL)
	}

	reporters, err := agentBatches(shape, sc.agentTokens)
	if err != nil {
		return row, err
	}
	for k := range scaleActivators {
		r, err := activatorBatch(shape, k, sc.activatorTokens[k], -1)
		if err != nil {
			return row, err
		}
		reporters = append(reporters, r)
	}
	fl := startFleet(statsURLs, ctrl.tls, reporters)
	defer fl.stop()

	steadyFrom := time.Now()
	if err := waitSteady(ctx, c, shape, o.steadyTimeout); err != nil {
		// Measured anyway: what a controller that cannot keep up does is
		// the point of the benchmark.
		row.notSteady = err.Error()
		fmt.Printf("  NOT steady, measuring anyway: %v\n", err)
	} else {
		row.steady = time.Since(steadyFrom)
		fmt.Printf("  steady (every target decided at its pods, cold ones at zero in Proxy mode) after %v; warming up %v\n", row.steady.Round(time.Second), o.warmup)
	}
	time.Sleep(o.warmup)

	// The window.
	apiPIDs := childPIDs("kube-apiserver", "etcd")
	m0, err := scrapeAll(ctrls)
	if err != nil {
		return row, err
	}
	a0, err := scrapeAPIServer(ctx, cs)
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	ctrlCPU0, apiCPU0, selfCPU0 := cpuEach(ctrls), cpuOf(apiPIDs), harness.ProcessCPU(os.Getpid())
	fl.rec.start()
	profiled := make(chan error, 1)
	if o.profileDir != "" {
		go func() { profiled <- saveCPUProfiles(ctx, cs, ctrls, min(30*time.Second, o.window), o.profileDir, n) }()
	} else {
		profiled <- nil
	}
	rssMax := int64(0)
	for end := t0.Add(o.window); time.Now().Before(end); {
		time.Sleep(min(time.Second, time.Until(end)))
		for _, c := range ctrls {
			rssMax = max(rssMax, harness.ProcessRSS(c.pid()))
		}
	}
	fl.rec.stop()
	elapsed := time.Since(t0)
	if err := <-profiled; err != nil {
		return row, err
	}
	if o.profileDir != "" {
		for k, c := range ctrls {
			if err := c.saveProfile("heap", profileFile(o.profileDir, n, len(ctrls), fmt.Sprintf("r%d-heap", k))); err != nil {
				return row, err
			}
		}
	}
	ctrlCPU1, apiCPU1, selfCPU1 := cpuEach(ctrls), cpuOf(apiPIDs), harness.ProcessCPU(os.Getpid())
	m1, err := scrapeAll(ctrls)
	if err != nil {
		return row, err
	}
	a1, err := scrapeAPIServer(ctx, cs)
	if err != nil {
		return row, err
	}
	for k := range ctrls {
		c := (ctrlCPU1[k] - ctrlCPU0[k]).Seconds() / elapsed.Seconds()
		row.ctrlCPU += c
		row.ctrlCPUMax = max(row.ctrlCPUMax, c)
	}
	row.apiCPU = (apiCPU1 - apiCPU0).Seconds() / elapsed.Seconds()
	row.fleetCPU = (selfCPU1 - selfCPU0).Seconds() / elapsed.Seconds()
	row.ctrlRSS = rssMax
	for _, c := range ctrls {
		row.ctrlPeak = max(row.ctrlPeak, processPeakRSS(c.pid()))
	}
	row.interval = histogramOf(m1, "sockscale_controller_decision_interval_seconds").sub(histogramOf(m0, "sockscale_controller_decision_interval_seconds"))
	row.duration = histogramOf(m1, "sockscale_controller_decision_duration_seconds").sub(histogramOf(m0, "sockscale_controller_decision_duration_seconds"))
	row.stable = medianStable(m1)
	row.decisionsPerSec = (m1.Value("sockscale_controller_decisions_total") - m0.Value("sockscale_controller_decisions_total")) / elapsed.Seconds()
	row.writes, row.reviews, row.writesBy = writeRates(apiRequests(a0), apiRequests(a1), elapsed)
	fl.rec.mu.Lock()
	row.ingest, row.posts = fl.rec.rtt, len(fl.rec.rtt)
	if len(fl.rec.lastErrs) > 0 {
		row.dropSample = strings.Join(fl.rec.lastErrs, "; ")
	}
	fl.rec.mu.Unlock()
	row.drops = fl.rec.drops()
	for _, count := range fl.rec.codes {
		row.posts += count
	}
	fmt.Printf("  window done: controller %.2f cores (busiest replica %.2f), %s; decisions %.0f/s\n", row.ctrlCPU, row.ctrlCPUMax, mib(row.ctrlRSS), row.decisionsPerSec)

	// Pokes, the fleet still posting; with the API server's own time for
	// the /scale writes they make, the part of a poke the controller does
	// not control.
	p0, err := scrapeAPIServer(ctx, cs)
	if err != nil {
		return row, err
	}
	c0, err := scrapeAll(ctrls)
	if err != nil {
		return row, err
	}
	row.pokes, row.pokeMissed, err = pokeAll(ctx, cs, ctrls, shape, sc.activatorTokens[0])
	if err != nil {
		return row, err
	}
	p1, err := scrapeAPIServer(ctx, cs)
	if err != nil {
		return row, err
	}
	c1, err := scrapeAll(ctrls)
	if err != nil {
		return row, err
	}
	scaleWrites := []string{"verb", "PUT", "resource", "deployments", "subresource", "scale"}
	row.scaleWrite = histogramOf(p1, "apiserver_request_duration_seconds", scaleWrites...).sub(histogramOf(p0, "apiserver_request_duration_seconds", scaleWrites...))
	row.pokeDecided = histogramOf(c1, "sockscale_controller_poke_duration_seconds").sub(histogramOf(c0, "sockscale_controller_poke_duration_seconds"))
	return row, nil
}

// medianStable is the median of the warm targets' stable values in a
// scrape of the controller.
func medianStable(m harness.PromSamples) float64 {
	var vs []float64
	f := m["sockscale_controller_stable_value"]
	if f == nil {
		return math.NaN()
	}
	for _, s := range f.GetMetric() {
		cold := false
		for _, l := range s.GetLabel() {
			if l.GetName() == "namespace" && l.GetValue() == coldNamespace {
				cold = true
			}
		}
		if !cold {
			vs = append(vs, s.GetGauge().GetValue())
		}
	}
	if len(vs) == 0 {
		return math.NaN()
	}
	sort.Float64s(vs)
	return vs[len(vs)/2]
}

// waitSteady waits until, twice in a row, every warm target's status
// says it was decided at its podsPerTarget pods, out of panic, on a
// stable value within 10 % of the load (so its stats arrive) and its
// Deployment asks for them, and every cold one was decided at zero in
// Proxy mode.
func waitSteady(ctx context.Context, c client.Client, s scaleShape, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	inRow := 0
	for {
		var list v1alpha1.PodAutoscalerList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		var deps appsv1.DeploymentList
		if err := c.List(ctx, &deps); err != nil {
			return err
		}
		warm, cold := 0, 0
		wrong := map[string]int{}
		for _, pa := range list.Items {
			d := int32(-2)
			if pa.Status.DesiredScale != nil {
				d = *pa.Status.DesiredScale
			}
			stable, _ := strconv.ParseFloat(pa.Status.StableValue, 64)
			switch {
			case pa.Namespace == coldNamespace && d == 0 && pa.Status.Mode == v1alpha1.ModeProxy:
				cold++
			case pa.Namespace == coldNamespace:
				wrong[fmt.Sprintf("cold desired %d mode %s", d, pa.Status.Mode)]++
			case d != podsPerTarget:
				wrong[fmt.Sprintf("desired %d", d)]++
			case pa.Status.Panicking:
				wrong["panicking"]++
			case math.Abs(stable/wantStable-1) > 0.1:
				// The status refreshes its values only when they moved
				// by more than 5 %, so one written while the windows
				// filled may stay up to 5 % off the value of the moment.
				wrong["stable value 10 % or more off"]++
			default:
				warm++
			}
		}
		for _, d := range deps.Items {
			if d.Namespace != coldNamespace && d.Namespace != othersNamespace && (d.Spec.Replicas == nil || *d.Spec.Replicas != podsPerTarget) {
				wrong["deployment replicas not 50"]++
			}
		}
		if warm == s.targets && cold == s.cold && len(wrong) == 0 {
			if inRow++; inRow == 2 {
				return nil
			}
		} else {
			inRow = 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not steady after %v: %d/%d warm, %d/%d cold as wanted; others: %v", timeout, warm, s.targets, cold, s.cold, wrong)
		}
		time.Sleep(3 * time.Second)
	}
}

// A poke that scales nothing within pokeWait counts as missed, and pokes
// stop after pokePhase (a controller that cannot keep up would otherwise
// make the phase last cold * pokeWait).
const (
	pokeWait  = 5 * time.Second
	pokePhase = 2 * time.Minute
)

// pokeAll pokes each cold target once, one at a time, as activator 0, and
// times each from just before its POST to the Deployment watch event
// that shows spec.replicas >= 1. It returns the latencies and how many
// got no such event within pokeWait.
func pokeAll(ctx context.Context, cs kubernetes.Interface, ctrls []*controllerProc, s scaleShape, token string) ([]time.Duration, int, error) {
	w, err := cs.AppsV1().Deployments(coldNamespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, err
	}
	defer w.Stop()
	var mu sync.Mutex
	waiting := map[string]chan time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || ev.Type != watch.Modified || d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
				continue
			}
			at := time.Now()
			mu.Lock()
			if ch := waiting[d.Name]; ch != nil {
				ch <- at
				delete(waiting, d.Name)
			}
			mu.Unlock()
		}
	}()
	// An activator posts to every replica, at once.
	fl := &fleet{tlsCfg: ctrls[0].tls}
	hcs := make([]*http.Client, len(ctrls))
	for k := range ctrls {
		hcs[k] = fl.client()
		defer hcs[k].CloseIdleConnections()
	}
	postAll := func(r reporter) (int, error) {
		codes, errs := make([]int, len(ctrls)), make([]error, len(ctrls))
		var wg sync.WaitGroup
		for k, c := range ctrls {
			wg.Go(func() { codes[k], _, errs[k] = post(ctx, hcs[k], c.statsURL, r) })
		}
		wg.Wait()
		for k := range ctrls {
			if errs[k] != nil || codes[k]/100 != 2 {
				return codes[k], errs[k]
			}
		}
		return codes[0], nil
	}
	var lat []time.Duration
	missed := 0
	phaseEnd := time.Now().Add(pokePhase)
	for k := range s.cold {
		if time.Now().After(phaseEnd) {
			fmt.Printf("  pokes: %d of %d tried within %v\n", k, s.cold, pokePhase)
			break
		}
		r, err := activatorBatch(s, 0, token, k)
		if err != nil {
			return nil, 0, err
		}
		// A warm connection, as an activator's is: the poke's own cost only.
		if k == 0 {
			if _, err := postAll(reporter{token: token, body: mustActivatorBatch(s, token)}); err != nil {
				return nil, 0, err
			}
		}
		ch := make(chan time.Time, 1)
		mu.Lock()
		waiting[coldName(k)] = ch
		mu.Unlock()
		// A refused poke is sent again at once (a real activator would
		// wait for its next report): the time counts from the first.
		t0 := time.Now()
		refused := false
		for {
			code, err := postAll(r)
			if err != nil {
				return nil, 0, fmt.Errorf("poke %s: %w", coldName(k), err)
			}
			if code/100 == 2 {
				break
			}
			if time.Since(t0) > 10*time.Second {
				// A controller that refuses every post is a result, not
				// a failure of the bench: the poke counts as missed.
				fmt.Printf("  poke %s: still status %d after 10 s, counted as missed\n", coldName(k), code)
				refused = true
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if refused {
			missed++
			continue
		}
		select {
		case at := <-ch:
			lat = append(lat, at.Sub(t0))
		case <-time.After(pokeWait):
			missed++
		}
	}
	return lat, missed, nil
}

func mustActivatorBatch(s scaleShape, token string) []byte {
	r, _ := activatorBatch(s, 0, token, -1)
	return r.body
}

// controllerProc is a running sockscale-controller.
type controllerProc struct {
	cmd                  *exec.Cmd
	statsURL, metricsURL string
	// pprofURL is the controller's /debug/pprof/ ("": not served).
	pprofURL string
	tls      *tls.Config
	log      string
}

func (p *controllerProc) pid() int { return p.cmd.Process.Pid }

// startControllers runs replicas of bin (empty: this tree's controller,
// built) with the control plane's admin kubeconfig, authentication on,
// stats over HTTPS; with pprof, their Go profiles served on loopback.
// Several replicas elect a leader and split the targets into buckets;
// their stats endpoints share a port on 127.0.0.2, .3, ..., as the pods
// behind a Service would.
func startControllers(cp *harness.ControlPlane, bin string, pprof bool, replicas, buckets int) ([]*controllerProc, error) {
	if bin == "" {
		var err error
		if bin, err = harness.GoBuild(cp.Dir, "github.com/sockscale/sockscale/controller/cmd/sockscale-controller"); err != nil {
			return nil, err
		}
	}
	var ips []net.IP
	for k := range replicas {
		ips = append(ips, net.IPv4(127, 0, 0, byte(2+k)))
	}
	certFile, keyFile, tlsCfg, err := selfSignedTLS(cp.Dir, ips)
	if err != nil {
		return nil, err
	}
	port, err := sharedPort(ips)
	if err != nil {
		return nil, err
	}
	var ps []*controllerProc
	for k := range replicas {
		p, err := startController(cp, bin, pprof, k, net.JoinHostPort(ips[k].String(), port), certFile, keyFile, tlsCfg, replicas, buckets)
		if err != nil {
			for _, p := range ps {
				p.stop()
			}
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// startController runs replica k, its stats endpoint on statsAddr.
func startController(cp *harness.ControlPlane, bin string, pprof bool, k int, statsAddr, certFile, keyFile string, tlsCfg *tls.Config, replicas, buckets int) (*controllerProc, error) {
	addrs, err := harness.FreeAddrs(3)
	if err != nil {
		return nil, err
	}
	logFile, err := os.CreateTemp("", fmt.Sprintf("sockscale-scale-controller-%d-*.log", k))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	p := &controllerProc{statsURL: "https://" + statsAddr + stats.Path, metricsURL: "http://" + addrs[0] + "/metrics", tls: tlsCfg, log: logFile.Name()}
	p.cmd = exec.Command(bin, "--metrics-bind-address="+addrs[0], "--metrics-secure=false", "--health-probe-bind-address="+addrs[1],
		"--stats-bind-address="+statsAddr, "--stats-tls-cert-file="+certFile, "--stats-tls-key-file="+keyFile,
		"--autoscaler-config="+scaleSystem+"/sockscale-autoscaler", "--activator-namespace="+scaleSystem)
	if replicas > 1 {
		p.cmd.Args = append(p.cmd.Args, "--leader-elect", fmt.Sprintf("--buckets=%d", buckets))
	}
	if pprof {
		p.pprofURL = "http://" + addrs[2] + "/debug/pprof/"
		p.cmd.Args = append(p.cmd.Args, "--pprof-bind-address="+addrs[2])
	}
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "POD_NAMESPACE="+scaleSystem, fmt.Sprintf("POD_NAME=sockscale-controller-%d", k))
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start controller: %w", err)
	}
	if err := harness.WaitHTTP("http://"+addrs[1]+"/readyz", 60*time.Second); err != nil {
		p.stop()
		return nil, fmt.Errorf("controller not ready (log %s): %w", p.log, err)
	}
	return p, nil
}

// sharedPort is a TCP port free on every one of ips.
func sharedPort(ips []net.IP) (string, error) {
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(ips[0].String(), "0"))
		if err != nil {
			return "", err
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		free := true
		for _, ip := range ips[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(ip.String(), port))
			if err != nil {
				free = false
				break
			}
			_ = l2.Close()
		}
		_ = l.Close()
		if free {
			return port, nil
		}
	}
	return "", fmt.Errorf("no port free on all of %v", ips)
}

// scrapeAll reads every replica's /metrics as one: each series of every
// replica, so counters and histograms add up.
func scrapeAll(ctrls []*controllerProc) (harness.PromSamples, error) {
	all := harness.PromSamples{}
	for _, c := range ctrls {
		m, err := scrapeURL(c.metricsURL)
		if err != nil {
			return nil, err
		}
		for name, f := range m {
			if have := all[name]; have != nil {
				have.Metric = append(have.Metric, f.Metric...)
			} else {
				all[name] = f
			}
		}
	}
	return all, nil
}

// cpuEach is each replica's CPU time so far.
func cpuEach(ctrls []*controllerProc) []time.Duration {
	out := make([]time.Duration, len(ctrls))
	for k, c := range ctrls {
		out[k] = harness.ProcessCPU(c.pid())
	}
	return out
}

// profileFile is where a profile of the point of n targets on replicas
// goes: scale-<n>-<what>.pprof for one replica (r0-cpu, r0-heap,
// apiserver-cpu), scale-<n>x<replicas>-<what>.pprof for more.
func profileFile(dir string, n, replicas int, what string) string {
	point := fmt.Sprint(n)
	if replicas > 1 {
		point = fmt.Sprintf("%dx%d", n, replicas)
	}
	return filepath.Join(dir, fmt.Sprintf("scale-%s-%s.pprof", point, what))
}

// saveCPUProfiles profiles every controller replica and the API server
// for d, at once, into dir.
func saveCPUProfiles(ctx context.Context, cs kubernetes.Interface, ctrls []*controllerProc, d time.Duration, dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	secs := int(d.Seconds())
	errs := make([]error, len(ctrls)+1)
	var wg sync.WaitGroup
	for k, c := range ctrls {
		wg.Go(func() {
			errs[k] = c.saveProfile(fmt.Sprintf("profile?seconds=%d", secs), profileFile(dir, n, len(ctrls), fmt.Sprintf("r%d-cpu", k)))
		})
	}
	wg.Go(func() {
		b, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(secs)).
			Timeout(d + 30*time.Second).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(profileFile(dir, n, len(ctrls), "apiserver-cpu"), b, 0o644)
		}
		if err != nil {
			errs[len(ctrls)] = fmt.Errorf("API server profile: %w", err)
		}
	})
	wg.Wait()
	return errors.Join(errs...)
}

// saveProfile writes the controller's pprof profile (e.g. "heap",
// "profile?seconds=30") to file.
func (p *controllerProc) saveProfile(profile, file string) error {
	if p.pprofURL == "" {
		return fmt.Errorf("controller started without pprof")
	}
	resp, err := http.Get(p.pprofURL + profile)
	if err != nil {
		return fmt.Errorf("controller profile %s: %w", profile, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller profile %s: %s", profile, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("controller profile %s: %w", profile, err)
	}
	return f.Close()
}

func (p *controllerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}
