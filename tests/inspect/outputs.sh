# SPDX-License-Identifier: MIT
# Files halite-inspect writes hold guest memory: mode 0600, whatever the umask
# allows (it may only take more away).
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
echo PASS
