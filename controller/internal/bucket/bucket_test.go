package bucket

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/kubernetes/fake"
)

func TestAssignSpreadsEvenlyAndTakesOrphans(t *testing.T) {
	none := make([]bool, 6)
	for _, c := range []struct {
		name    string
		count   int
		members []string
		self    string
		orphan  []bool
		want    []int
	}{
		{"alone: every bucket", 4, []string{"a"}, "a", none[:4], []int{0, 1, 2, 3}},
		{"first of two", 4, []string{"a", "b"}, "a", none[:4], []int{0, 2}},
		{"second of two", 4, []string{"a", "b"}, "b", none[:4], []int{1, 3}},
		{"three over five: 2, 2, 1", 5, []string{"a", "b", "c"}, "c", none[:5], []int{2}},
		{"more members than buckets: none", 2, []string{"a", "b", "c"}, "c", none[:2], nil},
		{"an orphan is taken by anyone", 4, []string{"a", "b"}, "a", []bool{false, true, false, false}, []int{0, 1, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []int
			for i, w := range assign(c.count, c.members, c.self, c.orphan) {
				if w {
					got = append(got, i)
				}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("assign (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNilSetOwnsEverything(t *testing.T) {
	var s *Set
	if !s.Owns("default", "hello") || s.Count() != 1 || !s.Holds(0) {
		t.Errorf("a nil Set (no buckets) must own every target: Owns %v, Count %d", s.Owns("default", "hello"), s.Count())
	}
	if h := s.Header(); h != "" {
		t.Errorf("a nil Set's stats header is %q, want none (every record is for it)", h)
	}
}

func TestNewRejectsBadCounts(t *testing.T) {
	for _, count := range []int{-1, 0, 1, MaxCount + 1} {
		_, err := New(Options{Count: count, Namespace: "ns", Identity: "me"})
		if err == nil {
			t.Errorf("New(Count=%d) accepted, want an error naming 2..%d", count, MaxCount)
		} else if want := fmt.Sprintf("buckets %d: want 2..%d", count, MaxCount); err.Error()[:len(want)] != want {
			t.Errorf("New(Count=%d) = %q, want it to start %q", count, err, want)
		}
	}
}

// TestGiveAwayWaitsForWorkInTheBucket: a bucket given away is not owned
// at once (Owns and Enter say no), but its Lease is released only when
// the work that entered before has left, or after RenewDeadline.
func TestGiveAwayWaitsForWorkInTheBucket(t *testing.T) {
	for _, c := range []struct {
		name  string
		leave bool // the work leaves after 100 ms; else never
	}{{"released when the work leaves", true}, {"released after RenewDeadline when it does not", false}} {
		t.Run(c.name, func(t *testing.T) {
			const renew = 400 * time.Millisecond
			s, err := New(Options{Count: 2, Namespace: "ns", Identity: "me", Leases: fake.NewClientset().CoordinationV1(), Log: logr.Discard(), RenewDeadline: renew})
			if err != nil {
				t.Fatal(err)
			}
			target := "t0"
			for i := 1; Of("ns", target, 2) != 0; i++ {
				target = fmt.Sprintf("t%d", i)
			}
			released := make(chan struct{})
			s.mu.Lock()
			s.bids[0] = &bid{cancel: func() { close(released) }, done: make(chan struct{})}
			s.mark(0, true)
			s.mu.Unlock()

			leave, ok := s.Enter("ns", target)
			if !ok {
				t.Fatal("Enter: a target of a held bucket is not owned")
			}
			start := time.Now()
			s.mu.Lock()
			s.stopBid(0)
			s.mu.Unlock()
			if s.Owns("ns", target) {
				t.Error("Owns: a bucket given away is still owned")
			}
			if _, ok := s.Enter("ns", target); ok {
				t.Error("Enter: a bucket given away can still be entered")
			}
			select {
			case <-released:
				t.Fatal("the Lease was released with work still in the bucket")
			case <-time.After(100 * time.Millisecond):
			}
			if c.leave {
				leave()
			}
			select {
			case <-released:
			case <-time.After(5 * time.Second):
				t.Fatal("the Lease was not released")
			}
			waited := time.Since(start)
			if !c.leave && waited < renew {
				t.Errorf("released after %v, before RenewDeadline %v with the work still in", waited, renew)
			}
			if c.leave && waited >= renew {
				t.Errorf("released after %v: the work left after 100 ms", waited)
			}
		})
	}
}
