#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The test object store STORE (radosgw: scripts/object-store.sh; seaweedfs:
# scripts/object-store-seaweedfs.sh) is a real S3: it starts in a fresh
# directory, keeps a few MiB of random bytes exactly (whole, by Range, and
# put in three parts of a multipart upload), answers a wrong If-Match with
# 412 and a wrong secret with 403, starts only once per directory, and stops
# leaving no process behind. Skips (77) without the store unless
# HALITE_REQUIRE_S3=1 (radosgw) or HALITE_REQUIRE_SEAWEEDFS=1 (seaweedfs).
#
#   test_object_store.sh SOURCE_DIR radosgw|seaweedfs [SEED]
set -euo pipefail

usage="usage: test_object_store.sh SOURCE_DIR radosgw|seaweedfs [SEED]"
src=${1:?$usage}
kind=${2:?$usage}
seed=${3:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}

skip() { # what's missing, the variable that makes it a failure, how to get it
	if [[ ${!2:-0} == 1 ]]; then
		echo "FAIL: $2=1 but there is no $1 ($3)"
		exit 1
	fi
	echo "SKIP: no $1 ($3)"
	exit 77
}

# What differs between the stores: the script, what must be installed, how
# the store's processes are told apart, how many serve it, its pid file.
case $kind in
radosgw)
	store=$src/scripts/object-store.sh
	for b in ceph-mon ceph-osd radosgw; do
		command -v "$b" >/dev/null ||
			skip "$b" HALITE_REQUIRE_S3 "apt-get install radosgw ceph-mon ceph-osd"
	done
	nprocs=4 procs_what="the shell and three daemons" pidfile=rgw.pid
	# Started with this store's ceph.conf (the leader shell and the daemons).
	is_store_proc() { grep -xF -- "$dir/ceph.conf" >/dev/null; }
	;;
seaweedfs)
	store=$src/scripts/object-store-seaweedfs.sh
	weed=${HALITE_WEED:-/usr/local/lib/halite/weed}
	[[ -x $weed ]] ||
		skip "weed at $weed" HALITE_REQUIRE_SEAWEEDFS "scripts/install-object-store.sh installs it"
	nprocs=3 procs_what="three weed processes" pidfile=weed.pid
	# An option naming a path in DIR (-mdir=DIR/master, -dir=DIR/volume, ...).
	is_store_proc() { awk -v want="=$dir/" '/^-/ && index($0, want) { f = 1 } END { exit !f }'; }
	;;
*)
	echo "$usage" >&2
	exit 2
	;;
esac

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

