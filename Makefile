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

.PHONY: all tools generate check-generated buf-lint buf-breaking lint vet test unit bench bench-kernel build run clean

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

# unit needs the tools: the grpcurl test runs the real grpcurl.
unit: tools
	go test -race -count=1 $(GO_PACKAGES)

test: check-generated buf-lint buf-breaking vet lint unit

# bench runs the control plane benchmarks; docs/benchmarks.md records them.
bench: tools
	go test -run '^$$' -bench . -benchmem -benchtime=20x -count=$(BENCH_COUNT) ./controlplane/table/ ./controlplane/server/ | tee bench.out
	benchstat bench.out

# bench-kernel programs the real kernel in throwaway namespaces (root):
# iptables full and partial syncs at 1k/5k/10k services against the raw
# iptables-restore floor, and the agent's memory at 10k services.
bench-kernel:
	go test -run '^$$' -bench . -benchtime=1x -timeout 30m ./nodeagent/dataplane/iptables/ ./nodeagent/agent/

clean:
	rm -rf $(BIN)
