package bpf

import "strings"

// A Go model of the connection state machine of the BPF programs (the
// message parser of both directions, the request ring, resynchronisation
// and the counters in lib/), step for step: the same windows, limits,
// parser states and fast paths. The fuzz and random-exchange tests feed the
// same segments to the BPF programs (through BPF_PROG_TEST_RUN) and to this
// model and compare counters and connection state after every segment;
// TestModelFastPathsMatchByteParsing checks that the fast paths, which read
// whole words and skip lines, decide what parsing byte by byte decides.

// modelFastPaths switches the model's word-at-a-time fast paths (line_fast
// and the lines skip_lines skips after the first); tests turn it off to get
// byte-by-byte parsing.
var modelFastPaths = true

// Limits and constants mirrored from accounting.h.
const (
	scanWindow       = 64
	maxWindows       = 256
	maxMethod        = 16
	skipLinesPerStep = 8
	maxPipeline      = MaxPipeline
	proofWindows     = 4
	maxStashed       = 4096
	maxH2Streams     = MaxH2Streams
	maxH2Frames      = 4096
	maxH2Stashed     = 256

	fnvOffset = 0x811c9dc5
	fnvPrime  = 0x01000193

	hashHead             = 0x305a7fc3
	hashPRI              = 0xdb304bea
	hashUserAgent        = 0x24259bee
	hashKubeProbe        = 0xba596f3c
	hashSockscaleProbe   = 0x083e4e8b
	hashHTTPVersion      = 0x1b47a03e
	hashContentLength    = 0x4df9451d
	hashTransferEncoding = 0xddb4744c
	hashChunked          = 0xd31f4213

	ipTCPHeaderLen = 40 // the crafted packets: IPv4 and TCP without options

	hfLength, hfChunked, hfClassify, hfBegun = 1, 2, 4, 8
	parseError, parseLimit                   = -1, -2
)

// Message parser states (MS_* in accounting.h).
const (
	msStart = iota
	msMethod
	msCode
	msSkipLine
	msLineStart
	msName
	msCLValue
	msTEValue
	msUASpace
	msUAValue
	msHeadersLF
	msBody
	msChunkSize
	msChunkExt
	msChunkData
	msChunkEnd
	msTrailerStart
	msTrailerSkip
	msTrailerLF
	msUntilClose
	msLost
)

// Events (enum event).
const (
	evConnUntracked = iota
	evParseLimit
	evParseError
	evStreamGap
	evResync
	evAdopted // the programs only (adopt.h), never the model
	evH2Full
	evH2Lost
	evRxWait     // the programs only (two CPUs at one connection), never the model
	evRxTakeover // the programs only
	evMax
)

type modelPod struct {
	inFlight, opaqueInFlight                int64
	started, completed, probes, opaqueTotal uint64
	proxiedInFlight                         int64
	proxiedStarted, proxiedCompleted        uint64
	conns                                   int64
	h2InFlight                              int64
	h2Total                                 uint64
	events                                  [evMax]uint64
	// now models bpf_ktime_get_ns: every program run reads a later time
	// than the runs before it, and one run reads one time (tick).
	now uint64
}

func (p *modelPod) tick() { p.now++ }

type modelMsg struct {
	length, remaining uint64
	hash              uint32
	status            uint16
	state, hflags     uint8
	pos               uint8
}

type modelScan struct {
	off, end, used, done, err int
}

type modelConn struct {
	rxNext, txNext      uint32
	pushed, popped      uint32
	headBits, probeBits uint16
	proxied, seen, load bool
	answered, opaque    bool
	closed, tunnel      bool
	rxGap               bool
	gapSeq, gapEnd      uint32
	rx, tx              modelMsg
	rxs, txs            modelScan
	txLast              uint64
	rxFirst             uint32
	startNs             [maxPipeline]uint64
	counted             bool // accepted: counts into the pod (owner() is not NULL)
	stashed             bool // a stash entry, before the accept (tenure 0)
	mayProbe            bool // a stash entry's client may send health probes (peer_kind)
	payload             []byte
	h2                  uint8    // h2None, h2ServerFirst, h2Follow, ... (model_h2_test.go)
	h2s                 *modelH2 // its HTTP/2 state, once it has one
}

