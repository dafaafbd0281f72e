package statsauth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 26, 2, 0, 0, 0, time.UTC)

// jwt makes a token whose claims peek can read; the fake reviewer decides
// whether it is valid, as the API server would.
func jwt(sub string, aud []string, exp time.Time) string {
	claims, _ := json.Marshal(map[string]any{"sub": sub, "aud": aud, "exp": exp.Unix()})
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(claims) + "." + enc([]byte("signature"))
}

// fakeReviewer answers as the API server would for the users it knows,
// by the token's subject.
type fakeReviewer struct {
	mu      sync.Mutex
	reviews int // TokenReviews asked
	sars    int
	// users by token subject; a subject missing is not authenticated.
	users map[string]authnv1.UserInfo
	// allowed[user][resource]
	allowed map[string]map[string]bool
	// down: the API server does not answer.
	down error
	// gate, if set, holds every TokenReview until closed.
	gate chan struct{}
}

func (f *fakeReviewer) ReviewToken(_ context.Context, token, audience string) (authnv1.TokenReviewStatus, error) {
	f.mu.Lock()
	f.reviews++
	gate, down := f.gate, f.down
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if down != nil {
		return authnv1.TokenReviewStatus{}, down
	}
	c, err := peek(token)
	if err != nil {
		return authnv1.TokenReviewStatus{}, err
	}
	var sub struct{ Sub string }
	payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[1])
	_ = json.Unmarshal(payload, &sub)
	u, ok := f.users[sub.Sub]
	if !ok || !c.Audience.has(audience) {
		return authnv1.TokenReviewStatus{Error: "invalid bearer token, token lookup failed"}, nil
	}
	return authnv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: []string{audience}}, nil
}

func (f *fakeReviewer) Allowed(_ context.Context, u authnv1.UserInfo, resource string) (bool, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sars++
	if f.down != nil {
		return false, "", f.down
	}
	return f.allowed[u.Username][resource], "", nil
}

func (f *fakeReviewer) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reviews, f.sars
}

const (
	agentUser     = "system:serviceaccount:sockscale-system:sockscale-agent"
	activatorUser = "system:serviceaccount:sockscale-system:sockscale-activator"
	defaultUser   = "system:serviceaccount:default:default"
)

func newFake() *fakeReviewer {
	bound := func(user, pod, node string) authnv1.UserInfo {
		return authnv1.UserInfo{Username: user, Extra: map[string]authnv1.ExtraValue{ExtraPodName: {pod}, ExtraNodeName: {node}}}
	}
	return &fakeReviewer{
		users: map[string]authnv1.UserInfo{
			"agent":     bound(agentUser, "sockscale-agent-x1", "node-a"),
			"activator": bound(activatorUser, "sockscale-activator-0", "node-b"),
			"default":   bound(defaultUser, "client", "node-a"),
		},
		allowed: map[string]map[string]bool{
			agentUser:     {ResourceNodeStats: true},
			activatorUser: {ResourceTargetStats: true},
		},
	}
}

func TestAuthenticate(t *testing.T) {
	aud := []string{DefaultAudience}
	exp := t0.Add(time.Hour)
	tests := []struct {
		name    string
		token   string
		down    error
		want    *Caller
		wantErr error
		msg     string // in the error
		reviews int    // TokenReviews it costs
	}{
		{"agent", jwt("agent", aud, exp),
			nil, &Caller{User: agentUser, Node: "node-a", Pod: "sockscale-agent-x1", Agent: true}, nil, "", 1},
		{"activator", jwt("activator", aud, exp),
			nil, &Caller{User: activatorUser, Node: "node-b", Pod: "sockscale-activator-0", Activator: true}, nil, "", 1},
		{"an ordinary pod's token, right audience", jwt("default", aud, exp),
			nil, nil, ErrForbidden, defaultUser + " may not create nodestats.sockscale.dev (agents) nor targetstats.sockscale.dev (activators)", 1},
		{"the API server's audience", jwt("agent", []string{"https://kubernetes.default.svc"}, exp),
			nil, nil, ErrUnauthenticated, `audiences ["https://kubernetes.default.svc"] do not include "sockscale-controller"`, 0},
		{"expired", jwt("agent", aud, t0.Add(-time.Second)),
			nil, nil, ErrUnauthenticated, "the token expired at 2026-11-26T01:59:59Z", 0},
		{"not a JWT", "0123456789abcdef",
			nil, nil, ErrUnauthenticated, "not a JWT", 0},
		{"unknown to the API server", jwt("forged", aud, exp),
			nil, nil, ErrUnauthenticated, "invalid bearer token", 1},
		{"API server down", jwt("agent", aud, exp),
			errors.New("dial tcp 10.96.0.1:443: connection refused"), nil, ErrUnavailable, "TokenReview: dial tcp", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			f.down = tt.down
			a := New(Options{Reviewer: f, Clock: clocktesting.NewFakePassiveClock(t0)})
			got, err := a.Authenticate(t.Context(), tt.token)
			if !errors.Is(err, tt.wantErr) || (err != nil && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("err = %v, want %v with %q", err, tt.wantErr, tt.msg)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("caller (-want +got):\n%s", diff)
			}
			if r, _ := f.counts(); r != tt.reviews {
				t.Errorf("%d TokenReviews, want %d", r, tt.reviews)
			}
		})
	}
}

