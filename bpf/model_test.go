package bpf

import "strings"

// A Go model of the connection state machine of the BPF programs (the
// request classifier, response parser and counters in lib/), step for step:
// the same windows, limits, parser states and fast paths. The fuzz test feeds
// the same segments to the BPF programs (through BPF_PROG_TEST_RUN) and to
// this model and compares counters and connection state after every segment;
// TestModelFastPathsMatchByteParsing checks that the fast paths, which read
// whole words, decide what parsing byte by byte decides.

// modelFastPaths switches the model's word-at-a-time fast paths (scan_line_fast
// and response_line_fast); tests turn it off to get byte-by-byte parsing.
var modelFastPaths = true

// Limits and constants mirrored from accounting.h.
const (
	scanWindow = 64
	scanSteps  = 32
	maxWindows = 256
	maxMethod  = 16
	maxSegment = 0xffff

	fnvOffset = 0x811c9dc5
	fnvPrime  = 0x01000193

	hashHead              = 0x305a7fc3
	hashPRI               = 0xdb304bea
	hashUserAgent         = 0x24259bee
	hashKubeProbe         = 0xba596f3c
	hashSockscaleProbe    = 0x083e4e8b
	hashHTTPVersion       = 0x1b47a03e
	hashContentLength     = 0x4df9451d
	hashTransferEncoding  = 0xddb4744c
	hashChunked           = 0xd31f4213
	ipTCPHeaderLen        = 40 // the crafted packets: IPv4 and TCP without options
	reqIdle, reqBusy      = 0, 1
	reqProbe              = 2
	verdictRequest        = 0
	verdictProbe          = 1
	verdictOpaque         = 2
	hfLength, hfChunked   = 1, 2
	parseError, parseLimt = -1, -2
)

// Response parser states (RS_* in accounting.h).
const (
	rsStatus = iota
	rsCode
	rsSkipLine
	rsLineStart
	rsName
	rsCLValue
	rsTEValue
	rsHeadersLF
	rsBody
	rsChunkSize
	rsChunkExt
	rsChunkData
	rsChunkEnd
	rsTrailerStart
	rsTrailerSkip
	rsTrailerLF
	rsUntilClose
)

// Request classifier states (RQ_*).
const (
	rqMethod = iota
	rqSkipLine
	rqLineStart
	rqName
	rqUASpace
	rqUAValue
	rqDone
)

type modelPod struct {
	inFlight, opaqueInFlight                int64
	started, completed, probes, opaqueTotal uint64
	proxiedInFlight                         int64
	proxiedStarted, proxiedCompleted        uint64
}

type modelConn struct {
	rxNext, txNext uint32
	req            int
	opaque, closed bool
	seen, head     bool
	load           bool // a request on it was load: later ones only have their method read
	proxied        bool

	state, hflags, pos uint8
	status             uint16
	hash               uint32
	length, remaining  uint64
}

func newModelConn(rxNext, txNext uint32, proxied bool) *modelConn {
	return &modelConn{rxNext: rxNext, txNext: txNext, hash: fnvOffset, proxied: proxied}
}

func fnvAdd(pos *uint8, hash *uint32, ch byte) {
	*hash = (*hash ^ uint32(ch)) * fnvPrime
	if *pos < 255 {
		*pos++
	}
}

func lower(ch byte) byte {
	if ch >= 'A' && ch <= 'Z' {
		return ch + 'a' - 'A'
	}
	return ch
}

func (c *modelConn) startRequest(p *modelPod, kind int) {
	if c.req != reqIdle {
		return
	}
	c.req = kind
	if kind == reqProbe {
		p.probes++
		return
	}
	p.inFlight++
	p.started++
	if c.proxied {
		p.proxiedInFlight++
		p.proxiedStarted++
	}
}

func (c *modelConn) endRequest(p *modelPod) {
	switch c.req {
	case reqProbe:
		c.req = reqIdle
	case reqBusy:
		c.req = reqIdle
		p.inFlight--
		p.completed++
		if c.proxied {
			p.proxiedInFlight--
			p.proxiedCompleted++
		}
	}
}

