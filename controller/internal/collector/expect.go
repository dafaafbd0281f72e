package collector

import (
	"math"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/window"
)

// Expect tells the collector which ready pods a target has now: their
// addresses and nodes (the private Service's ready endpoints). Unwatched
// targets are ignored. A pod is expected in the seconds it was ready for
// whole: one that became ready during this second from the next, one that
// stopped being ready no longer in this one (it may be gone already).
// Example: pod c leaves and pod d joins at 20.5 s: second 20 expects
// neither, second 21 expects d; both pods' load counts as reported.
func (c *Collector) Expect(key Key, pods map[netip.Addr]string) {
	now := c.clock.Now().Unix()
	t := c.target(key)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.told = true
	ready := make(map[addrKey]string, len(pods))
	for a, node := range pods {
		if ip, ok := addrKeyOf(a); ok {
			ready[ip] = node
		}
	}
	for ip, p := range t.pods {
		if _, ok := ready[ip]; !ok && p.isExpected && p.expected.until == math.MaxInt64 {
			p.expected.until = now - 1
			t.change(now, -1)
		}
	}
	for ip, node := range ready {
		p := t.podAt(ip)
		if p.isExpected && p.expected.until == math.MaxInt64 {
			p.expected.node = node
			continue
		}
		p.expected, p.isExpected = expectedPod{node: node, from: now + 1, until: math.MaxInt64}, true
		t.change(now+1, +1)
	}
}

// change records that from second from on, delta more pods are expected.
func (t *target) change(from int64, delta int) {
	i := sort.Search(len(t.changes), func(i int) bool { return t.changes[i].from > from })
	if i > 0 && t.changes[i-1].from == from {
		t.changes[i-1].delta += delta
		return
	}
	t.changes = slices.Insert(t.changes, i, change{from, delta})
}

// expectedAt is how many ready pods were expected in second sec (0
// before the first Expect: whatever reported counts as it is).
func (t *target) expectedAt(sec int64) int {
	n := t.base
	for _, c := range t.changes {
		if c.from > sec {
			break
		}
		n += c.delta
	}
	return n
}

// value is one complete second's value of the metric: what was reported,
// completed for expected pods that were not heard (see Collector), or
// window.NoData when too few were heard.
func (t *target) value(sec int64, b second) float64 {
	total, heardPart := b.concurrency, b.heardConcurrency
	if t.settings.Metric == config.MetricRPS {
		total, heardPart = b.requests, b.heardRequests
	}
	e := t.expectedAt(sec)
	if e == 0 {
		return total
	}
	heard := min(b.heard, float64(e))
	if heard < sampleSize(e)-coverageSlack {
		return window.NoData
	}
	return total + heardPart/heard*(float64(e)-heard)
}

// coverageSlack forgives rounding in the pod-seconds a second was heard
// for (a millisecond of one pod).
const coverageSlack = 0.001

// sampleSize is how many of n pods must be heard to estimate the others
// from them: Knative's sample size for a population mean at 95 %
// confidence, a margin of error of 5 and a variance of 100 (all of up to
// 3 pods; else ceil(n*X/(n+X-1)) with X = 1.96^2 * 100 / 5^2 = 15.37).
func sampleSize(n int) float64 {
	if n <= 3 {
		return float64(n)
	}
	const x = 1.96 * 1.96 * 100 / (5 * 5)
	return math.Ceil(float64(n) * x / (float64(n) + x - 1))
}

// missing fills Values' account of the expected pods not heard for
// StaleAfter. A pod ready for less than that is not missing yet: its
// agent may learn of it a moment after its endpoint shows.
func (t *target) missing(now time.Time) Values {
	var v Values
	for _, p := range t.pods {
		e := &p.expected
		if !p.isExpected || e.until != math.MaxInt64 {
			continue
		}
		v.Expected++
		if time.Unix(e.from, 0).Add(StaleAfter).After(now) {
			continue
		}
		if now.UnixNano()-p.src.heard > int64(StaleAfter) {
			v.Missing++
			if !slices.Contains(v.MissingNodes, e.node) {
				v.MissingNodes = append(v.MissingNodes, e.node)
			}
		}
	}
	sort.Strings(v.MissingNodes)
	v.Extrapolating = v.Missing > 0 && float64(v.Expected-v.Missing) >= sampleSize(v.Expected)
	return v
}
