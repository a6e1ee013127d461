#!/usr/bin/env bash
# Build the QEMU test guest (testing/guest-image/README.md): Debian's kernel from
# linux-image-amd64 and a busybox-static initramfs whose /init starts busybox
# httpd on port 80 and the verifier (testing/guest-image/verifier.c, built here with
# gcc -static), which fills memory with known data and keeps checking it.
#
#   scripts/make-guest.sh [--no-deps] [--boot-test] [--mib N] [--timeout S]
#                         [--append PARAMS] [--nic-model MODEL] [--bzimage] [OUTDIR]
#
# OUTDIR (default build/guest-image/) receives vmlinuz (Debian's bzImage),
# vmlinux (the same kernel uncompressed, for a faster PVH boot, when the
# kernel has CONFIG_PVH), initrd.img, verifier, append (a kernel command line
# to start from) and kernel-version.
# --no-deps    do not run scripts/install-deps.sh --guest first
# --boot-test  then boot the guest under QEMU (TCG, 2 vCPUs, 512 MiB on a
#              shared memfd, user network, QMP), wait for the verifier's ok
#              lines on the serial console, fetch /status over HTTP, ask for a
#              digest, fetch and check page 1000 (pages.c), list the vCPU
#              threads over QMP, quit QEMU, summarise
# --mib N      verifier memory for the boot test (default 64)
# --timeout S  seconds to wait for the verifier in the boot test (default 60)
# --append P   more kernel parameters for the boot test (e.g. verifier.seed=7)
# --nic-model M  the boot test's NIC (default: QEMU's, e1000e on q35;
#              virtio-net-pci comes up about 2 s sooner)
# --bzimage    boot the test with vmlinuz, not vmlinux (about 4 s slower)
# Exit 0 on success, 1 with a message on any failure, 2 on bad usage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/guest-image
deps=1
boot=0
mib=64
timeout=60
extra=
nic=
bzimage=0
while [[ $# -gt 0 ]]; do
	case "$1" in
	--mib|--timeout)
		[[ $# -ge 2 && $2 =~ ^[0-9]+$ && $2 -gt 0 ]] ||
			{ echo "make-guest.sh: $1 needs a positive number" >&2; exit 2; } ;;&
	--mib) mib=$2; shift ;;
	--timeout) timeout=$2; shift ;;
	--append|--nic-model)
		[[ $# -ge 2 ]] || { echo "make-guest.sh: $1 needs a value" >&2; exit 2; } ;;&
	--append) extra=$2; shift ;;
	--nic-model) nic=",model=$2"; shift ;;
	--no-deps) deps=0 ;;
	--bzimage) bzimage=1 ;;
	--boot-test) boot=1 ;;
	-h|--help) sed -n '2,26p' "$0"; exit 0 ;;
	-*) echo "make-guest.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) out=$1 ;;
	esac
	shift
done

say() { echo "make-guest: $*" >&2; }
die() { echo "make-guest: FAILED: $*" >&2; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

t_start=$(now)
if [[ $deps -eq 1 ]]; then
	"$root/scripts/install-deps.sh" --guest || die "scripts/install-deps.sh --guest failed"
fi
for tool in gcc cpio gzip dpkg-query; do
	command -v "$tool" >/dev/null || die "$tool not found (run scripts/install-deps.sh --guest)"
done
busybox=$(dpkg-query -L busybox-static 2>/dev/null | grep -m1 '/busybox$' || true)
[[ -n $busybox && -x $busybox ]] || die "busybox-static is not installed (run scripts/install-deps.sh --guest)"

mkdir -p "$out"
out=$(cd "$out" && pwd)

# --- the kernel: Debian's linux-image-amd64 -------------------------------
# The image package it depends on (e.g. linux-image-6.1.0-56-amd64); if that
# is installed, its /boot/vmlinuz-* and /lib/modules/*; otherwise download
# the .deb with apt-get and extract it into OUTDIR/kernel/.
kpkg=$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null |
	grep -o 'linux-image-[0-9][^ ,|]*' | head -n1 || true)
