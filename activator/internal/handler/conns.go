package handler

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Idle kept-alive connections and the direct path.
//
// A pod's response asks a busy client to reconnect (reconnect.go); a
// client that is idle when its target is served directly has no response
// to be asked on, and would come back once more through the activator.
// Conns follows the proxy port's connections and the target each last
// carried a request for, and moves the idle ones whose target has been in
// Serve mode for ReconnectAfter:
//
//   - an idle HTTP/1.x connection is closed, as an idle timeout would: an
//     HTTP/1.1 client must expect a kept-alive connection to close between
//     requests (RFC 9112, section 9.3.1), and retries a request it was
//     just sending on it when the request is idempotent (Go's transport,
//     curl, browsers);
//   - an HTTP/2 connection, idle or not, is shut down gracefully: the
//     server sends GOAWAY naming the last stream it took, finishes those
//     and closes. A stream the client opens as the GOAWAY is on its way
//     is refused unprocessed and retried on a new connection (gRPC does
//     this itself; Go's transport for requests it can send again). Go's
//     HTTP/2 server offers no call to shut down one connection, but
//     starts exactly this when its client says GOAWAY: Conns hands the
//     server a GOAWAY frame between two of the client's frames (goAway).
//
// Each connection is moved once; the sweep runs every sweepEvery.

// sweepEvery is how often Conns looks for connections to move.
const sweepEvery = 500 * time.Millisecond

// Conns follows one server's client connections (NewConns, Attach,
// Listener, Run). Its methods are safe for concurrent use.
type Conns struct {
	modes Modes
	after time.Duration
	m     *Metrics
	log   *slog.Logger

	mu    sync.Mutex
	conns map[*clientConn]struct{}
}

// NewConns returns a tracker that moves the idle connections of targets
// modes says have been in Serve mode for after; it counts them in m.
func NewConns(modes Modes, after time.Duration, m *Metrics, log *slog.Logger) *Conns {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Conns{modes: modes, after: after, m: m, log: log, conns: make(map[*clientConn]struct{})}
}

// clientConn is one client connection as Conns sees it.
type clientConn struct {
	net.Conn

	// h2 follows the bytes the server reads, to find the frame
	// boundaries of an HTTP/2 connection; only its reader touches it.
	h2 frameCursor
	// inject is a GOAWAY frame still to be handed to the server; only the
	// reader touches it.
	inject []byte

	mu     sync.Mutex
	state  http.ConnState
	target target.Key
	known  bool // a request resolved to target
	isH2   bool // the connection speaks HTTP/2 (set by the reader)
	goAway bool // asked to go away: the reader hands the server a GOAWAY
	woke   bool // the read deadline was set to wake the reader
	moved  bool // closed or told to go away already
}

// connKey is the context key of a request's *clientConn.
type connKey struct{}

// noteTarget records that r's connection carried a request for k.
func noteTarget(r *http.Request, k target.Key) {
	c, ok := r.Context().Value(connKey{}).(*clientConn)
	if !ok {
		return
	}
	c.mu.Lock()
	c.target, c.known = k, true
	c.mu.Unlock()
}

// Attach has srv tell Conns of its connections' states and give each
// request its connection (for noteTarget). Serve srv on a Listener of
// Conns.
func (cs *Conns) Attach(srv *http.Server) {
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if cc, ok := c.(*clientConn); ok {
			return context.WithValue(ctx, connKey{}, cc)
		}
		return ctx
	}
	srv.ConnState = func(c net.Conn, state http.ConnState) {
		cc, ok := c.(*clientConn)
		if !ok {
			return
		}
		cc.mu.Lock()
		cc.state = state
		cc.mu.Unlock()
		if state == http.StateClosed || state == http.StateHijacked {
			cs.mu.Lock()
			delete(cs.conns, cc)
			cs.mu.Unlock()
		}
	}
}

// Listener wraps l: its connections are the ones Conns follows.
func (cs *Conns) Listener(l net.Listener) net.Listener { return &listener{Listener: l, cs: cs} }

type listener struct {
	net.Listener
	cs *Conns
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &clientConn{Conn: c, state: http.StateNew}
	l.cs.mu.Lock()
	l.cs.conns[cc] = struct{}{}
	l.cs.mu.Unlock()
	return cc, nil
}

// Run sweeps until ctx ends.
func (cs *Conns) Run(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cs.sweep(time.Now())
		}
	}
}

