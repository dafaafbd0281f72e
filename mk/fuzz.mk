##@ Fuzzing

# Every fuzz target (hack/fuzz-targets.sh finds them: each func Fuzz* of a
# *_test.go, except FuzzProg*, which need root and run under test-bpf), one
# after another for FUZZTIME each. Inputs that fail are written under the
# package's testdata/fuzz/<Target>/: commit them as regression seeds.
# docs/fuzzing.md says what each target checks and how to run longer.
FUZZTIME ?= 10s

.PHONY: test-fuzz
test-fuzz: ## Run every fuzz target (hack/fuzz-targets.sh) for FUZZTIME each, default 10s; no privileges needed.
	@targets=$$(hack/fuzz-targets.sh); [ -n "$$targets" ] || { echo "test-fuzz: no fuzz targets found" >&2; exit 1; }; \
	while read -r pkg name; do \
	  echo "--- $$name ($$pkg, $(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg </dev/null; \
	done <<< "$$targets"

# make test runs each target briefly: enough to catch a regression in the
# neighbourhood of the seeds; longer runs are for docs/fuzzing.md's recipe.
# A count, not a duration: when a duration ends while a worker is busy, Go's
# fuzzing coordinator can report "context deadline exceeded" as a failure
# (seen on a loaded 2-core machine), which would make make test flaky.
.PHONY: test-fuzz-short
test-fuzz-short: ## Every fuzz target for 20,000 inputs (what make test runs; seconds each).
	$(MAKE) test-fuzz FUZZTIME=20000x
