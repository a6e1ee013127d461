/* SPDX-License-Identifier: MIT */
/*
 * Format 1.1's chunked index (docs/format.md 5.7, 5.8): a 1.1 file reads
 * exactly as the 1.0 file of the same content; a 1.0 reader refuses it with
 * HALITE_E_INCOMPAT; a damaged chunk opens fine and fails, naming the chunk,
 * at the first lookup that needs it (and every one after), never with a
 * wrong entry; damage behind valid chunk checksums is caught by the member
 * list checks; many threads using one chunk first at once all get it right
 * (run under TSan by the sanitizer build).
 *
 * The file has 3 regions of 4 KiB MBs (about 20000: three mb-map chunks),
 * 3000 raw MBs in 4 KiB LBs (two lb-table chunks) and compressible ones
 * packed several to an LB (more than one lb-members chunk).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "corrupt_util.h"
#include "endian_util.h"
#include "reader_test.h"
#include "test_util.h"

#define PAGE 4096u
#define NREG 3
#define NRAW 3000u
#define THREADS 8

static const struct halite_region regions[NREG] = {
	{ "ram0", 0, 48u << 20 },
	{ "ram1", 1ull << 32, 28u << 20 },
	{ "rom", 0xfff00000, 64 * 1024 },
};

static struct {
	char *v10, *v11, *work;
	uint8_t *file; /* the 1.1 file */
	size_t len;
	uint64_t mb_count;
	uint8_t *state;	 /* expected state of every MB */
	uint64_t seed0; /* data of MB m: t_fill from seed0 + m */
} g;

static unsigned mb_kind(uint64_t m)
{
	/* Raw MBs first (so they reach the second lb-table chunk), then packed ones. */
	if (m < NRAW)
		return 2;
	return m % 5 == 0 ? 1 : m % 5 <= 2 ? 3 : 0; /* zero, compressible, untouched */
}

static void mb_data(uint64_t m, uint8_t *p)
{
	uint64_t s = g.seed0 + m;

	t_fill(p, PAGE, mb_kind(m) == 2 ? 100 : 10, &s);
}

static void write_file(const char *path, unsigned flags)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	uint8_t buf[PAGE];

	o.codec = HALITE_CODEC_LZ4;
	o.mb_pages = 1;
	o.lb_size = 4096;
	o.flags = HALITE_WRITER_NO_SYNC | flags;
	assert_int_equal(halite_writer_create(&w, path, regions, NREG, &o), 0);
	g.mb_count = halite_writer_mb_count(w);
	for (uint64_t m = 0; m < g.mb_count; m++) {
		unsigned k = mb_kind(m);

		if (k == 0)
			continue;
		if (k == 1) {
			assert_int_equal(halite_writer_put_zero(w, m), 0);
			continue;
		}
		mb_data(m, buf);
		assert_int_equal(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, m % 3), m,
						   buf), 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
}

static int setup(void **state)
{
	assert_true(asprintf(&g.v10, "%s/v10.hlt", t_tmpdir()) > 0);
	assert_true(asprintf(&g.v11, "%s/v11.hlt", t_tmpdir()) > 0);
	assert_true(asprintf(&g.work, "%s/work.hlt", t_tmpdir()) > 0);
	g.seed0 = t_seed("test_index");
	write_file(g.v10, HALITE_WRITER_V1_0);
	write_file(g.v11, 0);
	g.file = cu_read_file(g.v11, &g.len);
	assert_non_null(g.file);
	return 0;
}

static int teardown(void **state)
{
	unlink(g.v10);
	unlink(g.v11);
	unlink(g.work);
	rmdir(t_tmpdir());
	free(g.file);
	free(g.v10);
	free(g.v11);
	free(g.work);
	return 0;
}

/* Equal but for the checksum (each file has its own uuid, so its own seeds). */
static bool lb_same(const struct halite_lb_info *a, const struct halite_lb_info *b)
{
	return a->stream == b->stream && a->seq == b->seq && a->used == b->used &&
	       a->mb_count == b->mb_count && a->offset == b->offset;
}

