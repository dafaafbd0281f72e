package kedascaler_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sockscale/sockscale/controller/internal/kedascaler"
)

// Only a client with a certificate from the client CA is answered.
func TestClientsWithoutKEDACertificateRefused(t *testing.T) {
	s := startServer(t, newFakeSource(), nil)
	other := newTestCA(t, "another CA").client(t, "keda-operator")
	for _, tt := range []struct {
		name  string
		cert  *tls.Certificate
		alert string // the server's TLS alert; "" for none
	}{
		{"KEDA's certificate", &s.kedaCert.pair, ""},
		{"no certificate", nil, "remote error: tls: certificate required"},
		{"a certificate from another CA", &other.pair, "remote error: tls: unknown certificate authority"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := s.tryIsActive(t, tt.cert, s.serverCA.pool())
			alert := s.tlsAlert(t, tt.cert, s.serverCA.pool())
			if tt.alert == "" {
				if err != nil || alert != nil {
					t.Fatalf("IsActive: %v; over TLS alone: %v", err, alert)
				}
				return
			}
			if status.Code(err) != codes.Unavailable {
				t.Errorf("IsActive: %v, want Unavailable", err)
			}
			if alert == nil || alert.Error() != tt.alert {
				t.Errorf("over TLS alone: %v, want %q", alert, tt.alert)
			}
		})
	}
	t.Run("plaintext", func(t *testing.T) {
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := pb.NewExternalScalerClient(conn).IsActive(ctx, ref(map[string]string{"deployment": "web"})); status.Code(err) != codes.Unavailable {
			t.Errorf("IsActive in plaintext: %v, want Unavailable", err)
		}
	})
}

// A renewed serving pair and a rotated client CA are taken from the files
// without a restart, within their check interval (10 s).
func TestReloadsServingPairAndClientCA(t *testing.T) {
	t.Parallel()
	s := startServer(t, newFakeSource(), nil)
	if err := s.tryIsActive(t, &s.kedaCert.pair, s.serverCA.pool()); err != nil {
		t.Fatal(err)
	}
	renewedServerCA, rotatedClientCA := newTestCA(t, "renewed serving CA"), newTestCA(t, "rotated KEDA client CA")
	renewedKEDA := rotatedClientCA.client(t, "keda-operator")
	renewedServerCA.serving(t).write(t, s.file("tls.crt"), s.file("tls.key"))
	rotatedClientCA.writeCert(t, s.file("client-ca.crt"))

	var err error
	for deadline := time.Now().Add(25 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if err = s.tryIsActive(t, &renewedKEDA.pair, renewedServerCA.pool()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewed files not in use after 25 s: %v", err)
		}
	}
	if err := s.tryIsActive(t, &s.kedaCert.pair, renewedServerCA.pool()); status.Code(err) != codes.Unavailable {
		t.Errorf("a certificate of the client CA rotated out: %v, want refused", err)
	}
}

// Serve refuses options that would not serve mutual TLS, naming what is
// wrong, and closes its listener.
func TestServeRefusesOptions(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	ca := newTestCA(t, "CA")
	ca.serving(t).write(t, file("tls.crt"), file("tls.key"))
	ca.writeCert(t, file("ca.crt"))
	writeFile(t, file("not-pem.crt"), []byte("not a certificate"))
	for _, tt := range []struct {
		name string
		opts kedascaler.Options
		say  string
	}{
		{"no files", kedascaler.Options{},
			`want a certificate file, a key file and a client CA file, got "", "" and "" (Insecure serves plaintext, for development)`},
		{"no client CA", kedascaler.Options{CertFile: file("tls.crt"), KeyFile: file("tls.key")}, `a client CA file, got`},
		{"missing key", kedascaler.Options{CertFile: file("tls.crt"), KeyFile: file("missing.key"), ClientCAFile: file("ca.crt")}, "missing.key"},
		{"missing client CA", kedascaler.Options{CertFile: file("tls.crt"), KeyFile: file("tls.key"), ClientCAFile: file("missing-ca.crt")},
			"client CA file: stat " + file("missing-ca.crt")},
		{"client CA not PEM", kedascaler.Options{CertFile: file("tls.crt"), KeyFile: file("tls.key"), ClientCAFile: file("not-pem.crt")},
			"client CA file " + file("not-pem.crt") + ": no PEM certificate in it"},
		{"Insecure with files", kedascaler.Options{Insecure: true, CertFile: file("tls.crt"), KeyFile: file("tls.key")},
			"Insecure serves plaintext: give no certificate, key or client CA file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			err = kedascaler.Serve(t.Context(), lis, newFakeSource(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.say) {
				t.Errorf("Serve: %v, want an error saying %q", err, tt.say)
			}
			if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("listener after Serve refused the options: %v, want closed", err)
			}
		})
	}
}

// Insecure serves plaintext, and says so in the log.
func TestInsecure(t *testing.T) {
	var mu sync.Mutex
	var logged strings.Builder
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged.WriteString(args + "\n")
	}, funcr.Options{})
	src := newFakeSource()
	src.set(ns, "web", kedascaler.Load{Concurrency: 3})
	addr, _ := serve(t, logr.NewContext(context.Background(), log), src, kedascaler.Options{Insecure: true})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got, err := pb.NewExternalScalerClient(conn).GetMetrics(t.Context(),
		&pb.GetMetricsRequest{ScaledObjectRef: ref(map[string]string{"deployment": "web"}), MetricName: "sockscale-concurrency-web"})
	if err != nil {
		t.Fatal(err)
	}
	if v := got.GetMetricValues()[0].GetMetricValueFloat(); v != 3 {
		t.Errorf("GetMetrics in plaintext: %v, want 3", v)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "PLAINTEXT with no client authentication") {
		t.Errorf("log %q does not warn of plaintext", logged.String())
	}
}
