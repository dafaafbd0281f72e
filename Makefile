# sockscale: sidecarless Knative-style serving. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
# Tools and pinned Kubernetes binaries are built once into a per-user cache
# that outlives checkouts (a fresh CI clone reuses them).
CACHE_DIR ?= $(HOME)/.cache/sockscale
BIN_DIR   ?= $(CURDIR)/bin
export CACHE_DIR

# Pinned tools, built from the Go module proxy into the cache when missing.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(CACHE_DIR)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION).d/golangci-lint

# Fragments: pinned Kubernetes binaries and other tools (mk/tools.mk), ...
-include mk/*.mk

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	/^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
	/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the Debian packages the build and tests need (only those missing).
	@bash hack/ensure-deps.sh

##@ Development

.PHONY: generate
generate: deps $(CONTROLLER_GEN) ## Regenerate the BPF objects and Go bindings (bpf2go), deepcopy, CRDs and each component's RBAC (controller-gen), and the package map docs/packages.md.
	cd bpf && $(GO) generate ./...
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths=./api/... output:crd:artifacts:config=charts/sockscale/files/crds
	# The controller's packages with markers, not ./controller/...: the metrics
	# APIs' library ships OpenAPI code that controller-gen's build tags exclude.
	$(CONTROLLER_GEN) rbac:roleName=sockscale-controller 'paths=./controller/internal/reconciler/...;./controller/internal/release/...;./controller/internal/securemetrics/...;./controller/internal/statsauth/...' output:rbac:artifacts:config=charts/sockscale/files/rbac
	$(CONTROLLER_GEN) rbac:roleName=sockscale-agent 'paths=./agent/internal/podwatch/...;./agent/internal/lifecycle/...;./agent/internal/endpointwatch/...;./agent/cmd/...' output:rbac:artifacts:config=charts/sockscale/files/rbac/agent
	$(CONTROLLER_GEN) rbac:roleName=sockscale-agent-redirect paths=./agent/internal/redirect/... output:rbac:artifacts:config=charts/sockscale/files/rbac/agent-redirect
	$(CONTROLLER_GEN) rbac:roleName=sockscale-activator paths=./activator/... output:rbac:artifacts:config=charts/sockscale/files/rbac/activator
	$(GO) run ./hack/pkgmap

.PHONY: verify
verify: generate ## Regenerate everything and fail if the tree differs from what is committed; go.mod tidy; the markdown's links and the README's length.
	@if [ -n "$$(git status --porcelain -- bpf api charts/sockscale/files/crds charts/sockscale/files/rbac docs/packages.md)" ]; then \
	  git status --porcelain -- bpf api charts/sockscale/files/crds charts/sockscale/files/rbac docs/packages.md; git diff --stat -- bpf api charts/sockscale/files/crds charts/sockscale/files/rbac docs/packages.md; \
	  echo "verify: generated files are out of date; run 'make generate' and commit" >&2; exit 1; fi
	@$(GO) mod tidy -diff || { echo "verify: go.mod/go.sum are not tidy; run 'go mod tidy' and commit" >&2; exit 1; }
	@$(GO) run ./hack/mdcheck || { echo "verify: fix the markdown above (README.md at most 320 lines; every relative link must resolve)" >&2; exit 1; }

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: lint
lint: $(GOLANGCI_LINT) chart-lint ## golangci-lint (.golangci.yml): vet, staticcheck, errcheck, gofmt, goimports, ...; helm lint.
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	GOBIN=$(dir $@) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

##@ Build

.PHONY: build
build: ## Build the binaries into ./bin (the images' binaries: agent, controller, activator, the autoscale test app, pause).
	$(GO) build -o $(BIN_DIR)/ ./agent/cmd/... ./controller/cmd/... ./activator/cmd/... ./test/autoscale ./test/pause

# The images (agent, controller, activator, the autoscale test app, the real
# node's pause) as an OCI layout; tagged with the chart's appVersion, every
# time in them the commit's (SOURCE_DATE_EPOCH), so one commit gives one
# digest per image.
IMAGES_LAYOUT ?= $(CURDIR)/out/images
REGISTRY ?=

.PHONY: images
images: ## Build the OCI images into out/images (no Docker; static binaries on a minimal base) and print their digests.
	$(GO) run ./hack/images build --layout $(IMAGES_LAYOUT)

.PHONY: push
push: ## Push out/images to $(REGISTRY) (host[:port][/path]; plain HTTP for localhost/127.0.0.1, else HTTPS with your docker credentials): make images push REGISTRY=...
	@[ -n "$(REGISTRY)" ] || { echo "push: set REGISTRY=host[:port][/path], e.g. make images push REGISTRY=127.0.0.1:5000/sockscale" >&2; exit 1; }
	$(GO) run ./hack/images push --layout $(IMAGES_LAYOUT) --registry $(REGISTRY)

##@ Test

# Privileged tests are routed by name, never by a package list: each prefix
# belongs to exactly one target, which runs every package that has such a
# test (hack/test-packages.sh finds them), so a new one cannot be missed.
#   TestKernel* (real sockets), TestProg*, FuzzProg* (BPF_PROG_TEST_RUN):
#     root and the kernel only                          -> test-bpf
#   TestIntegration*: the pinned etcd and kube-apiserver -> test-integration
#   TestE2E*: the local cluster                          -> test-e2e
# test-unit runs every other test (the chart tests need the pinned helm).
BPF_TEST_PREFIXES         := TestKernel TestProg FuzzProg
INTEGRATION_TEST_PREFIXES := TestIntegration
E2E_TEST_PREFIXES         := TestE2E
# -run/-skip pattern of a list of prefixes: ^(A|B|C).
test-pattern = ^($(subst $(eval) ,|,$(strip $(1))))
PRIVILEGED_TESTS := $(call test-pattern,$(BPF_TEST_PREFIXES) $(INTEGRATION_TEST_PREFIXES) $(E2E_TEST_PREFIXES))
# The packages that have tests with the given prefixes (evaluated when used).
test-packages = $$(hack/test-packages.sh $(1))

.PHONY: test
test: deps lint verify test-unit test-fuzz-short test-bpf test-integration test-e2e ## Everything CI runs (the README's test command).

.PHONY: test-unit
test-unit: $(HELM) ## Unit tests of every package, the chart's included (no privileges needed).
	$(GO) test -count=1 -skip '$(PRIVILEGED_TESTS)' ./...

.PHONY: test-bpf
test-bpf: ## BPF and agent tests in the real kernel (root; under CI=true a skip is a failure).
	$(GO) test -count=1 -run '$(call test-pattern,$(BPF_TEST_PREFIXES))' $(call test-packages,$(BPF_TEST_PREFIXES))

.PHONY: test-integration
test-integration: control-plane ## The agent, the API and the reconcilers against a real kube-apiserver and etcd (root).
	$(GO) test -count=1 -run '$(call test-pattern,$(INTEGRATION_TEST_PREFIXES))' $(call test-packages,$(INTEGRATION_TEST_PREFIXES))

##@ Demo

DEMO_FLAGS ?=

.PHONY: demo
demo: deps cluster-binaries images $(HELM) ## The README's first command (root): a local cluster, the images and chart pushed to its registry and installed from there, a load ramp with a live table, out/demo.png.
	$(GO) run ./test/demo --state-dir $(CLUSTER_STATE_DIR) --kube-bin-dir $(CLUSTER_BIN_DIR) --out out/demo.png $(DEMO_FLAGS)

##@ Benchmarks

BENCH_FLAGS ?=
SCALE_BENCH_FLAGS ?=
BURST_BENCH_FLAGS ?=
COLDSTART_BENCH_FLAGS ?=

.PHONY: bench
bench: deps queue-proxy control-plane cluster-binaries real-node-binaries $(HELM) ## Benchmarks (root): data path off/on/queue-proxy, accuracy, the same two over h2c and gRPC, agent footprint, the activator (warm path vs queue-proxy, containerConcurrency 1 held by it vs by queue-proxy, cold start, 10,000 held), the connect-time redirect per new connection (none, miss, Serve target among 1,000 entries, Proxy rewrite), a Route's split of new connections vs its percents (test/bench, flags in BENCH_FLAGS); the controller at 1,000/3,000/10,000 PodAutoscalers with a simulated fleet of agents: decision intervals, pokes, CPU, RSS, API writes, stats ingest (test/bench/scale, flags in SCALE_BENCH_FLAGS); targets that differ only in target-burst-capacity (211, 0, 1) on the local cluster under a steady load, a burst from 1 to 100 in flight and clients arriving at zero, keep-alive and new connections: req/s, p50/p99, failed, pods, share through the activators, time in Proxy (test/bench/burst, flags in BURST_BENCH_FLAGS); cold start end to end on the local cluster's simulated node and on its real node (kubelet, containerd, runc), 30 each: p50/p95/max, the activator's share, each step's offset, what dominates (test/bench/coldstart-node, flags in COLDSTART_BENCH_FLAGS); BPF programs per request, stats codec, windows, 10,000 decisions, 5,000 agents' ingest, bytes cached per other Deployment and EndpointSlice; the agent's connection check of 250 pods holding 10,000 connections and its socket-table reads; 100 Proxy/Serve switches through the API server into the redirect map.
	$(GO) run ./test/bench -queue-proxy $(QUEUE_PROXY) $(BENCH_FLAGS)
	$(GO) run ./test/bench/scale $(SCALE_BENCH_FLAGS)
	$(GO) run ./test/bench/burst --state-dir $(CLUSTER_STATE_DIR) --kube-bin-dir $(CLUSTER_BIN_DIR) $(BURST_BENCH_FLAGS)
	$(GO) run ./test/bench/coldstart-node --state-dir $(CACHE_DIR)/bench-coldstart --kube-bin-dir $(CLUSTER_BIN_DIR) $(COLDSTART_BENCH_FLAGS)
	$(GO) test -run '^$$' -bench . -benchtime 3x ./agent/internal/connaudit/ ./agent/internal/socktable/
	$(GO) test -run '^$$' -bench . -benchtime 1s ./bpf/... ./internal/stats/ ./controller/internal/window/ ./controller/internal/decider/ ./controller/internal/collector/ ./controller/internal/cachetrim/
	$(GO) test -run '^$$' -bench . -benchtime 100x ./agent/internal/redirect/
