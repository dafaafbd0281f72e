package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

// The h2 parts' gRPC servers: the pod's own, in its cgroup; the twins', in
// b.twins' cgroups beside their HTTP servers; and the one behind
// queue-proxy, in b.proxyBackend's. Not testpod.GRPCPort: queue-proxy
// serves its metrics on 9090 and 9091 in the same network namespace.
const (
	grpcPodPort     = 9190
	grpcTwinAPort   = 9191
	grpcTwinBPort   = 9192
	grpcBackendPort = 9193
)

// startGRPCServers starts the h2 parts' gRPC servers, once: the pod's own
// and those of grpcTarget.
func (b *bench) startGRPCServers() error {
	if b.grpcStarted {
		return nil
	}
	if err := b.pod.Start(testpod.RoleGRPC, grpcPodPort); err != nil {
		return err
	}
	t := b.grpcTarget()
	for _, srv := range []server{t.twins[0], t.twins[1], t.backend} {
		if err := b.pod.StartIn(srv.cgroup, testpod.RoleGRPC, srv.port); err != nil {
			return err
		}
	}
	b.grpcStarted = true
	return nil
}

// grpcTarget is the gRPC data path's: gRPC servers in the cgroups of the
// HTTP/1.x data path's twins and queue-proxy's backend, driven by one
// channel (one connection) of unary calls.
//
// The servers end each connection after testpod.GRPCMaxConnectionAge
// with a GOAWAY, and queue-proxy answers a call that meets it 502 now and
// then: Go's HTTP/2 transport retries the request on a new connection,
// and finds the body the reverse proxy gave it closed by the first try
// ("ReverseProxy does an invalid Read on closed Body"). grpc-go's channel,
// the direct client, retries such calls itself. Those 502s are counted
// and reported under the table, not an error: they are queue-proxy's, as
// it runs.
func (b *bench) grpcTarget() dataPathTarget {
	return dataPathTarget{
		twins:             [2]server{{b.twins[0].cgroup, grpcTwinAPort}, {b.twins[1].cgroup, grpcTwinBPort}},
		backend:           server{b.proxyBackend.cgroup, grpcBackendPort},
		client:            grpcClient(1, "", false),
		queueProxyMayFail: true,
	}
}

// h2DataPath is dataPath over HTTP/2 with prior knowledge, where a
// request is a stream: h2c requests from Go's net/http client to the same
// servers as the HTTP/1.x data path, then unary gRPC calls from grpc-go to
// grpc-go servers in the same cgroups, each mode's client over one
// connection. The method is dataPath's: twins swapping roles every block,
// modes taking turns in slices, ratios within a round.
//
// queue-proxy needs no setting for either: its server takes h2c with
// prior knowledge (knative.dev/pkg/network.NewServer) and its transport
// forwards an HTTP/2 request to the app over h2c (NewProxyAutoTransport
// picks by the request's ProtoMajor). A Knative revision whose port is
// named h2c tells the ingress and activator to speak HTTP/2 to
// queue-proxy, which the clients here do by themselves, and serves
// queue-proxy's same server on 8013 instead of 8012 (QUEUE_SERVING_PORT):
// the same queue-proxy serves both tables here.
func (b *bench) h2DataPath(slice time.Duration, rounds, block int, concurrencies []int, protocols []string, queueProxy string) error {
	if err := checkBlocks("h2-", rounds, block); err != nil {
		return err
	}
	targets := map[string]struct {
		title  string
		target dataPathTarget
	}{
		"h2c":  {"h2c", dataPathTarget{twins: b.twins, backend: b.proxyBackend, client: h2cClient(1, "", false)}},
		"grpc": {"gRPC", b.grpcTarget()},
	}
	for _, p := range protocols {
		if _, ok := targets[p]; !ok {
			return fmt.Errorf("-h2-protocols: unknown protocol %q, want h2c or grpc", p)
		}
	}
	if err := b.startGRPCServers(); err != nil {
		return err
	}
	pairs := rounds / (2 * block)
	fmt.Printf("\nData path over HTTP/2 with prior knowledge: trivial handler, each client one connection, closed loop; per c %d pairs of %d-round blocks, each mode %v per round, modes taking turns\n", pairs, block, slice)
	fmt.Println("A request is a stream: h2c, Go's net/http client (UnencryptedHTTP2) to the HTTP/1.x data path's servers; gRPC, grpc-go unary calls to grpc-go servers.")
	fmt.Println("queue-proxy takes h2c and forwards HTTP/2 to the app over h2c by itself (no setting).")
	printDataPathLegend()
	for _, p := range protocols {
		t := targets[p]
		fmt.Printf("\n%s:\n", t.title)
		if err := b.dataPathTable(t.target, slice, pairs, block, concurrencies, queueProxy); err != nil {
			return fmt.Errorf("%s: %w", t.title, err)
		}
	}
	return nil
}

