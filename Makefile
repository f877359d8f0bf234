# fenced: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Tools, pinned by version, installed into ./bin by `make tools`.
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPCURL_VERSION            := v1.9.4
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

BENCHTIME ?= 2s
# ETCD_DURATION is bench/etcd's time per case; MINIMAL_ROUNDS the paired rounds per case of BenchmarkMinimal.
ETCD_DURATION ?= 2s
MINIMAL_ROUNDS ?= 6

# The Python client (clients/python): Debian's interpreter and protoc.
PYTHON ?= /usr/bin/python3
PY     := clients/python

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: run
run: ## Development mode: serve gRPC on 127.0.0.1:7420, metrics on 127.0.0.1:7421 (FENCED_LISTEN, FENCED_METRICS_LISTEN or ARGS=... to change); Redis from FENCED_REDIS_URL, else an embedded in-memory one.
	CGO_ENABLED=0 go build -o fenced ./cmd/fenced
	exec env FENCED_LISTEN="$${FENCED_LISTEN:-127.0.0.1:7420}" FENCED_METRICS_LISTEN="$${FENCED_METRICS_LISTEN-127.0.0.1:7421}" \
	  ./fenced serve $(ARGS)

.PHONY: build
build: ## Build ./fenced.
	CGO_ENABLED=0 go build -o fenced ./cmd/fenced

.PHONY: test
test: redis-server test-deploy test-python ## Run every test with -race against a real redis-server (installed if missing), and the Python client's.
	go test -race -count=1 -timeout=30m ./...

.PHONY: test-short
test-short: redis-server ## The fast loop while working: every package's quick tests with -short (the slow ones, such as fault injection, Sentinel and Cluster, skip themselves); without -race, which make test runs.
	go test -short -count=1 ./...

.PHONY: test-python
test-python: redis-server ## Test the Python client (clients/python) against a live fenced (built here) and redis-server (Debian's Python packages installed if missing).
	@$(PYTHON) -c 'import grpc, google.protobuf, pytest' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq python3-grpcio python3-protobuf python3-pytest python3-pip python3-setuptools; \
	  else echo "the Python client's tests need Debian's python3-grpcio python3-protobuf python3-pytest python3-pip python3-setuptools: sudo apt-get install -y ..." >&2; exit 1; fi; }
	$(PYTHON) -m pytest -q $(PY)

.PHONY: test-deploy
test-deploy: redis-server ## Test the Kubernetes manifests (deploy/, a module of its own), the image's static build, and the monitoring component's queries against a live fenced.
	cd deploy && go test -count=1 ./...

.PHONY: redis-server
redis-server: ## Install Debian's redis-server when it is missing (needs root).
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else echo "redis-server not found: sudo apt-get install -y redis-server" >&2; exit 1; fi; }

.PHONY: bench-compare
bench-compare: redis-server ## fenced vs the minimal gRPC→Lua→Redis path vs the floor path (the plainest Lua writing fenced's bytes) vs etcd 3.6 Txn with fsync, 16/64 swarms × 1/8/64 puts, ratios from one run (docs/benchmarks.md).
	@etcd_out=$$(mktemp); trap 'rm -f $$etcd_out' EXIT; \
	(cd bench/etcd && go run . -duration=$(ETCD_DURATION) -out=$$etcd_out) && \
	FENCED_BENCH_ETCD=$$etcd_out go test -run='^$$' -bench='^BenchmarkMinimal$$' -benchtime=$(MINIMAL_ROUNDS)x ./internal/bench/

.PHONY: bench
bench: bench-compare ## Benchmarks: bench-compare; script direct vs bare forwarder vs fenced, batch sizes 1/8/64; isolation under floods; the tick's cycle in Go and Python (bench-tick).
	go test -run='^$$' -bench=. -skip='^BenchmarkMinimal$$' -benchtime=$(BENCHTIME) -benchmem ./internal/bench/
	go test -run='^$$' -bench=. -benchtime=1x -timeout=20m ./internal/bench/isolation/
	$(PYTHON) $(PY)/tools/bench_tick.py

.PHONY: bench-tick
bench-tick: redis-server ## The tick's cycle (W1-W3 of ../shared/bench-tick) in Go and Python: through the views, without them and an in-house port, ratios from one run; KeptChanging counts under a live in-house writer.
	go test -run='^$$' -bench='^BenchmarkTick' -benchtime=$(BENCHTIME) ./internal/bench/
	$(PYTHON) $(PY)/tools/bench_tick.py

.PHONY: tools
tools: grpcurl ## Install the pinned tools (buf, protoc plugins, grpcurl) into ./bin.
	GOBIN=$(BIN) go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

.PHONY: grpcurl
grpcurl: ## Install the pinned grpcurl alone into ./bin (all the README's tour needs).
	GOBIN=$(BIN) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

.PHONY: generate
generate: tools generate-python ## Regenerate the Go code of proto/ with buf, and the Python client's.
	buf generate

.PHONY: generate-python
generate-python: ## Regenerate the Python client's proto3 twin of proto/ and its stubs (Debian's protobuf-compiler, protobuf-compiler-grpc).
	$(PYTHON) $(PY)/tools/twin.py proto/fenced/v1 $(PY)/proto/fenced/v1
	rm -f $(PY)/fenced/v1/*_pb2*.py* $(PY)/fenced/_rpc_pb2.py*
	protoc -I$(PY)/proto --python_out=$(PY) --pyi_out=$(PY) --grpc_python_out=$(PY) \
	  --plugin=protoc-gen-grpc_python=$$(command -v grpc_python_plugin) $(PY)/proto/fenced/v1/*.proto
	protoc -I$(PY)/proto --python_out=$(PY) --pyi_out=$(PY) $(PY)/proto/fenced/_rpc.proto

.PHONY: check-generate
check-generate: generate ## Fail when the committed generated code differs from a fresh generation.
	@git diff --exit-code -- proto/ $(PY)/proto $(PY)/fenced || { echo "generated code is stale: run make generate and commit" >&2; exit 1; }
	@out=$$(git status --porcelain --untracked-files=all -- $(PY)/proto $(PY)/fenced); if [ -n "$$out" ]; then echo "generated files not committed: $$out" >&2; exit 1; fi

.PHONY: lint
lint: tools ## gofmt, go vet, buf lint, buf format.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change: $$out" >&2; exit 1; fi
	go vet ./...
	buf lint
	buf format -d --exit-code

.PHONY: breaking
breaking: ## buf breaking against main.
	buf breaking --against '.git#branch=main'
