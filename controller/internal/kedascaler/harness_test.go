package kedascaler_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/controller/internal/kedascaler"
)

// ns is the namespace of the tests' ScaledObjects.
const ns = "tenant-a"

// ref is a ScaledObject's trigger in ns as KEDA sends it.
func ref(md map[string]string) *pb.ScaledObjectRef {
	return &pb.ScaledObjectRef{Name: "web-scaler", Namespace: ns, ScalerMetadata: md}
}

// testServer is Serve on a loopback port with mutual TLS from files in
// dir: a serving pair from serverCA, clients checked against clientCA,
// which issued kedaCert.
type testServer struct {
	addr               string
	dir                string
	serverCA, clientCA *testCA
	kedaCert           issued
	stop               func() error // stops Serve and returns its error
}

// startServer serves src with mutual TLS; clk nil is the real clock.
func startServer(t *testing.T, src kedascaler.Source, clk clock.WithTicker) *testServer {
	t.Helper()
	s := &testServer{dir: t.TempDir(), serverCA: newTestCA(t, "serving CA"), clientCA: newTestCA(t, "KEDA client CA")}
	s.serverCA.serving(t).write(t, s.file("tls.crt"), s.file("tls.key"))
	s.clientCA.writeCert(t, s.file("client-ca.crt"))
	s.kedaCert = s.clientCA.client(t, "keda-operator")
	s.addr, s.stop = serve(t, context.Background(), src, kedascaler.Options{
		CertFile: s.file("tls.crt"), KeyFile: s.file("tls.key"), ClientCAFile: s.file("client-ca.crt"), Clock: clk})
	return s
}

func (s *testServer) file(name string) string { return filepath.Join(s.dir, name) }

// serve runs Serve on a loopback port until stop or the test's end.
func serve(t *testing.T, ctx context.Context, src kedascaler.Source, opts kedascaler.Options) (addr string, stop func() error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kedascaler.Serve(ctx, lis, src, opts) }()
	var once sync.Once
	var served error
	stop = func() error {
		once.Do(func() { cancel(); served = <-done })
		return served
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String(), stop
}

// keda is KEDA's client as a ClusterTriggerAuthentication with the
// serving CA and the KEDA certificate configures it.
func (s *testServer) keda(t *testing.T) pb.ExternalScalerClient {
	t.Helper()
	return pb.NewExternalScalerClient(s.dial(t, &s.kedaCert.pair, s.serverCA.pool()))
}

// dial connects to the server as clientTLS configures; the connection
// closes at the test's end.
func (s *testServer) dial(t *testing.T, cert *tls.Certificate, roots *x509.CertPool) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(cert, roots))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// clientTLS presents cert (nil: none) and trusts roots. The certificate
// goes out whatever CAs the server names (from Certificates, Go's client
// would send none that another CA signed), so that the server's check
// is what refuses it.
func clientTLS(cert *tls.Certificate, roots *x509.CertPool) *tls.Config {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return cfg
}

// tlsAlert connects as clientTLS configures, without gRPC, and reads: a
// client the server refuses reads its TLS alert, one it accepts gRPC's
// first frame (nil). gRPC's own error may instead be the broken pipe of
// its first write, depending on which comes first.
func (s *testServer) tlsAlert(t *testing.T, cert *tls.Certificate, roots *x509.CertPool) error {
	t.Helper()
	conn, err := tls.Dial("tcp", s.addr, clientTLS(cert, roots))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Read(make([]byte, 1))
	return err
}

// tryIsActive asks IsActive once over a connection of its own.
func (s *testServer) tryIsActive(t *testing.T, cert *tls.Certificate, roots *x509.CertPool) error {
	t.Helper()
	conn := s.dial(t, cert, roots)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := pb.NewExternalScalerClient(conn).IsActive(ctx, ref(map[string]string{"deployment": "web"}))
	return err
}

// settleGoroutines waits until at most n goroutines run, and fails with
// them all when they do not settle.
func settleGoroutines(t *testing.T, n int, when string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%s: %d goroutines, want at most %d:\n%s", when, runtime.NumGoroutine(), n, buf)
		}
	}
}
