package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/internal/stats"
)

// LegacyPeriod is how long a replica that answered a version 3 or 4
// batch with 400 (a controller that predates it, in a rolling upgrade)
// gets batches in the lower version it reads (without the pods'
// accounting, or without the IPv6 pods' records) before the newer
// version is tried again: long enough for one log line per upgrade,
// short enough that what was left out returns soon after the upgrade
// ends.
const LegacyPeriod = 10 * time.Minute

// Recorder counts batches sent and failed.
type Recorder interface {
	// Report counts a post to one replica that succeeded, or failed for
	// another reason than Refused's.
	Report(ok bool)
	// Refused counts a post a replica answered 401 or 403: this sender's
	// token or permissions are wrong, and no retry will help.
	Refused()
	// Error counts a failure at stage. Stage StageLegacyIPv6 counts posts
	// to a replica that predates version 4 which left out the records of
	// IPv6 pods.
	Error(stage string)
}

// StageLegacyIPv6 is the Recorder stage of a post that left out IPv6
// pods' records for a replica that cannot read them (version 4).
const StageLegacyIPv6 = "legacy_ipv6"

// latest is the newest version a replica gets until it refuses one.
const latest = 4

// Reporter posts batches to every address of a controller Service.
type Reporter struct {
	host, port string
	resolve    func(ctx context.Context, host string) ([]string, error)
	client     *http.Client
	timeout    time.Duration
	rec        Recorder
	log        *slog.Logger
	queue      chan *stats.Batch
	tokenFile  string
	// tls is set by SetCAFile: HTTPS, with the CA reloaded when its file
	// changes.
	tls *caTrust
	// clock times LegacyPeriod.
	clock clock.PassiveClock

	mu sync.Mutex
	// routes holds, by address, the buckets each replica said it decides
	// in its last answer (stats.HeaderBuckets); a replica without an
	// entry gets every record.
	routes map[string]stats.Buckets
	// legacy holds, by address, the newest version a replica that could
	// not read a newer one gets, and until when (LegacyPeriod).
	legacy map[string]legacyReplica
}

// legacyReplica is a replica that answered 400 to a version above max.
type legacyReplica struct {
	max   byte
	until time.Time
}

// New returns a reporter for target ("host:port"; the host is typically the
// controller's headless Service, which resolves to every replica). Each
// send gives up after timeout.
func New(target string, timeout time.Duration, rec Recorder, log *slog.Logger) (*Reporter, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("controller stats address %q: want host:port, e.g. sockscale-controller-stats.sockscale-system.svc:8443", target)
	}
	return &Reporter{
		host: host, port: port, timeout: timeout, rec: rec, log: log,
		resolve: net.DefaultResolver.LookupHost,
		clock:   clock.RealClock{},
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}},
		queue:   make(chan *stats.Batch, 1),
	}, nil
}

// SetResolver replaces DNS (net.DefaultResolver.LookupHost) as the way
// the target's host becomes the replicas' addresses, e.g. a fixed list.
// Call it before Run.
func (r *Reporter) SetResolver(resolve func(ctx context.Context, host string) ([]string, error)) {
	r.resolve = resolve
}

// SetTokenFile makes every post carry the token in path as
// "Authorization: Bearer": a projected ServiceAccount token, which the
// kubelet rotates, so it is read again for every batch. Call it before
// Run.
func (r *Reporter) SetTokenFile(path string) { r.tokenFile = path }

// Offer queues b for sending without blocking: if the previous batch is
// still waiting, it is replaced (fresh data beats old).
func (r *Reporter) Offer(b *stats.Batch) {
	for {
		select {
		case r.queue <- b:
			return
		default:
		}
		select {
		case <-r.queue:
		default:
		}
	}
}

// Run sends queued batches until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-r.queue:
			r.Send(ctx, b)
		}
	}
}

