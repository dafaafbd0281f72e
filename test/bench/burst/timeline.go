package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// step is a value from the moment a watch event brought it.
type step[T comparable] struct {
	at time.Time
	v  T
}

// series is one target's value over time, a new step only when it changed.
type series[T comparable] []step[T]

func (s *series[T]) add(at time.Time, v T) {
	if n := len(*s); n > 0 && (*s)[n-1].v == v {
		return
	}
	*s = append(*s, step[T]{at, v})
}

// timeline keeps, per target, whether its ServerlessService was in Proxy
// mode and how many pods its Deployment had ready, as the watches saw them.
// A watch event arrives within milliseconds of the write, far finer than
// the seconds the rows measure.
type timeline struct {
	mu     sync.Mutex
	proxy  map[string]*series[bool]
	ready  map[string]*series[int32]
	errors int
	log    io.Writer
}

func newTimeline(log io.Writer) *timeline {
	return &timeline{proxy: map[string]*series[bool]{}, ready: map[string]*series[int32]{}, log: log}
}

// follow watches list's objects in ns until ctx ends, watching again
// whenever the API server ends a watch (they time out after minutes).
func (tl *timeline) follow(ctx context.Context, wc client.WithWatch, list client.ObjectList, ns string) {
	for ctx.Err() == nil {
		w, err := wc.Watch(ctx, list, client.InNamespace(ns))
		if err != nil {
			tl.failed(fmt.Errorf("watch %T: %w", list, err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		tl.drain(ctx, w.ResultChan())
		w.Stop()
	}
}

func (tl *timeline) drain(ctx context.Context, events <-chan watch.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			tl.observe(time.Now(), ev.Object)
		}
	}
}

func (tl *timeline) failed(err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.errors++
	fmt.Fprintln(tl.log, "burst: timeline:", err)
}

// failures is how many times a watch could not be started.
func (tl *timeline) failures() int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.errors
}

func (tl *timeline) observe(at time.Time, o any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	switch o := o.(type) {
	case *v1alpha1.ServerlessService:
		if o.Status.Mode == "" {
			return // not reconciled yet
		}
		s := tl.proxy[o.Name]
		if s == nil {
			s = &series[bool]{}
			tl.proxy[o.Name] = s
		}
		s.add(at, o.Status.Mode == v1alpha1.ModeProxy)
	case *appsv1.Deployment:
		s := tl.ready[o.Name]
		if s == nil {
			s = &series[int32]{}
			tl.ready[o.Name] = s
		}
		s.add(at, o.Status.ReadyReplicas)
	}
}

// mode is the target's last seen mode: proxy, and whether any was seen.
func (tl *timeline) mode(name string) (proxy, known bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	s := tl.proxy[name]
	if s == nil || len(*s) == 0 {
		return false, false
	}
	return (*s)[len(*s)-1].v, true
}

// proxyTime is how long within [from, to] the target was in Proxy mode.
func (tl *timeline) proxyTime(name string, from, to time.Time) time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	s := tl.proxy[name]
	if s == nil {
		return 0
	}
	return timeIn(*s, true, from, to)
}

// maxReady is the most pods the target had ready within [from, to].
func (tl *timeline) maxReady(name string, from, to time.Time) int32 {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	s := tl.ready[name]
	if s == nil {
		return 0
	}
	return maxIn(*s, from, to)
}

// timeIn is how long within [from, to] s had the value v (the value before
// s's first step is unknown and not counted).
func timeIn[T comparable](s series[T], v T, from, to time.Time) time.Duration {
	var d time.Duration
	for i, st := range s {
		end := to
		if i+1 < len(s) && s[i+1].at.Before(to) {
			end = s[i+1].at
		}
		start := st.at
		if start.Before(from) {
			start = from
		}
		if st.v == v && end.After(start) {
			d += end.Sub(start)
		}
	}
	return d
}

// maxIn is the largest value s had within [from, to]: the one in force at
// from and those set before to.
func maxIn(s series[int32], from, to time.Time) int32 {
	var m int32
	for i, st := range s {
		if st.at.After(to) {
			break
		}
		if i+1 < len(s) && !s[i+1].at.After(from) {
			continue // replaced before the window
		}
		m = max(m, st.v)
	}
	return m
}
