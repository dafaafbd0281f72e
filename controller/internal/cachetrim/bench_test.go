package cachetrim

import (
	"encoding/json"
	"runtime"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// BenchmarkCachedBytes measures what one object sockscale does not
// control holds in the cache, whole (managed fields dropped, as before
// this package) and trimmed: decoded as the informer decodes it, kept, and
// the live heap divided by the objects kept. ns/op is the decoding plus
// the transform.
func BenchmarkCachedBytes(b *testing.B) {
	deployment, err := json.Marshal(userDeployment("cart"))
	if err != nil {
		b.Fatal(err)
	}
	slice, err := json.Marshal(userSlice("cart", 100))
	if err != nil {
		b.Fatal(err)
	}
	for _, o := range []struct {
		name      string
		raw       []byte
		new       func() any
		transform toolscache.TransformFunc
	}{
		{"Deployment/whole", deployment, func() any { return new(appsv1.Deployment) }, stripManagedFields},
		{"Deployment/trimmed", deployment, func() any { return new(appsv1.Deployment) }, Deployment},
		{"EndpointSlice-100/whole", slice, func() any { return new(discoveryv1.EndpointSlice) }, stripManagedFields},
		{"EndpointSlice-100/trimmed", slice, func() any { return new(discoveryv1.EndpointSlice) }, EndpointSlice},
	} {
		b.Run(o.name, func(b *testing.B) {
			kept := make([]any, 0, b.N)
			before := liveHeap()
			for range b.N {
				obj := o.new()
				if err := json.Unmarshal(o.raw, obj); err != nil {
					b.Fatal(err)
				}
				out, err := o.transform(obj)
				if err != nil {
					b.Fatal(err)
				}
				kept = append(kept, out)
			}
			b.StopTimer()
			b.ReportMetric(float64(liveHeap()-before)/float64(b.N), "cached-B/object")
			runtime.KeepAlive(kept)
		})
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
