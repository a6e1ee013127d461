# SPDX-License-Identifier: MIT
# A file written through the API with several streams, roots, device state,
# statistics and binary metadata (see mkfile.c for the exact layout).
. "$(dirname "$0")/lib.sh"

"$MKFILE" "$T" || fail "inspect_mkfile"
F=$T/multi.hlt

expect 0 "$HI" info --json "$F"
cp "$T/out" "$T/i.json"
is_json "$T/i.json"
eq "mbs" "$(js "$T/i.json" '[d["mbs"][k] for k in ("count", "stored", "zero", "untouched")]')" \
	"[36, 32, 2, 2]"
eq "streams" "$(js "$T/i.json" '[(s["name"], s["mbs"]) for s in d["streams"]]')" \
	"[('vcpu0', 10), ('vcpu1', 10), ('virtual', 10), ('physical', 2)]"
eq "stream ids" "$(js "$T/i.json" '[s["id"] for s in d["streams"]]')" \
	"[0, 1, 16777216, 33554432]"
eq "stream LBs" "$(js "$T/i.json" 'sum(s["lbs"] for s in d["streams"]) == d["lbs"]["count"]')" True
eq "vcpus" "$(js "$T/i.json" 'd["vcpus"]')" \
	"{'count': 2, 'roots': [{'vcpu': 0, 'mode': 4, 'cr3': '0x1000'}, {'vcpu': 1, 'mode': 5, 'cr3': '0x2003'}, {'vcpu': None, 'mode': 4, 'cr3': '0xabc000'}]}"
eq "device state" "$(js "$T/i.json" 'd["device_state_bytes"]')" 1000
eq "metadata" "$(js "$T/i.json" 'd["metadata"]')" \
	"{'name': 'test', 'bin': {'hex': '000102ff'}, 'cmd': ['prog', '-opt', \"value with 'quotes'\", '--flag']}"
# 2^60 + 1 survives exactly (a double would make it 2^60).
eq "stats" "$(js "$T/i.json" 'd["save_stats"]')" "{'faults': 1234, 'big': 1152921504606846977}"
eq "sections" "$(js "$T/i.json" 'sorted(s["name"] for s in d["sections"])')" \
	"['device-state', 'index', 'lb-members', 'lb-table', 'mb-map', 'metadata', 'regions', 'save-stats', 'vcpus']"

# Each stream's LBs are numbered 0, 1, 2, ... in file order.
expect 0 "$HI" blocks --json "$F"
is_json "$T/out"
eq "seqs" "$(js "$T/out" '
all([b["seq"] for b in d["lbs"] if b["stream"] == s] == list(range(sum(1 for b in d["lbs"] if b["stream"] == s)))
    for s in ("vcpu0", "vcpu1", "virtual", "physical"))')" True
eq "LB MBs" "$(js "$T/out" 'sum(b["mbs"] for b in d["lbs"])')" 32
# vcpu0 and vcpu1 filled their LBs in turns: their LBs alternate in the file.
eq "interleaved" "$(js "$T/out" '[b["stream"] for b in d["lbs"]][:4]')" \
	"['vcpu0', 'vcpu1', 'vcpu0', 'vcpu1']"

expect 0 "$HI" map --json --region rom "$F"
eq "rom states" "$(js "$T/out" '[(m["mb"], m["gpa"], m["state"]) for m in d["mbs"]]')" \
	"[(32, 4293918720, 'stored'), (33, 4293926912, 'stored'), (34, 4293935104, 'untouched'), (35, 4293943296, 'untouched')]"
expect 0 "$HI" map --json --region ram "$F"
eq "ram zero" "$(js "$T/out" '[m["mb"] for m in d["mbs"] if m["state"] == "zero"]')" "[30, 31]"

expect 0 "$HI" verify "$F"
eq "verify" "$(cat "$T/out")" "OK: $(js "$T/i.json" 'd["lbs"]["count"]') locality blocks, 32 memory blocks verified"
for r in ram rom; do
	expect 0 "$HI" extract "$F" --region $r -o "$T/x.img"
	cmp "$T/$r.img" "$T/x.img" || fail "region $r differs"
done

# The human view shows the same.
expect 0 "$HI" info "$F"
for s in "^vCPUs: 2, page-table roots: 3" "^ *? *4-level *0x0000000000abc000" "^vcpu1 *0x00000001 " \
	"^virtual *0x01000000 " "bin = hex:000102ff" "big = 1152921504606846977" \
	"^Device state: *1000 bytes" "^rom *0xfff00000 *32768 "; do
	grep -q "$s" "$T/out" || fail "info output lacks '$s'"
done
# A list: one option a line, quoted as a shell would, so it pastes into one.
sed -n '/^  cmd = /,/^      --flag$/p' "$T/out" >"$T/cmd"
printf '%s\n' "  cmd = prog \\" "      -opt 'value with '\''quotes'\''' \\" "      --flag" >"$T/want"
cmp -s "$T/cmd" "$T/want" || fail "the list shows as: $(cat "$T/cmd")"
eval "set -- $(sed 's/^  cmd = //; s/^      //; s/ \\$//' "$T/cmd" | tr '\n' ' ')"
[ $# -eq 4 ] && [ "$3" = "value with 'quotes'" ] || fail "the shell reads it back as $# words: $*"
echo PASS
