# proxyplane: `make demo` runs it, `make test` proves it.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

BIN := $(CURDIR)/.bin
export PATH := $(BIN):$(PATH)
# Tools are pinned in tools/go.mod (its own module, so their dependencies
# stay out of ours) and built into .bin/ from the Go build cache.
TOOLS := github.com/bufbuild/buf/cmd/buf \
	google.golang.org/protobuf/cmd/protoc-gen-go \
	google.golang.org/grpc/cmd/protoc-gen-go-grpc \
	github.com/fullstorydev/grpcurl/cmd/grpcurl \
	github.com/golangci/golangci-lint/v2/cmd/golangci-lint \
	golang.org/x/perf/cmd/benchstat
GO_PACKAGES := ./...
BENCH_COUNT ?= 6

.PHONY: all tools generate check-generated buf-lint buf-breaking lint vet test os-deps unit fuzz fuzz-short bench bench-kernel build run clean

all: build

tools:
	go -C tools build -o $(BIN)/ $(TOOLS)

build:
	go build -o $(BIN)/ ./controlplane ./nodeagent

# run starts the control plane against the cluster in $(KUBECONFIG).
KUBECONFIG ?= $(HOME)/.kube/config
run: build
	$(BIN)/controlplane --kubeconfig=$(KUBECONFIG) --grpc-address=127.0.0.1:9640 --metrics-address=127.0.0.1:9641

generate: tools
	rm -rf gen
	buf generate

# check-generated regenerates into a scratch copy and fails on any
# difference, so a stale gen/ never passes.
check-generated: tools
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	buf generate -o $$tmp; \
	diff -r gen $$tmp/gen || { echo "gen/ is stale: run 'make generate' and commit" >&2; exit 1; }

buf-lint: tools
	buf lint
	buf format -d --exit-code

# buf-breaking compares proto/ with main's last commit when there is one.
buf-breaking: tools
	@if git rev-parse --verify -q HEAD:proto >/dev/null; then \
		buf breaking --against '.git#ref=HEAD,subdir=proto'; \
	else echo "buf breaking: no committed proto/ to compare against"; fi

vet:
	go vet $(GO_PACKAGES)

lint: tools
	golangci-lint run $(GO_PACKAGES)
	cd e2e && go vet ./... && golangci-lint run ./...

# os-deps installs the OS packages the kernel tests need (as root, with
# apt), or names the missing ones; without root those tests skip, saying so.
os-deps:
	-hack/install-os-deps.sh

# unit needs the tools: the grpcurl test runs the real grpcurl.
unit: tools os-deps
	go test -race -count=1 $(GO_PACKAGES)

# test is everything: static checks, the unit and kernel tests, a short
# run of every fuzz target, then the end-to-end tests on a real API server
# (e2e, below).
test: check-generated buf-lint buf-breaking vet lint unit fuzz-short e2e

# FUZZ_TARGETS are the native fuzz targets at the trust boundaries, as
# package:Target. go test fuzzes one target per run, hence the loop. The
# seed corpora also run with every `go test`; fuzz-short fuzzes each for
# FUZZ_SHORT inputs, fuzz for FUZZ_TIME (new failures land in the
# package's testdata/fuzz, to commit with the fix). The short run counts
# inputs rather than time: when a time budget ends while a slow input (a
# cache write with its fsyncs) is still being minimized, go test reports
# "context deadline exceeded" as a failure.
FUZZ_TARGETS := ./nodeagent/proxytable:FuzzResponse \
	./controlplane/server:FuzzDecodeRequest \
	./controlplane/compute:FuzzBuild \
	./nodeagent/cache:FuzzOpenFile \
	./nodeagent/cache:FuzzStoredValues
FUZZ_SHORT ?= 2000x
FUZZ_TIME ?= 5m
fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZ_TIME=$(FUZZ_SHORT)
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzzing $${t#*:} in $${t%%:*} for $(FUZZ_TIME)"; \
		go test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZ_TIME) "$${t%%:*}"; \
	done

# bench runs the control plane benchmarks; docs/benchmarks.md records them.
# The Scale ones (10,000 Services) run apart: their memory figures need one
# iteration each (they repeat to 0.1%) and take minutes to set up.
bench: tools
	go test -run '^$$' -bench . -skip Scale -benchmem -benchtime=20x -count=$(BENCH_COUNT) ./controlplane/table/ ./controlplane/server/ | tee bench.out
	go test -run '^$$' -bench ScaleEndpointChange -benchmem -benchtime=50x -count=$(BENCH_COUNT) -timeout 30m ./controlplane/table/ | tee -a bench.out
	go test -run '^$$' -bench ScaleMemory -benchtime=1x -timeout 30m ./controlplane/table/ | tee -a bench.out
	benchstat bench.out

# bench-kernel programs the real kernel in throwaway namespaces (root):
# iptables full and partial syncs at 1k/5k/10k services against the raw
# iptables-restore floor, and the agent's memory at 10k services.
bench-kernel:
	go test -run '^$$' -bench . -benchtime=1x -timeout 30m ./nodeagent/dataplane/iptables/ ./nodeagent/agent/

