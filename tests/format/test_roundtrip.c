/* SPDX-License-Identifier: MIT */
/*
 * Writer -> reader round trips through the public API: every byte of every
 * memory block comes back, counts are exact, and each stream's locality
 * blocks hold exactly the blocks put to that stream, in the order they were
 * put (the property restore locality depends on).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "test_util.h"

static uint64_t g_seed;

struct geom {
	uint32_t mb_pages, lb_size;
};

/* Region sizes in pages: one page, a size that leaves a short last MB, a larger one. */
static const uint64_t region_pages[] = { 1, 37, 300 };
static const char *const region_names[] = { "rom@etc/acpi/rsdp", "pc.bios", "pc.ram" };

enum { NSTREAMS = 3 };
static const uint32_t streams[NSTREAMS] = {
	HALITE_STREAM(HALITE_STREAM_VCPU, 0),
	HALITE_STREAM(HALITE_STREAM_VCPU, 1),
	HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0),
};

struct expect {
	uint8_t *mem;	     /* the whole guest memory, regions back to back */
	uint64_t mem_len;
	uint8_t *state;	     /* per MB: enum halite_mb_state */
	uint64_t *order[NSTREAMS]; /* stored MBs put to each stream, in order */
	uint64_t norder[NSTREAMS];
	uint64_t n_untouched, n_zero, n_stored;
};

static char *tmp_path(const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", t_tmpdir(), name) > 0);
	return p;
}

static void make_regions(struct halite_region *r, uint64_t *mem_len)
{
	*mem_len = 0;
	for (int i = 0; i < 3; i++) {
		r[i].name = region_names[i];
		r[i].gpa = (uint64_t)i << 32;
		r[i].length = region_pages[i] * 4096;
		*mem_len += r[i].length;
	}
}

/*
 * Write a file: each MB, in a shuffled order, is left untouched (1 in 8),
 * put as explicit zero (1 in 8), put with zero data (1 in 8: the writer must
 * detect it), put pre-encoded raw (1 in 8), or put normally to a random stream.
 */
