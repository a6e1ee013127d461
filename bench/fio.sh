#!/usr/bin/env bash
# This machine's random-read limits for the restore's I/O patterns, beside
# halite-bench's results (issue 5): fio runs bench/fio/randread.fio on a test
# file in DIR (removed at the end) and one JSON object is printed:
#
#   {"fio": [{"name": "rand-4k-qd1", "bs": 4096, "iodepth": 1, "iops": ...,
#             "lat_p50_us": ..., "lat_p99_us": ..., "bw_mib_s": ...}, ...],
#    "size": ..., "runtime_s": ..., "engine": ..., "dir": ...}
#
# lat_* is fio's completion latency (submission to completion of one read,
# clat), which with io_uring is all of it but a microsecond or so.
#
#   bench/fio.sh DIR [--quick]     1 GiB file, 10 s per job (--quick: 128 MiB, 3 s; ~16 s)
#   FIO_ENGINE=libaio bench/fio.sh DIR
set -euo pipefail

usage() {
	echo "usage: $0 DIR [--quick]" >&2
	exit 2
}
[[ $# -ge 1 && $# -le 2 ]] || usage
dir=$1
quick=0
if [[ $# -eq 2 ]]; then
	[[ $2 == --quick ]] || usage
	quick=1
fi
[[ -d $dir ]] || { echo "$0: $dir: not a directory" >&2; exit 2; }
command -v fio >/dev/null || { echo "$0: fio not found (scripts/install-deps.sh)" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export FIO_FILE="$dir/halite-fio.$$.bin"
export FIO_ENGINE=${FIO_ENGINE:-io_uring}
if [[ $quick == 1 ]]; then
	export FIO_SIZE=128m FIO_RUNTIME=3
else
	export FIO_SIZE=1g FIO_RUNTIME=10
fi
out=$(mktemp)
trap 'rm -f "$FIO_FILE" "$out"' EXIT

# fio lays the file out (writes it) before the first job; with direct=1 the
# reads never see the page cache that leaves behind.
fio --output-format=json --output="$out" "$here/fio/randread.fio" >&2

python3 - "$out" "$dir" <<'PY'
import json, os, sys

with open(sys.argv[1]) as f:
    text = f.read()
# fio may print notes before the JSON object.
res = json.loads(text[text.index("{"):])
rows = []
for j in res["jobs"]:
    r = j["read"]
    opts = j.get("job options", {})
    pct = r.get("clat_ns", {}).get("percentile", {})
    bs = opts.get("bs", "")
    rows.append({
        "name": j["jobname"],
        "bs": int(bs[:-1]) * 1024 if bs.endswith("k") else int(bs or 0),
        "iodepth": int(opts.get("iodepth", 1)),
        "iops": round(r["iops"], 1),
        "lat_p50_us": round(pct.get("50.000000", 0) / 1000, 1),
        "lat_p99_us": round(pct.get("99.000000", 0) / 1000, 1),
        "bw_mib_s": round(r["bw_bytes"] / 2**20, 1),
    })
print(json.dumps({
    "fio": rows,
    "size": os.environ["FIO_SIZE"],
    "runtime_s": int(os.environ["FIO_RUNTIME"]),
    "engine": os.environ["FIO_ENGINE"],
    "dir": sys.argv[2],
    "fio_version": res.get("fio version", ""),
}))
PY