func (c *modelConn) goOpaque(p *modelPod) {
	if c.opaque {
		return
	}
	c.opaque = true
	p.opaqueInFlight++
	p.opaqueTotal++
	if c.req == reqProbe {
		c.req = reqIdle
	}
	c.startRequest(p, reqBusy)
}

// newBytes returns the part of a segment not seen before and advances next,
// as on_segment does.
func newBytes(next *uint32, seq uint32, payload []byte) (fresh []byte, skip int, ok bool) {
	end := seq + uint32(len(payload))
	if len(payload) == 0 || int32(end-*next) <= 0 {
		return nil, 0, false
	}
	if d := int32(*next - seq); d > 0 {
		skip = int(d)
	}
	*next = end
	return payload[skip:], skip, true
}

// ingress mirrors cgroup_skb/ingress for a segment with this seq and payload.
func (c *modelConn) ingress(p *modelPod, seq uint32, payload []byte) {
	if c.closed {
		return
	}
	_, skip, ok := newBytes(&c.rxNext, seq, payload)
	if !ok || c.opaque || c.req != reqIdle {
		return
	}
	verdict, head := verdictRequest, false
	if isHead, ok := commonMethod(payload[skip:]); c.load && ok {
		head = isHead
	} else {
		verdict, head = classify(payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload), c.load)
	}
	c.seen = true
	if verdict == verdictRequest {
		c.load = true
	}
	if verdict == verdictOpaque {
		c.goOpaque(p)
		return
	}
	c.head = head
	if verdict == verdictProbe {
		c.startRequest(p, reqProbe)
	} else {
		c.startRequest(p, reqBusy)
	}
}

// commonMethod mirrors common_method: ok if b starts with GET, PUT, POST or
// HEAD and a space, and has at least eight bytes.
func commonMethod(b []byte) (head, ok bool) {
	if len(b) < 8 {
		return false, false
	}
	n, head := methodWord(b)
	return head, n > 0
}

// methodWord mirrors method_word: the length of the common method and its
// space that start b, or 0, and whether it is HEAD.
func methodWord(b []byte) (n int, head bool) {
	for _, m := range []string{"GET ", "PUT ", "POST ", "HEAD "} {
		if strings.HasPrefix(string(b), m) {
			return len(m), m == "HEAD "
		}
	}
	return 0, false
}

// classify mirrors classify_request. Offsets are packet offsets: the payload
// starts at ipTCPHeaderLen; bytes before it are headers the scan skips.
func classify(payload []byte, off, end int, methodOnly bool) (verdict int, head bool) {
	s := scanState{state: rqMethod, hash: fnvOffset, methodOnly: methodOnly}
	for step := 0; step < scanSteps; step++ {
		if off >= end || s.state == rqDone || s.verdict != verdictRequest {
			break
		}
		buf := window(payload, off, end)
		n, k := len(buf), 0
		if (s.state == rqMethod && s.pos == 0) || s.state == rqLineStart {
			if modelFastPaths {
				k = s.lineFast(buf)
			}
			if s.state == rqDone || s.verdict != verdictRequest {
				break
			}
			if k > 0 && s.state == rqLineStart {
				off += k
				if off > maxSegment {
					break
				}
				continue
			}
		}
		if s.state != rqSkipLine && k < n {
			used := n
			for i := k; i < n; i++ {
				used = i + 1
				if s.scanByte(buf[i]) {
					break
				}
			}
			k = used
		}
		if s.state == rqSkipLine && k < n {
			if lf := findLF(buf, k); lf >= 0 {
				s.state = rqLineStart
				k = lf + 1
			} else {
				k = n
			}
		}
		off += k
		if off > maxSegment {
			break
		}
	}
	return int(s.verdict), s.head
}