static void write_file(const char *path, int codec, const struct geom *g, struct expect *ex,
		       uint64_t *seed)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_region regions[3];
	struct halite_writer *w;
	uint64_t nmb, *perm;
	uint32_t mb_size;

	make_regions(regions, &ex->mem_len);
	o.codec = codec;
	o.mb_pages = g->mb_pages;
	o.lb_size = g->lb_size;
	o.flags = HALITE_WRITER_NO_SYNC;
	o.vcpu_count = 2;
	assert_int_equal(halite_writer_create(&w, path, regions, 3, &o), 0);
	mb_size = halite_writer_mb_size(w);
	nmb = halite_writer_mb_count(w);
	{
		uint64_t want = 0;

		for (int i = 0; i < 3; i++)
			want += (regions[i].length + mb_size - 1) / mb_size;
		assert_int_equal(nmb, want);
	}

	ex->mem = calloc(1, ex->mem_len);
	ex->state = calloc(nmb, 1);
	perm = malloc(nmb * sizeof(*perm));
	for (int s = 0; s < NSTREAMS; s++) {
		ex->order[s] = malloc(nmb * sizeof(uint64_t));
		ex->norder[s] = 0;
	}
	ex->n_untouched = ex->n_zero = ex->n_stored = 0;
	for (uint64_t i = 0; i < nmb; i++)
		perm[i] = i;
	for (uint64_t i = nmb - 1; i > 0; i--) {
		uint64_t j = t_rand(seed) % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}

	/* MB m's bytes live at mem + offset_of(m): regions are contiguous in ex->mem. */
	for (uint64_t k = 0; k < nmb; k++) {
		uint64_t m = perm[k], off = 0, first = 0;
		uint32_t bytes = halite_writer_mb_bytes(w, m);
		unsigned kind = (unsigned)(t_rand(seed) % 8);
		int s = (int)(t_rand(seed) % NSTREAMS);
		uint8_t *p;

		for (int i = 0; i < 3; i++) {
			uint64_t n = (regions[i].length + mb_size - 1) / mb_size;

			if (m < first + n) {
				off += (m - first) * mb_size;
				break;
			}
			first += n;
			off += regions[i].length;
		}
		p = ex->mem + off;
		assert_true(bytes > 0 && bytes <= mb_size);
		switch (kind) {
		case 0:
			ex->state[m] = HALITE_MB_UNTOUCHED;
			ex->n_untouched++;
			continue;
		case 1:
			assert_int_equal(halite_writer_put_zero(w, m), 0);
			ex->state[m] = HALITE_MB_ZERO;
			ex->n_zero++;
			continue;
		case 2:
			assert_int_equal(halite_writer_put(w, streams[s], m, p), 0);
			ex->state[m] = HALITE_MB_ZERO;
			ex->n_zero++;
			continue;
		case 3:
			t_fill(p, bytes, 100, seed);
			assert_int_equal(halite_writer_put_encoded(w, streams[s], m, p, bytes, false), 0);
			break;
		default:
			t_fill(p, bytes, (unsigned)(t_rand(seed) % 101), seed);
			assert_int_equal(halite_writer_put(w, streams[s], m, p), 0);
			break;
		}
		ex->state[m] = HALITE_MB_STORED;
		ex->n_stored++;
		ex->order[s][ex->norder[s]++] = m;
	}
	free(perm);

	/* Misuse is refused with the documented codes and changes nothing. */
	for (uint64_t m = 0; m < nmb; m++) {
		if (ex->state[m] != HALITE_MB_UNTOUCHED) {
			assert_int_equal(halite_writer_put_zero(w, m), -HALITE_E_STATE);
			break;
		}
	}
	assert_int_equal(halite_writer_put_zero(w, nmb), -ERANGE);

	{
		struct halite_root root = { .vcpu = 1, .mode = HALITE_PAGING_4LEVEL, .cr3 = 0x1234000 };
		static const char dev[] = "QEVM device state";

		assert_int_equal(halite_writer_add_root(w, &root), 0);
		root.vcpu = 2; /* vcpu_count is 2: the reader would refuse the file */
		assert_int_equal(halite_writer_add_root(w, &root), -EINVAL);
		root.mode = 3;
		root.vcpu = HALITE_VCPU_UNKNOWN;
		assert_int_equal(halite_writer_add_root(w, &root), -EINVAL);
		assert_int_equal(halite_writer_set_device_state(w, dev, sizeof(dev)), 0);
		assert_int_equal(halite_writer_set_meta(w, "vm", "test", 4), 0);
		assert_int_equal(halite_writer_set_meta(w, "vm", "again", 5), -EEXIST);
		assert_int_equal(halite_writer_set_stat(w, "faults", 42), 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	assert_int_equal(halite_writer_put_zero(w, 0), -HALITE_E_STATE);
	halite_writer_free(w, true); /* finished: must not unlink */
	assert_int_equal(access(path, F_OK), 0);
}

static void check_file(const char *path, int codec, const struct geom *g, const struct expect *ex)
{
	struct halite_reader *r;
	const struct halite_file_info *fi;
	char errbuf[256];
	HALITE_OPTS(halite_reader_opts, ro);
	uint8_t *out, *lb;
	uint64_t pos = 0;

	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	assert_int_equal(halite_reader_open(&r, path, &ro), 0);
	fi = halite_reader_info(r);
	assert_int_equal(fi->codec, codec);
	assert_int_equal(fi->mb_pages, g->mb_pages);
	assert_int_equal(fi->lb_size, g->lb_size);
	assert_int_equal(fi->region_count, 3);
	assert_int_equal(fi->memory_bytes, ex->mem_len);
	assert_int_equal(fi->mb_untouched, ex->n_untouched);
	assert_int_equal(fi->mb_zero, ex->n_zero);
	assert_int_equal(fi->mb_stored, ex->n_stored);
	assert_int_equal(fi->mb_untouched + fi->mb_zero + fi->mb_stored, fi->mb_count);
	if (codec == HALITE_CODEC_NONE)
		assert_int_equal(fi->mb_compressed, 0);

	/* Every byte of every MB, read one by one. */
	out = malloc(fi->mb_size);
	for (uint32_t i = 0; i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(r, i);

		assert_string_equal(ri->name, region_names[i]);
		assert_int_equal(ri->length, region_pages[i] * 4096);
		assert_int_equal(halite_reader_find_region(r, ri->name), (int)i);
		for (uint64_t m = ri->first_mb; m < ri->first_mb + ri->mb_count; m++) {
			uint32_t bytes = halite_reader_mb_bytes(r, m);
			struct halite_mb_loc loc;

			assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
			assert_int_equal(loc.state, ex->state[m]);
			memset(out, 0xa5, fi->mb_size);
			assert_int_equal(halite_reader_read_mb(r, m, out), 0);
			assert_memory_equal(out, ex->mem + pos, bytes);
			pos += bytes;
		}
	}
	assert_int_equal(pos, ex->mem_len);
	assert_int_equal(halite_reader_find_region(r, "nope"), -HALITE_E_NOT_FOUND);

	/*
	 * Locality: walking each stream's LBs in seq order, their members in
	 * offset order are exactly the MBs put to that stream, in put order.
	 */
	lb = halite_reader_alloc_lb(r);
	for (int s = 0; s < NSTREAMS; s++) {
		uint64_t k = 0;
		uint32_t next_seq = 0;

		for (uint64_t i = 0; i < fi->lb_count; i++) {
			struct halite_lb_info li;
			const uint64_t *mbs;
			uint32_t n;

			assert_int_equal(halite_reader_lb_info(r, i, &li), 0);
			if (li.stream != streams[s])
				continue;
			assert_int_equal(li.seq, next_seq++);
			assert_int_equal(halite_reader_lb_members(r, i, &mbs, &n), 0);
			assert_int_equal(n, li.mb_count);
			assert_int_equal(halite_reader_read_lb(r, i, lb), 0);
			for (uint32_t j = 0; j < n; j++) {
				assert_true(k < ex->norder[s]);
				assert_int_equal(mbs[j], ex->order[s][k]);
				k++;
				assert_int_equal(halite_reader_decode_mb(r, mbs[j], lb, out), 0);
			}
		}
		assert_int_equal(k, ex->norder[s]);
	}
	halite_reader_free_lb(lb);

	{
		uint32_t nv, nr;
		const struct halite_root *roots;
		const void *data, *val;
		uint64_t len, v;
		const char *key;
		uint32_t vlen;

		assert_int_equal(halite_reader_vcpus(r, &nv, &roots, &nr), 0);
		assert_int_equal(nv, 2);
		assert_int_equal(nr, 1);
		assert_int_equal(roots[0].cr3, 0x1234000);
		assert_int_equal(halite_reader_device_state(r, &data, &len), 0);
		assert_int_equal(len, sizeof("QEVM device state"));
		assert_string_equal(data, "QEVM device state");
		assert_int_equal(halite_reader_meta_count(r), 1);
		assert_int_equal(halite_reader_meta(r, 0, &key, &val, &vlen), 0);
		assert_string_equal(key, "vm");
		assert_int_equal(vlen, 4);
		assert_memory_equal(val, "test", 4);
		assert_int_equal(halite_reader_stat_count(r), 1);
		assert_int_equal(halite_reader_stat(r, 0, &key, &v), 0);
		assert_string_equal(key, "faults");
		assert_int_equal(v, 42);
		for (uint32_t i = 0; i < halite_reader_section_count(r); i++)
			assert_int_equal(halite_reader_verify_section(r, i), 0);
	}
	free(out);
	halite_reader_free(r);
}

static void free_expect(struct expect *ex)
{
	free(ex->mem);
	free(ex->state);
	for (int s = 0; s < NSTREAMS; s++)
		free(ex->order[s]);
}

static void test_roundtrip_all(void **state)
{
	static const struct geom geoms[] = {
		{ 1, 4096 }, { 2, 8192 }, { 2, 65536 }, { 4, 1u << 20 }, { 16, 65536 },
	};
	uint64_t seed = g_seed;

	for (int codec = HALITE_CODEC_NONE; codec < HALITE_CODEC_MAX; codec++) {
		for (size_t gi = 0; gi < sizeof(geoms) / sizeof(geoms[0]); gi++) {
			char *path = tmp_path("rt.hlt");
			struct expect ex;

			fprintf(stderr, "codec %s, %u pages/MB, LB %u\n", halite_codec_name(codec),
				geoms[gi].mb_pages, geoms[gi].lb_size);
			write_file(path, codec, &geoms[gi], &ex, &seed);
			check_file(path, codec, &geoms[gi], &ex);
			free_expect(&ex);
			unlink(path);
			free(path);
		}
	}
}

/*
 * A writer that never finishes, told to keep its file, leaves it under
 * PATH.incomplete, never PATH, and every reader refuses it as incomplete.
 */
static void test_incomplete(void **state)
{
	struct halite_region reg = { .name = "pc.ram", .gpa = 0, .length = 1 << 20 };
	HALITE_OPTS(halite_writer_opts, o);
	HALITE_OPTS(halite_reader_opts, ro);
	char *path = tmp_path("incomplete.hlt");
	char *kept = tmp_path("incomplete.hlt.incomplete");
	struct halite_writer *w;
	struct halite_reader *r = (void *)0x1;
	uint8_t page[8192];
	char errbuf[256] = "";
	uint64_t seed = g_seed;

	o.flags = HALITE_WRITER_NO_SYNC;
	o.lb_size = 4096 * 4;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), 0);
	for (uint64_t m = 0; m < 40; m++) {
		t_fill(page, sizeof(page), 100, &seed);
		assert_int_equal(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, 0), m, page), 0);
	}
	halite_writer_free(w, false); /* dies mid-save: LBs on disk, no footer */
	assert_int_equal(access(path, F_OK), -1);
	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	assert_int_equal(halite_reader_open(&r, kept, &ro), -HALITE_E_INCOMPLETE);
	assert_ptr_equal(r, (void *)0x1); /* out-parameter untouched on failure */
	assert_non_null(strstr(errbuf, "did not finish"));
	assert_int_equal(unlink(kept), 0);

	/* And with unlink requested, the partial file is gone. */
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), 0);
	halite_writer_free(w, true);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(access(kept, F_OK), -1);
	free(kept);
	free(path);
}

