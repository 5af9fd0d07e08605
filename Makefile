# Every tool a target needs is fetched here, pinned; a fresh machine needs only Go.
GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
OPA_VERSION := v1.22.3
BIN         := bin
# A real OPA for the end-to-end tests against `opa run` (external store).
OPA         := $(BIN)/opa
PKGS        := ./...
FUZZTIME    ?= 10s

.PHONY: all build test fmt-check vet race mutate lint fuzz bench run clean tree-check image image-test buildah-tool

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
	OPAL_FLEETSIM=1 $(GO) test -count=1 -timeout 30m -run '^TestFleetSimulation$$' -v ./internal/fleetsim
	$(GO) run ./internal/tools/sidecarbench

## run: the dev server on examples/policy and the agent with embedded OPA; prints a decision's curl; Ctrl-C stops both
run: build
	$(GO) run ./internal/tools/devrun

clean:
	rm -rf $(BIN)

# The container image (Containerfile): FROM scratch, so nothing is pulled; the
# root filesystem is staged under $(IMAGE_DIR) and copied in by buildah.
HOSTARCH    := $(shell $(GO) env GOHOSTARCH)
ARCH        ?= $(HOSTARCH)
# A cross-built image gets its own tag, so it never replaces the one
# image-test runs.
IMAGE       ?= localhost/opal-client:dev$(if $(filter $(ARCH),$(HOSTARCH)),,-$(ARCH))
IMAGE_DIR   := $(BIN)/image/linux-$(ARCH)
# Debian's ca-certificates package provides it.
CA_BUNDLE   := /etc/ssl/certs/ca-certificates.crt
BUILDAH     := buildah

## buildah-tool: install buildah (and the CA bundle the image copies) from Debian's packages when missing
buildah-tool:
	@command -v $(BUILDAH) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y buildah)
	@[ -f $(CA_BUNDLE) ] || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ca-certificates)

## image: the container image $(IMAGE) for linux/$(ARCH) (make image ARCH=arm64 cross-builds)
image: buildah-tool
	rm -rf $(IMAGE_DIR)
	mkdir -p $(IMAGE_DIR)/rootfs/usr/local/bin $(IMAGE_DIR)/rootfs/etc/ssl/certs $(IMAGE_DIR)/rootfs/tmp $(IMAGE_DIR)/home/backup
	CGO_ENABLED=0 GOOS=linux GOARCH=$(ARCH) $(GO) build -ldflags="-s -w" -o $(IMAGE_DIR)/rootfs/usr/local/bin/opal-client ./cmd/opal-client
	cp $(CA_BUNDLE) $(IMAGE_DIR)/rootfs/etc/ssl/certs/ca-certificates.crt
	printf 'root:x:0:0:root:/root:/sbin/nologin\nopal:x:1000:1000:opal:/opal:/sbin/nologin\n' > $(IMAGE_DIR)/rootfs/etc/passwd
	printf 'root:x:0:\nopal:x:1000:\n' > $(IMAGE_DIR)/rootfs/etc/group
	chmod 1777 $(IMAGE_DIR)/rootfs/tmp
	chmod 0755 $(IMAGE_DIR)/home $(IMAGE_DIR)/home/backup
	@old=$$($(BUILDAH) images -q --noheading $(IMAGE) 2>/dev/null || true); \
	$(BUILDAH) build --quiet --platform linux/$(ARCH) -f Containerfile -t $(IMAGE) . >/dev/null && \
	new=$$($(BUILDAH) images -q --noheading $(IMAGE)) && \
	if [ -n "$$old" ] && [ "$$old" != "$$new" ]; then $(BUILDAH) rmi "$$old" >/dev/null 2>&1 || true; fi; \
	echo "built $(IMAGE) (linux/$(ARCH)): $$new"

## image-test: run the image's entrypoint in its root filesystem against the dev server and ask a decision (CI runs this)
image-test: image build
	IMAGE=$(IMAGE) BUILDAH=$(BUILDAH) deploy/image-test.sh