func newModelConn(rxNext, txNext uint32, proxied bool) *modelConn {
	c := &modelConn{rxNext: rxNext, txNext: txNext, proxied: proxied, counted: true}
	c.rx.hash, c.tx.hash = fnvOffset, fnvOffset
	return c
}

func fnvAdd(pos *uint8, hash *uint32, ch byte) {
	*hash = (*hash ^ uint32(ch)) * fnvPrime
	if *pos < 255 {
		*pos++
	}
}

func (m *modelMsg) tokenReset() { m.pos, m.hash = 0, fnvOffset }

func lower(ch byte) byte {
	if ch >= 'A' && ch <= 'Z' {
		return ch + 'a' - 'A'
	}
	return ch
}

func (c *modelConn) msgOf(req bool) *modelMsg {
	if req {
		return &c.rx
	}
	return &c.tx
}

func (c *modelConn) scanOf(req bool) *modelScan {
	if req {
		return &c.rxs
	}
	return &c.txs
}

func (c *modelConn) pending() uint32 { return c.pushed - c.popped }

func ringBit(n uint32) uint16 { return 1 << (n % maxPipeline) }

// Counters (lib/counters.h).

// owner mirrors owner(): nil unless the connection counts into p.
func (c *modelConn) owner(p *modelPod) *modelPod {
	if !c.counted {
		return nil
	}
	return p
}

func (c *modelConn) pushLocked(p *modelPod, n uint32) {
	counted := 0
	for i := range n {
		slot := (c.pushed + i) % maxPipeline
		c.startNs[slot] = p.now
		if c.probeBits&(1<<slot) == 0 {
			counted++
		}
	}
	c.pushed += n
	if c.owner(p) == nil {
		return
	}
	p.probes += uint64(int(n) - counted)
	p.inFlight += int64(counted)
	p.started += uint64(counted)
	if c.proxied {
		p.proxiedInFlight += int64(counted)
		p.proxiedStarted += uint64(counted)
	}
}

func (c *modelConn) popLocked(p *modelPod, n uint32) {
	counted := 0
	for i := range n {
		if c.probeBits&ringBit(c.popped+i) == 0 {
			counted++
		}
	}
	c.popped += n
	if c.owner(p) == nil {
		return
	}
	p.inFlight -= int64(counted)
	p.completed += uint64(counted)
	if c.proxied {
		p.proxiedInFlight -= int64(counted)
		p.proxiedCompleted += uint64(counted)
	}
}

func (c *modelConn) pushRequests(p *modelPod, n uint32) {
	if !c.closed {
		c.pushLocked(p, n)
	}
}

func (c *modelConn) popRequests(p *modelPod, n uint32) {
	n = min(n, c.pending())
	if !c.closed {
		c.popLocked(p, n)
	}
}

func (c *modelConn) goOpaque(p *modelPod) {
	if c.opaque || c.closed {
		return
	}
	c.opaque = true
	load := false
	for i := range c.pending() {
		if c.probeBits&ringBit(c.popped+i) == 0 {
			load = true
		}
	}
	if !load && c.pending() < maxPipeline {
		c.probeBits &^= ringBit(c.pushed)
		c.pushLocked(p, 1)
	}
	if c.owner(p) != nil {
		p.opaqueInFlight++
		p.opaqueTotal++
	}
}

// The message parser (lib/message.h).

func (c *modelConn) requestBegin(m *modelMsg, sc *modelScan) bool {
	n := c.pushed + uint32(sc.done)
	if n-c.popped >= maxPipeline {
		sc.err = parseLimit
		return true
	}
	c.headBits &^= ringBit(n)
	c.probeBits &^= ringBit(n)
	m.hflags = hfBegun
	if !c.load {
		m.hflags |= hfClassify
	}
	return false
}

func requestCounted(m *modelMsg, sc *modelScan) {
	m.hflags &^= hfBegun
	sc.done++
}

func (c *modelConn) requestHead(sc *modelScan) {
	c.headBits |= ringBit(c.pushed + uint32(sc.done))
}

func (c *modelConn) requestLoad(m *modelMsg) {
	m.hflags &^= hfClassify
	c.load = true
}

