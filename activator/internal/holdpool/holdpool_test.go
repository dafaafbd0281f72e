package holdpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// held is what a test expects the pool to hold, by namespace.
func heldBy(p *Pool, namespaces ...string) map[string]int {
	got := map[string]int{"": p.Held("")}
	for _, ns := range namespaces {
		got[ns] = p.Held(ns)
	}
	return got
}

func TestHold(t *testing.T) {
	type step struct {
		ns      string
		wantErr error // nil: admitted
		// shed: index of an earlier step whose request this one sheds
		// (-1: none).
		shed int
	}
	for _, tc := range []struct {
		name     string
		capacity int
		steps    []step
		want     map[string]int // held at the end, "" all
	}{
		{
			name: "admits up to capacity, then refuses the same namespace", capacity: 3,
			steps: []step{{"a", nil, -1}, {"a", nil, -1}, {"a", nil, -1}, {"a", ErrFull, -1}},
			want:  map[string]int{"": 3, "a": 3},
		},
		{
			name: "a flood to capacity makes room for another namespace, newest first", capacity: 4,
			steps: []step{{"a", nil, -1}, {"a", nil, -1}, {"a", nil, -1}, {"a", nil, -1}, {"b", nil, 3}, {"b", nil, 2},
				// b now holds its share (4/2): refused; so is a, at its share.
				{"b", ErrFull, -1}, {"a", ErrFull, -1}},
			want: map[string]int{"": 4, "a": 2, "b": 2},
		},
		{
			name: "three namespaces share max-min", capacity: 3,
			steps: []step{{"a", nil, -1}, {"a", nil, -1}, {"b", nil, -1}, {"c", nil, 1}, {"c", ErrFull, -1}, {"b", ErrFull, -1}},
			want:  map[string]int{"": 3, "a": 1, "b": 1, "c": 1},
		},
		{
			name: "no exchange that changes nothing", capacity: 3,
			// a 2, b 1: b's second would make it b 2, a 1: refused.
			steps: []step{{"a", nil, -1}, {"a", nil, -1}, {"b", nil, -1}, {"b", ErrFull, -1}},
			want:  map[string]int{"": 3, "a": 2, "b": 1},
		},
		{
			name: "more namespaces than capacity", capacity: 1,
			steps: []step{{"a", nil, -1}, {"b", ErrFull, -1}},
			want:  map[string]int{"": 1, "a": 1, "b": 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			p := New(Options{Capacity: tc.capacity, Registerer: reg})
			ctxs := make([]context.Context, len(tc.steps))
			tickets := make([]*Ticket, len(tc.steps))
			wantShed := map[int]bool{}
			for i, s := range tc.steps {
				ctx, tk, err := p.Hold(context.Background(), s.ns)
				if !errors.Is(err, s.wantErr) || (s.wantErr == nil) != (err == nil) {
					t.Fatalf("step %d: Hold(%q) = %v, want %v", i, s.ns, err, s.wantErr)
				}
				ctxs[i], tickets[i] = ctx, tk
				if s.shed >= 0 {
					wantShed[s.shed] = true
				}
			}
			gotShed := map[int]bool{}
			for i, ctx := range ctxs {
				if ctx == nil {
					continue
				}
				if cause := context.Cause(ctx); cause != nil {
					if !errors.Is(cause, ErrShed) {
						t.Errorf("step %d: context ended by %v, want ErrShed", i, cause)
					}
					if err := tickets[i].Release(); !errors.Is(err, ErrShed) {
						t.Errorf("step %d: shed request's Release = %v, want ErrShed", i, err)
					}
					gotShed[i] = true
				}
			}
			if diff := cmp.Diff(wantShed, gotShed); diff != "" {
				t.Errorf("requests shed (step index) -want +got:\n%s", diff)
			}
			var namespaces []string
			for ns := range tc.want {
				if ns != "" {
					namespaces = append(namespaces, ns)
				}
			}
			if diff := cmp.Diff(tc.want, heldBy(p, namespaces...)); diff != "" {
				t.Errorf("held -want +got:\n%s", diff)
			}
			if got, want := testutil.ToFloat64(p.m.held), float64(tc.want[""]); got != want {
				t.Errorf("held gauge %v, want %v", got, want)
			}
			wantRefused := 0
			for _, s := range tc.steps {
				if s.wantErr != nil {
					wantRefused++
				}
			}
			if diff := cmp.Diff(map[string]float64{ReasonFull: float64(wantRefused), ReasonShed: float64(len(wantShed))}, map[string]float64{
				ReasonFull: testutil.ToFloat64(p.m.refusals.WithLabelValues(ReasonFull)),
				ReasonShed: testutil.ToFloat64(p.m.refusals.WithLabelValues(ReasonShed)),
			}); diff != "" {
				t.Errorf("refusals by reason -want +got:\n%s", diff)
			}
			// Releasing every ticket empties the pool.
			for _, tk := range tickets {
				if tk != nil {
					_ = tk.Release()
				}
			}
			if diff := cmp.Diff(map[string]int{"": 0}, heldBy(p)); diff != "" {
				t.Errorf("after releasing all, held -want +got:\n%s", diff)
			}
			if n := len(p.byNS); n != 0 {
				t.Errorf("%d namespaces left in the pool after releasing all", n)
			}
		})
	}
}