if [[ -z $kpkg ]]; then
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
		grep -o 'linux-image-[0-9][^ ,|]*' | head -n1 || true)
fi
[[ -n $kpkg ]] || die "cannot tell which kernel linux-image-amd64 stands for (apt-get update?)"
kver=${kpkg#linux-image-}
vmlinuz=/boot/vmlinuz-$kver
moddir=/lib/modules/$kver
ksource="installed package $kpkg"
if [[ ! -r $vmlinuz || ! -r $moddir/modules.dep ]]; then
	kdir=$out/kernel
	if [[ ! -r $kdir/boot/vmlinuz-$kver || ! -r $kdir/lib/modules/$kver/modules.dep ]]; then
		say "downloading $kpkg (not installed)"
		rm -rf "$kdir" && mkdir -p "$kdir/deb"
		(cd "$kdir/deb" && apt-get download -q "$kpkg" >/dev/null 2>&1) ||
			die "apt-get download $kpkg failed"
		dpkg-deb -x "$kdir"/deb/*.deb "$kdir" || die "cannot extract $kdir/deb/*.deb"
		rm -rf "$kdir/deb" "$kdir/usr"
		# The package ships no modules.dep: depmod makes it at install time.
		depmod=$(PATH=$PATH:/sbin:/usr/sbin command -v depmod) ||
			die "depmod not found (Debian package kmod)"
		"$depmod" -b "$kdir" "$kver" || die "depmod -b $kdir $kver failed"
	fi
	vmlinuz=$kdir/boot/vmlinuz-$kver
	moddir=$kdir/lib/modules/$kver
	ksource="$kpkg, downloaded and extracted into $kdir"
fi
[[ -r $vmlinuz ]] || die "no kernel image $vmlinuz"

# --- the initramfs --------------------------------------------------------
stage=$out/root
rm -rf "$stage"
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,lib/modules,www}

install -m 0755 "$busybox" "$stage/bin/busybox"
"$busybox" --list-full | while read -r applet; do
	[[ -e $stage/$applet || -L $stage/$applet ]] || ln -s /bin/busybox "$stage/$applet"
done
[[ -L $stage/bin/sh ]] || die "busybox has no sh applet"

cflags=(-static -O2 -std=c11 -Wall -Wextra -Werror)
gcc "${cflags[@]}" -o "$out/verifier" "$root/testing/guest-image/verifier.c" ||
	die "cannot build the verifier (needs gcc and libc6-dev's static libc)"
install -m 0755 "$out/verifier" "$stage/bin/verifier"
gcc "${cflags[@]}" -o "$out/disklog" "$root/testing/guest-image/disklog.c" ||
	die "cannot build disklog"
install -m 0755 "$out/disklog" "$stage/bin/disklog"
gcc "${cflags[@]}" -o "$out/bario" "$root/testing/guest-image/bario.c" ||
	die "cannot build bario"
install -m 0755 "$out/bario" "$stage/bin/bario"
gcc "${cflags[@]}" -o "$out/pages" "$root/testing/guest-image/pages.c" ||
	die "cannot build pages"
install -m 0755 "$out/pages" "$stage/bin/pages"
install -m 0755 "$root/testing/guest-image/init" "$stage/init"
cp -r "$root/testing/guest-image/www/." "$stage/www/"
chmod 0755 "$stage"/www/cgi-bin/*
head -c $((1 << 20)) <(yes "halite test guest, static file for HTTP timing") >"$stage/www/blob.bin"

# NIC drivers, dependencies first: e1000e (q35's default -nic), e1000 (pc's),
# virtio-net (tests/qemu case network restores each); virtio-balloon, for
# guests whose memory a balloon gives back; virtio-blk, for a disk that
# disklog writes (tests/qemu).
declare -A seen=()
modlist=()
add_module() { # path relative to $moddir, as in modules.dep
	local m=$1 line dep
	[[ -n ${seen[$m]:-} ]] && return
	seen[$m]=1
	line=$(grep -m1 "^$m:" "$moddir/modules.dep") || die "$m is not in $moddir/modules.dep"
	for dep in ${line#*:}; do
		add_module "$dep"
	done
	modlist+=("$m")
}
for name in e1000e e1000 virtio_pci virtio_net virtio_balloon virtio_blk; do
	m=$(grep -o "^[^:]*/$name\.ko[^:]*" "$moddir/modules.dep" | head -n1 || true)
	if [[ -z $m ]]; then
		grep -qs "/$name\.ko" "$moddir/modules.builtin" || die "no module $name in $moddir"
		continue
	fi
	add_module "$m"
done
: >"$stage/etc/modules.list"
for m in "${modlist[@]+"${modlist[@]}"}"; do
	case "$m" in
	*.ko) ;;
	*) die "module $m is compressed; busybox insmod wants plain .ko" ;;
	esac
	mkdir -p "$stage/lib/modules/$(dirname "$m")"
	cp "$moddir/$m" "$stage/lib/modules/$m"
	echo "$m" >>"$stage/etc/modules.list"
