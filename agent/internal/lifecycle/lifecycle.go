package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Why the owning DaemonSet, and why watched rather than only read at
// SIGTERM: a rolling update, a node drain or a crash stop an agent while
// its DaemonSet stays; only an uninstall (helm uninstall, kubectl delete)
// deletes the DaemonSet first, and its garbage collector then deletes the
// pods. But `helm uninstall` deletes the agent's ClusterRoleBinding and
// ServiceAccount right after the DaemonSet, without waiting for the pods,
// so a read at SIGTERM is often refused (401/403). A watch opened while the
// agent ran keeps delivering events after its credentials go, so the
// deletion is seen before the SIGTERM; the read at SIGTERM is only the
// fallback for a watch that missed it.
//
// Any doubt keeps the state: a leftover is adopted by the next agent on the
// node (and removed by `sockscale-agent --uninstall`), while removing the
// pins of an agent that is only restarting loses every pod's counts.

// Owner is the DaemonSet that runs this agent.
type Owner struct {
	Namespace, Name string
	UID             types.UID
}

// Decision is what to do with the kernel state when the agent stops.
type Decision struct {
	// Uninstall: detach every program and remove every pin.
	Uninstall bool
	// Reason says why, for the log.
	Reason string
}

// Decide is the rule. ds and err are the result of reading the owner's
// DaemonSet by name (ds nil with err set); seenGone says a watch saw it
// deleted, being deleted, or replaced by another of the same name.
func Decide(owner *Owner, seenGone string, ds *appsv1.DaemonSet, err error) Decision {
	switch {
	case owner == nil:
		return Decision{Reason: "keep: no owning DaemonSet known (not run by one, or POD_NAME/POD_NAMESPACE unset, or its pod could not be read)"}
	case seenGone != "":
		return Decision{Uninstall: true, Reason: "uninstall: " + seenGone}
	case apierrors.IsNotFound(err):
		return Decision{Uninstall: true, Reason: fmt.Sprintf("uninstall: DaemonSet %s/%s is gone", owner.Namespace, owner.Name)}
	case err != nil:
		return Decision{Reason: fmt.Sprintf("keep: cannot read DaemonSet %s/%s (%v); a leftover is adopted by the next agent, lost counts are not recovered", owner.Namespace, owner.Name, err)}
	}
	if why := gone(owner, ds); why != "" {
		return Decision{Uninstall: true, Reason: "uninstall: " + why}
	}
	return Decision{Reason: fmt.Sprintf("keep: DaemonSet %s/%s is still there (a restart or rolling update)", owner.Namespace, owner.Name)}
}

// gone says why ds no longer stands for owner, or "".
func gone(owner *Owner, ds *appsv1.DaemonSet) string {
	switch {
	case ds.DeletionTimestamp != nil:
		return fmt.Sprintf("DaemonSet %s/%s is being deleted", owner.Namespace, owner.Name)
	case owner.UID != "" && ds.UID != owner.UID:
		// Deleted and created again (an uninstall and a new install):
		// this agent's release is gone; the new one's agent adopts nothing
		// from a removed pin directory and starts clean.
		return fmt.Sprintf("DaemonSet %s/%s was replaced (uid %s, this agent's was %s)", owner.Namespace, owner.Name, ds.UID, owner.UID)
	}
	return ""
}

// OwnerOf returns the DaemonSet in pod's ownerReferences, or nil.
func OwnerOf(pod metav1.Object) *Owner {
	for _, ref := range pod.GetOwnerReferences() {
		if ref.Kind == "DaemonSet" && ref.APIVersion == "apps/v1" {
			return &Owner{Namespace: pod.GetNamespace(), Name: ref.Name, UID: ref.UID}
		}
	}
	return nil
}

// Watcher finds this agent's DaemonSet from its own pod and watches it.
type Watcher struct {
	client             kubernetes.Interface
	namespace, podName string
	log                *slog.Logger
	retry              time.Duration

	mu       sync.Mutex
	owner    *Owner
	seenGone string
	// synced reports the watch's first list done (tests wait for it).
	synced func() bool
}

// NewWatcher watches the DaemonSet that owns pod namespace/podName. With
// either empty it knows no owner, and Decide always keeps.
func NewWatcher(client kubernetes.Interface, namespace, podName string, log *slog.Logger) *Watcher {
	return &Watcher{client: client, namespace: namespace, podName: podName, log: log, retry: 2 * time.Second}
}

// Its own pod is read once for its ownerReferences; the DaemonSet rule is
// the chart's Role (resourceNames: that one DaemonSet), which a marker
// cannot name.
// +kubebuilder:rbac:groups="",resources=pods,verbs=get

// Run reads the pod's owner (retrying until it can) and watches that
// DaemonSet until ctx ends. It never fails the agent: without an owner the
// agent keeps its state at exit, as it always did.
func (w *Watcher) Run(ctx context.Context) {
	if w.namespace == "" || w.podName == "" {
		w.log.Info("uninstall detection off: POD_NAME or POD_NAMESPACE unset; stopping always keeps the pinned programs")
		return
	}
	var owner *Owner
	for owner == nil {
		pod, err := w.client.CoreV1().Pods(w.namespace).Get(ctx, w.podName, metav1.GetOptions{})
		switch {
		case err == nil:
			if owner = OwnerOf(pod); owner == nil {
				w.log.Info("uninstall detection off: this pod has no DaemonSet owner; stopping always keeps the pinned programs", "pod", w.podName)
				return
			}
		case ctx.Err() != nil:
			return
		default:
			w.log.Warn("read own pod to find its DaemonSet; retrying", "pod", w.podName, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(w.retry):
			}
		}
	}
	w.mu.Lock()
	w.owner = owner
	w.mu.Unlock()

	// One object: a field selector on its name, which RBAC's resourceNames
	// allows for list and watch.
	factory := informers.NewSharedInformerFactoryWithOptions(w.client, 0, informers.WithNamespace(owner.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", owner.Name).String()
		}))
	inf := factory.Apps().V1().DaemonSets().Informer()
	check := func(obj any) {
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			if why := gone(owner, ds); why != "" {
				w.markGone(why)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, obj any) { check(obj) },
		DeleteFunc: func(any) {
			w.markGone(fmt.Sprintf("DaemonSet %s/%s was deleted", owner.Namespace, owner.Name))
		},
	}); err != nil {
		w.log.Warn("uninstall detection: watch DaemonSet", "err", err)
		return
	}
	w.mu.Lock()
	w.synced = inf.HasSynced
	w.mu.Unlock()
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

func (w *Watcher) markGone(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seenGone == "" {
		w.log.Info("owning DaemonSet gone: the agent removes its programs and pins when it stops", "why", why)
		w.seenGone = why
	}
}

// Decide tells what to do at exit: call it once the agent was told to
// stop, with a ctx that still has time (the run's ctx has ended by then).
func (w *Watcher) Decide(ctx context.Context) Decision {
	w.mu.Lock()
	owner, seenGone := w.owner, w.seenGone
	w.mu.Unlock()
	if owner == nil || seenGone != "" {
		return Decide(owner, seenGone, nil, nil)
	}
	ds, err := w.client.AppsV1().DaemonSets(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		ds = nil
	}
	return Decide(owner, "", ds, err)
}
