# clustermap: `make demo` runs local clusters with clustermap; `make test`
# runs every test. Both build what they need into ./bin first.
SHELL := /usr/bin/env bash
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/clustermap/clustermap/internal/version.Version=$(VERSION)
MCS_API_DIR = $(shell go list -m -f '{{.Dir}}' sigs.k8s.io/mcs-api)
# -parallel 5: the lab and registry tests mostly wait (operations, read
# lag, TTLs) rather than compute; at 3 the 2 cores sat half idle through a
# clean-clone run (vmstat, 2026-12-06).
GOTEST_FLAGS ?= -timeout 40m -parallel 5
# go.mod's toolchain line names the patched Go release the build, tests and
# govulncheck use; auto fetches it once through the module proxy when the
# machine's Go is older (the Go distribution's go.env says local).
GOTOOLCHAIN ?= auto
export GOTOOLCHAIN

.PHONY: all tools build image release generate crds test static-checks test-packages test-fast fuzz soak bench bench-tools demo down clean

all: build

## tools: build the pinned kube-apiserver, kube-proxy, etcd, kwok, controller-gen, staticcheck,
## kubectl, govulncheck and its database (from the pinned golang.org/x/vulndb),
## promtool and a PromQL checker (Prometheus), kustomize, CoreDNS, cyclonedx-gomod (the SBOM) into
## ./bin, and the Prometheus Operator's and mcs-api v0.1.0's CRDs into
## bin/crds for the tests; install the Debian packages the data plane and its pods use (nftables, dnsutils, curl, socat, netcat-openbsd)
tools:
	@hack/build-tools.sh

## build: into ./bin, the product binary clustermap (static, as the image
## needs) and the lab's: clustermap-dev (local clusters, data plane, demo)
## and cloudmap-local (the Cloud Map emulator)
build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/clustermap ./cmd/clustermap-dev ./cmd/cloudmap-local

PLATFORMS ?= linux/amd64 linux/arm64

## image: the OCI image, no Docker needed: bin/image/oci (OCI layout, every
## platform) and bin/image/clustermap-linux-<arch>.tar (docker load)
image:
	@set -e; args=; for p in $(PLATFORMS); do \
	  os=$${p%%/*}; arch=$${p#*/}; out=$(BIN)/$$os-$$arch/clustermap; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags '$(LDFLAGS)' -o $$out ./cmd/clustermap; \
	  args="$$args $$p=$$out"; done; \
	go run ./hack/image -version $(VERSION) -out $(BIN)/image $$args

CHART := charts/clustermap

RELEASE_DIR ?= $(CURDIR)/dist/$(VERSION)

## release: VERSION=vX.Y.Z: what a release publishes, into dist/VERSION
## (RELEASE_DIR): the CLI for linux and darwin on amd64 and arm64, the
## multi-platform image (OCI archive, docker tarballs), the packaged chart,
## the SBOM, the CHANGELOG section and SHA256SUMS (signed with COSIGN_KEY, a cosign
## key file, when set); .github/workflows/release.yml
## runs it for a pushed tag
release:
	@ONLY="cyclonedx-gomod$(if $(COSIGN_KEY), cosign)" hack/build-tools.sh
	go run ./hack/release -version '$(VERSION)' -out '$(RELEASE_DIR)' -tools '$(BIN)'

## generate: emulator wire code, deep-copies, the ClusterProperty CRD, the
## hub's ClusterExport CRD (config/hub, installed by clustermap hub init), one
## least-privilege ClusterRole per mode (controller-gen), and the chart's copies
# The Cloud Map API model the emulator's wire code is generated from: an
# input kept outside the clone (../shared/spec), needed only here.
MODEL ?= $(CURDIR)/../shared/spec/servicediscovery-2017-03-14.smithy.json

