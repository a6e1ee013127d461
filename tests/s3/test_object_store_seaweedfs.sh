#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The test object store (scripts/object-store-seaweedfs.sh) is a real S3: it starts in
# a fresh directory, keeps a few MiB of random bytes exactly (whole and by
# Range), answers a wrong If-Match with 412 and a wrong secret with 403,
# starts only once per directory, and stops leaving no process behind.
# Skips (77) without weed unless HALITE_REQUIRE_SEAWEEDFS=1.
#
#   test_object_store.sh SOURCE_DIR [SEED]
set -euo pipefail

src=${1:?usage: test_object_store.sh SOURCE_DIR [SEED]}
seed=${2:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
store=$src/scripts/object-store-seaweedfs.sh
weed=${HALITE_WEED:-/usr/local/lib/halite/weed}

if [[ ! -x $weed ]]; then
	if [[ ${HALITE_REQUIRE_SEAWEEDFS:-0} == 1 ]]; then
		echo "FAIL: HALITE_REQUIRE_SEAWEEDFS=1 but there is no weed at $weed (scripts/install-object-store.sh installs it)"
		exit 1
	fi
	echo "SKIP: no weed at $weed (scripts/install-object-store.sh installs it)"
	exit 77
fi

fails=0
check() { # description command...
	local what=$1
	shift
	if "$@"; then
		echo "ok: $what"
	else
		echo "FAIL: $what"
		fails=$((fails + 1))
	fi
}
eq() { [[ $1 == "$2" ]] || { echo "  got '$1', want '$2'"; return 1; }; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/halite-s3.XXXXXX")
dir=$tmp/store
cleanup() {
	"$store" stop "$dir" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
echo "seed $seed, store in $dir"

# Processes with an option naming a path in this store's directory
# (-mdir=DIR/master, -dir=DIR/volume, -defaultStoreDir=DIR/filer, ...).
weed_procs() {
	local p n=0
	for p in /proc/[0-9]*; do
		tr '\0' '\n' 2>/dev/null <"$p/cmdline" |
			awk -v want="=$dir/" '/^-/ && index($0, want) { found = 1 } END { exit !found }' &&
			n=$((n + 1))
	done
	echo "$n"
}
mode() { stat -c %a "$1"; }

t0=$(date +%s%N)
out=$("$store" start "$dir")
t1=$(date +%s%N)
echo "start to S3 ready: $(((t1 - t0) / 1000000)) ms"
eval "$out"
check "start prints the five variables" \
	eq "$(grep -c '^export \(AWS_ENDPOINT_URL\|AWS_ACCESS_KEY_ID\|AWS_SECRET_ACCESS_KEY\|AWS_REGION\|HALITE_TEST_BUCKET\)=' <<<"$out")" 5
check "the endpoint is on loopback" \
	eval '[[ $AWS_ENDPOINT_URL =~ ^http://127\.0\.0\.1:[0-9]+$ ]]'
check "the region is us-east-1" eq "$AWS_REGION" us-east-1
check "a random key id and secret" \
	eval '[[ ${#AWS_ACCESS_KEY_ID} -ge 16 && ${#AWS_SECRET_ACCESS_KEY} -ge 32 ]]'
check "DIR is 0700" eq "$(mode "$dir")" 700
check "DIR/env is 0600" eq "$(mode "$dir/env")" 600
check "DIR/s3.json is 0600" eq "$(mode "$dir/s3.json")" 600
check "three weed processes serve DIR" eq "$(weed_procs)" 3

again=$("$store" start "$dir")
check "a second start prints the same lines" eq "$again" "$out"
check "a second start makes no second server" eq "$(weed_procs)" 3
check "status says it runs" "$store" status "$dir"

# An object of random bytes from the seed: 3 MiB and an odd tail, so that a
# range crosses SeaweedFS's chunk boundaries and ends off any block size.
size=$((3 * 1024 * 1024 + 12345))
python3 -c 'import random, sys
sys.stdout.buffer.write(random.Random(int(sys.argv[1])).randbytes(int(sys.argv[2])))' \
	"$seed" "$size" >"$tmp/object"
url=$AWS_ENDPOINT_URL/$HALITE_TEST_BUCKET/dir/object.bin
sign=(--aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY")
s3() { # out-file curl-args... ; prints the HTTP status
	local out=$1
	shift
	curl -s --max-time 60 -o "$out" -w '%{http_code}' "${sign[@]}" "$@"
}
sha=$(sha256sum "$tmp/object" | cut -d' ' -f1)

check "LIST the new bucket: 200" eq "$(s3 "$tmp/list" "$AWS_ENDPOINT_URL/$HALITE_TEST_BUCKET")" 200
check "the new bucket is empty (start's probe object is gone)" eval '! grep -q "<Key>" "$tmp/list"'

check "PUT the object: 200" \
	eq "$(s3 /dev/null -X PUT -H "x-amz-content-sha256: $sha" --data-binary "@$tmp/object" \
		-D "$tmp/put.headers" "$url")" 200
etag=$(sed -n 's/^[Ee][Tt][Aa][Gg]: *\([^[:space:]]*\).*/\1/p' "$tmp/put.headers")
check "PUT returns the MD5 as ETag" eq "$etag" "\"$(md5sum "$tmp/object" | cut -d' ' -f1)\""

# curl -T streams the file and signs it as S3 allows (docs/testing.md's example).
check "PUT with curl -T: 200" eq "$(s3 /dev/null -T "$tmp/object" "$url.t")" 200
check "that object comes back exactly" eval 'cmp "$tmp/object" <(curl -s --max-time 60 "${sign[@]}" "$url.t")'
check "GET the object whole: 200" eq "$(s3 "$tmp/got" "$url")" 200
check "the bytes come back exactly" cmp "$tmp/object" "$tmp/got"

first=1000001 last=3200000
check "GET bytes=$first-$last: 206" eq "$(s3 "$tmp/range" -H "Range: bytes=$first-$last" "$url")" 206
tail -c +$((first + 1)) "$tmp/object" | head -c $((last - first + 1)) >"$tmp/want-range"
check "the range is those bytes exactly" cmp "$tmp/want-range" "$tmp/range"
check "GET bytes=-4096 (the last 4 KiB): 206" \
	eq "$(s3 "$tmp/suffix" -H "Range: bytes=-4096" "$url")" 206
check "the suffix is the last 4096 bytes" cmp <(tail -c 4096 "$tmp/object") "$tmp/suffix"

check "GET with If-Match: a wrong ETag: 412" \
	eq "$(s3 /dev/null -H 'If-Match: "0123456789abcdef0123456789abcdef"' "$url")" 412
check "GET with If-Match: the right ETag: 200" eq "$(s3 /dev/null -H "If-Match: $etag" "$url")" 200
check "GET a missing key: 404" eq "$(s3 /dev/null "$url.missing")" 404
check "GET with a wrong secret: 403" \
	eq "$(curl -s --max-time 60 -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
		--user "$AWS_ACCESS_KEY_ID:wrong$AWS_SECRET_ACCESS_KEY" "$url")" 403
check "GET unsigned: 403" eq "$(curl -s --max-time 60 -o /dev/null -w '%{http_code}' "$url")" 403

t0=$(date +%s%N)
check "stop exits 0" "$store" stop "$dir"
t1=$(date +%s%N)
echo "stop: $(((t1 - t0) / 1000000)) ms"
check "no weed process of DIR is left" eq "$(weed_procs)" 0
check "the pid file is gone" eval '[[ ! -e $dir/weed.pid ]]'
check "the data stays" eval '[[ -n $(ls -A "$dir/volume") ]]'
check "status says it stopped" eval '! "$store" status "$dir"'
check "stopping it again exits 0" "$store" stop "$dir"

if ((fails)); then
	echo "$fails checks failed (seed $seed)"
	exit 1
fi
echo "all checks passed"
