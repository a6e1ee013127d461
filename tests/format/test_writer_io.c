/* SPDX-License-Identifier: MIT */
/*
 * The writer's asynchronous locality-block writes. The same puts, written
 * through every I/O backend (io_uring, libaio, pwrite; a backend the kernel
 * refuses is skipped with a message) at queue depths 1 and 32, buffered and
 * with O_DIRECT, give files that decode to the same memory and have the same
 * LB tables and LB bytes (checksums differ: they are seeded with each file's
 * uuid). An injected ENOSPC or EIO on an LB write fails the put or finish that
 * collects it with exactly that code, names the LB, and leaves (kept, as
 * PATH.incomplete) a file every reader refuses as incomplete, with nothing
 * written after the failure, and nothing at PATH. A
 * real failure from the kernel (EFBIG past RLIMIT_FSIZE, where later writes
 * can fail before the first one does) is reported the same way, for the
 * first failed LB in file order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/errors.h>
#include <halite/format.h>

#include "layout.h"
#include "test_util.h"
#include "writer_test.h"

#define LB_SIZE 16384u
#define MEM_LEN (4u << 20)
#define NSTREAMS 3

static uint64_t g_seed;

static const int backends[] = {
	HALITE_IO_BACKEND_DEFAULT,
	HALITE_IO_BACKEND_URING,
	HALITE_IO_BACKEND_AIO,
	HALITE_IO_BACKEND_PSYNC,
};
static const char *const backend_names[] = { "default", "io_uring", "libaio", "psync" };
static const unsigned depths[] = { 1, 32 };

/* What to put, decided once from the seed: every configuration replays it. */
enum { P_UNTOUCHED, P_ZERO, P_STORED };
struct plan {
	uint8_t *mem;
	uint64_t nmb;
	uint32_t mb_size;
	uint64_t *order; /* MBs in put order */
	uint8_t *kind;	 /* per MB */
	uint8_t *stream; /* per MB */
};

struct config {
	int backend;
	unsigned qd;
	bool direct;
};

static struct plan g_plan;
static bool g_refused[4];     /* per backend: the kernel says no */
static int g_direct = -1;     /* -1 unknown, 0 the file system refuses O_DIRECT, 1 ok */

static const struct halite_region g_region = { .name = "pc.ram", .gpa = 0, .length = MEM_LEN };

static uint32_t stream_id(unsigned i)
{
	return i == NSTREAMS - 1 ? HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0)
				 : HALITE_STREAM(HALITE_STREAM_VCPU, i);
}

static char *tmp_path(const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", t_tmpdir(), name) > 0);
	return p;
}

static void make_plan(struct plan *p, uint64_t seed)
{
	p->mb_size = HALITE_DEFAULT_PAGE_SIZE * HALITE_DEFAULT_MB_PAGES;
	p->nmb = MEM_LEN / p->mb_size;
	p->mem = calloc(1, MEM_LEN);
	p->order = malloc(p->nmb * sizeof(*p->order));
	p->kind = malloc(p->nmb);
	p->stream = malloc(p->nmb);
	assert_non_null(p->mem);
	assert_non_null(p->order);
	assert_non_null(p->kind);
	assert_non_null(p->stream);
	for (uint64_t i = 0; i < p->nmb; i++)
		p->order[i] = i;
	for (uint64_t i = p->nmb - 1; i > 0; i--) {
		uint64_t j = t_rand(&seed) % (i + 1), t = p->order[i];

		p->order[i] = p->order[j];
		p->order[j] = t;
	}
	for (uint64_t m = 0; m < p->nmb; m++) {
		unsigned k = (unsigned)(t_rand(&seed) % 8);

		p->stream[m] = (uint8_t)(t_rand(&seed) % NSTREAMS);
		p->kind[m] = k == 0 ? P_UNTOUCHED : k == 1 ? P_ZERO : P_STORED;
		/* Mostly incompressible: one to three MBs per LB, many LBs. */
		if (p->kind[m] == P_STORED)
			t_fill(p->mem + m * p->mb_size, p->mb_size,
			       40 + (unsigned)(t_rand(&seed) % 61), &seed);
	}
}

