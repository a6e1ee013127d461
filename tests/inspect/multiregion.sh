# SPDX-License-Identifier: MIT
# Three regions (one page; not a multiple of the MB size; large) in physical
# and seeded random order; the same seed gives the same file.
. "$(dirname "$0")/lib.sh"

gen --out "$T/a.img" --pages 1 --seed 1 --layout t || fail generator
gen --out "$T/b.img" --pages 37 --seed 2 --layout "rtzmt" --expect 4 >"$T/b.json" || fail generator
gen --out "$T/c.img" --pages 300 --seed 3 --mix "r=1,t=2,m=1,z=1" --expect 4 >"$T/c.json" ||
	fail generator

REGS=(--region "lowmem=$T/a.img@0x1000" --region "odd=$T/b.img" --region "pc.ram=$T/c.img@0x100000000")
COMMON=(--mb-pages 4 --lb-size 64K --codec zstd)

check_regions() {
	local f=$1
	expect 0 "$HI" info --json "$f"
	cp "$T/out" "$T/i.json"
	is_json "$T/i.json"
	eq "region names" "$(js "$T/i.json" '[r["name"] for r in d["regions"]]')" \
		"['lowmem', 'odd', 'pc.ram']"
	# "odd" follows "lowmem" directly when it has no @GPA.
	eq "gpas" "$(js "$T/i.json" '[r["gpa"] for r in d["regions"]]')" \
		"[4096, 8192, 4294967296]"
	eq "lengths" "$(js "$T/i.json" '[r["length"] for r in d["regions"]]')" \
		"[4096, 151552, 1228800]"
	# ceil(1/4), ceil(37/4), ceil(300/4)
	eq "mb counts" "$(js "$T/i.json" '[r["mb_count"] for r in d["regions"]]')" "[1, 10, 75]"
	eq "first mbs" "$(js "$T/i.json" '[r["first_mb"] for r in d["regions"]]')" "[0, 1, 11]"
	eq "total" "$(js "$T/i.json" 'd["mbs"]["count"]')" 86
	eq "sum of states" "$(js "$T/i.json" 'd["mbs"]["stored"] + d["mbs"]["zero"] + d["mbs"]["untouched"]')" 86
	eq "zero blocks" "$(js "$T/i.json" 'd["mbs"]["zero"]')" \
		$(($(js "$T/b.json" 'd["4"]["zero"]') + $(js "$T/c.json" 'd["4"]["zero"]')))
	eq "untouched" "$(js "$T/i.json" 'd["mbs"]["untouched"]')" 0

	for r in lowmem:a odd:b pc.ram:c; do
		expect 0 "$HI" extract "$f" --region "${r%%:*}" -o "$T/x.img"
		cmp "$T/${r##*:}.img" "$T/x.img" || fail "$f: region ${r%%:*} differs"
	done
	expect 0 "$HI" verify "$f"
}

# Physical order.
import_ "${REGS[@]}" "${COMMON[@]}" -o "$T/phys.hlt"
check_regions "$T/phys.hlt"
eq "physical stream" "$(js "$T/i.json" '[s["name"] for s in d["streams"]]')" "['physical']"
eq "physical metadata" "$(js "$T/i.json" 'sorted(d["metadata"].items())')" \
	"[('import.order', 'physical'), ('source', 'import')]"

# Random order with a seed: other stream, seed recorded.
import_ "${REGS[@]}" "${COMMON[@]}" --order random --seed 42 -o "$T/r1.hlt"
check_regions "$T/r1.hlt"
eq "random stream" "$(js "$T/i.json" '[s["name"] for s in d["streams"]]')" "['other']"
eq "random metadata" "$(js "$T/i.json" 'sorted(d["metadata"].items())')" \
	"[('import.order', 'random'), ('import.seed', '42'), ('source', 'import')]"