func (c *modelConn) requestProbe(m *modelMsg, sc *modelScan) {
	m.hflags &^= hfClassify
	c.probeBits |= ringBit(c.pushed + uint32(sc.done))
}

func (c *modelConn) messageDone(m *modelMsg, sc *modelScan, req bool) {
	m.state = msStart
	m.hflags = 0
	m.tokenReset()
	if req {
		return
	}
	sc.done++
	m.status = 0
	c.answered = true
}

// headersDone mirrors headers_done; it returns true where that returns 1.
func (c *modelConn) headersDone(m *modelMsg, sc *modelScan, req bool) bool {
	m.tokenReset()
	if req {
		if m.hflags&hfClassify != 0 {
			c.requestLoad(m)
		}
		requestCounted(m, sc)
		if m.hflags&hfChunked != 0 {
			m.state, m.length = msChunkSize, 0
			return false
		}
		if m.hflags&hfLength != 0 && m.length != 0 {
			m.remaining, m.state = m.length, msBody
			return true
		}
		c.messageDone(m, sc, req)
		return true
	}
	switch {
	case m.status >= 100 && m.status < 200 && m.status != 101:
		m.state, m.hflags, m.status = msStart, 0, 0
		return false
	case m.status == 101:
		m.state = msUntilClose
		return true
	}
	n := c.popped + uint32(sc.done)
	if (int32(c.pushed-n) > 0 && c.headBits&ringBit(n) != 0) || m.status == 204 || m.status == 304 {
		c.messageDone(m, sc, req)
		return false
	}
	if m.hflags&hfChunked != 0 {
		m.state, m.length = msChunkSize, 0
		return false
	}
	if m.hflags&hfLength != 0 {
		if m.length == 0 {
			c.messageDone(m, sc, req)
			return false
		}
		m.remaining, m.state = m.length, msBody
		return true
	}
	m.state = msUntilClose
	return true
}

