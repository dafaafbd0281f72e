package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sockscale/sockscale/test/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-cluster:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) < 2 {
		return fmt.Errorf("usage: sockscale-cluster up|down|status [flags]")
	}
	cmd := os.Args[1]
	if cmd == "pod-init" {
		if len(os.Args) != 3 {
			return fmt.Errorf("usage: sockscale-cluster pod-init SPEC")
		}
		return cluster.PodInit(os.Args[2])
	}
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	var opts cluster.Options
	fs.IntVar(&opts.Nodes, "nodes", 2, "number of simulated nodes")
	fs.IntVar(&opts.RealNodes, "real-nodes", 0, "number of real nodes (kubelet, containerd, runc, CNI; make real-node-binaries), tainted "+cluster.RealNodeTaint)
	fs.StringVar(&opts.StateDir, "state-dir", cluster.DefaultStateDir(), "certificates, kubeconfig, logs and state")
	fs.BoolVar(&opts.DualStack, "dual-stack", false, "IPv6 beside IPv4 (secondary family): pods, Services, nodes")
	fs.StringVar(&opts.KubeBinDir, "kube-bin-dir", cluster.DefaultKubeBinDir(), "etcd, kube-apiserver, ... (make cluster-binaries)")
	// A second registry beside a running cluster's (tests of the real node
	// on their own) needs another address; `up` always uses RegistryAddr.
	registryAddr := fs.String("addr", cluster.RegistryAddr, "registry: the loopback address to serve on")
	if err := fs.Parse(os.Args[2:]); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "up":
		c, err := cluster.Up(ctx, opts)
		if err != nil {
			return err
		}
		fmt.Printf("up in %s\nkubeconfig: %s\nlogs: %s\nregistry: %s (plain HTTP; push images there, e.g. make images push REGISTRY=%s/sockscale)\nexport KUBECONFIG=%s\n",
			c.UpTime.Round(100*time.Millisecond), c.Kubeconfig, c.LogDir(), cluster.RegistryAddr, cluster.RegistryAddr, c.Kubeconfig)
		return nil
	case "down":
		return cluster.Down(opts)
	case "status":
		c, err := cluster.Connect(opts)
		if err != nil {
			return err
		}
		return c.Status(ctx, os.Stdout)
	case "simulate":
		self, err := os.Executable()
		if err != nil {
			return err
		}
		log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "node-simulator")
		return cluster.Simulate(ctx, cluster.SimOptions{StateDir: opts.StateDir, Nodes: opts.Nodes, DualStack: opts.DualStack, Self: self, Log: log})
	case "registry":
		return cluster.ServeRegistry(ctx, *registryAddr, filepath.Join(opts.StateDir, "registry"))
	}
	return fmt.Errorf("unknown command %q: want up, down or status", cmd)
}