// h2Accuracy is accuracy over HTTP/2 with prior knowledge: h2c requests
// to the pod's HTTP server, and unary gRPC calls to its gRPC server, each
// waiting accuracySleep in the handler, over one connection or four.
// The gRPC server sends GOAWAY every few seconds
// (testpod.GRPCMaxConnectionAge), so its rows also cover connections
// replaced under load.
func (b *bench) h2Accuracy(d time.Duration) error {
	if err := b.startGRPCServers(); err != nil {
		return err
	}
	a, detach, err := b.attach(b.root)
	if err != nil {
		return err
	}
	defer detach()
	fmt.Printf("\nAccuracy over HTTP/2 with prior knowledge: handler sleeping %v, closed loop for %v; measured = growth of the kernel's in-flight integral / time\n", accuracySleep, d)
	fmt.Println("A request is a stream. Clients: h2c, Go's net/http (one client per connection); gRPC, grpc-go unary calls (one channel per connection).")
	fmt.Println("client-side: the client's streams from the moment each had its connection; conns: the pod's connections the kernel had open at the window's end (followed as HTTP/2).")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "protocol\tconns\toffered\tmeasured\terror\tclient-side (Little)\terror vs client\tkernel conns (HTTP/2)\tfailed\t")
	for _, p := range []struct {
		name   string
		addr   string
		client func(conns int) newClient
	}{
		{"h2c", b.pod.Addr(testpod.HTTPPort), func(conns int) newClient { return h2cClient(conns, "?sleep="+accuracySleep.String(), true) }},
		{"gRPC", b.pod.Addr(grpcPodPort), func(conns int) newClient { return grpcClient(conns, accuracySleep.String(), true) }},
	} {
		for _, conns := range []int{1, 4} {
			for _, c := range []int{1, 8, 64} {
				if c < conns {
					continue // a connection without a stream is not load
				}
				l, closeClient, err := p.client(conns)(p.addr, c)
				if err != nil {
					return err
				}
				m, err := b.measureConcurrency(a, l, d)
				closeClient()
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d (%d)\t%d\t\n", p.name, conns, c, m.cells(c), m.conns, m.h2Conns, m.failed)
			}
		}
	}
	return w.Flush()
}

// h2cClient is a newClient of conns h2c connections, each Go's net/http
// client speaking HTTP/2 with prior knowledge (one connection: the
// transport opens another only past the server's stream limit, 250 for
// Go's servers and queue-proxy's), the c requests in flight spread over
// them. Requests go to the server's path "/" with query; spans: keep each
// request's span (loadgen.Options.Spans).
func h2cClient(conns int, query string, spans bool) newClient {
	return func(addr string, c int) (loop, func(), error) {
		if c < conns {
			return loop{}, nil, fmt.Errorf("h2c: %d requests in flight over %d connections: some would carry none", c, conns)
		}
		clients := make([]*http.Client, conns)
		for i := range clients {
			tr := &http.Transport{Protocols: new(http.Protocols)}
			tr.Protocols.SetUnencryptedHTTP2(true)
			clients[i] = &http.Client{Transport: tr, Timeout: 30 * time.Second}
		}
		closeAll := func() {
			for _, cl := range clients {
				cl.CloseIdleConnections()
			}
		}
		url := "http://" + addr + "/" + query
		opts := func(i int) loadgen.Options {
			return loadgen.Options{URLs: []string{url}, Concurrency: share(c, conns, i), KeepAlive: true, Client: clients[i], Spans: spans}
		}
		if conns == 1 {
			return httpLoop(opts(0)), closeAll, nil
		}
		return loop{c: c, run: func(d time.Duration) *loadgen.Result {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			loads := make([]*loadgen.Load, conns)
			for i := range loads {
				loads[i] = loadgen.Start(ctx, opts(i))
			}
			<-ctx.Done()
			all := &loadgen.Result{}
			for _, l := range loads {
				addResult(all, l.Stop())
			}
			return all
		}}, closeAll, nil
	}
}