static void test_bad_options(void **state)
{
	struct halite_region reg = { .name = "pc.ram", .gpa = 0, .length = 1 << 20 };
	struct halite_region two[2] = { reg, reg };
	char *path = tmp_path("opts.hlt");
	struct halite_writer *w;
	struct {
		struct halite_writer_opts o;
		uint64_t future_field;
	} big = { .o = { .sz = sizeof(big) }, .future_field = 1 };
	HALITE_OPTS(halite_writer_opts, o);

	o.lb_size = 12345;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), -EINVAL);
	o.lb_size = 8 << 20;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), -EINVAL);
	o.lb_size = 4096;
	o.mb_pages = 2; /* 8 KiB MB cannot fit a 4 KiB LB */
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), -EINVAL);
	o.mb_pages = 0;
	o.lb_size = 0;
	o.codec = 99;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), -HALITE_E_NO_CODEC);
	o.codec = 0;
	reg.length = 4097;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), -EINVAL);
	reg.length = 4096;
	assert_int_equal(halite_writer_create(&w, path, two, 2, &o), -EINVAL); /* same name */
	/* A newer caller's non-zero field we do not know is refused, not dropped. */
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &big.o), -EINVAL);
	big.future_field = 0;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &big.o), 0);
	halite_writer_free(w, true);
	free(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_all),
		cmocka_unit_test(test_incomplete),
		cmocka_unit_test(test_bad_options),
	};
	int ret;

	g_seed = t_seed("test_roundtrip");
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
