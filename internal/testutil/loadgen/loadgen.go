package loadgen

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options describe a closed loop.
type Options struct {
	// URLs are requested round-robin (each client starts at its own index).
	URLs []string
	// Concurrency is how many requests are kept in flight.
	Concurrency int
	// KeepAlive reuses connections; without it every request dials.
	KeepAlive bool
	// Header is added to every request.
	Header http.Header
	// Spans keeps each request's in-flight span (see Result.InFlightArea).
	Spans bool
	// OnError, if set, is told of each failed request as it fails, with
	// the local address of the connection it was sent on (nil when it
	// had none): a test that must explain a failure lines it up with
	// what else happened then.
	OnError func(err error, local net.Addr)
	// Client sends the requests, and keeps its connections when the loop
	// ends, for the next loop to reuse (see NewClient). Nil: a client of
	// the loop's own, whose connections close with it.
	Client *http.Client
}

// NewClient returns a client for loops of concurrency c whose keep-alive
// connections outlive each loop.
func NewClient(c int, keepAlive bool) *http.Client {
	tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: c, MaxConnsPerHost: c}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// Span is one request from the moment the client had a connection for it
// (dialling is not the server's time) to the end of its body.
type Span struct{ Start, End time.Time }

// Result is the client's view of the load.
type Result struct {
	Completed, Failed int64
	// FirstError is the first failure's, for a test's message; nil if none.
	FirstError error
	Elapsed    time.Duration
	Latencies  []time.Duration // whole requests, dialling included
	Spans      []Span
}

// Load is a running closed loop.
type Load struct {
	mu     sync.Mutex
	res    Result
	cancel context.CancelFunc
	done   chan struct{}
}

// Start keeps opts.Concurrency requests in flight until ctx ends or Stop.
func Start(ctx context.Context, opts Options) *Load {
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{cancel: cancel, done: make(chan struct{})}
	client, own := opts.Client, opts.Client == nil
	if own {
		client = NewClient(opts.Concurrency, opts.KeepAlive)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for g := range opts.Concurrency {
		wg.Go(func() {
			var mine Result
			for i := g; ctx.Err() == nil; i += opts.Concurrency {
				span, took, local, err := do(client, opts.URLs[i%len(opts.URLs)], opts.Header)
				if err != nil {
					if opts.OnError != nil {
						opts.OnError(err, local)
					}
					if mine.Failed++; mine.FirstError == nil {
						mine.FirstError = err
					}
					continue
				}
				mine.Completed++
				mine.Latencies = append(mine.Latencies, took)
				if opts.Spans {
					mine.Spans = append(mine.Spans, span)
				}
			}
			l.mu.Lock()
			l.res.Completed += mine.Completed
			l.res.Failed += mine.Failed
			if l.res.FirstError == nil {
				l.res.FirstError = mine.FirstError
			}
			l.res.Latencies = append(l.res.Latencies, mine.Latencies...)
			l.res.Spans = append(l.res.Spans, mine.Spans...)
			l.mu.Unlock()
		})
	}
	go func() {
		wg.Wait()
		l.res.Elapsed = time.Since(start)
		if own {
			client.CloseIdleConnections()
		}
		close(l.done)
	}()
	return l
}

// Run is Start for a fixed duration, then Stop.
func Run(opts Options, d time.Duration) *Result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	l := Start(ctx, opts)
	<-ctx.Done()
	return l.Stop()
}

// Stop ends the loop, waits for the requests in flight and returns the
// result.
func (l *Load) Stop() *Result {
	l.cancel()
	<-l.done
	return &l.res
}

func do(client *http.Client, url string, header http.Header) (span Span, took time.Duration, local net.Addr, err error) {
	trace := &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) {
		span.Start = time.Now()
		local = c.Conn.LocalAddr()
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
	if err != nil {
		return span, 0, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err == nil {
		// A failed answer's body says who refused it and why (the
		// activator writes one line); keep its start for the report.
		var head [160]byte
		n, _ := io.ReadFull(resp.Body, head[:])
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode >= 400 {
			body := strings.TrimSpace(strings.SplitN(string(head[:n]), "\n", 2)[0])
			err = fmt.Errorf("GET %s: %s: %q", url, resp.Status, body) // an answer, but a failed request
		}
	}
	span.End = time.Now()
	return span, span.End.Sub(t0), local, err
}

// InFlightArea is the time integral of the client's requests in flight
// within [from, to]: divided by the window, the concurrency the server
// should have seen (Little's law).
func (r *Result) InFlightArea(from, to time.Time) time.Duration {
	var area time.Duration
	for _, s := range r.Spans {
		start, end := s.Start, s.End
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) {
			area += end.Sub(start)
		}
	}
	return area
}

// RPS is completed requests per second.
func (r *Result) RPS() float64 { return float64(r.Completed) / r.Elapsed.Seconds() }

// Percentile of the latencies, p in [0, 1].
func (r *Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.Latencies)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