func chunkSizeDone(m *modelMsg, sc *modelScan) bool {
	if m.pos == 0 {
		sc.err = parseError
		return true
	}
	m.tokenReset()
	if m.length == 0 {
		m.state = msTrailerStart
		return false
	}
	m.remaining, m.state = m.length, msChunkData
	return true
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

func teTokenEnd(m *modelMsg) {
	if m.pos == 7 && m.hash == hashChunked {
		m.hflags |= hfChunked
	}
	m.tokenReset()
}

// msgByte mirrors msg_byte for byte i of the window; it returns true where
// that returns 1.
func (c *modelConn) msgByte(i int, ch byte, req bool) bool {
	m, sc := c.msgOf(req), c.scanOf(req)
	bad := func() bool { sc.err = parseError; return true }
	sc.used = i + 1
	switch m.state {
	case msStart:
		if req {
			if ch == '\r' || ch == '\n' {
				return false
			}
			if ch < 'A' || ch > 'Z' {
				return bad()
			}
			if c.requestBegin(m, sc) {
				return true
			}
			m.tokenReset()
			fnvAdd(&m.pos, &m.hash, ch)
			m.state = msMethod
			return false
		}
		if ch != ' ' {
			if m.pos >= 8 {
				return bad()
			}
			fnvAdd(&m.pos, &m.hash, ch)
			if m.pos == 5 && m.hash != hashHTTPVersion {
				return bad()
			}
			return false
		}
		if m.pos < 6 {
			return bad()
		}
		m.state, m.status = msCode, 0
		m.tokenReset()
		return false
	case msMethod:
		if ch >= 'A' && ch <= 'Z' {
			if m.pos >= maxMethod {
				return bad()
			}
			fnvAdd(&m.pos, &m.hash, ch)
			return false
		}
		if ch != ' ' || m.pos < 3 || (m.pos == 3 && m.hash == hashPRI) {
			return bad()
		}
		if m.pos == 4 && m.hash == hashHead {
			c.requestHead(sc)
		}
		m.state = msSkipLine
		return true
	case msCode:
		if ch >= '0' && ch <= '9' && m.pos < 3 {
			m.status = m.status*10 + uint16(ch-'0')
			m.pos++
			return false
		}
		if m.pos != 3 {
			return bad()
		}
		if ch == '\n' {
			m.state = msLineStart
			return true
		}
		m.state = msSkipLine
		return true
	case msSkipLine:
		if ch == '\n' {
			m.state = msLineStart
			return true
		}
		return false
	case msLineStart, msName:
		if m.state == msLineStart {
			if ch == '\r' {
				m.state = msHeadersLF
				return false
			}
			if ch == '\n' {
				return c.headersDone(m, sc, req)
			}
			m.state = msName
			m.tokenReset()
		}
		if ch == ':' {
			m.state = msSkipLine
			switch {
			case m.pos == 14 && m.hash == hashContentLength:
				m.state, m.length = msCLValue, 0
				m.hflags |= hfLength
			case m.pos == 17 && m.hash == hashTransferEncoding:
				m.state = msTEValue
			case req && m.hflags&hfClassify != 0 && m.pos == 10 && m.hash == hashUserAgent:
				m.state = msUASpace
			}
			m.tokenReset()
			return m.state == msSkipLine
		}
		if ch == '\n' {
			m.state = msLineStart
			return true
		}
		fnvAdd(&m.pos, &m.hash, lower(ch))
		return false
	case msUASpace, msUAValue:
		if m.state == msUASpace {
			if ch == ' ' || ch == '\t' {
				return false
			}
			m.state = msUAValue
			m.tokenReset()
		}
		if ch == '\r' || ch == '\n' {
			c.requestLoad(m)
			m.state = msSkipLine
			if ch == '\n' {
				m.state = msLineStart
			}
			return true
		}
		fnvAdd(&m.pos, &m.hash, ch)
		if (m.pos == 11 && m.hash == hashKubeProbe) || (m.pos == 16 && m.hash == hashSockscaleProbe) {
			c.requestProbe(m, sc)
			m.state = msSkipLine
			return true
		}
		if m.pos >= 16 {
			c.requestLoad(m)
			m.state = msSkipLine
			return true
		}
		return false
	case msCLValue:
		if ch >= '0' && ch <= '9' {
			if m.pos >= 18 {
				return bad()
			}
			m.length = m.length*10 + uint64(ch-'0')
			m.pos++
			return false
		}
		if ch == ' ' || ch == '\t' || ch == '\r' {
			return false
		}
		if ch == '\n' && m.pos > 0 {
			m.state = msLineStart
			return true
		}
		return bad()
	case msTEValue:
		if ch == '\n' {
			teTokenEnd(m)
			m.state = msLineStart
			return true
		}
		if ch == ',' || ch == ' ' || ch == '\t' || ch == '\r' {
			teTokenEnd(m)
			return false
		}
		fnvAdd(&m.pos, &m.hash, lower(ch))
		return false
	case msHeadersLF:
		if ch != '\n' {
			return bad()
		}
		return c.headersDone(m, sc, req)
	case msChunkSize:
		if v := hexValue(ch); v >= 0 {
			if m.pos >= 15 {
				return bad()
			}
			m.length = m.length*16 + uint64(v)
			m.pos++
			return false
		}
		switch ch {
		case ';', ' ', '\t':
			m.state = msChunkExt
			return false
		case '\r':
			return false
		case '\n':
			return chunkSizeDone(m, sc)
		}
		return bad()
	case msChunkExt:
		if ch == '\n' {
			return chunkSizeDone(m, sc)
		}
		return false
	case msChunkEnd:
		if ch == '\r' {
			return false
		}
		if ch != '\n' {
			return bad()
		}
		m.state, m.length = msChunkSize, 0
		m.tokenReset()
		return false
	case msTrailerStart:
		switch ch {
		case '\r':
			m.state = msTrailerLF
			return false
		case '\n':
			c.messageDone(m, sc, req)
			return req
		}
		m.state = msTrailerSkip
		return true
	case msTrailerSkip:
		if ch == '\n' {
			m.state = msTrailerStart
		}
		return false
	case msTrailerLF:
		if ch != '\n' {
			return bad()
		}
		c.messageDone(m, sc, req)
		return req
	}
	sc.used = i
	return true
}

func (c *modelConn) skipBody(m *modelMsg, sc *modelScan, req bool) bool {
	avail := uint64(sc.end - sc.off)
	if m.remaining > avail {
		m.remaining -= avail
		sc.off = sc.end
		return true
	}
	sc.off += int(m.remaining)
	m.remaining = 0
	if m.state == msBody {
		c.messageDone(m, sc, req)
	} else {
		m.state = msChunkEnd
	}
	return false
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

// lineMatters mirrors line_matters for the line at buf[p].
func lineMatters(buf []byte, p int, m *modelMsg, req bool) bool {
	ch := buf[p]
	low := ch | 0x20
	return ch == '\r' || ch == '\n' || low == 'c' || low == 't' || (req && m.hflags&hfClassify != 0 && low == 'u')
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

// findLF mirrors find_lf: the first '\n' at or after start, or -1.
func findLF(buf []byte, start int) int {
	for i := start; i < len(buf); i++ {
		if buf[i] == '\n' {
			return i
		}
	}
	return -1
}

// lineFast mirrors line_fast; it returns the bytes consumed.
func (c *modelConn) lineFast(buf []byte, req bool) int {
	m, sc := c.msgOf(req), c.scanOf(req)
	n := len(buf)
	if m.state == msLineStart && (buf[0] == '\n' || strings.HasPrefix(string(buf), "\r\n")) {
		c.headersDone(m, sc, req)
		if buf[0] == '\n' {
			return 1
		}
		return 2
	}
	if req && m.state == msStart {
		if n < 8 {
			return 0
		}
		k, head := methodWord(buf)
		if k == 0 || c.requestBegin(m, sc) {
			return 0
		}
		if head {
			c.requestHead(sc)
		}
		m.tokenReset()
		m.state = msSkipLine
		return k
	}
	if n < 24 {
		return 0
	}
	str := string(buf)
	if m.state == msStart {
		if !strings.HasPrefix(str, "HTTP/1.1 ") && !strings.HasPrefix(str, "HTTP/1.0 ") {
			return 0
		}
		for _, d := range buf[9:12] {
			if d < '0' || d > '9' {
				return 0
			}
		}
		m.tokenReset()
		m.pos = 3
		m.status = uint16(buf[9]-'0')*100 + uint16(buf[10]-'0')*10 + uint16(buf[11]-'0')
		m.state = msSkipLine
		if buf[12] == '\n' {
			m.state = msLineStart
		}
		return 13
	}
	if buf[0] == '\r' {
		return 0
	}
	if lowerEqual(buf, "content-length:") {
		m.state, m.length = msCLValue, 0
		m.hflags |= hfLength
		m.tokenReset()
		return 15 + contentLengthFast(m, buf[15:23])
	}
	if lowerEqual(buf, "transfer-encoding:") {
		m.state = msTEValue
		m.tokenReset()
		return 18
	}
	if req && m.hflags&hfClassify != 0 && lowerEqual(buf, "user-agent:") {
		if n < 32 {
			return 0
		}
		m.state = msUASpace
		m.tokenReset()
		if buf[11] != ' ' || buf[12] == ' ' || buf[12] == '\t' {
			return 11
		}
		if strings.HasPrefix(str[12:], "kube-probe/") || strings.HasPrefix(str[12:], "sockscale-probe/") {
			c.requestProbe(m, sc)
		} else {
			c.requestLoad(m)
		}
		m.state = msSkipLine
		return 12
	}
	q := firstColonOrLF(buf)
	if q < 0 {
		return 0
	}
	m.state = msLineStart
	if buf[q] == ':' {
		m.state = msSkipLine
	}
	m.tokenReset()
	return q + 1
}

// contentLengthFast mirrors content_length_fast: v is the eight bytes
// after "Content-Length:".
func contentLengthFast(m *modelMsg, v []byte) int {
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
	m.length, m.pos, m.state = length, uint8(i-1), msLineStart
	return i + 2
}

// skipLines mirrors skip_lines (and skip_line_step): it returns the bytes
// of buf consumed.
func (c *modelConn) skipLines(buf []byte, k int, req bool) int {
	m, sc := c.msgOf(req), c.scanOf(req)
	n := len(buf)
	for range skipLinesPerStep {
		lf := findLF(buf, k)
		if lf < 0 {
			return n
		}
		p := lf + 1
		if p >= n {
			m.state = msLineStart
			return n
		}
		if !modelFastPaths {
			// Byte by byte: the next line is parsed from its start.
			m.state = msLineStart
			return p
		}
		if !lineMatters(buf, p, m, req) {
			k = p
			continue
		}
		m.state = msLineStart
		switch {
		case buf[p] == '\n':
			c.headersDone(m, sc, req)
			return p + 1
		case buf[p] == '\r' && p+1 < n && buf[p+1] == '\n':
			c.headersDone(m, sc, req)
			return p + 2
		}
		return p
	}
	return k
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

// atLineStart mirrors at_line_start.
func atLineStart(m *modelMsg, req bool) bool {
	return m.state == msLineStart || (m.state == msStart && (req || m.pos == 0))
}

// msgStep mirrors msg_step; it returns true where that returns 1.
func (c *modelConn) msgStep(req bool) bool {
	m, sc := c.msgOf(req), c.scanOf(req)
	if sc.off >= sc.end || sc.err != 0 || m.state == msUntilClose || m.state == msLost {
		return true
	}
	if m.state == msBody || m.state == msChunkData {
		return c.skipBody(m, sc, req)
	}
	buf := window(c.payload, sc.off, sc.end)
	n, k := len(buf), 0
	next := false
	if atLineStart(m, req) {
		if modelFastPaths {
			k = c.lineFast(buf, req)
		}
		if sc.err != 0 {
			return true
		}
		switch {
		case k > 0 && m.state == msLineStart && k < n && !lineMatters(buf, k, m, req):
			m.state = msSkipLine
		case k > 0 && m.state != msSkipLine && m.state != msCLValue && m.state != msTEValue && m.state != msUASpace:
			next = true
		}
	}
	if !next {
		if m.state != msSkipLine && m.state != msTrailerSkip && k < n {
			sc.used = n
			for i := k; i < n; i++ {
				if c.msgByte(i, buf[i], req) {
					break
				}
			}
			k = sc.used
			if sc.err != 0 {
				return true
			}
		}
		if m.state == msSkipLine && k < n {
			k = c.skipLines(buf, k, req)
		} else if m.state == msTrailerSkip && k < n {
			if lf := findLF(buf, k); lf >= 0 {
				m.state = msTrailerStart
				k = lf + 1
			} else {
				k = n
			}
		}
	}
	sc.off += k
	return sc.off >= sc.end
}

// parseMsg mirrors parse_msg over the packet offsets [off, end) of payload.
func (c *modelConn) parseMsg(payload []byte, off, end int, req bool) int {
	sc, m := c.scanOf(req), c.msgOf(req)
	c.payload = payload
	sc.off, sc.end, sc.err, sc.done = off, end, 0, 0
	for range maxWindows {
		if c.msgStep(req) {
			break
		}
	}
	if sc.err != 0 {
		return sc.err
	}
	if sc.off < sc.end && m.state != msUntilClose {
		return parseLimit
	}
	return 0
}

// The request side (lib/request.h).

// requestLineProof mirrors request_line_proof for the packet offsets
// [off, end) of payload.
func requestLineProof(payload []byte, off, end int) bool {
	b := payload[off-ipTCPHeaderLen : end-ipTCPHeaderLen]
	if min(len(b), scanWindow) < 16 {
		return false
	}
	n := min(len(b), scanWindow)
	method := 0
	for method <= maxMethod && method < n && b[method] >= 'A' && b[method] <= 'Z' {
		method++
	}
	if method < 3 || method >= n || b[method] != ' ' || (method == 3 && strings.HasPrefix(string(b), "PRI ")) {
		return false
	}
	lf := findLF(b[:min(len(b), proofWindows*scanWindow)], 0)
	if lf < method+11 {
		return false
	}
	tail := string(b[lf-10 : lf+1])
	return tail == " HTTP/1.1\r\n" || tail == " HTTP/1.0\r\n"
}

func (c *modelConn) onRequestBytes(p *modelPod, payload []byte, off, end int) {
	m, sc := &c.rx, &c.rxs
	if c.opaque || c.tunnel {
		return
	}
	if m.state == msLost {
		if (c.pending() > 0 && c.tx.state != msLost) || !requestLineProof(payload, off, end) {
			return
		}
		m.state, m.hflags = msStart, 0
		m.tokenReset()
		p.events[evResync]++
	}
	err := c.parseMsg(payload, off, end, true)
	c.seen = true
	if err != 0 {
		begun := 0
		if m.hflags&hfBegun != 0 {
			begun = 1
		}
		if !c.answered && int(c.pushed)+sc.done+begun <= 1 {
			c.goOpaque(p)
			return
		}
		p.events[map[int]int{parseError: evParseError, parseLimit: evParseLimit}[err]]++
		m.state = msLost
		if begun != 0 {
			requestCounted(m, sc)
		}
	}
	if sc.done > 0 {
		c.pushRequests(p, uint32(sc.done))
	}
}

func (c *modelConn) noteGap(seq, end uint32) {
	if !c.rxGap {
		c.gapSeq, c.gapEnd, c.rxGap = seq, end, true
		return
	}
	if int32(seq-c.gapSeq) < 0 {
		c.gapSeq = seq
	}
	if int32(end-c.gapEnd) > 0 {
		c.gapEnd = end
	}
}

// closeGap mirrors close_gap; it returns true where that returns 1.
func (c *modelConn) closeGap(p *modelPod) bool {
	m := &c.rx
	if int32(c.rxNext-c.gapSeq) < 0 {
		return false
	}
	c.rxGap = false
	if int32(c.gapEnd-c.rxNext) <= 0 {
		return false
	}
	missed := uint64(c.gapEnd - c.rxNext)
	c.rxNext = c.gapEnd
	if c.opaque || m.state == msLost || c.tunnel {
		return false
	}
	if (m.state == msBody || m.state == msChunkData) && m.remaining >= missed {
		m.remaining -= missed
		if m.remaining != 0 {
			return false
		}
		if m.state == msChunkData {
			m.state = msChunkEnd
			return false
		}
		c.messageDone(m, &c.rxs, true)
		return false
	}
	m.state = msLost
	p.events[evStreamGap]++
	if m.hflags&hfBegun == 0 {
		return false
	}
	m.hflags &^= hfBegun
	return true
}

// The response side (lib/response.h).

func (c *modelConn) resyncResponse(p *modelPod, payload []byte, off, end int) bool {
	m := &c.tx
	b := payload[off-ipTCPHeaderLen : end-ipTCPHeaderLen]
	if len(b) < 13 || (!strings.HasPrefix(string(b), "HTTP/1.1 ") && !strings.HasPrefix(string(b), "HTTP/1.0 ")) {
		return false
	}
	for _, d := range b[9:12] {
		if d < '0' || d > '9' {
			return false
		}
	}
	if n := c.pending(); n > 0 {
		if c.startNs[(c.pushed-1)%maxPipeline] <= c.txLast {
			return false
		}
		if n > 1 {
			c.popRequests(p, n-1)
		}
	}
	m.state, m.hflags, m.status = msStart, 0, 0
	m.tokenReset()
	p.events[evResync]++
	return true
}

func (c *modelConn) onResponseBytes(p *modelPod, payload []byte, off, end int) {
	m := &c.tx
	if c.opaque {
		return
	}
	if !c.seen {
		c.goOpaque(p)
		return
	}
	if m.state == msLost && !c.resyncResponse(p, payload, off, end) {
		c.txLast = p.now
		return
	}
	if err := c.parseMsg(payload, off, end, false); err != 0 {
		p.events[map[int]int{parseError: evParseError, parseLimit: evParseLimit}[err]]++
		if !c.answered {
			c.goOpaque(p)
			return
		}
		m.state = msLost
		c.txLast = p.now
	}
	if m.state == msUntilClose {
		c.tunnel = true
	}
	if c.txs.done > 0 {
		c.popRequests(p, uint32(c.txs.done))
	}
}

// Segments (lib/segment.h).

// ingress mirrors cgroup_skb/ingress for a segment of the connection whose
// payload starts at seq.
func (c *modelConn) ingress(p *modelPod, seq uint32, payload []byte) {
	p.tick()
	if c.closed || len(payload) == 0 {
		return
	}
	end := seq + uint32(len(payload))
	next := c.rxNext
	if int32(end-next) <= 0 {
		return
	}
	if int32(seq-next) > 0 {
		c.noteGap(seq, end)
		return
	}
	skip := 0
	if d := int32(next - seq); d > 0 {
		skip = int(d)
	}
	c.rxNext = end
	if c.h2Ingress(p, payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload)) {
		return
	}
	c.onRequestBytes(p, payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload))
	if c.rxGap && c.closeGap(p) {
		c.pushRequests(p, 1)
	}
}

// egress mirrors cgroup_skb/egress.
func (c *modelConn) egress(p *modelPod, seq uint32, payload []byte) {
	p.tick()
	if c.closed || len(payload) == 0 {
		return
	}
	end := seq + uint32(len(payload))
	if int32(end-c.txNext) <= 0 {
		return
	}
	skip := 0
	if d := int32(c.txNext - seq); d > 0 {
		skip = int(d)
	}
	c.txNext = end
	if c.h2Egress(p, payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload)) {
		return
	}
	c.onResponseBytes(p, payload, ipTCPHeaderLen+skip, ipTCPHeaderLen+len(payload))
}

// Before the accept (lib/conn.h, lib/accept.h).

// listen mirrors ingress for a segment that reaches the listening socket
// (syn: a SYN, whose data follows its own sequence number): it parses into
// a new stash entry, counting nothing. prober: the client may send health
// probes (the node or an activator).
func listen(p *modelPod, seq uint32, syn bool, payload []byte, prober bool) *modelConn {
	if syn {
		seq++
	}
	s := &modelConn{rxNext: seq, rxFirst: seq, stashed: true, mayProbe: prober}
	s.rx.hash, s.tx.hash = fnvOffset, fnvOffset
	s.ingress(p, seq, payload)
	return s
}

// listenMore mirrors stash_conn for a later segment that reaches the
// listening socket while s (nil: none) is the stash entry: one that goes
// on from s's last byte is parsed on into s, any other starts afresh.
func listenMore(p *modelPod, s *modelConn, seq uint32, payload []byte, prober bool) *modelConn {
	if s != nil && s.rxNext == seq && s.rxFirst != seq {
		s.ingress(p, seq, payload)
		return s
	}
	return listen(p, seq, false, payload, prober)
}

// accept mirrors first_state and count_accepted: the connection's state
// when it is established with the client and server at rcvNxt and sndNxt,
// from the stash s (nil: none), and payload bytes on the segment that
// established it. prober: the client may send health probes (the node or
// an activator); else every request is load (load_only).
func accept(p *modelPod, s *modelConn, rcvNxt, sndNxt uint32, payload int, proxied, prober bool) *modelConn {
	p.tick()
	c := &modelConn{}
	if s != nil && s.rxFirst == rcvNxt {
		c = s
	} else {
		c.rxNext = rcvNxt
		c.rx.hash, c.tx.hash = fnvOffset, fnvOffset
		if s != nil && int32(s.rxFirst-rcvNxt) > 0 {
			c.rxGap, c.gapSeq, c.gapEnd = true, s.rxFirst, s.rxNext
		} else if payload > 0 {
			c.rxNext = rcvNxt + uint32(payload)
			c.seen = true
			c.rx.state = msLost
			p.events[evStreamGap]++
		}
	}
	c.counted, c.proxied, c.txNext, c.stashed = true, proxied, sndNxt, false
	if !prober {
		c.load, c.probeBits = true, 0
		c.rx.hflags &^= hfClassify
	}
	p.conns++
	if c.opaque {
		p.opaqueInFlight++
		p.opaqueTotal++
	}
	counted := 0
	if c.h2 == h2Follow && c.h2s != nil {
		// Streams walked before the accept (h2_accept_stash).
		counted = int(c.pending())
		p.probes += uint64(c.h2s.earlyProbes)
		if !c.opaque {
			p.h2InFlight++
			p.h2Total++
		}
	} else {
		for i := range c.pending() {
			if c.probeBits&ringBit(c.popped+i) == 0 {
				counted++
			}
		}
		p.probes += uint64(int(c.pending()) - counted)
	}
	p.inFlight += int64(counted)
	p.started += uint64(counted)
	if c.proxied {
		p.proxiedInFlight += int64(counted)
		p.proxiedStarted += uint64(counted)
	}
	return c
}