generate: tools
	@test -f "$(MODEL)" || { echo "make generate: the Cloud Map API model $(MODEL) is missing: put the shared folder beside the clone (../shared/spec/) or pass MODEL=path/to/servicediscovery-2017-03-14.smithy.json" >&2; exit 1; }
	go run ./internal/cloudmaplocal/modelgen "$(MODEL)" internal/cloudmaplocal/zz_generated_model.go internal/cloudmaplocal/testdata/servicediscovery-model.json
	$(BIN)/controller-gen object paths=./api/...
	$(BIN)/controller-gen crd paths=./api/v1alpha1/... output:crd:dir=config/crd/bases
	$(BIN)/controller-gen crd paths=./api/hub/... output:crd:dir=config/hub
	$(BIN)/controller-gen rbac:roleName=clustermap-mcs paths="./internal/controller;./internal/export;./internal/imports" output:rbac:dir=config/rbac/mcs
	$(BIN)/controller-gen rbac:roleName=clustermap-cloudmap-dns paths="./internal/controller;./internal/cloudmapdns" output:rbac:dir=config/rbac/cloudmap-dns
	$(BIN)/controller-gen rbac:roleName=clustermap-syndicate paths="./internal/controller;./internal/replication" output:rbac:dir=config/rbac/syndicate
	for m in mcs cloudmap-dns syndicate; do cp config/rbac/$$m/role.yaml $(CHART)/files/rbac/$$m.yaml; done
	cp config/crd/bases/*.yaml $(CHART)/crds/

## crds: vendor the upstream mcs-api CRDs from the pinned sigs.k8s.io/mcs-api module
crds:
	@mkdir -p config/crd/bases
	cp $(MCS_API_DIR)/config/crd/multicluster.x-k8s.io_*.yaml config/crd/bases/
	chmod 0644 config/crd/bases/multicluster.x-k8s.io_*.yaml
	cp config/crd/bases/*.yaml $(CHART)/crds/

## test: every test: the fast ones and, with the build tag e2e, those that
## start clusters, network namespaces or emulator processes, or build
## binaries (from ./bin), with the static checks beside them (the tests
## mostly wait: they use about half a core of two); the short fault
## campaigns, over Cloud Map and over a hub, run last and alone (they time
## convergence), printing their counts. Each part's output is printed when
## it ends.
test: tools build
	$(MAKE) --no-print-directory -j2 --output-sync=target static-checks test-packages
	CLUSTERMAP_BIN_DIR=$(BIN) go test -tags e2e $(GOTEST_FLAGS) -v -run 'FaultCampaign$$' ./test/soak/

## static-checks: go vet, staticcheck and govulncheck (on the vulnerability
## database make tools fetched)
static-checks:
	go vet -tags e2e ./...
	$(BIN)/staticcheck -tags e2e ./...
	$(BIN)/govulncheck -db file://$(BIN)/vulndb -tags e2e ./...

## test-packages: every package's tests but the fault campaign's. test/e2e
## is listed first: it is the longest package (about 18 minutes) and go
## test starts packages in the order given, so the others run beside it,
## not before it; test/release second: on a cold build cache its four
## cross-builds of the CLI took 1,256 s when they started last. -p 3: the
## others take about 22 minutes one after another
## (1,361 s in a clean-clone run of 06cfae2, against test/e2e's 1,156 s),
## so at go test's default of one package per core they, not test/e2e,
## set the time; two at a time beside test/e2e, they end well before it.
test-packages:
	CLUSTERMAP_BIN_DIR=$(BIN) go test -p 3 -tags e2e $(GOTEST_FLAGS) $$(go list -tags e2e ./test/e2e ./test/release ./... | grep -v /test/soak)

## test-fast: the tests that need no cluster, root, tool or built binary,
## but the Cloud Map backend's scenarios against the emulator (minutes of
## operations, read lag and TTLs; make test runs them with the e2e tag)
test-fast:
	go test ./...

FUZZTIME ?= 1m

## fuzz: every fuzz target (each func Fuzz... of a _test.go file, found
## anew each run) for FUZZTIME; their seed corpora run in every go test:
## another cluster's Cloud Map records, packed records, DNS packets, the
## emulator's requests, peer kubeconfigs, and the objects an import plans
## from any records, held to a real kube-apiserver's validation (it starts
## one; the tools must be built)
fuzz: tools
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' cmd internal test); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    echo "fuzz: $$t in ./$$(dirname $$f)"; \
	    CLUSTERMAP_BIN_DIR=$(BIN) go test -tags e2e -run XXX -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f); done; done

## soak: the full fault campaigns: over Cloud Map, all three modes (about
## 15 minutes: 3 clusters, 20 controller kills, Cloud Map down 5 min,
## throttled 2 min, a member down 2 min), and over a hub (about 11 minutes:
## the hub restarted, cut off 5 min, a member's credentials revoked 3 min);
## `make test` runs short ones
soak: tools build
	CLUSTERMAP_SOAK=full CLUSTERMAP_BIN_DIR=$(BIN) go test -tags e2e -count=1 -v -run 'FaultCampaign$$' -timeout 60m ./test/soak/

COREDNS_VERSION := v1.13.1

## bench-tools: what only the benchmarks need: stock CoreDNS to compare with, dnsperf (Debian)
bench-tools:
	@test -x $(BIN)/coredns || GOBIN=$(BIN) go install github.com/coredns/coredns@$(COREDNS_VERSION)
	@command -v dnsperf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsperf; }

## bench: the benchmarks, printing the numbers the issues set targets for
bench: tools build bench-tools
	CLUSTERMAP_BIN_DIR=$(BIN) go test -tags e2e -run XXX -bench . -benchtime 1x -timeout 60m ./bench/...

## demo: local clusters with clustermap (see README.md and docs/lab.md)
demo: tools build
	$(BIN)/clustermap-dev demo

## down: stop what `make demo` or `clustermap-dev up` started
down: build
	$(BIN)/clustermap-dev down

clean: down
	rm -rf $(BIN)
