# Every tool a target needs is fetched here, pinned; a fresh machine needs only Go.
GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
OPA_VERSION := v1.22.3
BIN         := bin
# A real OPA for the end-to-end tests against `opa run` (external store).
OPA         := $(BIN)/opa
PKGS        := ./...
FUZZTIME    ?= 10s

.PHONY: all build test fmt-check vet race mutate lint fuzz bench run clean tree-check

all: build

## build: the agent and the dev server into ./bin, statically linked (no cgo)
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

## test: tracked-file check, format check, vet, race-enabled tests, and the mutation check (CI runs this)
test: tree-check fmt-check vet race mutate

## tree-check: no tracked file is a binary or larger than 1 MB (docs/ images excepted by name)
tree-check:
	@bad=0; for f in $$(git ls-files); do \
	  case "$$f" in docs/*.svg|docs/*.png) continue;; esac; \
	  [ -f "$$f" ] || continue; \
	  if [ $$(wc -c < "$$f") -gt 1048576 ]; then echo "tracked file over 1 MB: $$f"; bad=1; fi; \
	  if ! tr -d '\000' < "$$f" | cmp -s - "$$f"; then echo "tracked binary file: $$f"; bad=1; fi; \
	done; exit $$bad

$(OPA):
	GOBIN=$(abspath $(BIN)) $(GO) install github.com/open-policy-agent/opa@$(OPA_VERSION)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

race: $(OPA)
	OPAL_TEST_OPA=$(abspath $(OPA)) $(GO) test -race -count=1 $(PKGS)

## mutate: apply every mutation in */mutations.txt; fails unless the tests catch each one
mutate: $(OPA)
	OPAL_TEST_OPA=$(abspath $(OPA)) $(GO) run ./internal/tools/mutate

## lint: gofmt, vet and staticcheck
lint: fmt-check vet
	$(GO) run $(STATICCHECK) $(PKGS)

## fuzz: run each fuzz target briefly (not in CI)
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

## bench: Go benchmarks, the store beside OPA's own activation, the fleet
## outage simulator (10,000 agents, rewrites docs/fleet-a-timeline.svg) and the
## sidecar beside `opa run --server`. Figures: docs/performance.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./fetcher ./scheduler ./updater
	OPAL_PERF=1 $(GO) test -count=1 -run '^TestPerformanceReport$$' -v ./internal/store/embedded
	OPAL_FLEETSIM=1 $(GO) test -count=1 -timeout 15m -run '^TestFleetSimulation$$' -v ./internal/fleetsim
	$(GO) run ./internal/tools/sidecarbench

## run: the dev server on examples/policy and the agent with embedded OPA; prints a decision's curl; Ctrl-C stops both
run: build
	$(GO) run ./internal/tools/devrun

clean:
	rm -rf $(BIN)