static struct halite_reader *open_ok(const char *path)
{
	struct halite_reader *r = NULL;
	char err[256] = "";
	HALITE_OPTS(halite_reader_opts, o);

	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	if (halite_reader_open(&r, path, &o))
		fail_msg("%s", err);
	return r;
}

/* The index section's fields, from the 1.1 file's bytes. */
struct idx {
	uint64_t off, nmap, nlbt, nmem;
	uint32_t pmap, plbt, pmem;
};

static void idx_of(const uint8_t *b, size_t len, struct idx *x)
{
	struct cu_view v;
	const struct cu_sec *s;

	assert_int_equal(cu_view(b, len, &v), 0);
	s = cu_find(&v, HALITE_SECTION_INDEX);
	assert_non_null(s);
	x->off = s->off;
	x->pmap = halite_get_le32(b + s->off + HLT_IDX_MAP_CHUNK);
	x->plbt = halite_get_le32(b + s->off + HLT_IDX_LBT_CHUNK);
	x->pmem = halite_get_le32(b + s->off + HLT_IDX_MEM_CHUNK);
	x->nmap = (cu_find(&v, HALITE_SECTION_MB_MAP)->len / 8 + x->pmap - 1) / x->pmap;
	x->nlbt = (cu_find(&v, HALITE_SECTION_LB_TABLE)->len / HLT_LBT_ENTRY_SIZE + x->plbt - 1) /
		  x->plbt;
	x->nmem = (cu_find(&v, HALITE_SECTION_LB_MEMBERS)->len / 8 + x->pmem - 1) / x->pmem;
}

/* ---------------------------------------------------------------------- */

/* 1.1 reads as 1.0 does: every entry, member list, total and byte. */
static void test_roundtrip(void **state)
{
	struct halite_reader *a = open_ok(g.v10), *b = open_ok(g.v11);
	const struct halite_file_info *fa = halite_reader_info(a), *fb = halite_reader_info(b);
	uint8_t *want = malloc(PAGE), *got = malloc(PAGE);
	struct idx x;

	assert_int_equal(fa->version_minor, 0);
	assert_int_equal(fa->incompat_flags, 0);
	assert_int_equal(fb->version_minor, 1);
	assert_int_equal(fb->incompat_flags, 1);
	idx_of(g.file, g.len, &x);
	/* The shape this test needs: more than one chunk of each. */
	assert_true(x.nmap >= 3 && x.nlbt >= 2 && x.nmem >= 2);
	assert_int_equal(fb->mb_count, fa->mb_count);
	assert_int_equal(fb->lb_count, fa->lb_count);
	assert_int_equal(fb->mb_stored, fa->mb_stored);
	assert_int_equal(fb->mb_zero, fa->mb_zero);
	assert_int_equal(fb->mb_untouched, fa->mb_untouched);
	assert_int_equal(fb->mb_compressed, fa->mb_compressed);
	assert_int_equal(fb->stored_bytes, fa->stored_bytes);
	assert_true(fa->mb_compressed > 0 && fa->mb_zero > 0 && fa->mb_untouched > 0);
	/* Backwards, so chunks come in out of order. */
	for (uint64_t lb = fa->lb_count; lb-- > 0;) {
		struct halite_lb_info ia, ib;
		const uint64_t *ma, *mb;
		uint32_t na, nb;

		assert_int_equal(halite_reader_lb_info(a, lb, &ia), 0);
		assert_int_equal(halite_reader_lb_info(b, lb, &ib), 0);
		assert_true(lb_same(&ia, &ib));
		assert_int_equal(halite_reader_lb_members(a, lb, &ma, &na), 0);
		assert_int_equal(halite_reader_lb_members(b, lb, &mb, &nb), 0);
		assert_int_equal(na, nb);
		assert_memory_equal(ma, mb, na * sizeof(*ma));
	}
	for (uint64_t m = fa->mb_count; m-- > 0;) {
		struct halite_mb_loc la, lb;

		assert_int_equal(halite_reader_mb_lookup(a, m, &la), 0);
		assert_int_equal(halite_reader_mb_lookup(b, m, &lb), 0);
		assert_int_equal(la.state, lb.state);
		assert_int_equal(la.state, mb_kind(m) == 0 ? HALITE_MB_UNTOUCHED :
					   mb_kind(m) == 1 ? HALITE_MB_ZERO : HALITE_MB_STORED);
		if (la.state != HALITE_MB_STORED)
			continue;
		assert_int_equal(la.lb, lb.lb);
		assert_int_equal(la.offset, lb.offset);
		assert_int_equal(la.length, lb.length);
		assert_int_equal(la.compressed, lb.compressed);
		if (m % 7)
			continue; /* bytes of a sample: the LB path is test_roundtrip's */
		mb_data(m, want);
		assert_int_equal(halite_reader_read_mb(b, m, got), 0);
		assert_memory_equal(got, want, PAGE);
	}
	assert_int_equal(halite_reader_verify_index(a), 0);
	assert_int_equal(halite_reader_verify_index(b), 0);
	for (uint32_t i = 0; i < halite_reader_section_count(b); i++)
		assert_int_equal(halite_reader_verify_section(b, i), 0);
	assert_int_equal(halite_reader_mb_lookup(b, fb->mb_count, &(struct halite_mb_loc){ 0 }),
			 -ERANGE);
	halite_reader_free(a);
	halite_reader_free(b);
	free(want);
	free(got);
}

