package holdpool

// DefaultCapacity is the pool's capacity when the activator's container
// has no memory limit to derive it from: one target's full queue at the
// default --queue-depth (throttle.DefaultQueueDepth), ~170 MB of held
// requests at the measured ~17 KB each (docs/benchmarks.md).
const DefaultCapacity = 10_000

// RequestCost is the memory budgeted per held request when the capacity
// is derived from a memory limit: ~17 KB measured (its connection's
// buffers and two goroutines, docs/benchmarks.md), plus up to 64 KiB of
// request body an h2c stream may have buffered before it is forwarded
// (handler.NewServer's per-stream window), rounded up to 96 KiB for what
// the measurement did not see (large headers, the garbage collector's
// headroom).
const RequestCost = 96 << 10

// MemoryShare is the part of the memory limit given to held requests: the
// rest is for the requests being forwarded, the caches of the cluster's
// objects and the runtime.
const MemoryShare = 0.5

// CapacityFor derives the capacity from the container's memory limit in
// bytes: MemoryShare of it divided by RequestCost (at least 1), or
// DefaultCapacity when limit is 0 (no limit).
func CapacityFor(limit int64) int {
	if limit <= 0 {
		return DefaultCapacity
	}
	return int(max(int64(float64(limit)*MemoryShare)/RequestCost, 1))
}
