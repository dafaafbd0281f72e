package statsauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// The virtual resources a caller must be allowed to "create" in Group:
// RBAC rules on them say who may report. Nothing serves them; only
// SubjectAccessReviews ask about them.
const (
	Group = "sockscale.dev"
	// ResourceNodeStats: per-pod records of one node (agents).
	ResourceNodeStats = "nodestats"
	// ResourceTargetStats: per-target records (activators).
	ResourceTargetStats = "targetstats"
	Verb                = "create"
)

// DefaultAudience is the audience of the projected tokens the chart
// mounts into agents and activators.
const DefaultAudience = "sockscale-controller"

// Keys of a pod-bound token's user.extra in a TokenReview.
const (
	ExtraNodeName = "authentication.kubernetes.io/node-name"
	ExtraPodName  = "authentication.kubernetes.io/pod-name"
)

// Errors of Authenticate, each wrapped with what was wrong: the stats
// handler answers 401, 403 and 503 to them.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
	ErrUnavailable     = errors.New("cannot review the token now")
)

// Caller is who sent a request, as the API server says.
type Caller struct {
	// User is the ServiceAccount's user name,
	// system:serviceaccount:<namespace>:<name>.
	User string
	// Node and Pod are where the token is bound: the pod it was issued for
	// and that pod's node ("" when the token is not bound to a pod).
	Node, Pod string
	// Agent: may create nodestats; Activator: may create targetstats.
	Agent, Activator bool
}

// Reviewer asks the API server. APIReviewer is the real one.
type Reviewer interface {
	// ReviewToken returns the TokenReview's status for token with the
	// audience; an error means no answer (the API server is unreachable).
	ReviewToken(ctx context.Context, token, audience string) (authnv1.TokenReviewStatus, error)
	// Allowed says whether user may create resource in Group, and why not.
	Allowed(ctx context.Context, user authnv1.UserInfo, resource string) (bool, string, error)
}

// Options configure an Authenticator; zero values take the defaults.
type Options struct {
	Audience string
	Reviewer Reviewer
	Clock    clock.PassiveClock
	// SuccessTTL bounds how long a caller is trusted without asking again
	// (default 90 s; never beyond the token's expiry). A deleted pod takes
	// effect within it, a revoked permission within 4/3 of it (the
	// permission answers a caller's answer is made of are shared by every
	// caller of the same user and kept a third of it).
	SuccessTTL time.Duration
	// FailureTTL is how long a refused token stays refused (default 10 s):
	// long enough that a misconfigured sender costs one review per 10 s,
	// short enough that an RBAC fix works at once.
	FailureTTL time.Duration
	// MaxEntries bounds the cache (default 8192: several tokens per node
	// of a 5,000-node cluster while they rotate).
	MaxEntries int
	// MaxReviews bounds reviews in flight (default 16): a flood of
	// unknown tokens gets ErrUnavailable rather than a queue of
	// TokenReviews at the API server.
	MaxReviews int
	// ReviewTimeout bounds one token's reviews (default 10 s).
	ReviewTimeout time.Duration
	// ReservedReviews of the MaxReviews slots (default a quarter: 4 of
	// 16) only review tokens that were valid before (a cached answer
	// lapsed or is refreshed), never unknown ones: a flood of forged
	// tokens from any number of sources takes at most 12 slots, and
	// known callers keep 4. A review takes ~10 ms, so 4 slots serve ~400
	// refreshes a second, against the ~75 a second of 5,000 agents.
	ReservedReviews int
	// ReviewsPerSource and ReviewBurst bound the reviews of uncached
	// tokens one source address may cause (LimitReviews; defaults 2 a
	// second, burst 10), MaxSources the addresses tracked (default 4096).
	ReviewsPerSource float64
	ReviewBurst      int
	MaxSources       int
	// MaxFailures bounds the negative cache of refused tokens (default
	// 4096), kept apart from valid answers so that a flood of forged
	// tokens cannot evict known callers.
	MaxFailures int
	// Metrics counts reviews refused (nil: none).
	Metrics *Metrics
}