/* A reader that knows no incompatible feature (1.0) refuses 1.1, and reads 1.0. */
static void test_v10_reader_refuses(void **state)
{
	struct halite_reader *r = NULL;
	char err[256] = "";
	HALITE_OPTS(halite_reader_opts, o);

	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	halite_reader_test_known_incompat(0);
	assert_int_equal(halite_reader_open(&r, g.v11, &o), -HALITE_E_INCOMPAT);
	assert_null(r);
	assert_non_null(strstr(err, "unknown incompatible features 0x1"));
	assert_int_equal(halite_reader_open(&r, g.v10, &o), 0);
	halite_reader_free(r);
	/* Bits the 1.1 reader does not know are refused by it too. */
	halite_reader_test_known_incompat(HLT_INCOMPAT_KNOWN);
	{
		uint8_t *b = malloc(g.len);

		memcpy(b, g.file, g.len);
		halite_put_le64(b + HLT_HDR_INCOMPAT, 3);
		cu_reseal(b, g.len, 0);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		assert_int_equal(halite_reader_open(&r, g.work, &o), -HALITE_E_INCOMPAT);
		assert_non_null(strstr(err, "0x2"));
		free(b);
	}
}

/* Recompute every chunk checksum of the index from the bytes, then re-seal. */
static void reseal_chunks(uint8_t *b, size_t len)
{
	struct idx x;
	struct cu_view v;
	uint64_t seed = cu_file_seed(b);
	const struct cu_sec *s[3];
	const uint32_t types[3] = { HALITE_SECTION_MB_MAP, HALITE_SECTION_LB_TABLE,
				    HALITE_SECTION_LB_MEMBERS };

	idx_of(b, len, &x);
	assert_int_equal(cu_view(b, len, &v), 0);
	for (int k = 0; k < 3; k++)
		s[k] = cu_find(&v, types[k]);
	for (uint64_t c = 0; c < x.nmap; c++) {
		uint64_t n = HALITE_MIN((uint64_t)x.pmap, s[0]->len / 8 - c * x.pmap);

		halite_put_le64(b + x.off + HLT_IDX_HDR_SIZE + 8 * c,
				hlt_hash(b + s[0]->off + c * x.pmap * 8, n * 8,
					 hlt_chunk_seed(seed, types[0], c)));
	}
	for (uint64_t c = 0; c < x.nlbt; c++) {
		uint64_t n = HALITE_MIN((uint64_t)x.plbt, s[1]->len / 24 - c * x.plbt);

		halite_put_le64(b + x.off + HLT_IDX_HDR_SIZE + 8 * x.nmap + 16 * c + 8,
				hlt_hash(b + s[1]->off + c * x.plbt * 24, n * 24,
					 hlt_chunk_seed(seed, types[1], c)));
	}
	for (uint64_t c = 0; c < x.nmem; c++) {
		uint64_t n = HALITE_MIN((uint64_t)x.pmem, s[2]->len / 8 - c * x.pmem);

		halite_put_le64(b + x.off + HLT_IDX_HDR_SIZE + 8 * x.nmap + 16 * x.nlbt + 8 * c,
				hlt_hash(b + s[2]->off + c * x.pmem * 8, n * 8,
					 hlt_chunk_seed(seed, types[2], c)));
	}
	cu_reseal(b, len, 0);
}

