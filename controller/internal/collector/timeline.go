package collector

import (
	"math"
	"time"
)

// load is what one report says over the period it covers: the
// concurrency that counts for the target (a pod's without what came
// through activators, which report it themselves) and the requests; for a
// pod, also its whole concurrency and the part of that on connections
// counted per connection (stats.PodStat.OpaqueConcurrency), which only
// the target's accounting reads.
type load struct {
	concurrency, requests             float64
	podConcurrency, opaqueConcurrency float64
}

// spread places one report of src, of period p arriving at now, on the
// timeline (see Collector): concurrency*p of area (of each kind in l) and the requests over
// the interval it covers, each second getting its share. For an expected
// pod (exp not nil) the seconds it is expected in also count what it
// covered as heard.
//
// A report that does not follow on from the source's previous one (its
// first, or one after a gap: a lost post, a restart) covers
// [max(src.until, now-p), now), and the gap goes to the missing-data
// rules.
//
// A report that follows on from the previous one on the reporter's own
// clock (follows) covers the next p of the source's timeline,
// [src.until, src.until+p), whenever it arrives, as long as the source
// was not yet missing (StaleAfter). So the source's reports sit at their
// reporter's own spacing, shifted by the smallest delivery delay seen so
// far, and jitter in delivery moves no load between seconds. Covering up
// to the arrival instead, a report 0.15 s late stretched its second over
// 1.15 s and the next, prompt one crowded its second into 0.85 s: in a CI
// run whose test agent posts up to a few hundred ms after each second, a
// pod at a steady 210 in flight (3.0 pods' worth) read 248.6 in the first
// seconds and its target went to 4 pods. What a report covers reads its
// concurrency and its requests' rate, whatever the length, and three
// bounds keep it next to the arrivals:
//   - it cannot end after it arrived: a delay smaller than any before
//     moves the shift down, and that report covers less than its period
//     (the time it would cover twice);
//   - one that ends before its arrival moves up by at most lagCreep, so a
//     delay that grew for good, or a reporter's clock slower than ours,
//     is caught up on slowly (lagCreep a second is 0.1 %);
//   - it ends no more than maxLag before its arrival, so a source never
//     holds back the seconds others complete by more than that.
func (t *target) spread(src *source, at time.Time, p time.Duration, follows bool, l load, exp *expectedPod) {
	// Nanoseconds since 1970 throughout: this runs for every pod of every
	// agent every second.
	const second = int64(time.Second)
	now := at.UnixNano()
	fresh := src.until == 0
	from, end := max(now-int64(p), src.until), now
	area, span := l.concurrency*p.Seconds(), float64(0)
	podArea, opaqueArea := l.podConcurrency*p.Seconds(), l.opaqueConcurrency*p.Seconds()
	if follows && !fresh && now-src.heard <= int64(StaleAfter) {
		from = src.until
		end = max(min(from+int64(p)+int64(lagCreep), now), now-int64(maxLag))
		span = float64(p) // its rates, over however long it covers
	}
	if from >= end { // a second report at the same instant, or our clock stepped back
		from, span = end-1, 0
	}
	if span == 0 {
		span = float64(end - from) // all it says, within what it covers
	}
	src.until, src.heard = end, now
	first := floorDiv(from, second)
	if !t.ring.Written() {
		t.started = at
	}
	if fresh && at.Sub(t.started) <= StaleAfter {
		// A cold start (the collector's, or the target's first reports):
		// the sources' first reports start at their own phases, so the
		// seconds before the last of those starts are covered only in
		// part and must not read as light ones.
		whole := first
		if from%second != 0 {
			whole++
		}
		t.since = max(t.since, whole)
	}
	// Seconds older than the ring cannot be written (At returns nil).
	last := floorDiv(end-1, second)
	first = max(first, last-int64(t.ring.Len()))
	for sec := first; sec <= last; sec++ {
		overlap := float64(min(end, (sec+1)*second) - max(from, sec*second))
		b := t.ring.At(sec)
		if b == nil || overlap <= 0 {
			continue
		}
		c, r := area*overlap/span, l.requests*overlap/span
		b.concurrency += c
		b.requests += r
		b.podConcurrency += podArea * overlap / span
		b.opaqueConcurrency += opaqueArea * overlap / span
		if exp != nil && exp.from <= sec && sec <= exp.until {
			b.heardConcurrency += c
			b.heardRequests += r
			b.heard += overlap / float64(second)
		}
	}
}

// floorDiv is a/b rounded down (also for a < 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// newestComplete is the newest second every live source has reported
// past, or the poke's second when a poke came after it. The sources waited
// for are the activators and the ready pods (every pod until the
// collector is told which are ready): a pod that left the ready set may be
// gone, and its silence must not hold the window back.
func (t *target) newestComplete(now time.Time) int64 {
	frontier := now.UnixNano()
	live := func(s *source) {
		if now.UnixNano()-s.heard <= int64(StaleAfter) && s.until < frontier {
			frontier = s.until
		}
	}
	for _, p := range t.pods {
		if !t.told || p.isExpected && p.expected.until == math.MaxInt64 {
			live(&p.src)
		}
	}
	for _, s := range t.activators {
		live(s)
	}
	newest := floorDiv(frontier, int64(time.Second)) - 1
	if p := t.poked.Unix(); !t.poked.IsZero() && p > newest && !t.poked.After(now) {
		newest = p
	}
	return newest
}

// prune forgets sources silent for longer than the window (nothing they
// said still counts) and pods expected only before it, and drops the
// entries of pods that are then neither reporting, expected nor members.
func (t *target) prune(now time.Time) {
	limit := time.Duration(t.ring.Len())*time.Second + StaleAfter
	oldest := now.Unix() - int64(t.ring.Len())
	for ip, p := range t.pods {
		if now.UnixNano()-p.src.heard > int64(limit) {
			p.src = source{}
		}
		if p.isExpected && p.expected.until < oldest {
			p.expected, p.isExpected = expectedPod{}, false
		}
		if p.src.heard == 0 && !p.isExpected && !p.member {
			delete(t.pods, ip)
		}
	}
	for name, s := range t.activators {
		if now.UnixNano()-s.heard > int64(limit) {
			delete(t.activators, name)
		}
	}
	// Changes before the ring's oldest second are in the base now.
	for len(t.changes) > 0 && t.changes[0].from <= oldest {
		t.base += t.changes[0].delta
		t.changes = t.changes[1:]
	}
}
