#!/usr/bin/env bash
# The benchmarks of issues 3, 5, 14, 15 and 17, one after the other, each one's JSON saved in DIR, then
# the paper's figures and a summary drawn from them (bench/plot.py):
#
#   save.json           halite-bench-save --json: the lazy save against the
#                       copy-on-write peer in the same run (fault p50/p99/max,
#                       guest slowdown; issues 3 and 15)
#   micro.json          halite-bench micro --json: Figure 2, Table 1
#   compress-P.json     halite-bench micro --json --only locality,halite
#                       --compress P for P = 10 30 50 70 90, cold cache,
#                       1 ms per read, no VM access runs: Figure 4
#   trace-NAME.json     halite-bench micro --json --trace NAME.trace for every
#                       real program's trace in bench/traces/ (NAME.trace.xz,
#                       decompressed into DIR/traces/): Figure 2 and Table 1
#                       on real programs (issue 15)
#   fio.json            bench/fio.sh: this machine's random-read limits
#   fault.json          halite-bench fault --json, if this build has it
#   clones.json         halite-bench clones --json: the clone service against
#                       N independent restores, N = 1, 2, 4, 8, 16 (issue 14)
#   clones-qemu.json    bench/clones_qemu.py --json: the same for N clones of
#                       the QEMU test guest, N = 1, 2, 4 (--quick: 1, 2);
#                       skipped with a message without QEMU, the test guest
#                       (scripts/make-guest.sh) or root
#   save-qemu.json      bench/save_qemu.py --json: the QEMU test guest's
#                       slowdown while halite-qemu saves it, against no save
#                       (issue 15); skipped as clones-qemu.json is
#   open.json           halite-bench-open --json: open to guest running at 1, 4,
#                       16, 64 GiB (--quick: 1, 4), format 1.0 against 1.1
#                       (issue 15 part 4); files in /var/tmp, removed after
#   qemu.json           bench/qemu.py --json: halite-qemu's lazy restore of the
#                       test guest against QEMU's eager one: first answer to a
#                       client, then 1000 page requests (--quick: one run of
#                       each, else 3); skipped as clones-qemu.json is
#   qemu-learn.json     bench/qemu.py --learn --json: the learning loop (issue
#                       17): a learning restore, the file relayouted from it,
#                       then restores of both at 0 and 1 ms per read, cold
#                       (--quick: one run of each, else 3); skipped as
#                       clones-qemu.json is
#   runs.tsv            file, exit code, seconds, command, for each of them
#   *.log               each command's stderr (progress)
#   fig2-overhead.svg, table1.md, fig4-compress.svg, fig2-trace-NAME.svg,
#   table-traces.md, summary.md
#
#   bench/run.sh [--quick] [--out DIR] [--build DIR]
#
# Builds first (scripts/build.sh, which installs what is missing), into
# --build DIR or $BUILD (default: build/). --out: default bench-results/.
# --quick: the benches' reduced runs (128 MiB guest), about 2 minutes on a
# 2-core machine; the full run takes about 40 minutes.
# Exit 0 when every command succeeded, 77 when userfaultfd is unavailable,
# 1 otherwise (the JSON of a run that failed a check is still saved and drawn).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quick=0
out=$root/bench-results
build=${BUILD:-$root/build}
while [[ $# -gt 0 ]]; do
	case "$1" in
	--out|--build)
		[[ $# -ge 2 ]] || { echo "run.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
	--quick) quick=1 ;;
	--out) out=$2; shift ;;
	--build) build=$2; shift ;;
	-h|--help) sed -n '2,51p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done

