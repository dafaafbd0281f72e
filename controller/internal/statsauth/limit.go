package statsauth

import (
	"crypto/sha256"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/lru"
)

// Metrics counts the token reviews the Authenticator refused to make.
type Metrics struct {
	refusedTotal *prometheus.CounterVec
}

// NewMetrics registers the Authenticator's counters with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockscale_controller_token_reviews_refused_total",
		Help: "Bearer tokens not sent to a TokenReview, by reason: rate_limited (429: the source address asked for too many reviews of uncached tokens), " +
			"negative_cached (the token failed a review less than 10 s ago and is refused again from the cache), " +
			"busy (503: every review slot its class may use is taken).",
	}, []string{"reason"})}
	reg.MustRegister(m.refusedTotal)
	return m
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusedTotal.WithLabelValues(reason).Inc()
	}
}

// bucket is one source's token bucket of reviews.
type bucket struct {
	tokens float64
	last   time.Time
}

// sources keeps a bucket per source address, the least recently used
// dropped past max. A bucket idle for burst/rate (5 s by default) is full
// again, so dropping it loses nothing unless more than max sources asked
// for reviews within those 5 s; then a dropped source starts again with a
// full burst, and the reserved review slots still keep known callers
// served.
type sources struct {
	rate  float64
	burst float64
	mu    sync.Mutex
	lru   *lru.Cache
}

// take spends one review of src at now, or says how long until one is
// available.
func (s *sources) take(src string, now time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := s.lru.Get(src)
	bk, _ := b.(*bucket)
	if bk == nil {
		bk = &bucket{tokens: s.burst, last: now}
		s.lru.Add(src, bk)
	}
	if d := now.Sub(bk.last); d > 0 {
		bk.tokens = math.Min(s.burst, bk.tokens+d.Seconds()*s.rate)
	}
	bk.last = now
	if bk.tokens >= 1 {
		bk.tokens--
		return 0, true
	}
	return time.Duration((1 - bk.tokens) / s.rate * float64(time.Second)), false
}

// LimitReviews answers 429 with Retry-After, before next runs and without
// asking the API server, to a request whose bearer token is not cached
// (neither as valid nor as refused) when its source address has spent its
// reviews: ReviewsPerSource a second with a burst of ReviewBurst. The
// stats endpoint is reached directly, so r.RemoteAddr is the sending pod
// (or node, for host-network pods). A legitimate agent needs a review when
// its token rotates (every ~48 min) or its cached answer lapsed, far below
// 2 a second; a pod forging tokens in a loop gets 2 reviews a second, not
// MaxReviews in flight all the time. Requests without a bearer token and
// cached or known tokens pass at no cost: next refuses or admits them.
func (a *Authenticator) LimitReviews(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if strings.EqualFold(scheme, "Bearer") && token != "" && !a.cached(token) {
			src := r.RemoteAddr
			if host, _, err := net.SplitHostPort(src); err == nil {
				src = host
			}
			if wait, ok := a.sources.take(src, a.o.Clock.Now()); !ok {
				a.o.Metrics.refused("rate_limited")
				secs := max(1, int(math.Ceil(wait.Seconds())))
				w.Header().Set("Retry-After", strconv.Itoa(secs))
				http.Error(w, fmt.Sprintf("stats: too many token reviews of new tokens from %s (%g a second, burst %d): retry in %d s",
					src, a.o.ReviewsPerSource, a.o.ReviewBurst, secs), http.StatusTooManyRequests)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// cached says whether token has an answer in the cache, valid or refused
// (Authenticate answers it without a review), or passed a review before:
// only its holder can send it, its review takes the reserved slots, and
// its answer is cached for SuccessTTL again, so it is not rate limited
// even when it shares its address with a flood (host-network pods).
func (a *Authenticator) cached(token string) bool {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	for _, c := range []*cache.LRUExpireCache{a.cache, a.failures, a.known} {
		if _, ok := c.Get(key); ok {
			return true
		}
	}
	return false
}
