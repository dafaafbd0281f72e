package bpf

// The model of lib/h2.h: HTTP/2 with prior knowledge, a request per stream.

const (
	h2None, h2ServerFirst, h2Follow, h2Stashed, h2Upgraded = 0, 1, 2, 3, 4
	h2StashFrames                                          = 4
	h2PrefaceLen, h2HeaderLen                              = 24, 9

	h2Data, h2Headers, h2Priority, h2RSTStream, h2Settings          = 0x0, 0x1, 0x2, 0x3, 0x4
	h2PushPromise, h2Ping, h2GoAway, h2WindowUpdate, h2Continuation = 0x5, 0x6, 0x7, 0x8, 0x9
	h2EndStream                                                     = 0x1
)

const h2ClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

type modelH2Dir struct {
	left, frames uint32
	have         int
	hdr          [h2HeaderLen]byte
}

type modelH2 struct {
	rx, tx    modelH2Dir
	maxStream uint32
	ids       [maxH2Streams]uint32
	startNs   [maxH2Streams]uint64
	startSum  uint64
	// earlyProbes mirrors early_probes: probes walked before the accept.
	earlyProbes uint32
}

// h2Walk mirrors struct h2_walk: a segment's stream changes.
type h2Walk struct {
	c                      *modelConn
	opened, closed, probes uint32
	starts                 uint64
	// classify: the next new stream's User-Agent decides whether it is
	// load; paused: the walk stopped there, at a HEADERS frame of stream
	// pSid, flags pFlags, length pLen, whose payload bytes in the segment
	// are pBytes.
	classify, paused bool
	pSid, pLen       uint32
	pFlags           byte
	pBytes           []byte
}

// packetBytes returns the payload bytes [off, end) of a packet whose
// payload starts at ipTCPHeaderLen (offsets as the programs use them).
func packetBytes(payload []byte, off, end int) []byte {
	return payload[off-ipTCPHeaderLen : end-ipTCPHeaderLen]
}

// h2Preface mirrors h2_preface.
func h2Preface(b []byte) bool {
	return len(b) >= h2PrefaceLen && string(b[:h2PrefaceLen]) == h2ClientPreface
}

// h2SettingsFirst mirrors h2_settings_first.
func h2SettingsFirst(b []byte) bool {
	if len(b) < h2HeaderLen {
		return false
	}
	n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	return b[3] == h2Settings && b[4] == 0 && b[5]|b[6]|b[7]|b[8] == 0 && n%6 == 0 && n <= 1024
}

// h2StashPreface mirrors h2_stash_preface.
func h2StashPreface(b []byte) bool {
	if !h2Preface(b) {
		return false
	}
	b = b[h2PrefaceLen:]
	for i := range h2StashFrames {
		if len(b) == 0 {
			return true
		}
		if len(b) < h2HeaderLen || b[5]|b[6]|b[7]|b[8] != 0 {
			return false
		}
		if typ := b[3]; typ != h2Settings && (i == 0 || (typ != h2WindowUpdate && typ != h2Ping)) {
			return false
		}
		n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		if n > len(b)-h2HeaderLen {
			return false
		}
		b = b[h2HeaderLen+n:]
	}
	return len(b) == 0
}

// h2FromStash mirrors h2_from_stash.
func (c *modelConn) h2FromStash(p *modelPod) {
	c.h2s = &modelH2{}
	c.h2s.rx.frames = 1
	c.h2 = h2Follow
	if !c.closed && !c.opaque && c.owner(p) != nil {
		p.h2InFlight++
		p.h2Total++
	}
}

// findSlot mirrors find_slot.
func (h *modelH2) findSlot(sid uint32) int {
	for i, id := range h.ids {
		if id == sid {
			return i
		}
	}
	return -1
}

// endStream mirrors end_stream.
func (h *modelH2) endStream(w *h2Walk, sid uint32) {
	i := h.findSlot(sid)
	if i < 0 || sid == 0 {
		return
	}
	h.ids[i] = 0
	w.closed++
	w.starts += h.startNs[i]
}

// openStream mirrors open_stream.
func (h *modelH2) openStream(p *modelPod, w *h2Walk, sid uint32) {
	i := h.findSlot(0)
	if i < 0 {
		p.events[evH2Full]++
		return
	}
	h.startNs[i], h.ids[i] = p.now, sid
	w.opened++
}