done

echo "halite-guest" >"$stage/etc/hostname"
(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
	cpio --null -o -H newc -R 0:0 --quiet) | gzip -6 >"$out/initrd.img.tmp" ||
	die "cannot write the initramfs"
mv "$out/initrd.img.tmp" "$out/initrd.img"
cp "$vmlinuz" "$out/vmlinuz"

# The same kernel uncompressed (ELF vmlinux): QEMU starts it at its PVH entry,
# which skips the in-guest xz decompression, about 4 s under TCG.
kconfig=$(dirname "$vmlinuz")/config-$kver
if grep -qs '^CONFIG_PVH=y' "$kconfig"; then
	if [[ ! -s $out/vmlinux || $out/vmlinux -ot $vmlinuz ||
		"$(cat "$out/kernel-version" 2>/dev/null)" != "$kver" ]]; then
		rm -f "$out/vmlinux"
		python3 - "$vmlinuz" "$out/vmlinux.tmp" <<'EOF' && mv "$out/vmlinux.tmp" "$out/vmlinux" ||
import lzma, sys, zlib
data = open(sys.argv[1], "rb").read()
for magic, decode in ((b"\xfd7zXZ\x00", lambda b: lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(b)),
                      (b"\x1f\x8b\x08", lambda b: zlib.decompressobj(31).decompress(b))):
    at = data.find(magic)
    while at >= 0:
        try:
            elf = decode(data[at:])
        except Exception:
            elf = b""
        if elf[:4] == b"\x7fELF":
            open(sys.argv[2], "wb").write(elf)
            sys.exit(0)
        at = data.find(magic, at + 1)
sys.exit(1)
EOF
			{ rm -f "$out/vmlinux.tmp"; say "cannot extract vmlinux from $vmlinuz: the boot test uses vmlinuz"; }
	fi
else
	rm -f "$out/vmlinux"
fi
echo "$kver" >"$out/kernel-version"
# no_timer_check: under TCG on a loaded host the kernel's check that the
# PIT's interrupt reaches the IO-APIC can time out and panic the boot ("IO-APIC
# + timer doesn't work!"), as seen with both cores busy; the timer is fine.
echo "console=ttyS0 quiet panic=-1 no_timer_check verifier.mib=$mib" >"$out/append"
t_built=$(now)
say "built $out: vmlinuz ($kver, from $ksource), initrd.img" \
	"($(du -k "$out/initrd.img" | cut -f1) KiB, ${#modlist[@]} modules) in $(secs "$t_start" "$t_built") s"

[[ $boot -eq 1 ]] || exit 0

