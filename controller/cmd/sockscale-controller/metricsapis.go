package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sockscale/sockscale/controller/internal/kedascaler"
	"github.com/sockscale/sockscale/controller/internal/metricsapi"
	"github.com/sockscale/sockscale/controller/internal/podindex"
	"github.com/sockscale/sockscale/controller/internal/recentload"
	"github.com/sockscale/sockscale/internal/stats"
)

// setupMetricsAPIs adds the metrics APIs and KEDA's scaler that f asks for
// to mgr, on every replica (each receives every agent's stats, so any
// replica answers for any Deployment). It returns what the stats handler
// must give each accepted batch; nil when neither is on.
func setupMetricsAPIs(mgr manager.Manager, f *flags) (record func(*stats.Batch), err error) {
	if f.metricsAPIAddr == "0" && f.kedaAddr == "0" {
		return nil, nil
	}
	store, err := recentload.New(clock.RealClock{}, f.metricsWindow)
	if err != nil {
		return nil, err
	}
	pods, err := podindex.New(mgr.GetConfig(), mgr.GetScheme())
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(pods); err != nil {
		return nil, err
	}
	// A record that would move a pod's history to another node or address
	// must be the pod's own (an unreadable index keeps the history).
	store.SetVerifier(func(namespace, name, node string, ip netip.Addr) bool {
		p, ok, err := pods.Get(context.Background(), namespace, name)
		return err == nil && ok && p.Node == node && p.IP == ip
	})
	deployments := deploymentLookup{mgr.GetClient()}
	values := metricsapi.NewProvider(store, pods, deployments, clock.RealClock{})
	if f.metricsAPIAddr != "0" {
		var apis metricsapi.APIs
		for _, api := range f.metricsAPIs {
			switch api {
			case "custom":
				apis |= metricsapi.CustomMetrics
			case "external":
				apis |= metricsapi.ExternalMetrics
			}
		}
		server, err := metricsapi.NewServer(metricsapi.ServerOptions{BindAddress: f.metricsAPIAddr, CertFile: f.metricsAPICert, KeyFile: f.metricsAPIKey,
			Kube: mgr.GetConfig(), APIs: apis, Provider: values})
		if err != nil {
			return nil, err
		}
		if err := mgr.Add(everyReplica(func(ctx context.Context) error {
			// Answers before the pods are known would leave every pod out.
			if !pods.WaitForCacheSync(ctx) {
				return ctx.Err()
			}
			return server.Run(ctx)
		})); err != nil {
			return nil, err
		}
		ctrl.Log.Info("serving the metrics APIs", "address", f.metricsAPIAddr, "apis", f.metricsAPIs, "window", f.metricsWindow)
	}
	if f.kedaAddr != "0" {
		lis, err := net.Listen("tcp", f.kedaAddr)
		if err != nil {
			return nil, fmt.Errorf("KEDA's scaler: listen on %s: %w", f.kedaAddr, err)
		}
		opts := kedascaler.Options{CertFile: f.kedaCert, KeyFile: f.kedaKey, ClientCAFile: f.kedaClientCA}
		if err := mgr.Add(everyReplica(func(ctx context.Context) error {
			if !pods.WaitForCacheSync(ctx) {
				_ = lis.Close()
				return ctx.Err()
			}
			return kedascaler.Serve(ctx, lis, kedaSource{values: values, store: store, deployments: deployments}, opts)
		})); err != nil {
			_ = lis.Close()
			return nil, err
		}
		ctrl.Log.Info("serving KEDA's external scaler", "address", f.kedaAddr, "window", f.metricsWindow)
	}
	return func(b *stats.Batch) {
		if len(b.Pods) > 0 {
			store.RecordPods(b.Node, b)
		}
		if len(b.Targets) > 0 {
			store.RecordTargets(b)
		}
	}, nil
}

// kedaSource is what KEDA's scaler reads: a Deployment's load from its
// pods' trusted records and its activators', as the external metrics
// API serves it.
type kedaSource struct {
	values      *metricsapi.Provider
	store       *recentload.Store
	deployments deploymentLookup
}

func (k kedaSource) Exists(namespace, workload string) (bool, error) {
	return k.deployments.Exists(context.Background(), namespace, workload)
}

// deploymentLookup tells whether a Deployment exists from the manager's
// cache, which holds every Deployment (trimmed, see cachetrim) on every
// replica.
type deploymentLookup struct{ c client.Reader }

func (d deploymentLookup) Exists(ctx context.Context, namespace, name string) (bool, error) {
	err := d.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &appsv1.Deployment{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

func (k kedaSource) Target(namespace, workload string) (kedascaler.Load, bool) {
	l, heard, err := k.values.Target(context.Background(), namespace, workload)
	if err != nil || !heard {
		// An unreadable pod index reads as not heard: the scaler answers
		// 0 and KEDA keeps the scale it has rather than act on a part.
		return kedascaler.Load{}, false
	}
	return kedascaler.Load{Concurrency: l.Concurrency, RPS: l.RPS, ActivatorConcurrency: l.ActivatorConcurrency,
		LatestConcurrency: l.LatestConcurrency, Pods: l.Pods, Heard: l.Heard}, true
}

func (k kedaSource) WhenActive(namespace, workload string) <-chan struct{} {
	return k.store.WhenActive(namespace, workload)
}

// everyReplica is a runnable that runs on every replica, leader or not.
type everyReplica func(context.Context) error

func (r everyReplica) Start(ctx context.Context) error { return r(ctx) }

func (everyReplica) NeedLeaderElection() bool { return false }