// TestCacheLifetimes walks one clock through the cache's TTLs: success
// 90 s but never past the token's expiry, refusals 10 s, the API server's
// silence not at all.
func TestCacheLifetimes(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := newFake()
	a := New(Options{Reviewer: f, Clock: clk})
	long := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	short := jwt("activator", []string{DefaultAudience}, t0.Add(30*time.Second))
	forbidden := jwt("default", []string{DefaultAudience}, t0.Add(time.Hour))
	forged := jwt("forged", []string{DefaultAudience}, t0.Add(time.Hour))
	type step struct {
		at          time.Duration
		token       string
		wantErr     error
		wantReviews int // in total so far
	}
	steps := []step{
		{0, long, nil, 1},
		{0, short, nil, 2},
		{0, forbidden, ErrForbidden, 3},
		{0, forged, ErrUnauthenticated, 4},
		{5 * time.Second, long, nil, 4},
		{5 * time.Second, forbidden, ErrForbidden, 4},
		{5 * time.Second, forged, ErrUnauthenticated, 4},
		// Refusals are asked again after 10 s: an RBAC fix works at once.
		{11 * time.Second, forbidden, ErrForbidden, 5},
		{11 * time.Second, forged, ErrUnauthenticated, 6},
		{29 * time.Second, short, nil, 6},
		// The short token expired at 30 s: refused without asking.
		{31 * time.Second, short, ErrUnauthenticated, 6},
		{44 * time.Second, long, nil, 6},
		// Between 45 s and 67.5 s a known caller is asked about again in
		// the background (answered from the cache meanwhile), which
		// renews its answer for 90 s.
		{68 * time.Second, long, nil, 7},
		{112 * time.Second, long, nil, 7},
	}
	for _, s := range steps {
		clk.SetTime(t0.Add(s.at))
		_, err := a.Authenticate(t.Context(), s.token)
		a.background.Wait()
		if !errors.Is(err, s.wantErr) {
			t.Errorf("at %v: err = %v, want %v", s.at, err, s.wantErr)
		}
		if r, _ := f.counts(); r != s.wantReviews {
			t.Errorf("at %v: %d TokenReviews so far, want %d", s.at, r, s.wantReviews)
		}
	}

	// The API server's silence is not remembered: the next request asks.
	f.down = errors.New("connection refused")
	fresh := jwt("agent", []string{DefaultAudience}, t0.Add(2*time.Hour))
	for i := range 2 {
		if _, err := a.Authenticate(t.Context(), fresh); !errors.Is(err, ErrUnavailable) {
			t.Errorf("API server down, try %d: err = %v, want ErrUnavailable", i, err)
		}
	}
	if r, _ := f.counts(); r != 9 {
		t.Errorf("%d TokenReviews, want 9: each try while down asks again", r)
	}
	f.down = nil
	if _, err := a.Authenticate(t.Context(), fresh); err != nil {
		t.Errorf("API server back: %v", err)
	}
}

// TestRefreshAhead: a known caller's answer is renewed in the background
// before it expires; while the API server does not answer, the cached
// answer holds until it expires; a refusal replaces it at once.
func TestRefreshAhead(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := newFake()
	a := New(Options{Reviewer: f, Clock: clk})
	tok := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	auth := func(at time.Duration) error {
		clk.SetTime(t0.Add(at))
		_, err := a.Authenticate(t.Context(), tok)
		a.background.Wait()
		return err
	}
	if err := auth(0); err != nil {
		t.Fatal(err)
	}
	f.down = errors.New("connection refused")
	for _, at := range []time.Duration{70 * time.Second, 80 * time.Second, 89 * time.Second} {
		if err := auth(at); err != nil {
			t.Errorf("at %v, API server down, answer cached until 90 s: %v", at, err)
		}
	}
	if r, _ := f.counts(); r != 4 {
		t.Errorf("%d TokenReviews, want 4: the first, then one try per request past the refresh point", r)
	}
	if err := auth(91 * time.Second); !errors.Is(err, ErrUnavailable) {
		t.Errorf("at 91 s, API server down, answer expired: err = %v, want ErrUnavailable", err)
	}
	f.down = nil
	if err := auth(92 * time.Second); err != nil {
		t.Fatal(err)
	}
	// RBAC revoked: the background review's refusal replaces the answer.
	delete(f.allowed, agentUser)
	_ = auth(92*time.Second + 70*time.Second) // answered from the cache, refused in the background
	if err := auth(92*time.Second + 71*time.Second); !errors.Is(err, ErrForbidden) {
		t.Errorf("after the permission was revoked: err = %v, want ErrForbidden", err)
	}
}

