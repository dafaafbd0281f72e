package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs the container's startup probe until it succeeds, then its
// readiness and liveness probes, from the host netns as a kubelet does from
// the node's. A failed startup or liveness probe restarts the container.
func (c *container) probe(ctx context.Context) {
	if p := c.spec.StartupProbe; p != nil {
		if !c.runProbe(ctx, p, "startup", func(ok bool) bool { return ok }) {
			return
		}
		c.set(func() {
			c.started = true
			c.ready = c.spec.ReadinessProbe == nil
		})
	}
	if p := c.spec.ReadinessProbe; p != nil {
		go c.runProbe(ctx, p, "readiness", func(ok bool) bool {
			c.mu.Lock()
			changed := c.ready != ok
			c.ready = ok
			c.mu.Unlock()
			if changed {
				c.w.kick()
			}
			return false
		})
	}
	if p := c.spec.LivenessProbe; p != nil {
		c.runProbe(ctx, p, "liveness", func(ok bool) bool { return false })
	}
}

// runProbe probes with p's timing; result gets each thresholded outcome and
// returns whether to stop. After failureThreshold failures of a startup or
// liveness probe, the container is killed (and runProbe returns false).
func (c *container) runProbe(ctx context.Context, p *corev1.Probe, kind string, result func(ok bool) bool) bool {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	if p.PeriodSeconds == 0 {
		period = 10 * time.Second
	}
	succThr, failThr := max(p.SuccessThreshold, 1), p.FailureThreshold
	if failThr == 0 {
		failThr = 3
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
	}
	succ, fail := int32(0), int32(0)
	for {
		err := c.probeOnce(ctx, p)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			succ, fail = succ+1, 0
			if succ >= succThr && result(true) {
				return true
			}
		} else {
			succ, fail = 0, fail+1
			if fail >= failThr {
				if kind != "readiness" {
					c.w.log().Info("probe failed, restarting container", "probe", kind, "container", c.spec.Name, "err", err)
					go c.kill()
					return false
				}
				result(false)
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(period):
		}
	}
}

func (c *container) probeOnce(ctx context.Context, p *corev1.Probe) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c.w.mu.Lock()
	ip := c.w.ip.String()
	c.w.mu.Unlock()
	port := func(p intstr.IntOrString) (string, error) {
		if p.Type == intstr.Int {
			return strconv.Itoa(p.IntValue()), nil
		}
		for _, cp := range c.spec.Ports {
			if cp.Name == p.StrVal {
				return strconv.Itoa(int(cp.ContainerPort)), nil
			}
		}
		return "", fmt.Errorf("no port named %q", p.StrVal)
	}
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		pt, err := port(g.Port)
		if err != nil {
			return err
		}
		host := ip
		if g.Host != "" {
			host = g.Host
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, pt), g.Path), nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/1.36")
		for _, h := range g.HTTPHeaders {
			req.Header.Set(h.Name, h.Value)
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true} //nolint:gosec // the kubelet does not verify probes either
		resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("http probe: %s", resp.Status)
		}
		return nil
	case p.TCPSocket != nil:
		pt, err := port(p.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ip, pt))
		if err != nil {
			return err
		}
		return conn.Close()
	case p.Exec != nil:
		c.mu.Lock()
		proc := c.proc
		c.mu.Unlock()
		if proc == nil || len(p.Exec.Command) == 0 {
			return fmt.Errorf("exec probe: no process")
		}
		// In the container's namespaces (netns, mounts), with its
		// capabilities not applied (documented).
		args := append([]string{"-t", strconv.Itoa(proc.Pid), "-n", "-m", "-u", "--"}, p.Exec.Command...)
		out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("exec probe: %w: %s", err, out)
		}
		return nil
	case p.GRPC != nil:
		return fmt.Errorf("grpc probes are not supported by the node simulator")
	}
	return fmt.Errorf("probe has no handler")
}
