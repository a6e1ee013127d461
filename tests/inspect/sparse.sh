# SPDX-License-Identifier: MIT
# Holes in a sparse image become untouched blocks; written zeros become zero
# blocks; extract gives the image back, sparse.
. "$(dirname "$0")/lib.sh"

# Pages: holes, written zeros, a hole next to zeros (a zero block, not untouched).
LAYOUT="hhhhtrzzzzhhhhmmhzzhhhhhhhhhzzzzhhhh"
gen --out "$T/img" --pages 520 --seed 11 --layout "$LAYOUT" --expect 1,2,4 >"$T/expect.json"
rc=$?
[ $rc -eq 3 ] && { echo "SKIP: this file system does not keep holes" >&2; exit 77; }
[ $rc -eq 0 ] || fail generator

for mbp in 1 2 4; do
	for order in physical random; do
		f="$T/s-$mbp-$order.hlt"
		import_ "$T/img" --region mem -o "$f" --mb-pages $mbp --order $order --seed 5 --codec lz4
		expect 0 "$HI" info --json "$f"
		cp "$T/out" "$T/i.json"
		for k in count stored zero untouched; do
			eq "$mbp/$order $k" "$(js "$T/i.json" "d['mbs']['$k']")" \
				"$(js "$T/expect.json" "d['$mbp']['$k']")"
		done
		[ "$(js "$T/i.json" 'd["mbs"]["untouched"]')" -gt 0 ] || fail "no untouched blocks"
		[ "$(js "$T/i.json" 'd["mbs"]["zero"]')" -gt 0 ] || fail "no zero blocks"

		# map agrees with info, block by block.
		expect 0 "$HI" map --json "$f"
		is_json "$T/out"
		for s in stored zero untouched; do
			eq "$mbp/$order map $s" \
				"$(js "$T/out" "sum(1 for m in d['mbs'] if m['state'] == '$s')")" \
				"$(js "$T/i.json" "d['mbs']['$s']")"
		done

		expect 0 "$HI" verify "$f"
		expect 0 "$HI" extract "$f" --region mem -o "$T/x.img"
		cmp "$T/img" "$T/x.img" || fail "$mbp/$order: extracted image differs"
		# The untouched and zero blocks were skipped, not written.
		alloc=$(($(stat -c %b "$T/x.img") * $(stat -c %B "$T/x.img")))
		size=$(stat -c %s "$T/x.img")
		[ "$alloc" -lt "$size" ] || fail "extracted image is not sparse ($alloc of $size bytes)"
	done
done

# An image with nothing but holes: every block untouched, no locality block.
truncate -s 1M "$T/empty.img"
import_ "$T/empty.img" --region mem -o "$T/e.hlt"
expect 0 "$HI" info --json "$T/e.hlt"
eq "all untouched" "$(js "$T/out" '(d["mbs"]["untouched"], d["mbs"]["count"], d["lbs"]["count"])')" \
	"(128, 128, 0)"
expect 0 "$HI" verify "$T/e.hlt"
grep -q "^OK: 0 locality blocks, 0 memory blocks verified" "$T/out" || fail "verify: $(cat "$T/out")"
expect 0 "$HI" extract "$T/e.hlt" -o "$T/e.img"
cmp "$T/empty.img" "$T/e.img" || fail "empty image differs"
echo PASS
