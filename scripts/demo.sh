#!/usr/bin/env bash
# The main job: snapshot a running guest lazily and restore it lazily into an
# empty guest whose vCPUs run at once, check the restored memory byte for byte
# against the snapshot instant, and report (bench/cycle.c, halite-cycle); then
# verify the snapshot file and show what is in it (halite-inspect).
#
#   scripts/demo.sh [--size MiB] [--codec lz4|zlib|zstd|none] [--keep DIR] [--build DIR]
#
# --keep DIR keeps the snapshot file in DIR/cycle/; --build DIR builds there
# (default: build/). Exit 0 when the restored memory is exact, 77 when the
# kernel lacks a userfaultfd feature, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=256
codec=lz4
keep=
build=$root/build
while [[ $# -gt 0 ]]; do
	case "$1" in
	--size|--codec|--keep|--build)
		[[ $# -ge 2 ]] || { echo "demo.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
	--size) size=$2; shift ;;
	--codec) codec=$2; shift ;;
	--keep) keep=$2; shift ;;
	--build) build=$2; shift ;;
	-h|--help) sed -n '2,11p' "$0"; exit 0 ;;
	*) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done

"$root/scripts/build.sh" "$build" >/dev/null
inspect=$build/tools/halite-inspect/halite-inspect
cycle=$build/bench/halite-cycle
work=${keep:-$(mktemp -d /tmp/halite-demo.XXXXXX)}
[[ -n $keep ]] || trap 'rm -rf "$work"' EXIT
# A directory of its own, so the one file in it is this run's.
mkdir -p "$work/cycle"
rm -f "$work"/cycle/halite-cycle-*.hlt

echo "== lazy save and lazy restore of a running guest ($size MiB, $codec)"
rc=0
"$cycle" --size "$size" --codec "$codec" --dir "$work/cycle" --keep || rc=$?
if [[ $rc -ne 0 ]]; then
	[[ $rc -eq 77 ]] && echo "demo.sh: skipped: the kernel lacks a userfaultfd feature" >&2
	exit "$rc"
fi
files=("$work"/cycle/halite-cycle-*.hlt)
file=${files[0]}

echo
echo "== the snapshot file"
"$inspect" verify "$file"
"$inspect" info "$file"