/* The work file: the 1.1 file with @n bytes at @off xor'ed with @x, re-sealed if asked. */
static struct halite_reader *damaged(uint64_t off, uint8_t x, bool reseal)
{
	uint8_t *b = malloc(g.len);
	struct halite_reader *r;

	memcpy(b, g.file, g.len);
	b[off] ^= x;
	if (reseal)
		reseal_chunks(b, g.len);
	else
		cu_reseal(b, g.len, 0); /* section checksums match: only the chunk's fails */
	assert_int_equal(cu_write_file(g.work, b, g.len), 0);
	free(b);
	r = open_ok(g.work);
	return r;
}

static uint64_t sec_off(uint32_t type)
{
	struct cu_view v;

	assert_int_equal(cu_view(g.file, g.len, &v), 0);
	return cu_find(&v, type)->off;
}

static void expect_err(struct halite_reader *r, int got, int want, const char *needle)
{
	if (got != want || !strstr(halite_reader_errmsg(r), needle))
		fail_msg("got %d, want %d; message '%s' should name '%s'", got, want,
			 halite_reader_errmsg(r), needle);
}

/* A damaged chunk: open is fine; its first use fails naming it, and so does every next. */
static void test_corrupt_chunk(void **state)
{
	struct halite_mb_loc loc;
	struct halite_lb_info li;
	const uint64_t *mbs;
	uint32_t n;
	struct halite_reader *r;
	struct idx x;
	uint8_t *buf;

	idx_of(g.file, g.len, &x);
	/* mb-map chunk 1: MBs of chunks 0 and 2 still look up; chunk 1's fail, twice. */
	r = damaged(sec_off(HALITE_SECTION_MB_MAP) + 8 * (x.pmap + 5), 0x10, false);
	assert_int_equal(halite_reader_mb_lookup(r, 1, &loc), 0);
	assert_int_equal(halite_reader_mb_lookup(r, 2 * x.pmap + 1, &loc), 0);
	for (int i = 0; i < 2; i++)
		expect_err(r, halite_reader_mb_lookup(r, x.pmap + 100, &loc), -HALITE_E_CHECKSUM,
			   "mb-map chunk 1 ");
	expect_err(r, halite_reader_verify_index(r), -HALITE_E_CHECKSUM, "mb-map chunk 1 ");
	halite_reader_free(r);

	/* lb-table chunk 1: info, verification and reads of its LBs fail; chunk 0's work. */
	r = damaged(sec_off(HALITE_SECTION_LB_TABLE) + 24 * (x.plbt + 3) + HLT_LBT_USED, 1, false);
	buf = halite_reader_alloc_lb(r);
	assert_int_equal(halite_reader_lb_info(r, 0, &li), 0);
	assert_int_equal(halite_reader_read_lb(r, 0, buf), 0);
	expect_err(r, halite_reader_lb_info(r, x.plbt, &li), -HALITE_E_CHECKSUM,
		   "lb-table chunk 1 ");
	assert_int_equal(li.used, 0); /* nothing from it */
	expect_err(r, halite_reader_read_lb(r, x.plbt + 7, buf), -HALITE_E_CHECKSUM,
		   "lb-table chunk 1 ");
	n = 99;
	expect_err(r, halite_reader_lb_members(r, x.plbt, &mbs, &n), -HALITE_E_CHECKSUM,
		   "lb-table chunk 1 ");
	assert_int_equal(n, 0);
	halite_reader_free_lb(buf);
	halite_reader_free(r);

	/* lb-members chunk 0: LB 0's list, and the lookup of a stored MB in it, fail. */
	r = damaged(sec_off(HALITE_SECTION_LB_MEMBERS) + 8, 0x01, false);
	expect_err(r, halite_reader_lb_members(r, 0, &mbs, &n), -HALITE_E_CHECKSUM,
		   "lb-members chunk 0 ");
	assert_int_equal(halite_reader_mb_lookup(r, 0, &loc), -HALITE_E_CHECKSUM);
	/* Untouched and zero blocks need no member list. */
	assert_int_equal(halite_reader_mb_lookup(r, NRAW + 3, &loc), 0);
	assert_int_equal(loc.state, HALITE_MB_UNTOUCHED);
	halite_reader_free(r);

	/* The index itself is verified at open. */
	{
		uint8_t *b = malloc(g.len);
		struct halite_reader *r2 = NULL;

		memcpy(b, g.file, g.len);
		b[x.off + HLT_IDX_HDR_SIZE + 3] ^= 4;
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		assert_int_equal(halite_reader_open(&r2, g.work, NULL), -HALITE_E_CHECKSUM);
		free(b);
	}
}

