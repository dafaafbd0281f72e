##@ Tools (pinned, built from the Go module proxy into $(CACHE_DIR)/bin)

# Knative's queue-proxy, for the data-path benchmark's comparison column.
QUEUE_PROXY_VERSION := v0.50.0
QUEUE_PROXY := $(CACHE_DIR)/bin/queue-proxy-$(QUEUE_PROXY_VERSION)

.PHONY: queue-proxy
queue-proxy: $(QUEUE_PROXY) ## Build Knative's queue-proxy (pinned in hack/tools/queue-proxy).

$(QUEUE_PROXY): hack/tools/queue-proxy/go.mod
	cd hack/tools/queue-proxy && $(GO) build -trimpath -ldflags '-s -w' -o $@ knative.dev/serving/cmd/queue
