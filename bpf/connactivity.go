package bpf

// ConnActivity is what a server connection is doing, as its state in the
// programs' socket storage says.
type ConnActivity uint8

const (
	// ConnUnknown is no state, or state the parsers cannot vouch for (the
	// request stream was lost).
	ConnUnknown ConnActivity = iota
	// ConnIdle is HTTP/1.x with no request in flight and no bytes of the
	// next one: the client may send one any moment.
	ConnIdle
	// ConnWaiting is a request in flight whose response has not begun
	// (the server is working on it).
	ConnWaiting
	// ConnBusy is a request being received or its response sent.
	ConnBusy
	// ConnOpaque is accounting per connection (TLS, other protocols),
	// upgraded (a websocket), or HTTP/2: its requests cannot be seen, or
	// (HTTP/2) the connection cannot be asked to close by a header.
	ConnOpaque
)

func (c ConnActivity) String() string {
	switch c {
	case ConnIdle:
		return "idle"
	case ConnWaiting:
		return "waiting"
	case ConnBusy:
		return "busy"
	case ConnOpaque:
		return "opaque"
	}
	return "unknown"
}
