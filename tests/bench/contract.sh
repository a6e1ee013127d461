#!/usr/bin/env bash
# halite-bench's JSON contract at a small size: micro (every organisation and
# peer, warm and cold, with and without added latency) and fault; checked by
# contract.py. Exit 77 (skip) when the bench says userfaultfd is missing.
set -uo pipefail
bench=${1:?usage: contract.sh HALITE_BENCH CONTRACT_PY}
check=${2:?usage: contract.sh HALITE_BENCH CONTRACT_PY}
T=$(mktemp -d /tmp/halite-bench-contract.XXXXXX)
trap 'rm -rf "$T"' EXIT

run() { # NAME ARGS...
	local name=$1 rc
	shift
	"$bench" "$@" --dir "$T" --json > "$T/$name.json" 2> "$T/$name.err"
	rc=$?
	if [[ $rc -eq 77 ]]; then
		echo "skipped: $(tail -n 1 "$T/$name.err")"
		exit 77
	fi
	if [[ $rc -ne 0 ]]; then
		cat "$T/$name.err" >&2
		echo "FAIL: halite-bench $* exited $rc" >&2
		exit 1
	fi
}

run micro micro --mem-mib 32 --passes 400 --cache warm,cold --latency 0,100 \
	--track-latency 100 --baseline-runs 1
run fault fault --mem-mib 16 --touches 100 --cache cold,warm
python3 "$check" "$T/micro.json" "$T/fault.json"
