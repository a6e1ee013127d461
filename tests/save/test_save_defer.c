/* SPDX-License-Identifier: MIT */
/*
 * The background walk's deferral (halite/save/defer.c), with exact counts: a
 * 1 MiB guest whose page tables map 64 data blocks at VA 0 in address
 * order, and one thread registered as vCPU 0 that touches them when told.
 * The background is held back until the guest is quiet (bg_idle_us 500 ms,
 * no rate floor), so the order of events is the test's:
 * 1. the vCPU touches data block 0: its fault saves it into vCPU 0's stream;
 * 2. the walk meets it claimed, so it defers the WINDOW blocks after it and
 *    saves the rest into the guest-virtual stream; the physical sweep saves
 *    what no table maps; the background then waits before the deferred
 *    blocks (halite_save_test_hold_deferred());
 * 3. the vCPU touches data blocks 1..WINDOW+6: the WINDOW deferred ones
 *    fault into its stream, the rest were saved (and given back) by the walk.
 * With the policy off (window 0) the same steps leave vCPU 0 only block 0:
 * the walk took the rest. When the vCPU never comes back, the deferred
 * blocks end the guest-virtual stream, in walk order. Every block's bytes
 * are compared with the snapshot.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "save_test.h"
#include "test_reader_util.h"
#include "test_util.h"
#include "uffd.h"

#define MB_SIZE 8192u
#define MEM (1u << 20)
#define NMB (MEM / MB_SIZE)
#define PML4 0x1000u
#define DATA 0x10000u	 /* block 8 */
#define DATA_MB (DATA / MB_SIZE)
#define NDATA 64u	 /* data blocks mapped at VA 0 */
#define WINDOW 16u

static uint64_t g_seed;

/* The vCPU: touches the first page of data blocks [lo, hi) when seq moves. */
struct vcpu {
	uint8_t *mem;
	_Atomic pid_t tid;
	_Atomic int seq, done; /* seq -1: exit */
	unsigned lo, hi;
};

static void *vcpu_main(void *arg)
{
	struct vcpu *v = arg;
	int seen = 0;

	atomic_store(&v->tid, gettid());
	for (;;) {
		int seq = atomic_load(&v->seq);

		if (seq < 0)
			return NULL;
		if (seq == seen) {
			usleep(200);
			continue;
		}
		for (unsigned i = v->lo; i < v->hi; i++)
			(void)*(volatile uint8_t *)(v->mem + DATA + (uint64_t)i * MB_SIZE);
		seen = seq;
		atomic_store(&v->done, seq);
	}
}

static void vcpu_touch(struct vcpu *v, unsigned lo, unsigned hi)
{
	int seq = atomic_load(&v->seq) + 1;

	v->lo = lo;
	v->hi = hi;
	atomic_store(&v->seq, seq);
	while (atomic_load(&v->done) != seq)
		usleep(200);
}

/* Four-level tables at PML4.. mapping VA 0.. to the NDATA * 2 data pages. */
static void make_tables(uint8_t *mem)
{
	uint64_t *pml4 = (uint64_t *)(mem + PML4), *pdpt = (uint64_t *)(mem + PML4 + 0x1000);
	uint64_t *pd = (uint64_t *)(mem + PML4 + 0x2000), *pt = (uint64_t *)(mem + PML4 + 0x3000);

	pml4[0] = (PML4 + 0x1000) | 7;
	pdpt[0] = (PML4 + 0x2000) | 7;
	pd[0] = (PML4 + 0x3000) | 7;
	for (unsigned i = 0; i < NDATA * MB_SIZE / 4096; i++)
		pt[i] = (DATA + i * 4096ull) | 7;
}

enum vcpu_after { TOUCH_DEFERRED, NEVER };

/*
 * One save as the header says; the streams it wrote in *vcpu_s (vCPU 0's)
 * and *virt_s (guest-virtual), counts in *nv, *nvirt. Returns the number of
 * blocks the walk deferred.
 */