// window mirrors load_window: the payload bytes [off, min(end, off+scanWindow))
// of a packet whose payload starts at ipTCPHeaderLen.
func window(payload []byte, off, end int) []byte {
	n := min(end-off, scanWindow)
	buf := make([]byte, n)
	for i := range buf {
		if off+i >= ipTCPHeaderLen { // header bytes are never parsed: off starts past them
			buf[i] = payload[off+i-ipTCPHeaderLen]
		}
	}
	return buf
}

// lowerEqual reports whether b starts with token, ASCII letters compared
// without case (as lower8 compares).
func lowerEqual(b []byte, token string) bool {
	if len(b) < len(token) {
		return false
	}
	for i := range len(token) {
		if lower(b[i]) != token[i] {
			return false
		}
	}
	return true
}

// firstColonOrLF mirrors find_either(buf, 0, n, ':', '\n').
func firstColonOrLF(buf []byte) int {
	for i, ch := range buf {
		if ch == ':' || ch == '\n' {
			return i
		}
	}
	return -1
}

// lineFast mirrors scan_line_fast; it returns the bytes consumed.
func (s *scanState) lineFast(buf []byte) int {
	if len(buf) < 32 {
		return 0
	}
	str := string(buf)
	if s.state == rqMethod {
		n, head := methodWord(buf)
		if n == 0 {
			return 0
		}
		s.head = head
		s.methodDone()
		return n
	}
	if buf[0] == '\r' || buf[0] == '\n' {
		return 0
	}
	if lowerEqual(buf, "user-agent:") {
		s.state = rqUASpace
		if buf[11] != ' ' || buf[12] == ' ' || buf[12] == '\t' {
			return 11
		}
		if strings.HasPrefix(str[12:], "kube-probe/") || strings.HasPrefix(str[12:], "sockscale-probe/") {
			s.verdict = verdictProbe
		} else {
			s.state = rqDone
		}
		return 28
	}
	q := firstColonOrLF(buf)
	if q < 0 {
		return 0
	}
	if buf[q] == ':' {
		s.state = rqSkipLine
	} else {
		s.state = rqLineStart
	}
	s.pos, s.hash = 0, fnvOffset
	return q + 1
}

type scanState struct {
	state, pos, verdict uint8
	hash                uint32
	head                bool
	methodOnly          bool // the connection already carried load (conn.load)
}

// methodDone moves past a request's method: to its other lines, or, on a
// connection that carried load, to the end of the scan.
func (s *scanState) methodDone() {
	s.state = rqSkipLine
	if s.methodOnly {
		s.state = rqDone
	}
}

// scanByte mirrors scan_byte; it returns true where scan_byte returns 1.
func (s *scanState) scanByte(ch byte) bool {
	switch s.state {
	case rqMethod:
		if ch >= 'A' && ch <= 'Z' {
			if s.pos >= maxMethod {
				s.verdict = verdictOpaque
				return true
			}
			fnvAdd(&s.pos, &s.hash, ch)
			return false
		}
		if ch != ' ' || s.pos < 3 || (s.pos == 3 && s.hash == hashPRI) {
			s.verdict = verdictOpaque
			return true
		}
		s.head = s.pos == 4 && s.hash == hashHead
		s.methodDone()
		return true
	case rqSkipLine:
		if ch == '\n' {
			s.state = rqLineStart
			return true
		}
		return false
	case rqLineStart, rqName:
		if s.state == rqLineStart {
			if ch == '\r' || ch == '\n' {
				s.state = rqDone
				return true
			}
			s.state = rqName
			s.pos, s.hash = 0, fnvOffset
		}
		if ch == ':' {
			if s.pos == 10 && s.hash == hashUserAgent {
				s.state = rqUASpace
				return false
			}
			s.state = rqSkipLine
			return true
		}
		if ch == '\n' {
			s.state = rqLineStart
			return true
		}
		fnvAdd(&s.pos, &s.hash, lower(ch))
		return false
	case rqUASpace, rqUAValue:
		if s.state == rqUASpace {
			if ch == ' ' || ch == '\t' {
				return false
			}
			s.state = rqUAValue
			s.pos, s.hash = 0, fnvOffset
		}
		if ch == '\r' || ch == '\n' {
			s.state = rqDone
			return true
		}
		fnvAdd(&s.pos, &s.hash, ch)
		if (s.pos == 11 && s.hash == hashKubeProbe) || (s.pos == 16 && s.hash == hashSockscaleProbe) {
			s.verdict = verdictProbe
			return true
		}
		if s.pos >= 16 {
			s.state = rqDone
			return true
		}
		return false
	}
	return true
}

