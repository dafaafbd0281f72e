package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

// connectService is the Service address the proxy mode dials. It is on
// loopback, where nothing listens on port 80 (connectRig checks the route,
// and the proxy mode checks that every connect was redirected): a connect
// the program failed to rewrite stays on this machine.
var connectService = netip.MustParseAddrPort("127.78.0.10:80")

// otherEntries is how many other Services the serve mode's map holds.
const otherEntries = 1000

// connectMode is where the client sits and what it dials in one mode.
type connectMode struct {
	cgroup string         // the client's cgroup (this process's) during the mode
	dial   netip.AddrPort // where it connects
	root   string         // where the redirect programs it runs are attached; "" none
}

// connectRig is the connect part's cgroups and redirect programs.
type connectRig struct {
	modes     map[string]connectMode
	redirects []*redirect.Redirect
	proxied   *redirect.Redirect // the proxy mode's
	dirs      []string           // cgroups to remove, children first
	home      string             // this process's cgroup before the part
}

// connectModes in table order; "off" is the baseline.
var connectModes = []string{"off", "miss", "serve", "proxy"}

// newConnectRig makes three sibling cgroup subtrees next to the bench's,
// each with a client leaf this process moves into for a mode: one with no
// program, one with the redirect attached and one Service entry (the proxy
// mode's, to the pod), one with the redirect attached and that entry among
// otherEntries others. Every subtree is at the same depth and made the
// same way, so a mode changes only what runs in connect().
func (b *bench) newConnectRig() (*connectRig, error) {
	if err := loopbackOnly(connectService.Addr()); err != nil {
		return nil, err
	}
	home, err := cgroup2.Own()
	if err != nil {
		return nil, err
	}
	rig := &connectRig{modes: map[string]connectMode{}, home: home}
	pod := netip.AddrPortFrom(b.pod.IP, testpod.HTTPPort)
	proxyEntry := []redirect.Backend{{Addr: pod, Weight: 1}}
	cgroups := map[string]string{}
	for _, sub := range []string{"off", "redirect", "redirect-1000"} {
		root := b.root + "-connect-" + sub
		client := filepath.Join(root, "client")
		if err := os.MkdirAll(client, 0o755); err != nil {
			return nil, errors.Join(err, rig.close())
		}
		rig.dirs = append([]string{client, root}, rig.dirs...)
		cgroups[sub] = root
		if sub == "off" {
			continue
		}
		r, err := redirect.New(redirect.Options{CgroupRoot: root})
		if err != nil {
			return nil, errors.Join(err, rig.close())
		}
		rig.redirects = append(rig.redirects, r)
		if err := r.Set(connectService, proxyEntry); err != nil {
			return nil, errors.Join(err, rig.close())
		}
		if sub == "redirect" {
			rig.proxied = r
			continue
		}
		// Other Services, as a node with many targets has them: ClusterIPs
		// 10.96.x.y:80, each to an activator address that is never dialled.
		for i := range otherEntries {
			svc := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)}), 80)
			act := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 213, 250, byte(i%2 + 2)}), 8012)
			if err := r.Set(svc, []redirect.Backend{{Addr: act, Weight: 1}}); err != nil {
				return nil, errors.Join(err, rig.close())
			}
		}
	}
	client := func(sub string) string { return filepath.Join(cgroups[sub], "client") }
	rig.modes["off"] = connectMode{cgroup: client("off"), dial: pod}
	rig.modes["miss"] = connectMode{cgroup: client("redirect"), dial: pod, root: cgroups["redirect"]}
	rig.modes["serve"] = connectMode{cgroup: client("redirect-1000"), dial: pod, root: cgroups["redirect-1000"]}
	rig.modes["proxy"] = connectMode{cgroup: client("redirect"), dial: connectService, root: cgroups["redirect"]}
	return rig, nil
}

