#!/bin/sh
# Builds runsc from the pinned gVisor source with its seccomp programs
# compiled at build time (see gen.go), static (CGO_ENABLED=0).
#
#   build.sh VERSION OUT     write runsc to OUT
#   build.sh VERSION -check  generate the programs twice, in two copies of the
#                            source, and fail unless both are byte for byte
#                            the same
#
# The generator runs as PID 1 of a new PID namespace (unshare): see gen.go
# for why. Go's build cache makes a second build cheap; the
# generation itself takes about a minute on two cores.
set -eu

version=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
src=$(go mod download -json "gvisor.dev/gvisor@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ]; then
	echo "build.sh: gvisor.dev/gvisor@$version: no source directory" >&2
	exit 1
fi
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT

# generate DIR: a writable copy of the pinned source in DIR, its
# filter_precompiled.go files filled in.
generate() {
	cp -R "$src" "$1"
	chmod -R u+w "$1"
	mkdir "$1/torpor_seccompgen"
	cp "$here/gen.go" "$1/torpor_seccompgen/gen.go"
	(cd "$1" && CGO_ENABLED=0 go build -o "$work/gen" ./torpor_seccompgen/gen.go)
	# Without root, a user namespace grants the PID namespace.
	if [ "$(id -u)" = 0 ]; then
		unshare --pid --fork "$work/gen" -root "$1"
	else
		unshare --user --map-root-user --pid --fork "$work/gen" -root "$1"
	fi
	rm -r "$1/torpor_seccompgen"
}

generate "$work/a"
if [ "$out" = -check ]; then
	generate "$work/b"
	for f in runsc/boot/filter/filter_precompiled.go runsc/fsgofer/filter/filter_precompiled.go; do
		cmp "$work/a/$f" "$work/b/$f"
	done
	echo "build.sh: the precompiled seccomp programs of gvisor.dev/gvisor@$version are the same in two generations"
	exit 0
fi
# -trimpath: the binary must not depend on where the copy was made.
mkdir -p "$(dirname "$out")"
(cd "$work/a" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out.tmp" ./runsc)
mv "$out.tmp" "$out"
