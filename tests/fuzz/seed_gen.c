/* SPDX-License-Identifier: MIT */
/*
 * Write the hand-made seeds of corpus/reader/ into a directory:
 *
 *   fuzz_seed_gen DIR
 *
 * Small valid files (every codec, both MB geometries, a file without LBs)
 * and a few malformed ones that start the fuzzer past the first checks. The
 * committed corpus also holds what libFuzzer found and -merge=1 kept (named
 * by their SHA-1) and every crasher once fixed (crash-*); this program only
 * documents where the seed-* files came from. Built, not a test.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/halite.h>

#include "corrupt_util.h"
#include "endian_util.h"

static const char *outdir;

#define CHECK(call)                                                                   \
	do {                                                                          \
		int ret_ = (call);                                                    \
		if (ret_) {                                                           \
			fprintf(stderr, "fuzz_seed_gen: %s: %s\n", #call,             \
				halite_strerror(ret_));                               \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

static char *out_path(const char *name)
{
	char *p;

	if (asprintf(&p, "%s/seed-%s", outdir, name) < 0)
		exit(1);
	return p;
}

static void save(const char *name, const uint8_t *b, size_t len)
{
	char *p = out_path(name);

	CHECK(cu_write_file(p, b, len));
	printf("%s (%zu bytes)\n", p, len);
	free(p);
}

/* kind 0: text, 1: random (stored raw), 2: sparse. */
static void fill(uint8_t *p, size_t len, unsigned kind, uint64_t *s)
{
	for (size_t i = 0; i < len; i++) {
		*s ^= *s << 13;
		*s ^= *s >> 7;
		*s ^= *s << 17;
		p[i] = kind == 0 ? (uint8_t)"abcab abc\n"[i % 10] : kind == 1 ? (uint8_t)*s
		       : (i % 512 == 0) ? (uint8_t)(*s | 1) : 0;
	}
}

/*
 * A valid file: two regions, MBs of every state, two streams, every optional
 * section. Returns its bytes. Format 1.0 (the seeds written before 1.1 were),
 * or 1.1 (chunked index) with @v11.
 */
static bool v11;

static uint8_t *make_valid(int codec, uint32_t mb_pages, uint32_t lb_size, bool with_lbs,
			   size_t *len)
{
	static const struct halite_region regions[] = {
		{ "ram", 0, 20 * 1024 },
		{ "rom", 0xfffff000, 4096 },
	};
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	char *path = out_path("tmp");
	uint64_t s = 0x1234567;
	uint8_t buf[8192], *b;

	o.codec = codec;
	o.mb_pages = mb_pages;
	o.lb_size = lb_size;
	o.flags = HALITE_WRITER_NO_SYNC | (v11 ? 0 : HALITE_WRITER_V1_0);
	o.vcpu_count = 1;
	CHECK(halite_writer_create(&w, path, regions, 2, &o));
	/*
	 * MB 2 untouched, MB 3 zero, MB 1 random on the virtual stream; the
	 * rest compress and share the vCPU stream's LBs.
	 */
	for (uint64_t m = 0; with_lbs && m < halite_writer_mb_count(w); m++) {
		uint32_t bytes = halite_writer_mb_bytes(w, m);

		if (m == 2)
			continue;
		if (m == 3) {
			CHECK(halite_writer_put_zero(w, m));
			continue;
		}
		fill(buf, bytes, m == 1 ? 1 : (unsigned)(m % 3 ? 2 : 0), &s);
		CHECK(halite_writer_put(w, HALITE_STREAM(m == 1, 0), m, buf));
	}
	CHECK(halite_writer_add_root(w, &(struct halite_root){ 0, 4, 0x1000 }));
	CHECK(halite_writer_set_device_state(w, "dev", 3));
	CHECK(halite_writer_set_meta(w, "k", "v", 1));
	CHECK(halite_writer_set_stat(w, "s", 7));
	CHECK(halite_writer_finish(w));
	halite_writer_free(w, true);
	b = cu_read_file(path, len);
	if (!b)
		exit(1);
	unlink(path);
	free(path);
	return b;
}

int main(int argc, char **argv)
{
	static const char *const codecs[] = { NULL, "none", "lz4", "zlib", "zstd" };
	struct cu_model m;
	uint8_t *b, *c;
	size_t len, clen;
	char name[64];

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];
	for (int codec = HALITE_CODEC_NONE; codec <= HALITE_CODEC_ZSTD; codec++) {
		snprintf(name, sizeof(name), "valid-%s", codecs[codec]);
		b = make_valid(codec, 1, 4096, true, &len);
		save(name, b, len);
		free(b);
	}
	b = make_valid(HALITE_CODEC_LZ4, 2, 8192, true, &len);
	save("valid-lz4-mb2", b, len);
	free(b);
	/* Format 1.1: the chunked index (lazy lookups, then the full check). */
	v11 = true;
	b = make_valid(HALITE_CODEC_LZ4, 1, 4096, true, &len);
	save("v1.1-valid-lz4", b, len);
	free(b);
	b = make_valid(HALITE_CODEC_ZSTD, 2, 8192, true, &len);
	save("v1.1-valid-zstd-mb2", b, len);
	free(b);
	b = make_valid(HALITE_CODEC_NONE, 1, 4096, false, &len);
	save("v1.1-valid-no-lbs", b, len);
	free(b);
	v11 = false;
	b = make_valid(HALITE_CODEC_ZSTD, 1, 4096, false, &len);
	save("valid-no-lbs", b, len);
	free(b);

	/* Malformed, from the lz4 file. */
	b = make_valid(HALITE_CODEC_LZ4, 1, 4096, true, &len);
	save("magic-only", b, 8);
	save("header-only", b, 4096);
	save("no-footer", b, len - 64);
	c = malloc(len);
	memcpy(c, b, len);
	c[HLT_HDR_INCOMPAT] = 1;
	cu_reseal(c, len, 0);
	save("incompat", c, len);
	memcpy(c, b, len);
	c[len - HLT_FTR_SIZE + HLT_FTR_SECTION_COUNT] = 65;
	cu_reseal(c, len, 0);
	save("65-sections", c, len);
	free(c);

	if (cu_parse(b, len, &m))
		return 1;
	cu_set_section(&m, 0x80000077u, "unknown optional", 16);
	c = cu_build(&m, &clen);
	save("unknown-optional", c, clen);
	free(c);
	cu_msec(&m, HALITE_SECTION_MB_MAP)->data[0] = 3; /* MB 0: state 3 */
	c = cu_build(&m, &clen);
	save("map-state3", c, clen);
	free(c);
	cu_model_free(&m);
	free(b);
	return 0;
}
