// SPDX-License-Identifier: MIT
/*
 * Test helper: write a snapshot with what `import` never makes (several vCPU
 * streams, virtual and physical streams, page-table roots, device state,
 * save statistics, binary and list metadata) through the writer API, plus the raw
 * image of each region as it must extract.
 *
 *   inspect_mkfile DIR      writes DIR/multi.hlt, DIR/ram.img, DIR/rom.img
 *
 * Layout (mb_pages 2, 16 KiB LBs, lz4), the numbers multi.sh checks:
 *   ram: 64 pages at 0          -> MBs 0..31
 *   rom:  8 pages at 0xfff00000 -> MBs 32..35
 *   vcpu0: MBs 0..9, vcpu1: 10..19 (puts interleaved), virtual: 20..29,
 *   physical: 32, 33; zero: 30, 31 (one explicit, one all-zero data);
 *   untouched: 34, 35.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/halite.h>

#define PAGE 4096u
#define MB_SIZE (2 * PAGE)

static uint8_t ram[64 * PAGE], rom[8 * PAGE];

static void check(int ret, const char *what, struct halite_writer *w)
{
	if (ret < 0) {
		fprintf(stderr, "inspect_mkfile: %s: %s: %s\n", what, halite_strerror(ret),
			w ? halite_writer_errmsg(w) : "");
		exit(1);
	}
}

/*
 * Half text, half noise: compresses to about half, so a 16 KiB LB holds
 * three blocks and each stream spans several LBs that interleave in the file.
 */
static void fill(uint8_t *p, uint64_t mb)
{
	uint64_t x = mb * 0x9e3779b97f4a7c15ull + 1;

	for (uint32_t i = 0; i < MB_SIZE; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = i < MB_SIZE / 2 ? (uint8_t)"halite locality "[i % 16] : (uint8_t)(x >> 56);
	}
}

static uint8_t *mb_ptr(uint64_t mb)
{
	return mb < 32 ? ram + mb * MB_SIZE : rom + (mb - 32) * MB_SIZE;
}

static void put(struct halite_writer *w, uint32_t stream, uint64_t mb)
{
	fill(mb_ptr(mb), mb);
	check(halite_writer_put(w, stream, mb, mb_ptr(mb)), "put", w);
}

static void save(const char *dir, const char *name, const void *p, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	static const struct halite_region regions[] = {
		{ "ram", 0, sizeof(ram) },
		{ "rom", 0xfff00000u, sizeof(rom) },
	};
	static const struct halite_root roots[] = {
		{ 0, HALITE_PAGING_4LEVEL, 0x1000 },
		{ 1, HALITE_PAGING_5LEVEL, 0x2003 },
		{ HALITE_VCPU_UNKNOWN, HALITE_PAGING_4LEVEL, 0xabc000 },
	};
	static const uint8_t bin[] = { 0, 1, 2, 0xff };
	static const char cmd[] = "prog\0-opt\0value with 'quotes'\0--flag\0";
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	uint8_t dev[1000], zero[MB_SIZE] = { 0 };
	char path[4096];

	if (argc != 2) {
		fprintf(stderr, "usage: inspect_mkfile DIR\n");
		return 2;
	}
	snprintf(path, sizeof(path), "%s/multi.hlt", argv[1]);
	o.mb_pages = 2;
	o.lb_size = 16384;
	o.codec = HALITE_CODEC_LZ4;
	o.vcpu_count = 2;
	o.flags = HALITE_WRITER_NO_SYNC;
	check(halite_writer_create(&w, path, regions, 2, &o), "create", NULL);

	for (uint64_t i = 0; i < 10; i++) {
		put(w, HALITE_STREAM(HALITE_STREAM_VCPU, 0), i);
		put(w, HALITE_STREAM(HALITE_STREAM_VCPU, 1), 10 + i);
	}
	for (uint64_t mb = 20; mb < 30; mb++)
		put(w, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0), mb);
	check(halite_writer_put_zero(w, 30), "put_zero", w);
	check(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), 31, zero), "put", w);
	put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), 32);
	put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), 33);

	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++)
		check(halite_writer_add_root(w, &roots[i]), "add_root", w);
	for (size_t i = 0; i < sizeof(dev); i++)
		dev[i] = (uint8_t)i;
	check(halite_writer_set_device_state(w, dev, sizeof(dev)), "device state", w);
	check(halite_writer_set_meta(w, "name", "test", 4), "meta", w);
	check(halite_writer_set_meta(w, "bin", bin, sizeof(bin)), "meta", w);
	/* A list (strings each ended by a NUL), as halite-qemu's qemu.cmdline. */
	check(halite_writer_set_meta(w, "cmd", cmd, sizeof(cmd) - 1), "meta", w);
	check(halite_writer_set_stat(w, "faults", 1234), "stat", w);
	/* Beyond 2^53: JSON output must not round it through a double. */
	check(halite_writer_set_stat(w, "big", (1ull << 60) + 1), "stat", w);
	check(halite_writer_finish(w), "finish", w);
	halite_writer_free(w, true);

	save(argv[1], "ram.img", ram, sizeof(ram));
	save(argv[1], "rom.img", rom, sizeof(rom));
	return 0;
}