// enter moves this process, every thread of it, into mode m's client
// cgroup: sockets it creates from then on belong there.
func (rig *connectRig) enter(m string) error {
	return moveProcess(rig.modes[m].cgroup)
}

func moveProcess(cgroup string) error {
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("move this process into %s: %w", cgroup, err)
	}
	return nil
}

// close moves this process home, detaches the programs and removes the
// cgroups.
func (rig *connectRig) close() error {
	errs := []error{moveProcess(rig.home)}
	for _, r := range rig.redirects {
		errs = append(errs, r.Close())
	}
	for _, dir := range rig.dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// loopbackOnly checks that the kernel routes a to the loopback device.
func loopbackOnly(a netip.Addr) error {
	return localroute.Check(a, localroute.Loopback())
}

// connectCost compares what a client's new connections cost with the
// connect-time redirect (bpf/redirect) above its cgroup and without it.
//
// The client is this process: for each mode it moves into a cgroup of its
// own (see newConnectRig; a cgroup move is a write to cgroup.procs) and
// runs a closed loop of c connects to the pod's HTTP server, each closed
// at once (with an RST, so no TIME_WAIT piles up and the ephemeral ports
// last), or after one tiny request and its answer:
//
//	off    nothing attached above the client's cgroup
//	miss   the redirect attached, the destination not in its map (one entry)
//	serve  the destination a target in Serve mode: no entry (the agent
//	       writes entries for Proxy mode only), among otherEntries others
//	proxy  the destination a Service in Proxy mode, rewritten to the pod
//
// Go's Dial calls getpeername after every connect, so the getpeername4
// program runs too, as it would for a Go client. Other cgroups of the
// machine may have connect4 programs (the kernel's switch for the hook is
// global): "off" is a client outside the redirect's subtree, as a process
// on a node outside the agent's cgroup root would be.
//
// The modes take turns in slices within rounds and blocks, as in the
// activator's table, and each block gives one estimate of each comparison
// with off. After each block a timed run of each redirect mode reads the
// programs' own run time (kernel.bpf_stats), per connect.
func (b *bench) connectCost(slice time.Duration, rounds, block int, concurrencies []int) error {
	if block < 1 || rounds < 2*block {
		return fmt.Errorf("-connect-rounds %d, -connect-block %d: a confidence interval needs at least two blocks of at least one round", rounds, block)
	}
	rig, err := b.newConnectRig()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rig.close(); cerr != nil {
			fmt.Fprintln(os.Stderr, "bench: connect:", cerr)
		}
	}()
	blocks := rounds / block
	fmt.Printf("\nConnect: closed loop of new TCP connections from a client in a cgroup to the pod; per c %d blocks of %d rounds, each mode %v per round, modes taking turns\n", blocks, block, slice)
	fmt.Println("close: connect() then close (RST); request: connect, one HTTP/1.1 GET of 2 bytes, read to the server's close.")
	fmt.Println("off: no redirect program above the client; miss: attached, destination not in the map (1 entry);")
	fmt.Printf("serve: destination a Serve-mode target, which has no entry (the agent writes Proxy-mode ones only), among %d others;\n", otherEntries)
	fmt.Printf("proxy: dials %s, a Proxy-mode entry the program rewrites to the pod (off dials the pod directly).\n", connectService)
	fmt.Println("rps is connections per second; CPU is the whole machine's (client, server and any other work), client CPU this process's")
	fmt.Println("(all its threads' schedstat: the connect syscalls and the programs they run, and some of the softirq work of the handshake).")
	fmt.Println("Ratios and differences: per round, geometric mean (ratios) or mean (differences) over the blocks [95 % confidence interval].")
	fmt.Println("BPF run time: the redirect programs' own (connect4 + getpeername4), kernel.bpf_stats, a timed run after each block.")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c\tload\tmode\t"+comparedHeader("off")+"\tclient CPU/conn\tclient CPU/conn vs off\tBPF run time/conn\t")
	var versusMiss []string
	var proxyConnects int64
	redirected0, err := rig.proxied.Redirected()
	if err != nil {
		return err
	}
	for _, c := range concurrencies {
		for _, request := range []bool{false, true} {
			load := "close"
			if request {
				load = "request"
			}
			run := func(m string, d time.Duration) (result, error) {
				r := connectLoop(rig.modes[m].dial, c, request, d)
				if m == "proxy" {
					proxyConnects += r.Completed + r.Failed
				}
				if r.Failed > 0 {
					return r, fmt.Errorf("connect %s c=%d %s: %d of %d connections failed", load, c, m, r.Failed, r.Failed+r.Completed)
				}
				return r, nil
			}
			for _, m := range connectModes { // warm up every cgroup's path
				if err := rig.enter(m); err != nil {
					return err
				}
				if _, err := run(m, slice); err != nil {
					return err
				}
			}
			all := map[string][]result{}
			est, vsMiss := estimates{}, estimates{}
			bpfTime := map[string]time.Duration{}
			bpfConnects := map[string]int64{}
			rng := rand.New(rand.NewPCG(uint64(c), 3))
			for range blocks {
				rs, err := takeTurns(connectModes, block, rng, func(m string) (result, error) {
					if err := rig.enter(m); err != nil {
						return result{}, err
					}
					if _, err := run(m, slice/10); err != nil {
						return result{}, err
					}
					return run(m, slice)
				})
				if err != nil {
					return err
				}
				for _, m := range connectModes {
					all[m] = append(all[m], rs[m]...)
				}
				est.add(roundMeans(rs, connectModes, "off"))
				vsMiss.add(roundMeans(rs, connectModes, "miss"))
				for _, m := range connectModes[1:] {
					t, n, err := timedConnects(rig, m, func() (result, error) { return run(m, slice) })
					if err != nil {
						return err
					}
					bpfTime[m] += t
					bpfConnects[m] += n
				}
			}
			for _, m := range connectModes {
				merged := merge(all[m])
				clientCol, bpfCol := "0", "-"
				if m != "off" {
					mean, lo, hi := est.ci(m, extraProc)
					clientCol = fmt.Sprintf("%+.2fµs [%+.2f..%+.2f]", mean/1e3, lo/1e3, hi/1e3)
				}
				if bpfConnects[m] > 0 {
					bpfCol = (bpfTime[m] / time.Duration(bpfConnects[m])).String()
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%v\t%s\t%s\t\n", c, load, m, comparedCells(m, merged, est, m == "off"),
					merged.procPerRequest().Round(10*time.Nanosecond), clientCol, bpfCol)
			}
			mean, lo, hi := vsMiss.ci("proxy", extraProc)
			versusMiss = append(versusMiss, fmt.Sprintf("c=%d %s: rps %s, client CPU/conn %+.2fµs [%+.2f..%+.2f]", c, load,
				ratioCI(vsMiss.ci("proxy", logRatio)), mean/1e3, lo/1e3, hi/1e3))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("proxy over miss (the rewrite, socket storage and counter beyond the lookup):", strings.Join(versusMiss, ", "))
	redirected1, err := rig.proxied.Redirected()
	if err != nil {
		return err
	}
	counted := int64(redirected1[connectService] - redirected0[connectService])
	if counted != proxyConnects {
		return fmt.Errorf("connect: the program counted %d redirected connects to %s, the proxy mode made %d", counted, connectService, proxyConnects)
	}
	fmt.Printf("Redirected connects counted by the program: %d, as many as the proxy mode made.\n", counted)
	return nil
}

// timedConnects runs one more slice of redirect mode m with the kernel
// timing BPF programs, and returns the run time of the programs attached
// at m's root and the connects made.
func timedConnects(rig *connectRig, m string, run func() (result, error)) (time.Duration, int64, error) {
	if err := rig.enter(m); err != nil {
		return 0, 0, err
	}
	stats, err := bpf.EnableRunTimeStats()
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = stats.Close() }()
	t0, err := cgroupProgRunTime(rig.modes[m].root)
	if err != nil {
		return 0, 0, err
	}
	r, err := run()
	if err != nil {
		return 0, 0, err
	}
	t1, err := cgroupProgRunTime(rig.modes[m].root)
	return t1 - t0, r.Completed, err
}

// connectAttachTypes are the hooks whose programs a connect can run.
var connectAttachTypes = []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCgroupInet4GetPeername,
	ebpf.AttachCGroupInet6Connect, ebpf.AttachCgroupInet6GetPeername}

