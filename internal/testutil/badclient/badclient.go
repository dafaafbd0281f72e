package badclient

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Raw writes raw to addr and returns the status and body of the answer,
// or status 0 if the server closed the connection without one. The write
// may fail part way when the server answers early and closes (an oversized
// header): the answer is still read.
func Raw(t testing.TB, addr, raw string) (int, string) {
	t.Helper()
	return send(t, addr, raw, false)
}

// Truncated is Raw, then the client closes its sending side: the request
// ends where raw does.
func Truncated(t testing.TB, addr, raw string) (int, string) {
	t.Helper()
	return send(t, addr, raw, true)
}

func send(t testing.TB, addr, raw string, closeWrite bool) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, raw)
	if tc, ok := c.(*net.TCPConn); ok && closeWrite {
		_ = tc.CloseWrite()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return 0, ""
		}
		t.Fatalf("read the answer to %.60q: %v", raw, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body)
}

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}

// OversizedHeader is a GET whose one header holds n bytes.
func OversizedHeader(n int) string {
	return "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", n) + "\r\n\r\n"
}

// SlowHeaders opens n connections to addr that each send the start of a
// request and then nothing (slowloris), and closes them when t ends.
func SlowHeaders(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("slow connection %d: %v", len(conns), err)
		}
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

// ClosedWithin says whether the server closes c (a read ends with EOF or
// a reset, after any answer) within d.
func ClosedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}
