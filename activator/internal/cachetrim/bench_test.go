package cachetrim

import (
	"encoding/json"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// BenchmarkCachedBytes measures what one object the activator does not
// read much of holds in the cache, whole (as before this package: managed
// fields included) and trimmed: decoded as the informer decodes it, kept,
// and the live heap divided by the objects kept. json-B/object is the
// object's JSON size after the transform. ns/op is the decoding plus the
// transform.
func BenchmarkCachedBytes(b *testing.B) {
	benchPod := userPod("shop", "hello-7d9f8-abcde", "10.244.1.7", map[string]string{"app": "hello", "pod-template-hash": "7d9f8"})
	public := userService("shop", "cart")
	private := userService("shop", "hello-private")
	for _, o := range []struct {
		name      string
		obj       any
		new       func() any
		transform toolscache.TransformFunc
	}{
		{"Service/whole", public, func() any { return new(corev1.Service) }, whole},
		{"Service/trimmed", public, func() any { return new(corev1.Service) }, Service},
		{"EndpointSlice-100/whole", userSlice(public, 100), func() any { return new(discoveryv1.EndpointSlice) }, whole},
		{"EndpointSlice-100/trimmed", userSlice(public, 100), func() any { return new(discoveryv1.EndpointSlice) }, EndpointSlice},
		{"PrivateEndpointSlice-100/whole", userSlice(private, 100), func() any { return new(discoveryv1.EndpointSlice) }, whole},
		{"PrivateEndpointSlice-100/trimmed", userSlice(private, 100), func() any { return new(discoveryv1.EndpointSlice) }, EndpointSlice},
		{"Ingress/whole", userIngress("shop", "cart", "cart"), func() any { return new(networkingv1.Ingress) }, whole},
		{"Ingress/trimmed", userIngress("shop", "cart", "cart"), func() any { return new(networkingv1.Ingress) }, Ingress},
		{"Pod/whole", benchPod, func() any { return new(corev1.Pod) }, whole},
		{"Pod/trimmed", benchPod, func() any { return new(corev1.Pod) }, Pod},
	} {
		raw, err := json.Marshal(o.obj)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(o.name, func(b *testing.B) {
			kept := make([]any, 0, b.N)
			before := liveHeap()
			for range b.N {
				obj := o.new()
				if err := json.Unmarshal(raw, obj); err != nil {
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
			out, err := json.Marshal(kept[0])
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(out)), "json-B/object")
			runtime.KeepAlive(kept)
		})
	}
}

// whole is the cache as it was: no transform.
func whole(in any) (any, error) { return in, nil }

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