start=$(date +%s)
say() {
	local t=$(($(date +%s) - start))
	printf '== [%2d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*" >&2
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(mkdir -p "$build" && cd "$build" && pwd)
# Commands are run from the top of the repository and recorded with paths
# relative to it where they are inside it, so summary.md shows them as typed.
cd "$root"
rel() { local p=$1; [[ $p == "$root"/* ]] && p=${p#"$root"/}; printf '%s' "$p"; }
bench=$(rel "$build")/bench/halite-bench
dir=$(rel "$out")

say "build ($(rel "$build"))"
"$root/scripts/build.sh" "$build" >/dev/null

# This run's files only: a fault.json left from an earlier run must not be
# taken for this one's.
rm -f "$out"/save.json "$out"/micro.json "$out"/compress-*.json "$out"/fio.json "$out"/fault.json "$out"/clones.json \
	"$out"/clones-qemu.json "$out"/qemu.json "$out"/trace-*.json "$out"/fig2-trace-*.svg "$out"/table-traces.md \
	"$out"/open.json "$out"/save-qemu.json \
	"$out"/*.log "$out"/runs.tsv "$out"/fig2-overhead.svg "$out"/fig4-compress.svg \
	"$out"/table1.md "$out"/summary.md
printf '# file\texit\tseconds\tcommand\n' >"$out/runs.tsv"

failed=0
skipped=0
# run FILE COMMAND...: stdout to DIR/FILE, stderr to the terminal and DIR/FILE.log.
run() {
	local file=$1 rc=0 t0 t1
	shift
	say "$* > $dir/$file"
	t0=$(date +%s%N)
	"$@" >"$out/$file" 2> >(tee "$out/${file%.json}.log" >&2) || rc=$?
	t1=$(( ($(date +%s%N) - t0) / 100000000 ))
	printf '%s\t%d\t%d.%d\t%s\n' "$file" "$rc" $((t1 / 10)) $((t1 % 10)) "$*" \
		>>"$out/runs.tsv"
	case $rc in
	0) ;;
	77) skipped=1; say "$file: skipped (exit 77)" ;;
	*) failed=1; say "$file: exit $rc (kept; plot.py says what it can)" ;;
	esac
	return 0
}

q=()
[[ $quick == 1 ]] && q=(--quick)

# (a0) The lazy save against plain copy-on-write, in the same run.
run save.json "$(rel "$build")/bench/halite-bench-save" --json "${q[@]}"

# (a) The microbenchmark: Figure 2 and Table 1.
run micro.json "$bench" micro --json "${q[@]}"

# (b) Figure 4: uncompressed locality blocks against halite across
# compressibility, at one storage condition.
if [[ $skipped == 0 ]]; then
	for p in 10 30 50 70 90; do
		run "compress-$p.json" "$bench" micro --json "${q[@]}" --only locality,halite \
			--compress "$p" --cache cold --latency 1000 --no-track
	done
fi

# (b2) Real programs' access traces (bench/traces/, docs/trace-format.md):
# every organisation and peer as in (a), the workload the program's recorded
# accesses, saved at the trace's midpoint.
if [[ $skipped == 0 ]]; then
	mkdir -p "$out/traces"
	for t in bench/traces/*.trace.xz; do
		[[ -e $t ]] || continue
		name=$(basename "$t" .trace.xz)
		xz -dc "$t" >"$out/traces/$name.trace"
		run "trace-$name.json" "$bench" micro --json "${q[@]}" --trace "$dir/traces/$name.trace"
	done
fi

# (c) This machine's random-read limits, on the storage the benches use
# (halite-bench micro's --dir default), not in DIR, which may be a tmpfs.
run fio.json bench/fio.sh /var/tmp "${q[@]}"

# (d) The cost of one fault from storage against those limits, if built.
if "$bench" fault --help >/dev/null 2>&1; then
	fq=()
	"$bench" fault --help 2>&1 | grep -q -- '--quick' && fq=("${q[@]}")
	run fault.json "$bench" fault --json "${fq[@]}"
else
	say "halite-bench fault: not in this build, skipped"
	rm -f "$out/fault.json"
fi

# (e) Many clones of one snapshot: the clone service against independent restores.
run clones.json "$bench" clones --json "${q[@]}"

# (e2) Open to guest running against memory size, format 1.0 against 1.1.
run open.json "$(rel "$build")/bench/halite-bench-open" --json "${q[@]}"

# Can the QEMU test guest run here? If not, say why FILE is skipped and fail.
# (The QEMU benches' own exit 77 would read as "no userfaultfd" below, so
# this is checked first.)
qemu_ready() {
	if ! command -v qemu-system-x86_64 >/dev/null; then
		say "$1: skipped, qemu-system-x86_64 not installed (scripts/install-deps.sh --guest)"
	elif [[ ! -e $build/guest-image/initrd.img || ! -e $build/guest-image/append ]]; then
		say "$1: skipped, no test guest in $(rel "$build")/guest-image (scripts/make-guest.sh)"
	elif [[ $(id -u) != 0 ]]; then
		say "$1: skipped, needs root (halite-qemu ptraces QEMU)"
	else
		return 0
	fi
	return 1
}

# (f) The same with QEMU clones of the test guest, when it can run here.
if qemu_ready clones-qemu.json; then
	HALITE_QEMU_BIN=$build/tools/halite-qemu/halite-qemu \
		HALITE_CLONED_BIN=$build/tools/halite-cloned/halite-cloned \
		run clones-qemu.json python3 bench/clones_qemu.py --json "${q[@]}" \
		--image "$(rel "$build")/guest-image"
fi

# (g) The QEMU test guest's own slowdown while it is saved (issue 15).
if qemu_ready save-qemu.json; then
	HALITE_QEMU_BIN=$build/tools/halite-qemu/halite-qemu \
		run save-qemu.json python3 bench/save_qemu.py --json "${q[@]}" \
		--image "$(rel "$build")/guest-image"
fi

# (h) A client of the restored QEMU guest: lazy against QEMU's eager restore
# (issue 15).
if qemu_ready qemu.json; then
	HALITE_QEMU_BIN=$build/tools/halite-qemu/halite-qemu \
		HALITE_INSPECT_BIN=$build/tools/halite-inspect/halite-inspect \
		run qemu.json python3 bench/qemu.py --json "${q[@]}" \
		--image "$(rel "$build")/guest-image"
fi

# (i) The learning loop on the same guest: a file relayouted from one learning
# restore against the original (issue 17).
if qemu_ready qemu-learn.json; then
	HALITE_QEMU_BIN=$build/tools/halite-qemu/halite-qemu \
		HALITE_INSPECT_BIN=$build/tools/halite-inspect/halite-inspect \
		run qemu-learn.json python3 bench/qemu.py --learn --json "${q[@]}" \
		--image "$(rel "$build")/guest-image"
fi

say "plot"
python3 bench/plot.py "$out" >/dev/null
say "done in $(($(date +%s) - start)) s: $dir/summary.md"
ls -1 "$out"/*.svg "$out"/*.md >&2 2>/dev/null || true
if [[ $skipped == 1 ]]; then
	exit 77
fi
exit $failed
