#!/usr/bin/env bash
# Record the real programs' access traces committed next to this script
# (docs/trace-format.md, docs/benchmarks.md "Real programs' traces"): each
# program runs once under `valgrind --tool=lackey --trace-mem=yes`, whose
# output is streamed through halite-trace-lackey (never stored: it is
# gigabytes) into NAME.trace, then compressed to NAME.trace.xz.
#
#   bench/traces/record.sh [--build DIR] [NAME...]
#
# NAMEs: sqlite-index (sqlite3 CREATE INDEX over a 100,000-row table),
# python-json (python3 running a script of json, re, csv, collections,
# hashlib, datetime, statistics), xz-compress (xz -6 compressing a 60 KB
# text). Default: all. Needs valgrind, sqlite3, python3, xz
# (scripts/install-deps.sh). Takes 2 to 10 minutes per program on the shared
# 2-core machine. A new recording is similar, not equal: ASLR moves the
# regions (packing keeps only offsets inside them), the programs' versions
# and xz-compress's input (the head of docs/benchmarks.md) change.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$root/build}
if [[ ${1:-} == --build ]]; then
	build=$2
	shift 2
fi
conv=$build/bench/halite-trace-lackey
[[ -x $conv ]] || { echo "record.sh: $conv not built (scripts/build.sh)" >&2; exit 2; }
for t in valgrind sqlite3 /usr/bin/python3 xz; do
	command -v "$t" >/dev/null || { echo "record.sh: $t missing (scripts/install-deps.sh)" >&2; exit 2; }
done
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(sqlite-index python-json xz-compress)
tmp=$(mktemp -d /tmp/halite-record.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# lackey NAME CMD...: the program's stdout and stderr are dropped; lackey's
# log goes to fd 9, the pipe.
lackey() {
	local name=$1
	shift
	echo "record.sh: $name: $*" >&2
	valgrind --tool=lackey --trace-mem=yes --log-fd=9 "$@" 9>&1 >/dev/null 2>/dev/null |
		"$conv" "$tmp/$name.trace" -
	xz -T1 -9 -c "$tmp/$name.trace" >"$here/$name.trace.xz"
	ls -l "$here/$name.trace.xz" >&2
}

for n in "${names[@]}"; do
	case $n in
	sqlite-index)
		# The table is built outside the trace; only the index build is recorded.
		sqlite3 "$tmp/t.db" "CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c INTEGER);
			WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100000)
			INSERT INTO t SELECT i, printf('k%08d', (i * 7919) % 100003), (i * 48271) % 1000003 FROM s;"
		lackey "$n" sqlite3 "$tmp/t.db" "CREATE INDEX tc ON t(c);"
		;;
	python-json)
		lackey "$n" /usr/bin/python3 -S "$here/workload.py"
		;;
	xz-compress)
		cat "$root/docs/benchmarks.md" "$root/docs/format.md" | head -c 60000 >"$tmp/in.txt"
		lackey "$n" xz -T1 -6 -c "$tmp/in.txt"
		;;
	*) echo "record.sh: unknown trace '$n'" >&2; exit 2 ;;
	esac
done
