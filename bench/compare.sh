#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two revisions' benchmarks side by side, in the same run on the same machine,
# so a refactoring can be held to "no slower than before" (docs/bench-compare.md):
#
#   bench/compare.sh [options] [REV_A [REV_B]]      (defaults: fb645ef HEAD)
#
# Each revision is checked out into its own git worktree under a temporary
# directory and built there (RelWithDebInfo, ninja -j$(nproc), only the
# programs the benchmarks run). Then, RUNS times, every part runs once for A
# and once for B, interleaved (A, B, A, B, ...), so that a change in the
# machine's load lands on both alike:
#
#   fault    halite-bench fault --json: the engine's fault p50 and p99, per cache
#   micro    halite-bench micro --quick --json: restore overhead per method and
#            condition (the organisations and the peers)
#   clones   halite-bench clones --quick --json: ready p50/p95, bytes read and
#            PSS, independent restores and the clone service, fewest and most clones
#   save     halite-bench-save --json: the lazy save's fault p50 and p99
#   qemu     bench/qemu.py --quick --json (that revision's own script): the first
#            HTTP answer of a restored QEMU guest, per cache; needs root, QEMU
#            and a test guest (--image, else each build gets one from
#            scripts/make-guest.sh)
#
# Prints a table for people on stderr and one JSON object (each metric: A's
# median, B's median, the ratio B/A, the raw runs; the commands; errors) on
# stdout, or into --json FILE. Timings are never asserted: the exit code says
# only whether everything built and ran (0), something failed (1; its metrics
# are null, the rest still reported), or the usage was wrong (2).
#
#   --runs N       runs of each part for each revision (3)
#   --only LIST    these parts, comma-separated (fault,micro,clones,save,qemu)
#   --json FILE    write the JSON there instead of stdout
#   --image DIR    the QEMU test guest for both revisions (scripts/make-guest.sh's OUTDIR)
#   --dir DIR      where the temporary worktrees, builds and outputs go (/var/tmp)
#   --keep         keep that directory (its path is printed)
#
# A full run (3 runs, every part) takes about 30 minutes on a 2-core machine,
# builds included; about 15 without qemu (docs/bench-compare.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all_parts=fault,micro,clones,save,qemu
runs=3
only=$all_parts
json_out=
image=
base=/var/tmp
keep=0
revs=()
usage() { sed -n '3,39p' "$0"; }
while [[ $# -gt 0 ]]; do
	case "$1" in
	--runs|--only|--json|--image|--dir)
		[[ $# -ge 2 ]] || { echo "compare.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;&
	--runs) runs=$2; shift ;;
	--only) only=$2; shift ;;
	--json) json_out=$2; shift ;;
	--image) image=$2; shift ;;
	--dir) base=$2; shift ;;
	--keep) keep=1 ;;
	-h|--help) usage; exit 0 ;;
	-*) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) revs+=("$1") ;;
	esac
	shift
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --runs: a whole number >= 1" >&2; exit 2; }
[[ ${#revs[@]} -le 2 ]] || { echo "compare.sh: at most two revisions" >&2; exit 2; }
rev_a=${revs[0]:-fb645ef}
rev_b=${revs[1]:-HEAD}
IFS=, read -r -a parts <<<"$only"
[[ ${#parts[@]} -gt 0 ]] || { echo "compare.sh: --only: no part named" >&2; exit 2; }
for p in "${parts[@]}"; do
	[[ ,$all_parts, == *",$p,"* ]] ||
		{ echo "compare.sh: --only: unknown part '$p' ($all_parts)" >&2; exit 2; }
done
if [[ -n $image ]]; then
	image=$(cd "$image" && pwd) || { echo "compare.sh: --image: no such directory" >&2; exit 2; }
fi
sha_a=$(git -C "$root" rev-parse --verify --quiet "$rev_a^{commit}") ||
	{ echo "compare.sh: '$rev_a' is not a revision of this repository" >&2; exit 2; }
sha_b=$(git -C "$root" rev-parse --verify --quiet "$rev_b^{commit}") ||
	{ echo "compare.sh: '$rev_b' is not a revision of this repository" >&2; exit 2; }
has_part() { [[ " ${parts[*]} " == *" $1 "* ]]; }

start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
say() {
	local t=$(($(date +%s) - start))
	printf '== [%2d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*" >&2
}

mkdir -p "$base"
tmp=$(mktemp -d "$base/halite-compare.XXXXXX")
out=$tmp/out
mkdir -p "$out"
cleanup() {
	local side
	for side in a b; do
		if [[ -d $tmp/$side ]]; then
			git -C "$root" worktree remove --force "$tmp/$side" 2>/dev/null || true
		fi
	done
	if [[ $keep == 1 ]]; then
		say "kept $tmp (outputs in $out)"
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The programs the parts run, and no more: a whole tree with its tests takes
# several times as long to build.
targets=(halite-bench halite-bench-save halite-synth)
has_part qemu && targets+=(halite-qemu halite-inspect)

build_side() { # a|b sha
	local side=$1 sha=$2 src=$tmp/$1
	say "$side: worktree of ${sha:0:12} in $src"
	git -C "$root" worktree add --detach --quiet "$src" "$sha"
	say "$side: build (RelWithDebInfo, -j$(nproc))"
	cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		>"$out/build-$side.log" 2>&1 &&
		ninja -C "$src/build" -j "$(nproc)" "${targets[@]}" >>"$out/build-$side.log" 2>&1 ||
		{ say "$side: build failed, see $out/build-$side.log"; tail -n 20 "$out/build-$side.log" >&2;
		  return 1; }
	if has_part qemu && [[ -z $image ]]; then
		say "$side: test guest (scripts/make-guest.sh)"
		"$src/scripts/make-guest.sh" "$src/build/guest-image" >>"$out/build-$side.log" 2>&1 ||
			{ say "$side: make-guest.sh failed, see $out/build-$side.log"; return 1; }
	fi
}
build_side a "$sha_a"
build_side b "$sha_b"

failed=0
# run_part PART SIDE RUN: one benchmark, its JSON in out/PART-SIDE-RUN.json,
# its stderr in the .log beside it, its command and exit code in runs.tsv.
run_part() {
	local part=$1 side=$2 run=$3 src=$tmp/$2 rc=0 t0 cmd img
	local bin=$src/build/bench
	case $part in
	fault) cmd=("$bin/halite-bench" fault --json) ;;
	micro) cmd=("$bin/halite-bench" micro --quick --json) ;;
	clones) cmd=("$bin/halite-bench" clones --quick --json) ;;
	save) cmd=("$bin/halite-bench-save" --json) ;;
	qemu)
		img=${image:-$src/build/guest-image}
		cmd=(python3 "$src/bench/qemu.py" --quick --json --image "$img"
		     --halite-qemu "$src/build/tools/halite-qemu/halite-qemu"
		     --halite-inspect "$src/build/tools/halite-inspect/halite-inspect") ;;
	esac
	local file=$out/$part-$side-$run.json
	say "run $run/$runs: $part $side"
	t0=$(date +%s%N)
	# halite-synth moved from guest/ to testing/synth/: a revision has one of them.
	local synth=$src/build/testing/synth/halite-synth
	[[ -x $synth ]] || synth=$src/build/guest/halite-synth
	HALITE_SYNTH_BIN=$synth HALITE_REQUIRE_QEMU=1 \
		"${cmd[@]}" >"$file" 2>"${file%.json}.log" || rc=$?
	t0=$((($(date +%s%N) - t0) / 100000000))
	printf '%s\t%s\t%d\t%d\t%d.%d\t%s\n' "$part" "$side" "$run" "$rc" \
		$((t0 / 10)) $((t0 % 10)) "${cmd[*]}" >>"$out/runs.tsv"
	if [[ $rc != 0 ]]; then
		failed=1
		say "$part $side run $run: exit $rc ($(tail -n 1 "${file%.json}.log"))"
	fi
}

printf 'part\tside\trun\texit\tseconds\tcommand\n' >"$out/runs.tsv"
for ((run = 1; run <= runs; run++)); do
	for part in "${parts[@]}"; do
		run_part "$part" a "$run"
		run_part "$part" b "$run"
	done
done

say "summary"
rc=0
python3 - "$out" "$runs" "$rev_a" "$sha_a" "$rev_b" "$sha_b" "$only" "${json_out:--}" \
	"$load_start" <<'EOF' || rc=$?
import json, os, platform, statistics, sys

out, runs, rev_a, sha_a, rev_b, sha_b, only, json_out, load_start = sys.argv[1:]
runs = int(runs)
parts = only.split(",")


def load(part, side, run):
    try:
        with open(os.path.join(out, f"{part}-{side}-{run}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# Each part's metrics: (name, unit, value of one run's JSON or None).
def fault(d):
    for c in d.get("conditions", []):
        cond = c["cache"] + (f" +{c['read_latency_us']}us" if c.get("read_latency_us") else "")
        yield f"fault {cond} engine_fault_p50", "us", c.get("engine_fault_p50_us")
        yield f"fault {cond} engine_fault_p99", "us", c.get("engine_fault_p99_us")


def micro(d):
    for r in d.get("results", []):
        cond = f"{r.get('cache')} +{r.get('read_latency_us', 0)}us"
        yield f"micro {cond} {r.get('name')} restore_overhead", "s", r.get("restore_overhead_s")


def clones(d):
    res = d.get("results", [])
    counts = sorted({r["clones"] for r in res})
    keep = {counts[0], counts[-1]} if counts else set()
    for r in res:
        if r["clones"] not in keep:
            continue
        n = f"clones {r['mode']} x{r['clones']}"
        yield f"{n} ready_p50", "s", r.get("ready_p50_s")
        yield f"{n} ready_p95", "s", r.get("ready_p95_s")
        yield f"{n} bytes_read", "B", r.get("bytes_read")
        yield f"{n} pss", "B", r.get("pss_bytes")


def save(d):
    for r in d.get("results", []):
        if r.get("name") == "halite":
            yield "save halite fault_p50", "us", r.get("fault_p50_us")
            yield "save halite fault_p99", "us", r.get("fault_p99_us")


def qemu(d):
    for cache, s in (d.get("summary") or {}).items():
        for m in ("halite", "qemu-eager"):
            if isinstance(s.get(m), dict):
                yield f"qemu {cache} {m} first_http", "s", s[m].get("first_http_s_median")


extract = {"fault": fault, "micro": micro, "clones": clones, "save": save, "qemu": qemu}


def median(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


metrics, order, errors = {}, [], []
for part in parts:
    for side in ("a", "b"):
        for run in range(1, runs + 1):
            d = load(part, side, run)
            if d is None:
                errors.append(f"{part} {side} run {run}: no JSON (see {part}-{side}-{run}.log)")
                continue
            try:
                got = list(extract[part](d))
            except (KeyError, TypeError, AttributeError) as e:
                errors.append(f"{part} {side} run {run}: unexpected JSON ({e!r})")
                continue
            for name, unit, v in got:
                if name not in metrics:
                    metrics[name] = {"part": part, "unit": unit,
                                     "a_runs": [None] * runs, "b_runs": [None] * runs}
                    order.append(name)
                metrics[name][f"{side}_runs"][run - 1] = v

for m in metrics.values():
    a, b = median(m["a_runs"]), median(m["b_runs"])
    m["a_median"], m["b_median"] = a, b
    m["ratio"] = round(b / a, 3) if a and b is not None else None
    m["diff"] = round(b - a, 6) if a is not None and b is not None else None

result = {
    "a": {"rev": rev_a, "commit": sha_a},
    "b": {"rev": rev_b, "commit": sha_b},
    "runs": runs, "parts": parts, "order": "interleaved: each run, each part, A then B",
    "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                "loadavg_at_start": [float(x) for x in load_start.split()],
                "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
    "note": "ratio = B median / A median, diff = B median - A median; nothing is asserted",
    "metrics": {n: metrics[n] for n in order},
    "errors": errors,
}


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 1048576:.1f}M"
    return f"{v:.4g}"


w = max([len(n) for n in order] + [6])
lines = [f"A = {rev_a} ({sha_a[:12]}), B = {rev_b} ({sha_b[:12]}), medians of {runs} run(s)",
         f"{'metric':<{w}}  unit  {'A':>10}  {'B':>10}  {'B/A':>7}  {'B-A':>10}"]
for n in order:
    m = metrics[n]
    r = f"{m['ratio']:.3f}" if m["ratio"] is not None else "-"
    lines.append(f"{n:<{w}}  {m['unit']:<4}  {fmt(m['a_median'], m['unit']):>10}  "
                 f"{fmt(m['b_median'], m['unit']):>10}  {r:>7}  {fmt(m['diff'], m['unit']):>10}")
for e in errors:
    lines.append("error: " + e)
print("\n".join(lines), file=sys.stderr)

text = json.dumps(result, indent=2) + "\n"
if json_out == "-":
    sys.stdout.write(text)
else:
    with open(json_out, "w") as f:
        f.write(text)
sys.exit(1 if errors else 0)
EOF
[[ $rc == 0 ]] || failed=1
say "done in $(($(date +%s) - start)) s"
exit $failed
