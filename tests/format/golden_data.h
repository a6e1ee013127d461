/* SPDX-License-Identifier: MIT */
/*
 * The content of the golden files tests/golden/v1.0-<codec>.hlt, shared by
 * golden_gen.c (which wrote them once) and test_golden.c (which checks every
 * later reader still reads them).
 *
 * FROZEN. The committed files were written from exactly this: changing any
 * table, constant or generator below makes test_golden compare the files
 * against something they never contained. A new format version gets new
 * files, and new tables next to these, never edits to them.
 */
#ifndef HALITE_TESTS_GOLDEN_DATA_H
#define HALITE_TESTS_GOLDEN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <halite/halite.h>

#define GOLDEN_PAGE 4096u
#define GOLDEN_MB_PAGES 2u
#define GOLDEN_MB_SIZE (GOLDEN_PAGE * GOLDEN_MB_PAGES)
#define GOLDEN_LB_SIZE 8192u
#define GOLDEN_VCPUS 2u
#define GOLDEN_NREGIONS 3u
#define GOLDEN_NMB 18u /* 12 + 5 + 1 */
#define GOLDEN_DEV_LEN 777u

static const struct halite_region golden_regions[GOLDEN_NREGIONS] = {
	{ "pc.ram", 0, 96 * 1024 },
	{ "mem1", 0x100000000ull, 40 * 1024 },
	{ "rom@x", 0xfffc0000ull, 4 * 1024 }, /* one short MB */
};

struct golden_codec {
	const char *file;
	int codec;
	int level;
	int minor; /* format 1.minor (1.1: the chunked index); 0 for the 1.0 files */
};

static const struct golden_codec golden_codecs[] = {
	{ "v1.0-none.hlt", HALITE_CODEC_NONE, 0, 0 },
	{ "v1.0-lz4.hlt", HALITE_CODEC_LZ4, 1, 0 },
	{ "v1.0-zlib.hlt", HALITE_CODEC_ZLIB, 6, 0 },
	{ "v1.0-zstd.hlt", HALITE_CODEC_ZSTD, 3, 0 },
	/* Format 1.1 (2026-11): the same content, with the chunked index. */
	{ "v1.1-none.hlt", HALITE_CODEC_NONE, 0, 1 },
	{ "v1.1-lz4.hlt", HALITE_CODEC_LZ4, 1, 1 },
	{ "v1.1-zlib.hlt", HALITE_CODEC_ZLIB, 6, 1 },
	{ "v1.1-zstd.hlt", HALITE_CODEC_ZSTD, 3, 1 },
};
#define GOLDEN_NFILES (sizeof(golden_codecs) / sizeof(golden_codecs[0]))

/* What each MB holds. */
enum golden_class {
	G_UNTOUCHED,	/* never put */
	G_ZERO_DATA,	/* put with all-zero bytes: the writer records it as zero */
	G_ZERO_PUT,	/* halite_writer_put_zero */
	G_TEXT,		/* words: compresses well */
	G_MIXED,	/* half random 64-byte chunks, half runs */
	G_RANDOM,	/* incompressible: stored raw by every codec */
	G_SPARSE,	/* zeros with a few random bytes */
};

static const uint8_t golden_class_of[GOLDEN_NMB] = {
	/* pc.ram, MBs 0..11 */
	G_TEXT, G_RANDOM, G_UNTOUCHED, G_SPARSE, G_MIXED, G_ZERO_DATA,
	G_TEXT, G_UNTOUCHED, G_RANDOM, G_MIXED, G_TEXT, G_ZERO_PUT,
	/* mem1, MBs 12..16 */
	G_SPARSE, G_TEXT, G_UNTOUCHED, G_MIXED, G_RANDOM,
	/* rom@x, MB 17 (4096 bytes) */
	G_TEXT,
};

#define G_V0 HALITE_STREAM(HALITE_STREAM_VCPU, 0)
#define G_V1 HALITE_STREAM(HALITE_STREAM_VCPU, 1)
#define G_VIRT HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0)
#define G_PHYS HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0)
#define G_FLUSH UINT64_MAX /* put-order marker: flush the stream now */

static const uint32_t golden_streams[] = { G_V0, G_V1, G_VIRT, G_PHYS };
#define GOLDEN_NSTREAMS 4u

