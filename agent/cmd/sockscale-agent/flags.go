package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	agentredirect "github.com/sockscale/sockscale/agent/internal/redirect"
	"github.com/sockscale/sockscale/internal/logflags"
	"github.com/sockscale/sockscale/internal/securemetrics"
)

type config struct {
	nodeName           string
	podName            string
	podNamespace       string
	cgroupRoot         string
	bpffsDir           string
	kubeconfig         string
	metricsAddr        string
	metrics            securemetrics.Config
	healthAddr         string
	reportPeriod       time.Duration
	controllerStats    string
	tokenFile          string
	caFile             string
	activatorSelector  string
	activatorNamespace string
	activatorPort      int
	socketRedirect     agentredirect.Mode
	logLevel           string
	uninstall          bool
	nodeNetns          string
	probeSources       string
	auditPeriod        time.Duration
	drainAddr          string
	drainMinWait       time.Duration
	// redirectRetryBackoff and redirectSyncTimeout have no flags: tests
	// shorten them (0 means the redirect package's defaults).
	redirectRetryBackoff time.Duration
	redirectSyncTimeout  time.Duration
}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("sockscale-agent", flag.ContinueOnError)
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	fs.StringVar(&c.podName, "pod-name", os.Getenv("POD_NAME"), "this agent's pod (default: $POD_NAME); with --pod-namespace it finds the owning DaemonSet, whose deletion makes a stop an uninstall")
	fs.StringVar(&c.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "this agent's namespace (default: $POD_NAMESPACE)")
	fs.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup v2 directory to attach at; every pod's cgroup must be below it")
	fs.StringVar(&c.bpffsDir, "bpffs-dir", "/sys/fs/bpf/sockscale", "directory on a bpffs where maps and links are pinned (survive restarts)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":9090", "address of the /metrics endpoint")
	securemetrics.BindFlags(fs, &c.metrics)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (plain HTTP, no token: the kubelet probes it)")
	fs.DurationVar(&c.reportPeriod, "report-period", time.Second, "how often counters are read and reported (100ms..1m)")
	fs.StringVar(&c.controllerStats, "controller-stats-address", "", "host:port of the controller's stats Service (headless: every replica gets the stats); empty: do not report")
	fs.StringVar(&c.caFile, "controller-ca-file", "", "PEM CA that signs the controller's stats serving certificate: report over HTTPS, verifying the Service's name (reloaded when the file changes); empty: plain HTTP")
	fs.StringVar(&c.tokenFile, "controller-token-file", "", "file with this pod's projected ServiceAccount token for the controller (audience sockscale-controller), read again for every batch as the kubelet rotates it; empty: send no token (only a controller with --stats-insecure-skip-auth takes that)")
	fs.StringVar(&c.activatorSelector, "activator-selector", "app.kubernetes.io/component=activator", "label selector of activator pods: their requests count as proxied; empty: none")
	fs.StringVar(&c.activatorNamespace, "activator-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the activator pods (default: $POD_NAMESPACE, the agent's own, where the chart runs both); only pods there are activators: a tenant can copy their names and labels, not their namespace")
	fs.IntVar(&c.activatorPort, "activator-port", 8012, "port on which activators take proxied requests (the controller's --activator-port)")
	fs.StringVar((*string)(&c.socketRedirect), "socket-redirect", string(agentredirect.ModeAuto), "send new connects to a public Service in Proxy mode straight to its activators, in the kernel: auto (where the kernel can), on (fail if it cannot), off (kube-proxy's path only)")
	fs.StringVar(&c.nodeNetns, "node-netns", "", "the node's network namespace (e.g. /proc/1/ns/net with hostPID), whose addresses the kubelet's probes come from, followed over netlink; empty: the agent's own (right with hostNetwork)")
	fs.StringVar(&c.probeSources, "probe-sources", probeSourcesNode, "whose requests with a probe's User-Agent (kube-probe/, sockscale-probe/) are health probes, not load: node (the node's own addresses and the activators) or any (every client: for an agent that can see neither the node's network namespace nor run in it; a pod can then hide its load)")
	fs.DurationVar(&c.auditPeriod, "connection-audit-period", 5*time.Minute, "how often each pod's connection count is checked against the kernel's socket table, in the pod's network namespace (needs the node's processes and CAP_SYS_ADMIN, CAP_SYS_PTRACE); pods are also checked when added; 0: never")
	fs.StringVar(&c.drainAddr, "drain-bind-address", "", "address of the preStop hooks' wait, GET /drain?namespace=&workload= (answered once the workload's leaving pods on this node are drained), in --node-netns: the node's loopback, where the kubelet calls hooks, e.g. 127.0.0.1:9094; needs the node's processes and CAP_SYS_PTRACE to reach a leaving pod's connections; empty: no drain")
	fs.DurationVar(&c.drainMinWait, "drain-min-wait", 2*time.Second, "how long a leaving pod is held at least after its deletion and after the last EndpointSlice listing it as ready dropped it, for kube-proxy and the activators to stop sending it new connections (100ms..1m)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.uninstall, "uninstall", false, "detach the programs, remove everything pinned under --bpffs-dir, and exit (a running agent does this itself when it stops because its DaemonSet was deleted)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: sockscale-agent takes flags only", fs.Args())
	}
	return c, c.validate()
}

