#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run a command against a real S3 store: start one (scripts/object-store.sh)
# in a temporary directory, export its endpoint, key, region and bucket, run
# the command, stop the store. Exits with the command's status, or 77 (skip)
# when the store cannot start, unless HALITE_REQUIRE_S3=1.
#
#   run_with_store.sh SOURCE_DIR COMMAND [ARGS...]
#
# HALITE_OBJECT_STORE names the store's script (default: scripts/object-store.sh,
# radosgw); HALITE_STORE_REQUIRE names the variable that, set to 1, makes a
# store that cannot start a failure (default HALITE_REQUIRE_S3).
set -uo pipefail

src=${1:?usage: run_with_store.sh SOURCE_DIR COMMAND [ARGS...]}
shift
store=${HALITE_OBJECT_STORE:-$src/scripts/object-store.sh}

require=${HALITE_STORE_REQUIRE:-HALITE_REQUIRE_S3}
skip() {
	if [[ ${!require:-0} == 1 ]]; then
		echo "FAIL: $require=1 but $*" >&2
		exit 1
	fi
	echo "SKIP: $*" >&2
	exit 77
}

[[ -r $store ]] || skip "no $store"
dir=$(mktemp -d "${TMPDIR:-/tmp}/halite-s3-test.XXXXXX") || exit 1
cleanup() {
	bash "$store" stop "$dir/store" >/dev/null 2>&1
	rm -rf "$dir"
}
trap cleanup EXIT
env=$(bash "$store" start "$dir/store" 2>"$dir/start.err") ||
	skip "the object store did not start: $(tail -n 3 "$dir/start.err")"
eval "$env"
[[ -n ${HALITE_TEST_BUCKET:-} && -n ${AWS_ENDPOINT_URL:-} ]] ||
	skip "the object store printed no endpoint or bucket"
# Nothing of the machine's own AWS setup may leak into the tests.
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_DEFAULT_REGION
export AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_CONFIG_FILE=/dev/null
"$@"