static void free_plan(struct plan *p)
{
	free(p->mem);
	free(p->order);
	free(p->kind);
	free(p->stream);
}

/* Create a writer; NULL (after saying why) when the kernel refuses the configuration. */
static struct halite_writer *create(const char *path, const struct config *c)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	int ret;

	o.lb_size = LB_SIZE;
	o.flags = HALITE_WRITER_NO_SYNC | (c->direct ? HALITE_WRITER_DIRECT : 0);
	o.io_backend = c->backend;
	o.queue_depth = c->qd;
	ret = halite_writer_create(&w, path, &g_region, 1, &o);
	if (ret == -HALITE_E_UNSUPPORTED) {
		fprintf(stderr, "# %s%s refused here (%s): skipped\n", backend_names[c->backend],
			c->direct ? " with O_DIRECT" : "", halite_strerror(ret));
		return NULL;
	}
	assert_int_equal(ret, 0);
	if (c->backend != HALITE_IO_BACKEND_DEFAULT) {
		assert_int_equal(halite_writer_test_io_backend(w), c->backend);
	} else {
		static bool said;
		int b = halite_writer_test_io_backend(w);

		assert_true(b >= HALITE_IO_BACKEND_URING && b <= HALITE_IO_BACKEND_PSYNC);
		if (!said)
			fprintf(stderr, "# the default backend here: %s\n", backend_names[b]);
		said = true;
	}
	return w;
}

/*
 * Put the plan; flush stream 1 halfway (a flush waits for every write in
 * flight). Returns 0 or the first failure.
 */
static int put_plan(struct halite_writer *w, const struct plan *p)
{
	for (uint64_t i = 0; i < p->nmb; i++) {
		uint64_t m = p->order[i];
		int ret = 0;

		switch (p->kind[m]) {
		case P_UNTOUCHED:
			break;
		case P_ZERO:
			ret = halite_writer_put_zero(w, m);
			break;
		default:
			ret = halite_writer_put(w, stream_id(p->stream[m]), m,
						p->mem + m * p->mb_size);
			break;
		}
		if (!ret && i == p->nmb / 2)
			ret = halite_writer_flush_stream(w, stream_id(1));
		if (ret)
			return ret;
	}
	return 0;
}

/* Write the plan with @c into @path: false if the kernel refuses @c. */
static bool write_plan(const char *path, const struct config *c)
{
	struct halite_writer *w = create(path, c);

	if (!w)
		return false;
	assert_int_equal(put_plan(w, &g_plan), 0);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
	return true;
}

static struct halite_reader *open_reader(const char *path)
{
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_reader *r;
	char errbuf[256] = "";
	int ret;

	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	ret = halite_reader_open(&r, path, &ro);
	if (ret)
		fail_msg("%s: %s (%s)", path, halite_strerror(ret), errbuf);
	return r;
}

/* Every MB of @path decodes to the plan's memory. */
static void check_memory(struct halite_reader *r)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	uint8_t *out = malloc(g_plan.mb_size);
	uint64_t stored = 0, zero = 0;

	assert_int_equal(fi->mb_count, g_plan.nmb);
	for (uint64_t m = 0; m < g_plan.nmb; m++) {
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
		switch (g_plan.kind[m]) {
		case P_UNTOUCHED:
			assert_int_equal(loc.state, HALITE_MB_UNTOUCHED);
			break;
		case P_ZERO:
			assert_int_equal(loc.state, HALITE_MB_ZERO);
			zero++;
			break;
		default:
			assert_int_equal(loc.state, HALITE_MB_STORED);
			stored++;
			break;
		}
		assert_int_equal(halite_reader_read_mb(r, m, out), 0);
		assert_memory_equal(out, g_plan.mem + m * g_plan.mb_size, g_plan.mb_size);
	}
	assert_int_equal(fi->mb_stored, stored);
	assert_int_equal(fi->mb_zero, zero);
	free(out);
}

