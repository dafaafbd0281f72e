package statsserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/statsauth"
	"github.com/sockscale/sockscale/internal/stats"
)

// NodeStateUnreadable marks a node whose state header could not be read
// (an agent newer than this controller, or a broken one).
const NodeStateUnreadable stats.RedirectState = "unreadable"

// DefaultMaxInFlight bounds requests handled at once: 5,000 agents each
// posting once a second, answered in about a millisecond, keep a handful
// in flight; a flood beyond it gets 503 before any work.
const DefaultMaxInFlight = 256

// Authenticator says who sent a bearer token and what they may report
// (statsauth.Authenticator). Errors wrap statsauth.ErrUnauthenticated,
// ErrForbidden or ErrUnavailable.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (*statsauth.Caller, error)
	Audience() string
}

// Placer says where each pod record's target has the pod
// (collector.Collector.PodNodes).
type Placer interface {
	PodNodes(pods []stats.PodStat) []collector.PodNode
}

// Options configure Handler.
type Options struct {
	// Accept takes each admitted batch; its error answers 503.
	Accept func(*stats.Batch) error
	// Auth authenticates and authorizes senders. Nil admits every
	// request: --stats-insecure-skip-auth, for development only.
	Auth Authenticator
	// Pods checks agents' pod records against the targets' endpoints;
	// required with Auth.
	Pods Placer
	// KeepUnwatched keeps the records of pods no PodAutoscaler watches
	// (dropped otherwise): the metrics APIs serve every Deployment's
	// pods, and check each record against its pod's node and address
	// when they read it.
	KeepUnwatched bool
	// MaxInFlight bounds requests handled at once (default
	// DefaultMaxInFlight); more get 503 at once.
	MaxInFlight int
	// Metrics counts refused requests and dropped records (nil: none).
	Metrics *Metrics
	// Log receives refusals, at most one line per reason every
	// logInterval (nil: none).
	Log *RateLimitedLog
	// Buckets, if set, gives the stats.HeaderBuckets value of each
	// accepted batch's answer (bucket.Set.Header): the buckets of targets
	// this replica decides, so that reporters send it only their records.
	// "" leaves the header out (every record is for this replica).
	Buckets func() string
}

