package stats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"
)

// Path is where controllers accept batches.
const Path = "/v1/stats"

// ContentType marks a batch in HTTP.
const ContentType = "application/vnd.sockscale.stats.v1"

// MaxBatchBytes bounds what a receiver reads: far above any real node
// (110 pods is ~10 KB), far below what could hurt a controller.
const MaxBatchBytes = 4 << 20

const (
	magic = "SSST"
	// Version 1 carries pod records only; version 2 adds target records
	// (activators); version 3 adds each pod's accounting to its record and
	// always has a target count; version 4 is version 3 with 16-byte pod
	// addresses, for IPv6 pods. Append writes the lowest version that
	// holds a batch, so agents stay readable by controllers that predate
	// the newer versions during a rolling upgrade; Decode reads all four.
	versionPods       = 1
	versionTargets    = 2
	versionAccounting = 3
	versionIPv6       = 4
	// maxName bounds names: Kubernetes names are at most 253 bytes.
	maxName = 253
)

// PodStat is one pod's requests over one period.
type PodStat struct {
	IP        netip.Addr
	Namespace string
	Pod       string
	// Workload names what the pod belongs to in its namespace (for a
	// Deployment's pod, the Deployment).
	Workload string
	// Concurrency is the average number of requests in flight, proxied ones
	// included; ProxiedConcurrency the average of those from activators.
	Concurrency, ProxiedConcurrency float64
	// Requests completed in the period; ProxiedRequests of those through
	// an activator.
	Requests, ProxiedRequests uint64
	// Accounting says how the pod's requests were counted in the period.
	Accounting Accounting
	// OpaqueConcurrency is the part of Concurrency that came from
	// connections counted at connection level (AccountingConnections),
	// each one request in flight for its whole life. It is at most
	// Concurrency, and 0 unless Accounting is AccountingConnections.
	OpaqueConcurrency float64
}

// Accounting says how a pod's requests were counted in a period. The zero
// value is what pods reported before version 3 could say otherwise.
type Accounting uint8

const (
	// AccountingHTTP1Requests says every connection was parsed as HTTP/1.x,
	// each request counted.
	AccountingHTTP1Requests Accounting = iota
	// AccountingHTTP2Streams says some connections were HTTP/2 with prior
	// knowledge (h2c, gRPC), each of their streams counted as a request;
	// none was at connection level.
	AccountingHTTP2Streams
	// AccountingConnections says some connections were neither HTTP/1.x nor
	// HTTP/2 with prior knowledge (TLS, other protocols, HTTP/2 frames
	// that could not be followed), each counted as one request in flight
	// for its whole life.
	AccountingConnections
)

// String names the accounting as the errors and logs show it.
func (a Accounting) String() string {
	switch a {
	case AccountingHTTP1Requests:
		return "HTTP/1 requests"
	case AccountingHTTP2Streams:
		return "HTTP/2 streams"
	case AccountingConnections:
		return "connections"
	}
	return fmt.Sprintf("accounting %d", uint8(a))
}

// hasAccounting says whether the record carries what only version 3 can
// say.
func (p *PodStat) hasAccounting() bool {
	return p.Accounting != AccountingHTTP1Requests || p.OpaqueConcurrency != 0
}

// checkAccounting says what is wrong with the record's accounting, if
// anything.
func (p *PodStat) checkAccounting() error {
	switch {
	case p.Accounting > AccountingConnections:
		return fmt.Errorf("accounting %d: want %d (%s), %d (%s) or %d (%s)", uint8(p.Accounting),
			AccountingHTTP1Requests, AccountingHTTP1Requests, AccountingHTTP2Streams, AccountingHTTP2Streams, AccountingConnections, AccountingConnections)
	case p.OpaqueConcurrency > p.Concurrency:
		return fmt.Errorf("opaque concurrency %v exceeds the concurrency %v it is part of", p.OpaqueConcurrency, p.Concurrency)
	case p.OpaqueConcurrency > 0 && p.Accounting != AccountingConnections:
		return fmt.Errorf("opaque concurrency %v with accounting %s: only a pod counted per connection has opaque connections", p.OpaqueConcurrency, p.Accounting)
	}
	return nil
}