clean:
	rm -rf $(BIN)

# e2e-apiserver runs a real etcd and kube-apiserver in one process on
# 127.0.0.1 (e2e/cmd/apiserver). It is a module of its own so that
# k8s.io/kubernetes stays out of ours and the e2e tests'. The version must be stamped in, or
# /version reports v0.0.0 and clients gating on it misbehave. A cold build
# takes minutes and GBs, so tests run this binary rather than link it.
# Keep E2E_K8S_VERSION equal to k8s.io/kubernetes in e2e/cmd/apiserver/go.mod.
E2E_K8S_VERSION := v1.36.4
E2E_K8S_VERSION_WORDS := $(subst ., ,$(patsubst v%,%,$(E2E_K8S_VERSION)))
E2E_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(E2E_K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(E2E_K8S_VERSION_WORDS)) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(E2E_K8S_VERSION_WORDS)) \
	-X k8s.io/component-base/version.gitTreeState=clean

.PHONY: e2e-apiserver e2e

e2e-apiserver:
	cd e2e/cmd/apiserver && go build -ldflags '$(E2E_LDFLAGS)' -o $(BIN)/e2e-apiserver .

# e2e runs the end-to-end tests (e2e/cluster, and e2e/scenarios on the
# cluster-in-a-box of e2e/box, as root) against e2e-apiserver and the
# built binaries; the grpcurl scenario runs the pinned grpcurl. -v shows
# the scenarios' measured figures (lines "e2e-figure: ...") when they pass.
e2e: build e2e-apiserver tools
	cd e2e && E2E_APISERVER=$(BIN)/e2e-apiserver E2E_BIN_DIR=$(BIN) go test -v -count=1 -timeout 30m ./...

# demo is the README's first command: a cluster in a box (e2e/box) with
# sample Services, running until Ctrl-C, then removed. As root; it installs
# the OS packages it needs (hack/install-os-deps.sh). grpcurl is built
# alone, so the demo does not wait for the whole toolchain.
.PHONY: demo demo-check
demo-check:
	@if [ "$$(id -u)" -ne 0 ]; then echo "make demo needs root: it creates network namespaces and programs rules in them (sudo make demo)" >&2; exit 1; fi
	@if [ ! -x $(BIN)/e2e-apiserver ]; then echo "building the binaries and a real etcd + kube-apiserver (e2e/cmd/apiserver): about 6 to 10 minutes and 2.3 GB of memory the first time" >&2; fi
# demo-check runs first: root, then what the build is about to take.
demo: demo-check build e2e-apiserver
	hack/install-os-deps.sh
	go -C tools build -o $(BIN)/ github.com/fullstorydev/grpcurl/cmd/grpcurl
	cd e2e && go build -o $(BIN)/e2e-demo ./cmd/demo
	E2E_APISERVER=$(BIN)/e2e-apiserver E2E_BIN_DIR=$(BIN) $(BIN)/e2e-demo

# bench-upstream compares proxyplane's nftables dataplane with upstream
# kube-proxy's nftables mode on this kernel, at 1k, 5k and 10k Services, in
# one run, as root (e2e/cmd/kpbench; docs/benchmarks.md records it). The
# kube-proxy is E2E_K8S_VERSION's, built from its own module
# (e2e/cmd/kpbench/upstream) and stamped like e2e-apiserver. Pass other
# flags with KPBENCH_FLAGS (for example --sizes=1000 --upstream-reps=1).
KPBENCH_FLAGS ?=
.PHONY: bench-upstream
bench-upstream: e2e-apiserver
	cd e2e/cmd/kpbench/upstream && go build -ldflags '$(E2E_LDFLAGS)' -o $(BIN)/kube-proxy k8s.io/kubernetes/cmd/kube-proxy
	cd e2e && go build -o $(BIN)/kpbench ./cmd/kpbench
	$(BIN)/kpbench --apiserver=$(BIN)/e2e-apiserver --kube-proxy=$(BIN)/kube-proxy $(KPBENCH_FLAGS) | tee bench-upstream.out

# bench-fleet measures the control plane binary at cluster scale on this
# machine (e2e/cmd/fleet; docs/benchmarks.md): N simulated agents, each on
# its own TCP connection, against e2e-apiserver with S Services, through a
# cold start, paced endpoint changes and a restart, then the peer
# (kube-proxy-style informer sets) in the same run. Not root. Pass sizes
# with FLEET_FLAGS (for example --nodes=5000 --services=10000
# --peer-sets=500; --peer=false skips the peer).
FLEET_FLAGS ?=
.PHONY: bench-fleet
bench-fleet: build e2e-apiserver
	cd e2e && go build -o $(BIN)/fleet ./cmd/fleet
	$(BIN)/fleet --apiserver=$(BIN)/e2e-apiserver --controlplane=$(BIN)/controlplane $(FLEET_FLAGS) | tee bench-fleet.out
