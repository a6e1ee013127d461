#!/usr/bin/env bash
# Install the build into a scratch prefix, then build a program against it
# twice, with pkg-config and with CMake's find_package, and run both. Also
# checks libhalite.so exports the public API and nothing private, and that
# the programs, their man pages, the completion and the docs are installed.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/halite-install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name 'libhalite.so.*.*' | head -n1)
[[ -n $lib ]] || { echo "no libhalite.so installed"; exit 1; }
for p in halite-inspect halite-qemu halite-synth halite-cloned halite-clone; do
	[[ -x $prefix/bin/$p ]] || { echo "no $p installed"; exit 1; }
	# Man pages: built unless help2man was missing (cmake/HaliteDocs.cmake).
	if [[ -e $build/man/$p.1 && ! -s $prefix/share/man/man1/$p.1 ]]; then
		echo "no man page $p.1 installed"; exit 1
	fi
done
for c in halite-inspect halite-qemu; do
	[[ -s $prefix/share/bash-completion/completions/$c ]] ||
		{ echo "no bash completion for $c installed"; exit 1; }
done
for d in README.md CHANGELOG.md copyright docs/format.md docs/cli.md; do
	[[ -s $prefix/share/doc/halite/$d ]] || { echo "no share/doc/halite/$d installed"; exit 1; }
done

# Exported: halite_* public symbols only.
syms=$(nm -D --defined-only "$lib" | awk '{sub(/@.*/, "", $3); print $3}' | grep -v '^HALITE_' | sort)
bad=$(echo "$syms" | grep -vE '^halite_(strerror|log_stderr|codec_name|codec_parse|codec_level_range|compress|decompress|stream_name|section_name|writer_.*|reader_.*|save_.*|restore_.*)$' || true)
if [[ -n $bad ]]; then
	echo "libhalite.so exports private symbols:"; echo "$bad"; exit 1
fi
for s in halite_reader_open halite_writer_create halite_strerror; do
	echo "$syms" | grep -qx "$s" || { echo "missing export $s"; exit 1; }
done

export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name halite.pc)")
cc -std=c11 -Wall -Werror -o "$tmp/consumer-pc" "$src/consumer.c" \
	$(pkg-config --cflags --libs halite) -Wl,-rpath,"$(dirname "$lib")"
"$tmp/consumer-pc" "$tmp/a.hlt"

mkdir "$tmp/cm"
cp "$src/consumer.c" "$tmp/cm/"
cp "$src/CMakeLists.txt.in" "$tmp/cm/CMakeLists.txt"
cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_BUILD_RPATH="$(dirname "$lib")" >/dev/null
cmake --build "$tmp/cm/build" >/dev/null
"$tmp/cm/build/consumer" "$tmp/b.hlt"
echo "install: ok"
