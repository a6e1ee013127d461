#!/usr/bin/env bash
# Install everything Halite needs from Debian's packages. Safe to rerun: it
# asks apt only for what is missing, and runs apt-get update only then.
#
#   scripts/install-deps.sh            build + test + fuzz dependencies
#   scripts/install-deps.sh --guest    also what the QEMU guest tests need
#   scripts/install-deps.sh --object-store
#                                      also SeaweedFS, the second S3 store the tests can use
#                                      (scripts/install-object-store.sh: built from source)
# The two flags go together too.
set -euo pipefail

pkgs=(
	# build
	build-essential cmake ninja-build pkg-config
	# I/O backends, codecs, checksums, JSON
	liburing-dev libaio-dev liblz4-dev zlib1g-dev libzstd-dev libxxhash-dev libcjson-dev
	# the clone service's HTTP API
	libmicrohttpd-dev
	# halite-clone, its client; the S3 client (halite/s3: libcurl, and
	# libcrypto for the MD5 and SHA-256 its requests carry)
	libcurl4-openssl-dev libssl-dev
	# benchmarks: delayfs (FUSE), the machine's I/O limits
	libfuse3-dev fuse3
	# man pages (help2man, from the programs' --help), `cpack -G DEB`'s
	# Depends (dpkg-shlibdeps), and man -l in the cli tests
	help2man dpkg-dev man-db
	# the tests' S3 store (scripts/object-store.sh: a throwaway Ceph cluster
	# whose radosgw speaks S3; nothing of it runs until a test starts it)
	radosgw ceph-mon ceph-osd
	# tests, fuzzing, benchmarks
	libcmocka-dev clang libclang-rt-14-dev llvm fio python3
	# bench/run.sh decompresses the real programs' traces; bench/traces/record.sh
	# records them again (valgrind's lackey, and the programs themselves)
	xz-utils valgrind sqlite3
)
guest=0 object_store=0
for arg in "$@"; do
	case $arg in
	--guest) guest=1 ;;
	--object-store) object_store=1 ;;
	*) echo "usage: $0 [--guest] [--object-store]" >&2; exit 2 ;;
	esac
done
if ((guest)); then
	# qemu-utils: qemu-img, which makes the overlays of frozen disks;
	# libvirt: tests/qemu case libvirt saves a VM libvirt runs
	pkgs+=(qemu-system-x86 qemu-utils busybox-static linux-image-amd64 cpio
		libvirt-daemon-system libvirt-clients)
fi

# The clone service's API fuzz (tests/clone/test_openapi.py): schemathesis,
# from PyPI (Debian has no package of it), into the python3 on PATH.
if ! python3 -c 'import schemathesis, yaml' 2>/dev/null; then
	echo "install-deps: installing schemathesis (PyPI)" >&2
	PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check \
		'schemathesis==4.32.5' >/dev/null
fi

# SeaweedFS is built from source with Go (Debian has no package of it); the
# script returns at once when the pinned version is installed.
if ((object_store)); then
	"$(dirname "$0")/install-object-store.sh"
fi

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi

SUDO=
if [[ $(id -u) -ne 0 ]]; then
	SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
