##@ Local cluster (test/cluster: real control plane, simulated nodes)

# mk/*.mk are read in name order, so the versions of mk/tools.mk are not set
# yet when this file is read: these variables are recursive (=) and the
# prerequisites below are expanded a second time (.SECONDEXPANSION).
KUBE_CONTROLLER_MANAGER = $(CACHE_DIR)/bin/kube-controller-manager-$(KUBE_BUILD)
KUBE_SCHEDULER = $(CACHE_DIR)/bin/kube-scheduler-$(KUBE_BUILD)
KUBE_PROXY = $(CACHE_DIR)/bin/kube-proxy-$(KUBE_BUILD)
# CoreDNS with only the plugins the cluster uses, pinned in hack/tools/coredns;
# the harness runs it on the host.
COREDNS_VERSION := v1.15.0
COREDNS := $(CACHE_DIR)/bin/coredns-$(COREDNS_VERSION)

# The directory test/cluster finds every control-plane binary in; relinked by
# every `make cluster-binaries`, so it always points at the pinned versions.
CLUSTER_BIN_DIR := $(CACHE_DIR)/cluster-bin
export SOCKSCALE_CLUSTER_BINARIES := $(CLUSTER_BIN_DIR)
# Where the local cluster keeps its state, logs and kubeconfig.
CLUSTER_STATE_DIR ?= $(CACHE_DIR)/cluster
CLUSTER_NODES ?= 2
# true: IPv6 as the second family (test/cluster/README.md, Dual-stack).
CLUSTER_DUAL_STACK ?= false
# The cluster command.
SOCKSCALE_CLUSTER := $(BIN_DIR)/sockscale-cluster
# The cluster's OCI registry (test/cluster.RegistryAddr): cluster-up pushes
# the images there.
CLUSTER_REGISTRY := 127.0.0.1:12390

.SECONDEXPANSION:

.PHONY: cluster-binaries
cluster-binaries: $$(ETCD) $$(KUBE_APISERVER) $$(KUBECTL) $$(KUBE_CONTROLLER_MANAGER) $$(KUBE_SCHEDULER) $$(KUBE_PROXY) $$(COREDNS) ## Build the pinned control plane, kube-proxy and CoreDNS for the local cluster.
	mkdir -p $(CLUSTER_BIN_DIR)
	ln -sf $(ETCD) $(CLUSTER_BIN_DIR)/etcd
	ln -sf $(KUBECTL) $(CLUSTER_BIN_DIR)/kubectl
	ln -sf $(KUBE_APISERVER) $(CLUSTER_BIN_DIR)/kube-apiserver
	ln -sf $(KUBE_CONTROLLER_MANAGER) $(CLUSTER_BIN_DIR)/kube-controller-manager
	ln -sf $(KUBE_SCHEDULER) $(CLUSTER_BIN_DIR)/kube-scheduler
	ln -sf $(KUBE_PROXY) $(CLUSTER_BIN_DIR)/kube-proxy
	ln -sf $(COREDNS) $(CLUSTER_BIN_DIR)/coredns

$(COREDNS):
	cd hack/tools/coredns && $(GO) build -trimpath -ldflags '-s -w' -o $@ .

# The real node's binaries (test/cluster/realnode.go), linked into
# $(CLUSTER_BIN_DIR) beside the control plane's: kubelet, containerd,
# containerd-shim-runc-v2, ctr, and cni/ with the CNI plugins. containerd
# finds its shim on PATH, so the harness puts this directory first there.
.PHONY: real-node-binaries
real-node-binaries: deps $$(KUBELET) $$(CONTAINERD) $$(CNI_BIN_DIR)/portmap ## Build the real node's kubelet, containerd (+ runc shim, ctr) and CNI plugins (pinned); runc is Debian's.
	mkdir -p $(CLUSTER_BIN_DIR)
	ln -sf $(KUBELET) $(CLUSTER_BIN_DIR)/kubelet
	ln -sf $(CONTAINERD) $(CLUSTER_BIN_DIR)/containerd
	ln -sf $(CONTAINERD_DIR)/containerd-shim-runc-v2 $(CLUSTER_BIN_DIR)/containerd-shim-runc-v2
	ln -sf $(CONTAINERD_DIR)/ctr $(CLUSTER_BIN_DIR)/ctr
	ln -sfn $(CNI_BIN_DIR) $(CLUSTER_BIN_DIR)/cni

.PHONY: sockscale-cluster
sockscale-cluster: ## Build the local cluster's command into $(BIN_DIR).
	$(GO) build -o $(SOCKSCALE_CLUSTER) ./test/cluster/cmd/sockscale-cluster

CLUSTER_FLAGS = --nodes $(CLUSTER_NODES) --dual-stack=$(CLUSTER_DUAL_STACK) --state-dir $(CLUSTER_STATE_DIR) --kube-bin-dir $(CLUSTER_BIN_DIR)

.PHONY: cluster-up
cluster-up: cluster-binaries sockscale-cluster ## Start the local cluster (root) and push the images to its registry ($(CLUSTER_REGISTRY)/sockscale). Prints the kubeconfig.
	$(SOCKSCALE_CLUSTER) up $(CLUSTER_FLAGS)
	$(MAKE) images push REGISTRY=$(CLUSTER_REGISTRY)/sockscale

.PHONY: cluster-status
cluster-status: sockscale-cluster ## What the local cluster runs, and its nodes.
	$(SOCKSCALE_CLUSTER) status $(CLUSTER_FLAGS)

.PHONY: cluster-down
cluster-down: sockscale-cluster ## Stop the local cluster and remove everything it made on the host.
	$(SOCKSCALE_CLUSTER) down $(CLUSTER_FLAGS)

.PHONY: keda-image
# KEDA's operator for TestE2EKEDAScaleToZero: the version go.mod pins, built
# from its source into an OCI layout under $(CACHE_DIR) once (about 7
# minutes cold on 2 cores), then reused.
keda-image: deps ## Build KEDA's operator image (the go.mod version) for the end-to-end tests into $(CACHE_DIR).
	$(GO) run ./test/keda/cmd/keda-image

.PHONY: test-e2e
# One cluster per machine: the packages run one after the other (-p 1).
# `images` first: the harness builds the images again with the same flags,
# then from the go build cache (a cold build takes minutes on 2 cores and
# would eat the harness's time to bring the cluster up).
test-e2e: deps cluster-binaries real-node-binaries images keda-image $$(HELM) ## End-to-end tests (TestE2E*): the harness itself (its real node too), then the autoscaling scenarios (docs/autoscaling.md) with the chart installed by helm (root).
	$(GO) test -count=1 -p 1 -timeout 40m -run '$(call test-pattern,$(E2E_TEST_PREFIXES))' $(call test-packages,$(E2E_TEST_PREFIXES))