// Send posts b to every replica and waits for all answers. A replica
// that splits targets into buckets with the others (it said so in its
// last answer) gets only the pod records of its buckets, and the records
// no replica claims (a bucket changing hands); the rest, the node state
// and any target records, go to every replica.
func (r *Reporter) Send(ctx context.Context, b *stats.Batch) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	addrs, err := r.resolve(ctx, r.host)
	if err != nil || len(addrs) == 0 {
		r.rec.Report(false)
		r.log.Warn("no controller to report to", "host", r.host, "err", err)
		return
	}
	now := r.clock.Now()
	parts := r.split(addrs, b)
	bodies := make([][]byte, len(addrs))
	// versions: each body's, which an older replica answers with 400 when
	// it is 3 or 4.
	versions := make([]byte, len(addrs))
	// b's encodings for replicas that read up to version 4, 3 and 2 (k is
	// 4 - that), made once for every replica that takes all.
	var whole [3][]byte
	for i, part := range parts {
		shared, maxVersion := part == b, r.maxVersion(addrs[i], now)
		k := latest - maxVersion
		if maxVersion < 4 {
			var dropped int
			if part, dropped = part.WithoutIPv6(); dropped > 0 {
				r.rec.Error(StageLegacyIPv6)
			}
		}
		if maxVersion < 3 {
			part = part.WithoutAccounting()
		}
		versions[i] = part.Version()
		if shared && whole[k] != nil {
			bodies[i] = whole[k]
			continue
		}
		body, err := stats.Append(nil, part)
		if err != nil {
			r.rec.Error("report")
			r.log.Error("encode stats", "err", err)
			return
		}
		if shared {
			whole[k] = body
		}
		bodies[i] = body
	}
	h := http.Header{"Content-Type": {stats.ContentType}}
	if b.NodeState != nil {
		h.Set(stats.HeaderNodeState, b.NodeState.Encode())
	}
	if r.tokenFile != "" {
		token, err := os.ReadFile(r.tokenFile)
		if err != nil || len(bytes.TrimSpace(token)) == 0 {
			r.rec.Error("token")
			r.log.Error("read the ServiceAccount token for the controller", "file", r.tokenFile, "err", err)
			return
		}
		h.Set("Authorization", "Bearer "+string(bytes.TrimSpace(token)))
	}
	client, scheme := r.client, "http"
	if r.tls != nil {
		if client, err = r.tls.client(); err != nil {
			r.rec.Error("ca")
			r.log.Error("read the controller's CA", "err", err)
			return
		}
		scheme = "https"
	}
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			buckets, err := r.post(ctx, client, scheme+"://"+net.JoinHostPort(a, r.port)+stats.Path, bodies[i], h)
			r.route(a, buckets, err)
			var refused *RefusedError
			var unreadable *unreadableError
			switch {
			case errors.As(err, &unreadable) && versions[i] >= 3:
				r.rec.Report(false)
				r.fallBack(a, versions[i], now, unreadable)
			case errors.As(err, &refused):
				r.rec.Refused()
				r.log.Error("the controller refused our stats: check this pod's ServiceAccount, its RBAC and the token's audience",
					"controller", a, "status", refused.Status, "message", refused.Message)
			case err != nil:
				r.rec.Report(false)
				r.log.Warn("report stats", "controller", a, "err", err)
			default:
				r.rec.Report(true)
			}
		})
	}
	wg.Wait()
	r.forgetRoutes(addrs)
}

// split returns the batch to post to each of addrs (stats.Split by the
// buckets each named last).
func (r *Reporter) split(addrs []string, b *stats.Batch) []*stats.Batch {
	routes := make([]stats.Buckets, len(addrs))
	r.mu.Lock()
	for i, a := range addrs {
		routes[i] = r.routes[a]
	}
	r.mu.Unlock()
	return stats.Split(b, routes)
}

// route records what replica a answered: its buckets, or none (it takes
// every record: it splits nothing, or it did not answer, so nothing is
// known of it).
func (r *Reporter) route(a string, buckets stats.Buckets, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil || buckets.Count == 0 {
		delete(r.routes, a)
		return
	}
	if r.routes == nil {
		r.routes = map[string]stats.Buckets{}
	}
	r.routes[a] = buckets
}

