package drain

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/bpf"
)

func TestRounds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const idleClose = time.Second
	d := newPodDrain()
	type step struct {
		at    time.Duration
		conns []Conn
		acts  []Action
		round Round
	}
	steps := []step{
		// 1 idle, 2 waiting on its response, 3 sending one, 4 h2, 5 idle
		// but with bytes not sent yet, 6 no state.
		{0, []Conn{{1, bpf.ConnIdle, 0}, {2, bpf.ConnWaiting, 0}, {3, bpf.ConnBusy, 0}, {4, bpf.ConnOpaque, 0}, {5, bpf.ConnIdle, 10}, {6, bpf.ConnUnknown, 0}},
			[]Action{HandOver, HandOver, Leave, Leave, Leave, Leave}, Round{InFlight: 2, Idle: 2, Opaque: 1, Unknown: 1}},
		// 3 is between responses now: handed over; 5 sent its bytes.
		{500 * time.Millisecond, []Conn{{1, bpf.ConnIdle, 0}, {2, bpf.ConnBusy, 0}, {3, bpf.ConnIdle, 0}, {5, bpf.ConnIdle, 0}},
			[]Action{Leave, Leave, HandOver, HandOver}, Round{InFlight: 1, Idle: 3}},
		// 1 idle for the whole second since its hand-over: closed; 2 got
		// its closing response and went.
		{time.Second, []Conn{{1, bpf.ConnIdle, 0}, {3, bpf.ConnIdle, 0}, {5, bpf.ConnIdle, 0}},
			[]Action{CloseIdle, Leave, Leave}, Round{Idle: 2}},
		// 1 is closing (its client has not closed yet): not waited for.
		// 3 got a request: idle again from the next round on.
		{1500 * time.Millisecond, []Conn{{1, bpf.ConnIdle, 0}, {3, bpf.ConnWaiting, 0}, {5, bpf.ConnIdle, 0}},
			[]Action{Leave, Leave, CloseIdle}, Round{InFlight: 1}},
		// 3 answered: idle since 1.8s, so it is left until 2.8s though
		// handed over 1.3s before.
		{1800 * time.Millisecond, []Conn{{1, bpf.ConnIdle, 0}, {3, bpf.ConnIdle, 0}},
			[]Action{Leave, Leave}, Round{Idle: 1}},
		{2700 * time.Millisecond, []Conn{{1, bpf.ConnIdle, 0}, {3, bpf.ConnIdle, 0}},
			[]Action{Leave, Leave}, Round{Idle: 1}},
		{2800 * time.Millisecond, []Conn{{3, bpf.ConnIdle, 0}},
			[]Action{CloseIdle}, Round{}},
	}
	for i, s := range steps {
		acts, r := d.round(t0.Add(s.at), s.conns, idleClose)
		if diff := cmp.Diff(s.acts, acts); diff != "" {
			t.Errorf("round %d actions (-want +got):\n%s", i, diff)
		}
		if diff := cmp.Diff(s.round, r); diff != "" {
			t.Errorf("round %d (-want +got):\n%s", i, diff)
		}
	}
	if !(Round{}).Drained() || (Round{Idle: 1}).Drained() || (Round{InFlight: 1}).Drained() || !(Round{Opaque: 3, Unknown: 1}).Drained() {
		t.Error("Drained: only in-flight requests and idle connections hold a pod")
	}
	// Gone connections are forgotten.
	d.round(t0.Add(3*time.Second), nil, idleClose)
	if len(d.handed) != 0 || len(d.closed) != 0 || len(d.idleSince) != 0 {
		t.Errorf("after every connection went: handed %v closed %v idle since %v", d.handed, d.closed, d.idleSince)
	}
}