// egress mirrors cgroup_skb/egress.
func (c *modelConn) egress(p *modelPod, seq uint32, payload []byte) {
	if c.closed {
		return
	}
	_, skip, ok := newBytes(&c.txNext, seq, payload)
	if !ok || c.opaque {
		return
	}
	if !c.seen {
		c.goOpaque(p)
		return
	}
	done, err := c.parse(payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload))
	if err != 0 {
		c.goOpaque(p)
		return
	}
	if done > 0 {
		c.endRequest(p)
	}
}

// findLF mirrors find_lf: the first '\n' at or after start, or -1.
func findLF(buf []byte, start int) int {
	for i := start; i < len(buf); i++ {
		if buf[i] == '\n' {
			return i
		}
	}
	return -1
}

type respCtx struct {
	off, end, used, done int
	err                  int
}

// parse mirrors parse_response.
func (c *modelConn) parse(payload []byte, off, end int) (done, err int) {
	r := respCtx{off: off, end: end}
	if end > maxSegment {
		return 0, parseLimt
	}
	for step := 0; step < maxWindows; step++ {
		if r.off >= r.end || c.state == rsUntilClose || r.err != 0 {
			break
		}
		if c.state == rsBody || c.state == rsChunkData {
			if c.skipBody(&r) {
				break
			}
			continue
		}
		buf := window(payload, r.off, r.end)
		n, k := len(buf), 0
		fresh := false
		if (c.state == rsStatus && c.pos == 0) || c.state == rsLineStart {
			if modelFastPaths {
				k = c.lineFast(&r, buf)
			}
			if r.err != 0 {
				break
			}
			fresh = k > 0 && c.state != rsSkipLine && c.state != rsCLValue && c.state != rsTEValue
		}
		skipping := func() bool { return c.state == rsSkipLine || c.state == rsTrailerSkip }
		if !fresh && !skipping() && k < n {
			r.used = n
			for i := k; i < n; i++ {
				if c.responseByte(&r, i, buf[i]) {
					break
				}
			}
			k = r.used
		}
		if !fresh && skipping() && k < n {
			if lf := findLF(buf, k); lf >= 0 {
				if c.state == rsSkipLine {
					c.state = rsLineStart
				} else {
					c.state = rsTrailerStart
				}
				k = lf + 1
			} else {
				k = n
			}
		}
		if r.off+k > maxSegment {
			r.err = parseLimt
			break
		}
		r.off += k
	}
	if r.err != 0 {
		return r.done, r.err
	}
	if r.off < r.end && c.state != rsUntilClose {
		return r.done, parseLimt
	}
	return r.done, 0
}