// Authenticator authenticates and authorizes bearer tokens. Answers are
// cached by the token's SHA-256 (the token itself is never kept), and
// concurrent requests with the same unknown token share one review.
//
// A known caller is asked about again before its answer expires, in the
// background, at a random point between half and three quarters of its
// lifetime: a fleet of agents that started together (a cluster's first
// install, a controller's restart) would otherwise expire together every
// 90 s and find MaxReviews taken, losing a period each (the scale bench
// saw 1,000-2,000 such 503s at 500 agents); spread, 5,000 agents cost
// about 5,000 / 67 s = 75 reviews a second, and a request never waits for
// one. A refusal from the API server replaces the answer at once; no
// answer keeps it until it expires.
type Authenticator struct {
	o     Options
	cache *cache.LRUExpireCache
	// failures caches refused tokens for FailureTTL: the same forged
	// token sent in a loop costs one review per 10 s.
	failures *cache.LRUExpireCache
	// known holds the keys of tokens a review found valid, until the
	// token expires: their reviews may take the reserved slots. A forged
	// token cannot get in, it never passed a review.
	known *cache.LRUExpireCache
	// unknownReviews bounds reviews of tokens not known:
	// MaxReviews-ReservedReviews.
	unknownReviews chan struct{}
	sources        *sources
	flight         singleflight.Group
	reviews        chan struct{}
	// permissions caches SubjectAccessReview answers by user name, groups
	// and resource: every agent of a cluster is one ServiceAccount, so
	// one answer serves them all, where a review per token asked the same
	// question thousands of times (two of the three reviews per agent,
	// 80 reviews a second at 1,500 agents, doubled with two replicas).
	// A token's extras (its pod and node) are not in the key: RBAC does
	// not read them.
	permissions *cache.LRUExpireCache
	permFlight  singleflight.Group

	mu         sync.Mutex
	refreshing map[string]bool // keys whose background review runs
	background sync.WaitGroup
}

// cached is one token's answer: a caller, or an error to repeat; a caller
// is asked about again from refreshAt (zero: never, the token expires
// with the answer).
type cached struct {
	caller    *Caller
	err       error
	refreshAt time.Time
	expiry    int64 // the token's exp claim (0: none)
}

// New returns an Authenticator; o.Reviewer is required.
func New(o Options) *Authenticator {
	if o.Audience == "" {
		o.Audience = DefaultAudience
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.SuccessTTL <= 0 {
		o.SuccessTTL = 90 * time.Second
	}
	if o.FailureTTL <= 0 {
		o.FailureTTL = 10 * time.Second
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 8192
	}
	if o.MaxReviews <= 0 {
		o.MaxReviews = 16
	}
	if o.ReviewTimeout <= 0 {
		o.ReviewTimeout = 10 * time.Second
	}
	if o.ReservedReviews <= 0 || o.ReservedReviews >= o.MaxReviews {
		o.ReservedReviews = o.MaxReviews / 4
	}
	if o.ReviewsPerSource <= 0 {
		o.ReviewsPerSource = 2
	}
	if o.ReviewBurst <= 0 {
		o.ReviewBurst = 10
	}
	if o.MaxSources <= 0 {
		o.MaxSources = 4096
	}
	if o.MaxFailures <= 0 {
		o.MaxFailures = 4096
	}
	return &Authenticator{o: o, cache: cache.NewLRUExpireCacheWithClock(o.MaxEntries, o.Clock), reviews: make(chan struct{}, o.MaxReviews),
		failures:       cache.NewLRUExpireCacheWithClock(o.MaxFailures, o.Clock),
		known:          cache.NewLRUExpireCacheWithClock(o.MaxEntries, o.Clock),
		unknownReviews: make(chan struct{}, o.MaxReviews-o.ReservedReviews),
		sources:        &sources{rate: o.ReviewsPerSource, burst: float64(o.ReviewBurst), lru: lru.New(o.MaxSources)},
		permissions:    cache.NewLRUExpireCacheWithClock(1024, o.Clock), refreshing: make(map[string]bool)}
}

// Audience is the audience tokens must carry.
func (a *Authenticator) Audience() string { return a.o.Audience }

// Authenticate returns who sent token and what they may report. Errors
// wrap ErrUnauthenticated, ErrForbidden or ErrUnavailable.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (*Caller, error) {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if v, ok := a.cache.Get(key); ok {
		c := v.(cached)
		if !c.refreshAt.IsZero() && !a.o.Clock.Now().Before(c.refreshAt) {
			a.refresh(key, token)
		}
		return c.caller, c.err
	}
	if v, ok := a.failures.Get(key); ok {
		a.o.Metrics.refused("negative_cached")
		c := v.(cached)
		return c.caller, c.err
	}
	v, _, _ := a.flight.Do(key, func() (any, error) {
		// Another request may have finished the same review meanwhile.
		if v, ok := a.cache.Get(key); ok {
			return v, nil
		}
		if v, ok := a.failures.Get(key); ok {
			return v, nil
		}
		c, ttl := a.review(ctx, key, token)
		a.keep(key, c, ttl)
		return c, nil
	})
	c := v.(cached)
	return c.caller, c.err
}

