##@ Chart (charts/sockscale)

# Helm, pinned in hack/tools/helm and built from the Go module proxy into
# the cache, like the tools of mk/tools.mk (the path names the version, so
# a bump builds a new binary). test/chart reads $HELM from the environment.
HELM_VERSION := v3.22.0
HELM := $(CACHE_DIR)/bin/helm-$(HELM_VERSION)
export HELM

# helm's own release build stamps its version and the Kubernetes version
# that `helm template` and `helm lint` assume (that of its client-go, v0.X
# => 1.X) with -X; without them a source build reports v1.20.0, which the
# chart's kubeVersion (>= 1.25) refuses.
HELM_LDFLAGS = -s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$minor \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$minor

.PHONY: helm
helm: $(HELM) ## Build helm (pinned in hack/tools/helm).

$(HELM):
	cd hack/tools/helm && minor=$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2) && \
	  $(GO) build -trimpath -ldflags "$(HELM_LDFLAGS)" -o $@ helm.sh/helm/v3/cmd/helm

.PHONY: chart-lint
chart-lint: $(HELM) ## helm lint --strict the chart (values.schema.json included).
	$(HELM) lint --strict charts/sockscale

.PHONY: chart-test
chart-test: $(HELM) ## Render the chart with the pinned helm and check the objects (test/chart).
	$(GO) test -count=1 ./test/chart/

.PHONY: chart-push
chart-push: $(HELM) ## Package the chart (helm package into out/charts) and push it to oci://$(REGISTRY) (plain HTTP for localhost/127.0.0.1): make chart-push REGISTRY=host:port/charts
	@[ -n "$(REGISTRY)" ] || { echo "chart-push: set REGISTRY=host[:port][/path], e.g. make chart-push REGISTRY=127.0.0.1:12390/charts" >&2; exit 1; }
	rm -rf out/charts && $(HELM) package charts/sockscale --destination out/charts
	plain=; case "$(REGISTRY)" in localhost[:/]*|localhost|127.*) plain=--plain-http;; esac; \
	  $(HELM) push out/charts/sockscale-*.tgz oci://$(REGISTRY) $$plain
