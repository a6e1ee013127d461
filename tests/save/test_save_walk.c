/* SPDX-License-Identifier: MIT */
/*
 * The save engine on the synthetic guest (testing/synth/synth.h): real x86-64 page
 * tables in guest memory, physical frames allocated with the paper's 16-page
 * stride, vCPUs that translate every access through those tables. Checked:
 * - exact content against a copy taken at the snapshot instant;
 * - the guest-virtual stream exists and follows page-table order: its blocks
 *   appear in the order a walk of the snapshot's page tables meets them,
 *   those the walk saved first, then those it deferred (halite/save/defer.c: next
 *   to a block a vCPU's fault took) and no vCPU took since, no more of them
 *   than it deferred;
 * - every block some page table maps was saved by a fault or by the walk,
 *   none by the physical sweep, which only gets what no page table maps;
 * - the vCPU streams hold only blocks of their own vCPU's pages or tables;
 * in this process (anonymous and memfd memory) and from outside, with the
 * guest in a child process. In this process the test also clears one of the
 * guest's leaf page tables right after the snapshot instant: the walk must
 * still follow the tables as they were (else the pages that table mapped
 * would fall to the physical sweep).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "ptwalk.h"
#include "save_test.h"
#include "synth.h"
#include "test_reader_util.h"
#include "test_util.h"
#include "uffd.h"

#define MB_SIZE 8192u
#define NVCPU 2

static uint64_t g_seed;

enum mode { ANON, SHARED, CHILD };
static const char *const mode_name[] = { "anonymous", "shared", "child" };

struct oracle {
	const uint8_t *snap;
	uint64_t len;
	uint64_t *order; /* MBs in the order the walk meets them, first time only */
	uint8_t *mapped;
	size_t n;
};

static int oracle_read(void *ctx, uint64_t gpa, void *page)
{
	struct oracle *o = ctx;

	if (gpa >= o->len || o->len - gpa < 4096)
		return -ERANGE;
	memcpy(page, o->snap + gpa, 4096);
	return 0;
}

static int oracle_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	struct oracle *o = ctx;

	for (uint64_t g = gpa - gpa % MB_SIZE; g < gpa + len && g < o->len; g += MB_SIZE) {
		uint64_t mb = g / MB_SIZE;

		if (!o->mapped[mb]) {
			o->mapped[mb] = 1;
			o->order[o->n++] = mb;
		}
	}
	return 0;
}

static int drop_ptes(void *ctx, uint64_t addr, uint64_t len)
{
	struct synth_guest *g = ctx;
	struct synth_info info;

	synth_info(g, &info);
	return synth_madvise_dontneed(g, addr - (uintptr_t)info.host_addr, len);
}

/*
 * GPA of the leaf (4 KiB-page) table that maps @va, walking @mem from @cr3;
 * UINT64_MAX if @va is not mapped by 4 KiB pages.
 */
static uint64_t leaf_table(const uint8_t *mem, uint64_t len, uint64_t cr3, unsigned levels,
			   uint64_t va)
{
	uint64_t table = cr3 & 0x000ffffffffff000ull;

	for (unsigned l = levels; l > 1; l--) {
		uint64_t e;

		if (table >= len)
			return UINT64_MAX;
		memcpy(&e, mem + table + ((va >> (12 + 9 * (l - 1))) & 511) * 8, 8);
		if (!(e & 1) || (l <= 3 && (e & 0x80)))
			return UINT64_MAX; /* not present, or a huge page */
		table = e & 0x000ffffffffff000ull;
	}
	return table < len ? table : UINT64_MAX;
}

static size_t stream_mbs(struct halite_reader *r, uint32_t stream, uint64_t *out)
{
	long n = t_stream_mbs(r, stream, out);

	assert_true(n >= 0);
	return (size_t)n;
}

