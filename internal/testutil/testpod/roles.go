package testpod

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c" //nolint:staticcheck // deprecated, and the one server of Upgrade: h2c (serveH2CUpgrade)
)

// roleEnv tells a re-executed test binary which role to play in a pod, and
// portEnv on which port, if not the role's own.
const (
	roleEnv = "SOCKSCALE_TESTPOD_ROLE"
	portEnv = "SOCKSCALE_TESTPOD_PORT"
)

// Roles a pod process can play.
const (
	// RoleHTTP serves HTTP/1.x and h2c with prior knowledge (on HTTPPort
	// unless started on another):
	// ?sleep=50ms waits, ?size=N answers N bytes, ?chunked=1 answers
	// chunked, ?close=1 closes after the response.
	RoleHTTP = "http"
	// RoleEcho echoes raw TCP (on EchoPort unless started on another) and
	// keeps connections open.
	RoleEcho = "echo"
	// RoleGRPC serves gRPC over h2c (on GRPCPort unless started on
	// another): GRPCUnary, GRPCStream and the health service.
	RoleGRPC = "grpc"
	// RoleH2CUpgrade serves RoleHTTP's handler to HTTP/1.1 clients that
	// upgrade to h2c (Upgrade: h2c, RFC 7540 section 3.2), on
	// H2CUpgradePort unless started on another.
	RoleH2CUpgrade = "h2c-upgrade"
)

// Ports the roles listen on.
const (
	HTTPPort       = 8080
	EchoPort       = 9000
	GRPCPort       = 9090
	H2CUpgradePort = 8081
)

// Main plays the role this process was started for and exits; it returns at
// once in a normal test process. Call it first in TestMain.
func Main() {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	waitForGate()
	var err error
	port := os.Getenv(portEnv)
	switch role {
	case RoleHTTP:
		err = serveHTTP(cmp.Or(port, strconv.Itoa(HTTPPort)))
	case RoleEcho:
		err = serveEcho(cmp.Or(port, strconv.Itoa(EchoPort)))
	case RoleGRPC:
		err = serveGRPC(cmp.Or(port, strconv.Itoa(GRPCPort)))
	case RoleH2CUpgrade:
		err = serveH2CUpgrade(cmp.Or(port, strconv.Itoa(H2CUpgradePort)))
	default:
		err = fmt.Errorf("unknown test pod role %q", role)
	}
	fmt.Fprintln(os.Stderr, "test pod:", err)
	os.Exit(1)
}

// Handler is the test server's handler (also used by benchmarks in-process).
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if d, err := time.ParseDuration(q.Get("sleep")); err == nil {
			time.Sleep(d)
		}
		if q.Get("close") == "1" {
			w.Header().Set("Connection", "close")
		}
		size, _ := strconv.Atoi(q.Get("size"))
		body := make([]byte, size)
		for i := range body {
			body[i] = 'a' + byte(i%26)
		}
		if q.Get("chunked") == "1" {
			// Flushing before the end makes net/http send chunks.
			for len(body) > 0 {
				n := min(len(body), 32<<10)
				_, _ = w.Write(body[:n])
				body = body[n:]
				w.(http.Flusher).Flush()
			}
			if size == 0 {
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(body)
	})
	return mux
}

// serveHTTP serves HTTP/1.x and, to clients that know it beforehand,
// HTTP/2 without TLS (h2c), as gRPC servers do.
func serveHTTP(port string) error {
	srv := &http.Server{Addr: ":" + port, Handler: Handler(), ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv.ListenAndServe()
}

// serveH2CUpgrade serves HTTP/1.1 and its upgrade to h2c. Go's server
// no longer offers the upgrade (RFC 9113 dropped it), but clients still
// send it (curl --http2 to an http:// URL), so the kernel must follow it;
// x/net's deprecated h2c package is the one server that answers it.
func serveH2CUpgrade(port string) error {
	h := h2c.NewHandler(Handler(), &http2.Server{}) //nolint:staticcheck // see above: the upgrade is what is tested
	srv := &http.Server{Addr: ":" + port, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

func serveEcho(port string) error {
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}