// share is connection i's part of c requests in flight over conns.
func share(c, conns, i int) int {
	n := c / conns
	if i < c%conns {
		n++
	}
	return n
}

// addResult adds r, a loop that ran beside all's others, to all.
func addResult(all, r *loadgen.Result) {
	all.Completed += r.Completed
	if all.Failed += r.Failed; all.FirstError == nil {
		all.FirstError = r.FirstError
	}
	all.Elapsed = max(all.Elapsed, r.Elapsed)
	all.Latencies = append(all.Latencies, r.Latencies...)
	all.Spans = append(all.Spans, r.Spans...)
}

// grpcClient is a newClient of conns grpc-go channels, each one
// connection, making unary calls of testpod.GRPCUnary that ask the server
// to wait sleep ("": answer at once), the c calls in flight spread over
// the channels. spans: keep each call's span, from the moment its stream
// had a connection (see callStart), as loadgen's HTTP spans start.
func grpcClient(conns int, sleep string, spans bool) newClient {
	return func(addr string, c int) (loop, func(), error) {
		if c < conns {
			return loop{}, nil, fmt.Errorf("gRPC: %d calls in flight over %d channels: some would carry none", c, conns)
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if spans {
			// Only where wanted: with a stats handler, grpc-go builds an
			// event for every header and message, which the data path
			// would pay for.
			opts = append(opts, grpc.WithStatsHandler(callStart{}))
		}
		chans := make([]*grpc.ClientConn, 0, conns)
		closeAll := func() {
			for _, ch := range chans {
				_ = ch.Close() // a second close only says it was closed
			}
		}
		for range conns {
			ch, err := grpc.NewClient(addr, opts...)
			if err != nil {
				closeAll()
				return loop{}, nil, fmt.Errorf("gRPC channel to %s: %w", addr, err)
			}
			chans = append(chans, ch)
		}
		return loop{c: c, run: func(d time.Duration) *loadgen.Result { return grpcCalls(chans, c, sleep, spans, d) }}, closeAll, nil
	}
}

// grpcCalls keeps c unary calls in flight over chans (call i on channel i
// mod len(chans)) for d; calls in flight at the end are waited for, as
// loadgen waits for requests. A call has no deadline, as the data path's
// HTTP requests have none but the client's 30 s: a deadline's timer and
// header would be the client's cost in every mode alike.
func grpcCalls(chans []*grpc.ClientConn, c int, sleep string, spans bool, d time.Duration) *loadgen.Result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	all := &loadgen.Result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for g := range c {
		ch := chans[g%len(chans)]
		wg.Go(func() {
			var mine loadgen.Result
			req := wrapperspb.String(sleep)
			for ctx.Err() == nil {
				var resp wrapperspb.StringValue
				var connected atomic.Int64 // unix ns, set by callStart
				callCtx := context.Background()
				if spans {
					callCtx = context.WithValue(callCtx, callStartKey{}, &connected)
				}
				t0 := time.Now()
				err := ch.Invoke(callCtx, testpod.GRPCUnary, req, &resp)
				end := time.Now()
				if err != nil {
					if mine.Failed++; mine.FirstError == nil {
						mine.FirstError = err
					}
					continue
				}
				mine.Completed++
				mine.Latencies = append(mine.Latencies, end.Sub(t0))
				if spans {
					s := loadgen.Span{Start: t0, End: end}
					if ns := connected.Load(); ns != 0 {
						s.Start = time.Unix(0, ns)
					}
					mine.Spans = append(mine.Spans, s)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			addResult(all, &mine)
		})
	}
	wg.Wait()
	all.Elapsed = time.Since(start)
	return all
}

// callStart is a gRPC stats handler that notes when a call's stream had
// its connection (stats.OutHeader, its headers about to go out) in the
// *atomic.Int64 its context carries under callStartKey: the time before
// it, waiting for a connection (as after a GOAWAY), is the client's
// alone, as loadgen's HTTP spans leave dialling out.
type callStart struct{}

type callStartKey struct{}

func (callStart) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (callStart) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.OutHeader); !ok {
		return
	}
	if connected, ok := ctx.Value(callStartKey{}).(*atomic.Int64); ok {
		connected.Store(time.Now().UnixNano())
	}
}

func (callStart) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (callStart) HandleConn(context.Context, stats.ConnStats) {}