static void run(enum mode mode, unsigned levels)
{
	SYNTH_OPTS(so, .mem_bytes = 64ull << 20, .nvcpus = NVCPU, .stride = 16,
		   .map_bytes = 8ull << 20, .ws_bytes = 1ull << 20, .compress_pct = 50,
		   .zero_pct = 5, .untouched_pct = 20, .write_pct = 50, .pattern = SYNTH_PAT_SEQ,
		   .paging_levels = levels);
	HALITE_OPTS(halite_save_opts, o);
	struct synth_guest *g;
	struct synth_info info;
	struct halite_save *s;
	struct halite_save_region reg;
	struct halite_save_stats st;
	struct halite_save_test_walk walk;
	struct halite_reader *r;
	struct oracle orc = { 0 };
	pid_t tids[NVCPU];
	uint8_t *snap, out[MB_SIZE];
	uint64_t *got, nmb;
	char *path;
	int uffd = -1, ret;

	so.seed = t_rand(&g_seed);
	so.backing = mode == ANON ? SYNTH_MEM_ANON : SYNTH_MEM_SHARED;
	so.flags = mode == CHILD ? SYNTH_F_CHILD : 0;
	assert_int_equal(synth_create(&g, &so), 0);
	assert_int_equal(synth_info(g, &info), 0);
	nmb = info.mem_bytes / MB_SIZE;
	assert_true(asprintf(&path, "%s/walk.hlt", t_tmpdir()) > 0);

	assert_int_equal(synth_start(g), 0);
	usleep(10000);
	assert_int_equal(synth_pause(g), 0);
	snap = malloc(info.mem_bytes);
	assert_int_equal(synth_copy_memory(g, snap), 0);

	reg = (struct halite_save_region){
		.name = SYNTH_REGION_NAME, .gpa = info.gpa_base, .length = info.mem_bytes,
		.host = (uintptr_t)info.host_addr,
		.kind = mode == ANON ? HALITE_MEM_ANON : HALITE_MEM_SHARED, .fd = info.memfd,
	};
	for (unsigned i = 0; i < NVCPU; i++) {
		struct synth_vcpu_info vi;

		assert_int_equal(synth_vcpu_info(g, i, &vi), 0);
		tids[i] = vi.tid;
	}
	o.vcpu_tids = tids;
	o.nvcpus = NVCPU;
	o.flags = HALITE_SAVE_NO_SYNC;
	o.bg_idle_us = 500;
	if (mode != CHILD) {
		/*
		 * The page-table change below must come before the background
		 * can reach that table's block: hold the background back until
		 * the guest has been quiet for 200 ms, with no rate floor.
		 */
		o.bg_idle_us = 200000;
		o.bg_min_rate = 1;
	}
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	if (mode == CHILD) {
		uffd = synth_get_uffd(g);
		assert_true(uffd >= 0);
		o.owner_pid = info.owner_pid;
		o.owner_uffd = uffd;
		o.drop_ptes = drop_ptes;
		o.drop_ctx = g;
	}
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), 0);
	if (uffd >= 0)
		close(uffd);
	for (unsigned i = 0; i < NVCPU; i++) {
		struct synth_vcpu_info vi;
		struct halite_root root;

		assert_int_equal(synth_vcpu_info(g, i, &vi), 0);
		root = (struct halite_root){ i, vi.paging_levels, vi.cr3 };
		assert_int_equal(halite_save_add_root(s, &root), 0);
	}
	ret = halite_save_arm(s);
	assert_int_equal(ret, 0);
	if (mode != CHILD) {
		/*
		 * The guest unmaps vCPU 0's units from 1024 on (outside its working
		 * set) by clearing their leaf table; this thread is not a vCPU, so
		 * that table's block goes to the "other" stream.
		 */
		struct synth_vcpu_info vi;
		uint64_t va, leaf;

		assert_int_equal(synth_vcpu_info(g, 0, &vi), 0);
		assert_true(vi.map_units > 1024 && vi.ws_units < 1024);
		assert_int_equal(synth_vcpu_pages(g, 0, 1024, &va, NULL, 1), 1);
		leaf = leaf_table(snap, info.mem_bytes, vi.cr3, vi.paging_levels, va);
		assert_true(leaf != UINT64_MAX);
		memset((uint8_t *)info.host_addr + leaf, 0, 4096);
	}
	assert_int_equal(synth_resume(g), 0);
	assert_int_equal(halite_save_wait(s, 120000), 0);
	halite_save_stats(s, &st);
	halite_save_test_walk(s, &walk);
	halite_save_free(s);
	assert_int_equal(synth_stop(g), 0);

	/* Content, every block. */
	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	assert_int_equal(halite_reader_info(r)->mb_count, nmb);
	for (uint64_t mb = 0; mb < nmb; mb++) {
		assert_int_equal(halite_reader_read_mb(r, mb, out), 0);
		if (memcmp(out, snap + mb * MB_SIZE, MB_SIZE))
			fail_msg("%s: memory block %llu differs from the snapshot", mode_name[mode],
				 (unsigned long long)mb);
	}

	/* The oracle: walk the snapshot's own page tables, every root in order. */
	orc.snap = snap;
	orc.len = info.mem_bytes;
	orc.order = malloc(nmb * sizeof(uint64_t));
	orc.mapped = calloc(nmb, 1);
	{
		struct halite_ptw *w;

		assert_int_equal(halite_ptw_create(&w, info.mem_bytes), 0);
		for (unsigned i = 0; i < NVCPU; i++) {
			struct synth_vcpu_info vi;

			synth_vcpu_info(g, i, &vi);
			assert_true(halite_ptw_walk(w, vi.cr3, vi.paging_levels, oracle_read,
						    oracle_visit, &orc) >= 0);
		}
		halite_ptw_free(w);
	}
	assert_true(orc.n > 0);

	/* The virtual stream: non-empty, in walk order, then the deferred in walk order. */
	got = malloc(nmb * sizeof(uint64_t));
	{
		size_t n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0), got), k = 0;
		size_t split = 0; /* where the deferred begin, if any */
		uint64_t *pos = malloc(nmb * sizeof(uint64_t));

		for (uint64_t mb = 0; mb < nmb; mb++)
			pos[mb] = UINT64_MAX;
		for (size_t j = 0; j < orc.n; j++)
			pos[orc.order[j]] = j;
		assert_true(n > 0);
		for (size_t j = 0; j < n; j++) {
			if (pos[got[j]] == UINT64_MAX)
				fail_msg("virtual stream holds block %llu, which no page table maps",
					 (unsigned long long)got[j]);
			if (j && pos[got[j]] <= pos[got[j - 1]]) {
				if (split)
					fail_msg("virtual stream out of walk order at %zu (the "
						 "deferred began at %zu)", j, split);
				split = j;
			}
			k++;
		}
		free(pos);
		if (split && n - split > walk.deferred)
			fail_msg("%zu blocks after the walk's, but it deferred %llu", n - split,
				 (unsigned long long)walk.deferred);
		fprintf(stderr, "%s, %u-level: %llu deferred, %zu after the walk's\n",
			mode_name[mode], levels, (unsigned long long)walk.deferred,
			split ? n - split : 0);
		fprintf(stderr, "%s, %u-level: %zu blocks mapped, %zu in the virtual stream, "
			"%llu faults (%llu vCPU), %llu background, p50 %llu ns p99 %llu ns\n",
			mode_name[mode], levels, orc.n, k, (unsigned long long)st.faults,
			(unsigned long long)st.faults_vcpu, (unsigned long long)st.mb_background,
			(unsigned long long)st.fault_p50_ns, (unsigned long long)st.fault_p99_ns);
	}
	/* The sweep only gets what no page table maps. */
	{
		size_t n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), got);

		for (size_t j = 0; j < n; j++)
			if (orc.mapped[got[j]])
				fail_msg("mapped block %llu was saved by the physical sweep",
					 (unsigned long long)got[j]);
	}
	/* vCPUs touched their own pages and tables only: "other" has the test's write. */
	assert_int_equal(stream_mbs(r, HALITE_STREAM(HALITE_STREAM_OTHER, 0), got),
			 mode == CHILD ? 0 : 1);
	assert_true(stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VCPU, 0), got) > 0);
	assert_true(stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VCPU, 1), got) > 0);

	halite_reader_free(r);
	unlink(path);
	free(path);
	free(got);
	free(orc.order);
	free(orc.mapped);
	free(snap);
	synth_free(g);
}

static void test_anonymous(void **state)
{
	run(ANON, 4);
}

static void test_shared(void **state)
{
	run(SHARED, 4);
}

static void test_child_5level(void **state)
{
	run(CHILD, 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_anonymous),
		cmocka_unit_test(test_shared),
		cmocka_unit_test(test_child_5level),
	};
	struct halite_uffd_caps caps;
	int ret;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_MINOR_SHMEM)) {
		fprintf(stderr, "no userfaultfd with MINOR_SHMEM: skipped\n");
		return 77;
	}
	g_seed = t_seed("test_save_walk");
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