# --- the boot test --------------------------------------------------------
qemu=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 not found (run scripts/install-deps.sh --guest)"
command -v python3 >/dev/null || die "python3 not found"
work=$(mktemp -d /tmp/halite-guest.XXXXXX)
qpid=
cleanup() {
	if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
		kill "$qpid" 2>/dev/null || true
		sleep 0.5
		kill -9 "$qpid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
console=$work/console.log
qmp=$work/qmp.sock
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
append="$(cat "$out/append")${extra:+ $extra}"
kernel=$out/vmlinux
[[ $bzimage -eq 0 && -s $kernel ]] || kernel=$out/vmlinuz
fail() {
	echo "make-guest: FAILED: $*" >&2
	if [[ -s $console ]]; then
		echo "make-guest: last lines of the guest console:" >&2
		tr -d '\r' <"$console" | tail -n 25 | sed 's/^/  | /' >&2
	fi
	exit 1
}

say "boot test: $qemu, TCG, 2 vCPUs, 512 MiB memfd, port $port, kernel $(basename "$kernel"), append '$append'"
t0=$(now)
"$qemu" -machine q35 -accel tcg,thread=multi -smp 2 -m 512 \
	-object memory-backend-memfd,id=mem0,size=512M,share=on -machine memory-backend=mem0 \
	-nographic -no-reboot \
	-kernel "$kernel" -initrd "$out/initrd.img" -append "$append" \
	-nic "user$nic,hostfwd=tcp:127.0.0.1:$port-:80" \
	-qmp "unix:$qmp,server,nowait" \
	</dev/null >"$console" 2>&1 &
qpid=$!
qemu_pid=$qpid

t_first=
t_ok=
t_link=
deadline=$(awk -v t="$t0" -v s="$timeout" 'BEGIN { printf "%.3f", t + s }')
while :; do
	if ! kill -0 "$qpid" 2>/dev/null; then
		wait "$qpid" && rc=0 || rc=$?
		qpid=
		fail "QEMU exited (status $rc) before the verifier reported"
	fi
	grep -q 'verifier: MISMATCH' "$console" && fail "the verifier reported a mismatch"
	grep -q 'verifier: pass [0-9]* FAILED' "$console" && fail "the verifier reported a failure"
	grep -q 'Kernel panic' "$console" && fail "the guest kernel panicked"
	if [[ -z $t_first ]] && grep -q '^verifier: ' <(tr -d '\r' <"$console"); then
		t_first=$(now)
	fi
	oks=$(grep -c 'verifier: pass [0-9]* ok' "$console" || true)
	if [[ -z $t_ok && $oks -ge 2 ]]; then
		t_ok=$(now)
	fi
	if [[ -z $t_link ]] && grep -q 'init: eth0 link up' "$console"; then
		t_link=$(now)
	fi
	[[ -n $t_ok && -n $t_link ]] && break
	if awk -v n="$(now)" -v d="$deadline" 'BEGIN { exit !(n > d) }'; then
		[[ -n $t_ok ]] || fail "no two verifier ok lines on the serial console within $timeout s"
		fail "the guest's network link did not come up within $timeout s"
	fi
	sleep 0.05
done

# HTTP and QMP checks; prints "key value" lines for the summary.
checks=$work/checks
python3 - "$port" "$qmp" "$qpid" "$root/scripts" >"$checks" <<'EOF' || fail "$(tail -n1 "$checks" 2>/dev/null)"
import json, os, socket, sys, time, urllib.request

port, qmp_path, qpid, scripts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, scripts)
from halite_guest import QMP, GuestError, page_bytes
# A QMP error (GuestError) is a failure like the others: its message on the last line.
sys.excepthook = lambda t, e, tb: (print(f"{t.__name__}: {e}"), sys.exit(1))

def fail(msg):
    print(msg)
    sys.exit(1)

def get(path, tries=20):
    err = None
    for _ in range(tries):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
                return r.status, r.read().decode(errors="replace")
        except Exception as e:  # connection refused while slirp settles, etc.
            err = e
            time.sleep(0.5)
    fail(f"HTTP GET {path} failed: {err}")

t = time.monotonic()
status, body = get("/status")
first = body.splitlines()[0] if body else ""
if status != 200 or not first.startswith("verifier: pass ") or "\nok 1\n" not in body:
    fail(f"HTTP /status: unexpected answer {status}: {first!r}")