// HasAccounting says whether some pod record carries an accounting other
// than the default (HTTP/1 requests, no opaque concurrency): only then is
// the batch encoded as version 3 (or 4, which carries the accounting too).
func (b *Batch) HasAccounting() bool {
	for i := range b.Pods {
		if b.Pods[i].hasAccounting() {
			return true
		}
	}
	return false
}

// HasIPv6 says whether some pod record's address is IPv6: only then is
// the batch encoded as version 4.
func (b *Batch) HasIPv6() bool {
	for i := range b.Pods {
		if b.Pods[i].IP.Is6() {
			return true
		}
	}
	return false
}

// WithoutIPv6 returns b, or a copy of it without the pod records whose
// address is IPv6, so that it encodes as version 3 or lower: what a
// controller that predates version 4 reads. dropped counts the records
// left out.
func (b *Batch) WithoutIPv6() (_ *Batch, dropped int) {
	if !b.HasIPv6() {
		return b, 0
	}
	c := *b
	c.Pods = make([]PodStat, 0, len(b.Pods))
	for _, p := range b.Pods {
		if p.IP.Is6() {
			dropped++
			continue
		}
		c.Pods = append(c.Pods, p)
	}
	return &c, dropped
}

// Version is the version Append writes b in: the lowest that holds it.
func (b *Batch) Version() byte {
	switch {
	case b.HasIPv6():
		return versionIPv6
	case b.HasAccounting():
		return versionAccounting
	case len(b.Targets) > 0:
		return versionTargets
	}
	return versionPods
}

// WithoutAccounting returns b, or a copy of it whose pod records have the
// default accounting, so that it encodes as version 1 or 2: what a
// controller that predates version 3 reads.
func (b *Batch) WithoutAccounting() *Batch {
	if !b.HasAccounting() {
		return b
	}
	c := *b
	c.Pods = make([]PodStat, len(b.Pods))
	for i, p := range b.Pods {
		p.Accounting, p.OpaqueConcurrency = AccountingHTTP1Requests, 0
		c.Pods[i] = p
	}
	return &c
}

// TargetStat is what one activator saw for one target over one period:
// the requests it held or forwarded. Pods count forwarded requests as
// proxied and leave them out, so each request is counted once.
type TargetStat struct {
	Namespace string
	// Workload names the target in its namespace as PodStat.Workload does
	// (the Deployment), so both add up in the same windows.
	Workload string
	// Concurrency is the average number of requests held or in flight
	// through the activator.
	Concurrency float64
	// Requests that arrived in the period. Arrivals, not completions: a
	// request held while its target scales from zero must count while it
	// waits, or a target scaled on requests per second would never wake.
	Requests uint64
}

