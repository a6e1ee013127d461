#!/usr/bin/env bash
# Fuzz the snapshot reader with libFuzzer for a while.
#
#   scripts/fuzz.sh [SECONDS] [LIBFUZZER_ARGS...]     (default 60 seconds)
#
# Builds the clang + ASan + UBSan libFuzzer build in build-fuzz/ (or
# $HALITE_FUZZ_BUILD), then runs tests/fuzz/fuzz_reader over a scratch copy of
# the committed corpus tests/fuzz/corpus/reader/, which it never modifies.
# Exits non-zero when the fuzzer finds a crash, a leak, a sanitizer report, a
# timeout or an oversized allocation; the input is saved in
# build-fuzz/fuzz-artifacts/. To keep a fixed crasher as a regression input:
#
#   cp build-fuzz/fuzz-artifacts/crash-<sha1> tests/fuzz/corpus/reader/
#
# To fold new coverage into the committed corpus (keep it small, < 2 MB):
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
corpus=$root/tests/fuzz/corpus/reader

# The whole project with clang, so the library is instrumented for coverage
# too (tests/fuzz/CMakeLists.txt). Warnings are not errors here: this build
# hunts crashes, the gcc and clang CI builds hunt warnings.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo -DHALITE_FUZZ=ON \
	-DHALITE_SANITIZE=address,undefined -DHALITE_WERROR=OFF >/dev/null
ninja -C "$build" fuzz_reader

work=$(mktemp -d "${TMPDIR:-/tmp}/halite-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -R "$corpus/." "$work/"
mkdir -p "$build/fuzz-artifacts"

# -malloc_limit_mb: every allocation the reader makes is bounded by the input's
# size, so anything near this is a bug, not a big input.
"$build/tests/fuzz/fuzz_reader" \
	-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
	-print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/" \
	"$@" "$work"
