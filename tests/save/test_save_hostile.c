/* SPDX-License-Identifier: MIT */
/*
 * The save engine on hostile page tables (issue 12, item 6). Whatever the
 * guest's tables say, the background walk's work stays within a budget
 * proportional to guest memory, and the save finishes within memory size /
 * bg_min_rate (plus a fixed slack) and exactly.
 *
 * The guest: MEM bytes of private anonymous memory in two regions, R0_LEN at
 * GPA 0 and R1_LEN at 4 GiB. NVCPU threads keep writing their pages of
 * [0, DATA) through the save, the last one also flipping the present bit of
 * every table page once the save is armed (the walk must read the tables as
 * they were). Page tables are written in [DATA, R0_LEN - TAIL) before the
 * snapshot; the tail of region 0 is never touched, so the save cannot
 * complete (which ends the walk) before the walk has finished:
 *  (a) a PML4 -> 4 PDPTs of 512 1 GiB leaves, all at GPA 0;
 *  (b) a PML4 -> 512 such PDPTs;
 *  (c) 5-level: a PML5 -> as many PML4s as memory holds, each -> 512 PDPTs
 *      of its own full of 1 GiB leaves at GPA 0: more work than the budget;
 *  (d) a PML4 -> 512 PDPTs whose leaves (1 GiB, 2 MiB, 4 KiB) all lie
 *      outside RAM, in the hole between the regions and up to 2^48 above,
 *      but for one 2 MiB leaf inside region 1;
 *  (e) a root mapping region 1 with 2 MiB pages (its walk lasts half a
 *      second, at the rate floor), then 80 roots added while the save runs,
 *      each a PML4 -> 64 PDPTs of its own full of 1 GiB leaves outside RAM:
 *      together more work than the budget;
 * and a legitimate guest (the synthetic one: 4-level, 4 KiB and 2 MiB pages)
 * whose guest-virtual stream must be exactly what a walk of its tables at
 * the snapshot instant gives.
 *
 * Checked for each: the save, from arm to halite_save_wait()'s return, takes
 * at most MEM / RATE + SLACK_S (the background runs at its rate floor only:
 * bg_idle_us is a minute); the file is the memory at the snapshot instant,
 * block for block; the walk's work (units of ptwalk.h:
 * HALITE_PTW_TABLE_UNITS per table page, one per leaf and per root, one per
 * memory block or 2 MiB chunk the engine looks at) is exactly what the
 * tables call for, or, in (c) and (e), stops at the budget; the walk saved
 * every block its leaves map that no fault took, in leaf order, and the
 * physical sweep only the rest.
 *
 * A watchdog fails the test at once (exit 1: an engine spinning in its walk
 * cannot be stopped) when a save is not over WAIT_GRACE_S after its
 * deadline; HALITE_TEST_HOSTILE_WAIT_S overrides that wait, to time an old
 * engine. argv[1], if given, runs only the cases whose names match (a cmocka
 * filter, e.g. "test_b_*").
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
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "endian_util.h"
#include "save_test.h"
#include "synth.h"
#include "test_reader_util.h"
#include "test_util.h"
#include "uffd.h"

#define PAGE 4096ull
#define MB_PAGES 2u
#define MB_SIZE (MB_PAGES * PAGE)
#define SZ_2M (1ull << 21)
#define SZ_1G (1ull << 30)
#define MEM (32ull << 20)
#define BLOCKS (MEM / MB_SIZE)
#define R1_LEN (4ull << 20)
#define R0_LEN (MEM - R1_LEN)
#define R0_BLOCKS (R0_LEN / MB_SIZE)
#define R1_GPA (4ull << 30)
#define DATA (4ull << 20)	/* [0, DATA): the vCPUs' pages */
#define TAIL (1ull << 20)	/* the end of region 0: never touched */
#define NVCPU 2
#define RATE (8ull << 20)	/* bg_min_rate: MEM / RATE = 4 s */
#define SLACK_S 4ull
#define DEADLINE_NS ((MEM / RATE + SLACK_S) * 1000000000ull)
#define WAIT_GRACE_S 10
#define LATE_ROOTS 80		/* case e */
#define LATE_PDPTS 64
#define FAR_GPA (1ull << 40)	/* outside RAM */

