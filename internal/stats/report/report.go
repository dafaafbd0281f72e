package report

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// Recorder counts batches sent and failed.
type Recorder interface {
	Report(ok bool)
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
	var nodeState string
	if b.NodeState != nil {
		nodeState = b.NodeState.Encode()
	}
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() {
			err := r.post(ctx, "http://"+net.JoinHostPort(a, r.port)+stats.Path, body, nodeState)
			r.rec.Report(err == nil)
			if err != nil {
				r.log.Warn("report stats", "controller", a, "err", err)
			}
		})
	}
	wg.Wait()
}

func (r *Reporter) post(ctx context.Context, url string, body []byte, nodeState string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", stats.ContentType)
	if nodeState != "" {
		req.Header.Set(stats.HeaderNodeState, nodeState)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		var msg [512]byte
		n, _ := resp.Body.Read(msg[:])
		return fmt.Errorf("controller answered %s: %s", resp.Status, bytes.TrimSpace(msg[:n]))
	}
	return nil
}