tmp=$(mktemp -d "${TMPDIR:-/tmp}/halite-s3-$kind.XXXXXX")
dir=$tmp/store
cleanup() {
	"$store" stop "$dir" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
echo "seed $seed, store in $dir"

# The processes serving DIR.
store_procs() {
	local p n=0
	for p in /proc/[0-9]*; do
		tr '\0' '\n' 2>/dev/null <"$p/cmdline" | is_store_proc && n=$((n + 1))
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
check "no file or directory in DIR is open to group or others" \
	eq "$(find "$dir" -perm /077 ! -type l ! -type s | wc -l)" 0
check "$procs_what serve DIR" eq "$(store_procs)" "$nprocs"

again=$("$store" start "$dir")
check "a second start prints the same lines" eq "$again" "$out"
check "a second start makes no second server" eq "$(store_procs)" "$nprocs"
check "status says it runs" "$store" status "$dir"

# An object of random bytes from the seed: 11 MiB and an odd tail, so that
# it makes three parts of 5 MiB, 5 MiB and the rest, and a range ends off
# any block size.
size=$((11 * 1024 * 1024 + 12345))
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
# A store may take a request without x-amz-content-sha256 as UNSIGNED-PAYLOAD
# (radosgw does), and curl 7.88 signs the body's hash then: every request here names one.
unsigned=(-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD')
sha=$(sha256sum "$tmp/object" | cut -d' ' -f1)

check "LIST the new bucket: 200" \
	eq "$(s3 "$tmp/list" "${unsigned[@]}" "$AWS_ENDPOINT_URL/$HALITE_TEST_BUCKET")" 200
check "the new bucket is empty (start's probe object is gone)" eval '! grep -q "<Key>" "$tmp/list"'

check "PUT the object: 200" \
	eq "$(s3 /dev/null -X PUT -H "x-amz-content-sha256: $sha" --data-binary "@$tmp/object" \
		-D "$tmp/put.headers" "$url")" 200
etag=$(sed -n 's/^[Ee][Tt][Aa][Gg]: *\([^[:space:]]*\).*/\1/p' "$tmp/put.headers")
check "PUT returns the MD5 as ETag" eq "$etag" "\"$(md5sum "$tmp/object" | cut -d' ' -f1)\""
check "PUT with a body not of the signed hash: 400 or 403" \
	eval '[[ $(s3 /dev/null -X PUT -H "x-amz-content-sha256: $sha" --data-binary "x" "$url.bad") == 40[03] ]]'

check "PUT with curl -T, UNSIGNED-PAYLOAD: 200" eq "$(s3 /dev/null "${unsigned[@]}" -T "$tmp/object" "$url.t")" 200
check "that object comes back exactly" \
	eval 'cmp "$tmp/object" <(curl -s --max-time 60 "${sign[@]}" "${unsigned[@]}" "$url.t")'
check "GET the object whole: 200" eq "$(s3 "$tmp/got" "${unsigned[@]}" "$url")" 200
check "the bytes come back exactly" cmp "$tmp/object" "$tmp/got"

first=1000001 last=9200000
check "GET bytes=$first-$last: 206" \
	eq "$(s3 "$tmp/range" "${unsigned[@]}" -H "Range: bytes=$first-$last" "$url")" 206
# head stops reading early: tail may die of SIGPIPE, which pipefail reports.
tail -c +$((first + 1)) "$tmp/object" | head -c $((last - first + 1)) >"$tmp/want-range" || true
check "the range is those bytes exactly" cmp "$tmp/want-range" "$tmp/range"
check "GET bytes=-4096 (the last 4 KiB): 206" \
	eq "$(s3 "$tmp/suffix" "${unsigned[@]}" -H "Range: bytes=-4096" "$url")" 206
check "the suffix is the last 4096 bytes" cmp <(tail -c 4096 "$tmp/object") "$tmp/suffix"

check "GET with If-Match: a wrong ETag: 412" \
	eq "$(s3 /dev/null "${unsigned[@]}" -H 'If-Match: "0123456789abcdef0123456789abcdef"' "$url")" 412
check "GET with If-Match: the right ETag: 200" eq "$(s3 /dev/null "${unsigned[@]}" -H "If-Match: $etag" "$url")" 200
check "GET a missing key: 404" eq "$(s3 /dev/null "${unsigned[@]}" "$url.missing")" 404
check "GET with a wrong secret: 403" \
	eq "$(curl -s --max-time 60 -o /dev/null -w '%{http_code}' "${unsigned[@]}" \
		--aws-sigv4 "aws:amz:$AWS_REGION:s3" \
		--user "$AWS_ACCESS_KEY_ID:wrong$AWS_SECRET_ACCESS_KEY" "$url")" 403
check "GET unsigned: 403" eq "$(curl -s --max-time 60 -o /dev/null -w '%{http_code}' "$url")" 403

# Multipart: three parts (5 MiB, 5 MiB, the rest), completed, read back.
# "?uploads=", not "?uploads": curl 7.88 signs the bare name without its "=".
mp=$AWS_ENDPOINT_URL/$HALITE_TEST_BUCKET/dir/multipart.bin
check "start a multipart upload: 200" \
	eq "$(s3 "$tmp/initiate" "${unsigned[@]}" -X POST "$mp?uploads=")" 200
upload=$(sed -n 's:.*<UploadId>\([^<]*\)</UploadId>.*:\1:p' "$tmp/initiate")
check "it names an upload id" eval '[[ -n $upload ]]'
part=$((5 * 1024 * 1024))
split -b "$part" -a 1 --numeric-suffixes=1 "$tmp/object" "$tmp/part."
complete="<CompleteMultipartUpload>"
for n in 1 2 3; do
	check "PUT part $n: 200" \
		eq "$(s3 /dev/null "${unsigned[@]}" -T "$tmp/part.$n" -D "$tmp/part.$n.headers" \
			"$mp?partNumber=$n&uploadId=$upload")" 200
	tag=$(sed -n 's/^[Ee][Tt][Aa][Gg]: *\([^[:space:]]*\).*/\1/p' "$tmp/part.$n.headers")
	complete+="<Part><PartNumber>$n</PartNumber><ETag>$tag</ETag></Part>"
done
complete+="</CompleteMultipartUpload>"
check "complete the upload: 200" \
	eq "$(s3 "$tmp/complete" "${unsigned[@]}" -X POST --data-binary "$complete" "$mp?uploadId=$upload")" 200
# radosgw 16.2 leaves <ETag> empty in the completion's answer: HEAD has it.
check "HEAD the multipart object: 200" \
	eq "$(s3 /dev/null "${unsigned[@]}" -I -D "$tmp/mp.headers" "$mp")" 200
check "its ETag counts three parts" grep -qi '^etag: *"[0-9a-f]\{32\}-3"' "$tmp/mp.headers"
check "GET the multipart object: 200" eq "$(s3 "$tmp/mp-got" "${unsigned[@]}" "$mp")" 200
check "the multipart object is the bytes exactly" cmp "$tmp/object" "$tmp/mp-got"
check "a range across the first part boundary is exact" \
	eval '[[ $(s3 "$tmp/mp-range" "${unsigned[@]}" -H "Range: bytes=$((part - 10))-$((part + 9))" "$mp") == 206 ]] &&
		cmp <(tail -c +$((part - 9)) "$tmp/object" | head -c 20) "$tmp/mp-range"'

t0=$(date +%s%N)
check "stop exits 0" "$store" stop "$dir"
t1=$(date +%s%N)
echo "stop: $(((t1 - t0) / 1000000)) ms"
check "no process of DIR is left" eq "$(store_procs)" 0
check "the pid file is gone" eval '[[ ! -e $dir/$pidfile ]]'
check "status says it stopped" eval '! "$store" status "$dir"'
check "stopping it again exits 0" "$store" stop "$dir"

if ((fails)); then
	echo "$fails checks failed (seed $seed)"
	exit 1
fi
echo "all checks passed"