// Batch is what one reporter (a node's agent, or an activator) reports for
// one period.
type Batch struct {
	// Node names the reporter: the node of an agent, the pod of an
	// activator.
	Node string
	// Start is when the reporter's period began, by its clock; the
	// controller places a report by its own clock and Period instead.
	Start   time.Time
	Period  time.Duration
	Pods    []PodStat
	Targets []TargetStat
	// NodeState is an agent's node state; nil from activators and from
	// agents that predate it. It travels in HeaderNodeState, not in the
	// encoding: Append and Decode leave it alone.
	NodeState *NodeState
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed stats batch")

// Append encodes b at the end of dst.
func Append(dst []byte, b *Batch) ([]byte, error) {
	if b.Period <= 0 {
		return nil, fmt.Errorf("encode stats: period %v must be positive", b.Period)
	}
	version := b.Version()
	dst = append(dst, magic...)
	dst = append(dst, version)
	dst = appendString(dst, b.Node)
	dst = binary.AppendVarint(dst, b.Start.UnixNano())
	dst = binary.AppendUvarint(dst, uint64(b.Period))
	dst = binary.AppendUvarint(dst, uint64(len(b.Pods)))
	for i := range b.Pods {
		p := &b.Pods[i]
		switch {
		case !p.IP.IsValid():
			return nil, fmt.Errorf("encode stats: pod %s/%s has no address: want an IPv4 or IPv6 address", p.Namespace, p.Pod)
		case p.IP.Is4In6():
			// Decode gives it back as plain IPv4: refusing it keeps one
			// encoding per batch and each address in one form.
			return nil, fmt.Errorf("encode stats: pod %s/%s address %s is IPv4-mapped IPv6: want it as IPv4 (%s)", p.Namespace, p.Pod, p.IP, p.IP.Unmap())
		case p.IP.Zone() != "":
			return nil, fmt.Errorf("encode stats: pod %s/%s address %s has a zone: want a pod address without one", p.Namespace, p.Pod, p.IP)
		case version == versionIPv6:
			ip := p.IP.As16() // IPv4 as IPv4-mapped IPv6
			dst = append(dst, ip[:]...)
		default:
			ip := p.IP.As4()
			dst = append(dst, ip[:]...)
		}
		dst = appendString(dst, p.Namespace)
		dst = appendString(dst, p.Pod)
		dst = appendString(dst, p.Workload)
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(p.Concurrency))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(p.ProxiedConcurrency))
		dst = binary.AppendUvarint(dst, p.Requests)
		dst = binary.AppendUvarint(dst, p.ProxiedRequests)
		if version >= versionAccounting {
			if err := p.checkAccounting(); err != nil {
				return nil, fmt.Errorf("encode stats: pod %s/%s: %w", p.Namespace, p.Pod, err)
			}
			dst = append(dst, byte(p.Accounting))
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(p.OpaqueConcurrency))
		}
	}
	if version == versionPods {
		return dst, nil
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Targets)))
	for i := range b.Targets {
		t := &b.Targets[i]
		dst = appendString(dst, t.Namespace)
		dst = appendString(dst, t.Workload)
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(t.Concurrency))
		dst = binary.AppendUvarint(dst, t.Requests)
	}
	return dst, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode parses one batch. Errors wrap ErrMalformed and say what and where.
