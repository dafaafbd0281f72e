package endpoints

import (
	"hash/fnv"
	"sort"
)

// Subset picks n of the activators for a target by rendezvous hashing: each
// target ranks every activator by hash(target, activator) and takes the top
// n. Targets spread evenly over activators, and adding or removing one
// activator moves only the targets that ranked it in their top n.
func Subset(target string, activators []string, n int) []string {
	if n >= len(activators) {
		out := append([]string(nil), activators...)
		sort.Strings(out)
		return out
	}
	type ranked struct {
		name  string
		score uint64
	}
	rs := make([]ranked, len(activators))
	for i, a := range activators {
		h := fnv.New64a()
		_, _ = h.Write([]byte(target))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(a))
		rs[i] = ranked{a, mix(h.Sum64())}
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].score != rs[j].score {
			return rs[i].score > rs[j].score
		}
		return rs[i].name < rs[j].name
	})
	out := make([]string, n)
	for i := range out {
		out[i] = rs[i].name
	}
	sort.Strings(out)
	return out
}

// mix spreads FNV's bits (names that differ in their last byte differ
// mostly in low bits) so comparing scores is fair: splitmix64's finaliser.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