/* Same LB table (but for the seeded checksums), same LB bytes, same MB map. */
static void check_same(struct halite_reader *a, struct halite_reader *b)
{
	const struct halite_file_info *fa = halite_reader_info(a), *fb = halite_reader_info(b);
	void *la = halite_reader_alloc_lb(a), *lb = halite_reader_alloc_lb(b);

	assert_int_equal(fa->lb_count, fb->lb_count);
	assert_int_equal(fa->file_size, fb->file_size);
	for (uint64_t i = 0; i < fa->lb_count; i++) {
		struct halite_lb_info ia, ib;
		const uint64_t *ma, *mb;
		uint32_t na, nb;

		assert_int_equal(halite_reader_lb_info(a, i, &ia), 0);
		assert_int_equal(halite_reader_lb_info(b, i, &ib), 0);
		assert_int_equal(ia.stream, ib.stream);
		assert_int_equal(ia.seq, ib.seq);
		assert_int_equal(ia.used, ib.used);
		assert_int_equal(ia.mb_count, ib.mb_count);
		assert_int_equal(ia.offset, ib.offset);
		assert_int_equal(halite_reader_lb_members(a, i, &ma, &na), 0);
		assert_int_equal(halite_reader_lb_members(b, i, &mb, &nb), 0);
		assert_int_equal(na, nb);
		assert_memory_equal(ma, mb, na * sizeof(*ma));
		/* read_lb checks each file's own checksum first. */
		assert_int_equal(halite_reader_read_lb(a, i, la), 0);
		assert_int_equal(halite_reader_read_lb(b, i, lb), 0);
		assert_memory_equal(la, lb, fa->lb_size);
	}
	for (uint64_t m = 0; m < fa->mb_count; m++) {
		struct halite_mb_loc x, y;

		assert_int_equal(halite_reader_mb_lookup(a, m, &x), 0);
		assert_int_equal(halite_reader_mb_lookup(b, m, &y), 0);
		assert_int_equal(x.state, y.state);
		assert_int_equal(x.lb, y.lb);
		assert_int_equal(x.offset, y.offset);
		assert_int_equal(x.length, y.length);
		assert_int_equal(x.compressed, y.compressed);
	}
	halite_reader_free_lb(la);
	halite_reader_free_lb(lb);
}

/* Probe once whether the scratch file system takes O_DIRECT. */
static bool direct_ok(void)
{
	if (g_direct < 0) {
		char *path = tmp_path("direct-probe.hlt");
		struct config c = { HALITE_IO_BACKEND_PSYNC, 1, true };
		struct halite_writer *w = create(path, &c);

		g_direct = w != NULL;
		halite_writer_free(w, true);
		free(path);
	}
	return g_direct;
}

static void test_backends_same_file(void **state)
{
	char *ref_path = tmp_path("ref.hlt"), *path = tmp_path("io.hlt");
	struct config ref = { HALITE_IO_BACKEND_PSYNC, 1, false };
	struct halite_reader *rr;
	unsigned nwritten = 0;

	assert_true(write_plan(ref_path, &ref));
	rr = open_reader(ref_path);
	check_memory(rr);
	fprintf(stderr, "reference (psync, depth 1): %llu LBs of %u bytes\n",
		(unsigned long long)halite_reader_info(rr)->lb_count, LB_SIZE);
	assert_true(halite_reader_info(rr)->lb_count > 64);

	for (size_t bi = 0; bi < sizeof(backends) / sizeof(backends[0]); bi++) {
		for (int direct = 0; direct < 2; direct++) {
			for (size_t qi = 0; qi < sizeof(depths) / sizeof(depths[0]); qi++) {
				struct config c = { backends[bi], depths[qi], direct };
				struct halite_reader *r;

				if (g_refused[c.backend] || (direct && !direct_ok()))
					continue;
				if (!write_plan(path, &c)) {
					/* psync took O_DIRECT: only a backend is refused. */
					assert_false(direct);
					g_refused[c.backend] = true;
					continue;
				}
				fprintf(stderr, "%s, depth %u%s: same as the reference\n",
					backend_names[c.backend], c.qd, direct ? ", O_DIRECT" : "");
				r = open_reader(path);
				check_memory(r);
				check_same(rr, r);
				halite_reader_free(r);
				unlink(path);
				nwritten++;
			}
		}
	}
	assert_true(nwritten >= 2); /* psync at both depths, at least */
	assert_false(g_refused[HALITE_IO_BACKEND_PSYNC]);
	assert_false(g_refused[HALITE_IO_BACKEND_DEFAULT]);
	halite_reader_free(rr);
	unlink(ref_path);
	free(ref_path);
	free(path);
}