// forgetRoutes drops the routes of replicas no longer resolved, and
// which versions they read (a new address is a new replica).
func (r *Reporter) forgetRoutes(addrs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range r.routes {
		if !slices.Contains(addrs, a) {
			delete(r.routes, a)
		}
	}
	for a := range r.legacy {
		if !slices.Contains(addrs, a) {
			delete(r.legacy, a)
		}
	}
}

// maxVersion is the newest version replica a gets at now: the latest,
// or a lower one for LegacyPeriod after it refused a newer (fallBack).
func (r *Reporter) maxVersion(a string, now time.Time) byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.legacy[a]
	if !ok {
		return latest
	}
	if !now.Before(l.until) {
		delete(r.legacy, a)
		return latest
	}
	return l.max
}

// fallBack makes replica a, which could not read a batch of version v
// (3 or 4) sent at now, get batches of a lower version for LegacyPeriod:
// without the IPv6 pods' records after version 4 (it can read no IPv6
// address, but the IPv4 pods' records still count), without the
// accounting too after version 3. It says so once per refusal.
func (r *Reporter) fallBack(a string, v byte, now time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.legacy == nil {
		r.legacy = map[string]legacyReplica{}
	}
	r.legacy[a] = legacyReplica{max: v - 1, until: now.Add(LegacyPeriod)}
	if v == 4 {
		r.log.Warn("the controller cannot read stats version 4 (it predates this sender, or a rolling upgrade is under way): "+
			"sending it the stats of the IPv4 and dual-stack pods only, in the version it reads, and dropping those of the IPv6-only pods "+
			"(counted as errors at stage "+StageLegacyIPv6+"), then trying version 4 again",
			"controller", a, "for", LegacyPeriod, "err", err)
		return
	}
	r.log.Warn("the controller cannot read stats version 3 (it predates this sender, or a rolling upgrade is under way): "+
		"sending it the stats without the pods' accounting, which it reads, then trying version 3 again",
		"controller", a, "for", LegacyPeriod, "err", err)
}

// RefusedError is a replica's 401 or 403, with its message.
type RefusedError struct {
	Status  int
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("controller answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// unreadableError is a replica's 400: it could not read the batch.
type unreadableError struct{ Message string }

func (e *unreadableError) Error() string {
	return fmt.Sprintf("controller answered 400 Bad Request: %s", e.Message)
}

// post sends body to url and returns the buckets the replica answered
// with (none: it takes every record).
func (r *Reporter) post(ctx context.Context, client *http.Client, url string, body []byte, h http.Header) (stats.Buckets, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return stats.Buckets{}, err
	}
	req.Header = h.Clone()
	resp, err := client.Do(req)
	if err != nil {
		return stats.Buckets{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		var msg [512]byte
		n, _ := io.ReadFull(resp.Body, msg[:])
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return stats.Buckets{}, &RefusedError{Status: resp.StatusCode, Message: string(bytes.TrimSpace(msg[:n]))}
		case http.StatusBadRequest:
			return stats.Buckets{}, &unreadableError{Message: string(bytes.TrimSpace(msg[:n]))}
		}
		return stats.Buckets{}, fmt.Errorf("controller answered %s: %s", resp.Status, bytes.TrimSpace(msg[:n]))
	}
	v := resp.Header.Get(stats.HeaderBuckets)
	if v == "" {
		return stats.Buckets{}, nil
	}
	buckets, err := stats.ParseBuckets(v)
	if err != nil {
		// The batch was taken; the replica gets every record until it
		// answers with a header that parses.
		r.rec.Error("buckets")
		r.log.Warn("the controller's answer names its buckets unreadably: sending it every record", "controller", req.URL.Host, "err", err)
		return stats.Buckets{}, nil
	}
	return buckets, nil
}
