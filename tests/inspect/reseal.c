// SPDX-License-Identifier: MIT
/*
 * Test helper: damage a locality block *and* fix every checksum over it, so
 * that the damage gets past the checksums and only deeper checks (decoding,
 * zero slack) can catch it.
 *
 *   inspect_reseal FILE LB OFFSET LENGTH BYTE
 *
 * sets LENGTH bytes at OFFSET inside locality block LB to BYTE, then
 * recomputes the LB's checksum in the lb-table, the lb-table's checksum in
 * the directory, the directory checksum and the footer checksum; in a
 * format 1.1 file also the checksum of the lb-table chunk holding the entry
 * in the index (section 5.7) and the index's in the directory.
 *
 * Written from docs/format.md alone, on purpose: it does not share code with
 * format/, so it also checks that the library writes what the spec says.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void die(const char *msg)
{
	fprintf(stderr, "inspect_reseal: %s\n", msg);
	exit(1);
}

int main(int argc, char **argv)
{
	uint64_t lb, off, len, file_size, data_offset, lb_count, dir_off, seed;
	uint64_t lbt_off = 0, lbt_len = 0, lbt_dirent = 0;
	uint64_t idx_off = 0, idx_len = 0, idx_dirent = 0, mb_count = 0;
	uint32_t lb_size, nsec;
	uint8_t *f, *foot, *dir;
	struct stat st;
	int byte, fd;

	if (argc != 6)
		die("usage: inspect_reseal FILE LB OFFSET LENGTH BYTE");
	lb = strtoull(argv[2], NULL, 0);
	off = strtoull(argv[3], NULL, 0);
	len = strtoull(argv[4], NULL, 0);
	byte = (int)strtol(argv[5], NULL, 0);

	fd = open(argv[1], O_RDWR);
	if (fd < 0 || fstat(fd, &st) < 0)
		die("cannot open FILE");
	file_size = (uint64_t)st.st_size;
	f = malloc(file_size);
	if (!f || pread(fd, f, file_size, 0) != (ssize_t)file_size)
		die("cannot read FILE");

	/* Header (format.md section 3) and footer (section 4). */
	lb_size = le32(f + 40);
	data_offset = le64(f + 48);
	seed = XXH3_64bits_withSeed(f + 56, 16, 0);
	foot = f + file_size - 64;
	if (memcmp(foot, "HLTFOOT1", 8))
		die("no footer");
	lb_count = le64(foot + 24);
	dir_off = le64(foot + 32);
	nsec = le32(foot + 40);
	if (lb >= lb_count || off + len > lb_size)
		die("LB or range out of bounds");

	/* Directory (section 5): find the lb-table (type 3). */
	dir = f + dir_off;
	for (uint32_t i = 0; i < nsec; i++) {
		if (le32(dir + 32 * i) == 3) {
			lbt_dirent = 32 * i;
			lbt_off = le64(dir + 32 * i + 8);
			lbt_len = le64(dir + 32 * i + 16);
		}
		if (le32(dir + 32 * i) == 2)
			mb_count = le64(dir + 32 * i + 16) / 8;
		if (le32(dir + 32 * i) == 4) {
			idx_dirent = 32 * i;
			idx_off = le64(dir + 32 * i + 8);
			idx_len = le64(dir + 32 * i + 16);
		}
	}
	if (!lbt_off || lbt_len < 24 * lb_count)
		die("no lb-table");

	memset(f + data_offset + lb * lb_size + off, byte, len);
	/* LB checksum: XXH3(all lb_size bytes, file_seed + i), at entry offset 16 (5.3). */
	put64(f + lbt_off + 24 * lb + 16,
	      XXH3_64bits_withSeed(f + data_offset + lb * lb_size, lb_size, seed + lb));
	put64(dir + lbt_dirent + 24, XXH3_64bits_withSeed(f + lbt_off, lbt_len, seed));
	if (idx_off) {
		/* 5.7: E entries per chunk; seed file_seed + 3 * 2^48 + c; after the map's sums. */
		uint64_t map_e = le32(f + idx_off), lbt_e = le32(f + idx_off + 4);
		uint64_t c = lb / lbt_e, n = lb_count - c * lbt_e < lbt_e ? lb_count - c * lbt_e : lbt_e;
		uint64_t at = idx_off + 48 + 8 * ((mb_count + map_e - 1) / map_e) + 16 * c + 8;

		if (!map_e || !lbt_e || at + 8 > idx_off + idx_len)
			die("index out of bounds");
		put64(f + at, XXH3_64bits_withSeed(f + lbt_off + 24 * c * lbt_e, 24 * n,
						   seed + (3ull << 48) + c));
		put64(dir + idx_dirent + 24, XXH3_64bits_withSeed(f + idx_off, idx_len, seed));
	}
	put64(foot + 48, XXH3_64bits_withSeed(dir, 32 * (size_t)nsec, seed));
	put64(foot + 56, XXH3_64bits_withSeed(foot, 56, 0));

	if (pwrite(fd, f, file_size, 0) != (ssize_t)file_size || close(fd))
		die("cannot write FILE");
	free(f);
	return 0;
}
