#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The .deb: `cpack -G DEB` from the build tree, its control fields and file
list, then installed with dpkg into a scratch root and run there.

The scratch root is an overlay of / (lower: the real root, read only; upper:
a tmpfs) mounted in a private mount namespace (unshare -m) and chrooted
into: the package installs against the machine's real libraries and dpkg
database, as on a user's Debian 12, while every write lands in the tmpfs,
which goes with the namespace. The real root's dpkg status file is checked
unchanged afterwards. Root only (unshare, mount, chroot): exit 77 otherwise.
"""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("HALITE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("HALITE_BINARY_DIR", os.path.join(SRC, "build"))
PROGRAMS = ["halite-inspect", "halite-qemu", "halite-synth", "halite-cloned", "halite-clone"]
# What the binaries link (CMakeLists.txt's pkg_check_modules and libaio):
# dpkg-shlibdeps must have named each one's package in Depends.
RUNTIME_DEPS = ["liblz4", "libzstd", "zlib1g", "libxxhash", "libcjson", "liburing", "libaio",
                "libmicrohttpd", "libcurl", "libc6"]
STATUS = "/var/lib/dpkg/status"

from checks import check, failures  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


# The scratch root. $1 tmp dir, $2 the .deb, $3 a golden file, $4 the deb's
# file list (one path a line). Each step's output is framed by
# "=== NAME" and "=== NAME rc=N" for the test to read.
SCRIPT = r'''
set -u
T=$1 DEB=$2 GOLDEN=$3 LIST=$4
R=$T/root
mount -t tmpfs tmpfs "$T/layer" || exit 90
mkdir "$T/layer/upper" "$T/layer/work"
# The upper layer on a tmpfs: overlayfs refuses an upper directory inside
# its lower one, and the tmpfs dies with this namespace.
mount -t overlay overlay -o "lowerdir=/,upperdir=$T/layer/upper,workdir=$T/layer/work" "$R" || exit 91
mountpoint -q "$R" || exit 92
mount -t proc proc "$R/proc" || exit 93
mount --rbind /dev "$R/dev" || exit 94
mkdir -p "$R/tmp/pkg"
cp "$DEB" "$R/tmp/pkg/halite.deb" && cp "$GOLDEN" "$R/tmp/pkg/golden.hlt" || exit 95

step() {
	local name=$1
	shift
	echo "=== $name"
	chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
		MANPAGER=cat PAGER=cat MANWIDTH=100 /bin/sh -c "$*" 2>&1
	rc=$?
	echo	# the output may not end its line
	echo "=== $name rc=$rc"
}

step before 'test ! -e /usr/bin/halite-inspect'
step install 'dpkg -i /tmp/pkg/halite.deb'
step status 'dpkg-query -W -f "\${Status} \${Version}" halite'
step version 'halite-inspect --version'
step man 'man -l /usr/share/man/man1/halite-inspect.1*'
step man_qemu 'man -l /usr/share/man/man1/halite-qemu.1*'
step info 'halite-inspect info /tmp/pkg/golden.hlt'
step completion 'bash -c ". /usr/share/bash-completion/completions/halite-inspect; COMP_WORDS=(halite-inspect ve); COMP_CWORD=1; _halite_inspect; echo \"\${COMPREPLY[*]}\""'
step pkgconfig 'pkg-config --modversion halite'
step unit 'grep -h ExecStart= /usr/lib/systemd/system/halite-cloned.service'
step remove 'dpkg -r halite'
step removed_status 'dpkg-query -W -f "\${Status}" halite'
step purge 'dpkg -P halite'
echo "=== left"
while IFS= read -r f; do
	if [ -e "$R$f" ] || [ -L "$R$f" ]; then
		echo "$f"
	fi
done < "$LIST"
echo "=== left rc=0"
'''


def steps(out):
    """{name: (rc, text)} from the script's framed output."""
    res = {}
    for m in re.finditer(r"^=== (\w+)\n(.*?)^=== \1 rc=(\d+)$", out, re.S | re.M):
        res[m.group(1)] = (int(m.group(3)), m.group(2))
    return res


