# health-router: the front door. `make help` lists the targets.
export GOTOOLCHAIN := auto
# One set of build flags for every build make runs (go vet, the tests, the tools the suites
# need, the image): static binaries with trimmed paths, as the release image is built. The
# build cache then compiles a package once for all of them instead of once per flag set (on a
# fresh machine the standard library alone was compiled four ways, the AWS SDK's EC2 client three).
export CGO_ENABLED := 0
export GOFLAGS := -trimpath $(GOFLAGS)
GO ?= go
BIN := bin/health-router
# What `health-router version`, the health_router_build_info metric and the start log line
# say: stamped into the binary by the linker (router/version), one version for make build, the
# image and the release, as a release names it: the tag (git describe) without its "v", as the
# chart's appVersion and the image tag, or 0.0.0-dev.g<commit> before the first tag.
VERSION ?= $(shell { git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo v0.0.0-dev.g$$(git describe --always --dirty=.dirty); } | sed 's/^v//')
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
VERSION_PKG := github.com/health-router/health-router/router/version
DEMO_NOW ?= 2026-11-21T12:00:00Z

.PHONY: help build test unit fmt lint fuzz bench demo world box-plot soak replay clean image image-push release release-verify chart-docs docs manifests sim

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

build: ## build bin/health-router, stamped with VERSION and REVISION (git describe, the commit)
	$(GO) build -ldflags "-X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(REVISION)" -o $(BIN) ./cmd/health-router

demo: ## the live router on local stand-ins (moto_server, envtest): the demo scenario end to end, what it did and why; KEEP=1: stays up (kubectl, status, /metrics) until Ctrl-C; KARPENTER=1: in front of the real Karpenter
	KEEP=$(KEEP) KARPENTER=$(KARPENTER) $(GO) run ./test/demo/live

NODES ?= 3
world: ## the cluster in a box (test/box): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok playing NODES kubelets (default 3), up until Ctrl-C; prints its KUBECONFIG
	NODES=$(NODES) $(GO) run ./test/box/world

box-plot: ## Karpenter alone beside the router in front, in the cluster in a box (test/box TestBoxSideBySide): the table, and the picture written to docs/box-side-by-side.png
	BOX_PLOT=$(CURDIR)/docs/box-side-by-side.png $(GO) test -count=1 -timeout 40m -run '^TestBoxSideBySide$$' -v ./test/box

