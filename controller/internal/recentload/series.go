package recentload

import "math"

// bucketsPerWindow is how many buckets a window is cut into (a 60 s
// window has buckets of 5 s, a 10 min one of 50 s). A series keeps one
// more, ringLength, for the bucket being filled now: a read covers it and
// the 12 complete ones before it.
const (
	bucketsPerWindow = 12
	ringLength       = bucketsPerWindow + 1
)

// bucket holds what one source reported about one bucket of time: the
// time integral of its requests in flight (request-seconds), the part of
// it proxied by activators, its requests and the proxied part of them, and
// how many seconds its reports covered. float32 keeps a bucket at 20
// bytes: its 24 bits of mantissa hold a bucket's sums (at most a few
// thousand reports of a few thousand requests) to 7 digits.
type bucket struct {
	heard                           float32
	concurrency, proxiedConcurrency float32
	requests, proxiedRequests       float32
}

func (b *bucket) add(o bucket) {
	b.heard += o.heard
	b.concurrency += o.concurrency
	b.proxiedConcurrency += o.proxiedConcurrency
	b.requests += o.requests
	b.proxiedRequests += o.proxiedRequests
}

// report is one period's record of a source: averages over the period
// (concurrency) and counts (requests), as the wire carries them.
type report struct {
	concurrency, proxiedConcurrency float64
	requests, proxiedRequests       float64
}

// active: requests were in flight or completed (arrived, for an
// activator) in the period.
func (r report) active() bool { return r.concurrency > 0 || r.requests > 0 }

// series is one source's ring of buckets (a pod's, or an activator's for
// one target) and its latest report. Times are nanoseconds since the
// store's epoch; bucket k covers [k*width, (k+1)*width).
//
// The fields are ordered, and head is an int32, so that a pod's entry
// fits 320 bytes (see pod). An int32 of buckets of at least 0.5 s lasts
// 34 years from the store's start.
type series struct {
	// heard is the arrival of the latest report.
	heard int64
	// head is the index of the newest bucket the ring holds; the ring
	// holds head-12 to head.
	head int32
	// latest is the latest report's concurrency (for a pod, without the
	// proxied part); latestActive says whether it was active.
	latest       float32
	buckets      [ringLength]bucket
	latestActive bool
}

// newSeries returns an empty series: its first bucket clears the ring.
func newSeries() series { return series{head: math.MinInt32} }

// record adds a report that arrived at to and covered [from, to) of a
// period of period nanoseconds (from is later than to-period when the
// period is longer than the window): its concurrency integral and heard
// time go to the buckets it overlaps in proportion, and so do its
// requests, as the share of the whole period each overlap is.
func (s *series) record(from, to, period, width int64, r report) {
	for k := floorDiv(from, width); k*width < to; k++ {
		lo, hi := max(from, k*width), min(to, (k+1)*width)
		if hi <= lo {
			continue
		}
		b := s.bucket(k)
		if b == nil {
			continue
		}
		seconds := float64(hi-lo) / 1e9
		share := float64(hi-lo) / float64(period)
		b.add(bucket{
			heard:       float32(seconds),
			concurrency: float32(r.concurrency * seconds), proxiedConcurrency: float32(r.proxiedConcurrency * seconds),
			requests: float32(r.requests * share), proxiedRequests: float32(r.proxiedRequests * share),
		})
	}
	if to >= s.heard {
		s.heard = to
		s.latest = float32(max(0, r.concurrency-r.proxiedConcurrency))
		s.latestActive = r.active()
	}
}

// bucket returns the bucket of index k, moving the ring on to it (and
// clearing the buckets it passes) when k is newer than head; nil when k
// is older than the ring holds.
func (s *series) bucket(k int64) *bucket {
	head := int64(s.head)
	if k > head {
		if k-head >= ringLength {
			clear(s.buckets[:])
		} else {
			for i := head + 1; i <= k; i++ {
				s.buckets[ringIndex(i)] = bucket{}
			}
		}
		head = k
		s.head = int32(k)
	}
	if k <= head-ringLength {
		return nil
	}
	return &s.buckets[ringIndex(k)]
}

// sum adds up what a read in bucket n covers: buckets n-12 to n, those
// the ring still holds.
func (s *series) sum(n int64) bucket {
	var total bucket
	head := int64(s.head)
	for k := max(n, head) - ringLength + 1; k <= min(n, head); k++ {
		total.add(s.buckets[ringIndex(k)])
	}
	return total
}

// reset forgets every report.
func (s *series) reset() { *s = newSeries() }

func ringIndex(k int64) int {
	i := k % ringLength
	if i < 0 {
		i += ringLength
	}
	return int(i)
}

// floorDiv is a/b rounded down (a may be negative: reports that began
// before the store's epoch).
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