// h2Frame mirrors h2_frame; payload is the segment's bytes after the
// header.
func (h *modelH2) h2Frame(p *modelPod, w *h2Walk, d *modelH2Dir, hdr []byte, payload []byte, req bool) int {
	n := uint32(hdr[0])<<16 | uint32(hdr[1])<<8 | uint32(hdr[2])
	typ, flags := hdr[3], hdr[4]
	sid := uint32(hdr[5]&0x7f)<<24 | uint32(hdr[6])<<16 | uint32(hdr[7])<<8 | uint32(hdr[8])
	d.left = n
	d.frames++
	switch typ {
	case h2Data, h2Headers, h2Priority, h2RSTStream, h2PushPromise, h2Continuation:
		if sid == 0 {
			return parseError
		}
	case h2Settings, h2Ping, h2GoAway:
		if sid != 0 {
			return parseError
		}
	}
	if req && d.frames == 1 && typ != h2Settings {
		return parseError
	}
	if req {
		if typ == h2Headers && sid > h.maxStream {
			if sid&1 == 0 {
				return parseError
			}
			h.maxStream = sid
			if w.classify {
				w.classify, w.paused = false, true
				w.pSid, w.pLen, w.pFlags, w.pBytes = sid, n, flags, payload[:min(uint32(len(payload)), n)]
				return 0
			}
			w.c.load = true
			h.openStream(p, w, sid)
		} else if typ == h2RSTStream {
			h.endStream(w, sid)
		}
		return 0
	}
	if ((typ == h2Data || typ == h2Headers) && flags&h2EndStream != 0) || typ == h2RSTStream {
		h.endStream(w, sid)
	} else if typ == h2GoAway && n >= 4 && len(payload) >= 4 {
		last := uint32(payload[0]&0x7f)<<24 | uint32(payload[1])<<16 | uint32(payload[2])<<8 | uint32(payload[3])
		for i, id := range h.ids {
			if id > last {
				h.ids[i] = 0
				w.closed++
				w.starts += h.startNs[i]
			}
		}
	}
	return 0
}

// h2Bytes mirrors h2_bytes over the packet bytes [off, end).
func (c *modelConn) h2Bytes(p *modelPod, payload []byte, off, end int, req bool) {
	if c.opaque {
		return
	}
	h := c.h2s
	d := &h.tx
	if req {
		d = &h.rx
	}
	b := packetBytes(payload, off, end)
	w := h2Walk{c: c, classify: req && !c.load}
	err := 0
	walk := func() {
		for steps := 0; len(b) > 0 && err == 0 && steps < maxH2Frames; {
			steps++
			if d.left > 0 {
				n := min(uint32(len(b)), d.left)
				d.left -= n
				b = b[n:]
				continue
			}
			var hdr []byte
			if d.have == 0 && len(b) >= h2HeaderLen {
				hdr, b = b[:h2HeaderLen], b[h2HeaderLen:]
			} else {
				for k := 0; k < h2HeaderLen && len(b) > 0 && d.have < h2HeaderLen; k++ {
					d.hdr[d.have] = b[0]
					d.have++
					b = b[1:]
				}
				if d.have < h2HeaderLen {
					break
				}
				d.have = 0
				hdr = d.hdr[:]
			}
			if err = h.h2Frame(p, &w, d, hdr, b, req); err != 0 {
				break
			}
			n := min(uint32(len(b)), d.left)
			d.left -= n
			b = b[n:]
			if w.paused {
				break
			}
		}
	}
	walk()
	if w.paused {
		w.paused = false
		if hpackProbe(w.pBytes, w.pLen, w.pFlags) {
			w.probes++
		} else {
			c.load = true
			h.openStream(p, &w, w.pSid)
		}
		walk()
	}
	if err == 0 && len(b) > 0 {
		err = parseLimit
	}
	c.h2Count(p, &w)
	if err != 0 {
		c.h2GoOpaque(p)
	}
}

// h2Count mirrors h2_count.
func (c *modelConn) h2Count(p *modelPod, w *h2Walk) {
	if (w.opened == 0 && w.closed == 0 && w.probes == 0) || c.closed || c.opaque {
		return
	}
	if c.owner(p) != nil {
		p.probes += uint64(w.probes)
	} else if c.stashed {
		c.h2s.earlyProbes += w.probes
	}
	c.pushed += w.opened
	c.popped += w.closed
	c.h2s.startSum += uint64(w.opened)*p.now - w.starts
	if c.owner(p) == nil {
		return
	}
	p.inFlight += int64(w.opened) - int64(w.closed)
	p.started += uint64(w.opened)
	p.completed += uint64(w.closed)
	if c.proxied {
		p.proxiedInFlight += int64(w.opened) - int64(w.closed)
		p.proxiedStarted += uint64(w.opened)
		p.proxiedCompleted += uint64(w.closed)
	}
}

// h2GoOpaque mirrors h2_go_opaque.
func (c *modelConn) h2GoOpaque(p *modelPod) {
	p.events[evH2Lost]++
	if c.opaque || c.closed {
		return
	}
	n := c.pending()
	c.popped = c.pushed
	c.opaque = true
	c.pushed++
	c.h2s.startSum = p.now
	if c.owner(p) == nil {
		return
	}
	p.inFlight += 1 - int64(n)
	p.started++
	p.completed += uint64(n)
	if c.proxied {
		p.proxiedInFlight += 1 - int64(n)
		p.proxiedStarted++
		p.proxiedCompleted += uint64(n)
	}
	p.opaqueInFlight++
	p.opaqueTotal++
	if c.h2 == h2Follow {
		p.h2InFlight--
	}
}

