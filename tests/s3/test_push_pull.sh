#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# halite-inspect push and pull against a real S3 store (run_with_store.sh
# exports it): a snapshot of several MiB goes up in many parts and comes
# back byte for byte; a push stopped after some parts resumes and sends
# only the rest; what is not a snapshot, a missing key, bad credentials and
# a symbolic link at the target each fail with their own exit code and
# words, and a failed pull leaves its target as it was.
#
#   test_push_pull.sh HALITE_INSPECT SOURCE_DIR
set -uo pipefail

HI=${1:?usage: test_push_pull.sh HALITE_INSPECT SOURCE_DIR}
ROOT=${2:?}
# B, SEED, the inspect tests' helpers and has(): tests/s3/lib.sh.
. "$ROOT/tests/s3/lib.sh" "$HI" "$ROOT" run

# A snapshot of 26 MiB of incompressible pages, stored uncompressed: 6 parts
# of 5 MiB, the least a store takes (a last one short).
gen --out "$T/img" --pages 6656 --seed "$SEED" \
	--layout r || fail "generator"
expect 0 "$HI" import --no-sync -j 2 "$T/img" --region ram -o "$T/snap.hlt" --codec none
size=$(stat -c %s "$T/snap.hlt")
P=$((5 << 20))
parts=$(( (size + P - 1) / P ))
[ "$parts" -ge 6 ] || fail "the snapshot is too small for many parts: $size bytes"

# ---- push, pull, the same bytes ----
expect 0 "$HI" push --json --part-size 5M -j 4 "$T/snap.hlt" "s3://$B/snaps/one.hlt"
eq bytes "$(js "$T/out" 'd["bytes"]')" "$size"
eq parts "$(js "$T/out" 'd["parts"]')" "$parts"
eq parts_sent "$(js "$T/out" 'd["parts_sent"]')" "$parts"
eq resumed "$(js "$T/out" 'd["resumed"]')" False
[ "$(js "$T/out" 'd["requests"] >= d["parts"] + 2')" = True ] || fail "requests: $(cat "$T/out")"
[ -e "$T/snap.hlt.s3-upload" ] && fail "the state file outlived a complete push"
expect 0 "$HI" pull --json --part-size 5M -j 4 "s3://$B/snaps/one.hlt" "$T/back.hlt"
eq "pull bytes" "$(js "$T/out" 'd["bytes"]')" "$size"
eq "pull parts" "$(js "$T/out" 'd["parts"]')" "$parts"
cmp "$T/snap.hlt" "$T/back.hlt" || fail "pulled bytes differ"
ls "$T" | grep -q 'back.hlt.tmp-' && fail "a temporary file left behind"
expect 0 "$HI" verify "$T/back.hlt"

# ---- an interrupted push resumes, sending only what is missing ----
HALITE_S3_TEST_STOP_AFTER_PARTS=2 expect 1 "$HI" push --part-size 5M -j 1 "$T/snap.hlt" \
	"s3://$B/snaps/two.hlt"
has "$T/err" "stopped after 2 parts"
[ "$(stat -c %a "$T/snap.hlt.s3-upload")" = 600 ] || fail "the state file is not 0600"
grep -q "^url s3://$B/snaps/two.hlt$" "$T/snap.hlt.s3-upload" || fail "state: $(cat "$T/snap.hlt.s3-upload")"
expect 1 "$HI" pull "s3://$B/snaps/two.hlt" "$T/two.hlt"   # not complete: no object yet
has "$T/err" "HTTP 404: no such key"
expect 0 "$HI" push --json --part-size 5M -j 4 "$T/snap.hlt" "s3://$B/snaps/two.hlt"
eq resumed "$(js "$T/out" 'd["resumed"]')" True
eq parts "$(js "$T/out" 'd["parts"]')" "$parts"
sent=$(js "$T/out" 'd["parts_sent"]')
[ "$sent" -le $((parts - 2)) ] || fail "the resumed push sent $sent of $parts parts"
[ -e "$T/snap.hlt.s3-upload" ] && fail "the state file outlived the resumed push"
expect 0 "$HI" pull "s3://$B/snaps/two.hlt" "$T/two.hlt"
cmp "$T/snap.hlt" "$T/two.hlt" || fail "the resumed object differs"

# A state file for another part size is not resumed: a fresh upload, all parts sent.
HALITE_S3_TEST_STOP_AFTER_PARTS=2 expect 1 "$HI" push --part-size 5M -j 1 "$T/snap.hlt" \
	"s3://$B/snaps/three.hlt"
expect 0 "$HI" push --json --part-size 10M "$T/snap.hlt" "s3://$B/snaps/three.hlt"
eq resumed "$(js "$T/out" 'd["resumed"]')" False
eq parts_sent "$(js "$T/out" 'd["parts_sent"]')" $(( (size + 2 * P - 1) / (2 * P) ))
expect 0 "$HI" pull "s3://$B/snaps/three.hlt" "$T/three.hlt"
cmp "$T/snap.hlt" "$T/three.hlt" || fail "the object pushed anew differs"

# ---- what is refused ----
head -c 100000 /dev/urandom >"$T/junk"
expect 1 "$HI" push "$T/junk" "s3://$B/junk"
has "$T/err" "not a Halite snapshot"
has "$T/err" "--any"
expect 0 "$HI" push --any "$T/junk" "s3://$B/junk"
cp "$T/snap.hlt" "$T/keep.hlt"
expect 1 "$HI" pull "s3://$B/junk" "$T/keep.hlt"
has "$T/err" "not a Halite snapshot"
cmp "$T/snap.hlt" "$T/keep.hlt" || fail "a refused pull changed its target"
expect 0 "$HI" pull --any "s3://$B/junk" "$T/junk.back"
cmp "$T/junk" "$T/junk.back" || fail "pull --any bytes differ"

expect 1 "$HI" pull "s3://$B/no/such.hlt" "$T/keep.hlt"
has "$T/err" "HTTP 404: no such key"
cmp "$T/snap.hlt" "$T/keep.hlt" || fail "a failed pull changed its target"

AWS_SECRET_ACCESS_KEY=wrong-secret expect 1 "$HI" pull --json "s3://$B/snaps/one.hlt" "$T/x.hlt"
has "$T/err" "HTTP 403"
eq ok "$(js "$T/out" 'd["ok"]')" False
[ -e "$T/x.hlt" ] && fail "a denied pull wrote its target"

ln -s "$T/keep.hlt" "$T/link.hlt"
expect 2 "$HI" pull "s3://$B/snaps/one.hlt" "$T/link.hlt"
has "$T/err" "symbolic link"
[ -L "$T/link.hlt" ] || fail "the link was replaced"

expect 2 "$HI" pull "s3://Bad_Bucket/k" "$T/y.hlt"
has "$T/err" "bad bucket name"
expect 2 "$HI" push "$T/snap.hlt" "s3://$HALITE_TEST_BUCKET/"
has "$T/err" "empty key"
echo ok
