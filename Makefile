# Every tool a target needs is fetched here, pinned; a fresh machine needs only Go.
GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BIN         := bin
PKGS        := ./...
FUZZTIME    ?= 10s

.PHONY: all build test fmt-check vet race mutate lint fuzz bench run clean

all: build

## build: the agent and the dev server into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## test: format check, vet, race-enabled tests, and the mutation check (CI runs this)
test: fmt-check vet race mutate

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

race:
	$(GO) test -race -count=1 $(PKGS)

## mutate: apply every mutation in */mutations.txt; fails unless the tests catch each one
mutate:
	$(GO) run ./internal/tools/mutate

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