func TestReleaseFreesAPlace(t *testing.T) {
	p := New(Options{Capacity: 1})
	_, first, err := p.Hold(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Hold(context.Background(), "a"); !errors.Is(err, ErrFull) {
		t.Fatalf("second Hold at capacity 1 = %v, want ErrFull", err)
	}
	for range 2 { // twice: Release is idempotent
		if err := first.Release(); err != nil {
			t.Fatalf("Release = %v, want nil", err)
		}
	}
	if got := p.Held(""); got != 0 {
		t.Fatalf("held %d after Release, want 0", got)
	}
	if _, _, err := p.Hold(context.Background(), "a"); err != nil {
		t.Fatalf("Hold after Release = %v, want admitted", err)
	}
}

// A request whose client leaves releases its place with a deferred
// Release, as the handler does; its context ends with the client's.
func TestCancelledRequestFreesAPlace(t *testing.T) {
	p := New(Options{Capacity: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		hctx, tk, err := p.Hold(ctx, "a")
		if err != nil {
			t.Error(err)
			return
		}
		defer tk.Release()
		<-hctx.Done() // waiting, as in the throttle
	}()
	for p.Held("") == 0 {
		time.Sleep(100 * time.Microsecond) // until the request is held
		select {
		case <-done:
			t.Fatal("request ended before being held")
		default:
		}
	}
	cancel()
	<-done
	if got := p.Held(""); got != 0 {
		t.Fatalf("held %d after the client left, want 0", got)
	}
}

// Many namespaces holding, shedding and releasing at once leave nothing
// behind (run with -race).
func TestConcurrentUseLeaksNothing(t *testing.T) {
	p := New(Options{Capacity: 16})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			ns := fmt.Sprintf("ns%d", g%3)
			for range 500 {
				hctx, tk, err := p.Hold(context.Background(), ns)
				if err != nil {
					if !errors.Is(err, ErrFull) {
						t.Errorf("Hold = %v", err)
					}
					continue
				}
				if n := p.Held(""); n > p.Capacity() {
					t.Errorf("held %d > capacity %d", n, p.Capacity())
				}
				if err := tk.Release(); err != nil && (!errors.Is(err, ErrShed) || !errors.Is(context.Cause(hctx), ErrShed)) {
					t.Errorf("Release = %v, context cause %v", err, context.Cause(hctx))
				}
			}
		})
	}
	wg.Wait()
	if got, n := p.Held(""), len(p.byNS); got != 0 || n != 0 {
		t.Fatalf("after every request ended: held %d in %d namespaces, want none", got, n)
	}
	if got := testutil.ToFloat64(p.m.held); got != 0 {
		t.Fatalf("held gauge %v, want 0", got)
	}
}

func TestCapacityFor(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		want  int
	}{
		{0, DefaultCapacity},
		{256 << 20, 1365}, // the chart's limit: 128 MiB / 96 KiB
		{1 << 30, 5461},
		{64 << 10, 1}, // smaller than one request: still one
	} {
		if got := CapacityFor(tc.limit); got != tc.want {
			t.Errorf("CapacityFor(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}
