# SPDX-License-Identifier: MIT
# extract refuses a damaged file: exit 1, no output, an older image kept.
. "$(dirname "$0")/lib.sh"

gen --out "$T/img" --pages 256 --seed 9 --mix "r=1,t=2,z=1" || fail generator
import_ "$T/img" --region ram -o "$T/good.hlt" --lb-size 64K --codec zlib
expect 0 "$HI" info --json "$T/good.hlt"
DO=$(js "$T/out" 'd["data_offset"]')
LBS=$(js "$T/out" 'd["lbs"]["count"]')

expect 0 "$HI" extract --json "$T/good.hlt" --region ram -o "$T/x.img"
is_json "$T/out"
eq "json" "$(js "$T/out" '(d["bytes"], d["lbs_read"], d["mbs"]["stored"] + d["mbs"]["zero"] + d["mbs"]["untouched"])')" \
	"(1048576, $LBS, 128)"
cmp "$T/img" "$T/x.img" || fail "extracted image differs"
rm "$T/x.img"

# A flipped byte in the last LB.
cp "$T/good.hlt" "$T/bad.hlt"
"$PY" -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); f.write(b"\x5a\xa5")' \
	"$T/bad.hlt" $((DO + (LBS - 1) * 65536 + 17))
expect 1 "$HI" extract "$T/bad.hlt" --region ram -o "$T/x.img"
grep -q "LB $((LBS - 1))[ :].*checksum" "$T/err" || fail "bad LB not named: $(cat "$T/err")"
[ -e "$T/x.img" ] && fail "partial output left behind"
ls "$T" | grep -q "x.img" && fail "temporary output left behind: $(ls "$T")"

# An existing image at the output path survives a failed extract.
echo "older image" >"$T/x.img"
expect 1 "$HI" extract "$T/bad.hlt" --region ram -o "$T/x.img"
eq "older image" "$(cat "$T/x.img")" "older image"
rm "$T/x.img"

# Incomplete file: exit 1, nothing written.
cp "$T/good.hlt" "$T/cut.hlt"
truncate -s -1 "$T/cut.hlt"
expect 1 "$HI" extract "$T/cut.hlt" --region ram -o "$T/x.img"
grep -qi "incomplete" "$T/err" || fail "not called incomplete"
[ -e "$T/x.img" ] && fail "output written from an incomplete file"

# Usage errors.
expect 2 "$HI" extract "$T/good.hlt" --region ram
expect 2 "$HI" extract --region ram -o "$T/x.img"
expect 1 "$HI" extract "$T/nope.hlt" --region ram -o "$T/x.img"
expect 2 "$HI" extract "$T/good.hlt" --region ram -o "$T"	# a directory
[ -e "$T/x.img" ] && fail "output written on a usage error"
echo PASS