/* The order of the writer calls: MB (or G_FLUSH) and stream. */
static const struct {
	uint64_t mb;
	uint32_t stream;
} golden_puts[] = {
	{ 0, G_V0 },   { 1, G_V1 },   { 3, G_VIRT }, { 4, G_PHYS },  { 6, G_V0 },
	{ 5, G_V1 },   { 8, G_VIRT }, { 9, G_V0 },	 { G_FLUSH, G_V0 }, { 10, G_PHYS },
	{ 11, G_V1 },  { 12, G_V1 },  { 13, G_V0 },	 { 15, G_VIRT }, { 16, G_PHYS },
	{ 17, G_V1 },
};
#define GOLDEN_NPUTS (sizeof(golden_puts) / sizeof(golden_puts[0]))

struct golden_kv {
	const char *key;
	const char *value;
	uint32_t len;
};

/* Metadata, in the order set; "codec" is added after these with the codec's name. */
static const struct golden_kv golden_meta[] = {
	{ "golden", "1", 1 },
	{ "generator", "tests/format/golden_gen.c", 25 },
	{ "bin", "\x00\x01\xfe\xff\x00", 5 },
	{ "empty", "", 0 },
};
#define GOLDEN_NMETA (sizeof(golden_meta) / sizeof(golden_meta[0]))

static const struct {
	const char *key;
	uint64_t value;
} golden_stats[] = {
	{ "save_ns", 123456789 },
	{ "mb_put", 15 },
	{ "big", 0xfedcba9876543210ull },
};
#define GOLDEN_NSTATS (sizeof(golden_stats) / sizeof(golden_stats[0]))

static const struct halite_root golden_roots[] = {
	{ 0, HALITE_PAGING_4LEVEL, 0x1000 },
	{ HALITE_VCPU_UNKNOWN, HALITE_PAGING_5LEVEL, 0xabc000 | 0x18 },
};
#define GOLDEN_NROOTS (sizeof(golden_roots) / sizeof(golden_roots[0]))

/* xorshift64*, as in test_util.h, copied so that nothing outside can change it. */
static inline uint64_t golden_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static inline uint64_t golden_seed(uint64_t what)
{
	return 0x48414c4954450001ull ^ ((what + 1) * 0x9e3779b97f4a7c15ull);
}

/* The @bytes bytes of MB @mb (zeros for the zero and untouched classes). */
static inline void golden_mb_data(uint64_t mb, uint32_t bytes, uint8_t *out)
{
	static const char *const words[] = {
		"halite", "snapshot", "locality", "block", "guest", "memory", "page",
		"restore", "fault", "stream", "vcpu", "the", "of", "and", "a", "zstd",
	};
	uint64_t s = golden_seed(mb);
	uint32_t i = 0;

	memset(out, 0, bytes);
	switch (golden_class_of[mb]) {
	case G_TEXT:
		while (i < bytes) {
			const char *w = words[golden_rand(&s) % 16];
			size_t n = strlen(w);

			for (size_t k = 0; k < n && i < bytes; k++)
				out[i++] = (uint8_t)w[k];
			if (i < bytes)
				out[i++] = (golden_rand(&s) % 8) ? ' ' : '\n';
		}
		break;
	case G_MIXED:
		for (; i < bytes; i += 64) {
			uint64_t r = golden_rand(&s);

			for (uint32_t k = 0; k < 64 && i + k < bytes; k++)
				out[i + k] = (r & 1) ? (uint8_t)golden_rand(&s) : (uint8_t)(r >> 8);
		}
		break;
	case G_RANDOM:
		for (; i < bytes; i++)
			out[i] = (uint8_t)golden_rand(&s);
		break;
	case G_SPARSE:
		for (int k = 0; k < 16; k++) {
			uint64_t r = golden_rand(&s);

			out[r % bytes] = (uint8_t)(r >> 32) | 1;
		}
		break;
	default:
		break;
	}
}

/* The device-state blob. */
static inline void golden_device_state(uint8_t out[GOLDEN_DEV_LEN])
{
	uint64_t s = golden_seed(0xde71ce);

	for (uint32_t i = 0; i < GOLDEN_DEV_LEN; i++)
		out[i] = (i % 3) ? (uint8_t)golden_rand(&s) : (uint8_t)i;
}

#endif
