package bpf

import (
	"testing"
	"unsafe"
)

func TestConnActivityOf(t *testing.T) {
	if parserStart != msStart || parserLost != msLost {
		t.Fatalf("parser states read by connActivityOf: start %d lost %d; the model's: %d %d", parserStart, parserLost, msStart, msLost)
	}
	state := func(change func(c *accountingConn)) []byte {
		c := accountingConn{}
		change(&c)
		return unsafe.Slice((*byte)(unsafe.Pointer(&c)), unsafe.Sizeof(c))
	}
	tests := []struct {
		name  string
		state []byte
		want  ConnActivity
	}{
		{"no state", nil, ConnUnknown},
		{"between requests", state(func(c *accountingConn) { c.Pushed, c.Popped = 3, 3 }), ConnIdle},
		{"a request in flight, its response not begun", state(func(c *accountingConn) { c.Pushed, c.Popped = 4, 3 }), ConnWaiting},
		{"a response being sent", state(func(c *accountingConn) { c.Pushed, c.Popped, c.Tx.State = 4, 3, msBody }), ConnBusy},
		{"a status line begun", state(func(c *accountingConn) { c.Pushed, c.Popped, c.Tx.Pos = 4, 3, 5 }), ConnBusy},
		{"the next request's headers arriving", state(func(c *accountingConn) { c.Pushed, c.Popped, c.Rx.State = 3, 3, msSkipLine }), ConnBusy},
		{"bytes ahead of a hole", state(func(c *accountingConn) { c.RxGap = 1 }), ConnBusy},
		{"lost request stream", state(func(c *accountingConn) { c.Rx.State = msLost }), ConnUnknown},
		{"lost response stream", state(func(c *accountingConn) { c.Tx.State = msLost }), ConnUnknown},
		{"opaque", state(func(c *accountingConn) { c.Opaque = 1 }), ConnOpaque},
		{"upgraded", state(func(c *accountingConn) { c.Tunnel, c.Pushed = 1, 1 }), ConnOpaque},
		{"HTTP/2, no stream in flight", state(func(c *accountingConn) { c.H2 = 2 }), ConnOpaque},
		{"closed", state(func(c *accountingConn) { c.Closed = 1 }), ConnUnknown},
	}
	for _, tt := range tests {
		if got := connActivityOf(tt.state); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