#define T ((uint64_t)HALITE_PTW_TABLE_UNITS)
/* What the engine allows its walk: every page a table, every block twice. */
#define BUDGET (T * (MEM / PAGE) + 2 * BLOCKS)
/*
 * The work of the first 1 GiB leaf at GPA 0: the engine looks at each
 * 2 MiB chunk and each block of region 0 once; every later leaf at GPA 0
 * costs its one unit.
 */
#define FIRST_AT_0 (R0_LEN / SZ_2M + R0_BLOCKS)

/* Entry bits (Intel SDM vol. 3, 4.5). */
#define E_TABLE 0x027ull	/* P, RW, US, A */
#define E_LEAF 0x063ull		/* P, RW, A, D */
#define E_PS 0x080ull

static uint64_t g_seed;

struct guest;

struct vcpu_arg {
	struct guest *g;
	int i;
};

struct guest {
	uint8_t *mem;		/* region 0, then region 1 */
	uint64_t tables_end;	/* GPA past the last table page */
	pthread_t thr[NVCPU];
	_Atomic pid_t tid[NVCPU];
	pid_t tids[NVCPU];
	_Atomic int pause_req, parked, stop, scribble;
	struct vcpu_arg args[NVCPU]; /* each guest its own: two may run at once */
};

static void park(struct guest *g)
{
	if (!atomic_load(&g->pause_req))
		return;
	atomic_fetch_add(&g->parked, 1);
	while (atomic_load(&g->pause_req))
		usleep(100);
	atomic_fetch_sub(&g->parked, 1);
}

/*
 * Each vCPU reads and writes every page of its slice of [0, DATA), over and
 * over. The last one, once armed, also flips the present bit of entry 0 of
 * every table page: the live tables then lose or regain one entry a pass,
 * which a walk reading them instead of the snapshot's would count.
 */
static void *vcpu_main(void *arg)
{
	struct vcpu_arg *a = arg;
	struct guest *g = a->g;
	uint64_t lo = DATA / NVCPU * (uint64_t)a->i, hi = lo + DATA / NVCPU;

	atomic_store(&g->tid[a->i], gettid());
	while (!atomic_load(&g->stop)) {
		for (uint64_t off = lo; off < hi && !atomic_load(&g->stop); off += PAGE) {
			park(g);
			*(volatile uint64_t *)(g->mem + off + 8) +=
				*(volatile uint64_t *)(g->mem + off + 16) * 0;
			(*(volatile uint64_t *)(g->mem + off))++;
		}
		if (a->i != NVCPU - 1 || !atomic_load(&g->scribble))
			continue;
		for (uint64_t p = DATA; p < g->tables_end && !atomic_load(&g->stop); p += PAGE) {
			park(g);
			*(volatile uint64_t *)(g->mem + p) ^= 1;
		}
	}
	return NULL;
}

static void guest_pause(struct guest *g)
{
	atomic_store(&g->pause_req, 1);
	while (atomic_load(&g->parked) != NVCPU)
		usleep(50);
}

/* Memory filled (data, region 1), no tables yet, vCPUs parked. */
static struct guest *guest_new(void)
{
	struct guest *g = calloc(1, sizeof(*g));
	uint64_t seed = g_seed;

	assert_non_null(g);
	g->mem = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(g->mem != MAP_FAILED);
	/* Untouched pages must stay holes (THP would fill a 2 MiB extent). */
	assert_int_equal(madvise(g->mem, MEM, MADV_NOHUGEPAGE), 0);
	t_fill(g->mem, DATA, 50, &seed);
	t_fill(g->mem + R0_LEN, R1_LEN, 50, &seed);
	g->tables_end = DATA;
	atomic_store(&g->pause_req, 1);
	for (int i = 0; i < NVCPU; i++) {
		g->args[i] = (struct vcpu_arg){ g, i };
		assert_int_equal(pthread_create(&g->thr[i], NULL, vcpu_main, &g->args[i]), 0);
	}
	t_wait_parked(&g->parked, NVCPU, g->tid, g->tids);
	return g;
}

