# SPDX-License-Identifier: MIT
# extract(import(x)) == x for every codec, MB size and LB size; counts exact.
. "$(dirname "$0")/lib.sh"

# Not a multiple of 2 or 4 pages: the last MB is short. The run of eight
# random pages holds an aligned 4-page block that cannot compress.
PAGES=333
gen --out "$T/img" --pages $PAGES --seed 7 --layout "rtmzrtzztmrrtzmrrrrrrrr" \
	--expect 1,2,4 >"$T/expect.json" || fail "generator"

for codec in none lz4 zlib zstd; do
	for mbp in 1 2 4; do
		for lb in 4K 64K 1M; do
			f="$T/snap-$codec-$mbp-$lb.hlt"
			case $lb in 4K) lbb=4096 ;; 64K) lbb=65536 ;; 1M) lbb=1048576 ;; esac
			if [ $((mbp * 4096)) -gt $lbb ]; then
				# A memory block must fit in a locality block.
				expect 2 "$HI" import "$T/img" --region ram -o "$f" --codec $codec \
					--mb-pages $mbp --lb-size $lb --page-size 4096
				[ -e "$f" ] && fail "$f left behind by a refused import"
				continue
			fi
			import_ "$T/img" --region ram -o "$f" --codec $codec --mb-pages $mbp \
				--lb-size $lb --page-size 4096

			expect 0 "$HI" info --json "$f"
			# One interpreter per file: python start-up dominates this test.
			"$PY" - "$T/out" "$T/expect.json" $codec $mbp $lbb $PAGES <<'PYEOF' ||
import json, sys
d = json.load(open(sys.argv[1]))
e = json.load(open(sys.argv[2]))[sys.argv[4]]
codec, mbp, lbb, pages = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
m = d["mbs"]
checks = [
    ("codec", d["codec"], codec),
    ("lb_size", d["lb_size"], lbb),
    ("mb_size", d["mb_size"], mbp * 4096),
    ("count", m["count"], e["count"]),
    ("count formula", m["count"], (pages + mbp - 1) // mbp),
    ("stored", m["stored"], e["stored"]),
    ("zero", m["zero"], e["zero"]),
    ("untouched", m["untouched"], e["untouched"]),
    ("regions", [(r["name"], r["length"], r["mb_count"]) for r in d["regions"]],
     [("ram", pages * 4096, e["count"])]),
    ("streams", [s["name"] for s in d["streams"]], ["physical"]),
]
if codec == "none":
    checks.append(("compressed", m["compressed"], 0))
else:
    # Text pages compress, random ones cannot: both kinds must show.
    checks.append(("some compressed", 0 < m["compressed"] < m["stored"], True))
bad = [f"{k}: got {g!r}, expected {w!r}" for k, g, w in checks if g != w]
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PYEOF
				fail "$codec/$mbp/$lb: info --json"

			expect 0 "$HI" verify "$f"
			expect 0 "$HI" extract "$f" --region ram -o "$T/out.img"
			cmp "$T/img" "$T/out.img" || fail "$codec/$mbp/$lb: extracted image differs"
			rm -f "$f" "$T/out.img"
		done
	done
done
echo PASS
