# te — build, run, test, bench. See README.md.
GO      ?= go
BIN     := bin/te
PKGS    := ./...

export CGO_ENABLED ?= 0

# te version reports the commit; the toolchain's own VCS stamp is missing
# in some checkouts (git worktrees, GOFLAGS=-buildvcs=false).
LDFLAGS := -s -w -X github.com/rdmago/te/internal/cli.commit=$(shell git rev-parse HEAD 2>/dev/null)

.PHONY: all build build-arm64 run test test-deps lint generate test-unit test-race test-arm64 test-softroce bench bench-smoke fuzz-smoke deps clean

all: build

## build: static, cgo-free bin/te
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='$(LDFLAGS)' -o $(BIN) ./cmd/te

## build-arm64: the same binary for arm64 hosts (Grace), bin/te-arm64
build-arm64:
	CGO_ENABLED=0 GOARCH=arm64 $(GO) build -trimpath -ldflags='$(LDFLAGS)' -o $(BIN)-arm64 ./cmd/te

## run: the main job — te bench, loopback TCP and shm taking turns, in-process target
run: build
	./$(BIN) bench

## test: every tier (lint, unit+race, benchmarks once, softroce in qemu);
## as root it first installs whatever the tiers need that is missing
test: test-deps lint test-unit test-race test-arm64 bench-smoke fuzz-smoke test-softroce

# As root, .ci/deps installs what is missing (each step is skipped when
# satisfied); as another user the tiers that need root skip loudly.
test-deps:
	@if [ "$$(id -u)" = 0 ]; then bash .ci/deps; else echo "test-deps: not root, installing nothing (run make deps as root)"; fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	CGO_ENABLED=0 $(GO) build $(PKGS)
	$(GO) tool staticcheck $(PKGS)
	$(GO) test -count=1 -run '^TestImportRule' ./internal
	$(GO) mod tidy -diff
	@bash .ci/check-generate

## generate: the stringer tables (*_string.go) and the eBPF objects from
## ebpf/bpf/*.c (bpf2go: clang, llvm, libbpf-dev)
generate:
	$(GO) generate ./...

# -race needs cgo in the test binaries only; the product stays cgo-free.
test-race:
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 20m $(PKGS)

# Without -race too: the zero-allocation tests skip under the race detector.
test-unit:
	$(GO) test -count=1 -timeout 20m $(PKGS)

# arm64 (Grace hosts): the ABI, verbs, rxe and mlx5 unit suites (the mlx5dv
# oracle, the simulated HCA, the doorbell stores of mmio_arm64.s) built for
# arm64 and run under qemu-user, then the static arm64 te runs the main job
# (te bench, loopback TCP and shm, data verified). Without qemu-aarch64 it skips
# loudly, and fails under CI=true.
ARM64_PKGS := ./internal/... ./uverbs/... ./rxe ./mlx5
test-arm64:
	GOARCH=arm64 $(GO) vet $(PKGS)
	@if ! command -v qemu-aarch64 >/dev/null; then \
		echo "test-arm64: qemu-aarch64 not found (apt-get install qemu-user, or make deps)"; \
		if [ "$${CI:-}" = true ]; then exit 1; fi; echo "*** SKIPPED: arm64 tier ***"; exit 0; fi; \
	echo "TE_QEMU_USER=1 GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64 $(ARM64_PKGS)"; \
	TE_QEMU_USER=1 GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64 $(ARM64_PKGS) && \
	$(MAKE) --no-print-directory build-arm64 && \
	echo "qemu-aarch64 $(BIN)-arm64 bench --duration 1s --verify" && \
	qemu-aarch64 $(BIN)-arm64 bench --duration 1s --verify

fuzz-smoke:
	bash .ci/fuzz-smoke

## bench-smoke: every benchmark once, so none can rot
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 15m $(PKGS)

# Every package whose tests import test/softroce/srenv runs inside a qemu
# guest with rdma_rxe (two simulated hosts, two rails each, plus loopback),
# once per kernel of the matrix: Debian 12's 6.1 and its 6.12 (rxe differs,
# e.g. a bad lkey completes as a flush). Both run even when one fails.
SR_KERNELS ?= linux-image-amd64 linux-image-6.12-amd64
test-softroce:
	@st=0; for k in $(SR_KERNELS); do \
		echo "SR_KPKG=$$k bash test/softroce/run.sh -all"; \
		SR_KPKG=$$k bash test/softroce/run.sh -all || st=1; \
	done; exit $$st

## bench: the measured tables (README)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./engine ./tcp ./shm ./mlx5
	./$(BIN) bench --sweep --baseline
	bash test/softroce/bench.sh

## deps: everything the test tiers need on a fresh Debian 12 machine (as root)
deps:
	bash .ci/deps

clean:
	rm -rf bin
