# SPDX-License-Identifier: MIT
# Command line: help, version, exit codes, option parsing, --json everywhere.
. "$(dirname "$0")/lib.sh"

expect 0 "$HI" --version
grep -q "^halite-inspect [0-9]*\.[0-9]*\.[0-9]* (file format 1\.1)$" "$T/out" || fail "version: $(cat "$T/out")"
expect 0 "$HI" help
for c in info verify blocks map extract import restore; do
	grep -q "^  $c " "$T/out" || fail "help does not list $c"
done
for c in info verify blocks map extract import restore help; do
	expect 0 "$HI" help $c
	grep -q "^Usage: halite-inspect $c" "$T/out" || fail "help $c"
	expect 0 "$HI" $c --help
	grep -q "^Usage: halite-inspect $c" "$T/out" || fail "$c --help"
done
expect 2 "$HI"
expect 2 "$HI" frobnicate
grep -q "^halite-inspect: unknown command 'frobnicate'" "$T/err" || fail "unknown command"
expect 2 "$HI" --frobnicate
expect 2 "$HI" help frobnicate
expect 2 "$HI" info
expect 2 "$HI" info --jsn x
expect 2 "$HI" map --region

gen --out "$T/img" --pages 64 --seed 4 || fail generator

# Sizes with suffixes.
for lb in 4096:4096 4K:4096 64K:65536 64k:65536 1M:1048576 1MiB:1048576 0x8000:32768; do
	import_ "$T/img" --region r -o "$T/s.hlt" --lb-size "${lb%%:*}" --mb-pages 1
	expect 0 "$HI" info --json "$T/s.hlt"
	eq "--lb-size ${lb%%:*}" "$(js "$T/out" 'd["lb_size"]')" "${lb##*:}"
done
for bad in 3K 5000 8M 0 -64K 64X ""; do
	expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --lb-size "$bad"
done
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --codec lzma
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --order sideways
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --mb-pages 0
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --seed x
expect 2 "$HI" import "$T/img" --region r
expect 2 "$HI" import "$T/img" -o "$T/bad.hlt"
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --meta source=me
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --meta novalue
sum=$(cksum <"$T/img")
expect 2 "$HI" import "$T/img" --region r -o "$T/img"	# would replace its own input
eq "input kept" "$(cksum <"$T/img")" "$sum"
expect 1 "$HI" import "$T/nonexistent.img" --region r -o "$T/bad.hlt"	# does not open: failed
[ -e "$T/bad.hlt" ] && fail "refused import left a file"

# An image that is not a whole number of pages is named.
head -c 10000 "$T/img" >"$T/ragged.img"
expect 2 "$HI" import "$T/ragged.img" --region r -o "$T/bad.hlt"
grep -q "^halite-inspect: .*ragged.img: length 10000 is not a multiple of the page size 4096" "$T/err" ||
	fail "ragged image: $(cat "$T/err")"
expect 2 "$HI" import "$T/ragged.img" --region r -o "$T/bad.hlt" --page-size 8K
expect 2 "$HI" import "$T/img" --region r -o "$T/bad.hlt" --page-size 8K --mb-pages 16 --lb-size 64K
[ -e "$T/bad.hlt" ] && fail "refused import left a file"

# Page size, level, GPA and metadata are recorded.
import_ "$T/img" --region r -o "$T/m.hlt" --page-size 8K --mb-pages 2 --lb-size 64K \
	--codec zstd --level 7 --gpa 0x40000000 --meta "owner=test suite" --meta $'tab=a\tb' \
	--meta "empty="
expect 0 "$HI" info --json "$T/m.hlt"
cp "$T/out" "$T/i.json"
is_json "$T/i.json"
eq "params" "$(js "$T/i.json" '(d["page_size"], d["mb_pages"], d["mb_size"], d["codec"], d["codec_level"])')" \
	"(8192, 2, 16384, 'zstd', 7)"
eq "gpa" "$(js "$T/i.json" 'd["regions"][0]["gpa"]')" 1073741824
eq "metadata" "$(js "$T/i.json" 'sorted(d["metadata"].items())')" \
	"[('empty', ''), ('import.order', 'physical'), ('owner', 'test suite'), ('source', 'import'), ('tab', {'hex': '610962'})]"
eq "version" "$(js "$T/i.json" 'd["version"]')" "1.1"
eq "uuid" "$(js "$T/i.json" 'len(d["uuid"]) == 32 and int(d["uuid"], 16) >= 0')" True
eq "created" "$(js "$T/i.json" 'd["created"].endswith("Z") and d["created"][:2] == "20"')" True
eq "file size" "$(js "$T/i.json" 'd["file_size"]')" "$(stat -c %s "$T/m.hlt")"
eq "sections" "$(js "$T/i.json" 'sorted(s["name"] for s in d["sections"])')" \
	"['index', 'lb-members', 'lb-table', 'mb-map', 'metadata', 'regions']"

# Human output: the parts are there, metadata is shown.
expect 0 "$HI" info "$T/m.hlt"
for s in "Codec: *zstd, level 7" "Page size: *8192" "Compression ratio:" "File/memory ratio:" \
	"^Streams:" "^Sections:" "owner = test suite" "tab = hex:610962" "^r  *0x40000000 "; do
	grep -q "$s" "$T/out" || fail "info output lacks '$s'"
done
expect 0 "$HI" blocks "$T/m.hlt"
eq "blocks rows" "$(($(wc -l <"$T/out") - 1))" "$(js "$T/i.json" 'd["lbs"]["count"]')"
expect 0 "$HI" map "$T/m.hlt"
eq "map rows" "$(($(wc -l <"$T/out") - 1))" "$(js "$T/i.json" 'd["mbs"]["count"]')"

# Every --json output is one JSON document.
for cmd in "info" "verify" "blocks" "map" "map --region r"; do
	expect 0 "$HI" $cmd --json "$T/m.hlt"
	is_json "$T/out"
done
expect 0 "$HI" extract --json "$T/m.hlt" -o "$T/x.img"
is_json "$T/out"
cmp "$T/img" "$T/x.img" || fail "8K-page round trip"
expect 0 "$HI" import --json --no-sync "$T/img" --region r -o "$T/j.hlt" --order random --seed 1
is_json "$T/out"
eq "import json" "$(js "$T/out" '(d["order"], d["seed"], d["mbs"]["count"])')" "('random', 1, 32)"
echo PASS