static uint64_t run(uint32_t window, enum vcpu_after after, uint64_t *vcpu_s, size_t *nv,
		    uint64_t *virt_s, size_t *nvirt)
{
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save_region reg;
	struct halite_save_test_walk walk;
	struct halite_save_stats st;
	struct halite_save *s;
	struct halite_reader *r;
	struct halite_root root = { 0, HALITE_PAGING_4LEVEL, PML4 };
	struct vcpu v = { 0 };
	pthread_t thr;
	pid_t tid;
	uint8_t *mem, *snap, out[MB_SIZE];
	char *path;
	long n;

	mem = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(mem != MAP_FAILED);
	t_fill(mem + DATA, NDATA * MB_SIZE, 50, &g_seed);
	make_tables(mem);
	snap = malloc(MEM);
	memcpy(snap, mem, MEM);
	v.mem = mem;
	assert_int_equal(pthread_create(&thr, NULL, vcpu_main, &v), 0);
	while (!(tid = atomic_load(&v.tid)))
		usleep(100);

	assert_true(asprintf(&path, "%s/defer.hlt", t_tmpdir()) > 0);
	reg = (struct halite_save_region){ .name = "ram", .gpa = 0, .length = MEM,
					   .host = (uintptr_t)mem, .kind = HALITE_MEM_ANON };
	o.vcpu_tids = &tid;
	o.nvcpus = 1;
	o.flags = HALITE_SAVE_NO_SYNC;
	o.bg_idle_us = 500000; /* the background waits for 500 ms of quiet */
	o.bg_min_rate = 1;     /* and has no rate floor to catch up with */
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), 0);
	assert_int_equal(halite_save_add_root(s, &root), 0);
	halite_save_test_defer_window(s, window);
	halite_save_test_hold_deferred(s, true);
	assert_int_equal(halite_save_arm(s), 0);

	vcpu_touch(&v, 0, 1);
	/* The walk and the sweep are over (the tables' and unmapped blocks saved). */
	/*
	 * A deadline in time, not in polls: on a busy host the background's
	 * 500 ms of quiet and its walk take far longer than on an idle one.
	 */
	for (time_t end = time(NULL) + 60; !halite_save_test_deferred_held(s);) {
		if (time(NULL) > end) {
			int ret = halite_save_wait(s, 0);

			fail_msg("the background never reached the deferred blocks in 60 s "
				 "(the save: %d %s)", ret, halite_save_errmsg(s));
		}
		usleep(500);
	}
	if (after == TOUCH_DEFERRED)
		vcpu_touch(&v, 1, WINDOW + 7);
	halite_save_test_hold_deferred(s, false);
	assert_int_equal(halite_save_wait(s, 60000), 0);
	halite_save_stats(s, &st);
	halite_save_test_walk(s, &walk);
	halite_save_free(s);
	atomic_store(&v.seq, -1);
	pthread_join(thr, NULL);

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	assert_int_equal(halite_reader_info(r)->mb_count, NMB);
	for (uint64_t mb = 0; mb < NMB; mb++) {
		assert_int_equal(halite_reader_read_mb(r, mb, out), 0);
		if (memcmp(out, snap + mb * MB_SIZE, MB_SIZE))
			fail_msg("window %u: memory block %llu differs from the snapshot", window,
				 (unsigned long long)mb);
	}
	n = t_stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VCPU, 0), vcpu_s);
	assert_true(n >= 0);
	*nv = (size_t)n;
	n = t_stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0), virt_s);
	assert_true(n >= 0);
	*nvirt = (size_t)n;
	assert_int_equal(st.faults_vcpu, *nv);
	fprintf(stderr, "window %u: %llu deferred, %zu blocks in vCPU 0's stream, %zu in the "
		"guest-virtual one, %llu faults\n", window, (unsigned long long)walk.deferred, *nv,
		*nvirt, (unsigned long long)st.faults);
	halite_reader_free(r);
	unlink(path);
	free(path);
	free(snap);
	munmap(mem, MEM);
	return walk.deferred;
}

/* @got[0..n) is lo, lo+1, ..., hi-1. */
static void assert_run(const uint64_t *got, size_t n, uint64_t lo, uint64_t hi)
{
	assert_int_equal(n, hi - lo);
	for (size_t i = 0; i < n; i++)
		if (got[i] != lo + i)
			fail_msg("block %zu of the stream is %llu, not %llu", i,
				 (unsigned long long)got[i], (unsigned long long)(lo + i));
}

static void test_deferred_to_vcpu(void **state)
{
	uint64_t vs[NMB], virt[NMB];
	size_t nv, nvirt;

	(void)state;
	/* The policy on: block 0 and the WINDOW after it in vCPU 0's stream. */
	assert_int_equal(run(WINDOW, TOUCH_DEFERRED, vs, &nv, virt, &nvirt), WINDOW);
	assert_run(vs, nv, DATA_MB, DATA_MB + 1 + WINDOW);
	assert_run(virt, nvirt, DATA_MB + 1 + WINDOW, DATA_MB + NDATA);
}

static void test_off_walk_takes_them(void **state)
{
	uint64_t vs[NMB], virt[NMB];
	size_t nv, nvirt;

	(void)state;
	/* The policy off: the same touches find the walk's blocks, no fault. */
	assert_int_equal(run(0, TOUCH_DEFERRED, vs, &nv, virt, &nvirt), 0);
	assert_run(vs, nv, DATA_MB, DATA_MB + 1);
	assert_run(virt, nvirt, DATA_MB + 1, DATA_MB + NDATA);
}

static void test_never_touched(void **state)
{
	uint64_t vs[NMB], virt[NMB];
	size_t nv, nvirt;

	(void)state;
	/* The vCPU never comes: the deferred blocks end the virtual stream. */
	assert_int_equal(run(WINDOW, NEVER, vs, &nv, virt, &nvirt), WINDOW);
	assert_run(vs, nv, DATA_MB, DATA_MB + 1);
	assert_int_equal(nvirt, NDATA - 1);
	assert_run(virt, NDATA - 1 - WINDOW, DATA_MB + 1 + WINDOW, DATA_MB + NDATA);
	assert_run(virt + NDATA - 1 - WINDOW, WINDOW, DATA_MB + 1, DATA_MB + 1 + WINDOW);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deferred_to_vcpu),
		cmocka_unit_test(test_off_walk_takes_them),
		cmocka_unit_test(test_never_touched),
	};
	struct halite_uffd_caps caps;
	int failed = 0;

	if (halite_uffd_probe(&caps) == 0) {
		g_seed = t_seed("test_save_defer");
		failed = cmocka_run_group_tests(tests, NULL, NULL);
		rmdir(t_tmpdir());
		return failed ? 1 : 0;
	}
	fprintf(stderr, "no userfaultfd: skipped\n");
	return 77;
}
