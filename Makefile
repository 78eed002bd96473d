# health-router: the front door. `make help` lists the targets.
export GOTOOLCHAIN := auto
GO ?= go
BIN := bin/health-router
DEMO_NOW ?= 2026-11-21T12:00:00Z

.PHONY: help build test unit lint fuzz bench demo replay clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

build: ## build bin/health-router
	$(GO) build -o $(BIN) ./cmd/health-router

demo: ## the live router on local stand-ins (moto_server, envtest kube-apiserver): the demo scenario end to end
	$(GO) run ./test/demo/live

replay: build ## the what-if tool on the demo scenario (test/demo): no servers at all
	$(BIN) replay --cluster test/demo/cluster.yaml --events test/demo/events --aws test/demo/aws.yaml --now $(DEMO_NOW)

# The Terraform suite (test/tools/terraform-tests.sh) runs the Lambda's and test/terraform's Go
# tests itself, so the package list here leaves them out rather than run them twice.
GO_PACKAGES = $$($(GO) list ./... | grep -v -e /test/terraform -e /lambda/)

test: lint ## everything CI runs: lint, unit, integration and drills (moto, envtest), Terraform
	KUBEBUILDER_ASSETS=$$(test/tools/envtest-bins.sh) $(GO) test -p 1 -count=1 -timeout 30m $(GO_PACKAGES)
	test/tools/terraform-tests.sh

unit: ## unit tests only (no moto, no envtest)
	$(GO) test -short ./router/...

lint: ## gofmt and go vet
	@out=$$(gofmt -l cmd router lambda test 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

fuzz: ## fuzz the event parser for a minute (corpus in router/event/testdata/fuzz)
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./router/event

bench: ## benchmarks, the load harness, and the live bench on envtest + moto (LIVE_FLAGS=-nodes=4000 ...)
	$(GO) test -run '^$$' -bench . -benchmem ./router/...
	$(GO) run ./test/bench $(BENCH_FLAGS)
	$(GO) run ./test/bench/live $(LIVE_FLAGS)

clean: ## remove build output
	rm -rf bin
