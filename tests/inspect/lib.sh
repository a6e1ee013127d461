# SPDX-License-Identifier: MIT
# Shared by the halite-inspect test scripts; sourced, not run.
# Arguments of every script: HALITE_INSPECT PYTHON3 SOURCE_DIR RESEAL MKFILE
set -u

HI=$1
PY=$2
SRC=$3
RESEAL=${4:-}
MKFILE=${5:-}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
	echo "SKIP: needs python3 >= 3.9" >&2
	exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/halite-inspect-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# expect CODE CMD...: run CMD, stdout to $T/out, stderr to $T/err, check its exit code.
expect() {
	local want=$1 got
	shift
	"$@" >"$T/out" 2>"$T/err"
	got=$?
	if [ "$got" -ne "$want" ]; then
		echo "command: $*" >&2
		echo "--- stdout:" >&2
		head -c 4000 "$T/out" >&2
		echo "--- stderr:" >&2
		head -c 4000 "$T/err" >&2
		fail "exit status $got, expected $want"
	fi
}

# js FILE EXPR: evaluate a Python expression over the JSON document d in FILE.
js() {
	"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" ||
		fail "bad JSON in $1 or expression $2"
}

# is_json FILE: the file holds exactly one JSON value.
is_json() {
	"$PY" -m json.tool "$1" >/dev/null || fail "$1 is not JSON"
}

# eq WHAT GOT WANT
eq() {
	[ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}

gen() {
	"$PY" "$SRC/gen_image.py" "$@"
}

# Fast imports: the tests do not need the data on stable storage.
import_() {
	expect 0 "$HI" import --no-sync -j 2 "$@"
}