static void guest_free(struct guest *g)
{
	atomic_store(&g->stop, 1);
	atomic_store(&g->pause_req, 0);
	for (int i = 0; i < NVCPU; i++)
		pthread_join(g->thr[i], NULL);
	munmap(g->mem, MEM);
	free(g);
}

/* A zeroed table page in region 0, between the data and the tail. */
static uint64_t tbl(struct guest *g)
{
	uint64_t gpa = g->tables_end;

	assert_true(gpa + PAGE <= R0_LEN - TAIL);
	g->tables_end += PAGE;
	return gpa;
}

static unsigned tbl_left(const struct guest *g)
{
	return (unsigned)((R0_LEN - TAIL - g->tables_end) / PAGE);
}

static void set(struct guest *g, uint64_t table, unsigned i, uint64_t e)
{
	halite_put_le64(g->mem + table + 8 * i, e);
}

/* A PDPT of 512 1 GiB leaves, all at @gpa. */
static uint64_t pdpt_of(struct guest *g, uint64_t gpa)
{
	uint64_t t = tbl(g);

	for (unsigned i = 0; i < 512; i++)
		set(g, t, i, gpa | E_LEAF | E_PS);
	return t;
}

/* A PML4 -> @n PDPTs of 512 1 GiB leaves, all at @gpa. */
static uint64_t pml4_of(struct guest *g, unsigned n, uint64_t gpa)
{
	uint64_t t = tbl(g);

	for (unsigned i = 0; i < n; i++)
		set(g, t, i, pdpt_of(g, gpa) | E_TABLE);
	return t;
}

enum hcase { CASE_A, CASE_B, CASE_C, CASE_D, CASE_E };
static const char *const case_name[] = { "a", "b", "c", "d", "e" };

struct hostile {
	uint64_t root;
	unsigned levels;
	uint64_t late[LATE_ROOTS];
	uint64_t work;		/* expected: all of it, or of the first root (e) */
	uint64_t per_late;	/* case e: the work of each late root */
	uint64_t vlo, vhi;	/* the blocks the leaves map */
};

