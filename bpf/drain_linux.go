package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Drain hands a server connection of a leaving pod to sockscale_drain
// (drain.c): if the next thing its server writes starts an HTTP/1.x
// response, that response tells the client to close the connection. fd is
// a file descriptor of the connection's socket (the caller's duplicate of
// the server's, see pidfd_getfd); the caller may close it afterwards. Call
// it only between two responses (ConnActivity says ConnIdle or ConnWaiting,
// and the socket has nothing left to send, SIOCOUTQNSD): a write in the
// middle of one
// would not be looked at, nor the responses after it. A connection handed
// over before is not an error.
func (a *Accounting) Drain(fd int) error {
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return fmt.Errorf("drain a connection: its cookie: %w", err)
	}
	err = a.objs.Draining.Update(cookie, uint64(fd), ebpf.UpdateNoExist)
	if errors.Is(err, ebpf.ErrKeyExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("drain connection %d: %w", cookie, err)
	}
	return nil
}

// Where connActivityOf reads a connection's state (struct conn).
var (
	connPushedOff  = int(unsafe.Offsetof(accountingConn{}.Pushed))
	connPoppedOff  = int(unsafe.Offsetof(accountingConn{}.Popped))
	connOpaqueOff  = int(unsafe.Offsetof(accountingConn{}.Opaque))
	connTunnelOff  = int(unsafe.Offsetof(accountingConn{}.Tunnel))
	connH2Off      = int(unsafe.Offsetof(accountingConn{}.H2))
	connRxGapOff   = int(unsafe.Offsetof(accountingConn{}.RxGap))
	connRxStateOff = int(unsafe.Offsetof(accountingConn{}.Rx) + unsafe.Offsetof(accountingMsg{}.State))
	connTxStateOff = int(unsafe.Offsetof(accountingConn{}.Tx) + unsafe.Offsetof(accountingMsg{}.State))
	connTxPosOff   = int(unsafe.Offsetof(accountingConn{}.Tx) + unsafe.Offsetof(accountingMsg{}.Pos))
)

// Parser states (MS_* of accounting.h) read here; the model's test checks
// them against its own list.
const (
	parserStart = 0
	parserLost  = 20
)

// ConnActivity reads what the server connection of the socket fd (the
// caller's descriptor of it) is doing from its state in socket storage.
func (a *Accounting) ConnActivity(fd int) (ConnActivity, error) {
	state := make([]byte, connSize)
	err := a.objs.ConnStore.Lookup(int32(fd), state)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return ConnUnknown, nil
	}
	if err != nil {
		return ConnUnknown, fmt.Errorf("connection state: %w", err)
	}
	return connActivityOf(state), nil
}

// connActivityOf reads a connection's activity from its state (struct
// conn as socket storage holds it; nil: none).
func connActivityOf(state []byte) ConnActivity {
	if len(state) < connSize || state[connClosedOff] != 0 {
		return ConnUnknown
	}
	// HTTP/2 is not asked to close by a header: its streams are counted,
	// but the connection is the app's to end (GOAWAY), as for TLS.
	if state[connOpaqueOff] != 0 || state[connTunnelOff] != 0 || state[connH2Off] != 0 {
		return ConnOpaque
	}
	rx, tx := state[connRxStateOff], state[connTxStateOff]
	if rx == parserLost || tx == parserLost {
		return ConnUnknown
	}
	pushed := binary.NativeEndian.Uint32(state[connPushedOff:])
	popped := binary.NativeEndian.Uint32(state[connPoppedOff:])
	responding := tx != parserStart || state[connTxPosOff] != 0
	switch {
	case responding:
		return ConnBusy
	case pushed != popped:
		return ConnWaiting
	case rx != parserStart || state[connRxGapOff] != 0:
		return ConnBusy // the next request's bytes are coming
	}
	return ConnIdle
}
