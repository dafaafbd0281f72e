package kedascaler_test

import (
	"maps"
	"sync"

	"github.com/sockscale/sockscale/controller/internal/kedascaler"
)

type targetKey struct{ namespace, workload string }

// fakeSource is a Source that behaves as the stats store does: Target is
// the load the test set (ok false for a target never set), WhenActive
// one channel per target, closed the moment a request is in flight and
// replaced by a fresh one when the target goes idle.
type fakeSource struct {
	mu       sync.Mutex
	loads    map[targetKey]kedascaler.Load
	inFlight map[targetKey]bool
	wake     map[targetKey]chan struct{}
	// asked are the namespaces the scaler read; whenActiveCalls counts
	// WhenActive's calls.
	asked           map[string]bool
	whenActiveCalls int
	// missing are Deployments that do not exist; lookupErr, if set, is
	// every lookup's error.
	missing   map[targetKey]bool
	lookupErr error
}

func newFakeSource() *fakeSource {
	return &fakeSource{loads: map[targetKey]kedascaler.Load{}, inFlight: map[targetKey]bool{},
		wake: map[targetKey]chan struct{}{}, asked: map[string]bool{}, missing: map[targetKey]bool{}}
}

func (f *fakeSource) Target(namespace, workload string) (kedascaler.Load, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[namespace] = true
	l, ok := f.loads[targetKey{namespace, workload}]
	return l, ok
}

func (f *fakeSource) Exists(namespace, workload string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.missing[targetKey{namespace, workload}], f.lookupErr
}

func (f *fakeSource) WhenActive(namespace, workload string) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[namespace] = true
	f.whenActiveCalls++
	return f.channel(targetKey{namespace, workload})
}

// channel is k's current channel; the caller holds mu.
func (f *fakeSource) channel(k targetKey) chan struct{} {
	c, ok := f.wake[k]
	if !ok {
		c = make(chan struct{})
		f.wake[k] = c
	}
	return c
}

// set makes l the target's load.
func (f *fakeSource) set(namespace, workload string, l kedascaler.Load) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads[targetKey{namespace, workload}] = l
}

// start says a request is in flight or held now: WhenActive fires.
func (f *fakeSource) start(namespace, workload string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := targetKey{namespace, workload}
	if !f.inFlight[k] {
		f.inFlight[k] = true
		close(f.channel(k))
	}
}

// stop says nothing is in flight any more: WhenActive waits again.
func (f *fakeSource) stop(namespace, workload string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := targetKey{namespace, workload}
	if f.inFlight[k] {
		f.inFlight[k] = false
		f.wake[k] = make(chan struct{})
	}
}

func (f *fakeSource) askedNamespaces() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.asked)
}

func (f *fakeSource) whenActiveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.whenActiveCalls
}
