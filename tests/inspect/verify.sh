# SPDX-License-Identifier: MIT
# verify: intact file, flipped bytes in chosen LBs (named, walk continues),
# damage behind valid checksums (decode and slack), truncation, usage errors.
. "$(dirname "$0")/lib.sh"

gen --out "$T/img" --pages 600 --seed 3 --mix "r=1,t=3,m=1,z=1" || fail generator
import_ "$T/img" --region ram -o "$T/good.hlt" --lb-size 16K --mb-pages 2 --codec lz4
expect 0 "$HI" info --json "$T/good.hlt"
cp "$T/out" "$T/i.json"
DO=$(js "$T/i.json" 'd["data_offset"]')
LBS=$(js "$T/i.json" 'd["lbs"]["count"]')
STORED=$(js "$T/i.json" 'd["mbs"]["stored"]')
[ "$LBS" -ge 8 ] || fail "want at least 8 LBs, have $LBS"

expect 0 "$HI" verify "$T/good.hlt"
eq "summary" "$(cat "$T/out")" "OK: $LBS locality blocks, $STORED memory blocks verified"
expect 0 "$HI" verify -j 1 --json "$T/good.hlt"
is_json "$T/out"
eq "json ok" "$(js "$T/out" '(d["ok"], d["lbs"]["bad"], d["mbs"]["verified"], d["problems"])')" \
	"(True, 0, $STORED, [])"

# flip FILE OFFSET: invert one byte.
flip() {
	"$PY" - "$1" "$2" <<'PYEOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 0xff]))
PYEOF
}

# One byte in LB k: exit 1, LB k named with its offset.
K=$((LBS / 2))
cp "$T/good.hlt" "$T/one.hlt"
flip "$T/one.hlt" $((DO + K * 16384 + 100))
expect 1 "$HI" verify "$T/one.hlt"
grep -q "LB $K (offset $((DO + K * 16384)), stream physical, seq $K): .*checksum" "$T/err" ||
	fail "LB $K not named: $(cat "$T/err")"
[ "$(grep -c 'LB ' "$T/err")" -eq 1 ] || fail "more than LB $K blamed: $(cat "$T/err")"
grep -q "^halite-inspect: " "$T/err" || fail "stderr not prefixed"
eq "summary" "$(cat "$T/out")" "BAD: 1 of $LBS locality blocks failed"

# Two LBs, first and last: both named, so the walk went on after the first.
L=$((LBS - 1))
cp "$T/good.hlt" "$T/two.hlt"
flip "$T/two.hlt" $((DO + 5))
flip "$T/two.hlt" $((DO + L * 16384 + 16383))
expect 1 "$HI" verify -j 3 "$T/two.hlt"
grep -q "LB 0 (offset $DO," "$T/err" || fail "LB 0 not named"
grep -q "LB $L (offset $((DO + L * 16384))," "$T/err" || fail "LB $L not named"
eq "summary" "$(cat "$T/out")" "BAD: 2 of $LBS locality blocks failed"
expect 1 "$HI" verify --json "$T/two.hlt"
is_json "$T/out"
eq "json" "$(js "$T/out" '(d["ok"], d["lbs"]["bad"], [p["lb"] for p in d["problems"]])')" \
	"(False, 2, [0, $L])"

# The other LBs still decode: extract refuses, but info and map still work.
expect 0 "$HI" info "$T/two.hlt"
expect 0 "$HI" blocks "$T/two.hlt"

