#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# halite-inspect on a snapshot at s3://BUCKET/KEY against a real S3 store
# (run_with_store.sh exports it): info, verify, blocks and map say exactly
# what they say of the local file (the name aside), extract writes the same
# bytes, a missing key and a replaced-then-truncated object fail with words
# that name the object, and an s3:// output is refused.
#
#   test_s3_read_inspect.sh HALITE_INSPECT SOURCE_DIR
set -uo pipefail

HI=${1:?usage: test_s3_read_inspect.sh HALITE_INSPECT SOURCE_DIR}
ROOT=${2:?}
# B, SEED, the inspect tests' helpers and has(): tests/s3/lib.sh.
. "$ROOT/tests/s3/lib.sh" "$HI" "$ROOT" s3read

# Two regions, compressed, a few hundred LBs: sections below the tail too.
gen --out "$T/a" --pages 3000 --seed "$SEED" --layout r || fail "generator"
gen --out "$T/b" --pages 1000 --seed "$((SEED + 1))" --layout r || fail "generator"
expect 0 "$HI" import --no-sync -j 2 --region "ram=$T/a" --region "rom=$T/b" \
	-o "$T/snap.hlt"
U="s3://$B/snap.hlt"
expect 0 "$HI" push "$T/snap.hlt" "$U"

# ---- the same answers as the local file ----
for cmd in "info" "info --json" "verify --json" "blocks" "blocks --json" "map" "map --json"; do
	# shellcheck disable=SC2086
	expect 0 "$HI" $cmd "$T/snap.hlt"
	mv "$T/out" "$T/local.out"
	# shellcheck disable=SC2086
	expect 0 "$HI" $cmd "$U"
	# The store's counters are the one difference by meaning (null locally).
	case $cmd in verify\ --json)
		eq "local store" "$(js "$T/local.out" 'd["store"]')" None
		python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["store"] = None
print(json.dumps(d, indent="\t"))' "$T/out" >"$T/out.j" && mv "$T/out.j" "$T/out"
		python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])), indent="\t"))' \
			"$T/local.out" >"$T/out.j" && mv "$T/out.j" "$T/local.out" ;;
	esac
	sed "s#$U#$T/snap.hlt#g" "$T/out" >"$T/s3.out"
	cmp -s "$T/local.out" "$T/s3.out" ||
		{ diff "$T/local.out" "$T/s3.out" | head -20 >&2; fail "$cmd differs on $U"; }
done
for reg in ram rom; do
	expect 0 "$HI" extract --region "$reg" -o "$T/$reg.local" "$T/snap.hlt"
	expect 0 "$HI" extract --json --region "$reg" -o "$T/$reg.s3" "$U"
	cmp "$T/$reg.local" "$T/$reg.s3" || fail "extract of $reg from $U differs"
	[ "$(stat -c %a "$T/$reg.s3")" = 600 ] || fail "the extracted image is not 0600"
done
cmp "$T/ram.s3" <(head -c "$(stat -c %s "$T/ram.s3")" "$T/a") || fail "ram is not the image"
# An object's LBs come 16 to a request (extract.c read_lbs()): the last extract (rom)
# read its LBs in a few requests beside the open's.
R=$(js "$T/out" 'd["store"]["requests"]')
N=$(js "$T/out" 'd["lbs_read"]')
[ "$N" -gt 16 ] && [ "$((R * 4))" -lt "$N" ] || fail "extract: $N LBs in $R requests"

# ---- the host's LB cache: the second reader gets every LB from it ----
for run in 1 2; do
	expect 0 "$HI" verify --json --cache-dir "$T/cache" --cache-size 64M "$U"
	cp "$T/out" "$T/cache$run.json"
done
LBS=$(js "$T/cache1.json" 'd["lbs"]["count"]')
[ "$LBS" -gt 100 ] || fail "only $LBS LBs"
eq "first verify: LBs kept" "$(js "$T/cache1.json" 'd["store"]["cache_puts"]')" "$LBS"
eq "first verify: LBs from the store" "$(js "$T/cache1.json" 'd["store"]["cache_misses"]')" "$LBS"
eq "second verify: LBs from the cache" "$(js "$T/cache2.json" 'd["store"]["cache_hits"]')" "$LBS"
eq "second verify: none from the store" "$(js "$T/cache2.json" 'd["store"]["cache_misses"]')" 0
# ... so it sent the store only what opening does (HEAD and the index's GETs).
eq "second verify: requests" "$(js "$T/cache2.json" 'd["store"]["requests"]')" \
	"$(js "$T/cache1.json" 'd["store"]["requests"] - d["store"]["cache_puts"]')"
expect 0 "$HI" extract --json --cache-dir "$T/cache" --region ram -o "$T/ram.cached" "$U"
cmp "$T/ram.local" "$T/ram.cached" || fail "extract through the cache differs"
eq "extract: every LB from the cache" "$(js "$T/out" 'd["store"]["cache_misses"]')" 0
expect 2 "$HI" info --cache-size 0 "$U"
has "$T/err" "--cache-size '0'"

# ---- push of a hostile disk record: nothing read for it, nothing uploaded ----
# A frozen image another user owns (push would read it with this user's rights
# and upload it), and a format that is not a disk image's (vvfat reads a tree).
echo secret >"$T/theirs.img"
chown 65534 "$T/theirs.img" 2>/dev/null || echo "not root: the other owner's case is skipped"
rec() { # IMAGE FORMAT
	printf '[{"image":"%s","format":"%s","frozen":true,"size":"%s","mtime_ns":"%s"}]' \
		"$1" "$2" "$(stat -c %s "$1")" \
		"$(python3 -c 'import os, sys; print(os.stat(sys.argv[1]).st_mtime_ns)' "$1")"
}
if [ "$(stat -c %u "$T/theirs.img")" != "$(id -u)" ]; then
	expect 0 "$HI" import --no-sync --region "ram=$T/b" --meta "qemu.disks=$(rec "$T/theirs.img" raw)" \
		-o "$T/theirs.hlt"
	expect 1 "$HI" push "$T/theirs.hlt" "s3://$B/theirs.hlt"
	has "$T/err" "belongs to uid 65534"
	expect 1 "$HI" info "s3://$B/theirs.hlt"
	has "$T/err" "no such key"
fi
echo mine >"$T/mine.img"
expect 0 "$HI" import --no-sync --region "ram=$T/b" --meta "qemu.disks=$(rec "$T/mine.img" vvfat)" \
	-o "$T/vvfat.hlt"
expect 1 "$HI" push "$T/vvfat.hlt" "s3://$B/vvfat.hlt"
has "$T/err" "format 'vvfat' is not a disk image format"

# ---- what fails, and says so ----
expect 1 "$HI" info "s3://$B/none.hlt"
has "$T/err" "s3://$B/none.hlt"
has "$T/err" "no such key"
# Writes go to local files only: an s3:// output is refused, nothing written.
cd "$T" || fail "cd"
expect 1 "$HI" extract --region ram -o "s3://$B/out.img" "$U"
has "$T/err" "s3://$B/out.img"
[ -e "$T/s3:" ] && fail "an s3:// output made a local directory"
echo PASS
