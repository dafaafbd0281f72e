package statsauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authnv1 "k8s.io/api/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// limited serves LimitReviews around a handler that answers 200 or 401
// with Authenticate, as the stats handler does.
func limited(a *Authenticator) http.Handler {
	return a.LimitReviews(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := a.Authenticate(r.Context(), strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	}))
}

func send(h http.Handler, src, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/stats", nil)
	r.RemoteAddr = src + ":40000"
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestForgedTokensRateLimitedPerSource: distinct forged tokens from one
// pod cost at most burst + rate*t reviews (10 + 2/s); the rest get 429
// with Retry-After, without a review. Another source is not affected.
func TestForgedTokensRateLimitedPerSource(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := newFake()
	reg := prometheus.NewRegistry()
	a := New(Options{Reviewer: f, Clock: clk, Metrics: NewMetrics(reg)})
	h := limited(a)
	n := 0
	flood := func(count int) (limitedCount int) {
		for range count {
			n++
			w := send(h, "10.0.0.7", jwt(fmt.Sprintf("forged-%d", n), []string{DefaultAudience}, t0.Add(time.Hour)))
			switch w.Code {
			case http.StatusTooManyRequests:
				if got := w.Header().Get("Retry-After"); got != "1" {
					t.Fatalf("Retry-After %q, want 1 (a review every 0.5 s)", got)
				}
				limitedCount++
			case http.StatusUnauthorized:
			default:
				t.Fatalf("forged token: %d %s", w.Code, w.Body)
			}
		}
		return limitedCount
	}
	if l := flood(100); l != 90 {
		t.Errorf("%d of 100 forged tokens at once got 429, want 90 (burst 10)", l)
	}
	if r, _ := f.counts(); r != 10 {
		t.Errorf("%d TokenReviews for 100 forged tokens at once, want the burst, 10", r)
	}
	for s := 1; s <= 5; s++ {
		clk.SetTime(t0.Add(time.Duration(s) * time.Second))
		flood(100)
	}
	if r, _ := f.counts(); r != 10+2*5 {
		t.Errorf("%d TokenReviews for 600 forged tokens over 5 s, want 10 + 2*5 = 20", r)
	}
	if got := testutil.ToFloat64(a.o.Metrics.refusedTotal.WithLabelValues("rate_limited")); got != 580 {
		t.Errorf("rate_limited = %v, want 580", got)
	}
	// Another pod, and the flooding pod's own valid token, still pass.
	if w := send(h, "10.0.0.8", jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))); w.Code != http.StatusOK {
		t.Errorf("an agent on another address: %d %s", w.Code, w.Body)
	}
}

// TestForgedTokenRepeatedReviewedOnce: the same forged token in a loop
// costs one review per FailureTTL, and refusals never evict valid
// answers (they have a cache of their own).
func TestForgedTokenRepeatedReviewedOnce(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := newFake()
	a := New(Options{Reviewer: f, Clock: clk, MaxEntries: 2, Metrics: NewMetrics(prometheus.NewRegistry())})
	agent := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	if _, err := a.Authenticate(t.Context(), agent); err != nil {
		t.Fatal(err)
	}
	forged := jwt("forged", []string{DefaultAudience}, t0.Add(time.Hour))
	for range 50 {
		if _, err := a.Authenticate(t.Context(), forged); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("forged token: %v", err)
		}
	}
	if r, _ := f.counts(); r != 2 {
		t.Errorf("%d TokenReviews, want 2: the agent's, then one for 50 times the same forged token", r)
	}
	if got := testutil.ToFloat64(a.o.Metrics.refusedTotal.WithLabelValues("negative_cached")); got != 49 {
		t.Errorf("negative_cached = %v, want 49", got)
	}
	// More distinct forged tokens than MaxEntries: the agent stays cached.
	for i := range 5 {
		_, _ = a.Authenticate(t.Context(), jwt(fmt.Sprintf("forged-%d", i), []string{DefaultAudience}, t0.Add(time.Hour)))
	}
	if _, err := a.Authenticate(t.Context(), agent); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.counts(); r != 2+5 {
		t.Errorf("%d TokenReviews, want 7: refusals evicted the agent's answer", r)
	}
}

// floodReviewer holds every review of a forged token (subject forged-*)
// until release is closed, as a slow API server flooded would; the
// agent's are answered at once.
type floodReviewer struct {
	*fakeReviewer
	release chan struct{}
	held    atomic.Int32
}

func (f *floodReviewer) ReviewToken(ctx context.Context, token, audience string) (authnv1.TokenReviewStatus, error) {
	var sub struct{ Sub string }
	payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	_ = json.Unmarshal(payload, &sub)
	if strings.HasPrefix(sub.Sub, "forged") {
		f.held.Add(1)
		<-f.release
	}
	return f.fakeReviewer.ReviewToken(ctx, token, audience)
}

// TestKnownCallerServedDuringFlood: forged tokens from many sources take
// at most 12 of the 16 review slots; an agent whose cached answer lapsed
// gets one of the 4 reserved, at once.
func TestKnownCallerServedDuringFlood(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := &floodReviewer{fakeReviewer: newFake(), release: make(chan struct{})}
	a := New(Options{Reviewer: f, Clock: clk, Metrics: NewMetrics(prometheus.NewRegistry())})
	agent := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	if _, err := a.Authenticate(t.Context(), agent); err != nil {
		t.Fatal(err)
	}
	// The answer lapsed (no request between 45 s and 90 s refreshed it).
	clk.SetTime(t0.Add(100 * time.Second))

	var wg sync.WaitGroup
	var done atomic.Int32
	const flood = 40
	for i := range flood {
		wg.Go(func() {
			_, _ = a.Authenticate(context.Background(), jwt(fmt.Sprintf("forged-%d", i), []string{DefaultAudience}, t0.Add(time.Hour)))
			done.Add(1)
		})
	}
	defer func() { close(f.release); wg.Wait() }()
	// Every forged token is either held in a review or refused.
	for deadline := time.Now().Add(5 * time.Second); f.held.Load()+done.Load() < flood; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d held, %d done of %d", f.held.Load(), done.Load(), flood)
		}
	}
	if h := f.held.Load(); h != 12 {
		t.Errorf("%d forged tokens in review, want 12 (16 slots, 4 reserved)", h)
	}
	if _, err := a.Authenticate(t.Context(), agent); err != nil {
		t.Errorf("the agent's token during the flood: %v, want it reviewed in a reserved slot", err)
	}
	if got := testutil.ToFloat64(a.o.Metrics.refusedTotal.WithLabelValues("busy")); got != flood-12 {
		t.Errorf("busy = %v, want %d", got, flood-12)
	}
}

// TestSourcesBounded: at most MaxSources addresses are tracked, the least
// recently used dropped.
func TestSourcesBounded(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	a := New(Options{Reviewer: newFake(), Clock: clk, MaxSources: 3})
	h := limited(a)
	for i := range 10 {
		send(h, fmt.Sprintf("10.0.1.%d", i), jwt(fmt.Sprintf("forged-%d", i), []string{DefaultAudience}, t0.Add(time.Hour)))
	}
	a.sources.mu.Lock()
	n := a.sources.lru.Len()
	a.sources.mu.Unlock()
	if n != 3 {
		t.Errorf("%d sources tracked, want MaxSources, 3", n)
	}
}
