#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the S3 object store the tests run (SeaweedFS's `weed`, built from
# source at a pinned version) as /usr/local/lib/halite/weed, root-owned, 0755.
# Safe to rerun: when the installed binary reports the pinned commit it only
# checks and exits. Progress goes to stderr.
#
#   scripts/install-object-store.sh             install if missing or another version
#   scripts/install-object-store.sh --check     exit 0 if installed at the pinned version, 1 if not
#   scripts/install-object-store.sh --print-path print where `weed` goes (or is)
#
# Needs a Go toolchain (`go` on PATH, 1.21 or later: older ones cannot fetch
# the toolchain SeaweedFS's go.mod asks for) and the Go module proxy.
# Environment: HALITE_WEED_PREFIX overrides /usr/local/lib/halite (tests).
set -euo pipefail

# The module and its commit. SeaweedFS's go.mod has a replace directive, so
# `go install module/weed@version` refuses it: the build runs inside the
# module's own directory, where go.mod is the main module's.
module=github.com/seaweedfs/seaweedfs
version=v0.0.0-20261109003541-7506e5f91cd6
commit=${version##*-}

prefix=${HALITE_WEED_PREFIX:-/usr/local/lib/halite}
weed=$prefix/weed

say() { echo "install-object-store: $*" >&2; }
die() { say "$*"; exit 1; }

# Whether binary $1 says it is the pinned commit. Its output is taken whole
# (no grep -q): under pipefail an early exit would kill weed with SIGPIPE.
reports_commit() {
	local v
	v=$("$1" version 2>/dev/null) || return 1
	[[ $v == *" $commit "* ]]
}

installed() {
	[[ -x $weed ]] && reports_commit "$weed"
}

case "${1:-}" in
"") ;;
--check) installed; exit ;;
--print-path) echo "$weed"; exit 0 ;;
-h|--help) sed -n '3,14p' "$0"; exit 0 ;;
*) echo "usage: $0 [--check|--print-path]" >&2; exit 2 ;;
esac

if installed; then
	say "$weed is at $commit already"
	exit 0
fi

command -v go >/dev/null ||
	die "no 'go' on PATH: building $module needs Go 1.21 or later (Debian bookworm's golang-go, 1.19, is too old)"

# Root owns the default place; a HALITE_WEED_PREFIX of one's own needs no sudo.
SUDO=
owner=(-o root -g root)
if [[ -n ${HALITE_WEED_PREFIX:-} ]]; then
	owner=()
elif [[ $(id -u) -ne 0 ]]; then
	SUDO=sudo
fi

# A private GOPATH and caches, removed at the end: the build fills about 2 GB
# of modules and 1.5 GB of build cache that nothing else here needs, and a
# fresh cache makes every install pay (and measure) the same.
work=$(mktemp -d "${TMPDIR:-/tmp}/halite-weed.XXXXXX")
cleanup() {
	# The module cache is read-only by design; go clean knows how to remove it.
	GOMODCACHE=$work/mod go clean -modcache 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
export GOPATH=$work/gopath GOMODCACHE=$work/mod GOCACHE=$work/cache
# go.mod names the Go it needs; a local toolchain older than that fetches it
# from the module proxy instead of failing.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
# A static binary with no cgo: nothing to link against at run time, and no C
# compiler in the build.
export CGO_ENABLED=0

t0=$SECONDS
say "downloading $module@$version and its dependencies"
dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n $dir && -f $dir/go.mod ]] || die "go mod download $module@$version gave no module directory"
# Only the modules the weed program imports (go list loads them), not all
# that go.mod lists for SeaweedFS's other programs and tests. Go names each
# of the ~250 it fetches: that goes to a log, shown only if it fails.
if ! (cd "$dir" && go list -deps ./weed >/dev/null 2>"$work/download.log"); then
	tail -n 20 "$work/download.log" >&2
	die "downloading the dependencies of $module/weed failed"
fi
t1=$SECONDS
say "downloaded in $((t1 - t0)) s; compiling weed (several minutes)"
# -trimpath and -s -w: no build paths or symbol tables in the binary; the
# commit in `weed version` is what the check above looks for.
(cd "$dir" && go build -trimpath \
	-ldflags "-s -w -X $module/weed/util/version.COMMIT=$commit" \
	-o "$work/weed" ./weed) || die "building $module/weed failed"
t2=$SECONDS
say "compiled in $((t2 - t1)) s"

reports_commit "$work/weed" || die "the built weed does not report commit $commit"
$SUDO install -d -m 0755 "$prefix"
$SUDO install -m 0755 "${owner[@]}" "$work/weed" "$weed"
say "installed $weed ($commit) in $((SECONDS - t0)) s"
