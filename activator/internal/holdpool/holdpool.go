package holdpool

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of Hold and Release, checked with errors.Is.
var (
	// ErrFull: the pool holds its capacity and the namespace already
	// holds its fair share, so nothing is shed for it (Hold).
	ErrFull = errors.New("held requests at the activator's limit")
	// ErrShed: the request was shed to admit a request of a namespace
	// holding less than its fair share. The context Hold returned ends
	// with a cause wrapping it, and Release returns an error wrapping it
	// when the shedding came first.
	ErrShed = errors.New("held request shed")
)

// Reasons, the values of the reason label of the refusals counter.
const (
	ReasonFull = "full"
	ReasonShed = "shed"
)

// Options configure a Pool.
type Options struct {
	// Capacity is the most requests held at once, all namespaces
	// together (>= 1).
	Capacity int
	// Registerer gets the pool's metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Pool counts held requests by namespace. While it holds fewer than its
// capacity it admits every request. When full it is max-min fair: a
// request of a namespace holding less than its fair share (capacity / the
// namespaces holding, itself included) takes the place of the newest
// request of the namespace holding the most, if that one holds at least
// two more (else the exchange would change nothing); any other request is
// refused. So one namespace's flood fills an idle pool but cannot keep
// another namespace from holding its share. The newest is shed because
// it has waited least and the oldest are next for a pod. Its methods are
// safe for concurrent use.
type Pool struct {
	capacity int
	m        *metrics

	mu   sync.Mutex
	held int
	byNS map[string]*list.List // of *Ticket, oldest first; no empty lists
}

// Ticket is one admitted request's place in the pool.
type Ticket struct {
	p      *Pool
	ns     string
	elem   *list.Element
	cancel context.CancelCauseFunc
	// Under p.mu: done once released or shed.
	done, shed bool
}

// New returns an empty pool. A capacity below 1 is taken as 1.
func New(o Options) *Pool {
	p := &Pool{capacity: max(o.Capacity, 1), byNS: make(map[string]*list.List)}
	p.m = newMetrics(o.Registerer, p.capacity)
	return p
}

// Capacity is the most requests the pool holds at once.
func (p *Pool) Capacity() int { return p.capacity }

// Held is how many requests namespace ns holds ("": all namespaces).
func (p *Pool) Held(ns string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ns == "" {
		return p.held
	}
	if l := p.byNS[ns]; l != nil {
		return l.Len()
	}
	return 0
}

// Hold admits a request of namespace ns, or refuses it with an error
// wrapping ErrFull. An admitted request waits with the returned context,
// ctx's child, which is cancelled with cause ErrShed if the pool sheds
// it. The caller calls Release when the request is no longer held: before
// it is forwarded (and must not forward it if Release says it was shed),
// and when it fails or its client leaves (a deferred Release does).
func (p *Pool) Hold(ctx context.Context, ns string) (context.Context, *Ticket, error) {
	p.mu.Lock()
	var victim *Ticket
	if p.held >= p.capacity {
		mine := 0
		namespaces := len(p.byNS)
		if l := p.byNS[ns]; l != nil {
			mine = l.Len()
		} else {
			namespaces++
		}
		share := p.capacity / namespaces
		most := p.most()
		if mine >= share || most == nil || most.Len() < mine+2 {
			p.mu.Unlock()
			p.m.refusals.WithLabelValues(ReasonFull).Inc()
			return nil, nil, fmt.Errorf("%w (%d, --max-held) and namespace %q holds %d, its fair share or more (%d of them for each of %d namespaces holding)",
				ErrFull, p.capacity, ns, mine, share, namespaces)
		}
		victim = most.Back().Value.(*Ticket)
		p.remove(victim)
		victim.shed = true
	}
	hctx, cancel := context.WithCancelCause(ctx)
	t := &Ticket{p: p, ns: ns, cancel: cancel}
	l := p.byNS[ns]
	if l == nil {
		l = list.New()
		p.byNS[ns] = l
	}
	t.elem = l.PushBack(t)
	p.held++
	p.m.held.Set(float64(p.held))
	p.mu.Unlock()
	if victim != nil {
		p.m.refusals.WithLabelValues(ReasonShed).Inc()
		victim.cancel(fmt.Errorf("%w: the activator held its most requests (%d, --max-held), namespace %q the most of them, and namespace %q, holding less than its fair share, needed a place",
			ErrShed, p.capacity, victim.ns, ns))
	}
	return hctx, t, nil
}

// most is the list of the namespace holding the most, nil if none; ties
// go to the first found. It scans the namespaces holding, only when the
// pool is full. Called with p.mu held.
func (p *Pool) most() *list.List {
	var best *list.List
	for _, l := range p.byNS {
		if best == nil || l.Len() > best.Len() {
			best = l
		}
	}
	return best
}

// remove takes t out of the pool and marks it done. Called with p.mu held.
func (p *Pool) remove(t *Ticket) {
	l := p.byNS[t.ns]
	l.Remove(t.elem)
	if l.Len() == 0 {
		delete(p.byNS, t.ns)
	}
	t.done = true
	p.held--
	p.m.held.Set(float64(p.held))
}

// Release frees the request's place. It returns nil, or an error wrapping
// ErrShed when the pool shed the request first (its place was given away
// and its context cancelled: it must not be forwarded). Calling it again
// returns what the first call did.
func (t *Ticket) Release() error {
	p := t.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.shed {
		return fmt.Errorf("%w to admit another namespace's", ErrShed)
	}
	if !t.done {
		p.remove(t)
	}
	return nil
}