/*
 * Fail LB writes with @err once @after_lbs LBs have been written. The failure
 * comes back with exactly -@err, naming LB @after_lbs, from the put (or the
 * flush) that seals the next LB, or from finish when @at_finish (the last LB,
 * sealed by finish); the file ends after the LBs written before it and no
 * reader takes it.
 */
static void fail_case(const struct config *c, int err, uint64_t after_lbs, bool at_finish)
{
	char *path = tmp_path("fail.hlt"), *kept = tmp_path("fail.hlt.incomplete");
	struct halite_writer *w = create(path, c);
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_reader *r = NULL;
	char want[128], errbuf[256] = "";
	struct stat st;
	int ret;

	if (!w) {
		free(kept);
		free(path);
		return;
	}
	/* Half an LB more: the budget runs out inside LB after_lbs. */
	halite_writer_test_fail_writes(w, after_lbs * LB_SIZE + LB_SIZE / 2, err);
	ret = put_plan(w, &g_plan);
	if (at_finish) {
		assert_int_equal(ret, 0);
		ret = halite_writer_finish(w);
	}
	assert_int_equal(ret, -err);
	snprintf(want, sizeof(want), "writing locality block %llu at offset %llu",
		 (unsigned long long)after_lbs,
		 (unsigned long long)(HLT_DATA_OFFSET + after_lbs * LB_SIZE));
	if (!strstr(halite_writer_errmsg(w), want))
		fail_msg("errmsg '%s' lacks '%s'", halite_writer_errmsg(w), want);
	fprintf(stderr, "%s, depth %u%s, %s after %llu LBs: %s from %s\n",
		backend_names[c->backend], c->qd, c->direct ? ", O_DIRECT" : "", strerror(err),
		(unsigned long long)after_lbs, halite_strerror(ret),
		at_finish ? "finish" : "a put");
	/* The writer is failed: nothing more reaches the file. */
	assert_int_equal(halite_writer_put_zero(w, g_plan.nmb - 1), -HALITE_E_STATE);
	assert_int_equal(halite_writer_flush_stream(w, stream_id(0)), -HALITE_E_STATE);
	assert_int_equal(halite_writer_finish(w), -HALITE_E_STATE);
	halite_writer_free(w, false);

	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(stat(kept, &st), 0);
	assert_int_equal((uint64_t)st.st_size, HLT_DATA_OFFSET + after_lbs * LB_SIZE);
	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	assert_int_equal(halite_reader_open(&r, kept, &ro), -HALITE_E_INCOMPLETE);
	assert_null(r);
	unlink(kept);
	free(kept);
	free(path);
}

static void test_write_failure(void **state)
{
	static const int errs[] = { EIO, ENOSPC };
	char *ref_path = tmp_path("fail-ref.hlt");
	struct config ref = { HALITE_IO_BACKEND_PSYNC, 1, false };
	struct halite_reader *rr;
	uint64_t lb_count;

	assert_true(write_plan(ref_path, &ref));
	rr = open_reader(ref_path);
	lb_count = halite_reader_info(rr)->lb_count;
	halite_reader_free(rr);
	unlink(ref_path);
	free(ref_path);

	for (size_t bi = 0; bi < sizeof(backends) / sizeof(backends[0]); bi++) {
		for (size_t qi = 0; qi < sizeof(depths) / sizeof(depths[0]); qi++) {
			for (size_t ei = 0; ei < sizeof(errs) / sizeof(errs[0]); ei++) {
				struct config c = { backends[bi], depths[qi], false };

				if (g_refused[c.backend])
					continue;
				/* Early: a put collects it. Last LB: finish does. */
				fail_case(&c, errs[ei], 5, false);
				fail_case(&c, errs[ei], lb_count - 1, true);
			}
		}
		if (direct_ok() && !g_refused[backends[bi]]) {
			struct config c = { backends[bi], 32, true };

			fail_case(&c, ENOSPC, 7, false);
			fail_case(&c, EIO, lb_count - 1, true);
		}
	}
}

