package bucket

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
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