// cgroupProgRunTime is the run time of the programs attached directly at
// cgroup to connectAttachTypes, summed.
func cgroupProgRunTime(cgroup string) (time.Duration, error) {
	dir, err := os.Open(cgroup)
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	var total time.Duration
	for _, typ := range connectAttachTypes {
		q, err := link.QueryPrograms(link.QueryOptions{Target: int(dir.Fd()), Attach: typ})
		if err != nil {
			return 0, fmt.Errorf("query %v programs at %s: %w", typ, cgroup, err)
		}
		for _, ap := range q.Programs {
			p, err := ebpf.NewProgramFromID(ap.ID)
			if err != nil {
				return 0, fmt.Errorf("open program %d: %w", ap.ID, err)
			}
			st, err := p.Stats()
			_ = p.Close()
			if err != nil {
				return 0, fmt.Errorf("read statistics of program %d: %w", ap.ID, err)
			}
			total += st.Runtime
		}
	}
	return total, nil
}

// connectRequest is the request mode's one request: the answer is "ok",
// then the server closes.
const connectRequest = "GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"

// connectLoop keeps c connects to addr in flight for d, each from a new
// socket, and returns them as requests: with request, each connection
// sends connectRequest and reads the answer to its end; without, it is
// closed as soon as it is made, with an RST (SO_LINGER 0), which leaves no
// TIME_WAIT socket holding an ephemeral port.
func connectLoop(addr netip.AddrPort, c int, request bool, d time.Duration) result {
	cpu0, sw0 := machineStat()
	self0 := processCPUTime(os.Getpid())
	start := time.Now()
	deadline := start.Add(d)
	res := &loadgen.Result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	dialer := net.Dialer{Timeout: 2 * time.Second}
	for range c {
		wg.Go(func() {
			var mine loadgen.Result
			buf := make([]byte, 512)
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := connectOnce(&dialer, addr, request, buf); err != nil {
					mine.Failed++
					continue
				}
				mine.Completed++
				mine.Latencies = append(mine.Latencies, time.Since(t0))
			}
			mu.Lock()
			res.Completed += mine.Completed
			res.Failed += mine.Failed
			res.Latencies = append(res.Latencies, mine.Latencies...)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	self1 := processCPUTime(os.Getpid())
	cpu1, sw1 := machineStat()
	return result{Result: res, cpu: cpu1 - cpu0, switches: sw1 - sw0, proc: self1 - self0}
}

func connectOnce(dialer *net.Dialer, addr netip.AddrPort, request bool, buf []byte) error {
	conn, err := dialer.Dial("tcp4", addr.String())
	if err != nil {
		return err
	}
	tc := conn.(*net.TCPConn)
	if !request {
		_ = tc.SetLinger(0)
		return tc.Close()
	}
	defer func() { _ = tc.Close() }()
	_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(tc, connectRequest); err != nil {
		return err
	}
	n, err := io.ReadFull(tc, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	if !bytes.HasPrefix(buf[:n], []byte("HTTP/1.1 200 ")) || !bytes.HasSuffix(buf[:n], []byte("\r\n\r\nok")) {
		return fmt.Errorf("unexpected answer %q", buf[:n])
	}
	return nil
}
