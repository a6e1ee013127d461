/* SPDX-License-Identifier: MIT */
/*
 * The reader on hostile input: every kind of damage docs/format.md names must
 * be refused with the exact error code the spec gives, before anything is
 * trusted, and without allocating more than the file's size justifies.
 *
 * One small valid file (3 regions, 3 streams, lz4, 4 KiB LBs so there are
 * many of them, metadata, save-stats, vCPU roots, device state) is written
 * with the writer; each case damages a copy and opens it. Byte flips check
 * the checksums; truncations check the footer; semantic cases change a field
 * and re-seal the file (every checksum recomputed, corrupt_util.c) so that
 * the range and consistency checks behind the checksums are reached too.
 *
 * Each group runs every case and prints every one that fails, with the code
 * it got, the code it wanted and the reader's message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "corrupt_util.h"
#include "endian_util.h"
#include "test_util.h"

/*
 * "No huge allocation": an allocation sized by a hostile field must fail the
 * test, not pass unnoticed because the machine had the memory. Under ASan a
 * too-large malloc returns NULL (the reader then says -ENOMEM, which no case
 * expects); elsewhere the address space is capped.
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#ifdef __SANITIZE_ADDRESS__
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "max_allocation_size_mb=256:allocator_may_return_null=1";
}
#endif

static void limit_allocations(void)
{
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	struct rlimit rl = { 1ull << 30, 1ull << 30 };

	setrlimit(RLIMIT_AS, &rl);
#endif
}

/* ---------------------------------------------------------------------- */
/* The base file                                                            */

#define LB_SIZE 4096u
#define PAGE 4096u
#define NREG 3
#define NSTREAM 3

static const struct halite_region base_regions[NREG] = {
	{ "ram0", 0, 64 * 1024 },
	{ "ram1", 0x100000, 40 * 1024 },
	{ "rom0", 0xfff00000, 8 * 1024 },
};
static const uint32_t base_streams[NSTREAM] = {
	HALITE_STREAM(HALITE_STREAM_VCPU, 0),
	HALITE_STREAM(HALITE_STREAM_VCPU, 1),
	HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0),
};
/* Same-length keys so that one can be renamed into another in place. */
static const char *const meta_keys[] = { "vm.a", "vm.b", "vm.c" };

static struct {
	char *path;	   /* the work file every case writes */
	uint8_t *file;	   /* the valid file */
	size_t len;
	struct cu_view v;
	struct cu_model model;
	uint64_t mb_count, lb_count;
	uint8_t *mem;	   /* expected bytes of every MB, mb_count * PAGE */
	uint8_t *state;	   /* expected state of every MB */
	uint64_t lb_used[64];
	int failures;	   /* in the current group */
} g;

static void write_base(const char *path)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	uint64_t s = 0x5eed0001;
	uint8_t dev[301];

	o.codec = HALITE_CODEC_LZ4;
	o.mb_pages = 1;
	o.lb_size = LB_SIZE;
	/* Format 1.0: every check below is made at open (1.1's chunks: test_index). */
	o.flags = HALITE_WRITER_NO_SYNC | HALITE_WRITER_V1_0;
	o.vcpu_count = 2;
	assert_int_equal(halite_writer_create(&w, path, base_regions, NREG, &o), 0);
	g.mb_count = halite_writer_mb_count(w);
	g.mem = calloc(g.mb_count, PAGE);
	g.state = calloc(g.mb_count, 1);
	/* A fixed order that is not the MB order, so streams interleave. */
	for (uint64_t k = 0; k < g.mb_count; k++) {
		uint64_t m = (k * 11) % g.mb_count; /* 11 is prime to mb_count (28) */
		uint32_t bytes = halite_writer_mb_bytes(w, m);
		uint8_t *p = g.mem + m * PAGE;

		switch (m % 7) {
		case 0:
			g.state[m] = HALITE_MB_UNTOUCHED;
			continue;
		case 1:
			g.state[m] = HALITE_MB_ZERO;
			break;
		case 2:
			t_fill(p, bytes, 100, &s); /* stored raw */
			g.state[m] = HALITE_MB_STORED;
			break;
		default:
			t_fill(p, bytes, (unsigned)(m % 7 - 3) * 10, &s); /* compresses */
			g.state[m] = HALITE_MB_STORED;
			break;
		}
		assert_int_equal(halite_writer_put(w, base_streams[k % NSTREAM], m, p), 0);
		if (k == g.mb_count / 2)
			assert_int_equal(halite_writer_flush_stream(w, base_streams[0]), 0);
	}
	t_fill(dev, sizeof(dev), 50, &s);
	assert_int_equal(halite_writer_set_device_state(w, dev, sizeof(dev)), 0);
	for (size_t i = 0; i < HALITE_ARRAY_SIZE(meta_keys); i++)
		assert_int_equal(halite_writer_set_meta(w, meta_keys[i], "value", 5), 0);
	assert_int_equal(halite_writer_set_stat(w, "st.a", 1), 0);
	assert_int_equal(halite_writer_set_stat(w, "st.b", 2), 0);
	assert_int_equal(halite_writer_add_root(w, &(struct halite_root){ 0, 4, 0x1000 }), 0);
	assert_int_equal(halite_writer_add_root(w, &(struct halite_root){ 1, 5, 0x2000 }), 0);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
}

static int setup(void **state)
{
	char *base;

	limit_allocations();
	assert_true(asprintf(&base, "%s/base.hlt", t_tmpdir()) > 0);
	assert_true(asprintf(&g.path, "%s/work.hlt", t_tmpdir()) > 0);
	write_base(base);
	g.file = cu_read_file(base, &g.len);
	assert_non_null(g.file);
	assert_int_equal(cu_view(g.file, g.len, &g.v), 0);
	assert_int_equal(cu_parse(g.file, g.len, &g.model), 0);
	g.lb_count = g.v.lb_count;
	assert_true(g.lb_count >= 8 && g.lb_count <= HALITE_ARRAY_SIZE(g.lb_used));
	assert_int_equal(g.v.nsec, 7);
	for (uint64_t i = 0; i < g.lb_count; i++)
		g.lb_used[i] = halite_get_le32(g.file + cu_find(&g.v, HALITE_SECTION_LB_TABLE)->off +
					       i * HLT_LBT_ENTRY_SIZE + HLT_LBT_USED);
	unlink(base);
	free(base);
	return 0;
}