# The soak (test/box/soak): a run of DURATION, plus a few minutes to bring the world up and
# check it at rest; SOAK_TIMEOUT bounds the whole (raise it for a soak of a day or more).
DURATION ?= 4h
SOAK_TIMEOUT ?= 24h
soak: ## the soak (test/box/soak) for DURATION (default 4h): the router as a process in the cluster in a box before the real Karpenter, AWS drawing maintenance and carrying it out, the router SIGKILLed at random, an outside checker; SEED replays the draws (make test runs 5m)
	SOAK_DURATION=$(DURATION) SOAK_SEED=$(SEED) $(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -run TestSoak -v ./test/box/soak

replay: build ## the what-if tool on the demo scenario (test/demo): no servers at all
	$(BIN) replay --cluster test/demo/cluster.yaml --events test/demo/events --aws test/demo/aws.yaml --now $(DEMO_NOW)

# Every tool the suites need is built from the Go module proxy once per machine and version,
# cached outside the repo (test/tools/*-bin.sh). test/tools/make-test.sh builds them in the
# background beside go vet and the suites; a suite that needs one waits for it, and a failed
# build fails the target (never a skipped suite). Each phase says how long it took
# (test/tools/timed.sh).
TIMED := test/tools/timed.sh
test: ## everything CI runs: gofmt and go vet, unit, integration and drills (moto, envtest, the real Karpenter and Alertmanager, helm), Terraform
	test/tools/make-test.sh

SEEDS ?= 200
STEPS ?= 60
sim: ## the simulation of the router with SEEDS seeds of STEPS actions (make test runs 20; 500 take about an hour on 2 cores)
	$(GO) test -count=1 -timeout 180m ./test/sim -rapid.checks=$(SEEDS) -sim.steps=$(STEPS)

unit: ## unit tests only (no moto, no envtest)
	$(GO) test -short ./router/...

fmt: ## gofmt check (no file is written)
	@out=$$(gofmt -l cmd router lambda test deploy 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: fmt ## gofmt and go vet
	$(TIMED) vet $(GO) vet ./...

fuzz: ## fuzz the event parser for a minute (corpus in router/event/testdata/fuzz)
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./router/event

bench: ## benchmarks, the load harness, the live bench on envtest + moto (LIVE_FLAGS), the burst of Spot warnings (BURST_FLAGS), the added latency in front of the real Karpenter (BENCH_KARPENTER_FLAGS)
	$(GO) test -run '^$$' -bench . -benchmem ./router/...
	$(GO) run ./test/bench $(BENCH_FLAGS)
	$(GO) run ./test/bench/live $(LIVE_FLAGS)
	$(GO) run ./test/bench/live -burst $(BURST_FLAGS)
	KUBEBUILDER_ASSETS=$$(test/tools/envtest-bins.sh) KARPENTER_BIN=$$(test/tools/karpenter-bin.sh) $(GO) run ./test/bench/karpenter $(BENCH_KARPENTER_FLAGS)

# The container image (deploy/image): linux/amd64 and linux/arm64, from an empty base, no daemon.
# SOURCE_DATE_EPOCH is the commit time, so one commit gives one digest.
IMAGE_VERSION ?= $(VERSION)
IMAGE_REVISION ?= $(REVISION)
IMAGE_TAG ?= $(IMAGE_VERSION)
export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct)

image: ## build the multi-platform OCI image into bin/image (an OCI layout; prints its digest)
	$(GO) run ./deploy/image build --out bin/image --version $(IMAGE_VERSION) --revision $(IMAGE_REVISION)

image-push: image ## push bin/image to REGISTRY (make image-push REGISTRY=123456789012.dkr.ecr.eu-west-1.amazonaws.com)
	@test -n "$(REGISTRY)" || { echo "set REGISTRY, e.g. make image-push REGISTRY=ghcr.io/you"; exit 1; }
	$(GO) run ./deploy/image push --layout bin/image --ref $(REGISTRY)/health-router:$(IMAGE_TAG)

# A release (deploy/release; docs/releasing.md): the image layout with its SBOM and SLSA
# provenance, the chart, the CLI archives and SHA256SUMS, offline, reproducible, verified before
# it ends. RELEASE_VERSION is SemVer: VERSION, the tag (git describe), or 0.0.0-dev.g<commit>
# before the first one. SIGNING_KEY (a PEM ECDSA P-256 key, or cosign's with COSIGN_PASSWORD)
# signs it as cosign does; without it the release is unsigned and says so. make test releases
# this machine's platform only (test/release); RELEASE_FLAGS="--platforms host" does the same here.
RELEASE_VERSION ?= $(VERSION)

release: ## what a release publishes, into bin/release: the image (OCI layout) with its SBOM and provenance, the chart, CLI archives for linux and darwin (amd64, arm64), SHA256SUMS; SIGNING_KEY=cosign.key signs it (cosign-compatible)
	$(GO) run ./deploy/release --out bin/release --version $(RELEASE_VERSION) --revision $(IMAGE_REVISION) --helm $$(test/tools/helm-bin.sh) --invocation "make release" $(if $(SIGNING_KEY),--signing-key $(SIGNING_KEY)) $(RELEASE_FLAGS)

release-verify: ## verify bin/release offline as a user does: checksums, provenance, SBOM, chart digest; KEY=cosign.pub: the signatures too
	$(GO) run ./deploy/release verify --dir bin/release $(if $(KEY),--key $(KEY))

# The Helm chart (deploy/charts/health-router) is the one install path; helm is built from the
# module proxy by test/tools/helm-bin.sh and cached.
CHART := deploy/charts/health-router
VALUES ?= $(CHART)/ci/default-values.yaml

chart-docs: ## regenerate the chart README's values table from values.yaml's `# --` comments
	$(GO) run ./deploy/chartdoc $(CHART)

chart-admission: ## regenerate the chart's NodePool admission policy from router/policy's annotation table
	$(GO) run ./deploy/admission $(CHART)

docs: chart-docs chart-admission ## regenerate docs/reference.md (annotations, written keys, Events, flags, metrics) from the code's tables, and the chart's values table
	$(GO) run ./deploy/refdoc

# helm template cannot ask the API server: the admission policies (Kubernetes 1.30 and later) are
# rendered for it unless API_VERSIONS is emptied.
API_VERSIONS ?= admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy

manifests: ## plain manifests rendered from the chart into bin/manifests.yaml (VALUES=your-values.yaml; API_VERSIONS= for a server before 1.30)
	@mkdir -p bin
	$$(test/tools/helm-bin.sh) template health-router $(CHART) --namespace health-router -f $(VALUES) $(if $(API_VERSIONS),--api-versions $(API_VERSIONS)) > bin/manifests.yaml
	@echo "wrote bin/manifests.yaml"

clean: ## remove build output
	rm -rf bin