// refresh reviews a known caller's token again in the background, unless
// that runs already. An answer replaces the cached one; no answer (the
// API server unreachable, every review slot taken) leaves it to expire,
// and the caller's next request tries again.
func (a *Authenticator) refresh(key, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refreshing[key] {
		return
	}
	a.refreshing[key] = true
	a.background.Add(1)
	go func() {
		defer a.background.Done()
		if c, ttl := a.review(context.Background(), key, token); ttl > 0 {
			a.keep(key, c, ttl)
		}
		a.mu.Lock()
		delete(a.refreshing, key)
		a.mu.Unlock()
	}()
}

// keep caches a review's answer for ttl (0: not at all): a caller in the
// cache (and its token as known until it expires), a refusal in the
// negative cache, replacing any answer of the other kind.
func (a *Authenticator) keep(key string, c cached, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	if c.err != nil {
		a.cache.Remove(key)
		a.failures.Add(key, c, ttl)
		return
	}
	a.failures.Remove(key)
	a.cache.Add(key, c, ttl)
	known := 10 * a.o.SuccessTTL
	if c.expiry != 0 {
		known = time.Unix(c.expiry, 0).Sub(a.o.Clock.Now())
	}
	if known > 0 {
		a.known.Add(key, struct{}{}, known)
	}
}

// review asks the API server about token and says how long to keep the
// answer (0: not at all).
func (a *Authenticator) review(ctx context.Context, key, token string) (cached, time.Duration) {
	now := a.o.Clock.Now()
	claims, err := peek(token)
	// The claims are not verified yet: they may refuse a token, never
	// admit one. Refusing here costs the API server nothing, and the
	// answer is not cached: recomputing it is as cheap, and a flood of
	// junk tokens then cannot push good callers out of the cache.
	if err != nil {
		return cached{err: fmt.Errorf("%w: %w", ErrUnauthenticated, err)}, 0
	}
	if !claims.Audience.has(a.o.Audience) {
		return cached{err: fmt.Errorf("%w: the token's audiences %q do not include %q: send a projected ServiceAccount token with that audience", ErrUnauthenticated, []string(claims.Audience), a.o.Audience)}, 0
	}
	if claims.Expiry != 0 && !now.Before(time.Unix(claims.Expiry, 0)) {
		return cached{err: fmt.Errorf("%w: the token expired at %s", ErrUnauthenticated, time.Unix(claims.Expiry, 0).UTC().Format(time.RFC3339))}, 0
	}
	if _, known := a.known.Get(key); !known {
		select {
		case a.unknownReviews <- struct{}{}:
			defer func() { <-a.unknownReviews }()
		default:
			a.o.Metrics.refused("busy")
			return cached{err: fmt.Errorf("%w: %d token reviews already in flight for new tokens (%d more are kept for tokens accepted before)",
				ErrUnavailable, a.o.MaxReviews-a.o.ReservedReviews, a.o.ReservedReviews)}, 0
		}
	}
	select {
	case a.reviews <- struct{}{}:
		defer func() { <-a.reviews }()
	default:
		a.o.Metrics.refused("busy")
		return cached{err: fmt.Errorf("%w: %d token reviews already in flight", ErrUnavailable, a.o.MaxReviews)}, 0
	}
	// Shared by every request waiting for this token: the first one's
	// cancellation must not fail the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.o.ReviewTimeout)
	defer cancel()
	st, err := a.o.Reviewer.ReviewToken(ctx, token, a.o.Audience)
	if err != nil {
		return cached{err: fmt.Errorf("%w: TokenReview: %w", ErrUnavailable, err)}, 0
	}
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "the API server did not authenticate it"
		}
		return cached{err: fmt.Errorf("%w: token for audience %q: %s", ErrUnauthenticated, a.o.Audience, why)}, a.o.FailureTTL
	}
	if !audiences(st.Audiences).has(a.o.Audience) {
		return cached{err: fmt.Errorf("%w: the API server authenticated the token for audiences %q, not %q", ErrUnauthenticated, st.Audiences, a.o.Audience)}, a.o.FailureTTL
	}
	c := &Caller{User: st.User.Username, Node: extra(st.User, ExtraNodeName), Pod: extra(st.User, ExtraPodName)}
	type answer struct {
		allowed bool
		reason  string
		err     error
	}
	// Both questions at once: a miss costs one round trip, not two.
	targets := make(chan answer, 1)
	go func() {
		ok, why, err := a.allowed(ctx, st.User, ResourceTargetStats)
		targets <- answer{ok, why, err}
	}()
	ok, nodeWhy, err := a.allowed(ctx, st.User, ResourceNodeStats)
	t := <-targets
	if err = errors.Join(err, t.err); err != nil {
		return cached{err: fmt.Errorf("%w: SubjectAccessReview for %s: %w", ErrUnavailable, c.User, err)}, 0
	}
	c.Agent, c.Activator = ok, t.allowed
	if !c.Agent && !c.Activator {
		return cached{err: fmt.Errorf("%w: %s may not create %s.%s (agents) nor %s.%s (activators)%s", ErrForbidden, c.User,
			ResourceNodeStats, Group, ResourceTargetStats, Group, reasons(nodeWhy, t.reason))}, a.o.FailureTTL
	}
	ttl := a.o.SuccessTTL
	if claims.Expiry != 0 && time.Unix(claims.Expiry, 0).Sub(now) <= ttl {
		// The token expires first: the sender brings a new one.
		return cached{caller: c, expiry: claims.Expiry}, time.Unix(claims.Expiry, 0).Sub(now)
	}
	return cached{caller: c, refreshAt: now.Add(ttl/2 + rand.N(ttl/4)), expiry: claims.Expiry}, ttl
}

