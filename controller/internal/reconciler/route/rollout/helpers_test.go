package rollout

import (
	"time"

	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// t0 is a whole second, so float64 Unix nanoseconds are exact in tests.
var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// tt builds one traffic entry: latest(...) or pinned(...), then .tagged().
type tt servingv1alpha1.TrafficTargetStatus

func latest(config, rev string, pct int64) tt {
	return tt{ConfigurationName: config, RevisionName: rev, LatestRevision: ptr.To(true), Percent: ptr.To(pct)}
}

func pinned(rev string, pct int64) tt {
	return tt{RevisionName: rev, LatestRevision: ptr.To(false), Percent: ptr.To(pct)}
}

func (t tt) tagged(tag string) tt {
	t.Tag, t.URL = tag, "http://"+tag+"-hello.default.example.com"
	return t
}

func split(ts ...tt) []servingv1alpha1.TrafficTargetStatus {
	out := make([]servingv1alpha1.TrafficTargetStatus, len(ts))
	for i, t := range ts {
		out[i] = servingv1alpha1.TrafficTargetStatus(t)
	}
	return out
}

func shares(kv ...any) []Share {
	var out []Share
	for i := 0; i < len(kv); i += 2 {
		out = append(out, Share{RevisionName: kv[i].(string), Percent: kv[i+1].(int)})
	}
	return out
}

func sum(ts []servingv1alpha1.TrafficTargetStatus) int64 {
	var n int64
	for _, t := range ts {
		if t.Percent != nil {
			n += *t.Percent
		}
	}
	return n
}