static void build(struct guest *g, enum hcase c, struct hostile *h)
{
	uint64_t t, pd, pt, leaves;
	unsigned n4;

	h->levels = 4;
	h->vhi = R0_BLOCKS;
	switch (c) {
	case CASE_A:
		h->root = pml4_of(g, 4, 0);
		h->work = 1 + 5 * T + 4 * 512 + FIRST_AT_0;
		break;
	case CASE_B:
		h->root = pml4_of(g, 512, 0);
		h->work = 1 + 513 * T + 512 * 512 + FIRST_AT_0;
		break;
	case CASE_C:
		/* PML5 -> n4 PML4s -> 512 PDPTs each: as many as memory holds. */
		h->levels = 5;
		h->root = tbl(g);
		n4 = tbl_left(g) / 513;
		for (unsigned i = 0; i < n4; i++)
			set(g, h->root, i, pml4_of(g, 512, 0) | E_TABLE);
		/* What it would cost in full: more than the budget. */
		h->work = 1 + (1 + 513ull * n4) * T + 512ull * 512 * n4 + FIRST_AT_0;
		assert_true(h->work > BUDGET);
		break;
	case CASE_D:
		h->root = tbl(g);
		t = tbl(g);
		set(g, h->root, 0, t | E_TABLE);
		/* PDPT 0: a PD of 2 MiB leaves in the hole [1, 2) GiB ... */
		pd = tbl(g);
		set(g, t, 0, pd | E_TABLE);
		for (unsigned k = 0; k < 512; k++)
			set(g, pd, k, (SZ_1G + k * SZ_2M) | E_LEAF | E_PS);
		/* ... a PD with a PT of 4 KiB leaves at 2 GiB, and one 2 MiB leaf in region 1 ... */
		pd = tbl(g);
		set(g, t, 1, pd | E_TABLE);
		pt = tbl(g);
		set(g, pd, 0, pt | E_TABLE);
		for (unsigned k = 0; k < 512; k++)
			set(g, pt, k, (2 * SZ_1G + k * PAGE) | E_LEAF);
		set(g, pd, 1, (R1_GPA + SZ_2M) | E_LEAF | E_PS);
		/* ... and 1 GiB leaves from 6 GiB up. */
		for (unsigned k = 2; k < 512; k++)
			set(g, t, k, ((uint64_t)(k + 4) << 30) | E_LEAF | E_PS);
		/* PDPTs 1..511: 1 GiB leaves from 2^45 up, no two alike. */
		for (unsigned j = 1; j < 512; j++) {
			t = tbl(g);
			set(g, h->root, j, t | E_TABLE);
			for (unsigned k = 0; k < 512; k++)
				set(g, t, k, ((1ull << 45) + ((uint64_t)(j * 512 + k) << 30)) |
						     E_LEAF | E_PS);
		}
		leaves = 512 + 512 + 1 + 510 + 511 * 512;
		h->work = 1 + 516 * T + leaves + SZ_2M / MB_SIZE;
		h->vlo = R0_BLOCKS + SZ_2M / MB_SIZE;
		h->vhi = h->vlo + SZ_2M / MB_SIZE;
		break;
	case CASE_E:
		/* PML4 -> PDPT -> PD of 2 MiB leaves over region 1. */
		h->root = tbl(g);
		t = tbl(g);
		pd = tbl(g);
		set(g, h->root, 0, t | E_TABLE);
		set(g, t, 0, pd | E_TABLE);
		for (unsigned k = 0; k < R1_LEN / SZ_2M; k++)
			set(g, pd, k, (R1_GPA + k * SZ_2M) | E_LEAF | E_PS);
		h->work = 1 + 3 * T + R1_LEN / SZ_2M + R1_LEN / MB_SIZE;
		h->vlo = R0_BLOCKS;
		h->vhi = BLOCKS;
		for (unsigned j = 0; j < LATE_ROOTS; j++)
			h->late[j] = pml4_of(g, LATE_PDPTS, FAR_GPA);
		h->per_late = 1 + (1 + LATE_PDPTS) * T + LATE_PDPTS * 512;
		/* What the late roots would cost in full: more than the budget. */
		assert_true(h->work + LATE_ROOTS * h->per_late > BUDGET);
		break;
	}
}


/* Region 0's blocks come first in the file, then region 1's: as in memory. */
static void check_content(const char *path, const uint8_t *snap)
{
	struct halite_reader *r;
	uint8_t out[MB_SIZE];

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	assert_int_equal(halite_reader_info(r)->mb_count, BLOCKS);
	for (uint64_t mb = 0; mb < BLOCKS; mb++) {
		assert_int_equal(halite_reader_read_mb(r, mb, out), 0);
		if (memcmp(out, snap + mb * MB_SIZE, MB_SIZE))
			fail_msg("memory block %llu differs from the snapshot",
				 (unsigned long long)mb);
	}
	halite_reader_free(r);
}

static size_t stream_mbs(struct halite_reader *r, uint32_t stream, uint64_t *out)
{
	long n = t_stream_mbs(r, stream, out);

	assert_true(n >= 0);
	return (size_t)n;
}

/*
 * Blocks the walk cannot have put in the virtual stream: those first touches
 * saved (the vCPU and "other" streams), and those saved without bytes (zero
 * or never touched), which no stream lists.
 */