# Physical order puts MB n before MB n+1; a shuffle does not.
expect 0 "$HI" map --json "$T/phys.hlt"
cp "$T/out" "$T/map-phys.json"
expect 0 "$HI" map --json "$T/r1.hlt"
cp "$T/out" "$T/map-r1.json"
is_json "$T/map-r1.json"
P='[(m["lb"], m["lb_offset"]) for m in d["mbs"] if m["state"] == "stored"]'
eq "physical order sorted" "$(js "$T/map-phys.json" "$P == sorted($P)")" True
eq "random order shuffled" "$(js "$T/map-r1.json" "$P == sorted($P)")" False

# Same seed, other thread count: the same layout, the same LB bytes.
expect 0 "$HI" import --no-sync -j 1 "${REGS[@]}" "${COMMON[@]}" --order random --seed 42 \
	-o "$T/r2.hlt"
expect 0 "$HI" map --json "$T/r2.hlt"
cmp "$T/map-r1.json" <(sed "s|r2.hlt|r1.hlt|" "$T/out") || fail "same seed, different map"
expect 0 "$HI" blocks --json "$T/r1.hlt"
js "$T/out" '[(b["offset"], b["stream"], b["seq"], b["used"], b["mbs"]) for b in d["lbs"]]' >"$T/b1"
expect 0 "$HI" blocks --json "$T/r2.hlt"
js "$T/out" '[(b["offset"], b["stream"], b["seq"], b["used"], b["mbs"]) for b in d["lbs"]]' >"$T/b2"
cmp "$T/b1" "$T/b2" || fail "same seed, different blocks"
do=$(js "$T/i.json" 'd["data_offset"]')
n=$(( $(js "$T/i.json" 'd["lbs"]["count"]') * 65536 ))
cmp <(tail -c +$((do + 1)) "$T/r1.hlt" | head -c $n) <(tail -c +$((do + 1)) "$T/r2.hlt" | head -c $n) ||
	fail "same seed, different locality-block bytes"

# No seed: one is chosen, printed, and reproduces the file.
import_ "${REGS[@]}" "${COMMON[@]}" --order random -o "$T/r3.hlt"
seed=$(sed -n 's/.*--seed \([0-9][0-9]*\).*/\1/p' "$T/err")
[ -n "$seed" ] || fail "no seed printed: $(cat "$T/err")"
import_ "${REGS[@]}" "${COMMON[@]}" --order random --seed "$seed" -o "$T/r4.hlt"
expect 0 "$HI" map --json "$T/r3.hlt"
sed "s|r3.hlt|X|" "$T/out" >"$T/m3"
expect 0 "$HI" map --json "$T/r4.hlt"
sed "s|r4.hlt|X|" "$T/out" >"$T/m4"
cmp "$T/m3" "$T/m4" || fail "printed seed $seed does not reproduce the order"

# map --region lists exactly that region's blocks.
expect 0 "$HI" map --json --region odd "$T/phys.hlt"
is_json "$T/out"
eq "map --region" "$(js "$T/out" '[(m["mb"], m["region"]) for m in d["mbs"]] == [(i, "odd") for i in range(1, 11)]')" True
expect 0 "$HI" map --region odd "$T/phys.hlt"
eq "map --region rows" "$(wc -l <"$T/out")" 11
expect 2 "$HI" map --region nosuch "$T/phys.hlt"
expect 2 "$HI" extract "$T/phys.hlt" --region nosuch -o "$T/x.img"
expect 2 "$HI" extract "$T/phys.hlt" -o "$T/x.img"	# 3 regions: which one?

# Multi-region spec errors.
expect 2 "$HI" import "$T/a.img" --region a=b -o "$T/bad.hlt"
expect 2 "$HI" import --region a -o "$T/bad.hlt"
expect 2 "$HI" import --region "a=$T/a.img" --region "a=$T/b.img" -o "$T/bad.hlt"
[ -e "$T/bad.hlt" ] && fail "refused import left a file"
echo PASS
