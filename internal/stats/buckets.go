package stats

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// BucketOf is the bucket of the target namespace/workload (the workload a
// PodStat names: the Deployment a PodAutoscaler scales) among count
// buckets: FNV-1a of "namespace/workload", modulo count. Controller
// replicas split targets by it and reporters route records by it, so
// both sides must compute it alike: it is part of the protocol.
func BucketOf(namespace, workload string, count int) int {
	h := fnv.New32a()
	h.Write([]byte(namespace))
	h.Write([]byte{'/'})
	h.Write([]byte(workload))
	return int(h.Sum32() % uint32(count))
}

// HeaderBuckets is the header of a replica's answer to a batch that says
// which buckets of targets that replica decides: "<count>;<bucket>,<bucket>,..." ("4;0,2":
// buckets 0 and 2 of 4; "4;": none, a standby). Reporters send a pod
// record only to the replicas holding its target's bucket. A replica
// that splits nothing leaves it out, and then gets every record.
const HeaderBuckets = "Sockscale-Buckets"

// MaxBuckets bounds the count of HeaderBuckets (a held set fits one
// 64-bit word).
const MaxBuckets = 64

// Buckets is a replica's HeaderBuckets: Count buckets, bit i of Held
// set for each bucket i it holds.
type Buckets struct {
	Count int
	Held  uint64
}

// Holds tells whether bucket i is among b's.
func (b Buckets) Holds(i int) bool { return i >= 0 && i < b.Count && b.Held&(1<<uint(i)) != 0 }

// String is the HeaderBuckets value of b.
func (b Buckets) String() string {
	var sb strings.Builder
	sb.WriteString(strconv.Itoa(b.Count))
	sb.WriteByte(';')
	first := true
	for i := range b.Count {
		if b.Holds(i) {
			if !first {
				sb.WriteByte(',')
			}
			first = false
			sb.WriteString(strconv.Itoa(i))
		}
	}
	return sb.String()
}

// ParseBuckets reads a HeaderBuckets value.
func ParseBuckets(v string) (Buckets, error) {
	count, list, ok := strings.Cut(v, ";")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 2 || n > MaxBuckets {
		return Buckets{}, fmt.Errorf("%s %q: want <count 2..%d>;<bucket>,... e.g. 4;0,2", HeaderBuckets, v, MaxBuckets)
	}
	b := Buckets{Count: n}
	if list == "" {
		return b, nil
	}
	for _, f := range strings.Split(list, ",") {
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 || i >= n {
			return Buckets{}, fmt.Errorf("%s %q: bucket %q is not in 0..%d", HeaderBuckets, v, f, n-1)
		}
		b.Held |= 1 << uint(i)
	}
	return b, nil
}

// Split returns the batch to post to each replica, given the buckets each
// named in its last answer (a zero Buckets: none named, it takes every
// record): b itself for a replica that takes every record, else a copy
// with the pod records of the buckets it holds and those no replica
// claims (a bucket changing hands), so that routing drops no record.
// Target records and the node state stay in every copy.
func Split(b *Batch, routes []Buckets) []*Batch {
	out := make([]*Batch, len(routes))
	splitting := false
	for i, rt := range routes {
		if rt.Count == 0 {
			out[i] = b
		} else {
			splitting = true
		}
	}
	if !splitting {
		return out
	}
	pods := make([][]PodStat, len(routes))
	for _, p := range b.Pods {
		claimed := false
		for i, rt := range routes {
			if rt.Count > 0 && rt.Holds(BucketOf(p.Namespace, p.Workload, rt.Count)) {
				pods[i], claimed = append(pods[i], p), true
			}
		}
		if claimed {
			continue
		}
		for i, rt := range routes {
			if rt.Count > 0 {
				pods[i] = append(pods[i], p)
			}
		}
	}
	for i, rt := range routes {
		if rt.Count > 0 {
			part := *b
			part.Pods = pods[i]
			out[i] = &part
		}
	}
	return out
}
