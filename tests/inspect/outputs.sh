# SPDX-License-Identifier: MIT
# Files halite-inspect writes hold guest memory: mode 0600, whatever the umask
# allows (it may only take more away). An output that is an input (the same
# path, or the same file through ./, a hard link or a symlink) is refused
# before anything is written: exit 2, the input unchanged, one sentence
# naming both.
. "$(dirname "$0")/lib.sh"

gen --out "$T/img" --pages 64 --seed 3 --mix "r=2,z=1,t=1" || fail generator

# mode FILE: its permission bits, octal.
mode() {
	stat -c %a "$1"
}

for m in 000:600 022:600 077:600 277:400; do
	mask=${m%%:*} want=${m##*:}
	rm -f "$T/s.hlt" "$T/x.img"
	(umask "$mask" && "$HI" import --no-sync -j 2 "$T/img" --region ram -o "$T/s.hlt") \
		>"$T/out" 2>"$T/err" || fail "import under umask $mask: $(cat "$T/err")"
	eq "snapshot mode, umask $mask" "$(mode "$T/s.hlt")" "$want"
	(umask "$mask" && "$HI" extract "$T/s.hlt" -o "$T/x.img") >"$T/out" 2>"$T/err" ||
		fail "extract under umask $mask: $(cat "$T/err")"
	eq "image mode, umask $mask" "$(mode "$T/x.img")" "$want"
	cmp "$T/img" "$T/x.img" || fail "extracted image differs"
done

# Replacing an older image or snapshot of another mode gives the new one 0600 too.
chmod 644 "$T/x.img" "$T/s.hlt"
expect 0 "$HI" extract "$T/s.hlt" -o "$T/x.img"
eq "replaced image mode" "$(mode "$T/x.img")" 600
import_ "$T/img" --region ram -o "$T/s.hlt"
eq "replaced snapshot mode" "$(mode "$T/s.hlt")" 600

# refused WHAT OUT INPUT CMD...: CMD exits 2 naming OUT and INPUT as the same
# file, INPUT's bytes and the directory's names unchanged.
refused() {
	local what=$1 out=$2 in=$3 sum names
	shift 3
	sum=$(cksum <"$in")
	names=$(ls -A "$T")
	expect 2 "$@"
	eq "$what: input kept" "$(cksum <"$in")" "$sum"
	eq "$what: nothing written" "$(ls -A "$T")" "$names"
	grep -qF "the output $out is the same file as $in" "$T/err" ||
		fail "$what: message does not name both: $(cat "$T/err")"
	[ "$(wc -l <"$T/err")" -eq 1 ] || fail "$what: more than one line: $(cat "$T/err")"
}

expect 0 "$HI" info "$T/s.hlt"
ln "$T/s.hlt" "$T/hard.hlt"
ln -s s.hlt "$T/soft.hlt"
refused "extract -o FILE FILE" "$T/s.hlt" "$T/s.hlt" "$HI" extract -o "$T/s.hlt" "$T/s.hlt"
(cd "$T" && refused "extract -o ./FILE FILE" ./s.hlt s.hlt "$HI" extract -o ./s.hlt s.hlt) || exit 1
refused "extract -o HARDLINK" "$T/hard.hlt" "$T/s.hlt" \
	"$HI" extract --region ram -o "$T/hard.hlt" "$T/s.hlt"
refused "extract -o SYMLINK" "$T/soft.hlt" "$T/s.hlt" "$HI" extract -o "$T/soft.hlt" "$T/s.hlt"
refused "extract FILE through a symlink" "$T/s.hlt" "$T/soft.hlt" \
	"$HI" extract -o "$T/s.hlt" "$T/soft.hlt"
expect 0 "$HI" verify "$T/s.hlt"

ln "$T/img" "$T/img.hard"
ln -s img "$T/img.soft"
refused "import IMG -o IMG" "$T/img" "$T/img" \
	"$HI" import --no-sync "$T/img" --region ram -o "$T/img"
grep -q "region ram" "$T/err" || fail "the region is not named: $(cat "$T/err")"
refused "import -o HARDLINK" "$T/img.hard" "$T/img" \
	"$HI" import --no-sync "$T/img" --region ram -o "$T/img.hard"
refused "import -o SYMLINK" "$T/img.soft" "$T/img" \
	"$HI" import --no-sync "$T/img" --region ram -o "$T/img.soft"
gen --out "$T/img2" --pages 16 --seed 4 --mix "r=1" || fail generator
refused "import, several regions, -o the second image" "$T/img2" "$T/img2" \
	"$HI" import --no-sync --region a="$T/img" --region b="$T/img2" -o "$T/img2"
grep -q "region b" "$T/err" || fail "the region is not named: $(cat "$T/err")"
refused "import, several regions, -o a link to the first" "$T/img.hard" "$T/img" \
	"$HI" import --no-sync --region a="$T/img" --region b="$T/img2" -o "$T/img.hard"
cmp "$T/img" "$T/x.img" || fail "input image changed"

# A snapshot written over another snapshot is fine: that is not an input.
import_ --region a="$T/img" --region b="$T/img2" -o "$T/hard.hlt"
expect 0 "$HI" verify "$T/hard.hlt"
echo PASS