/* Damage behind valid chunk checksums: the member-list checks catch it. */
static void test_semantic(void **state)
{
	struct halite_reader *r;
	struct halite_mb_loc loc;
	const uint64_t *mbs;
	uint32_t n;
	uint64_t mem = sec_off(HALITE_SECTION_LB_MEMBERS), map = sec_off(HALITE_SECTION_MB_MAP);
	struct idx x;
	int ret;

	idx_of(g.file, g.len, &x);
	/* LB 0's member is another MB: its list does not tile, and MB 0's entry is unvouched. */
	r = damaged(mem, 0x02, true);
	expect_err(r, halite_reader_lb_members(r, 0, &mbs, &n), -HALITE_E_CORRUPT,
		   "lb-members: locality block 0");
	expect_err(r, halite_reader_mb_lookup(r, 0, &loc), -HALITE_E_CORRUPT, "locality block 0");
	halite_reader_free(r);
	/* A member past the last MB. */
	r = damaged(mem + 7, 0x40, true);
	expect_err(r, halite_reader_lb_members(r, 0, &mbs, &n), -HALITE_E_CORRUPT, "past the last");
	halite_reader_free(r);
	/* MB 0's map entry moved to another LB (1): LB 1's list does not hold it. */
	{
		uint8_t *b = malloc(g.len);
		uint64_t e = halite_get_le64(g.file + map);

		memcpy(b, g.file, g.len);
		/* 4 KiB LBs: lb_shift 12, LB index from bit 27. */
		halite_put_le64(b + map, e + (1ull << 27));
		reseal_chunks(b, g.len);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		r = open_ok(g.work);
		ret = halite_reader_mb_lookup(r, 0, &loc);
		expect_err(r, ret, -HALITE_E_CORRUPT, "memory block 0");
		expect_err(r, halite_reader_verify_index(r), -HALITE_E_CORRUPT, "locality block 0");
		halite_reader_free(r);
		/* Index totals off by one: open trusts them, the full check does not. */
		memcpy(b, g.file, g.len);
		halite_put_le64(b + x.off + HLT_IDX_MB_ZERO,
				halite_get_le64(b + x.off + HLT_IDX_MB_ZERO) - 1);
		cu_reseal(b, g.len, 0);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		r = open_ok(g.work);
		assert_int_equal(halite_reader_mb_lookup(r, 0, &loc), 0);
		expect_err(r, halite_reader_verify_index(r), -HALITE_E_CORRUPT, "index totals");
		halite_reader_free(r);
		/* Chunk sizes that are not powers of two, and an index of the wrong length. */
		memcpy(b, g.file, g.len);
		halite_put_le32(b + x.off + HLT_IDX_MAP_CHUNK, 1000);
		cu_reseal(b, g.len, 0);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		assert_int_equal(halite_reader_open(&r, g.work, NULL), -HALITE_E_CORRUPT);
		memcpy(b, g.file, g.len);
		halite_put_le32(b + x.off + HLT_IDX_MAP_CHUNK, x.pmap * 2);
		cu_reseal(b, g.len, 0);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		assert_int_equal(halite_reader_open(&r, g.work, NULL), -HALITE_E_CORRUPT);
		/* The first member of lb-table chunk 1 moved. */
		memcpy(b, g.file, g.len);
		halite_put_le64(b + x.off + HLT_IDX_HDR_SIZE + 8 * x.nmap + 16,
				halite_get_le64(b + x.off + HLT_IDX_HDR_SIZE + 8 * x.nmap + 16) + 1);
		cu_reseal(b, g.len, 0);
		assert_int_equal(cu_write_file(g.work, b, g.len), 0);
		r = open_ok(g.work);
		expect_err(r, halite_reader_lb_members(r, x.plbt, &mbs, &n), -HALITE_E_CORRUPT,
			   "lb-table chunk 1");
		halite_reader_free(r);
		free(b);
	}
}