static uint8_t *elsewhere(struct halite_reader *r, size_t nmb)
{
	uint64_t *got = malloc(nmb * sizeof(uint64_t));
	uint8_t *f = calloc(nmb, 1);
	struct halite_mb_loc loc;
	size_t n;

	for (unsigned i = 0; i <= NVCPU; i++) {
		n = stream_mbs(r, i < NVCPU ? HALITE_STREAM(HALITE_STREAM_VCPU, i)
					    : HALITE_STREAM(HALITE_STREAM_OTHER, 0), got);
		for (size_t j = 0; j < n; j++)
			f[got[j]] = 1;
	}
	for (size_t mb = 0; mb < nmb; mb++) {
		assert_int_equal(halite_reader_mb_lookup(r, mb, &loc), 0);
		if (loc.state != HALITE_MB_STORED)
			f[mb] = 1;
	}
	free(got);
	return f;
}

/*
 * The virtual stream: the blocks in [vlo, vhi) (what the leaves map, in leaf
 * order, which is GPA order in these tables) that were saved with bytes and
 * not by a fault, exactly; the physical sweep saved only blocks outside it.
 */
static void check_streams(const char *path, const struct hostile *h)
{
	struct halite_reader *r;
	uint64_t *got = malloc(BLOCKS * sizeof(uint64_t)), want = h->vlo;
	uint8_t *f;
	size_t n;

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	f = elsewhere(r, BLOCKS);
	n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0), got);
	for (size_t j = 0; j < n; j++, want++) {
		while (want < h->vhi && f[want])
			want++;
		if (got[j] != want)
			fail_msg("virtual stream: block %zu is %llu, want %llu", j,
				 (unsigned long long)got[j], (unsigned long long)want);
	}
	while (want < h->vhi && f[want])
		want++;
	assert_int_equal(want, h->vhi);
	n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), got);
	for (size_t j = 0; j < n; j++)
		if (got[j] >= h->vlo && got[j] < h->vhi)
			fail_msg("physical stream holds block %llu, which the walk maps",
				 (unsigned long long)got[j]);
	free(f);
	free(got);
	halite_reader_free(r);
}

/* ---- the watchdog: a save that does not end fails the test at once ---- */

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *watch_what;	/* NULL: no save running */
static uint64_t watch_t0, watch_until;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *watchdog(void *arg)
{
	for (;;) {
		usleep(100000);
		pthread_mutex_lock(&watch_lock);
		if (watch_what && now_ns() > watch_until) {
			fprintf(stderr, "%s: save not over %.1f s after arm: FAIL\n", watch_what,
				(now_ns() - watch_t0) / 1e9);
			_exit(1);
		}
		pthread_mutex_unlock(&watch_lock);
	}
	return NULL;
}

/* Returns the time, for the save's duration. */
static uint64_t watch(const char *what)
{
	const char *e = getenv("HALITE_TEST_HOSTILE_WAIT_S");
	uint64_t wait = e ? strtoull(e, NULL, 0) * 1000000000u
			  : DEADLINE_NS + WAIT_GRACE_S * 1000000000ull;

	pthread_mutex_lock(&watch_lock);
	watch_what = what;
	watch_t0 = now_ns();
	watch_until = watch_t0 + wait;
	pthread_mutex_unlock(&watch_lock);
	return watch_t0;
}

static void unwatch(void)
{
	pthread_mutex_lock(&watch_lock);
	watch_what = NULL;
	pthread_mutex_unlock(&watch_lock);
}

static void opts_for(struct halite_save_opts *o, const pid_t *tids)
{
	o->vcpu_tids = tids;
	o->nvcpus = NVCPU;
	o->mb_pages = MB_PAGES;
	o->flags = HALITE_SAVE_NO_SYNC;
	o->workers = 2;
	/* The background at its rate floor only: the deadline's worst case. */
	o->bg_idle_us = 60u * 1000 * 1000;
	o->bg_min_rate = RATE;
	o->log = halite_log_stderr;
	o->log_level = HALITE_LOG_WARN;
}

/*
 * The save to its end, then what it did: its stats and walk in @st and @w,
 * the save freed; the nanoseconds since @t0.
 */