// permission is a cached SubjectAccessReview answer.
type permission struct {
	allowed bool
	reason  string
}

// allowed says whether user may create resource, from an answer at most a
// third of SuccessTTL old (a refusal: FailureTTL), asking the API server
// once for every caller waiting on the same question.
func (a *Authenticator) allowed(ctx context.Context, user authnv1.UserInfo, resource string) (bool, string, error) {
	groups := slices.Clone(user.Groups)
	slices.Sort(groups)
	key := user.Username + "\x00" + strings.Join(groups, "\x00") + "\x00\x00" + resource
	if v, ok := a.permissions.Get(key); ok {
		p := v.(permission)
		return p.allowed, p.reason, nil
	}
	v, err, _ := a.permFlight.Do(key, func() (any, error) {
		ok, why, err := a.o.Reviewer.Allowed(ctx, user, resource)
		if err != nil {
			return nil, err
		}
		ttl := a.o.SuccessTTL / 3
		if !ok {
			ttl = a.o.FailureTTL
		}
		a.permissions.Add(key, permission{allowed: ok, reason: why}, ttl)
		return permission{allowed: ok, reason: why}, nil
	})
	if err != nil {
		return false, "", err
	}
	p := v.(permission)
	return p.allowed, p.reason, nil
}

func reasons(rs ...string) string {
	var out []string
	for _, r := range rs {
		if r != "" && !strings.Contains(strings.Join(out, "; "), r) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

func extra(u authnv1.UserInfo, key string) string {
	if v := u.Extra[key]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// claims are the unverified JWT claims peek reads.
type claims struct {
	Audience audiences `json:"aud"`
	Expiry   int64     `json:"exp"`
}

// audiences is a JWT's aud: a string or a list of them.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(a))
}

func (a audiences) has(s string) bool {
	for _, x := range a {
		if x == s {
			return true
		}
	}
	return false
}

// peek reads a JWT's claims without verifying its signature.
func peek(token string) (claims, error) {
	var c claims
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return c, errors.New("the bearer token is not a JWT (a ServiceAccount token has three dot-separated parts)")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, fmt.Errorf("the bearer token's claims are not base64url: %w", err)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		// Unmarshal fills what it could read before the error: none of it
		// is a claim.
		return claims{}, fmt.Errorf("the bearer token's claims are not JSON with aud and exp: %w", err)
	}
	return c, nil
}
