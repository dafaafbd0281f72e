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
	"sync"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// Recorder counts batches sent and failed.
type Recorder interface {
	// Report counts a post to one replica that succeeded, or failed for
	// another reason than Refused's.
	Report(ok bool)
	// Refused counts a post a replica answered 401 or 403: this sender's
	// token or permissions are wrong, and no retry will help.
	Refused()
	Error(stage string)
}

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
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}},
		queue:   make(chan *stats.Batch, 1),
	}, nil
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

// Send posts b to every replica and waits for all answers.
func (r *Reporter) Send(ctx context.Context, b *stats.Batch) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	body, err := stats.Append(nil, b)
	if err != nil {
		r.rec.Error("report")
		r.log.Error("encode stats", "err", err)
		return
	}
	addrs, err := r.resolve(ctx, r.host)
	if err != nil || len(addrs) == 0 {
		r.rec.Report(false)
		r.log.Warn("no controller to report to", "host", r.host, "err", err)
		return
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
	for _, a := range addrs {
		wg.Go(func() {
			err := r.post(ctx, client, scheme+"://"+net.JoinHostPort(a, r.port)+stats.Path, body, h)
			var refused *RefusedError
			switch {
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
}

// RefusedError is a replica's 401 or 403, with its message.
type RefusedError struct {
	Status  int
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("controller answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

func (r *Reporter) post(ctx context.Context, client *http.Client, url string, body []byte, h http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = h.Clone()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		var msg [512]byte
		n, _ := io.ReadFull(resp.Body, msg[:])
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return &RefusedError{Status: resp.StatusCode, Message: string(bytes.TrimSpace(msg[:n]))}
		}
		return fmt.Errorf("controller answered %s: %s", resp.Status, bytes.TrimSpace(msg[:n]))
	}
	return nil
}
