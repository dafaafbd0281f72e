##@ Tools (pinned, built from the Go module proxy into $(CACHE_DIR)/bin)

# Each binary's path names its version, so a bump builds a new one and a
# cached build is never stale; the rules deliberately do not depend on the
# tools' go.mod files, whose times are those of the checkout.

# Knative's queue-proxy, for the data-path benchmark's comparison column.
QUEUE_PROXY_VERSION := v0.50.0
QUEUE_PROXY := $(CACHE_DIR)/bin/queue-proxy-$(QUEUE_PROXY_VERSION)

.PHONY: queue-proxy
queue-proxy: $(QUEUE_PROXY) ## Build Knative's queue-proxy (pinned in hack/tools/queue-proxy).

$(QUEUE_PROXY):
	cd hack/tools/queue-proxy && $(GO) build -trimpath -ldflags '-s -w' -o $@ knative.dev/serving/cmd/queue

# The control plane for integration and end-to-end tests, pinned in
# hack/tools/kube (k8s.io/kubernetes, staging modules at their releases) and
# hack/tools/etcd. kube-apiserver takes ~6 minutes to build cold on 2 cores.
KUBE_VERSION := v1.36.3
ETCD_VERSION := v3.6.16
# The binaries are stamped with their version as Kubernetes' own release
# build does (hack/lib/version.sh): unstamped, kube-apiserver reports
# v0.0.0-master, which helm refuses for a chart's kubeVersion and kubectl
# shows to users. KUBE_BUILD names the build recipe in the cached path: bump
# it when the flags change so that older cached builds are not reused.
KUBE_BUILD := $(KUBE_VERSION)-stamped
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_LDFLAGS := -s -w $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(pkg).gitVersion=$(KUBE_VERSION) -X $(pkg).gitMajor=1 -X $(pkg).gitMinor=$(KUBE_MINOR) -X $(pkg).gitTreeState=clean)
KUBE_APISERVER := $(CACHE_DIR)/bin/kube-apiserver-$(KUBE_BUILD)
KUBECTL := $(CACHE_DIR)/bin/kubectl-$(KUBE_BUILD)
ETCD := $(CACHE_DIR)/bin/etcd-$(ETCD_VERSION)
# What controller-runtime's envtest expects: a directory with etcd,
# kube-apiserver and kubectl.
KUBEBUILDER_ASSETS := $(CACHE_DIR)/envtest-$(KUBE_BUILD)-etcd-$(ETCD_VERSION)
export KUBEBUILDER_ASSETS

.PHONY: control-plane
control-plane: $(KUBEBUILDER_ASSETS)/kube-apiserver ## Build etcd, kube-apiserver and kubectl (pinned) for envtest.

$(KUBEBUILDER_ASSETS)/kube-apiserver: $(KUBE_APISERVER) $(KUBECTL) $(ETCD)
	mkdir -p $(KUBEBUILDER_ASSETS)
	ln -sf $(ETCD) $(KUBEBUILDER_ASSETS)/etcd
	ln -sf $(KUBECTL) $(KUBEBUILDER_ASSETS)/kubectl
	ln -sf $(KUBE_APISERVER) $(KUBEBUILDER_ASSETS)/kube-apiserver

$(CACHE_DIR)/bin/kube-%-$(KUBE_BUILD):
	cd hack/tools/kube && $(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kube-$*

$(KUBECTL):
	cd hack/tools/kube && $(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kubectl

# The real node of the local cluster (test/cluster/realnode.go): a kubelet of
# the control plane's release, containerd with its runc shim, and the CNI
# plugins its pod network needs (runc itself is Debian's, hack/ensure-deps.sh).
# Cold builds on 2 cores (empty build cache, modules downloaded, the machine
# busy with other builds meanwhile): kubelet ~14 min, containerd ~6 min;
# with the build cache of the control plane's builds, 40 s and 2 min.
KUBELET := $(CACHE_DIR)/bin/kubelet-$(KUBE_BUILD)

$(KUBELET):
	cd hack/tools/kube && $(GO) build -trimpath -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/kubelet

# containerd without the snapshotters that need C libraries or kernel
# features no test uses (btrfs needs cgo anyway; devmapper, zfs), so it
# builds static with CGO_ENABLED=0; overlayfs and native stay. The shim is
# built as containerd's Makefile builds it: no_grpc, it only speaks ttrpc.
CONTAINERD_VERSION := v2.4.2
CONTAINERD_DIR := $(CACHE_DIR)/bin/containerd-$(CONTAINERD_VERSION).d
CONTAINERD := $(CONTAINERD_DIR)/containerd
CONTAINERD_TAGS := urfave_cli_no_docs no_btrfs no_devmapper no_zfs
CONTAINERD_LDFLAGS := -s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)

$(CONTAINERD):
	cd hack/tools/containerd && CGO_ENABLED=0 $(GO) build -trimpath -tags '$(CONTAINERD_TAGS)' -ldflags '$(CONTAINERD_LDFLAGS)' -o $(CONTAINERD_DIR)/ctr github.com/containerd/containerd/v2/cmd/ctr
	cd hack/tools/containerd && CGO_ENABLED=0 $(GO) build -trimpath -tags '$(CONTAINERD_TAGS) no_grpc' -ldflags '$(CONTAINERD_LDFLAGS)' -o $(CONTAINERD_DIR)/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	cd hack/tools/containerd && CGO_ENABLED=0 $(GO) build -trimpath -tags '$(CONTAINERD_TAGS)' -ldflags '$(CONTAINERD_LDFLAGS)' -o $@.tmp github.com/containerd/containerd/v2/cmd/containerd
	mv $@.tmp $@

# The CNI plugins, one directory as the CNI bin dir wants it.
CNI_PLUGINS_VERSION := v1.10.0
CNI_BIN_DIR := $(CACHE_DIR)/bin/cni-plugins-$(CNI_PLUGINS_VERSION).d
CNI_PLUGINS := bridge host-local loopback portmap
CNI_LDFLAGS := -s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(CNI_PLUGINS_VERSION)

$(CNI_BIN_DIR)/portmap:
	cd hack/tools/cni && for p in main/bridge ipam/host-local main/loopback; do \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(CNI_LDFLAGS)' -o $(CNI_BIN_DIR)/ github.com/containernetworking/plugins/plugins/$$p; done
	cd hack/tools/cni && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(CNI_LDFLAGS)' -o $@.tmp github.com/containernetworking/plugins/plugins/meta/portmap
	mv $@.tmp $@

$(ETCD):
	cd hack/tools/etcd && $(GO) build -trimpath -ldflags '-s -w' -o $@ .

# controller-gen: CRDs and deepcopy for api/.
CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN := $(CACHE_DIR)/bin/controller-gen-$(CONTROLLER_GEN_VERSION).d/controller-gen

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Build controller-gen (pinned).

$(CONTROLLER_GEN):
	GOBIN=$(dir $@) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
