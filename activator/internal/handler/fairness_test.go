package handler

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/activator/internal/holdpool"
	"github.com/sockscale/sockscale/activator/internal/target"
)

// answer is what a client saw, reduced to what the test compares.
type answer struct {
	Code       int
	RetryAfter string
	Body       string
}

// One namespace floods a cold target past its share of the activator's
// held requests; another namespace's cold start still gets held and
// answered.
func TestFairShareOfHeldRequests(t *testing.T) {
	const capacity = 4
	pool := holdpool.New(holdpool.Options{Capacity: capacity})
	e := newEnvWithPool(t, 0, pool)
	flood := target.Key{Namespace: "tenant-a", Name: "flood"}
	cold := target.Key{Namespace: "tenant-b", Name: "cold"}
	e.serve(t, target.Target{Key: flood})
	e.serve(t, target.Target{Key: cold})
	floodPod, coldPod := newPod(t, hi), newPod(t, hi)

	send := func(k target.Key, out chan<- answer) {
		resp, body, err := e.get(t, context.Background(), k.Name+"."+k.Namespace)
		if err != nil {
			out <- answer{Body: err.Error()}
			return
		}
		out <- answer{Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Body: body}
	}

	// tenant-a fills the whole pool: nobody else is holding.
	floods := make(chan answer, capacity+1)
	for range capacity {
		go send(flood, floods)
	}
	waitFor(t, "tenant-a holding the pool", func() bool { return pool.Held("tenant-a") == capacity })

	// Its next request is refused: the pool is full and tenant-a holds
	// its share (all of it, alone).
	refused := make(chan answer, 2)
	send(flood, refused)

	// tenant-b's cold start is admitted by shedding tenant-a's newest.
	colds := make(chan answer, 1)
	go send(cold, colds)
	shed := <-floods
	waitFor(t, "tenant-b held", func() bool { return pool.Held("tenant-b") == 1 })

	// Now tenant-a holds 3 of 4, more than its share (2): refused.
	send(flood, refused)

	// tenant-b's pod is ready: its request is answered.
	e.setPods(cold, coldPod.Server)
	gotCold := <-colds
	e.setPods(flood, floodPod.Server)
	var rest []answer
	for range capacity - 1 {
		rest = append(rest, <-floods)
	}

	ok := answer{Code: 200, Body: "hi from the pod\n"}
	full := func(holds, share, namespaces int) answer {
		return answer{Code: 503, RetryAfter: "2", Body: fmt.Sprintf("sockscale-activator: tenant-a/flood: held requests at the activator's limit (4, --max-held) "+
			"and namespace \"tenant-a\" holds %d, its fair share or more (%d of them for each of %d namespaces holding); retry later\n", holds, share, namespaces)}
	}
	if diff := cmp.Diff(map[string]any{
		"refused": []answer{full(4, 4, 1), full(3, 2, 2)},
		"shed": answer{Code: 503, RetryAfter: "2", Body: "sockscale-activator: tenant-a/flood: held request shed: the activator held its most requests (4, --max-held), " +
			"namespace \"tenant-a\" the most of them, and namespace \"tenant-b\", holding less than its fair share, needed a place; retry later\n"},
		"cold start":    ok,
		"flood, others": []answer{ok, ok, ok},
	}, map[string]any{
		"refused":       []answer{<-refused, <-refused},
		"shed":          shed,
		"cold start":    gotCold,
		"flood, others": rest,
	}); diff != "" {
		t.Errorf("answers -want +got:\n%s", diff)
	}
	got := map[string]float64{}
	for _, reason := range []string{reasonMaxHeld, reasonShed} {
		got[reason] = e.errorResponses(t, 503, reason)
	}
	if diff := cmp.Diff(map[string]float64{reasonMaxHeld: 2, reasonShed: 1}, got); diff != "" {
		t.Errorf("sockscale_activator_error_responses_total{code=503} by reason -want +got:\n%s", diff)
	}
	if n := pool.Held(""); n != 0 {
		t.Errorf("pool holds %d after every request ended, want 0", n)
	}
	if hits := fmt.Sprint(floodPod.hits.Load(), coldPod.hits.Load()); hits != "3 1" {
		t.Errorf("pods' hits (flood, cold) = %s, want 3 1: the shed and refused requests must not reach a pod", hits)
	}
}