// lineFast mirrors response_line_fast; it returns the bytes consumed.
func (c *modelConn) lineFast(r *respCtx, buf []byte) int {
	if c.state == rsLineStart {
		if buf[0] == '\n' {
			c.headersDone(r)
			return 1
		}
		if strings.HasPrefix(string(buf), "\r\n") {
			c.headersDone(r)
			return 2
		}
	}
	if len(buf) < 24 {
		return 0
	}
	str := string(buf)
	if c.state == rsStatus {
		if !strings.HasPrefix(str, "HTTP/1.1 ") && !strings.HasPrefix(str, "HTTP/1.0 ") {
			return 0
		}
		for _, d := range buf[9:12] {
			if d < '0' || d > '9' {
				return 0
			}
		}
		c.pos, c.hash = 3, fnvOffset
		c.status = uint16(buf[9]-'0')*100 + uint16(buf[10]-'0')*10 + uint16(buf[11]-'0')
		if buf[12] == '\n' {
			c.state = rsLineStart
		} else {
			c.state = rsSkipLine
		}
		return 13
	}
	if buf[0] == '\r' { // a CR without its LF
		return 0
	}
	if lowerEqual(buf, "content-length:") {
		c.state = rsCLValue
		c.hflags |= hfLength
		c.length = 0
		c.pos, c.hash = 0, fnvOffset
		return 15 + c.contentLengthFast(buf[15:23])
	}
	if lowerEqual(buf, "transfer-encoding:") {
		c.state = rsTEValue
		c.pos, c.hash = 0, fnvOffset
		return 18
	}
	q := firstColonOrLF(buf)
	if q < 0 {
		return 0
	}
	if buf[q] == '\n' {
		r.err = parseError
		return 0
	}
	c.state = rsSkipLine
	c.pos, c.hash = 0, fnvOffset
	return q + 1
}

// contentLengthFast mirrors content_length_fast: v is the eight bytes
// after "Content-Length:".
func (c *modelConn) contentLengthFast(v []byte) int {
	if v[0] != ' ' {
		return 0
	}
	i, length := 1, uint64(0)
	for ; i < 6 && v[i] >= '0' && v[i] <= '9'; i++ {
		length = length*10 + uint64(v[i]-'0')
	}
	if i == 1 || v[i] != '\r' || v[i+1] != '\n' {
		return 0
	}
	c.length, c.pos, c.state = length, uint8(i-1), rsLineStart
	return i + 2
}

func (c *modelConn) skipBody(r *respCtx) bool {
	avail := uint64(r.end - r.off)
	if c.remaining > avail {
		c.remaining -= avail
		r.off = r.end
		return true
	}
	r.off += int(c.remaining)
	c.remaining = 0
	if c.state == rsBody {
		c.responseDone(r)
	} else {
		c.state = rsChunkEnd
	}
	return false
}

func (c *modelConn) responseDone(r *respCtx) {
	r.done++
	c.state = rsStatus
	c.hflags = 0
	c.status = 0
	c.head = false
	c.pos, c.hash = 0, fnvOffset
}

func (c *modelConn) headersDone(r *respCtx) bool {
	c.pos, c.hash = 0, fnvOffset
	switch {
	case c.status >= 100 && c.status < 200 && c.status != 101:
		c.state = rsStatus
		c.hflags = 0
		c.status = 0
		return false
	case c.status == 101:
		c.state = rsUntilClose
		return true
	case c.head || c.status == 204 || c.status == 304:
		c.responseDone(r)
		return false
	case c.hflags&hfChunked != 0:
		c.state = rsChunkSize
		c.length = 0
		return false
	case c.hflags&hfLength != 0:
		if c.length == 0 {
			c.responseDone(r)
			return false
		}
		c.remaining = c.length
		c.state = rsBody
		return true
	}
	c.state = rsUntilClose
	return true
}

func (c *modelConn) chunkSizeDone(r *respCtx) bool {
	if c.pos == 0 {
		r.err = parseError
		return true
	}
	c.pos, c.hash = 0, fnvOffset
	if c.length == 0 {
		c.state = rsTrailerStart
		return false
	}
	c.remaining = c.length
	c.state = rsChunkData
	return true
}

func (c *modelConn) teTokenEnd() {
	if c.pos == 7 && c.hash == hashChunked {
		c.hflags |= hfChunked
	}
	c.pos, c.hash = 0, fnvOffset
}

func hexValue(ch byte) int {
	switch {
	case ch >= '0' && ch <= '9':
		return int(ch - '0')
	case lower(ch) >= 'a' && lower(ch) <= 'f':
		return int(lower(ch)-'a') + 10
	}
	return -1
}