// Handler authenticates each POST, then decodes its batch and hands it to
// accept. In order, before the body is read: a request beyond
// MaxInFlight gets 503; no bearer token or a token the API server does
// not accept for the audience 401; a caller RBAC allows neither to
// create nodestats nor targetstats 403; the API server unreachable 503.
// Then bad batches get 400 with the reason, and a batch its caller may
// not send 403 (see authorize); an agent's pod records of pods its node
// does not run are dropped (see filterPods), not the batch. A node state
// header (stats.HeaderNodeState) it cannot read does not cost the batch
// its counts: the batch is accepted with a NodeState whose SocketRedirect
// is NodeStateUnreadable and whose Reason is the parse error, so the
// ServerlessServices name the node and why.
func Handler(o Options) http.Handler {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	inFlight := make(chan struct{}, o.MaxInFlight)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "stats: only POST is allowed", http.StatusMethodNotAllowed)
			return
		}
		select {
		case inFlight <- struct{}{}:
			defer func() { <-inFlight }()
		default:
			o.refuse(w, "too_many_in_flight", http.StatusServiceUnavailable, fmt.Sprintf("stats: %d requests already in flight; this period's batch is dropped", o.MaxInFlight))
			return
		}
		var caller *statsauth.Caller
		if o.Auth != nil {
			var ok bool
			if caller, ok = o.authenticate(w, r); !ok {
				return
			}
		}
		buf := bodies.Get().(*bytes.Buffer)
		buf.Reset()
		n, err := io.Copy(buf, io.LimitReader(r.Body, stats.MaxBatchBytes+1))
		if err != nil {
			putBody(buf)
			http.Error(w, "stats: read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if n > stats.MaxBatchBytes {
			putBody(buf)
			http.Error(w, fmt.Sprintf("stats: batch larger than %d bytes", stats.MaxBatchBytes), http.StatusRequestEntityTooLarge)
			return
		}
		b, err := stats.Decode(buf.Bytes()) // copies what it keeps
		putBody(buf)
		if err != nil {
			http.Error(w, "stats: "+err.Error(), http.StatusBadRequest)
			return
		}
		if h := r.Header.Get(stats.HeaderNodeState); h != "" {
			ns, err := stats.ParseNodeState(h)
			if err != nil {
				ns = stats.NodeState{SocketRedirect: NodeStateUnreadable, Reason: err.Error()}
			}
			b.NodeState = &ns
		}
		if caller != nil {
			if reason, err := authorize(caller, b); err != nil {
				o.refuse(w, reason, http.StatusForbidden, "stats: forbidden: "+err.Error())
				return
			}
			o.filterPods(b)
		}
		if err := o.Accept(b); err != nil {
			http.Error(w, "stats: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		o.Metrics.took(b)
		if o.Buckets != nil {
			if v := o.Buckets(); v != "" {
				w.Header().Set(stats.HeaderBuckets, v)
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// bodies are the buffers batches are read into: 5,000 agents post
// 10 kB each a second, and a fresh buffer grown to each batch was a
// twentieth of the controller's CPU in allocation and GC.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putBody returns buf to bodies unless an outsized batch grew it (up to
// stats.MaxBatchBytes): those are not kept.
func putBody(buf *bytes.Buffer) {
	if buf.Cap() <= 64<<10 {
		bodies.Put(buf)
	}
}

// authenticate reads the bearer token and asks o.Auth about it; when it
// returns false it has answered the request.
func (o *Options) authenticate(w http.ResponseWriter, r *http.Request) (*statsauth.Caller, bool) {
	token, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sockscale-controller stats"`)
		o.refuse(w, "no_token", http.StatusUnauthorized, fmt.Sprintf(
			"stats: unauthenticated: no bearer token: send a projected ServiceAccount token with audience %q in Authorization: Bearer", o.Auth.Audience()))
		return nil, false
	}
	caller, err := o.Auth.Authenticate(r.Context(), token)
	switch {
	case err == nil:
		return caller, true
	case errors.Is(err, statsauth.ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="sockscale-controller stats", error="invalid_token"`)
		o.refuse(w, "invalid_token", http.StatusUnauthorized, "stats: "+err.Error())
	case errors.Is(err, statsauth.ErrForbidden):
		o.refuse(w, "forbidden", http.StatusForbidden, "stats: "+err.Error())
	default:
		o.refuse(w, "review_failed", http.StatusServiceUnavailable, "stats: "+err.Error())
	}
	return nil, false
}

func bearer(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (o *Options) refuse(w http.ResponseWriter, reason string, code int, msg string) {
	o.Metrics.refused(reason)
	o.Log.Print(reason, msg)
	http.Error(w, msg, code)
}

// authorize says whether caller may send b (nil), or why not and the
// refusal's metric label. Agents (nodestats) send pod records and their
// node's state as the node their token is bound to; activators
// (targetstats) send target records as the pod their token is bound to
// (the collector keeps each activator's reports apart by that name).
func authorize(c *statsauth.Caller, b *stats.Batch) (string, error) {
	switch {
	case len(b.Pods) > 0 && len(b.Targets) > 0:
		return "mixed_batch", errors.New("a batch carries pod records (agents) or target records (activators), not both")
	case len(b.Targets) > 0 || (c.Activator && !c.Agent):
		if !c.Activator {
			return "wrong_kind", fmt.Errorf("%s may not send target records: that takes create on %s.%s (activators)", c.User, statsauth.ResourceTargetStats, statsauth.Group)
		}
		if len(b.Pods) > 0 || b.NodeState != nil {
			return "wrong_kind", fmt.Errorf("%s may not send pod records or a node state: that takes create on %s.%s (agents)", c.User, statsauth.ResourceNodeStats, statsauth.Group)
		}
		if c.Pod == "" {
			return "unbound_token", fmt.Errorf("%s's token is bound to no pod: mount a projected ServiceAccount token", c.User)
		}
		if b.Node != c.Pod {
			return "wrong_sender", fmt.Errorf("the batch names activator %q but the token of %s is bound to pod %q", b.Node, c.User, c.Pod)
		}
	default:
		if c.Node == "" {
			return "unbound_token", fmt.Errorf("%s's token names no node: mount a projected ServiceAccount token (pod-bound, Kubernetes >= 1.30)", c.User)
		}
		if b.Node != c.Node {
			return "wrong_node", fmt.Errorf("the batch is for node %q but the token of %s is bound to a pod on node %q", b.Node, c.User, c.Node)
		}
	}
	return "", nil
}

// filterPods drops the pod records of an agent's batch that its node does
// not run: a record of an autoscaled target counts only if the target's
// private Service has an endpoint at its address on b.Node (ready or
// not). Records of targets nobody autoscales are dropped without a word
// (the collector ignores them anyway), or kept with KeepUnwatched. One
// agent's lies thus reach at most its own node's pods.
func (o *Options) filterPods(b *stats.Batch) {
	if len(b.Pods) == 0 {
		return
	}
	places := o.Pods.PodNodes(b.Pods)
	kept := b.Pods[:0]
	for i, p := range b.Pods {
		switch pl := places[i]; {
		case !pl.Watched:
			if o.KeepUnwatched {
				kept = append(kept, p)
			}
		case pl.Node == "":
			o.Metrics.rejected("unknown_pod")
			o.Log.Print("unknown_pod", fmt.Sprintf("stats: dropped a record from node %q: %s/%s at %s is not an endpoint of %s/%s's private Service",
				b.Node, p.Namespace, p.Pod, p.IP, p.Namespace, p.Workload))
		case pl.Node != b.Node:
			o.Metrics.rejected("wrong_node")
			o.Log.Print("wrong_node", fmt.Sprintf("stats: dropped a record from node %q: %s/%s at %s runs on node %q",
				b.Node, p.Namespace, p.Pod, p.IP, pl.Node))
		default:
			kept = append(kept, p)
		}
	}
	b.Pods = kept
}