func TestCacheIsBounded(t *testing.T) {
	f := newFake()
	a := New(Options{Reviewer: f, Clock: clocktesting.NewFakePassiveClock(t0), MaxEntries: 2})
	tokens := make([]string, 3)
	for i := range tokens {
		tokens[i] = jwt("agent", []string{DefaultAudience}, t0.Add(time.Duration(i+1)*time.Hour))
		if _, err := a.Authenticate(t.Context(), tokens[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The least recently used is gone; the other two are kept.
	for _, tok := range []string{tokens[1], tokens[2], tokens[0]} {
		if _, err := a.Authenticate(t.Context(), tok); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := f.counts(); r != 4 {
		t.Errorf("%d TokenReviews, want 4: 3 tokens, then only the evicted one again", r)
	}
}

// TestConcurrentReviewsCoalesce: requests with the same unknown token
// wait for one review; a different token beyond MaxReviews is refused
// with 503 rather than queued.
func TestConcurrentReviewsCoalesce(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	a := New(Options{Reviewer: f, Clock: clocktesting.NewFakePassiveClock(t0), MaxReviews: 1})
	tok := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() { _, errs[i] = a.Authenticate(context.Background(), tok) })
	}
	// Wait until the one review is in flight.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if r, _ := f.counts(); r == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no review started")
		}
	}
	other := jwt("activator", []string{DefaultAudience}, t0.Add(time.Hour))
	if _, err := a.Authenticate(t.Context(), other); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "1 token reviews already in flight") {
		t.Errorf("a second token while the review slot is taken: %v, want ErrUnavailable", err)
	}
	close(f.gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	if r, s := f.counts(); r != 1 || s != 2 {
		t.Errorf("%d TokenReviews and %d SubjectAccessReviews for 20 requests with one token, want 1 and 2", r, s)
	}
}

func TestAudiencesClaim(t *testing.T) {
	for _, tt := range []struct {
		json string
		want audiences
	}{
		{`{"aud":"a"}`, audiences{"a"}},
		{`{"aud":["a","b"]}`, audiences{"a", "b"}},
		{`{}`, nil},
	} {
		var c claims
		if err := json.Unmarshal([]byte(tt.json), &c); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, c.Audience); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.json, diff)
		}
	}
}

// BenchmarkAuthenticateCached is the cost a known sender's request pays:
// hashing its token (a ServiceAccount token is about 1 KB: a long
// signature here) and a cache lookup.
func BenchmarkAuthenticateCached(b *testing.B) {
	a := New(Options{Reviewer: newFake(), Clock: clocktesting.NewFakePassiveClock(t0)})
	tok := jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))
	tok = tok[:strings.LastIndex(tok, ".")+1] + strings.Repeat("s", 700)
	if _, err := a.Authenticate(context.Background(), tok); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := a.Authenticate(context.Background(), tok); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPermissionsSharedByUser: the tokens of many agents (one
// ServiceAccount, each bound to its own pod and node) cost one
// TokenReview each but one SubjectAccessReview per resource between
// them; the answers are asked again after a third of SuccessTTL (a
// refusal after FailureTTL), so a revoked permission takes effect.
func TestPermissionsSharedByUser(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	f := newFake()
	for i := range 100 {
		f.users[fmt.Sprintf("agent-%d", i)] = authnv1.UserInfo{Username: agentUser,
			Extra: map[string]authnv1.ExtraValue{ExtraPodName: {fmt.Sprintf("sockscale-agent-%d", i)}, ExtraNodeName: {fmt.Sprintf("node-%d", i)}}}
	}
	a := New(Options{Reviewer: f, Clock: clk})
	for i := range 100 {
		c, err := a.Authenticate(t.Context(), jwt(fmt.Sprintf("agent-%d", i), []string{DefaultAudience}, t0.Add(time.Hour)))
		if err != nil || !c.Agent || c.Node != fmt.Sprintf("node-%d", i) {
			t.Fatalf("agent %d: %+v, %v", i, c, err)
		}
	}
	if reviews, sars := f.counts(); reviews != 100 || sars != 2 {
		t.Errorf("100 agents: %d TokenReviews and %d SubjectAccessReviews, want 100 and 2 (nodestats and targetstats, once)", reviews, sars)
	}
	// The agents' permission is revoked; 31 s on, a new agent's token is
	// reviewed with the question asked again.
	f.mu.Lock()
	f.allowed[agentUser] = nil
	f.mu.Unlock()
	clk.SetTime(t0.Add(31 * time.Second))
	if _, err := a.Authenticate(t.Context(), jwt("agent", []string{DefaultAudience}, t0.Add(time.Hour))); !errors.Is(err, ErrForbidden) {
		t.Errorf("after the permission was revoked and 31 s: err = %v, want ErrForbidden", err)
	}
	if _, sars := f.counts(); sars != 4 {
		t.Errorf("%d SubjectAccessReviews, want 4: the cached answers expired after 30 s", sars)
	}
	// The refusal is shared too, for FailureTTL.
	if _, err := a.Authenticate(t.Context(), jwt("agent-0", []string{DefaultAudience}, t0.Add(2*time.Hour))); !errors.Is(err, ErrForbidden) {
		t.Errorf("another agent's new token: err = %v, want ErrForbidden", err)
	}
	if _, sars := f.counts(); sars != 4 {
		t.Errorf("%d SubjectAccessReviews, want still 4 (the refusal is cached)", sars)
	}
}