static uint64_t walk_done(struct halite_save *s, uint64_t t0, struct halite_save_stats *st,
			  struct halite_save_test_walk *w)
{
	uint64_t ns;

	assert_int_equal(halite_save_wait(s, -1), 0);
	ns = now_ns() - t0;
	unwatch();
	halite_save_stats(s, st);
	halite_save_test_walk(s, w);
	halite_save_free(s);
	return ns;
}

static void print_walk(const char *what, const struct halite_save_test_walk *w, uint64_t ns)
{
	fprintf(stderr, "%s: walk work %llu of budget %llu%s, %u roots, %llu tables, "
		"%llu leaves, walk %.3f s (%.3f s CPU), save %.3f s of deadline %.1f s\n", what,
		(unsigned long long)w->st.work, (unsigned long long)w->budget,
		w->st.over_budget ? " (stopped over budget)" : "", w->roots,
		(unsigned long long)w->st.tables_read,
		(unsigned long long)(w->st.leaves_4k + w->st.leaves_2m + w->st.leaves_1g),
		w->ns / 1e9, w->cpu_ns / 1e9, ns / 1e9, DEADLINE_NS / 1e9);
}

static struct halite_root root_of(uint32_t vcpu, unsigned levels, uint64_t cr3)
{
	return (struct halite_root){ vcpu, levels == 5 ? HALITE_PAGING_5LEVEL
						     : HALITE_PAGING_4LEVEL, cr3 };
}

static void run_hostile(enum hcase c)
{
	HALITE_OPTS(halite_save_opts, o);
	struct guest *g = guest_new();
	struct halite_save_region reg[2];
	struct halite_save_test_walk w;
	struct halite_save_stats st;
	struct hostile h = { 0 };
	struct halite_root root;
	struct halite_save *s;
	uint64_t t0, ns;
	uint8_t *snap;
	char *path, what[32];

	snprintf(what, sizeof(what), "hostile (%s)", case_name[c]);
	build(g, c, &h);
	assert_true(asprintf(&path, "%s/hostile-%s.hlt", t_tmpdir(), case_name[c]) > 0);
	atomic_store(&g->pause_req, 0);
	usleep(10000);
	guest_pause(g);
	snap = calloc(1, MEM);
	t_copy_resident(snap, g->mem, MEM);

	reg[0] = (struct halite_save_region){ .name = "pc.ram", .gpa = 0, .length = R0_LEN,
					      .host = (uintptr_t)g->mem,
					      .kind = HALITE_MEM_ANON };
	reg[1] = (struct halite_save_region){ .name = "high", .gpa = R1_GPA, .length = R1_LEN,
					      .host = (uintptr_t)g->mem + R0_LEN,
					      .kind = HALITE_MEM_ANON };
	opts_for(&o, g->tids);
	assert_int_equal(halite_save_create(&s, path, reg, 2, &o), 0);
	root = root_of(HALITE_VCPU_UNKNOWN, h.levels, h.root);
	assert_int_equal(halite_save_add_root(s, &root), 0);
	t0 = watch(what);
	assert_int_equal(halite_save_arm(s), 0);
	atomic_store(&g->scribble, 1);
	atomic_store(&g->pause_req, 0);
	/* Case e: the sampler finds new roots while the walk is busy with the first. */
	for (unsigned j = 0; c == CASE_E && j < LATE_ROOTS; j++) {
		root = root_of(j % NVCPU, 4, h.late[j]);
		assert_int_equal(halite_save_add_root(s, &root), 0);
	}
	ns = walk_done(s, t0, &st, &w);
	print_walk(what, &w, ns);

	assert_true(st.done);
	assert_true(ns <= DEADLINE_NS);
	check_content(path, snap);
	check_streams(path, &h);
	assert_int_equal(w.budget, BUDGET);
	assert_true(w.st.work <= w.budget);
	if (c == CASE_C || c == CASE_E) {
		/* Stopped at the budget: the step refused was at most a table's. */
		assert_int_equal(w.st.over_budget, 1);
		assert_true(w.st.work > w.budget - T);
	} else {
		assert_int_equal(w.st.over_budget, 0);
		assert_int_equal(w.st.work, h.work);
	}
	if (c == CASE_E) {
		/*
		 * Every late root was known before the first one's walk ended:
		 * the walk went through as many as the budget left room for,
		 * and stopped in the next one.
		 */
		assert_int_equal(w.roots, 1 + (BUDGET - h.work) / h.per_late + 1);
	}
	unlink(path);
	free(path);
	free(snap);
	guest_free(g);
}