# Damage that the checksums do not see, because it was resealed.
if [ -n "$RESEAL" ]; then
	expect 0 "$HI" map --json "$T/good.hlt"
	# A compressed MB: overwrite its bytes so they cannot decode.
	read -r MB LB OFF LEN < <(js "$T/out" \
		'" ".join(str(x) for x in next((m["mb"], m["lb"], m["lb_offset"], m["length"]) for m in d["mbs"] if m.get("compressed")))')
	cp "$T/good.hlt" "$T/dec.hlt"
	"$RESEAL" "$T/dec.hlt" "$LB" "$OFF" "$LEN" 0xff || fail reseal
	expect 1 "$HI" verify "$T/dec.hlt"
	grep -q "MB $MB (region ram + .*) in LB $LB " "$T/err" || fail "MB $MB not named: $(cat "$T/err")"
	eq "summary" "$(cat "$T/out")" "BAD: 1 of $LBS locality blocks, 1 of $STORED memory blocks failed"
	expect 1 "$HI" extract "$T/dec.hlt" -o "$T/dec.img"
	[ -e "$T/dec.img" ] && fail "extract left output after a decode failure"

	# Non-zero slack in the LB with the most room.
	expect 0 "$HI" blocks --json "$T/good.hlt"
	read -r LB USED < <(js "$T/out" \
		'" ".join(str(x) for x in min(((b["lb"], b["used"]) for b in d["lbs"]), key=lambda b: b[1]))')
	[ "$USED" -lt 16384 ] || fail "no LB with slack"
	cp "$T/good.hlt" "$T/slack.hlt"
	"$RESEAL" "$T/slack.hlt" "$LB" 16383 1 0x5a || fail reseal
	expect 1 "$HI" verify "$T/slack.hlt"
	grep -q "LB $LB (.*): non-zero byte in slack at LB offset 16383" "$T/err" ||
		fail "slack not reported: $(cat "$T/err")"
	eq "summary" "$(cat "$T/out")" "BAD: 1 of $LBS locality blocks failed"
fi

# A damaged header or directory: the file does not open at all.
cp "$T/good.hlt" "$T/hdr.hlt"
flip "$T/hdr.hlt" 33
# One sentence on stderr, once; nothing on stdout (issue 16: it was on both).
expect 1 "$HI" verify "$T/hdr.hlt"
eq "stderr" "$(cat "$T/err")" "halite-inspect: verify: $T/hdr.hlt: header checksum mismatch"
[ -s "$T/out" ] && fail "verify of a file that does not open wrote stdout: $(cat "$T/out")"
expect 1 "$HI" verify --json "$T/hdr.hlt"
is_json "$T/out"
eq "json" "$(js "$T/out" '(d["ok"], d["exit"], d["error"], d["summary"])')" \
	"(False, 1, '$T/hdr.hlt: header checksum mismatch', None)"

# Truncated: no footer, so incomplete.
cp "$T/good.hlt" "$T/trunc.hlt"
truncate -s -100 "$T/trunc.hlt"
expect 1 "$HI" verify "$T/trunc.hlt"
grep -qi "incomplete" "$T/err" || fail "truncation not called incomplete: $(cat "$T/err")"
cp "$T/good.hlt" "$T/trunc2.hlt"
truncate -s $((DO + 3 * 16384)) "$T/trunc2.hlt"
expect 1 "$HI" verify "$T/trunc2.hlt"
grep -qi "incomplete" "$T/err" || fail "cut file not called incomplete: $(cat "$T/err")"

# Format 1.1: one byte of the mb-map. It opens (open reads only the index);
# a restore would meet it at the first use of its chunk; info, which reads
# every entry, and verify, which checks every chunk, name it.
MAP=$(js "$T/i.json" '[s["offset"] for s in d["sections"] if s["name"] == "mb-map"][0]')
cp "$T/good.hlt" "$T/map.hlt"
flip "$T/map.hlt" $((MAP + 8 * 3 + 1))
expect 1 "$HI" info "$T/map.hlt"
grep -q "mb-map chunk 0 " "$T/err" || fail "info: mb-map chunk not named: $(cat "$T/err")"
expect 1 "$HI" verify "$T/map.hlt"
grep -q "index: .*mb-map chunk 0 (entries 0\.\..*checksum mismatch" "$T/err" ||
	fail "mb-map chunk not named: $(cat "$T/err")"
grep -q "section .*mb-map" "$T/err" || fail "mb-map section not named: $(cat "$T/err")"

# A file that does not open: the command failed, 1 (docs/cli.md). Usage: 2.
expect 1 "$HI" verify "$T/does-not-exist.hlt"
grep -q "^halite-inspect: verify: .*does-not-exist.hlt" "$T/err" || fail "missing file not named"
expect 2 "$HI" verify --bogus "$T/good.hlt"
grep -q "unknown option '--bogus'" "$T/err" || fail "bad option not named: $(cat "$T/err")"
expect 2 "$HI" verify
expect 2 "$HI" verify "$T/good.hlt" "$T/good.hlt"
expect 2 "$HI" verify -j 0 "$T/good.hlt"
expect 2 "$HI" verify "$T"
echo PASS
