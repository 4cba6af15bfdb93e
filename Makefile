# Tool versions are pinned in tools/go.mod (Go tool directives) and
# GVISOR_VERSION below; everything builds from the Go module proxy.
GVISOR_VERSION := v0.0.0-20260905035102-160fafc42237
TOOLS := go tool -modfile=tools/go.mod
BIN := $(CURDIR)/bin

.PHONY: all build generate runsc images up test bench clean

all: build

build:
	CGO_ENABLED=0 go build -o $(BIN)/torpor ./cmd/torpor

generate:
	go build -modfile=tools/go.mod -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
	$(TOOLS) buf generate

# runsc must be static: a cgo build cannot exec itself inside its own chroot.
runsc: $(BIN)/runsc
$(BIN)/runsc:
	CGO_ENABLED=0 GOBIN=$(BIN) go install -ldflags="-s -w" gvisor.dev/gvisor/runsc@$(GVISOR_VERSION)

# The counter example's OCI image layout, built without a container engine
# or registry; rebuilt only when its sources change.
images: examples/counter/image/index.json
examples/counter/image/index.json: $(filter-out %_test.go,$(wildcard examples/counter/*.go examples/counter/mkimage/*.go internal/image/*.go))
	go run ./examples/counter/mkimage -out examples/counter/image -tag latest

# One command to run Torpor on this machine (as root).
up: build runsc images
	$(BIN)/torpor up

test: build runsc images
	go test -count=1 -timeout 60m ./...

bench: build runsc images
	go test -run '^$$' -bench . -benchtime 2s ./...

clean:
	rm -rf $(BIN) examples/counter/image