func Decode(data []byte) (*Batch, error) {
	d := decoder{data: data}
	if len(data) < len(magic)+1 || string(data[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: does not start with %q", ErrMalformed, magic)
	}
	d.off = len(magic)
	v := d.data[d.off]
	if v < versionPods || v > versionIPv6 {
		return nil, fmt.Errorf("%w: version %d, this controller reads versions %d to %d", ErrMalformed, v, versionPods, versionIPv6)
	}
	d.off++
	b := &Batch{Node: d.string("node")}
	start := d.varint("start")
	period := d.uvarint("period")
	count := d.uvarint("pod count")
	if d.err != nil {
		return nil, d.err
	}
	if period == 0 || period > uint64(time.Hour) {
		return nil, fmt.Errorf("%w: period %v out of range (0, 1h]", ErrMalformed, time.Duration(period))
	}
	// Reject counts the data cannot hold.
	minRecord := uint64(minPodRecord)
	if v == versionIPv6 {
		minRecord += 16 - 4 + 9 // the longer address, the accounting
	}
	if count > uint64(len(data)-d.off)/minRecord {
		return nil, fmt.Errorf("%w: %d pods cannot fit in %d bytes", ErrMalformed, count, len(data)-d.off)
	}
	b.Start = time.Unix(0, start)
	b.Period = time.Duration(period)
	b.Pods = make([]PodStat, count)
	for i := range b.Pods {
		p := &b.Pods[i]
		if v != versionIPv6 {
			if b := d.ip(4); b != nil {
				p.IP = netip.AddrFrom4([4]byte(b))
			}
		} else if b := d.ip(16); b != nil {
			p.IP = netip.AddrFrom16([16]byte(b)).Unmap()
		}
		p.Namespace = d.string("namespace")
		p.Pod = d.string("pod")
		p.Workload = d.string("workload")
		p.Concurrency = d.float("concurrency")
		p.ProxiedConcurrency = d.float("proxied concurrency")
		p.Requests = d.uvarint("requests")
		p.ProxiedRequests = d.uvarint("proxied requests")
		if v >= versionAccounting {
			d.accounting(p)
		}
		if d.err != nil {
			return nil, fmt.Errorf("pod record %d: %w", i, d.err)
		}
	}
	if v == versionAccounting && !b.HasAccounting() {
		// One encoding per batch: without accounting it is version 1 or 2.
		return nil, fmt.Errorf("%w: version 3 with every pod at the default accounting (%s, no opaque concurrency): that batch is version 1 or 2", ErrMalformed, AccountingHTTP1Requests)
	}
	if v == versionIPv6 && !b.HasIPv6() {
		// One encoding per batch: with IPv4 pods only it is version 1 to 3.
		return nil, fmt.Errorf("%w: version 4 with every pod address IPv4 (IPv4-mapped on the wire): that batch is version 1, 2 or 3", ErrMalformed)
	}
	if v >= versionTargets {
		if err := d.targets(b, v); err != nil {
			return nil, err
		}
	}
	if d.off != len(data) {
		return nil, fmt.Errorf("%w: %d bytes after the last record", ErrMalformed, len(data)-d.off)
	}
	return b, nil
}

// minPodRecord is the fewest bytes a pod record takes (address, three
// empty names, two floats, two one-byte varints).
const minPodRecord = 24

// accounting reads version 3's accounting of pod record p.
func (d *decoder) accounting(p *PodStat) {
	if d.err != nil {
		return
	}
	if len(d.data)-d.off < 1 {
		d.fail("accounting", "truncated")
		return
	}
	p.Accounting = Accounting(d.data[d.off])
	at := d.off
	d.off++
	p.OpaqueConcurrency = d.float("opaque concurrency")
	if d.err != nil {
		return
	}
	if err := p.checkAccounting(); err != nil {
		d.off = at
		d.fail("accounting", err.Error())
	}
}

// targets reads the target records of version v (2 to 4) into b.
func (d *decoder) targets(b *Batch, v byte) error {
	count := d.uvarint("target count")
	if d.err != nil {
		return d.err
	}
	if count == 0 && v == versionTargets {
		// One encoding per batch: without targets it is version 1.
		return fmt.Errorf("%w: version 2 with no target records (that batch is version 1)", ErrMalformed)
	}
	// Each record takes at least 11 bytes: reject counts the data cannot hold.
	if count > uint64(len(d.data)-d.off)/11 {
		return fmt.Errorf("%w: %d targets cannot fit in %d bytes", ErrMalformed, count, len(d.data)-d.off)
	}
	if count == 0 {
		return nil // version 3 or 4 of an agent: pods only
	}
	b.Targets = make([]TargetStat, count)
	for i := range b.Targets {
		t := &b.Targets[i]
		t.Namespace = d.string("namespace")
		t.Workload = d.string("workload")
		t.Concurrency = d.float("concurrency")
		t.Requests = d.uvarint("requests")
		if d.err != nil {
			return fmt.Errorf("target record %d: %w", i, d.err)
		}
	}
	return nil
}

type decoder struct {
	data []byte
	off  int
	err  error
}

func (d *decoder) fail(what string, why string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s at byte %d: %s", ErrMalformed, what, d.off, why)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 || !minimal(d.data[d.off:d.off+n]) {
		d.fail(what, "truncated or overlong varint")
		return 0
	}
	d.off += n
	return v
}

// minimal says whether a varint's bytes are its shortest encoding: a last
// byte of 0 after others only pads. encoding/binary accepts the padding;
// refusing it keeps one encoding per batch.
func minimal(varint []byte) bool {
	return len(varint) == 1 || varint[len(varint)-1] != 0
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.data[d.off:])
	if n <= 0 || !minimal(d.data[d.off:d.off+n]) {
		d.fail(what, "truncated or overlong varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) string(what string) string {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return ""
	}
	if n > maxName {
		d.fail(what, fmt.Sprintf("length %d exceeds %d", n, maxName))
		return ""
	}
	if uint64(len(d.data)-d.off) < n {
		d.fail(what, "truncated")
		return ""
	}
	s := string(d.data[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

func (d *decoder) float(what string) float64 {
	if d.err != nil {
		return 0
	}
	if len(d.data)-d.off < 8 {
		d.fail(what, "truncated")
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.data[d.off:]))
	d.off += 8
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		d.fail(what, fmt.Sprintf("%v is not a finite non-negative number", v))
		return 0
	}
	return v
}

// ip reads an address of n bytes (4 or 16); nil once the decoder failed.
func (d *decoder) ip(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.data)-d.off < n {
		d.fail("ip", "truncated")
		return nil
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b
}
