package drain

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The preStop wait's bounds: a kubelet ends the hook with the pod's grace
// period anyway, so the default only bounds a hook called by hand.
const (
	DefaultWaitTimeout = 10 * time.Minute
	MaxWaitTimeout     = time.Hour
	// noneLeavingGrace is how long a wait for pods the agent does not see
	// leaving lasts: the kubelet calls the hook right after the deletion,
	// which the agent's watch shows a moment later.
	noneLeavingGrace = 2 * time.Second
	// maxWaits bounds the waits in progress: one per leaving pod is the
	// need, 110 pods a node the kubelet's default.
	maxWaits = 512
)

// Handler serves a preStop hook's wait, GET
// /drain?namespace=NS&workload=NAME[&timeout=DURATION]: it answers once
// every leaving pod of that workload on this node is drained (or the
// timeout passed, or none is leaving), so the kubelet stops the pod's
// containers only then. The answer is 200 in each case (its body says
// which); 400 names a bad parameter. The workload is what the agent's
// metrics call it: a Deployment's name for its pods.
func (d *Drainer) Handler() http.Handler {
	slots := make(chan struct{}, maxWaits)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "the drain wait is GET /drain?namespace=NS&workload=NAME[&timeout=DURATION]", http.StatusMethodNotAllowed)
			return
		}
		ns, workload, timeout, err := waitParams(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			http.Error(w, fmt.Sprintf("%d drain waits in progress already; not waiting", maxWaits), http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		start := d.clock.Now()
		res := d.Wait(ctx, ns, workload, noneLeavingGrace)
		took := d.clock.Since(start).Round(time.Millisecond)
		switch {
		case res.Pods == 0:
			fmt.Fprintf(w, "no pod of %s/%s is leaving this node (waited %s)\n", ns, workload, took)
		case res.Drained == res.Pods:
			fmt.Fprintf(w, "drained %d pod(s) of %s/%s in %s\n", res.Pods, ns, workload, took)
		default:
			d.metrics.waitTimeouts.Inc()
			fmt.Fprintf(w, "stopped waiting after %s: %d of %d pod(s) of %s/%s drained, %d request(s) in flight\n",
				took, res.Drained, res.Pods, ns, workload, res.InFlight)
		}
	})
}

// waitParams reads and checks a wait's query.
func waitParams(r *http.Request) (ns, workload string, timeout time.Duration, err error) {
	q := r.URL.Query()
	ns, workload = q.Get("namespace"), q.Get("workload")
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", 0, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(workload); len(errs) > 0 {
		return "", "", 0, fmt.Errorf("workload %q (the pods' Deployment or other owner): %s", workload, strings.Join(errs, "; "))
	}
	timeout = DefaultWaitTimeout
	if v := q.Get("timeout"); v != "" {
		timeout, err = time.ParseDuration(v)
		if err != nil || timeout < time.Second || timeout > MaxWaitTimeout {
			return "", "", 0, fmt.Errorf("timeout %q: a duration from 1s to %s, e.g. 30s", v, MaxWaitTimeout)
		}
	}
	return ns, workload, timeout, nil
}