print(f"http_status {first}")
print(f"http_ms {(time.monotonic() - t) * 1000:.0f}")
status, body = get("/hello.txt")
if status != 200 or "halite" not in body:
    fail(f"HTTP /hello.txt: unexpected answer {status}: {body!r}")
with urllib.request.urlopen(f"http://127.0.0.1:{port}/p/1000.txt", timeout=30) as r:
    if r.read() != page_bytes(1000):
        fail("HTTP /p/1000.txt: not the bytes pages.c writes")
print("http_page /p/1000.txt, %d bytes as expected" % len(page_bytes(1000)))
status, body = get("/cgi-bin/digest", tries=3)
if status != 200 or " digest " not in body or not body.strip().endswith("expected"):
    fail(f"HTTP /cgi-bin/digest: unexpected answer {status}: {body.strip()!r}")
print(f"http_digest {body.strip()}")

try:
    q = QMP(qmp_path)
except Exception as e:
    fail(f"QMP: cannot connect to {qmp_path}: {e}")
v = q.version
print(f"qemu_version {v['major']}.{v['minor']}.{v['micro']}")
run = q.cmd("query-status")
if run.get("status") != "running":
    fail(f"QMP query-status: guest is {run.get('status')}, not running")
cpus = q.cmd("query-cpus-fast")
if len(cpus) != 2:
    fail(f"QMP query-cpus-fast: {len(cpus)} vCPUs, expected 2")
tids = []
for c in cpus:
    tid = c.get("thread-id")
    if not tid or not os.path.exists(f"/proc/{qpid}/task/{tid}"):
        fail(f"QMP query-cpus-fast: vCPU {c.get('cpu-index')} thread {tid} is not a thread of QEMU {qpid}")
    tids.append(f"cpu{c['cpu-index']}={tid}")
if len(set(tids)) != len(tids):
    fail("QMP query-cpus-fast: vCPUs share a thread (not thread=multi?)")
print(f"vcpu_threads {' '.join(tids)}")
ram = [b for b in q.cmd("query-memdev") if b.get("id") == "mem0"]
if not ram or not ram[0].get("share"):
    fail("QMP query-memdev: mem0 is missing or not shared")
print(f"memdev mem0 {ram[0]['size'] >> 20} MiB, share={ram[0]['share']}")
try:
    q.cmd("quit")
except (EOFError, OSError):
    pass  # QEMU may close the socket before its reply
EOF

# QMP quit was sent: QEMU must end by itself, with status 0.
for _ in $(seq 100); do
	kill -0 "$qpid" 2>/dev/null || break
	sleep 0.1
done
kill -0 "$qpid" 2>/dev/null && fail "QEMU did not quit within 10 s of QMP quit"
wait "$qpid" && rc=0 || rc=$?
qpid=
[[ $rc -eq 0 ]] || fail "QEMU exited with status $rc after QMP quit"
t_end=$(now)

val() { sed -n "s/^$1 //p" "$checks"; }
first_line=$(tr -d '\r' <"$console" | grep -m1 '^verifier: ')
oks=$(tr -d '\r' <"$console" | grep -c '^verifier: pass [0-9]* ok')
last_ok=$(tr -d '\r' <"$console" | grep '^verifier: pass [0-9]* ok' | tail -n1)
echo "boot test: ok"
echo "  qemu                $(val qemu_version), $(val memdev), kernel $(basename "$kernel") ($kver)"
echo "  first verifier line $(secs "$t0" "$t_first") s after QEMU start: $first_line"
echo "  verifier ok         $(secs "$t0" "$t_ok") s after QEMU start; $oks ok lines, last: $last_ok"
echo "  guest link up       $(secs "$t0" "$t_link") s after QEMU start"
echo "  HTTP /status        ok in $(val http_ms) ms: $(val http_status)"
echo "  HTTP /cgi-bin/digest $(val http_digest)"
echo "  HTTP page           $(val http_page)"
echo "  vCPU threads        $(val vcpu_threads) (QEMU pid $qemu_pid)"
echo "  QEMU quit           cleanly (status 0); whole test $(secs "$t0" "$t_end") s, with build $(secs "$t_start" "$t_end") s"