/*
 * The kernel fails the writes: the file may not grow past the middle of LB 5.
 * LB 5 is written short and its remainder fails, later LBs fail at once
 * (with io_uring and libaio they can complete first): the error reported is
 * LB 5's, as a synchronous writer would have hit it.
 */
static void test_kernel_efbig(void **state)
{
	const uint64_t limit = HLT_DATA_OFFSET + 5 * LB_SIZE + LB_SIZE / 2;
	struct rlimit old, rl;
	char want[128];

	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	if (old.rlim_max != RLIM_INFINITY && old.rlim_max < limit)
		skip();
	signal(SIGXFSZ, SIG_IGN);
	snprintf(want, sizeof(want), "writing locality block 5 at offset %llu",
		 (unsigned long long)(HLT_DATA_OFFSET + 5 * LB_SIZE));
	for (size_t bi = 0; bi < sizeof(backends) / sizeof(backends[0]); bi++) {
		for (size_t qi = 0; qi < sizeof(depths) / sizeof(depths[0]); qi++) {
			struct config c = { backends[bi], depths[qi], false };
			char *path = tmp_path("efbig.hlt"), *kept = tmp_path("efbig.hlt.incomplete");
			struct halite_writer *w;
			struct stat st;
			int ret;

			if (g_refused[c.backend] || !(w = create(path, &c))) {
				free(kept);
				free(path);
				continue;
			}
			rl = (struct rlimit){ limit, old.rlim_max };
			assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
			ret = put_plan(w, &g_plan);
			if (!ret)
				ret = halite_writer_finish(w);
			assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
			assert_int_equal(ret, -EFBIG);
			if (!strstr(halite_writer_errmsg(w), want))
				fail_msg("%s, depth %u: errmsg '%s' lacks '%s'",
					 backend_names[c.backend], c.qd, halite_writer_errmsg(w),
					 want);
			halite_writer_free(w, false);
			assert_int_equal(access(path, F_OK), -1);
			assert_int_equal(stat(kept, &st), 0);
			assert_int_equal((uint64_t)st.st_size, limit);
			unlink(kept);
			free(kept);
			free(path);
		}
	}
	signal(SIGXFSZ, SIG_DFL);
}

static void test_bad_io_options(void **state)
{
	char *path = tmp_path("opts.hlt");
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = (void *)0x1;

	o.io_backend = 4;
	assert_int_equal(halite_writer_create(&w, path, &g_region, 1, &o), -EINVAL);
	o.io_backend = -1;
	assert_int_equal(halite_writer_create(&w, path, &g_region, 1, &o), -EINVAL);
	o.io_backend = HALITE_IO_BACKEND_PSYNC;
	o.queue_depth = HALITE_WRITER_MAX_QUEUE_DEPTH + 1;
	assert_int_equal(halite_writer_create(&w, path, &g_region, 1, &o), -EINVAL);
	assert_ptr_equal(w, (void *)0x1);
	o.queue_depth = HALITE_WRITER_MAX_QUEUE_DEPTH;
	o.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, path, &g_region, 1, &o), 0);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
	unlink(path);
	free(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backends_same_file),
		cmocka_unit_test(test_write_failure),
		cmocka_unit_test(test_kernel_efbig),
		cmocka_unit_test(test_bad_io_options),
	};
	int ret;

	g_seed = t_seed("test_writer_io");
	make_plan(&g_plan, g_seed);
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	free_plan(&g_plan);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