// Values of --probe-sources.
const (
	probeSourcesNode = "node"
	probeSourcesAny  = "any"
)

func (c *config) validate() error {
	var errs []error
	if !c.uninstall && c.nodeName == "" {
		errs = append(errs, errors.New("--node-name is empty: set it or $NODE_NAME (the chart sets it from spec.nodeName)"))
	}
	if c.reportPeriod < 100*time.Millisecond || c.reportPeriod > time.Minute {
		errs = append(errs, fmt.Errorf("--report-period=%v: must be between 100ms and 1m", c.reportPeriod))
	}
	if c.bpffsDir == "" || c.bpffsDir == "/" {
		errs = append(errs, fmt.Errorf("--bpffs-dir=%q: must be a directory of its own on a bpffs, e.g. /sys/fs/bpf/sockscale", c.bpffsDir))
	}
	for flagName, addr := range map[string]string{"--metrics-bind-address": c.metricsAddr, "--health-probe-bind-address": c.healthAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want [host]:port, e.g. :9090", flagName, addr))
		}
	}
	c.metrics.BindAddress = c.metricsAddr
	if err := c.metrics.Check(); err != nil {
		errs = append(errs, err)
	}
	if c.controllerStats != "" {
		if _, _, err := net.SplitHostPort(c.controllerStats); err != nil {
			errs = append(errs, fmt.Errorf("--controller-stats-address=%q: want host:port", c.controllerStats))
		}
	}
	switch c.socketRedirect {
	case agentredirect.ModeAuto, agentredirect.ModeOn, agentredirect.ModeOff:
	default:
		errs = append(errs, fmt.Errorf("--socket-redirect=%q: want auto, on or off", c.socketRedirect))
	}
	if c.activatorPort < 1 || c.activatorPort > 65535 {
		errs = append(errs, fmt.Errorf("--activator-port=%d: want 1..65535", c.activatorPort))
	}
	if c.socketRedirect == agentredirect.ModeOn && c.activatorSelector == "" {
		errs = append(errs, errors.New("--socket-redirect=on needs --activator-selector: the activator pods are the redirect's destinations"))
	}
	if msgs := validation.IsDNS1123Label(c.activatorNamespace); !c.uninstall && c.activatorSelector != "" && len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--activator-namespace=%q: want the namespace the activators run in, set it or $POD_NAMESPACE (a namespace name: %s)", c.activatorNamespace, strings.Join(msgs, "; ")))
	}
	if _, err := labels.Parse(c.activatorSelector); err != nil {
		errs = append(errs, fmt.Errorf("--activator-selector=%q: %w", c.activatorSelector, err))
	}
	if c.probeSources != probeSourcesNode && c.probeSources != probeSourcesAny {
		errs = append(errs, fmt.Errorf("--probe-sources=%q: want node or any", c.probeSources))
	}
	if c.probeSources == probeSourcesAny && c.nodeNetns != "" {
		errs = append(errs, fmt.Errorf("--probe-sources=any with --node-netns=%q: the node's addresses are not used then; drop one", c.nodeNetns))
	}
	if c.drainAddr != "" {
		if _, _, err := net.SplitHostPort(c.drainAddr); err != nil {
			errs = append(errs, fmt.Errorf("--drain-bind-address=%q: want host:port on the node's loopback, e.g. 127.0.0.1:9094", c.drainAddr))
		}
	}
	if c.drainMinWait < 100*time.Millisecond || c.drainMinWait > time.Minute {
		errs = append(errs, fmt.Errorf("--drain-min-wait=%v: want 100ms..1m", c.drainMinWait))
	}
	if c.auditPeriod != 0 && (c.auditPeriod < time.Second || c.auditPeriod > time.Hour) {
		errs = append(errs, fmt.Errorf("--connection-audit-period=%v: want 0 (off) or 1s..1h", c.auditPeriod))
	}
	if _, err := logflags.ParseLevel(c.logLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// redirectLoadOptions are --socket-redirect and what it needs.
func (c *config) redirectLoadOptions(log *slog.Logger) agentredirect.LoadOptions {
	return agentredirect.LoadOptions{
		Mode: c.socketRedirect, HaveActivators: c.activatorSelector != "",
		CgroupRoot: c.cgroupRoot, PinDir: c.bpffsDir, Log: log,
	}
}