static int teardown(void **state)
{
	unlink(g.path);
	rmdir(t_tmpdir());
	cu_model_free(&g.model);
	free(g.file);
	free(g.mem);
	free(g.state);
	free(g.path);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Opening and judging                                                      */

static const char *code_name(int ret)
{
	static char buf[160];

	if (ret == 0)
		return "0";
	snprintf(buf, sizeof(buf), "%d (%s)", ret, halite_strerror(ret));
	return buf;
}

/* Open the work file; the reader (on success) goes to *rp, else is freed. */
static int open_work(struct halite_reader **rp, char *err, size_t errlen)
{
	HALITE_OPTS(halite_reader_opts, o);
	struct halite_reader *r = NULL;
	int ret;

	err[0] = 0;
	o.errbuf = err;
	o.errbuf_len = errlen;
	ret = halite_reader_open(&r, g.path, &o);
	if (rp)
		*rp = ret ? NULL : r;
	else if (!ret)
		halite_reader_free(r);
	return ret;
}

__attribute__((format(printf, 4, 5)))
static void judge(int got, int want, const char *err, const char *fmt, ...)
{
	char what[200];
	va_list ap;

	if (got == want)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	fprintf(stderr, "FAIL %s: got %s", what, code_name(got));
	fprintf(stderr, ", want %s\n     reader: %s\n", code_name(want), err[0] ? err : "(no message)");
	g.failures++;
}

static void end_group(const char *group, int cases)
{
	int f = g.failures;

	fprintf(stderr, "%s: %d cases, %d failed\n", group, cases, f);
	g.failures = 0;
	if (f)
		fail_msg("%s: %d of %d cases failed (listed above)", group, f, cases);
}

static void write_work(const uint8_t *b, size_t len)
{
	assert_int_equal(cu_write_file(g.path, b, len), 0);
}

static void poke(int fd, uint64_t off, uint8_t v)
{
	assert_int_equal(pwrite(fd, &v, 1, (off_t)off), 1);
}

/* Flip @off by each mask in place in the work file (which holds the valid file). */
static int flip_range(uint64_t from, uint64_t to, int (*want)(uint64_t off), const char *what)
{
	static const uint8_t masks[] = { 0xff, 0x01 };
	char err[512];
	int fd, n = 0;

	write_work(g.file, g.len);
	fd = open(g.path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	for (uint64_t off = from; off < to; off++) {
		for (size_t k = 0; k < HALITE_ARRAY_SIZE(masks); k++) {
			poke(fd, off, g.file[off] ^ masks[k]);
			judge(open_work(NULL, err, sizeof(err)), want(off), err, "%s byte %llu ^0x%02x",
			      what, (unsigned long long)off, masks[k]);
			n++;
		}
		poke(fd, off, g.file[off]);
	}
	close(fd);
	return n;
}

/* ---------------------------------------------------------------------- */
/* The valid file, and the helpers themselves                               */

static void check_all_mbs(struct halite_reader *r, const char *what)
{
	uint8_t *lb = halite_reader_alloc_lb(r), out[PAGE];

	assert_non_null(lb);
	for (uint64_t m = 0; m < g.mb_count; m++) {
		struct halite_mb_loc loc;
		uint32_t bytes = halite_reader_mb_bytes(r, m);

		assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
		if (loc.state != g.state[m])
			fail_msg("%s: MB %llu state %u, want %u", what, (unsigned long long)m, loc.state,
				 g.state[m]);
		if (loc.state == HALITE_MB_STORED)
			assert_int_equal(halite_reader_read_lb(r, loc.lb, lb), 0);
		assert_int_equal(halite_reader_decode_mb(r, m, lb, out), 0);
		if (memcmp(out, g.mem + m * PAGE, bytes))
			fail_msg("%s: MB %llu decodes to other bytes", what, (unsigned long long)m);
	}
	halite_reader_free_lb(lb);
}

static void test_valid(void **state)
{
	struct halite_reader *r;
	char err[512];
	uint8_t *b;
	size_t len;
	uint64_t counts[3] = { 0 };

	write_work(g.file, g.len);
	assert_int_equal(open_work(&r, err, sizeof(err)), 0);
	assert_int_equal(halite_reader_info(r)->mb_count, g.mb_count);
	assert_int_equal(halite_reader_info(r)->lb_count, g.lb_count);
	for (uint64_t m = 0; m < g.mb_count; m++)
		counts[g.state[m]]++;
	assert_int_equal(halite_reader_info(r)->mb_untouched, counts[HALITE_MB_UNTOUCHED]);
	assert_int_equal(halite_reader_info(r)->mb_zero, counts[HALITE_MB_ZERO]);
	assert_int_equal(halite_reader_info(r)->mb_stored, counts[HALITE_MB_STORED]);
	assert_true(halite_reader_info(r)->mb_compressed > 0);
	assert_true(halite_reader_info(r)->mb_compressed < counts[HALITE_MB_STORED]);
	for (uint64_t i = 0; i < g.lb_count; i++) {
		struct halite_lb_info li;

		assert_int_equal(halite_reader_lb_info(r, i, &li), 0);
		assert_int_equal(li.used, g.lb_used[i]);
		assert_int_equal(li.offset, g.v.data_offset + i * LB_SIZE);
	}
	for (uint32_t i = 0; i < halite_reader_section_count(r); i++)
		assert_int_equal(halite_reader_verify_section(r, i), 0);
	check_all_mbs(r, "valid file");
	halite_reader_free(r);

	/* The helpers: a model rebuilt unchanged is the writer's file, byte for byte. */
	b = cu_build(&g.model, &len);
	assert_int_equal(len, g.len);
	assert_memory_equal(b, g.file, len);
	/* ... and re-sealing a valid file changes nothing. */
	cu_reseal(b, len, CU_RESEAL_LBS);
	assert_memory_equal(b, g.file, len);
	free(b);
}

/* ---------------------------------------------------------------------- */
/* Byte flips                                                               */

static int want_header(uint64_t off)
{
	if (off < HLT_HDR_VERSION_MAJOR)
		return -HALITE_E_BAD_MAGIC;
	if (off < HLT_HDR_VERSION_MAJOR + 2)
		return -HALITE_E_VERSION;
	if (off < HLT_HDR_SIZE)
		return -HALITE_E_CHECKSUM;
	return -HALITE_E_RESERVED; /* padding up to data_offset */
}

static int want_incomplete(uint64_t off) { return -HALITE_E_INCOMPLETE; }
static int want_checksum(uint64_t off) { return -HALITE_E_CHECKSUM; }

static void test_flip_header(void **state)
{
	int n = flip_range(0, HLT_DATA_OFFSET, want_header, "header");

	end_group("header and padding flips", n);
}

static void test_flip_footer(void **state)
{
	int n = flip_range(g.len - HLT_FTR_SIZE, g.len, want_incomplete, "footer");

	end_group("footer flips", n);
}

static void test_flip_directory(void **state)
{
	int n = flip_range(g.v.dir_off, g.v.dir_off + g.v.nsec * HLT_DIR_ENTRY_SIZE, want_checksum,
			   "directory");

	end_group("directory flips", n);
}

static void test_flip_sections(void **state)
{
	int n = 0;

	for (uint32_t i = 0; i < g.v.nsec; i++) {
		const struct cu_sec *s = &g.v.sec[i];
		uint64_t pos[] = { s->off, s->off + s->len / 2, s->off + s->len - 1 };
		char what[64];

		assert_true(s->len > 0);
		snprintf(what, sizeof(what), "section %s",
			 halite_section_name(s->type) ? halite_section_name(s->type) : "?");
		for (size_t k = 0; k < HALITE_ARRAY_SIZE(pos); k++)
			n += flip_range(pos[k], pos[k] + 1, want_checksum, what);
	}
	end_group("section flips", n);
}

/* errmsg names "locality block N" with N exactly (not a prefix of another number). */
static bool names_lb(const char *msg, uint64_t lb)
{
	char needle[48];
	const char *p = msg;
	size_t n = (size_t)snprintf(needle, sizeof(needle), "locality block %llu",
				    (unsigned long long)lb);

	while ((p = strstr(p, needle))) {
		if (p[n] < '0' || p[n] > '9')
			return true;
		p += n;
	}
	return false;
}

/* Open the work file (must succeed) and check LB @bad fails, every other LB reads fine. */
static void check_lbs(const char *what, int64_t bad)
{
	struct halite_reader *r;
	char err[512];
	void *buf;
	int ret = open_work(&r, err, sizeof(err));

	judge(ret, 0, err, "%s: open", what);
	if (ret)
		return;
	buf = halite_reader_alloc_lb(r);
	assert_non_null(buf);
	for (uint64_t i = 0; i < g.lb_count; i++) {
		int want = (int64_t)i == bad ? -HALITE_E_LB_CHECKSUM : 0;

		ret = halite_reader_read_lb(r, i, buf);
		judge(ret, want, halite_reader_errmsg(r), "%s: read LB %llu", what,
		      (unsigned long long)i);
		if (ret == -HALITE_E_LB_CHECKSUM && !names_lb(halite_reader_errmsg(r), i)) {
			fprintf(stderr, "FAIL %s: message does not name locality block %llu: %s\n",
				what, (unsigned long long)i, halite_reader_errmsg(r));
			g.failures++;
		}
		if (ret == -HALITE_E_LB_CHECKSUM)
			continue;
		/* The LBs that verify still decode to the right bytes. */
		for (uint64_t m = 0; m < g.mb_count; m++) {
			struct halite_mb_loc loc;
			uint8_t out[PAGE];

			assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
			if (loc.state != HALITE_MB_STORED || loc.lb != i)
				continue;
			ret = halite_reader_decode_mb(r, m, buf, out);
			judge(ret, 0, halite_reader_errmsg(r), "%s: decode MB %llu", what,
			      (unsigned long long)m);
			if (!ret && memcmp(out, g.mem + m * PAGE, halite_reader_mb_bytes(r, m))) {
				fprintf(stderr, "FAIL %s: MB %llu decodes to other bytes\n", what,
					(unsigned long long)m);
				g.failures++;
			}
		}
	}
	halite_reader_free_lb(buf);
	halite_reader_free(r);
}

static void test_flip_lbs(void **state)
{
	int n = 0;

	for (uint64_t i = 0; i < g.lb_count; i++) {
		uint64_t base = g.v.data_offset + i * LB_SIZE, used = g.lb_used[i];
		uint64_t pos[] = { 0, used / 2, used - 1, used, LB_SIZE - 1 }; /* used..: slack */

		for (size_t k = 0; k < HALITE_ARRAY_SIZE(pos); k++) {
			uint8_t *b;
			char what[96];

			if (pos[k] >= LB_SIZE)
				continue;
			b = malloc(g.len);
			memcpy(b, g.file, g.len);
			b[base + pos[k]] ^= k & 1 ? 0x01 : 0xff;
			write_work(b, g.len);
			free(b);
			snprintf(what, sizeof(what), "LB %llu byte %llu%s", (unsigned long long)i,
				 (unsigned long long)pos[k], pos[k] >= used ? " (slack)" : "");
			check_lbs(what, (int64_t)i);
			n++;
		}
	}
	/* An LB moved to another position, or swapped with another, fails: seeds differ. */
	for (uint64_t i = 0; i + 1 < g.lb_count; i += 3) {
		uint8_t *b = malloc(g.len);
		char what[64];

		memcpy(b, g.file, g.len);
		memcpy(b + g.v.data_offset + i * LB_SIZE, g.file + g.v.data_offset + (i + 1) * LB_SIZE,
		       LB_SIZE);
		write_work(b, g.len);
		free(b);
		snprintf(what, sizeof(what), "LB %llu replaced by LB %llu", (unsigned long long)i,
			 (unsigned long long)i + 1);
		check_lbs(what, (int64_t)i);
		n++;
	}
	end_group("locality block damage", n);
}

/* ---------------------------------------------------------------------- */
/* Truncation                                                               */

/*
 * docs/format.md section 6 step 1: shorter than 4096 + 64 bytes is
 * TRUNCATED (BAD_MAGIC when even the magic is wrong, as it is when there is
 * no whole magic); past that, a file cut short has no valid footer:
 * INCOMPLETE (section 2).
 */
static int want_truncated(uint64_t size)
{
	if (size < 8)
		return -HALITE_E_BAD_MAGIC;
	if (size < HLT_HDR_SIZE)
		return -HALITE_E_TRUNCATED;
	/* A valid header without a valid footer is incomplete, however short. */
	return -HALITE_E_INCOMPLETE;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void test_truncate(void **state)
{
	uint64_t sizes[256];
	size_t ns = 0;
	char err[512];
	int n = 0;
	const uint64_t fixed[] = { 0, 1, 7, 8, 9, 127, 128, 129, 4095, 4096, 4097,
				   HLT_DATA_OFFSET + HLT_FTR_SIZE - 1, HLT_DATA_OFFSET + HLT_FTR_SIZE,
				   g.len - HLT_FTR_SIZE - 1, g.len - HLT_FTR_SIZE, g.len - 8,
				   g.len - 1 };

	for (size_t i = 0; i < HALITE_ARRAY_SIZE(fixed); i++)
		sizes[ns++] = fixed[i];
	for (uint64_t i = 0; i <= g.lb_count; i++) {
		sizes[ns++] = g.v.data_offset + i * LB_SIZE;
		sizes[ns++] = g.v.data_offset + i * LB_SIZE + 1;
	}
	for (uint32_t i = 0; i < g.v.nsec; i++) {
		sizes[ns++] = g.v.sec[i].off;
		sizes[ns++] = g.v.sec[i].off + g.v.sec[i].len;
		sizes[ns++] = g.v.dir_off + i * HLT_DIR_ENTRY_SIZE;
	}
	sizes[ns++] = g.v.dir_off + g.v.nsec * HLT_DIR_ENTRY_SIZE;
	assert_true(ns <= HALITE_ARRAY_SIZE(sizes));
	qsort(sizes, ns, sizeof(sizes[0]), cmp_u64);
	for (size_t i = 1; i < ns;) /* unique */
		if (sizes[i] == sizes[i - 1])
			memmove(&sizes[i], &sizes[i + 1], (--ns - i) * sizeof(sizes[0]));
		else
			i++;

	write_work(g.file, g.len);
	for (size_t i = 0; i < ns; i++) {
		assert_true(sizes[i] < g.len);
		assert_int_equal(truncate(g.path, (off_t)sizes[i]), 0);
		judge(open_work(NULL, err, sizeof(err)), want_truncated(sizes[i]), err,
		      "truncated to %llu bytes", (unsigned long long)sizes[i]);
		n++;
		write_work(g.file, g.len); /* truncate() cannot grow it back */
	}
	/* Short files whose magic is wrong are not Halite files at all. */
	for (uint64_t size = 8; size <= HLT_DATA_OFFSET + HLT_FTR_SIZE; size += 1031) {
		uint8_t b[HLT_DATA_OFFSET + HLT_FTR_SIZE];

		memcpy(b, g.file, size);
		b[1] ^= 0x20;
		write_work(b, size);
		judge(open_work(NULL, err, sizeof(err)), -HALITE_E_BAD_MAGIC, err,
		      "%llu bytes with a bad magic", (unsigned long long)size);
		n++;
	}
	/* Appended bytes: the footer is no longer at the end. */
	{
		uint8_t *b = calloc(1, g.len + 64);

		memcpy(b, g.file, g.len);
		write_work(b, g.len + 64);
		judge(open_work(NULL, err, sizeof(err)), -HALITE_E_INCOMPLETE, err,
		      "64 zero bytes appended");
		memcpy(b + g.len, g.file + g.len - HLT_FTR_SIZE, HLT_FTR_SIZE);
		write_work(b, g.len + 64);
		/* A valid footer now, but its directory no longer ends where it starts. */
		judge(open_work(NULL, err, sizeof(err)), -HALITE_E_CORRUPT, err,
		      "footer duplicated at the end");
		n += 2;
		free(b);
	}
	end_group("truncation", n);
}

/* ---------------------------------------------------------------------- */
/* Semantic corruption, re-sealed                                           */

/* Where a patch applies. */
enum area { HDR, FTR, DIRENT, SEC };

struct patch {
	const char *name;
	enum area area;
	uint32_t sel;	  /* DIRENT: section type of the entry; SEC: section type */
	int64_t off;	  /* from the area's start; negative: from the section's end */
	unsigned width;	  /* 1, 2, 4, 8 bytes */
	uint64_t value;
	int want;
	unsigned flags;
};

#define P_XOR 0x1u  /* xor the value in rather than store it */
#define P_ADD 0x2u  /* add the value (mod 2^(8*width)) */

static uint64_t get_n(const uint8_t *p, unsigned w)
{
	switch (w) {
	case 1: return p[0];
	case 2: return halite_get_le16(p);
	case 4: return halite_get_le32(p);
	}
	return halite_get_le64(p);
}

static void put_n(uint8_t *p, unsigned w, uint64_t v)
{
	switch (w) {
	case 1: p[0] = (uint8_t)v; break;
	case 2: halite_put_le16(p, (uint16_t)v); break;
	case 4: halite_put_le32(p, (uint32_t)v); break;
	default: halite_put_le64(p, v); break;
	}
}

static void apply(uint8_t *b, size_t len, const struct patch *p)
{
	uint64_t base = 0, v;
	const struct cu_sec *s;

	switch (p->area) {
	case HDR:
		base = 0;
		break;
	case FTR:
		base = len - HLT_FTR_SIZE;
		break;
	case DIRENT:
		s = cu_find(&g.v, p->sel);
		assert_non_null(s);
		base = s->dir_pos;
		break;
	case SEC:
		s = cu_find(&g.v, p->sel);
		assert_non_null(s);
		base = p->off < 0 ? s->off + s->len : s->off;
		break;
	}
	base += (uint64_t)p->off;
	assert_true(base + p->width <= len);
	v = p->value;
	if (p->flags & P_XOR)
		v ^= get_n(b + base, p->width);
	if (p->flags & P_ADD)
		v += get_n(b + base, p->width);
	put_n(b + base, p->width, v);
}

/* Open @b (already sealed) as the work file and judge. */
static void try_bytes(const uint8_t *b, size_t len, int want, const char *name)
{
	char err[512];

	write_work(b, len);
	judge(open_work(NULL, err, sizeof(err)), want, err, "%s", name);
}

static void run_patch(const struct patch *p)
{
	uint8_t *b = malloc(g.len);

	memcpy(b, g.file, g.len);
	apply(b, g.len, p);
	cu_reseal(b, g.len, 0);
	try_bytes(b, g.len, p->want, p->name);
	free(b);
}

#define E(x) (-HALITE_E_##x)
#define MIB (1ull << 20)
#define REG0 HLT_REG_HDR_SIZE /* first region entry */
#define REG1 (REG0 + HLT_REG_ENTRY_SIZE + 8) /* names are 4 bytes, padded to 8 */
#define REG2 (REG1 + HLT_REG_ENTRY_SIZE + 8)
#define KV0 HLT_KV_HDR_SIZE
#define KV1 (KV0 + 24) /* metadata entries: 8 + "vm.x" + "value" = 17, padded to 24 */

/* Most rows leave flags out: zero, store the value. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const struct patch patches[] = {
	/* header */
	/* bit 0 is 1.1's chunked index: known, but this 1.0 file has no index section */
	{ "incompat bit 0 (no index)", HDR, 0, HLT_HDR_INCOMPAT, 8, 1, E(CORRUPT) },
	{ "incompat bit 1", HDR, 0, HLT_HDR_INCOMPAT, 8, 2, E(INCOMPAT) },
	{ "incompat bit 63", HDR, 0, HLT_HDR_INCOMPAT, 8, 1ull << 63, E(INCOMPAT) },
	{ "compat bit 5 (ignored)", HDR, 0, HLT_HDR_COMPAT, 8, 1u << 5, 0 },
	{ "version minor 7 (accepted)", HDR, 0, HLT_HDR_VERSION_MINOR, 2, 7, 0 },
	{ "version major 0", HDR, 0, HLT_HDR_VERSION_MAJOR, 2, 0, E(VERSION) },
	{ "version major 2", HDR, 0, HLT_HDR_VERSION_MAJOR, 2, 2, E(VERSION) },
	{ "header size 0", HDR, 0, HLT_HDR_HEADER_SIZE, 4, 0, E(CORRUPT) },
	{ "header size 256", HDR, 0, HLT_HDR_HEADER_SIZE, 4, 256, E(CORRUPT) },
	{ "header reserved @46", HDR, 0, HLT_HDR_RESERVED0, 2, 1, E(RESERVED) },
	{ "header reserved @47", HDR, 0, HLT_HDR_RESERVED0 + 1, 1, 0x80, E(RESERVED) },
	{ "header reserved @80", HDR, 0, HLT_HDR_RESERVED1, 1, 1, E(RESERVED) },
	{ "header reserved @119", HDR, 0, HLT_HDR_CHECKSUM - 1, 1, 0x40, E(RESERVED) },
	{ "page size 0", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 0, E(CORRUPT) },
	{ "page size 2048", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 2048, E(CORRUPT) },
	{ "page size 4097", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 4097, E(CORRUPT) },
	{ "page size 6144", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 6144, E(CORRUPT) },
	{ "page size 8 MiB", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 8 * MIB, E(CORRUPT) },
	{ "page size 2^31", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 1u << 31, E(CORRUPT) },
	{ "page size 8192 > LB", HDR, 0, HLT_HDR_PAGE_SIZE, 4, 8192, E(CORRUPT) },
	{ "mb pages 0", HDR, 0, HLT_HDR_MB_PAGES, 4, 0, E(CORRUPT) },
	{ "mb pages 1025", HDR, 0, HLT_HDR_MB_PAGES, 4, 1025, E(CORRUPT) },
	{ "mb pages 2^32-1", HDR, 0, HLT_HDR_MB_PAGES, 4, UINT32_MAX, E(CORRUPT) },
	{ "mb pages 2: MB > LB", HDR, 0, HLT_HDR_MB_PAGES, 4, 2, E(CORRUPT) },
	{ "lb size 0", HDR, 0, HLT_HDR_LB_SIZE, 4, 0, E(CORRUPT) },
	{ "lb size 2048", HDR, 0, HLT_HDR_LB_SIZE, 4, 2048, E(CORRUPT) },
	{ "lb size 6144", HDR, 0, HLT_HDR_LB_SIZE, 4, 6144, E(CORRUPT) },
	{ "lb size 8 MiB", HDR, 0, HLT_HDR_LB_SIZE, 4, 8 * MIB, E(CORRUPT) },
	{ "lb size 2^31", HDR, 0, HLT_HDR_LB_SIZE, 4, 1u << 31, E(CORRUPT) },
	{ "lb size 8192: LBs overrun the sections", HDR, 0, HLT_HDR_LB_SIZE, 4, 8192, E(CORRUPT) },
	{ "codec 0", HDR, 0, HLT_HDR_CODEC, 1, 0, E(NO_CODEC) },
	{ "codec 5", HDR, 0, HLT_HDR_CODEC, 1, 5, E(NO_CODEC) },
	{ "codec 255", HDR, 0, HLT_HDR_CODEC, 1, 255, E(NO_CODEC) },
	{ "codec none with compressed blocks", HDR, 0, HLT_HDR_CODEC, 1, HALITE_CODEC_NONE,
	  E(CORRUPT) },
	{ "codec level -7 (informational)", HDR, 0, HLT_HDR_CODEC_LEVEL, 1, 0xf9, 0 },
	{ "data offset 0", HDR, 0, HLT_HDR_DATA_OFFSET, 8, 0, E(CORRUPT) },
	{ "data offset 100", HDR, 0, HLT_HDR_DATA_OFFSET, 8, 100, E(CORRUPT) },
	{ "data offset 4097", HDR, 0, HLT_HDR_DATA_OFFSET, 8, 4097, E(CORRUPT) },
	{ "data offset 2^64-4096", HDR, 0, HLT_HDR_DATA_OFFSET, 8, (uint64_t)-4096, E(CORRUPT) },
	/* A valid footer whose directory lies before lb_end (section 4): CORRUPT, not INCOMPLETE. */
	{ "data offset 2^40 (past the file)", HDR, 0, HLT_HDR_DATA_OFFSET, 8, 1ull << 40, E(CORRUPT) },
	{ "header uuid only (footer's differs)", HDR, 0, HLT_HDR_UUID + 3, 1, 0x10, E(INCOMPLETE),
	  P_XOR },
	{ "created_ns (informational)", HDR, 0, HLT_HDR_CREATED, 8, 12345, 0 },

	/* footer */
	{ "footer magic", FTR, 0, 3, 1, 0x20, E(INCOMPLETE), P_XOR },
	{ "footer uuid", FTR, 0, HLT_FTR_UUID + 15, 1, 0x01, E(INCOMPLETE), P_XOR },
	{ "footer reserved", FTR, 0, HLT_FTR_RESERVED, 4, 1, E(RESERVED) },
	{ "footer reserved top byte", FTR, 0, HLT_FTR_RESERVED + 3, 1, 0x80, E(RESERVED) },
	{ "lb_count + 1", FTR, 0, HLT_FTR_LB_COUNT, 8, 1, E(CORRUPT), P_ADD },
	{ "lb_count - 1", FTR, 0, HLT_FTR_LB_COUNT, 8, (uint64_t)-1, E(CORRUPT), P_ADD },
	{ "lb_count 0", FTR, 0, HLT_FTR_LB_COUNT, 8, 0, E(CORRUPT) },
	{ "lb_count 2^40", FTR, 0, HLT_FTR_LB_COUNT, 8, 1ull << 40, E(CORRUPT) },
	{ "lb_count 2^52 (wraps * lb_size)", FTR, 0, HLT_FTR_LB_COUNT, 8, 1ull << 52, E(CORRUPT) },
	{ "lb_count 2^64-1", FTR, 0, HLT_FTR_LB_COUNT, 8, UINT64_MAX, E(CORRUPT) },
	{ "directory offset + 8", FTR, 0, HLT_FTR_DIR_OFFSET, 8, 8, E(CORRUPT), P_ADD },
	{ "directory offset - 32", FTR, 0, HLT_FTR_DIR_OFFSET, 8, (uint64_t)-32, E(CORRUPT), P_ADD },
	{ "directory offset 0", FTR, 0, HLT_FTR_DIR_OFFSET, 8, 0, E(CORRUPT) },
	{ "directory offset 2^64-1", FTR, 0, HLT_FTR_DIR_OFFSET, 8, UINT64_MAX, E(CORRUPT) },
	{ "section count 0", FTR, 0, HLT_FTR_SECTION_COUNT, 4, 0, E(CORRUPT) },
	{ "section count 2", FTR, 0, HLT_FTR_SECTION_COUNT, 4, 2, E(CORRUPT) },
	{ "section count 8", FTR, 0, HLT_FTR_SECTION_COUNT, 4, 8, E(CORRUPT) },
	{ "section count 65", FTR, 0, HLT_FTR_SECTION_COUNT, 4, 65, E(CORRUPT) },
	{ "section count 2^32-1", FTR, 0, HLT_FTR_SECTION_COUNT, 4, UINT32_MAX, E(CORRUPT) },

	/* directory entries */
	{ "dir entry reserved", DIRENT, HALITE_SECTION_MB_MAP, HLT_DIR_RESERVED, 4, 1, E(RESERVED) },
	{ "section offset beyond the file", DIRENT, HALITE_SECTION_METADATA, HLT_DIR_OFFSET, 8,
	  1ull << 32, E(CORRUPT) },
	{ "section offset 2^64-1", DIRENT, HALITE_SECTION_METADATA, HLT_DIR_OFFSET, 8, UINT64_MAX,
	  E(CORRUPT) },
	{ "section offset inside the LBs", DIRENT, HALITE_SECTION_REGIONS, HLT_DIR_OFFSET, 8,
	  (uint64_t)-8, E(CORRUPT), P_ADD },
	{ "section offset 0", DIRENT, HALITE_SECTION_VCPUS, HLT_DIR_OFFSET, 8, 0, E(CORRUPT) },
	{ "section length past the directory", DIRENT, HALITE_SECTION_SAVE_STATS, HLT_DIR_LENGTH, 8,
	  9, E(CORRUPT), P_ADD },
	{ "section length 2^64-1", DIRENT, HALITE_SECTION_REGIONS, HLT_DIR_LENGTH, 8, UINT64_MAX,
	  E(CORRUPT) },
	{ "sections overlap (map 8 bytes early)", DIRENT, HALITE_SECTION_MB_MAP, HLT_DIR_OFFSET, 8,
	  (uint64_t)-8, E(CORRUPT), P_ADD },
	{ "sections overlap (regions 8 longer)", DIRENT, HALITE_SECTION_REGIONS, HLT_DIR_LENGTH, 8,
	  8, E(CORRUPT), P_ADD },
	{ "duplicate type: vcpus -> regions", DIRENT, HALITE_SECTION_VCPUS, HLT_DIR_TYPE, 4,
	  HALITE_SECTION_REGIONS, E(CORRUPT) },
	{ "duplicate type: stats -> metadata", DIRENT, HALITE_SECTION_SAVE_STATS, HLT_DIR_TYPE, 4,
	  HALITE_SECTION_METADATA, E(CORRUPT) },
	{ "missing regions", DIRENT, HALITE_SECTION_REGIONS, HLT_DIR_TYPE, 4, 0x80000077u,
	  E(CORRUPT) },
	{ "missing mb-map", DIRENT, HALITE_SECTION_MB_MAP, HLT_DIR_TYPE, 4, 0x80000077u,
	  E(CORRUPT) },
	{ "missing lb-table", DIRENT, HALITE_SECTION_LB_TABLE, HLT_DIR_TYPE, 4, 0x80000077u,
	  E(CORRUPT) },
	{ "unknown required type 0x7", DIRENT, HALITE_SECTION_DEVICE_STATE, HLT_DIR_TYPE, 4, 0x7,
	  E(UNKNOWN_SECTION) },
	{ "unknown required type 0", DIRENT, HALITE_SECTION_METADATA, HLT_DIR_TYPE, 4, 0,
	  E(UNKNOWN_SECTION) },
	{ "unknown required type 0x7fffffff", DIRENT, HALITE_SECTION_VCPUS, HLT_DIR_TYPE, 4,
	  0x7fffffffu, E(UNKNOWN_SECTION) },
	{ "unknown optional type (device state renamed)", DIRENT, HALITE_SECTION_DEVICE_STATE,
	  HLT_DIR_TYPE, 4, 0x80000077u, 0 },

	/* regions */
	{ "region count 0", SEC, HALITE_SECTION_REGIONS, 0, 4, 0, E(CORRUPT) },
	{ "region count 2 (trailing entry)", SEC, HALITE_SECTION_REGIONS, 0, 4, 2, E(CORRUPT) },
	{ "region count 4", SEC, HALITE_SECTION_REGIONS, 0, 4, 4, E(CORRUPT) },
	{ "region count 2^32-1", SEC, HALITE_SECTION_REGIONS, 0, 4, UINT32_MAX, E(CORRUPT) },
	{ "regions reserved", SEC, HALITE_SECTION_REGIONS, 4, 4, 1, E(RESERVED) },
	{ "region 0 first_mb 1", SEC, HALITE_SECTION_REGIONS, REG0 + HLT_REG_FIRST_MB, 8, 1,
	  E(CORRUPT) },
	{ "region 1 first_mb + 1", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_FIRST_MB, 8, 1,
	  E(CORRUPT), P_ADD },
	{ "region 2 first_mb - 1", SEC, HALITE_SECTION_REGIONS, REG2 + HLT_REG_FIRST_MB, 8,
	  (uint64_t)-1, E(CORRUPT), P_ADD },
	{ "region 1 length 0", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_LENGTH, 8, 0, E(CORRUPT) },
	{ "region 1 length not page aligned", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_LENGTH, 8,
	  1, E(CORRUPT), P_ADD },
	{ "region 1 length + 1 page (map too short)", SEC, HALITE_SECTION_REGIONS,
	  REG1 + HLT_REG_LENGTH, 8, PAGE, E(CORRUPT), P_ADD },
	{ "region 2 length - 1 page (map too long)", SEC, HALITE_SECTION_REGIONS,
	  REG2 + HLT_REG_LENGTH, 8, (uint64_t)-PAGE, E(CORRUPT), P_ADD },
	{ "region 0 length 2^62", SEC, HALITE_SECTION_REGIONS, REG0 + HLT_REG_LENGTH, 8, 1ull << 62,
	  E(CORRUPT) },
	{ "region 0 length 2^64-4096", SEC, HALITE_SECTION_REGIONS, REG0 + HLT_REG_LENGTH, 8,
	  (uint64_t)-4096, E(CORRUPT) },
	{ "region 1 gpa not page aligned", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_GPA, 8, 0x800,
	  E(CORRUPT), P_ADD },
	{ "region 1 name_len 0", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_NAME_LEN, 2, 0,
	  E(CORRUPT) },
	{ "region 1 name_len 300", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_NAME_LEN, 2, 300,
	  E(CORRUPT) },
	{ "region 1 name_len 256", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_NAME_LEN, 2, 256,
	  E(CORRUPT) },
	{ "region 2 name_len 65535", SEC, HALITE_SECTION_REGIONS, REG2 + HLT_REG_NAME_LEN, 2, 65535,
	  E(CORRUPT) },
	{ "region 1 name_len 3 (non-zero padding)", SEC, HALITE_SECTION_REGIONS,
	  REG1 + HLT_REG_NAME_LEN, 2, 3, E(CORRUPT) },
	{ "region 1 name_len 5 (NUL in name)", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_NAME_LEN,
	  2, 5, E(CORRUPT) },
	{ "region 2 name_len 12 (past the section)", SEC, HALITE_SECTION_REGIONS,
	  REG2 + HLT_REG_NAME_LEN, 2, 12, E(CORRUPT) },
	{ "region 1 name has a NUL", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_ENTRY_SIZE + 1, 1, 0,
	  E(CORRUPT) },
	{ "region 1 name padding", SEC, HALITE_SECTION_REGIONS, REG1 + HLT_REG_ENTRY_SIZE + 7, 1, 'x',
	  E(CORRUPT) },
	{ "duplicate region names (ram1 -> ram0)", SEC, HALITE_SECTION_REGIONS,
	  REG1 + HLT_REG_ENTRY_SIZE + 3, 1, '0', E(CORRUPT) },
	{ "region 0 reserved byte 26", SEC, HALITE_SECTION_REGIONS, REG0 + HLT_REG_RESERVED, 1, 1,
	  E(RESERVED) },
	{ "region 2 reserved byte 31", SEC, HALITE_SECTION_REGIONS, REG2 + HLT_REG_RESERVED + 5, 1,
	  0x80, E(RESERVED) },

	/* lb-table (entry 0 is LB 0, entry 1 LB 1, ...) */
	{ "LB 2 seq + 1 (gap)", SEC, HALITE_SECTION_LB_TABLE, 2 * HLT_LBT_ENTRY_SIZE + HLT_LBT_SEQ,
	  4, 1, E(CORRUPT), P_ADD },
	{ "LB 0 seq 1", SEC, HALITE_SECTION_LB_TABLE, HLT_LBT_SEQ, 4, 1, E(CORRUPT) },
	{ "LB 3 seq 2^32-1", SEC, HALITE_SECTION_LB_TABLE, 3 * HLT_LBT_ENTRY_SIZE + HLT_LBT_SEQ, 4,
	  UINT32_MAX, E(CORRUPT) },
	{ "LB 1 used 0", SEC, HALITE_SECTION_LB_TABLE, HLT_LBT_ENTRY_SIZE + HLT_LBT_USED, 4, 0,
	  E(CORRUPT) },
	{ "LB 1 used lb_size + 1", SEC, HALITE_SECTION_LB_TABLE, HLT_LBT_ENTRY_SIZE + HLT_LBT_USED, 4,
	  LB_SIZE + 1, E(CORRUPT) },
	{ "LB 1 used 2^32-1", SEC, HALITE_SECTION_LB_TABLE, HLT_LBT_ENTRY_SIZE + HLT_LBT_USED, 4,
	  UINT32_MAX, E(CORRUPT) },
	{ "LB 0 used - 1", SEC, HALITE_SECTION_LB_TABLE, HLT_LBT_USED, 4, (uint64_t)-1, E(CORRUPT),
	  P_ADD },
	{ "LB 4 mb_count 0", SEC, HALITE_SECTION_LB_TABLE, 4 * HLT_LBT_ENTRY_SIZE + HLT_LBT_MB_COUNT,
	  4, 0, E(CORRUPT) },
	{ "LB 4 mb_count + 1", SEC, HALITE_SECTION_LB_TABLE,
	  4 * HLT_LBT_ENTRY_SIZE + HLT_LBT_MB_COUNT, 4, 1, E(CORRUPT), P_ADD },
	{ "LB 4 mb_count 2^32-1", SEC, HALITE_SECTION_LB_TABLE,
	  4 * HLT_LBT_ENTRY_SIZE + HLT_LBT_MB_COUNT, 4, UINT32_MAX, E(CORRUPT) },

	/* metadata and save-stats */
	{ "metadata value_len 0xffffffff", SEC, HALITE_SECTION_METADATA, KV0 + 4, 4, UINT32_MAX,
	  E(CORRUPT) },
	{ "metadata value_len 1 MiB + 1", SEC, HALITE_SECTION_METADATA, KV1 + 4, 4, MIB + 1,
	  E(CORRUPT) },
	{ "metadata value_len + 8", SEC, HALITE_SECTION_METADATA, KV1 + 4, 4, 8, E(CORRUPT), P_ADD },
	{ "metadata key_len 0", SEC, HALITE_SECTION_METADATA, KV0, 2, 0, E(CORRUPT) },
	{ "metadata key_len 256", SEC, HALITE_SECTION_METADATA, KV0, 2, 256, E(CORRUPT) },
	{ "metadata key_len 65535", SEC, HALITE_SECTION_METADATA, KV1, 2, 65535, E(CORRUPT) },
	{ "metadata entry_count 0 (trailing bytes)", SEC, HALITE_SECTION_METADATA, 0, 4, 0,
	  E(CORRUPT) },
	{ "metadata entry_count + 1", SEC, HALITE_SECTION_METADATA, 0, 4, 1, E(CORRUPT), P_ADD },
	{ "metadata entry_count 65537", SEC, HALITE_SECTION_METADATA, 0, 4, 65537, E(CORRUPT) },
	{ "metadata entry_count 2^32-1", SEC, HALITE_SECTION_METADATA, 0, 4, UINT32_MAX,
	  E(CORRUPT) },
	{ "metadata header reserved", SEC, HALITE_SECTION_METADATA, 4, 4, 1, E(RESERVED) },
	{ "metadata entry reserved", SEC, HALITE_SECTION_METADATA, KV1 + 2, 2, 1, E(RESERVED) },
	{ "metadata duplicate key", SEC, HALITE_SECTION_METADATA, KV1 + HLT_KV_ENTRY_HDR + 3, 1, 'a',
	  E(CORRUPT) },
	{ "metadata NUL in key", SEC, HALITE_SECTION_METADATA, KV1 + HLT_KV_ENTRY_HDR + 1, 1, 0,
	  E(CORRUPT) },
	{ "metadata padding", SEC, HALITE_SECTION_METADATA, KV0 + 23, 1, 1, E(CORRUPT) },
	{ "save-stats value_len 4", SEC, HALITE_SECTION_SAVE_STATS, KV0 + 4, 4, 4, E(CORRUPT) },
	{ "save-stats header reserved", SEC, HALITE_SECTION_SAVE_STATS, 4, 4, 0x100, E(RESERVED) },

	/* vcpus: vcpu_count 2, roots (0, 4, 0x1000), (1, 5, 0x2000) */
	{ "root vcpu >= vcpu_count", SEC, HALITE_SECTION_VCPUS, 8 + 16, 4, 2, E(CORRUPT) },
	{ "root vcpu unknown (accepted)", SEC, HALITE_SECTION_VCPUS, 8 + 16, 4, HALITE_VCPU_UNKNOWN,
	  0 },
	{ "root paging mode 3", SEC, HALITE_SECTION_VCPUS, 8 + 4, 4, 3, E(CORRUPT) },
	{ "root paging mode 6", SEC, HALITE_SECTION_VCPUS, 8 + 16 + 4, 4, 6, E(CORRUPT) },
	{ "vcpu_count 1", SEC, HALITE_SECTION_VCPUS, 0, 4, 1, E(CORRUPT) },
	{ "root_count 3", SEC, HALITE_SECTION_VCPUS, 4, 4, 3, E(CORRUPT) },
	{ "root_count 2^32-1", SEC, HALITE_SECTION_VCPUS, 4, 4, UINT32_MAX, E(CORRUPT) },
};
#pragma GCC diagnostic pop

static void test_semantic_patches(void **state)
{
	for (size_t i = 0; i < HALITE_ARRAY_SIZE(patches); i++)
		run_patch(&patches[i]);
	end_group("re-sealed field corruption", (int)HALITE_ARRAY_SIZE(patches));
}

/* ---- the MB map, entry by entry ---- */

struct mbpick {
	uint64_t untouched, zero, raw, comp, comp2; /* comp2: in the same LB as comp, after it */
};

static uint64_t map_entry(const uint8_t *b, uint64_t m)
{
	return halite_get_le64(b + cu_find(&g.v, HALITE_SECTION_MB_MAP)->off + 8 * m);
}

static void set_map_entry(uint8_t *b, uint64_t m, uint64_t e)
{
	halite_put_le64(b + cu_find(&g.v, HALITE_SECTION_MB_MAP)->off + 8 * m, e);
}

static void pick_mbs(struct mbpick *p)
{
	const unsigned k = 12; /* log2(LB_SIZE) */
	bool have_comp = false;

	memset(p, 0xff, sizeof(*p));
	for (uint64_t m = 0; m < g.mb_count; m++) {
		uint64_t e = map_entry(g.file, m);

		if (e == HALITE_MB_UNTOUCHED && p->untouched == UINT64_MAX)
			p->untouched = m;
		if (e == HALITE_MB_ZERO && p->zero == UINT64_MAX)
			p->zero = m;
		if ((e & 3) == HALITE_MB_STORED && !(e & 4) && p->raw == UINT64_MAX)
			p->raw = m;
	}
	/* Two compressed MBs in one LB, the second right after the first. */
	for (uint64_t a = 0; a < g.mb_count && !have_comp; a++) {
		uint64_t ea = map_entry(g.file, a);

		if ((ea & 7) != (HALITE_MB_STORED | 4))
			continue;
		for (uint64_t b = 0; b < g.mb_count; b++) {
			uint64_t eb = map_entry(g.file, b);
			uint64_t end = ((ea >> 3) & 0xfff) + ((ea >> (3 + k)) & 0xfff) + 1;

			if ((eb & 3) == HALITE_MB_STORED && eb >> (3 + 2 * k) == ea >> (3 + 2 * k) &&
			    ((eb >> 3) & 0xfff) == end) {
				p->comp = a;
				p->comp2 = b;
				have_comp = true;
				break;
			}
		}
	}
	assert_true(p->untouched != UINT64_MAX && p->zero != UINT64_MAX && p->raw != UINT64_MAX);
	assert_true(have_comp);
}

/* Map entry fields with k = 12. */
#define F_OFF(x) ((uint64_t)(x) << 3)
#define F_LEN(x) ((uint64_t)(x) << 15)
#define F_LB(x) ((uint64_t)(x) << 27)
#define M_OFF F_OFF(0xfff)
#define M_LEN F_LEN(0xfff)
#define M_LB (~(uint64_t)0 << 27)

enum mc_kind {
	MC_BITS,     /* (entry & ~clear | set) + add */
	MC_LB_COUNT, /* LB index = lb_count */
	MC_SAME_OFF, /* offset = the compressed MB's offset */
};

struct mapcase {
	const char *name;
	int which;	 /* 0 untouched, 1 zero, 2 raw, 3 compressed, 4 the one after it */
	enum mc_kind kind;
	uint64_t clear, set, add;
	int want;
};

static const struct mapcase mapcases[] = {
	{ "untouched -> state 3", 0, MC_BITS, 0, 3, 0, E(CORRUPT) },
	{ "stored -> state 3", 2, MC_BITS, 3, 3, 0, E(CORRUPT) },
	{ "untouched with bit 2", 0, MC_BITS, 0, 4, 0, E(RESERVED) },
	{ "untouched with bit 63", 0, MC_BITS, 0, 1ull << 63, 0, E(RESERVED) },
	{ "zero with bit 5", 1, MC_BITS, 0, 1u << 5, 0, E(RESERVED) },
	{ "zero with bit 40", 1, MC_BITS, 0, 1ull << 40, 0, E(RESERVED) },
	{ "untouched -> zero (valid)", 0, MC_BITS, 0, HALITE_MB_ZERO, 0, 0 },
	{ "zero -> untouched (valid)", 1, MC_BITS, 3, 0, 0, 0 },
	{ "stored -> untouched (LB mb_count off)", 2, MC_BITS, ~(uint64_t)0, 0, 0, E(CORRUPT) },
	{ "stored -> zero", 3, MC_BITS, ~(uint64_t)0, HALITE_MB_ZERO, 0, E(CORRUPT) },
	{ "LB index = lb_count", 2, MC_LB_COUNT, 0, 0, 0, E(CORRUPT) },
	{ "LB index 2^37-1", 2, MC_BITS, 0, M_LB, 0, E(CORRUPT) },
	{ "raw length - 1", 2, MC_BITS, M_LEN, F_LEN(PAGE - 2), 0, E(CORRUPT) },
	{ "raw -> compressed (length == MB size)", 2, MC_BITS, 0, 4, 0, E(CORRUPT) },
	{ "compressed -> raw", 3, MC_BITS, 4, 0, 0, E(CORRUPT) },
	{ "compressed length 4096 (past used)", 4, MC_BITS, M_LEN, M_LEN, 0, E(CORRUPT) },
	{ "compressed offset 4095", 4, MC_BITS, M_OFF, M_OFF, 0, E(CORRUPT) },
	{ "two MBs at one offset", 4, MC_SAME_OFF, 0, 0, 0, E(CORRUPT) },
	{ "compressed length + 1 (overlap)", 3, MC_BITS, 0, 0, F_LEN(1), E(CORRUPT) },
	{ "compressed length - 1 (gap)", 3, MC_BITS, 0, 0, -F_LEN(1), E(CORRUPT) },
	{ "next MB's offset + 1 (gap)", 4, MC_BITS, 0, 0, F_OFF(1), E(CORRUPT) },
};

static void test_mb_map(void **state)
{
	struct mbpick p;
	int n = 0;

	pick_mbs(&p);
	for (size_t i = 0; i < HALITE_ARRAY_SIZE(mapcases); i++) {
		const struct mapcase *c = &mapcases[i];
		const uint64_t mbs[] = { p.untouched, p.zero, p.raw, p.comp, p.comp2 };
		uint64_t m = mbs[c->which], e = map_entry(g.file, m), ne;
		uint8_t *b = malloc(g.len);

		switch (c->kind) {
		case MC_BITS:
			ne = ((e & ~c->clear) | c->set) + c->add;
			break;
		case MC_LB_COUNT:
			ne = (e & ~M_LB) | F_LB(g.lb_count);
			break;
		default:
			ne = (e & ~M_OFF) | (map_entry(g.file, p.comp) & M_OFF);
			break;
		}
		memcpy(b, g.file, g.len);
		set_map_entry(b, m, ne);
		cu_reseal(b, g.len, 0);
		{
			char what[160];

			snprintf(what, sizeof(what), "mb-map: %s (MB %llu: %016llx -> %016llx)", c->name,
				 (unsigned long long)m, (unsigned long long)e, (unsigned long long)ne);
			try_bytes(b, g.len, c->want, what);
		}
		free(b);
		n++;
	}
	/* Whole-section lengths: one entry more or less than mb_count. */
	for (int d = -1; d <= 1; d += 2) {
		struct cu_model m;
		struct cu_msec *s;
		uint8_t *b;
		size_t len;

		cu_model_copy(&m, &g.model);
		s = cu_msec(&m, HALITE_SECTION_MB_MAP);
		s->data = realloc(s->data, s->len + 8);
		memset(s->data + s->len, 0, 8);
		s->len = (size_t)((int64_t)s->len + 8 * d);
		b = cu_build(&m, &len);
		try_bytes(b, len, E(CORRUPT), d < 0 ? "mb-map one entry short" : "mb-map one entry long");
		free(b);
		cu_model_free(&m);
		n++;
	}
	end_group("mb-map", n);
}

/* ---- rebuilt files: sections added, resized, reordered ---- */

static void try_model(struct cu_model *m, int want, const char *name)
{
	size_t len;
	uint8_t *b = cu_build(m, &len);

	try_bytes(b, len, want, name);
	free(b);
}

/* A regions section for @n regions named by @names (region i's data as in the base). */
static void set_regions(struct cu_model *m, const char *const *names, uint32_t n)
{
	uint8_t buf[8192] = { 0 };
	uint64_t pos = HLT_REG_HDR_SIZE, first = 0;

	halite_put_le32(buf, n);
	for (uint32_t i = 0; i < n; i++) {
		size_t nl = strlen(names[i]);

		halite_put_le64(buf + pos + HLT_REG_GPA, base_regions[i].gpa);
		halite_put_le64(buf + pos + HLT_REG_LENGTH, base_regions[i].length);
		halite_put_le64(buf + pos + HLT_REG_FIRST_MB, first);
		halite_put_le16(buf + pos + HLT_REG_NAME_LEN, (uint16_t)nl);
		memcpy(buf + pos + HLT_REG_ENTRY_SIZE, names[i], nl);
		first += base_regions[i].length / PAGE;
		pos += HLT_REG_ENTRY_SIZE + hlt_pad8(nl);
	}
	cu_set_section(m, HALITE_SECTION_REGIONS, buf, pos);
}

static void test_rebuilt(void **state)
{
	char name255[256], name256[257];
	struct cu_model m;
	int n = 0;

	memset(name255, 'n', 255);
	name255[255] = 0;
	memset(name256, 'n', 256);
	name256[256] = 0;

#define CASE(label, want, ...)                                \
	do {                                                  \
		cu_model_copy(&m, &g.model);                  \
		__VA_ARGS__;                                  \
		try_model(&m, want, label);                   \
		cu_model_free(&m);                            \
		n++;                                          \
	} while (0)

	CASE("unknown optional section 0x80000077 added", 0,
	     cu_set_section(&m, 0x80000077u, "opaque", 6));
	CASE("unknown optional empty section added", 0, cu_set_section(&m, 0xfffffffeu, "", 0));
	CASE("unknown required section 0x7 added", E(UNKNOWN_SECTION),
	     cu_set_section(&m, 0x7, "opaque", 6));
	CASE("sections reversed, with gaps", 0, {
		for (uint32_t i = 0; i < m.nsec / 2; i++) {
			struct cu_msec t = m.sec[i];

			m.sec[i] = m.sec[m.nsec - 1 - i];
			m.sec[m.nsec - 1 - i] = t;
		}
		for (uint32_t i = 0; i < m.nsec; i++)
			m.sec[i].gap = 8 * i + 3;
	});
	CASE("optional sections removed", 0, {
		cu_del_section(&m, HALITE_SECTION_VCPUS);
		cu_del_section(&m, HALITE_SECTION_DEVICE_STATE);
		cu_del_section(&m, HALITE_SECTION_METADATA);
		cu_del_section(&m, HALITE_SECTION_SAVE_STATS);
	});
	CASE("regions removed", E(CORRUPT),
	     cu_del_section(&m, HALITE_SECTION_REGIONS));
	CASE("mb-map removed", E(CORRUPT), {
		cu_del_section(&m, HALITE_SECTION_MB_MAP);
		cu_set_section(&m, 0x80000077u, "x", 1); /* keep 7 sections */
	});
	CASE("lb-table removed", E(CORRUPT), {
		cu_del_section(&m, HALITE_SECTION_LB_TABLE);
		cu_set_section(&m, 0x80000077u, "x", 1);
	});
	CASE("65 sections", E(CORRUPT), {
		for (uint32_t t = 0; m.nsec < 65; t++)
			cu_set_section(&m, 0x80000100u + t, "x", 1);
	});
	CASE("64 sections (the limit)", 0, {
		for (uint32_t t = 0; m.nsec < 64; t++)
			cu_set_section(&m, 0x80000100u + t, "x", 1);
	});
	CASE("directory entry reserved (rebuilt)", E(RESERVED),
	     cu_msec(&m, HALITE_SECTION_SAVE_STATS)->reserved = 0x80000000u);
	CASE("device state empty", 0, cu_set_section(&m, HALITE_SECTION_DEVICE_STATE, "", 0));
	CASE("metadata empty section", E(CORRUPT), cu_set_section(&m, HALITE_SECTION_METADATA, "", 0));
	CASE("metadata 7-byte section", E(CORRUPT),
	     cu_set_section(&m, HALITE_SECTION_METADATA, "\0\0\0\0\0\0\0", 7));
	CASE("metadata with no entries", 0,
	     cu_set_section(&m, HALITE_SECTION_METADATA, "\0\0\0\0\0\0\0\0", 8));
	CASE("vcpus 7-byte section", E(CORRUPT),
	     cu_set_section(&m, HALITE_SECTION_VCPUS, "\2\0\0\0\0\0\0", 7));
	CASE("vcpus with no roots", 0,
	     cu_set_section(&m, HALITE_SECTION_VCPUS, "\2\0\0\0\0\0\0\0", 8));
	CASE("vcpus root truncated", E(CORRUPT), {
		struct cu_msec *s = cu_msec(&m, HALITE_SECTION_VCPUS);

		s->len -= 8;
	});
	CASE("regions 7-byte section", E(CORRUPT),
	     cu_set_section(&m, HALITE_SECTION_REGIONS, "\1\0\0\0\0\0\0", 7));
	CASE("regions section cut inside an entry", E(CORRUPT),
	     cu_msec(&m, HALITE_SECTION_REGIONS)->len -= 12);
	CASE("region name of 255 bytes (the limit)", 0, {
		const char *names[NREG] = { "ram0", name255, "rom0" };

		set_regions(&m, names, NREG);
	});
	CASE("region name of 256 bytes", E(CORRUPT), {
		const char *names[NREG] = { "ram0", name256, "rom0" };

		set_regions(&m, names, NREG);
	});
	CASE("region names differ only after byte 4", 0, {
		const char *names[NREG] = { "ram0", "ram0x", "ram0xy" };

		set_regions(&m, names, NREG);
	});
	CASE("duplicate region names (rebuilt)", E(CORRUPT), {
		const char *names[NREG] = { "pc.ram", "rom", "pc.ram" };

		set_regions(&m, names, NREG);
	});
	CASE("lb-table length not a multiple of 24", E(CORRUPT),
	     cu_msec(&m, HALITE_SECTION_LB_TABLE)->len -= 1);
	CASE("lb-table one entry short", E(CORRUPT),
	     cu_msec(&m, HALITE_SECTION_LB_TABLE)->len -= HLT_LBT_ENTRY_SIZE);
	CASE("lb-table empty", E(CORRUPT), cu_msec(&m, HALITE_SECTION_LB_TABLE)->len = 0);
	CASE("metadata section with a trailing byte", E(CORRUPT), {
		struct cu_msec *s = cu_msec(&m, HALITE_SECTION_METADATA);

		s->data = realloc(s->data, s->len + 1);
		s->data[s->len++] = 0;
	});
	CASE("metadata value 1 MiB (the limit)", 0, {
		size_t len = 8 + hlt_pad8(8 + 3 + MIB);
		uint8_t *kv = calloc(1, len);

		halite_put_le32(kv, 1);
		halite_put_le16(kv + 8, 3);
		halite_put_le32(kv + 12, (uint32_t)MIB);
		memcpy(kv + 16, "big", 3);
		cu_set_section(&m, HALITE_SECTION_METADATA, kv, len);
		free(kv);
	});
	CASE("save-stats entry_count 2^16 + 1 in a small section", E(CORRUPT), {
		struct cu_msec *s = cu_msec(&m, HALITE_SECTION_SAVE_STATS);

		halite_put_le32(s->data, HLT_MAX_KV + 1);
	});
#undef CASE
	end_group("rebuilt files", n);
}

/* ---- data-level damage behind valid checksums ---- */

static void test_data(void **state)
{
	struct mbpick p;
	struct halite_mb_loc loc;
	struct halite_reader *r;
	char err[512];
	uint8_t *b, *lb;
	uint8_t out[PAGE];
	int n = 0, ret;

	pick_mbs(&p);

	/* A compressed MB's bytes garbled, its LB's checksum re-sealed: CODEC, not a crash. */
	static const uint8_t fills[] = { 0x00, 0xff, 0xa5 };
	for (size_t f = 0; f < HALITE_ARRAY_SIZE(fills); f++) {
		uint64_t e = map_entry(g.file, p.comp);
		uint64_t lbi = e >> 27, off = (e >> 3) & 0xfff, len = ((e >> 15) & 0xfff) + 1;

		b = malloc(g.len);
		memcpy(b, g.file, g.len);
		memset(b + g.v.data_offset + lbi * LB_SIZE + off, fills[f], len);
		cu_reseal(b, g.len, CU_RESEAL_LBS);
		write_work(b, g.len);
		free(b);
		ret = open_work(&r, err, sizeof(err));
		judge(ret, 0, err, "garbled MB: open");
		if (ret)
			continue;
		lb = halite_reader_alloc_lb(r);
		judge(halite_reader_read_lb(r, lbi, lb), 0, halite_reader_errmsg(r),
		      "garbled MB: read LB");
		judge(halite_reader_decode_mb(r, p.comp, lb, out), E(CODEC), halite_reader_errmsg(r),
		      "compressed MB %llu filled with 0x%02x", (unsigned long long)p.comp, fills[f]);
		judge(halite_reader_decode_mb(r, p.comp2, lb, out), 0, halite_reader_errmsg(r),
		      "its neighbour MB %llu", (unsigned long long)p.comp2);
		judge(halite_reader_read_mb(r, p.comp, out), E(CODEC), halite_reader_errmsg(r),
		      "read_mb of the garbled MB");
		halite_reader_free_lb(lb);
		halite_reader_free(r);
		n += 4;
	}

	/* The header names another valid codec: opens, every compressed MB fails to decode. */
	for (int codec = HALITE_CODEC_ZLIB; codec <= HALITE_CODEC_ZSTD; codec++) {
		b = malloc(g.len);
		memcpy(b, g.file, g.len);
		b[HLT_HDR_CODEC] = (uint8_t)codec;
		cu_reseal(b, g.len, 0);
		write_work(b, g.len);
		free(b);
		ret = open_work(&r, err, sizeof(err));
		judge(ret, 0, err, "codec lz4 -> %s: open", halite_codec_name(codec));
		if (ret)
			continue;
		for (uint64_t m = 0; m < g.mb_count; m++) {
			assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
			judge(halite_reader_read_mb(r, m, out),
			      loc.state == HALITE_MB_STORED && loc.compressed ? E(CODEC) : 0,
			      halite_reader_errmsg(r), "codec lz4 -> %s: MB %llu",
			      halite_codec_name(codec), (unsigned long long)m);
			n++;
		}
		halite_reader_free(r);
	}

	/* A new uuid in header and footer (a block from "another file"): every LB fails. */
	{
		struct cu_model m;
		size_t len;

		cu_model_copy(&m, &g.model);
		m.head[HLT_HDR_UUID] ^= 1;
		b = cu_build(&m, &len);
		cu_model_free(&m);
		write_work(b, len);
		free(b);
		ret = open_work(&r, err, sizeof(err));
		judge(ret, 0, err, "new uuid: open");
		if (!ret) {
			lb = halite_reader_alloc_lb(r);
			for (uint64_t i = 0; i < g.lb_count; i++) {
				judge(halite_reader_read_lb(r, i, lb), E(LB_CHECKSUM),
				      halite_reader_errmsg(r), "new uuid: LB %llu", (unsigned long long)i);
				n++;
			}
			halite_reader_free_lb(lb);
			halite_reader_free(r);
		}
	}

	/* An lb-table checksum changed and re-sealed: only that LB fails. */
	{
		uint8_t *c = malloc(g.len);

		memcpy(c, g.file, g.len);
		c[cu_find(&g.v, HALITE_SECTION_LB_TABLE)->off + 5 * HLT_LBT_ENTRY_SIZE +
		  HLT_LBT_CHECKSUM] ^= 0x10;
		cu_reseal(c, g.len, 0);
		write_work(c, g.len);
		free(c);
		check_lbs("LB 5 checksum in the lb-table", 5);
		n++;
	}

	/* Every LB of one stream moved to a reserved stream kind: readers accept it. */
	{
		uint8_t *c = malloc(g.len);
		const struct cu_sec *t = cu_find(&g.v, HALITE_SECTION_LB_TABLE);
		uint32_t moved = 0;

		memcpy(c, g.file, g.len);
		for (uint64_t i = 0; i < g.lb_count; i++) {
			uint8_t *e = c + t->off + i * HLT_LBT_ENTRY_SIZE + HLT_LBT_STREAM;

			if (halite_get_le32(e) == base_streams[2]) {
				halite_put_le32(e, HALITE_STREAM(9, 7));
				moved++;
			}
		}
		assert_true(moved > 0);
		cu_reseal(c, g.len, 0);
		write_work(c, g.len);
		free(c);
		check_lbs("stream kind 9", -1);
		n++;
	}
	end_group("data behind valid checksums", n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_flip_header),
		cmocka_unit_test(test_flip_footer),
		cmocka_unit_test(test_flip_directory),
		cmocka_unit_test(test_flip_sections),
		cmocka_unit_test(test_flip_lbs),
		cmocka_unit_test(test_truncate),
		cmocka_unit_test(test_semantic_patches),
		cmocka_unit_test(test_mb_map),
		cmocka_unit_test(test_rebuilt),
		cmocka_unit_test(test_data),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
