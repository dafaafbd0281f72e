package collector

import (
	"math"
	"time"
)

// spread places one report of src, of period p arriving at now, on the
// timeline (see Collector): concurrency*p of area and the requests over
// [max(src.until, now-p), now), each second getting its share. For an
// expected pod (exp not nil) the seconds it is expected in also count
// what it covered as heard.
func (t *target) spread(src *source, now time.Time, p time.Duration, concurrency, requests float64, exp *expectedPod) {
	fresh := src.until.IsZero()
	from := now.Add(-p)
	if src.until.After(from) {
		from = src.until
	}
	if !now.After(from) { // a second report at the same instant
		from = now.Add(-time.Nanosecond)
	}
	src.until = now
	area, span := concurrency*p.Seconds(), float64(now.Sub(from))
	first := from.Unix()
	if !t.ring.Written() {
		t.started = now
	}
	if fresh && now.Sub(t.started) <= StaleAfter {
		// A cold start (the collector's, or the target's first reports):
		// the sources' first reports start at their own phases, so the
		// seconds before the last of those starts are covered only in
		// part and must not read as light ones.
		whole := first
		if from.Nanosecond() != 0 {
			whole++
		}
		t.since = max(t.since, whole)
	}
	// Seconds older than the ring cannot be written (At returns nil).
	first = max(first, now.Unix()-int64(t.ring.Len()))
	for sec := first; sec <= now.Add(-time.Nanosecond).Unix(); sec++ {
		start, end := time.Unix(sec, 0), time.Unix(sec+1, 0)
		overlap := float64(minTime(end, now).Sub(maxTime(start, from)))
		b := t.ring.At(sec)
		if b == nil || overlap <= 0 {
			continue
		}
		c, r := area*overlap/span, requests*overlap/span
		b.concurrency += c
		b.requests += r
		if exp != nil && exp.from <= sec && sec <= exp.until {
			b.heardConcurrency += c
			b.heardRequests += r
			b.heard += overlap / float64(time.Second)
		}
	}
}

// newestComplete is the newest second every live source has reported
// past, or the poke's second when a poke came after it. The sources waited
// for are the activators and the ready pods (every pod until the
// collector is told which are ready): a pod that left the ready set may be
// gone, and its silence must not hold the window back.
func (t *target) newestComplete(now time.Time) int64 {
	frontier := now
	live := func(s *source) {
		if now.Sub(s.until) <= StaleAfter && s.until.Before(frontier) {
			frontier = s.until
		}
	}
	for ip, s := range t.pods {
		if e := t.expected[ip]; !t.told || e != nil && e.until == math.MaxInt64 {
			live(s)
		}
	}
	for _, s := range t.activators {
		live(s)
	}
	newest := frontier.Unix() - 1
	if p := t.poked.Unix(); !t.poked.IsZero() && p > newest && !t.poked.After(now) {
		newest = p
	}
	return newest
}

// prune forgets sources silent for longer than the window: nothing they
// said still counts.
func (t *target) prune(now time.Time) {
	limit := time.Duration(t.ring.Len())*time.Second + StaleAfter
	for ip, s := range t.pods {
		if now.Sub(s.until) > limit {
			delete(t.pods, ip)
		}
	}
	for name, s := range t.activators {
		if now.Sub(s.until) > limit {
			delete(t.activators, name)
		}
	}
	oldest := now.Unix() - int64(t.ring.Len())
	for ip, e := range t.expected {
		if e.until < oldest {
			delete(t.expected, ip)
		}
	}
	// Changes before the ring's oldest second are in the base now.
	for len(t.changes) > 0 && t.changes[0].from <= oldest {
		t.base += t.changes[0].delta
		t.changes = t.changes[1:]
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
