package drain

import (
	"time"

	"github.com/sockscale/sockscale/bpf"
)

// Conn is one server connection of a leaving pod as a drain round sees it.
type Conn struct {
	// Cookie identifies the socket for its life.
	Cookie uint64
	// Activity is what the connection is doing (the programs' state).
	Activity bpf.ConnActivity
	// Unsent is how many bytes its server wrote that TCP has not sent:
	// the response parser has not seen them yet.
	Unsent int
}

// Action is what a round does to a connection.
type Action uint8

const (
	// Leave it as it is.
	Leave Action = iota
	// HandOver to the kernel's drain program: its next response asks the
	// client to close the connection.
	HandOver
	// CloseIdle ends our side of an idle connection (a FIN): its client
	// sent nothing for IdleClose after the hand-over, and would otherwise
	// keep it open until its next request.
	CloseIdle
)

// Round is what one look at a pod's connections found.
type Round struct {
	// InFlight counts the HTTP/1.x connections with a request being
	// received, served or answered: the requests the pod must finish.
	InFlight int
	// Idle counts the HTTP/1.x connections open and idle that were not
	// closed yet; Opaque those whose requests cannot be seen (TLS, h2,
	// upgraded; left to the app), Unknown those without state.
	Idle, Opaque, Unknown int
}

// Drained says whether the pod has nothing left to finish: no request in
// flight and no idle connection a client could send one on. Connections
// whose requests cannot be seen do not hold it up: the app's own stop is
// all that ends them.
func (r Round) Drained() bool { return r.InFlight == 0 && r.Idle == 0 }

// podDrain is the drain of one pod: which of its connections were handed
// over and when, since when each has been idle, and which were closed.
type podDrain struct {
	handed    map[uint64]time.Time
	idleSince map[uint64]time.Time
	closed    map[uint64]bool
}

func newPodDrain() *podDrain {
	return &podDrain{handed: map[uint64]time.Time{}, idleSince: map[uint64]time.Time{}, closed: map[uint64]bool{}}
}

// round decides what to do with each connection at now; idleClose is how
// long an idle connection that was handed over is left open: idle all that
// time since both its hand-over and its last request, as each round saw
// it. (A connection that served a request between two rounds looks idle
// throughout; its client's next request may then meet the close, which a
// client retries on a kept-alive connection that ends before answering.)
// A connection is handed over only between two responses with nothing
// left unsent, so that the next thing its server writes starts a response.
func (d *podDrain) round(now time.Time, conns []Conn, idleClose time.Duration) ([]Action, Round) {
	acts := make([]Action, len(conns))
	var r Round
	live := make(map[uint64]bool, len(conns))
	for i, c := range conns {
		live[c.Cookie] = true
		switch c.Activity {
		case bpf.ConnOpaque:
			r.Opaque++
			continue
		case bpf.ConnUnknown:
			r.Unknown++
			continue
		case bpf.ConnWaiting, bpf.ConnBusy:
			r.InFlight++
		case bpf.ConnIdle:
			if !d.closed[c.Cookie] {
				r.Idle++
			}
		}
		if c.Activity != bpf.ConnIdle {
			delete(d.idleSince, c.Cookie)
		} else if _, seen := d.idleSince[c.Cookie]; !seen {
			d.idleSince[c.Cookie] = now
		}
		at, handed := d.handed[c.Cookie]
		switch {
		case !handed && c.Unsent == 0 && (c.Activity == bpf.ConnIdle || c.Activity == bpf.ConnWaiting):
			acts[i] = HandOver
			d.handed[c.Cookie] = now
		case handed && c.Activity == bpf.ConnIdle && !d.closed[c.Cookie] && now.Sub(later(at, d.idleSince[c.Cookie])) >= idleClose:
			acts[i] = CloseIdle
			d.closed[c.Cookie] = true
			r.Idle--
		}
	}
	// Forget connections that are gone: cookies are never reused, this
	// only bounds the maps.
	for c := range d.handed {
		if !live[c] {
			delete(d.handed, c)
			delete(d.closed, c)
		}
	}
	for c := range d.idleSince {
		if !live[c] {
			delete(d.idleSince, c)
		}
	}
	return acts, r
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