static void test_a_four_tables_at_0(void **state)
{
	run_hostile(CASE_A);
}

static void test_b_512_tables_at_0(void **state)
{
	run_hostile(CASE_B);
}

static void test_c_5level_over_budget(void **state)
{
	run_hostile(CASE_C);
}

static void test_d_outside_ram(void **state)
{
	run_hostile(CASE_D);
}

static void test_e_late_roots(void **state)
{
	run_hostile(CASE_E);
}

/* ---- a legitimate guest ---- */

struct oracle {
	const uint8_t *snap;
	uint64_t len;
	uint64_t *order; /* blocks in the order the walk meets them, first time only */
	uint8_t *mapped;
	size_t n;
};

static int oracle_read(void *ctx, uint64_t gpa, void *page)
{
	struct oracle *o = ctx;

	if (gpa >= o->len || o->len - gpa < PAGE)
		return -ERANGE;
	memcpy(page, o->snap + gpa, PAGE);
	return 0;
}

static int oracle_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	struct oracle *o = ctx;

	for (uint64_t g = gpa - gpa % MB_SIZE; g < gpa + len && g < o->len; g += MB_SIZE) {
		if (!o->mapped[g / MB_SIZE]) {
			o->mapped[g / MB_SIZE] = 1;
			o->order[o->n++] = g / MB_SIZE;
		}
	}
	return 0;
}

/*
 * The synthetic guest with 4 KiB and 2 MiB pages: the walk stays far under
 * its budget, its work is what the tables call for, and the virtual stream
 * is exactly the walk order of the snapshot's tables less what faults took.
 */
