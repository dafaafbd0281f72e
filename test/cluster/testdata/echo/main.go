// Command echo is the small HTTP server the tests of test/cluster run as
// the image "autoscale": it says who it is and, on request, reports what it
// sees of its pod (files, directories, a privileged syscall, an HTTP GET
// or a DNS lookup from inside the pod).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	ignoreTerm := flag.Bool("ignore-sigterm", false, "log SIGTERM but keep serving (only SIGKILL ends it)")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		fmt.Fprintf(w, "pod=%s node=%s ip=%s hostname=%s\n", os.Getenv("POD_NAME"), os.Getenv("NODE_NAME"), os.Getenv("POD_IP"), host)
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		if err := os.WriteFile(r.URL.Query().Get("path"), []byte("x"), 0o600); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, os.Getenv(r.URL.Query().Get("name")))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_, _ = w.Write(b)
	})
	mux.HandleFunc("/ls", func(w http.ResponseWriter, r *http.Request) {
		entries, err := os.ReadDir(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		for _, e := range entries {
			fmt.Fprintln(w, e.Name())
		}
	})
	// /bpf creates (and closes) a BPF array map: it needs CAP_BPF or
	// CAP_SYS_ADMIN, and changes nothing.
	mux.HandleFunc("/bpf", func(w http.ResponseWriter, r *http.Request) {
		attr := make([]byte, 128)
		putU32 := func(off int, v uint32) {
			attr[off], attr[off+1], attr[off+2], attr[off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		putU32(0, 2)  // map_type: BPF_MAP_TYPE_ARRAY
		putU32(4, 4)  // key_size
		putU32(8, 4)  // value_size
		putU32(12, 1) // max_entries
		fd, _, errno := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
		if errno != 0 {
			http.Error(w, "bpf map create: "+errno.Error(), http.StatusForbidden)
			return
		}
		unix.Close(int(fd))
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/get", func(w http.ResponseWriter, r *http.Request) {
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get(r.URL.Query().Get("url"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		_, _ = io.Copy(w, resp.Body)
	})
	mux.HandleFunc("/resolve", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, r.URL.Query().Get("name"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		fmt.Fprintln(w, strings.Join(addrs, " "))
	})
	// /whoami asks the apiserver who this pod's ServiceAccount token is,
	// the way in-cluster clients reach it (KUBERNETES_SERVICE_HOST, ca.crt).
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
		tok, err1 := os.ReadFile(sa + "token")
		ca, err2 := os.ReadFile(sa + "ca.crt")
		if err := errors.Join(err1, err2); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		url := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")) +
			"/apis/authentication.k8s.io/v1/selfsubjectreviews"
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, url,
			strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 { // a review is 201 Created
			w.WriteHeader(resp.StatusCode)
		}
		_, _ = io.Copy(w, resp.Body)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() {
		<-sig
		// The tests look for this line in the container's log.
		fmt.Println("received SIGTERM")
		if *ignoreTerm {
			select {}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	log.Printf("listening on %s", *listen)
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
