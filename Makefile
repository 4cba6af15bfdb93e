# Tool versions are pinned in tools/go.mod (Go tool directives) and
# GVISOR_VERSION and VERSITYGW_VERSION below; everything builds from the Go
# module proxy.
GVISOR_VERSION := v0.0.0-20260905035102-160fafc42237
VERSITYGW_VERSION := v1.8.0
KWOK_VERSION := v0.8.0
TOOLS := go tool -modfile=tools/go.mod
BIN := $(CURDIR)/bin

.PHONY: all build generate runsc runsc-check s3server kube images up lint test fuzz bench clean dist image

all: build

# The release version torpor version prints; go build itself records the
# commit, its time and whether the tree was modified (-buildvcs=auto: in a
# git checkout, even where GOFLAGS turns stamping off).
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null)
VERSION_FLAGS := -buildvcs=auto -ldflags "-X github.com/torpor-dev/torpor/internal/version.version=$(VERSION)"

build:
	CGO_ENABLED=0 go build $(VERSION_FLAGS) -o $(BIN)/torpor ./cmd/torpor

# Release binaries: torpor and runsc, static, for each of DIST_ARCHES
# (linux), under $(DIST)/linux-<arch>/. runsc for this machine's
# architecture is built as make runsc builds it, precompiled seccomp
# programs included; the others' cannot be (their generator would have to
# run on that architecture), so they are a plain go install, which
# compiles the programs when a sandbox starts. go install cannot write a
# cross-compiled binary to GOBIN, so theirs goes into a GOPATH of its own
# and is copied out.
DIST := $(CURDIR)/dist
DIST_ARCHES := amd64 arm64
dist:
	set -e; for arch in $(DIST_ARCHES); do \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch go build -trimpath $(VERSION_FLAGS) -o $(DIST)/linux-$$arch/torpor ./cmd/torpor; \
	  if [ "$$arch" = "$$(go env GOARCH)" ]; then \
	    tools/runscseccomp/build.sh $(GVISOR_VERSION) $(DIST)/linux-$$arch/runsc; \
	  else \
	    gopath=$$(mktemp -d); \
	    GOPATH=$$gopath GOMODCACHE=$$(go env GOMODCACHE) GOBIN= CGO_ENABLED=0 GOOS=linux GOARCH=$$arch \
	      go install -ldflags="-s -w" gvisor.dev/gvisor/runsc@$(GVISOR_VERSION); \
	    cp $$(find $$gopath/bin -name runsc -type f) $(DIST)/linux-$$arch/runsc; \
	    chmod -R u+w $$gopath; rm -rf $$gopath; \
	  fi; \
	done

# The torpor container image (torpor and runsc, every DIST_ARCHES) as an
# OCI image layout at $(DIST)/image, built without a container engine.
image: dist
	go run ./deploy/mkimage -dist $(DIST) -out $(DIST)/image -tag $(or $(VERSION),latest) -arch $(shell echo $(DIST_ARCHES) | tr ' ' ',')

generate:
	go build -modfile=tools/go.mod -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	$(TOOLS) buf generate

# runsc must be static: a cgo build cannot exec itself inside its own chroot.
# It is built from the pinned source with the seccomp programs of its
# sentry and gofer compiled at build time (tools/runscseccomp; about a
# minute more), which a plain go install leaves to every sandbox start and
# restore (~25 ms each, docs/benchmarks.md).
runsc: $(BIN)/runsc
$(BIN)/runsc:
	tools/runscseccomp/build.sh $(GVISOR_VERSION) $(BIN)/runsc

# Fails unless two generations of those programs are byte for byte the same.
runsc-check:
	tools/runscseccomp/build.sh $(GVISOR_VERSION) -check

# A real S3-compatible server (Versity's gateway over a directory) for the
# tests of S3 snapshot storage.
s3server: $(BIN)/versitygw
$(BIN)/versitygw:
	GOBIN=$(BIN) go install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

# A real Kubernetes control plane for the tests of Torpor on Kubernetes:
# kube-apiserver and kubectl (tools/kube, k8s.io/kubernetes pinned there),
# etcd (tools/etcd) and kwok's fake nodes. The first build takes ~15
# minutes on 2 cores; later ones are cached here.
kube: $(BIN)/kube-apiserver $(BIN)/kubectl $(BIN)/etcd $(BIN)/kwok
$(BIN)/kube-apiserver $(BIN)/kubectl &:
	cd tools/kube && CGO_ENABLED=0 go build -o $(BIN)/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
$(BIN)/etcd:
	cd tools/etcd && CGO_ENABLED=0 go build -o $(BIN)/etcd go.etcd.io/etcd/server/v3
$(BIN)/kwok:
	GOBIN=$(BIN) CGO_ENABLED=0 go install sigs.k8s.io/kwok/cmd/kwok@$(KWOK_VERSION)

# The examples' OCI image layouts, built without a container engine or
# registry; rebuilt only when their sources change.
images: examples/counter/image/index.json examples/pod/image/index.json
examples/counter/image/index.json: $(filter-out %_test.go,$(wildcard examples/counter/*.go examples/counter/mkimage/*.go examples/internal/*/*.go internal/image/*.go))
	go run ./examples/counter/mkimage -out examples/counter/image -tag latest
examples/pod/image/index.json: $(filter-out %_test.go,$(wildcard examples/pod/*/*.go examples/internal/*/*.go internal/image/*.go))
	go run ./examples/pod/mkimage -out examples/pod/image -tag latest

# One command to run Torpor on this machine (as root). Templates may name
# the examples' images (see docs/operations.md, "Image policy").
up: build runsc images
	$(BIN)/torpor up --allow-image-dir $(CURDIR)/examples

# go vet and staticcheck (pinned in tools/go.mod, default checks; it
# skips generated code, such as api/gen, by its "Code generated" header).
lint:
	go vet ./...
	$(TOOLS) staticcheck ./...

test: build runsc s3server kube images
	go test -count=1 -timeout 60m ./...
	$(MAKE) fuzz

# Each fuzz target for a bounded time, on top of its committed seed corpus
# (testdata/fuzz/), which plain go test runs anyway. A failing input is
# written to testdata/fuzz/, to be committed with the fix.
FUZZTIME := 10s
fuzz:
	go test -run '^$$' -fuzz '^FuzzParseTemplates$$' -fuzztime $(FUZZTIME) ./internal/cli/
	go test -run '^$$' -fuzz '^FuzzActorOf$$' -fuzztime $(FUZZTIME) ./internal/router/

bench: build runsc s3server kube images
	go test -run '^$$' -bench . -benchtime 2s ./...

clean:
	rm -rf $(BIN) $(DIST) examples/counter/image examples/pod/image