static void test_legit_guest(void **state)
{
	SYNTH_OPTS(so, .mem_bytes = MEM, .nvcpus = NVCPU, .stride = 16,
		   .map_bytes = 8ull << 20, .huge_2m = 2, .ws_bytes = 1ull << 20,
		   .compress_pct = 50, .zero_pct = 5, .untouched_pct = 20, .write_pct = 50,
		   .pattern = SYNTH_PAT_SEQ, .paging_levels = 4);
	HALITE_OPTS(halite_save_opts, o);
	struct oracle orc = { 0 };
	struct synth_guest *g;
	struct synth_info info;
	struct halite_save *s;
	struct halite_save_region reg;
	struct halite_save_stats st;
	struct halite_save_test_walk w;
	struct halite_ptw_stats ost;
	struct halite_ptw *ow;
	struct halite_reader *r;
	pid_t tids[NVCPU];
	uint64_t cr3[NVCPU], *got, t0, ns;
	uint8_t *snap, *f;
	char *path;
	size_t n, k = 0;

	so.seed = t_rand(&g_seed);
	assert_int_equal(synth_create(&g, &so), 0);
	assert_int_equal(synth_info(g, &info), 0);
	assert_int_equal(info.mem_bytes, MEM);
	assert_true(asprintf(&path, "%s/legit.hlt", t_tmpdir()) > 0);
	assert_int_equal(synth_start(g), 0);
	usleep(10000);
	assert_int_equal(synth_pause(g), 0);
	snap = malloc(MEM);
	assert_int_equal(synth_copy_memory(g, snap), 0);

	reg = (struct halite_save_region){ .name = SYNTH_REGION_NAME, .gpa = info.gpa_base,
					   .length = MEM, .host = (uintptr_t)info.host_addr,
					   .kind = HALITE_MEM_ANON };
	for (unsigned i = 0; i < NVCPU; i++) {
		struct synth_vcpu_info vi;

		assert_int_equal(synth_vcpu_info(g, i, &vi), 0);
		tids[i] = vi.tid;
		cr3[i] = vi.cr3;
	}
	opts_for(&o, tids);
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), 0);
	for (unsigned i = 0; i < NVCPU; i++) {
		struct halite_root root = root_of(i, 4, cr3[i]);

		assert_int_equal(halite_save_add_root(s, &root), 0);
	}
	t0 = watch("legit");
	/* The walk's order exactly: no deferral (halite/save/defer.c; test_save_defer has it). */
	halite_save_test_defer_window(s, 0);
	assert_int_equal(halite_save_arm(s), 0);
	assert_int_equal(synth_resume(g), 0);
	ns = walk_done(s, t0, &st, &w);
	assert_int_equal(synth_stop(g), 0);
	print_walk("legit", &w, ns);
	assert_true(st.done);
	assert_true(ns <= DEADLINE_NS);
	check_content(path, snap);

	/* The oracle: a walk of the snapshot's tables, every root in order. */
	orc.snap = snap;
	orc.len = MEM;
	orc.order = malloc(BLOCKS * sizeof(uint64_t));
	orc.mapped = calloc(BLOCKS, 1);
	assert_int_equal(halite_ptw_create(&ow, MEM), 0);
	for (unsigned i = 0; i < NVCPU; i++)
		assert_int_equal(halite_ptw_walk(ow, cr3[i], 4, oracle_read, oracle_visit, &orc), 0);
	halite_ptw_stats(ow, &ost);
	halite_ptw_free(ow);
	assert_true(ost.leaves_2m > 0 && ost.leaves_4k > 0);

	/*
	 * Work: the oracle walker's (roots, tables, leaves), plus one block per
	 * 4 KiB leaf and every block of each 2 MiB leaf (all distinct here).
	 */
	assert_int_equal(w.st.over_budget, 0);
	assert_int_equal(w.budget, BUDGET);
	assert_int_equal(w.roots, NVCPU);
	assert_int_equal(w.st.work, ost.work + ost.leaves_4k + ost.leaves_2m * (SZ_2M / MB_SIZE));

	/* The virtual stream: the oracle's order, less the blocks it cannot hold. */
	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	f = elsewhere(r, BLOCKS);
	got = malloc(BLOCKS * sizeof(uint64_t));
	n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0), got);
	for (size_t j = 0; j < orc.n; j++) {
		if (f[orc.order[j]])
			continue;
		if (k >= n || got[k] != orc.order[j])
			fail_msg("virtual stream: block %zu is %lld, the walk says %llu", k,
				 k < n ? (long long)got[k] : -1LL,
				 (unsigned long long)orc.order[j]);
		k++;
	}
	assert_int_equal(k, n);
	fprintf(stderr, "legit: %zu blocks mapped, %zu in the virtual stream\n", orc.n, n);
	halite_reader_free(r);

	unlink(path);
	free(path);
	free(got);
	free(f);
	free(orc.order);
	free(orc.mapped);
	free(snap);
	synth_free(g);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_legit_guest),
		cmocka_unit_test(test_a_four_tables_at_0),
		cmocka_unit_test(test_b_512_tables_at_0),
		cmocka_unit_test(test_c_5level_over_budget),
		cmocka_unit_test(test_d_outside_ram),
		cmocka_unit_test(test_e_late_roots),
	};
	struct halite_uffd_caps caps;
	pthread_t wd;
	int ret;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_THREAD_ID)) {
		fprintf(stderr, "no userfaultfd with THREAD_ID: skipped\n");
		return 77;
	}
	g_seed = t_seed("test_save_hostile");
	assert_int_equal(pthread_create(&wd, NULL, watchdog, NULL), 0);
	pthread_detach(wd);
	if (argc > 1)
		cmocka_set_test_filter(argv[1]);
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
