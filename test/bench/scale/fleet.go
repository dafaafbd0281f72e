package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// This file is the scale benchmark's simulated fleet: agents and
// activators posting real stats batches to the controller, each over its
// own keep-alive connection as the real ones do.

// fleetRecorder counts the fleet's posts while on.
type fleetRecorder struct {
	mu       sync.Mutex
	on       bool
	rtt      []time.Duration
	codes    map[int]int // non-2xx answers by status
	errs     int         // transport errors
	skipped  int         // periods missed: the previous post still in flight
	lastErrs []string
}

func (r *fleetRecorder) record(rtt time.Duration, code int, err error, skipped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return
	}
	r.skipped += skipped
	switch {
	case err != nil:
		r.errs++
		if len(r.lastErrs) < 3 {
			r.lastErrs = append(r.lastErrs, err.Error())
		}
	case code/100 != 2:
		r.codes[code]++
	default:
		r.rtt = append(r.rtt, rtt)
	}
}

// start clears the counts and turns recording on; stop turns it off.
func (r *fleetRecorder) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.rtt, r.codes, r.errs, r.skipped, r.lastErrs = true, nil, map[int]int{}, 0, 0, nil
}

func (r *fleetRecorder) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
}

// drops says what was not taken: non-2xx by status, errors, skipped
// periods.
func (r *fleetRecorder) drops() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var parts []string
	codes := make([]int, 0, len(r.codes))
	for c := range r.codes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, r.codes[c]))
	}
	if r.errs > 0 {
		parts = append(parts, fmt.Sprintf("err:%d", r.errs))
	}
	if r.skipped > 0 {
		parts = append(parts, fmt.Sprintf("skip:%d", r.skipped))
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, " ")
}

// reporter is one agent or activator: its token and its batch, encoded
// once (the fleet's load is constant).
type reporter struct {
	token string
	body  []byte
	// agent, if set, is an agent's batch: run encodes it again for each
	// post with the period since the previous read, as a real agent does,
	// so that its periods follow on on its own clock (a skipped period
	// leaves a gap, as an agent's dropped batch does).
	agent *stats.Batch
	// nodeState: an agent's node state header ("" for activators).
	nodeState string
}

// fleet posts every reporter's batch once a second, each at its own
// random phase, to every controller replica, until stopped. An agent
// sends a replica that names its buckets only their pod records, as the
// agents' reporter does (stats.Split).
type fleet struct {
	urls   []string
	tlsCfg *tls.Config
	rec    *fleetRecorder
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startFleet(urls []string, tlsCfg *tls.Config, reporters []reporter) *fleet {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{urls: urls, tlsCfg: tlsCfg, rec: &fleetRecorder{codes: map[int]int{}}, cancel: cancel}
	for _, r := range reporters {
		f.wg.Go(func() { f.run(ctx, r) })
	}
	return f
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

// client is one reporter's HTTPS client: one keep-alive connection.
func (f *fleet) client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: f.tlsCfg.Clone(),
		MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, IdleConnTimeout: time.Minute}}
}

