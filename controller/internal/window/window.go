package window

import (
	"fmt"
	"math"
	"time"
)

// Ring is a ring of 1-second buckets of T, keyed by Unix second, covering
// the last Len seconds up to the newest bucket written. What a bucket
// holds and how a second's value is read from it is the caller's: the
// collector keeps per-second sums there and turns them into the values
// that Linear and WeightedExponential average.
//
// Every method takes the second explicitly; nothing reads a clock. A Ring
// is not safe for concurrent use.
type Ring[T any] struct {
	buckets []T
	// first and last are the oldest and the newest second written; valid
	// only when written is true.
	first, last int64
	written     bool
}

// New returns a ring for a window of length (whole seconds, 1s to 24h).
func New[T any](length time.Duration) (*Ring[T], error) {
	n, err := seconds(length)
	if err != nil {
		return nil, err
	}
	return &Ring[T]{buckets: make([]T, n)}, nil
}

func seconds(d time.Duration) (int, error) {
	if d < time.Second || d%time.Second != 0 || d > 24*time.Hour {
		return 0, fmt.Errorf("window %v: must be whole seconds between 1s and 24h", d)
	}
	return int(d / time.Second), nil
}

// Len is how many seconds the ring holds.
func (r *Ring[T]) Len() int { return len(r.buckets) }

func (r *Ring[T]) slot(sec int64) int {
	n := int64(len(r.buckets))
	return int(((sec % n) + n) % n)
}

// At returns the bucket of sec for writing. Writing a second after the
// newest moves the ring forward: the seconds in between start as the zero
// T. The first write fixes the ring's first second; At returns nil for a
// second before it or older than the ring holds (nothing to write to).
func (r *Ring[T]) At(sec int64) *T {
	n := int64(len(r.buckets))
	switch {
	case !r.written:
		clear(r.buckets)
		r.first, r.last, r.written = sec, sec, true
	case sec > r.last:
		if sec-r.last >= n {
			clear(r.buckets)
		} else {
			var zero T
			for s := r.last + 1; s <= sec; s++ {
				r.buckets[r.slot(s)] = zero
			}
		}
		r.last = sec
	case sec < r.first || sec <= r.last-n:
		return nil
	}
	return &r.buckets[r.slot(sec)]
}

// Get returns the bucket of sec for reading and whether sec counts: it is
// at or after the first second written and within the ring's reach of
// the newest. A second after the newest counts and is the zero T (nothing
// was written for it).
func (r *Ring[T]) Get(sec int64) (T, bool) {
	var zero T
	if !r.written || sec < r.first || sec <= r.last-int64(len(r.buckets)) {
		return zero, false
	}
	if sec > r.last {
		return zero, true
	}
	return r.buckets[r.slot(sec)], true
}

// Written reports whether anything was written since New or Reset.
func (r *Ring[T]) Written() bool { return r.written }

// Reset empties the ring: the next write is its first.
func (r *Ring[T]) Reset() { r.written = false }

// Resize changes how many seconds the ring holds, keeping the newest
// that still fit.
func (r *Ring[T]) Resize(length time.Duration) error {
	n, err := seconds(length)
	if err != nil {
		return err
	}
	if n == len(r.buckets) {
		return nil
	}
	buckets := make([]T, n)
	if r.written {
		for sec := r.last; sec > r.last-int64(min(n, len(r.buckets))); sec-- {
			buckets[int(((sec%int64(n))+int64(n))%int64(n))] = r.buckets[r.slot(sec)]
		}
	}
	r.buckets = buckets
	return nil
}

// NoData marks a second without a value in what Linear and
// WeightedExponential average: such a second is left out, neither a zero
// nor a second of the divisor.
var NoData = math.NaN()

// Linear is the mean of the seconds that have a value (values newest
// first; NoData left out). ok is false when none has. Example: 4, NoData,
// 8 => (4 + 8) / 2 = 6.
func Linear(values []float64) (avg float64, ok bool) {
	var sum float64
	count := 0
	for _, v := range values {
		if !math.IsNaN(v) {
			sum += v
			count++
		}
	}
	if count == 0 {
		return 0, false
	}
	return sum / float64(count), true
}

// WeightedExponential weighs newer seconds more (values newest first): the
// second of age k weighs a*(1-a)^k with a = max(1 - (1-0.9999)^(1/n), 0.2)
// for a window of n seconds, and the weights of the seconds that have a
// value are normalised to sum to 1. For a 60 s window a = 0.2, so the
// newest second weighs 20 % and one a minute old ~0.0003 %.
func WeightedExponential(values []float64, n int) (avg float64, ok bool) {
	if n < 1 {
		return 0, false
	}
	a := math.Max(1-math.Pow(1-0.9999, 1/float64(n)), 0.2)
	var sum, weights float64
	w := a
	for _, v := range values {
		if !math.IsNaN(v) {
			sum += w * v
			weights += w
		}
		w *= 1 - a
	}
	if weights == 0 {
		return 0, false
	}
	return sum / weights, true
}
