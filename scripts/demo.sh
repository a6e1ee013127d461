#!/usr/bin/env bash
# The main job, until the restore engine lands: build a guest-like memory
# image, write it as a Halite snapshot in two layouts, verify it, extract it
# back, and report; then save a running synthetic guest lazily, beside plain
# copy-on-write, and report that.
#
#   scripts/demo.sh [--size MiB] [--codec lz4|zlib|zstd|none] [--keep DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=256
codec=lz4
keep=
while [[ $# -gt 0 ]]; do
	case "$1" in
	--size) size=$2; shift ;;
	--codec) codec=$2; shift ;;
	--keep) keep=$2; shift ;;
	-h|--help) sed -n '2,7p' "$0"; exit 0 ;;
	*) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done

"$root/scripts/build.sh" "$root/build" >/dev/null
inspect=$root/build/tools/halite-inspect/halite-inspect
work=${keep:-$(mktemp -d /tmp/halite-demo.XXXXXX)}
mkdir -p "$work"
[[ -n $keep ]] || trap 'rm -rf "$work"' EXIT

echo "== guest image: $size MiB (holes, zero pages, code, text, random data)"
python3 "$root/scripts/make-image.py" --size "$size" --seed 1 -o "$work/guest.img"

ms() { date +%s%N; }
t0=$(ms)
"$inspect" import "$work/guest.img" --region pc.ram --codec "$codec" --order physical \
	-o "$work/physical.hlt"
t1=$(ms)
"$inspect" import "$work/guest.img" --region pc.ram --codec "$codec" --order random --seed 7 \
	-o "$work/random.hlt"
t2=$(ms)
"$inspect" verify "$work/physical.hlt"
t3=$(ms)
"$inspect" extract "$work/physical.hlt" --region pc.ram -o "$work/extracted.img"
t4=$(ms)
cmp "$work/guest.img" "$work/extracted.img"
echo "extract == original: yes (cmp)"
echo
"$inspect" info "$work/physical.hlt"
echo
"$inspect" info --json "$work/physical.hlt" > "$work/info.json"
python3 - "$work/info.json" "$size" $(( (t1 - t0) / 1000000 )) $(( (t2 - t1) / 1000000 )) \
	$(( (t3 - t2) / 1000000 )) $(( (t4 - t3) / 1000000 )) <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
size, imp, imp_rand, ver, ext = int(sys.argv[2]), *map(int, sys.argv[3:7])
m, lbs = info["mbs"], info["lbs"]
print("== report")
print(f"  memory            {size} MiB in {m['count']} memory blocks of {info['mb_size']} bytes")
print(f"  stored/zero/never {m['stored']} / {m['zero']} / {m['untouched']} "
      f"({m['stored_pct']:.1f}% / {m['zero_pct']:.1f}% / {m['untouched_pct']:.1f}%)")
print(f"  file size         {info['file_size'] / 2**20:.1f} MiB "
      f"({info['file_memory_ratio'] * 100:.1f}% of memory)")
print(f"  compression       {m['compression_ratio']:.2f}x on stored blocks ({info['codec']})")
print(f"  locality blocks   {lbs['count']} of {info['lb_size'] // 1024} KiB, "
      f"mean fill {lbs['fill_mean_pct']:.1f}%")
print(f"  import            {imp} ms physical order, {imp_rand} ms random order")
print(f"  verify            {ver} ms; extract {ext} ms, byte-identical to the image")
PY

echo
echo "== lazy save of a running guest (synthetic guest, 128 MiB, 2 vCPUs, real page tables)"
"$root/build/bench/halite-bench-save" --quick --dir "$work" > "$work/save.json" 2> "$work/save.log" ||
	{ cat "$work/save.log" >&2; exit 1; }
python3 - "$work/save.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = {"halite": "halite (copy-on-access)", "cow-wp-physical": "plain copy-on-write"}
print(f"  {'':26} {'pause+arm':>10} {'fault p50':>10} {'fault p99':>10} {'save':>7} "
      f"{'guest slowdown':>15} {'file':>9} {'content':>8}")
for r in d["results"]:
    print(f"  {names.get(r['name'], r['name']):26} {r['pause_to_arm_us'] / 1000:8.2f}ms "
          f"{r['fault_p50_us']:8.1f}us {r['fault_p99_us']:8.1f}us {r['save_s']:6.2f}s "
          f"{r['slowdown_pct']:14.1f}% {r['file_bytes'] / 2**20:7.1f}Mi "
          f"{'exact' if r['content_ok'] else 'WRONG':>8}")
if not all(r["content_ok"] for r in d["results"]):
    sys.exit("a saved file does not match the snapshot")
PY
