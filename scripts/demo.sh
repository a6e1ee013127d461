#!/usr/bin/env bash
# The main job: boot the QEMU test guest (stock QEMU, TCG, 2 vCPUs, 512 MiB),
# save it lazily while it runs (halite-qemu save), restore it lazily into a
# new QEMU (halite-qemu restore), check from inside the guest that its memory
# digest equals the snapshot's and its verifier keeps passing, measure what a
# client sees (first answer, then 1000 page requests: mean, p99, max), print a
# short report (scripts/demo_qemu.py); then verify the snapshot file and show
# what is in it (halite-inspect).
#
#   scripts/demo.sh [--codec lz4|zlib|zstd|none] [--keep DIR] [--build DIR]
#   scripts/demo.sh --synthetic [--size MiB] [--codec C] [--keep DIR]
#
# --synthetic runs the same cycle on the in-process synthetic guest instead
# (halite-cycle, tools/halite-cycle/cycle.c), which also compares the
# restored memory byte for byte with a copy taken at the snapshot instant.
# --keep DIR keeps the snapshot file (and consoles) in DIR; --build DIR
# builds there (default: build/). Exit 0 when the check passes, 77 when the
# kernel lacks a userfaultfd feature, 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=256
codec=lz4
keep=
build=$root/build
synthetic=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	--size|--codec|--keep|--build)
		[[ $# -ge 2 ]] || { echo "demo.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
	--size) size=$2; shift ;;
	--codec) codec=$2; shift ;;
	--keep) keep=$2; shift ;;
	--build) build=$2; shift ;;
	--synthetic) synthetic=1 ;;
	-h|--help) sed -n '2,18p' "$0"; exit 0 ;;
	*) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done

"$root/scripts/build.sh" "$build" >/dev/null
inspect=$build/tools/halite-inspect/halite-inspect
if [[ $synthetic -eq 0 ]]; then
	"$root/scripts/make-guest.sh" >/dev/null
	work=${keep:-$(mktemp -d /tmp/halite-demo.XXXXXX)}
	[[ -n $keep ]] || trap 'rm -rf "$work"' EXIT
	echo "== lazy save and lazy restore of a running QEMU guest ($codec)"
	HALITE_QEMU_BIN=$build/tools/halite-qemu/halite-qemu \
		python3 "$root/scripts/demo_qemu.py" --keep "$work" --codec "$codec"
	echo
	echo "== the snapshot file"
	"$inspect" verify "$work/guest.hlt"
	"$inspect" info "$work/guest.hlt"
	exit 0
fi
cycle=$build/tools/halite-cycle/halite-cycle
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