// sweep moves every connection that is due.
func (cs *Conns) sweep(now time.Time) {
	cs.mu.Lock()
	all := make([]*clientConn, 0, len(cs.conns))
	for c := range cs.conns {
		all = append(all, c)
	}
	cs.mu.Unlock()
	for _, c := range all {
		cs.move(c, now)
	}
}

// move closes c, or has it go away, if it is due.
func (cs *Conns) move(c *clientConn, now time.Time) {
	c.mu.Lock()
	if c.moved || !c.known {
		c.mu.Unlock()
		return
	}
	k := c.target
	c.mu.Unlock()
	since, serving := cs.modes.ServeSince(k)
	if !serving || now.Sub(since) < cs.after {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.moved:
		return
	case c.isH2:
		// Idle or busy, GOAWAY is graceful: the streams it has finish.
		// (A busy one may have been asked by a response already; the
		// server then takes this GOAWAY as the same shutdown.)
		c.moved, c.goAway, c.woke = true, true, true
		// Wake the reader, which waits for the client's next frame: the
		// server sets no read deadline on an HTTP/2 connection (its
		// ReadTimeout is 0), so a timeout the reader meets is this one.
		_ = c.SetReadDeadline(now)
	case c.state == http.StateIdle:
		c.moved = true
		_ = c.Close()
	default:
		return // busy HTTP/1.x: its response asks it (reconnect.go)
	}
	how := "closed"
	if c.isH2 {
		how = "goaway"
	}
	cs.m.moves.WithLabelValues(k.Namespace, how).Inc()
	cs.log.Debug("kept-alive connection moved off the activator", "target", k, "remote", c.RemoteAddr(), "http2", c.isH2)
}

// Read hands the server what the client sent, with a GOAWAY frame between
// two frames once the connection is asked to go away.
func (c *clientConn) Read(p []byte) (int, error) {
	for {
		if len(c.inject) > 0 {
			n := copy(p, c.inject)
			c.inject = c.inject[n:]
			return n, nil
		}
		n, err := c.Conn.Read(p)
		c.h2.advance(p[:n])
		c.mu.Lock()
		c.isH2 = c.h2.isH2
		if c.goAway && c.h2.atBoundary() {
			c.goAway = false
			c.inject = goAwayFrame
		}
		woke := c.woke
		if woke {
			// Woken once: from here the reader waits as before (for the
			// end of a frame it is in, if any: the GOAWAY follows it).
			c.woke = false
			_ = c.SetReadDeadline(time.Time{})
		}
		c.mu.Unlock()
		if woke && errors.Is(err, os.ErrDeadlineExceeded) {
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

// goAwayFrame is an HTTP/2 GOAWAY frame (RFC 9113, section 6.8) from the
// client: last stream 0 (the client takes no pushed streams), NO_ERROR.
var goAwayFrame = []byte{
	0, 0, 8, // length
	0x7,        // type GOAWAY
	0,          // flags
	0, 0, 0, 0, // stream 0
	0, 0, 0, 0, // last stream ID
	0, 0, 0, 0, // NO_ERROR
}

// http2Preface is what an HTTP/2 client sends first (RFC 9113, section
// 3.4).
var http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// frameCursor follows a byte stream from its start: whether it opens with
// the HTTP/2 preface, and where its frames begin.
type frameCursor struct {
	seen    int     // bytes of the preface seen so far
	notH2   bool    // the stream is not HTTP/2 with prior knowledge
	isH2    bool    // the whole preface was seen
	header  [9]byte // the frame header being read
	inHead  int     // its bytes read
	payload int     // bytes of the current frame's payload still to come
}

// advance reads b, the next bytes of the stream.
func (f *frameCursor) advance(b []byte) {
	for len(b) > 0 && !f.notH2 {
		switch {
		case !f.isH2:
			n := min(len(b), len(http2Preface)-f.seen)
			if !bytes.Equal(b[:n], http2Preface[f.seen:f.seen+n]) {
				f.notH2 = true
				return
			}
			f.seen += n
			f.isH2 = f.seen == len(http2Preface)
			b = b[n:]
		case f.payload > 0:
			n := min(len(b), f.payload)
			f.payload -= n
			b = b[n:]
		default:
			n := copy(f.header[f.inHead:], b)
			f.inHead += n
			b = b[n:]
			if f.inHead == len(f.header) {
				f.inHead = 0
				f.payload = int(f.header[0])<<16 | int(f.header[1])<<8 | int(f.header[2])
			}
		}
	}
}

// atBoundary says whether the stream is HTTP/2 and between two frames.
func (f *frameCursor) atBoundary() bool {
	return f.isH2 && f.inHead == 0 && f.payload == 0
}