// responseByte mirrors response_byte; it returns true where that returns 1.
func (c *modelConn) responseByte(r *respCtx, i int, ch byte) bool {
	bad := func() bool { r.err = parseError; return true }
	r.used = i + 1
	switch c.state {
	case rsStatus:
		if ch != ' ' {
			if c.pos >= 8 {
				return bad()
			}
			fnvAdd(&c.pos, &c.hash, ch)
			if c.pos == 5 && c.hash != hashHTTPVersion {
				return bad()
			}
			return false
		}
		if c.pos < 6 {
			return bad()
		}
		c.state = rsCode
		c.status = 0
		c.pos, c.hash = 0, fnvOffset
		return false
	case rsCode:
		if ch >= '0' && ch <= '9' && c.pos < 3 {
			c.status = c.status*10 + uint16(ch-'0')
			c.pos++
			return false
		}
		if c.pos != 3 {
			return bad()
		}
		if ch == '\n' {
			c.state = rsLineStart
			return true
		}
		c.state = rsSkipLine
		return true
	case rsSkipLine:
		if ch == '\n' {
			c.state = rsLineStart
			return true
		}
		return false
	case rsLineStart, rsName:
		if c.state == rsLineStart {
			if ch == '\r' {
				c.state = rsHeadersLF
				return false
			}
			if ch == '\n' {
				return c.headersDone(r)
			}
			c.state = rsName
			c.pos, c.hash = 0, fnvOffset
		}
		if ch == ':' {
			c.state = rsSkipLine
			if c.pos == 14 && c.hash == hashContentLength {
				c.state = rsCLValue
				c.hflags |= hfLength
				c.length = 0
			} else if c.pos == 17 && c.hash == hashTransferEncoding {
				c.state = rsTEValue
			}
			c.pos, c.hash = 0, fnvOffset
			return c.state == rsSkipLine
		}
		if ch == '\n' {
			return bad()
		}
		fnvAdd(&c.pos, &c.hash, lower(ch))
		return false
	case rsCLValue:
		if ch >= '0' && ch <= '9' {
			if c.pos >= 18 {
				return bad()
			}
			c.length = c.length*10 + uint64(ch-'0')
			c.pos++
			return false
		}
		if ch == ' ' || ch == '\t' || ch == '\r' {
			return false
		}
		if ch == '\n' && c.pos > 0 {
			c.state = rsLineStart
			return true
		}
		return bad()
	case rsTEValue:
		if ch == '\n' {
			c.teTokenEnd()
			c.state = rsLineStart
			return true
		}
		if ch == ',' || ch == ' ' || ch == '\t' || ch == '\r' {
			c.teTokenEnd()
			return false
		}
		fnvAdd(&c.pos, &c.hash, lower(ch))
		return false
	case rsHeadersLF:
		if ch != '\n' {
			return bad()
		}
		return c.headersDone(r)
	case rsChunkSize:
		if v := hexValue(ch); v >= 0 {
			if c.pos >= 15 {
				return bad()
			}
			c.length = c.length*16 + uint64(v)
			c.pos++
			return false
		}
		switch ch {
		case ';', ' ', '\t':
			c.state = rsChunkExt
			return false
		case '\r':
			return false
		case '\n':
			return c.chunkSizeDone(r)
		}
		return bad()
	case rsChunkExt:
		if ch == '\n' {
			return c.chunkSizeDone(r)
		}
		return false
	case rsChunkEnd:
		if ch == '\r' {
			return false
		}
		if ch != '\n' {
			return bad()
		}
		c.state = rsChunkSize
		c.length = 0
		c.pos, c.hash = 0, fnvOffset
		return false
	case rsTrailerStart:
		switch ch {
		case '\r':
			c.state = rsTrailerLF
		case '\n':
			c.responseDone(r)
		default:
			c.state = rsTrailerSkip
			return true
		}
		return false
	case rsTrailerSkip:
		if ch == '\n' {
			c.state = rsTrailerStart
		}
		return false
	case rsTrailerLF:
		if ch != '\n' {
			return bad()
		}
		c.responseDone(r)
		return false
	}
	r.used = i
	return true
}