struct race {
	struct halite_reader *r, *ref;
	pthread_barrier_t *bar;
	unsigned id;
	int bad;
};

static void *race_main(void *arg)
{
	struct race *t = arg;
	const struct halite_file_info *fi = halite_reader_info(t->r);

	pthread_barrier_wait(t->bar);
	/* Everyone starts on the same MBs and LBs: the first use of the same chunks. */
	for (uint64_t k = 0; k < fi->mb_count; k += 1 + t->id) {
		uint64_t m = (k * 7919) % fi->mb_count;
		struct halite_mb_loc a, b;

		if (halite_reader_mb_lookup(t->r, m, &a) || halite_reader_mb_lookup(t->ref, m, &b) ||
		    a.state != b.state || (a.state == HALITE_MB_STORED &&
					   (a.lb != b.lb || a.offset != b.offset)))
			t->bad++;
	}
	for (uint64_t lb = 0; lb < fi->lb_count; lb += 1 + t->id % 3) {
		const uint64_t *ma, *mb;
		uint32_t na, nb;
		struct halite_lb_info ia, ib;

		if (halite_reader_lb_members(t->r, lb, &ma, &na) ||
		    halite_reader_lb_members(t->ref, lb, &mb, &nb) || na != nb ||
		    memcmp(ma, mb, na * sizeof(*ma)) || halite_reader_lb_info(t->r, lb, &ia) ||
		    halite_reader_lb_info(t->ref, lb, &ib) || !lb_same(&ia, &ib))
			t->bad++;
	}
	return NULL;
}

/* Many threads using the same chunks first, at once (TSan build: no race reported). */
static void test_concurrent_first_use(void **state)
{
	struct halite_reader *ref = open_ok(g.v10);

	for (int round = 0; round < 4; round++) {
		struct halite_reader *r = open_ok(g.v11);
		pthread_barrier_t bar;
		pthread_t th[THREADS];
		struct race t[THREADS];

		pthread_barrier_init(&bar, NULL, THREADS);
		for (unsigned i = 0; i < THREADS; i++) {
			t[i] = (struct race){ r, ref, &bar, i, 0 };
			assert_int_equal(pthread_create(&th[i], NULL, race_main, &t[i]), 0);
		}
		for (unsigned i = 0; i < THREADS; i++) {
			pthread_join(th[i], NULL);
			assert_int_equal(t[i].bad, 0);
		}
		pthread_barrier_destroy(&bar);
		assert_int_equal(halite_reader_verify_index(r), 0);
		halite_reader_free(r);
	}
	halite_reader_free(ref);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_v10_reader_refuses),
		cmocka_unit_test(test_corrupt_chunk),
		cmocka_unit_test(test_semantic),
		cmocka_unit_test(test_concurrent_first_use),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
