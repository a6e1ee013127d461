# SPDX-License-Identifier: MIT
# halite-inspect restore: real traces written by the restore engine
# (inspect_mkrestore; its header has the file's layout and the three runs),
# shown exactly; then docs/restore-trace.md's rules broken one at a time, each
# refused with exit 1 and the line named; then usage errors, exit 2.
. "$(dirname "$0")/lib.sh"
MKRESTORE=${6:?usage: restore.sh HALITE_INSPECT PYTHON3 SOURCE_DIR RESEAL MKFILE MKRESTORE}

"$MKRESTORE" "$T" 2>"$T/mk.err"
rc=$?
cat "$T/mk.err" >&2
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || fail "inspect_mkrestore exit status $rc"
F=$T/r.hlt

expect 0 "$HI" info --json "$F"
UUID=$(js "$T/out" 'd["uuid"]')

# The engine writes 'stat lb_hot' (a relayouted file's hot prefix; none
# here) after the 23 stats the line numbers below count: read as it is
# written, then dropped (unknown stats are skipped: ext.trace below).
for tr in "$T"/*.trace; do
	grep -qx "stat lb_hot 0" "$tr" || fail "$tr: no 'stat lb_hot 0'"
	expect 0 "$HI" restore "$F" "$tr"
	grep -qxF "Hot prefix:         0 LBs read first (the file has no hot prefix)" "$T/out" ||
		fail "$tr: hot prefix: $(grep '^Hot' "$T/out")"
	expect 0 "$HI" restore --json "$F" "$tr"
	eq "$tr: hot_prefix" "$(js "$T/out" 'd["hot_prefix"]')" \
		"{'lb_hot': 0, 'file_hot_lbs': None, 'traces': None}"
	sed -i '/^stat lb_hot /d' "$tr"
done
# A trace written before lb_hot existed: no number, not a zero.
expect 0 "$HI" restore "$F" "$T/full.trace"
grep -qxF "Hot prefix:         not in the trace (the file has no hot prefix)" "$T/out" ||
	fail "no lb_hot: $(grep '^Hot' "$T/out")"
expect 0 "$HI" restore --json "$F" "$T/full.trace"
eq "no lb_hot" "$(js "$T/out" 'd["hot_prefix"]')" \
	"{'lb_hot': None, 'file_hot_lbs': None, 'traces': None}"

# trace_stat TRACE NAME: a stat's value as the trace has it.
trace_stat() {
	sed -n "s/^stat $2 //p" "$1"
}

# The tool reports every stat exactly as the trace has it: integers as
# integers, done as a boolean, vm_access_pct as a number or null.
check_stats() {
	local tr=$1 js_file=$2
	"$PY" - "$tr" "$js_file" <<'EOF' || fail "stats of $2 differ from $1"
import json, sys
names = ["ready_ns", "duration_ns", "mb_total", "mb_fault", "mb_pool", "mb_prefetch",
         "mb_zero", "faults", "faults_cached", "faults_zero", "faults_vcpu", "lb_total",
         "lb_demand", "lb_prefetch", "lb_retries", "bytes_read", "mb_staged",
         "mb_staged_accessed", "vm_access_pct", "fault_p50_ns", "fault_p99_ns", "done", "error"]
raw = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "stat":
        raw[f[1]] = f[2]
st = json.load(open(sys.argv[2]))["stats"]
assert list(st) == names, list(st)
for n in names:
    want = raw[n]
    if n == "vm_access_pct":
        want = None if want.startswith("-") else float(want)
    elif n == "done":
        want = want == "1"
    else:
        want = int(want)
    assert st[n] == want and type(st[n]) == type(want), (n, st[n], want)
EOF
}

# ---- demand only, then cancelled: LBs 0, 3, 4 and 7 demanded, six never read.
expect 0 "$HI" restore --json "$F" "$T/demand.trace"
cp "$T/out" "$T/d.json"
is_json "$T/d.json"
check_stats "$T/demand.trace" "$T/d.json"
eq "head" "$(js "$T/d.json" '(d["file"], d["trace"], d["uuid"], d["lb_count"], d["mb_count"])')" \
	"('$F', '$T/demand.trace', '$UUID', 10, 32)"
eq "demand stats" "$(js "$T/d.json" '[d["stats"][k] for k in ("mb_total", "mb_fault", "mb_pool",
	"mb_prefetch", "mb_zero", "lb_total", "lb_demand", "lb_prefetch", "lb_retries", "bytes_read",
	"mb_staged", "mb_staged_accessed", "vm_access_pct", "done", "error")]')" \
	"[32, 4, 4, 0, 12, 10, 4, 0, 0, 65536, 0, 0, None, False, -125]"
eq "demand faults" "$(js "$T/d.json" '(d["stats"]["faults"] >= 6 and d["stats"]["faults_zero"] >= 2
	and d["stats"]["faults_vcpu"] == d["stats"]["faults"] and d["stats"]["fault_p50_ns"] > 0
	and d["stats"]["ready_ns"] > 0 and d["stats"]["duration_ns"] > 0)')" True
eq "error_text" "$(js "$T/d.json" 'd["error_text"]')" "Operation canceled"
eq "totals" "$(js "$T/d.json" 'd["totals"]')" "{'lbs': 10, 'demand': 4, 'prefetch': 0, 'never': 6}"
eq "streams" "$(js "$T/d.json" '[tuple(s.values()) for s in d["streams"]]')" \
	"[('vcpu0', 0, 4, 3, 0, 1), ('physical', 33554432, 6, 1, 0, 5)]"
eq "stream keys" "$(js "$T/d.json" 'list(d["streams"][0])')" \
	"['stream', 'stream_id', 'lbs', 'demand', 'prefetch', 'never']"
eq "no lbs without --blocks" "$(js "$T/d.json" '"lbs" in d')" False

expect 0 "$HI" restore "$F" "$T/demand.trace" --json --blocks
cp "$T/out" "$T/db.json"
is_json "$T/db.json"
check_stats "$T/demand.trace" "$T/db.json"
eq "lb keys" "$(js "$T/db.json" 'list(d["lbs"][0])')" \
	"['lb', 'stream', 'stream_id', 'seq', 'fate', 't_ns', 'fault_mb', 'staged', 'accessed']"
eq "lb rows" "$(js "$T/db.json" '[(l["lb"], l["stream"], l["seq"], l["fate"], l["fault_mb"],
	l["staged"], l["accessed"]) for l in d["lbs"]]')" \
	"[(0, 'vcpu0', 0, 'demand', 1, 0, 0), (1, 'physical', 0, 'never', None, None, None), \
(2, 'physical', 1, 'never', None, None, None), (3, 'vcpu0', 1, 'demand', 2, 0, 0), \
(4, 'vcpu0', 2, 'demand', 5, 0, 0), (5, 'physical', 2, 'never', None, None, None), \
(6, 'physical', 3, 'never', None, None, None), (7, 'physical', 4, 'demand', 16, 0, 0), \
(8, 'vcpu0', 3, 'never', None, None, None), (9, 'physical', 5, 'never', None, None, None)]"
# Touched one after the other: each LB was in before the next fault.
eq "t_ns" "$(js "$T/db.json" '([l["t_ns"] for l in d["lbs"] if l["fate"] == "demand"] ==
	sorted(int(x.split()[3]) for x in open("'"$T/demand.trace"'") if x.startswith("lb ")))')" True
eq "never t_ns" "$(js "$T/db.json" 'set(l["t_ns"] for l in d["lbs"] if l["fate"] == "never")')" "{None}"

expect 0 "$HI" restore --json --stream vcpu0 "$F" "$T/demand.trace"
eq "--stream vcpu0" "$(js "$T/out" '(d["stream"], [(l["lb"], l["fate"]) for l in d["lbs"]])')" \
	"('vcpu0', [(0, 'demand'), (3, 'demand'), (4, 'demand'), (8, 'never')])"
expect 0 "$HI" restore --json --blocks --stream physical "$F" "$T/demand.trace"
eq "--stream physical" "$(js "$T/out" '[l["lb"] for l in d["lbs"] if l["stream"] == "physical"]')" \
	"[1, 2, 5, 6, 7, 9]"
eq "--stream physical rows" "$(js "$T/out" 'len(d["lbs"])')" 6

# For people.
faults=$(trace_stat "$T/demand.trace" faults)
cached=$(trace_stat "$T/demand.trace" faults_cached)
zero=$(trace_stat "$T/demand.trace" faults_zero)
expect 0 "$HI" restore "$F" "$T/demand.trace"
cp "$T/out" "$T/d.txt"
while IFS= read -r want; do
	grep -qxF -- "$want" "$T/d.txt" || { cat "$T/d.txt" >&2; fail "demand: no line '$want'"; }
done <<EOF
File:               $F
Trace:              $T/demand.trace
UUID:               $UUID
Result:             failed: Operation canceled (-125)
Faults:             $faults (answered from memory $cached, zero $zero, from vCPUs $faults)
Memory blocks:      32, installed by
  fault                       4   12.5%
  pool                        4   12.5%
  prefetch                    0    0.0%
  zero                       12   37.5%
  not installed              12   37.5%
Locality blocks:    10: demand 4 (40.0%), prefetch 0 (0.0%), never read 6 (60.0%)
Bytes read:         65536 (64.0 KiB)
Retries:            0
VM access:          not measured
Streams (locality blocks):
STREAM    LBS  DEMAND  PREFETCH  NEVER  DEMAND%
vcpu0       4       3         0      1    75.0%
physical    6       1         0      5    16.7%
EOF
for s in "^Ready: .* (open to ready)$" "^Duration: .* (ready to the end)$" \
	"^Fault service: *p50 [0-9.]* [nuµm]*s, p99 [0-9.]* [nuµm]*s$"; do
	grep -q "$s" "$T/d.txt" || fail "demand: no line matching '$s'"
done
grep -q "^Per locality block" "$T/d.txt" && fail "rows without --blocks"

expect 0 "$HI" restore --blocks "$F" "$T/demand.trace"
eq "text rows" "$(sed -n '/^Per locality block:$/,$p' "$T/out" | wc -l)" 12
grep -q "^LB  STREAM  *SEQ  FATE  *T_MS  FAULT_MB  STAGED  ACCESSED$" "$T/out" || fail "blocks heading"
grep -qE "^ 0  vcpu0 +0  demand +[0-9]+\.[0-9]{3} +1 +0 +0$" "$T/out" || fail "row of LB 0"
grep -qE "^ 7  physical +4  demand +[0-9]+\.[0-9]{3} +16 +0 +0$" "$T/out" || fail "row of LB 7"
grep -qE "^ 9  physical +5  never +- +- +- +-$" "$T/out" || fail "row of LB 9"
expect 0 "$HI" restore --stream vcpu0 "$F" "$T/demand.trace"
eq "text rows of vcpu0" "$(sed -n '/^Per locality block, stream vcpu0:$/,$p' "$T/out" | wc -l)" 6

# ---- prefetch, nothing touched: every LB prefetched, done.
expect 0 "$HI" restore --json --blocks "$F" "$T/full.trace"
cp "$T/out" "$T/f.json"
check_stats "$T/full.trace" "$T/f.json"
eq "full stats" "$(js "$T/f.json" '[d["stats"][k] for k in ("faults", "mb_fault", "mb_pool",
	"mb_prefetch", "mb_zero", "lb_demand", "lb_prefetch", "bytes_read", "vm_access_pct", "done",
	"error")] + [d["error_text"]]')" "[0, 0, 0, 20, 12, 0, 10, 163840, None, True, 0, None]"
eq "full streams" "$(js "$T/f.json" '[tuple(s.values()) for s in d["streams"]]')" \
	"[('vcpu0', 0, 4, 0, 4, 0), ('physical', 33554432, 6, 0, 6, 0)]"
eq "full lbs" "$(js "$T/f.json" 'set((l["fate"], l["fault_mb"], l["staged"], l["accessed"])
	for l in d["lbs"])')" "{('prefetch', None, 0, 0)}"
eq "full lb count" "$(js "$T/f.json" 'len(d["lbs"])')" 10
expect 0 "$HI" restore "$F" "$T/full.trace"
for want in "Result:             done" \
	"Locality blocks:    10: demand 0 (0.0%), prefetch 10 (100.0%), never read 0 (0.0%)" \
	"  prefetch                   20   62.5%" "vcpu0       4       0         4      0     0.0%"; do
	grep -qxF -- "$want" "$T/out" || fail "full: no line '$want'"
done
grep -q "not installed" "$T/out" && fail "full: blocks not installed"

# ---- TRACK_ACCESS: all demand, 1 staged per LB, 2 of them accessed.
expect 0 "$HI" restore --json --blocks "$F" "$T/track.trace"
cp "$T/out" "$T/t.json"
check_stats "$T/track.trace" "$T/t.json"
eq "track stats" "$(js "$T/t.json" '[d["stats"][k] for k in ("mb_fault", "mb_pool", "lb_demand",
	"mb_staged", "mb_staged_accessed", "vm_access_pct", "done")]')" "[12, 8, 10, 10, 2, 20.0, True]"
eq "track lbs" "$(js "$T/t.json" '[(l["fate"], l["fault_mb"], l["staged"], l["accessed"])
	for l in d["lbs"]][:3]')" "[('demand', 0, 1, 1), ('demand', 8, 1, 1), ('demand', 10, 1, 0)]"
eq "track fault_mb" "$(js "$T/t.json" '[l["fault_mb"] for l in d["lbs"]]')" \
	"[0, 8, 10, 2, 4, 12, 14, 16, 6, 18]"
expect 0 "$HI" restore "$F" "$T/track.trace"
grep -qxF "VM access:          20.00% (2 of 10 staged blocks touched)" "$T/out" || fail "VM access"

# ---- unknown stats after the known ones are skipped (later versions add them).
"$PY" - "$T/demand.trace" "$T/ext.trace" <<'EOF'
import sys
L = open(sys.argv[1]).read().split("\n")[:-1]
L[25:25] = ["stat new_counter 17", "stat new_ratio -0.5e3"]
open(sys.argv[2], "w").write("".join(l + "\n" for l in L))
EOF
expect 0 "$HI" restore --json "$F" "$T/ext.trace"
eq "unknown stats skipped" "$(js "$T/out" '"new_counter" in d["stats"] or len(d["stats"])')" 23

# ---- every rule broken once: exit 1, nothing on stdout, the line named.
# bad SRC LINE MESSAGE CODE: Python CODE edits L (SRC's lines, no newlines) or
# sets RAW (bytes to write instead); restore must fail at LINE with MESSAGE.
bad() {
	local src=$1 line=$2 msg=$3
	"$PY" - "$src" "$T/bad.trace" "$4" <<'EOF' || fail "mutation $4"
import sys
L = open(sys.argv[1]).read().split("\n")[:-1]
RAW = None
exec(sys.argv[3])
open(sys.argv[2], "wb").write(RAW if RAW is not None else "".join(l + "\n" for l in L).encode())
EOF
	for j in "" --json; do
		expect 1 "$HI" restore $j "$F" "$T/bad.trace"
		# Text: nothing on stdout. --json: only the failure object.
		if [ -z "$j" ]; then
			[ -s "$T/out" ] && fail "output for a bad trace ($4)"
		else
			eq "json ($4)" "$("$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print((d["ok"], d["exit"], d["error"].startswith(sys.argv[2])))' "$T/out" "$T/bad.trace:$line: $msg")" \
				"(False, 1, True)"
		fi
		grep -qF -- "halite-inspect: restore: $T/bad.trace:$line: $msg" "$T/err" ||
			fail "$4: expected '$T/bad.trace:$line: $msg', got: $(cat "$T/err")"
	done
}
D=$T/demand.trace	# lines: 1 header, 2 uuid, 3..25 stats, 26..29 LBs 0, 3, 4, 7
FULL=$T/full.trace	# 26..35 LBs 0..9
OTHER=$(printf '%s' "$UUID" | tr 0-9a-f 1-9a-f0)

bad $D 1 "expected 'halite-restore-trace 1' or 2, got 'halite-trace 1'" 'L[0] = "halite-trace 1"'
bad $D 1 "trace version 3: this reader knows versions 1 and 2 only" 'L[0] = "halite-restore-trace 3"'
bad $D 1 "expected 'halite-restore-trace 1' or 2, got 'halite-restore-trace 01'" 'L[0] = "halite-restore-trace 01"'
bad $D 29 "no 'learn <window_ms> <complete>' line after the lb lines: version 2 has one" \
	'L[0] = "halite-restore-trace 2"'
bad $D 2 "expected 'file-uuid <32 lowercase hex digits>'" 'L[1] = L[1].upper().replace("FILE-UUID", "file-uuid")'
bad $D 2 "expected 'file-uuid <32 lowercase hex digits>'" 'L[1] = L[1][:-1]'
bad $D 2 "file-uuid $OTHER is not the uuid of $F ($UUID)" "L[1] = 'file-uuid $OTHER'"
bad $D 6 "expected 'stat mb_fault <integer>', got 'stat mb_pool 4'" 'del L[5]'
bad $D 7 "expected 'stat mb_pool <integer>', got 'stat mb_prefetch 0'" 'L[6], L[7] = L[7], L[6]'
bad $D 10 "expected 'stat faults <integer>', got 'stat faults 06'" 'L[9] = "stat faults 06"'
bad $D 10 "expected 'stat faults <integer>', got 'stat faults -6'" 'L[9] = "stat faults -6"'
bad $D 10 "expected 'stat faults <integer>'" 'L[9] = "stat faults 18446744073709551616"'
bad $D 10 "expected 'stat faults <integer>'" 'L[9] = "stat faults"'
bad $D 10 "expected 'stat faults <integer>'" 'L[9] = "stat faults 6 7"'
bad $D 21 "expected 'stat vm_access_pct <percent with two decimals>', got 'stat vm_access_pct -1'" \
	'L[20] = "stat vm_access_pct -1"'
bad $D 21 "expected 'stat vm_access_pct <percent with two decimals>'" 'L[20] = "stat vm_access_pct 20.5"'
bad $D 24 "expected 'stat done <0 or 1>', got 'stat done 2'" 'L[23] = "stat done 2"'
bad $D 25 "expected 'stat error <0 or a negative integer>', got 'stat error 125'" 'L[24] = "stat error 125"'
bad $D 25 "expected 'stat error <0 or a negative integer>', got 'stat error -0'" 'L[24] = "stat error -0"'
bad $D 25 "error 0 in a restore that did not complete (done 0)" 'L[24] = "stat error 0"'
bad $FULL 25 "error -5 in a restore that completed (done 1)" 'L[24] = "stat error -5"'
bad $D 5 "mb_total 33, but $F has 32 memory blocks" 'L[4] = "stat mb_total 33"'
bad $D 14 "lb_total 9, but $F has 10 locality blocks" 'L[13] = "stat lb_total 9"'
bad $D 26 "stat 'faults' given twice" 'L.insert(25, "stat faults 1")'
bad $D 26 "expected 'stat <name> <value>' or 'lb <index> <how> <t_ns> <fault_mb> <staged> <accessed>'" \
	'L.insert(25, "stat Bad-Name 1")'
bad $D 27 "stat line after the lb lines" 'L.insert(26, "stat later 1")'
bad $D 29 "LB index 10 out of range: $F has 10 locality blocks" 'L[28] = L[28].replace("lb 7 ", "lb 10 ")'
bad $D 28 "LB 3 after LB 4: lb lines must be in ascending order of index" 'L[26], L[27] = L[27], L[26]'
bad $D 27 "LB 0 listed twice" 'L.insert(26, L[25])'
bad $D 26 "LB 0: fault_mb 2 is stored in LB 3, not in this one" 'L[25] = "lb 0 demand 5 2 0 0"'
bad $D 26 "LB 0: fault_mb 21 is a zero block, stored nowhere" 'L[25] = "lb 0 demand 5 21 0 0"'
bad $D 26 "LB 0: fault_mb 30 is an untouched block, stored nowhere" 'L[25] = "lb 0 demand 5 30 0 0"'
bad $D 26 "LB 0: fault_mb 32 is not a memory block of $F (it has 32)" 'L[25] = "lb 0 demand 5 32 0 0"'
bad $D 26 "LB 0: staged 2, but the LB holds only 1 other blocks" 'L[25] = "lb 0 demand 5 1 2 0"'
bad $D 26 "LB 0: accessed 1 exceeds staged 0" 'L[25] = "lb 0 demand 5 1 0 1"'
bad $D 26 "LB 0: a prefetched LB has staged 0 and accessed 0" 'L[25] = "lb 0 prefetch 5 - 1 0"'
bad $D 26 "expected 'lb <index> <how> <t_ns> <fault_mb> <staged> <accessed>', got 'lb 0 prefetch 5 1 0 0'" \
	'L[25] = "lb 0 prefetch 5 1 0 0"'
bad $D 26 "expected 'lb <index> <how> <t_ns> <fault_mb> <staged> <accessed>', got 'lb 0 demand 5 - 0 0'" \
	'L[25] = "lb 0 demand 5 - 0 0"'
bad $D 26 "expected 'lb <index> <how> <t_ns> <fault_mb> <staged> <accessed>', got 'lb 0 fault 5 1 0 0'" \
	'L[25] = "lb 0 fault 5 1 0 0"'
bad $D 26 "expected 'lb <index>" 'L[25] = "lb 0 demand 5 1 0"'
bad $D 26 "expected 'lb <index>" 'L[25] = "lb 00 demand 5 1 0 0"'
bad $D 10 "trailing space" 'L[9] += " "'
bad $D 10 "leading space" 'L[9] = " " + L[9]'
bad $D 10 "two spaces in a row" 'L[9] = L[9].replace(" ", "  ", 1)'
bad $D 10 "byte 0x09 at column 5" 'L[9] = L[9].replace(" ", "\t", 1)'
bad $D 10 "byte 0xc3 at column 1" 'L[9] = "é" + L[9]'
bad $D 1 "carriage return in line (CRLF line ends?)" 'RAW = "".join(l + "\r\n" for l in L).encode()'
bad $D 29 "carriage return in line (CRLF line ends?)" 'L[28] += "\r"'
bad $D 11 "empty line" 'L.insert(10, "")'
bad $D 29 "the last line does not end with a newline" 'RAW = "\n".join(L).encode()'
bad $D 11 "unexpected end of file; expected 'stat faults_cached <integer>'" 'L = L[:10]'
bad $D 3 "unexpected end of file; expected 'stat ready_ns <integer>'" 'L = L[:2]'
bad $D 1 "empty file; expected 'halite-restore-trace 1' or 2" 'L = []'
bad $FULL 34 "a completed restore lists every LB: 9 lb lines, lb_total 10" 'del L[30]'
bad $FULL 35 "a completed restore has lb_demand demand lines: 0, lb_demand 1" \
	'L[14] = "stat lb_demand 1"; L[15] = "stat lb_prefetch 9"'
"$PY" -c 'import sys; sys.stdout.write("stat x " + "1" * 5000 + "\n")' >"$T/long"
bad $D 26 "line longer than 4096 bytes" 'L.insert(25, open("'"$T/long"'").read()[:-1])'

# ---- version 2 (a learning restore): full.trace with a learn line and touches.
L2=$T/learn.trace	# 36 learn, 37.. touches
{
	sed '1s/ 1$/ 2/' "$FULL"
	printf 'learn 5000 1\ntouch 100 0 2 stored\ntouch 100 - 21 zero\ntouch 250 0 30 untouched\n'
	printf 'touch 900 0 0 stored\n'
} >"$L2"
expect 0 "$HI" restore --json "$F" "$L2"
is_json "$T/out"
eq "learn" "$(js "$T/out" '(d["trace_version"], d["learn"])')" \
	"(2, {'window_ms': 5000, 'complete': True, 'touches': 4, 'stored': 2, 'zero': 1, 'untouched': 1, 'not_vcpu': 1, 'vcpus': [{'vcpu': 0, 'touches': 3}]})"
expect 0 "$HI" restore --json "$F" "$FULL"
eq "v1 learn" "$(js "$T/out" '(d["trace_version"], d["learn"])')" "(1, None)"
expect 0 "$HI" restore "$F" "$L2"
grep -q "^Learning: *4 memory blocks first touched in a 5000 ms window (complete): stored 2, zero 1, never-touched 1$" \
	"$T/out" || fail "learning text: $(cat "$T/out")"
grep -q "^Touches by: *vcpu0 3, other threads 1$" "$T/out" || fail "touches text: $(cat "$T/out")"
bad $L2 36 "expected 'learn <window_ms> <complete>', got 'learn 5000 2'" 'L[35] = "learn 5000 2"'
bad $L2 36 "expected 'learn <window_ms> <complete>'" 'L[35] = "learn 5000"'
bad $L2 37 "expected 'touch <t_ns> <vcpu> <mb> <stored|zero|untouched>', got 'touch 100 0 2 hot'" \
	'L[36] = "touch 100 0 2 hot"'
bad $L2 41 "a second learn line" 'L.append("learn 1 1")'
bad $L2 37 "memory block 32 out of range: $F has 32 memory blocks" 'L[36] = "touch 100 0 32 stored"'
bad $L2 37 "vCPU 1 out of range: $F has 1 vCPUs" 'L[36] = "touch 100 1 2 stored"'
bad $L2 37 "memory block 2 is stored in $F, not zero" 'L[36] = "touch 100 0 2 zero"'
bad $L2 38 "memory block 21 is zero in $F, not untouched" 'L[37] = "touch 100 - 21 untouched"'
bad $L2 39 "memory block 30 is untouched in $F, not stored" 'L[38] = "touch 250 0 30 stored"'
bad $L2 40 "memory block 2 touched twice" 'L[39] = "touch 900 0 2 stored"'
bad $L2 38 "t_ns 99 before the previous touch's 100: touch lines are in touch order" \
	'L[37] = "touch 99 - 21 zero"'
bad $L2 36 "expected 'lb <index>" 'L.insert(35, "touch 1 0 2 stored")'

# ---- version 2 written by a template (the clone service's hot set): the learn
# line right after file-uuid, no stat or lb lines.
TP=$T/template.trace	# 3 learn, 4.. touches
{
	head -n 2 "$L2"
	printf 'learn 2000 0\ntouch 0 - 2 stored\ntouch 7 0 0 stored\n'
} >"$TP"
expect 0 "$HI" restore --json "$F" "$TP"
is_json "$T/out"
eq "template" "$(js "$T/out" '(d["written_by"], d["stats"], d["error_text"], d["totals"], d["learn"])')" \
	"('template', None, None, {'lbs': 10, 'demand': 0, 'prefetch': 0, 'never': 10}, {'window_ms': 2000, 'complete': False, 'touches': 2, 'stored': 2, 'zero': 0, 'untouched': 0, 'not_vcpu': 1, 'vcpus': [{'vcpu': 0, 'touches': 1}]})"
expect 0 "$HI" restore --json "$F" "$L2"
eq "restore written_by" "$(js "$T/out" 'd["written_by"]')" "restore"
expect 0 "$HI" restore "$F" "$TP"
grep -q "^Written by: *a template (the clone service's hot set): no restore statistics, no LB read$" \
	"$T/out" || fail "template text: $(cat "$T/out")"
grep -q "^Learning: *2 memory blocks first touched in a 2000 ms window (cut short): stored 2, zero 0, never-touched 0$" \
	"$T/out" || fail "template learning text: $(cat "$T/out")"
grep -q "^Result:\|^Faults:" "$T/out" && fail "template text has restore statistics: $(cat "$T/out")"
# Its touches are checked as a restore's; version 1 has no such form.
bad $TP 5 "memory block 2 touched twice" 'L[4] = "touch 7 0 2 stored"'
bad $TP 4 "memory block 2 is stored in $F, not zero" 'L[3] = "touch 0 - 2 zero"'
bad $TP 3 "expected 'stat ready_ns <integer>', got 'learn 2000 0'" 'L[0] = "halite-restore-trace 1"'
bad $TP 4 "expected 'touch <t_ns> <vcpu> <mb> <stored|zero|untouched>', got 'stat ready_ns 1'" \
	'L.insert(3, "stat ready_ns 1")'
bad $TP 3 "unexpected end of file; expected 'stat ready_ns <integer>' or (written by a template) 'learn <window_ms> <complete>'" \
	'L = L[:2]'
bad $TP 3 "expected 'learn <window_ms> <complete>', got 'learn 2000'" 'L[2] = "learn 2000"'

# ---- stat lb_hot: at most lb_prefetch, once, at most the file's hot prefix.
bad $FULL 26 "expected 'stat lb_hot <integer>', got 'stat lb_hot 01'" 'L.insert(25, "stat lb_hot 01")'
bad $FULL 27 "stat 'lb_hot' given twice" 'L[25:25] = ["stat lb_hot 0", "stat lb_hot 0"]'
bad $D 26 "lb_hot 1 exceeds lb_prefetch 0: the hot LBs read first are prefetched" \
	'L.insert(25, "stat lb_hot 1")'
bad $FULL 26 "lb_hot 1, but $F has no hot prefix (not relayouted)" \
	'L.insert(25, "stat lb_hot 1")'

# A relayouted file (from the learning trace above) and a trace of a restore
# of it that read its whole hot prefix first, then the rest.
expect 0 "$HI" relayout "$F" --trace "$L2" -o "$T/rl.hlt" --json
HOT=$(js "$T/out" 'd["hot_lbs"]')
[ "$HOT" -gt 0 ] || fail "relayout: hot_lbs $HOT"
expect 0 "$HI" info --json "$T/rl.hlt"
cp "$T/out" "$T/rl.json"
# rl_trace LB_HOT OUT: every LB prefetched, done; stat lb_hot LB_HOT.
rl_trace() {
	"$PY" - "$T/rl.json" "$1" "$2" <<'EOF' || fail "rl_trace $1"
import json, sys
d = json.load(open(sys.argv[1]))
nlb, nmb = d["lbs"]["count"], d["mbs"]["count"]
st = dict(ready_ns=1000, duration_ns=5000, mb_total=nmb, mb_fault=0, mb_pool=0,
          mb_prefetch=nmb, mb_zero=0, faults=0, faults_cached=0, faults_zero=0, faults_vcpu=0,
          lb_total=nlb, lb_demand=0, lb_prefetch=nlb, lb_retries=0, bytes_read=nlb * 16384,
          mb_staged=0, mb_staged_accessed=0, vm_access_pct="-1.00", fault_p50_ns=0,
          fault_p99_ns=0, done=1, error=0, lb_hot=int(sys.argv[2]))
L = ["halite-restore-trace 1", "file-uuid " + d["uuid"]]
L += ["stat %s %s" % kv for kv in st.items()]
L += ["lb %d prefetch %d - 0 0" % (i, 100 + i) for i in range(nlb)]
open(sys.argv[3], "w").write("".join(l + "\n" for l in L))
EOF
}
rl_trace "$HOT" "$T/rl.trace"
expect 0 "$HI" restore "$T/rl.hlt" "$T/rl.trace"
LBS=LBs; [ "$HOT" -eq 1 ] && LBS=LB
grep -qxF "Hot prefix:         $HOT $LBS read first, of the file's $HOT (relayouted from 1 trace)" \
	"$T/out" || fail "relayouted: $(grep '^Hot' "$T/out")"
expect 0 "$HI" restore --json "$T/rl.hlt" "$T/rl.trace"
eq "relayouted hot_prefix" "$(js "$T/out" 'd["hot_prefix"]')" \
	"{'lb_hot': $HOT, 'file_hot_lbs': $HOT, 'traces': 1}"
# --hot-prefix 0 (or a restore without a prefetcher): none read first.
rl_trace 0 "$T/rl0.trace"
expect 0 "$HI" restore "$T/rl.hlt" "$T/rl0.trace"
grep -qxF "Hot prefix:         0 LBs read first, of the file's $HOT (relayouted from 1 trace)" \
	"$T/out" || fail "relayouted, none read first: $(grep '^Hot' "$T/out")"
rl_trace $((HOT + 1)) "$T/rl1.trace"
expect 1 "$HI" restore "$T/rl.hlt" "$T/rl1.trace"
grep -qxF "halite-inspect: restore: $T/rl1.trace:26: lb_hot $((HOT + 1)), but the hot prefix of $T/rl.hlt is $HOT LBs" \
	"$T/err" || fail "lb_hot past the hot prefix: $(cat "$T/err")"

# A trace of another snapshot, with a valid syntax: refused by its uuid.
expect 0 "$MKFILE" "$T"
expect 1 "$HI" restore "$T/multi.hlt" "$T/full.trace"
grep -q "full.trace:2: file-uuid $UUID is not the uuid of $T/multi.hlt" "$T/err" || fail "other file: $(cat "$T/err")"

# ---- usage and I/O errors: exit 2.
expect 0 "$HI" restore --help
grep -q "^Usage: halite-inspect restore \[--json\] \[--blocks\] \[--stream STREAM\] FILE TRACE$" "$T/out" ||
	fail "restore --help"
for key in vm_access_pct error_text totals streams stream_id fate t_ns fault_mb staged accessed \
	hot_prefix lb_hot file_hot_lbs; do
	grep -q "$key" "$T/out" || fail "--help does not document $key"
done
expect 2 "$HI" restore
expect 2 "$HI" restore "$F"
expect 2 "$HI" restore "$F" "$D" "$D"
expect 2 "$HI" restore --frobnicate "$F" "$D"
expect 2 "$HI" restore "$F" "$D" --stream
for s in bogus vcpu vcpu01 vcpu-1 virtual.0 physical. "kind1.0" vcpu16777216 ""; do
	expect 2 "$HI" restore --stream "$s" "$F" "$D"
	grep -q "bad stream" "$T/err" || fail "--stream '$s': $(cat "$T/err")"
done
expect 2 "$HI" restore --stream vcpu1 "$F" "$D"
grep -qF "halite-inspect: restore: $F: no stream 'vcpu1'; the file has: vcpu0, " "$T/err" ||
	fail "absent stream: $(cat "$T/err")"
expect 1 "$HI" restore "$F" "$T/nonexistent.trace"	# a file that does not open: failed, 1
grep -qF "$T/nonexistent.trace: No such file or directory" "$T/err" || fail "missing trace"
expect 2 "$HI" restore "$F" "$T"	# a directory: cannot be a trace
grep -qF "halite-inspect: restore: $T: not a regular file (a directory)" "$T/err" || fail "trace dir"
expect 1 "$HI" restore "$T/nonexistent.hlt" "$D"
# A bad snapshot is the file's fault: 1, as for every command.
head -c 8192 "$F" >"$T/cut.hlt"
expect 1 "$HI" restore "$T/cut.hlt" "$D"
echo PASS
