package socketlayer

import (
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/internal/stats"
)

const (
	// SilentAfter is how long a node goes unheard before it counts as out
	// of sync. Agents report every second by default; 10 misses is a dead
	// agent, an unreachable node or a partition, not a late packet.
	SilentAfter = 10 * time.Second
	// ForgetAfter is how long a silent node is kept before it is dropped
	// (it left the cluster, or its agent was uninstalled from it).
	ForgetAfter = 10 * time.Minute
)

// Silent is the state of a node whose agent stopped reporting. It is the
// controller's, never sent by an agent.
const Silent stats.RedirectState = "silent"

// NodeState is one node's state as the Tracker holds it.
type NodeState struct {
	Node   string
	State  stats.RedirectState
	Reason string
}

// Summary is the nodes' states at one moment.
type Summary struct {
	// Warm: the Tracker has listened for SilentAfter, long enough for
	// every running agent to have reported.
	Warm bool
	// Active counts the nodes where the redirect is in effect.
	Active int
	// Others are the nodes where it is not, sorted by node name.
	Others []NodeState
}

// Reporting says whether any node reports its state.
func (s Summary) Reporting() bool { return s.Active > 0 || len(s.Others) > 0 }

// key identifies what the conditions are made of: the nodes that are not
// active and why, whether any node reports, and whether the Tracker is warm. The number of active
// nodes is left out, so nodes joining the cluster do not rewrite every
// ServerlessService.
func (s Summary) key() string {
	var b strings.Builder
	if s.Warm {
		b.WriteString("warm\n")
	}
	if s.Reporting() {
		b.WriteString("reporting\n")
	}
	for _, n := range s.Others {
		b.WriteString(n.Node + "\x00" + string(n.State) + "\x00" + n.Reason + "\n")
	}
	return b.String()
}

// Tracker keeps each node's latest state. It is safe for concurrent use:
// the stats handler records while reconcilers read.
type Tracker struct {
	clock   clock.PassiveClock
	started time.Time
	mu      sync.Mutex
	nodes   map[string]heard
}

type heard struct {
	state stats.NodeState
	at    time.Time
}

// NewTracker returns an empty Tracker reading time from clk.
func NewTracker(clk clock.PassiveClock) *Tracker {
	return &Tracker{clock: clk, started: clk.Now(), nodes: make(map[string]heard)}
}

// Record notes a batch's node state; batches without one (activators,
// agents that predate it) are ignored.
func (t *Tracker) Record(b *stats.Batch) {
	if b.NodeState == nil || b.Node == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nodes[b.Node] = heard{state: *b.NodeState, at: t.clock.Now()}
}

// Summary returns the nodes' states now, forgetting those silent for
// ForgetAfter.
func (t *Tracker) Summary() Summary {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Summary{Warm: now.Sub(t.started) >= SilentAfter}
	for node, h := range t.nodes {
		switch age := now.Sub(h.at); {
		case age >= ForgetAfter:
			delete(t.nodes, node)
		case age >= SilentAfter:
			s.Others = append(s.Others, NodeState{Node: node, State: Silent,
				Reason: "no report from its agent since " + h.at.UTC().Format(time.RFC3339)})
		case h.state.SocketRedirect == stats.RedirectActive:
			s.Active++
		default:
			s.Others = append(s.Others, NodeState{Node: node, State: h.state.SocketRedirect, Reason: h.state.Reason})
		}
	}
	slices.SortFunc(s.Others, func(a, b NodeState) int { return strings.Compare(a.Node, b.Node) })
	return s
}