def main():
    if os.geteuid() != 0:
        print("SKIP: the scratch root needs root (unshare -m, mount, chroot)")
        return 77
    for tool in ("cpack", "dpkg-deb", "dpkg-shlibdeps", "unshare", "chroot", "man"):
        if not shutil.which(tool):
            print(f"FAIL: {tool} not found (scripts/install-deps.sh installs what the tests need)")
            return 1
    config = os.path.join(BUILD, "CPackConfig.cmake")
    if not check(os.path.exists(config), f"{config} exists (configure the build first)"):
        return 1
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        version = re.search(r"project\(halite VERSION (\d+\.\d+\.\d+)", f.read()).group(1)
    goldens = sorted(glob.glob(os.path.join(SRC, "tests", "golden", "*.hlt")))
    if not check(goldens, "a golden file in tests/golden"):
        return 1

    status_before = sha256(STATUS)
    real_had = os.path.exists("/usr/bin/halite-inspect")
    tmp = tempfile.mkdtemp(prefix="halite-package.")
    try:
        pkgdir = os.path.join(tmp, "pkg")
        r = run(["cpack", "-G", "DEB", "--config", config, "-B", pkgdir])
        if not check(r.returncode == 0, f"cpack -G DEB exits 0:\n{r.stdout}"):
            return 1
        debs = glob.glob(os.path.join(pkgdir, "*.deb"))
        if not check(len(debs) == 1, f"one .deb made: {debs}"):
            return 1
        deb = debs[0]
        check(re.fullmatch(rf"halite_{re.escape(version)}_\w+\.deb", os.path.basename(deb)),
              f"the .deb is named halite_{version}_ARCH.deb: {os.path.basename(deb)}")

        # Control fields.
        info = run(["dpkg-deb", "-I", deb]).stdout
        fields = dict(re.findall(r"^ (\w[\w-]*): (.*)$", info, re.M))
        check(fields.get("Package") == "halite", f"Package: halite ({fields.get('Package')})")
        check(fields.get("Version") == version, f"Version: {version} ({fields.get('Version')})")
        check(fields.get("Maintainer"), "a Maintainer")
        check(fields.get("Section"), "a Section")
        check(fields.get("Description", "").strip(), "a Description")
        depends = fields.get("Depends", "")
        for lib in RUNTIME_DEPS:
            check(re.search(rf"(^|, ){re.escape(lib)}", depends),
                  f"Depends names {lib} (dpkg-shlibdeps): {depends}")

        # Contents.
        listing = run(["dpkg-deb", "-c", deb]).stdout
        entries = []  # (is a directory, absolute path)
        for line in listing.splitlines():
            cols = line.split()
            if len(cols) >= 6 and cols[5] != "./":
                entries.append((line.startswith("d"), cols[5][1:].rstrip("/")))
        paths = [p for _, p in entries]
        files = [p for d, p in entries if not d]
        pset = set(paths)
        for prog in PROGRAMS:
            check(f"/usr/bin/{prog}" in pset, f"the .deb holds /usr/bin/{prog}")
            check(any(re.fullmatch(rf"/usr/share/man/man1/{re.escape(prog)}\.1(\.gz)?", p)
                      for p in pset), f"the .deb holds {prog}'s man page")
        check(any(re.fullmatch(r"/usr/lib(/[\w-]+)?/libhalite\.so\.\d+\.\d+\.\d+", p) for p in pset),
              "the .deb holds libhalite.so.X.Y.Z")
        for h in ("format.h", "save.h", "restore.h", "halite.h"):
            check(f"/usr/include/halite/{h}" in pset, f"the .deb holds /usr/include/halite/{h}")
        for c in ("halite-inspect", "halite-qemu"):
            check(f"/usr/share/bash-completion/completions/{c}" in pset,
                  f"the .deb holds {c}'s bash completion")
        check("/usr/share/doc/halite/copyright" in pset, "the .deb holds the LICENSE as copyright")
        check("/usr/lib/systemd/system/halite-cloned.service" in pset,
              "the .deb holds the clone service's systemd unit")
        check(any(p.endswith("/pkgconfig/halite.pc") for p in pset), "the .deb holds halite.pc")

        # Install, run, remove, in the scratch root.
        os.makedirs(os.path.join(tmp, "layer"))
        os.makedirs(os.path.join(tmp, "root"))
        listfile = os.path.join(tmp, "files")
        # What must be gone after dpkg -r: every file, and every directory
        # the real root does not have.
        gone = files + [p for p in paths if p not in files and not os.path.lexists(p)]
        with open(listfile, "w") as f:
            f.write("".join(p + "\n" for p in gone))
        r = run(["unshare", "--mount", "--propagation", "private", "bash", "-c", SCRIPT, "scratch",
                 tmp, deb, goldens[-1], listfile], timeout=300)
        out = r.stdout
        if not check(r.returncode == 0, f"the scratch root script exits 0 ({r.returncode}):\n{out}"):
            return 1
        s = steps(out)
        print(out)

        def ok(name):
            rc, text = s.get(name, (None, ""))
            check(rc == 0, f"step {name} exits 0 ({rc}):\n{text}")
            return text

        ok("before")
        ok("install")
        check(ok("status").strip() == f"install ok installed {version}", "dpkg says halite is installed")
        v = ok("version").strip()
        check(re.fullmatch(rf"halite-inspect {re.escape(version)}( .*)?", v),
              f"halite-inspect --version prints the version: {v!r}")
        man = ok("man")
        check(re.search(r"^NAME\n\s+halite-inspect\s+-", man, re.M), "the man page has its NAME")
        for sub in ("info", "verify", "blocks", "map", "extract", "import", "restore"):
            check(re.search(rf"halite-inspect {sub}\b", man), f"the man page has the {sub} command")
        manq = ok("man_qemu")
        for sub in ("save", "restore"):
            check(re.search(rf"halite-qemu {sub}\b", manq), f"halite-qemu's page has {sub}")
        check("EXIT STATUS" in manq, "halite-qemu's page has its EXIT STATUS")
        # The installed program says of the golden file what the build
        # tree's says (but for the file's path).
        inf = ok("info").rstrip("\n").replace("/tmp/pkg/golden.hlt", "GOLDEN")
        here = run([os.environ.get("HALITE_INSPECT_BIN",
                                   os.path.join(BUILD, "tools", "halite-inspect", "halite-inspect")),
                    "info", goldens[-1]]).stdout.rstrip("\n").replace(goldens[-1], "GOLDEN")
        check("GOLDEN" in inf and inf == here,
              f"the installed halite-inspect info prints what the build tree's does:\n{inf}\n---\n{here}")
        check(ok("completion").split() == ["verify"], "the installed completion completes ve to verify")
        check(ok("pkgconfig").strip() == version, "pkg-config finds halite's version")
        check("/usr/bin/halite-cloned" in ok("unit"), "the unit runs /usr/bin/halite-cloned")
        ok("remove")
        rc, text = s.get("removed_status", (None, ""))
        check(rc != 0 or re.match(r"(deinstall|unknown|purge) ok (config-files|not-installed)", text),
              f"dpkg no longer has halite installed: {text}")
        ok("purge")
        left = ok("left").split()
        check(not left, f"dpkg -r halite removes every file: left {left}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    check(sha256(STATUS) == status_before, f"the real {STATUS} is unchanged")
    check(os.path.exists("/usr/bin/halite-inspect") == real_had,
          "the real root's /usr/bin is unchanged")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("package: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
