package bucket

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOfIsFixedAndSpreads(t *testing.T) {
	// The bucket of a target never changes (it is what moves with a
	// Lease): values pinned from FNV-1a computed apart from this code,
	// so that a change of hash is a visible, deliberate break of every
	// running cluster's split.
	for _, c := range []struct {
		ns, name string
		count    int
		want     int
	}{
		{"default", "hello", 4, 1},
		{"default", "hello", 64, 1},
		{"prod", "api", 8, 3},
		{"default", "hello", 1, 0},
	} {
		if got := Of(c.ns, c.name, c.count); got != c.want {
			t.Errorf("Of(%s, %s, %d) = %d, want %d", c.ns, c.name, c.count, got, c.want)
		}
	}
	// 10,000 targets over 8 buckets: each within 10 % of its share.
	const n, count = 10000, 8
	per := make([]int, count)
	for i := range n {
		per[Of(fmt.Sprintf("ns-%d", i/100), fmt.Sprintf("t-%d", i), count)]++
	}
	for b, got := range per {
		if got < n/count*9/10 || got > n/count*11/10 {
			t.Errorf("bucket %d has %d of %d targets, want %d +- 10 %%: %v", b, got, n, n/count, per)
		}
	}
}

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
	if !s.Predicate().Generic(eventFor("default", "hello")) {
		t.Error("a nil Set's predicate must let every event through")
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
