#!/usr/bin/env bash
# Fuzz the snapshot reader and the restore trace parser with libFuzzer for a while.
#
#   scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]     (default 60 seconds)
#
# Builds the clang + ASan + UBSan libFuzzer build in build-fuzz/ (or
# $HALITE_FUZZ_BUILD), then runs, one after the other, each over a scratch
# copy of its committed corpus, which it never modifies:
#   tests/fuzz/fuzz_reader  SECONDS     over tests/fuzz/corpus/reader/
#   tests/fuzz/fuzz_trace   SECONDS/2   over tests/fuzz/corpus/trace/
# (the trace parser is small and its inputs short: half the time covers it).
# LIBFUZZER_ARGS go to both. Exits non-zero when either fuzzer finds a crash,
# a leak, a sanitizer report, a broken promise, a timeout or an oversized
# allocation; the input is saved in build-fuzz/fuzz-artifacts/TARGET/. To
# keep a fixed crasher as a regression input:
#
#   cp build-fuzz/fuzz-artifacts/reader/crash-<sha1> tests/fuzz/corpus/reader/
#   cp build-fuzz/fuzz-artifacts/trace/crash-<sha1> tests/fuzz/corpus/trace/
#
# To fold new coverage into a committed corpus (keep it small: reader < 2 MB,
# trace < 200 KB):
#
#   mkdir new && build-fuzz/tests/fuzz/fuzz_reader -merge=1 new tests/fuzz/corpus/reader FINDS
#
# Needs clang and libclang-rt-14-dev (scripts/install-deps.sh).
set -euo pipefail

secs=${1:-60}
[[ $# -gt 0 ]] && shift
if ! [[ $secs =~ ^[0-9]+$ ]]; then
	echo "usage: $0 [SECONDS] [LIBFUZZER_ARGS...]" >&2
	exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HALITE_FUZZ_BUILD:-$root/build-fuzz}

# The whole project with clang, so the library is instrumented for coverage
# too (tests/fuzz/CMakeLists.txt). Warnings are not errors here: this build
# hunts crashes, the gcc and clang CI builds hunt warnings.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHALITE_FUZZ=ON \
	-DHALITE_SANITIZE=address,undefined -DHALITE_WERROR=OFF >/dev/null
ninja -C "$build" fuzz_reader fuzz_trace

work=$(mktemp -d "${TMPDIR:-/tmp}/halite-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run TARGET SECONDS [TARGET_ARGS...]: the target over a copy of corpus/TARGET.
run() {
	local target=$1 t=$2
	shift 2
	echo "=== fuzz_$target, $t s"
	mkdir -p "$work/$target" "$build/fuzz-artifacts/$target"
	cp -R "$root/tests/fuzz/corpus/$target/." "$work/$target/"
	# -malloc_limit_mb: every allocation the code under test makes is bounded
	# by the input's size, so anything near this is a bug, not a big input.
	"$build/tests/fuzz/fuzz_$target" \
		-max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
		-print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$target/" \
		"$@" "$work/$target"
}

# Both run even when the first finds something: one report per run.
status=0
run reader "$secs" "$@" || status=1
# -max_len: the corpus's traces are under 1 KiB, libFuzzer's default would
# keep inputs that short and never reach the 4096-byte line limit.
run trace $(((secs + 1) / 2)) -max_len=16384 "$@" || status=1
exit $status