// h2CloseGap mirrors h2_close_gap.
func (c *modelConn) h2CloseGap(p *modelPod) {
	if int32(c.rxNext-c.gapSeq) < 0 {
		return
	}
	c.rxGap = false
	if int32(c.gapEnd-c.rxNext) <= 0 {
		return
	}
	missed := c.gapEnd - c.rxNext
	c.rxNext = c.gapEnd
	if c.opaque {
		return
	}
	if c.h2s.rx.have == 0 && c.h2s.rx.left >= missed {
		c.h2s.rx.left -= missed
		return
	}
	c.h2GoOpaque(p)
}

// h2Ingress mirrors on_segment's HTTP/2 part for client bytes [off, end)
// of a packet; it returns false where on_segment goes on to request_bytes.
func (c *modelConn) h2Ingress(p *modelPod, payload []byte, off, end int) bool {
	if c.stashed && !c.seen && c.h2 == h2None && !c.opaque && h2Preface(packetBytes(payload, off, end)) {
		c.seen = true
		if h2StashPreface(packetBytes(payload, off, end)) {
			c.h2 = h2Stashed
			return true
		}
		// A request with the preface: walked before the accept (h2_stash).
		c.h2s, c.h2 = &modelH2{}, h2Follow
		return c.h2StashWalk(p, payload, off+h2PrefaceLen, end)
	}
	if c.stashed && c.h2 == h2Stashed {
		// A second segment before the accept (stash_conn went on).
		c.h2s, c.h2 = &modelH2{}, h2Follow
		c.h2s.rx.frames = 1
		return c.h2StashWalk(p, payload, off, end)
	}
	if c.stashed && c.h2 == h2Follow {
		return c.h2StashWalk(p, payload, off, end)
	}
	if c.h2 == h2Stashed && !c.stashed {
		c.h2FromStash(p)
	}
	if (c.h2 == h2Upgraded || c.h2Upgraded()) && h2Preface(packetBytes(payload, off, end)) {
		if c.h2 != h2Upgraded {
			c.h2Upgrade(p, true)
		}
		c.h2 = h2Follow
		off += h2PrefaceLen
	} else if c.h2 == h2Upgraded {
		c.h2GoOpaque(p)
		return true
	}
	if c.h2 != h2Follow && !c.seen && !c.opaque && !c.stashed {
		if h2Preface(packetBytes(payload, off, end)) {
			if c.h2s == nil {
				c.h2s = &modelH2{}
			}
			c.h2 = h2Follow
			c.seen = true
			off += h2PrefaceLen
			if !c.closed && !c.opaque && c.owner(p) != nil {
				p.h2InFlight++
				p.h2Total++
			}
		} else if c.h2 == h2ServerFirst {
			c.h2GoOpaque(p)
			return true
		}
	}
	if c.h2 != h2Follow {
		return false
	}
	c.h2Bytes(p, payload, off, end, true)
	if c.rxGap {
		c.h2CloseGap(p)
	}
	return true
}

// h2Upgraded mirrors h2_upgraded.
func (c *modelConn) h2Upgraded() bool {
	return c.tunnel && c.h2 == h2None && !c.opaque && c.tx.status == 101 && c.tx.state == msUntilClose
}

// h2Upgrade mirrors h2_upgrade.
func (c *modelConn) h2Upgrade(p *modelPod, ingress bool) {
	c.h2s = &modelH2{maxStream: 1}
	if c.pending() == 1 {
		start := c.startNs[c.popped%maxPipeline] // the oldest in flight (oldest_ns)
		c.h2s.startNs[0], c.h2s.startSum, c.h2s.ids[0] = start, start, 1
	}
	c.h2 = h2Upgraded
	if ingress {
		c.h2 = h2Follow
	}
	if !c.closed && !c.opaque && c.owner(p) != nil {
		p.h2InFlight++
		p.h2Total++
	}
}

// h2StashWalk mirrors the walk of a stash entry's client bytes.
func (c *modelConn) h2StashWalk(p *modelPod, payload []byte, off, end int) bool {
	if !c.mayProbe {
		c.load = true
	}
	c.h2Bytes(p, payload, off, end, true)
	return true
}

// h2Egress mirrors on_segment's HTTP/2 part for server bytes; false where
// it goes on to on_response_bytes.
func (c *modelConn) h2Egress(p *modelPod, payload []byte, off, end int) bool {
	if c.h2 == h2Stashed {
		c.h2FromStash(p)
	}
	if !c.seen && c.h2 == h2None && !c.opaque && !c.stashed && h2SettingsFirst(packetBytes(payload, off, end)) {
		c.h2s = &modelH2{}
		c.h2 = h2ServerFirst
	}
	if c.h2Upgraded() && h2SettingsFirst(packetBytes(payload, off, end)) {
		c.h2Upgrade(p, false)
	}
	if c.h2 == h2None {
		c.onResponseBytes(p, payload, off, end)
		if off = c.txs.off; c.h2Upgraded() && off < end && h2SettingsFirst(packetBytes(payload, off, end)) {
			c.h2Upgrade(p, false)
			c.h2Bytes(p, payload, off, end, false)
		}
		return true
	}
	c.h2Bytes(p, payload, off, end, false)
	return true
}
