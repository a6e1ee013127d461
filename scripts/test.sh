#!/usr/bin/env bash
# The test command. On a fresh machine it installs what it needs, builds, and
# runs every test:
#   1. a normal (RelWithDebInfo) build: all CTest tests but the labels qemu
#      and seaweedfs (--s3's);
#   2. an ASan+UBSan build: all CTest tests, the qemu ones too, but seaweedfs
#      and bench (the benchmarks' JSON contracts, run in step 1);
#   3. the libFuzzer targets (scripts/fuzz.sh): the reader for
#      $HALITE_FUZZ_SECONDS (default 60) s, then the trace parser for half that.
# First it builds the QEMU test guest (scripts/make-guest.sh, with QEMU and
# the guest's packages): the qemu tests then must run, never skip.
#
#   scripts/test.sh                 everything above
#   scripts/test.sh --quick         the normal build, then only the tests labelled
#                                   quick (no root, QEMU, huge pages or network;
#                                   under 2 minutes); no guest image is built
#   scripts/test.sh --release       step 1 only (all tests of the normal build)
#   scripts/test.sh -L LABEL        step 1, one area (format, inspect, unit, fuzz, ...)
#   scripts/test.sh --tsan          the tests under ThreadSanitizer
#   scripts/test.sh --s3            the normal build, then the S3 tests against the second
#                                   store, SeaweedFS (label seaweedfs; built from source
#                                   with Go the first time: 7-11 minutes; docs/testing.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
mode=all
ctest_args=()
while [[ $# -gt 0 ]]; do
	case "$1" in
	--quick) mode=quick ;;
	--release) mode=release ;;
	--tsan) mode=tsan ;;
	--s3) mode=s3 ;;
	-L) mode=release; ctest_args+=(-L "$2"); shift ;;
	-h|--help) sed -n '2,20p' "$0"; exit 0 ;;
	*) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done

run_suite() { # name build-dir cmake-args...
	local name=$1 dir=$2
	shift 2
	echo "=== $name: build ($dir)"
	"$root/scripts/build.sh" "$dir" "$@"
	echo "=== $name: ctest"
	ctest --test-dir "$dir" --output-on-failure -j "$jobs" "${ctest_args[@]}" \
		"${ctest_extra[@]}"
}
ctest_extra=()

# The quick and s3 labels need no QEMU: no guest to build, and nothing to require.
if [[ $mode != quick && $mode != s3 ]]; then
	"$root/scripts/make-guest.sh" >/dev/null
	export HALITE_REQUIRE_QEMU=1
	# install-deps.sh installs the S3 store (radosgw): its tests must run, never skip.
	export HALITE_REQUIRE_S3=1
fi

case $mode in
quick)
	ctest_args+=(-L quick)
	run_suite release "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
	;;
release)
	run_suite release "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
	;;
s3)
	# The store must start: a skip would hide that the tests did not run.
	"$root/scripts/install-deps.sh" --object-store
	export HALITE_REQUIRE_SEAWEEDFS=1
	ctest_args+=(-L seaweedfs)
	run_suite release "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
	;;
tsan)
	run_suite tsan "$root/build-tsan" -DCMAKE_BUILD_TYPE=Debug -DHALITE_SANITIZE=thread
	;;
all)
	# The QEMU end-to-end cases run one at a time (RUN_SERIAL: each boots two
	# or three TCG guests), about 5 minutes a build: they run once, under
	# ASan+UBSan, where a memory error of halite-qemu or the engines shows.
	# The SeaweedFS tests are --s3's (CI runs it after this), the benchmarks'
	# contracts need no sanitizer: the command stays under 20 minutes.
	ctest_extra=(-LE "qemu|seaweedfs")
	run_suite release "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
	ctest_extra=(-LE "seaweedfs|bench")
	run_suite asan+ubsan "$root/build-asan" -DCMAKE_BUILD_TYPE=Debug \
		-DHALITE_SANITIZE=address,undefined
	echo "=== fuzz: reader ${HALITE_FUZZ_SECONDS:-60} s, trace parser half that"
	"$root/scripts/fuzz.sh" "${HALITE_FUZZ_SECONDS:-60}"
	;;
esac