// run posts r's batch every second from a random phase on, to every
// replica at once, each post recorded. A post still in flight when the
// next is due skips that period, as a real agent's reporter replaces a
// queued batch by the fresh one.
func (f *fleet) run(ctx context.Context, r reporter) {
	hcs := make([]*http.Client, len(f.urls))
	for k := range f.urls {
		hcs[k] = f.client()
		defer hcs[k].CloseIdleConnections()
	}
	routes := make([]stats.Buckets, len(f.urls)) // what each replica named last
	bodies := make([][]byte, len(f.urls))
	codes, errs, rtts := make([]int, len(f.urls)), make([]error, len(f.urls)), make([]time.Duration, len(f.urls))
	next := time.Now().Add(time.Duration(mrand.Int64N(int64(time.Second))))
	read := next.Add(-time.Second) // the agent's previous read of its counters
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		t0 := time.Now()
		if r.agent != nil {
			r.agent.Start, r.agent.Period = read, t0.Sub(read)
			read = t0
			// Each replica's body in a buffer of its own, reused from
			// period to period.
			for k, part := range stats.Split(r.agent, routes) {
				body, err := stats.Append(bodies[k][:0], part)
				if err != nil {
					panic(err) // the batch encoded once already
				}
				bodies[k] = body
			}
		} else {
			for k := range bodies {
				bodies[k] = r.body // an activator's: never changes
			}
		}
		var wg sync.WaitGroup
		for k, url := range f.urls {
			wg.Go(func() {
				one := r
				one.body = bodies[k]
				var named string
				codes[k], named, errs[k] = post(ctx, hcs[k], url, one)
				rtts[k] = time.Since(t0)
				routes[k] = stats.Buckets{}
				if named != "" {
					routes[k], _ = stats.ParseBuckets(named)
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		next = next.Add(time.Second)
		skipped := 0
		for now := time.Now(); !next.After(now); next = next.Add(time.Second) {
			skipped++
		}
		if skipped > 0 {
			read = next.Add(-time.Second) // that read's batch was dropped
		}
		for k := range f.urls {
			f.rec.record(rtts[k], codes[k], errs[k], skipped)
			skipped = 0 // counted once per period
		}
		timer.Reset(time.Until(next))
	}
}

// post sends one batch and returns the answer's status and the buckets
// the replica named (stats.HeaderBuckets, "" if none).
func post(ctx context.Context, hc *http.Client, url string, r reporter) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(r.body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", stats.ContentType)
	req.Header.Set("Authorization", "Bearer "+r.token)
	if r.nodeState != "" {
		req.Header.Set(stats.HeaderNodeState, r.nodeState)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(stats.HeaderBuckets), nil
}

// agentBatches are the agents' batches: node n's agent reports its
// podsPerNode pods, each at perPodConcurrency.
func agentBatches(s scaleShape, tokens []string) ([]reporter, error) {
	pods := make([][]stats.PodStat, s.nodes)
	for i := range s.targets {
		for j := range podsPerTarget {
			n := s.podNode(i, j)
			pods[n] = append(pods[n], stats.PodStat{IP: podIP(i, j), Namespace: targetNamespace(i),
				Pod: fmt.Sprintf("%s-%d", targetName(i), j), Workload: targetName(i),
				Concurrency: perPodConcurrency, Requests: uint64(perPodConcurrency * 10)})
		}
	}
	state := stats.NodeState{SocketRedirect: stats.RedirectActive}.Encode()
	out := make([]reporter, s.nodes)
	for n := range s.nodes {
		body, err := stats.Append(nil, &stats.Batch{Node: nodeName(n), Start: time.Now(), Period: time.Second, Pods: pods[n]})
		if err != nil {
			return nil, err
		}
		out[n] = reporter{token: tokens[n], body: body, nodeState: state,
			agent: &stats.Batch{Node: nodeName(n), Period: time.Second, Pods: pods[n]}}
	}
	return out, nil
}

// activatorBatch is activator k's report of the cold targets: nothing
// held (concurrency and requests 0) over period, or, with poke set, a
// poke of that one cold target (a request arrived: concurrency 1 over a
// period below the collector's 100 ms, which it takes as a poke).
func activatorBatch(s scaleShape, k int, token string, poke int) (reporter, error) {
	b := &stats.Batch{Node: activatorPod(k), Start: time.Now(), Period: time.Second}
	if poke >= 0 {
		b.Period = time.Millisecond
		b.Targets = []stats.TargetStat{{Namespace: coldNamespace, Workload: coldName(poke), Concurrency: 1, Requests: 1}}
	} else {
		for c := range s.cold {
			b.Targets = append(b.Targets, stats.TargetStat{Namespace: coldNamespace, Workload: coldName(c)})
		}
	}
	body, err := stats.Append(nil, b)
	return reporter{token: token, body: body}, err
}

// selfSignedTLS writes a certificate and key for ips into dir and
// returns their paths and a client configuration that trusts it.
func selfSignedTLS(dir string, ips []net.IP) (certFile, keyFile string, cfg *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sockscale-controller"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "stats.crt"), filepath.Join(dir, "stats.key")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return certFile, keyFile, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
