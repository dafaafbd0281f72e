package window

import (
	"fmt"
	"math"
	"time"
)

// Buckets is a ring of 1-second buckets covering the last Length seconds.
// Values recorded for the same second are summed (a second's samples from
// every pod and activator of a target add up). A shorter window (the panic
// window) is a suffix of the same ring.
//
// Every method takes the time explicitly; nothing reads a clock. Buckets is
// not safe for concurrent use.
type Buckets struct {
	values []float64
	// first and last are the Unix seconds of the first and the newest
	// write; valid only when written is true.
	first, last int64
	written     bool
}

// New returns buckets for a window of length (whole seconds, at least 1s).
func New(length time.Duration) (*Buckets, error) {
	n, err := seconds(length)
	if err != nil {
		return nil, err
	}
	return &Buckets{values: make([]float64, n)}, nil
}

func seconds(d time.Duration) (int, error) {
	if d < time.Second || d%time.Second != 0 || d > 24*time.Hour {
		return 0, fmt.Errorf("window %v: must be whole seconds between 1s and 24h", d)
	}
	return int(d / time.Second), nil
}

// Length is the longest window the buckets average over.
func (b *Buckets) Length() time.Duration { return time.Duration(len(b.values)) * time.Second }

func (b *Buckets) slot(sec int64) int {
	n := int64(len(b.values))
	return int(((sec % n) + n) % n)
}

// Record adds v to the bucket of t's second. A value older than the ring
// is dropped.
func (b *Buckets) Record(t time.Time, v float64) {
	sec := t.Unix()
	n := int64(len(b.values))
	switch {
	case !b.written:
		clear(b.values)
		b.first, b.last, b.written = sec, sec, true
	case sec > b.last:
		// The seconds since the newest write start empty: they hold what
		// was there a ring ago.
		if sec-b.last >= n {
			clear(b.values)
		} else {
			for s := b.last + 1; s <= sec; s++ {
				b.values[b.slot(s)] = 0
			}
		}
		b.last = sec
	case sec <= b.last-n:
		return // older than anything the ring holds
	}
	if sec < b.first {
		b.first = sec
	}
	b.values[b.slot(sec)] += v
}

// Written reports whether anything was ever recorded ("no data" if not).
func (b *Buckets) Written() bool { return b.written }

// Average is the mean per second over the window of the given length
// ending with now's second: the sum of its buckets divided by the number of
// its seconds since the first write (so right after a cold start it
// averages over the seconds that exist). ok is false if nothing was ever
// recorded. A window without any write in it averages 0.
//
// Example: first write at 10 s, values 4 at 10 s and 8 at 11 s, now 11 s,
// window 60 s: (4 + 8) / 2 seconds = 6.
func (b *Buckets) Average(now time.Time, length time.Duration) (avg float64, ok bool) {
	sum, count := b.fold(now, length, func(_ int, v float64) float64 { return v })
	if count == 0 {
		return 0, b.written
	}
	return sum / float64(count), true
}

// WeightedAverage weighs newer seconds more: the second k seconds before
// now's second weighs a*(1-a)^k with a = max(1 - (1-0.9999)^(1/n), 0.2) for
// a window of n seconds, and the weights of the seconds that exist are
// normalised to sum to 1. For a 60 s window a = 0.2, so the newest second
// weighs 20 % and one a minute old ~0.0003 %.
func (b *Buckets) WeightedAverage(now time.Time, length time.Duration) (avg float64, ok bool) {
	n := min(int(length/time.Second), len(b.values))
	if n < 1 {
		return 0, b.written
	}
	a := math.Max(1-math.Pow(1-0.9999, 1/float64(n)), 0.2)
	var weights float64
	sum, count := b.fold(now, length, func(age int, v float64) float64 {
		w := a * math.Pow(1-a, float64(age))
		weights += w
		return w * v
	})
	if count == 0 || weights == 0 {
		return 0, b.written
	}
	return sum / weights, true
}

// fold applies f to each second of the window that is at or after the
// first write (age 0 is now's second) and returns the sum of f and how many
// seconds there were.
func (b *Buckets) fold(now time.Time, length time.Duration, f func(age int, v float64) float64) (sum float64, count int) {
	if !b.written {
		return 0, 0
	}
	n := min(int(length/time.Second), len(b.values))
	nowSec := now.Unix()
	for age := range n {
		sec := nowSec - int64(age)
		if sec < b.first {
			break
		}
		v := 0.0
		// A bucket is current if its second is within the ring behind the
		// newest write; later seconds have had no write yet.
		if sec <= b.last && sec > b.last-int64(len(b.values)) {
			v = b.values[b.slot(sec)]
		}
		sum += f(age, v)
		count++
	}
	return sum, count
}

// Resize changes the ring's length, keeping what still fits.
func (b *Buckets) Resize(length time.Duration) error {
	n, err := seconds(length)
	if err != nil {
		return err
	}
	if n == len(b.values) {
		return nil
	}
	values := make([]float64, n)
	if b.written {
		for sec := b.last; sec > b.last-int64(min(n, len(b.values))); sec-- {
			values[int(((sec%int64(n))+int64(n))%int64(n))] = b.values[b.slot(sec)]
		}
	}
	b.values = values
	return nil
}
