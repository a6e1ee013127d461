// SPDX-License-Identifier: MIT
/*
 * The restore side of docs/failure-model.md, each guarantee proven once and
 * run against both restore engines through one adapter (struct eng):
 *
 *   restore  a single restore (halite_restore_open + start) into private
 *            anonymous memory of this process;
 *   clone    a template over a memory file on tmpfs (halite_template_open)
 *            and a session (halite_session_start) for a private mapping of
 *            that file, as halite-cloned's clones have.
 *
 * Cases: every byte exact (zero, never-touched and stored blocks over two
 * regions, read by a thread); a corrupt LB never installed, its faulting
 * thread blocked, the error naming the LB, the other LBs exact; an LB that
 * fails its checksum once and then reads good is recovered, one retry
 * counted; a truncated file and a bad header refused at open with the
 * reader's code; a format 1.1 file with a damaged index chunk: its blocks
 * never served (no zero page), the error naming the chunk, the good
 * chunk's blocks exact; a page the guest discards (MADV_DONTNEED) during
 * the restore; bad arguments.
 *
 * Where a guest thread must stay blocked, the engine runs in a forked child
 * (which never calls cmocka: it records what it saw in shared memory); the
 * engine's free then makes the memory PROT_NONE, and the blocked thread
 * must die of SIGSEGV, never having read a byte.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>
#include <halite/restore.h>
#include <halite/template.h>

#include "restore_util.h"
#include "test_util.h"
#include "uffd.h"

#define PAGE R_PAGE
#define MB_SIZE 8192u
#define NREG 2u
static const char *const g_rname[NREG] = { "pc.ram", "pc.ram.hi" };
static const uint64_t g_rlen[NREG] = { 3u << 20, 1u << 20 };
#define LEN ((uint64_t)(4u << 20))
#define NMB (LEN / MB_SIZE)

static uint8_t *g_image;	/* the snapshot: what every engine must give back */
static uint8_t g_kind[NMB];	/* 0 never touched, 1 zero, 2 stored */
static char g_snap[256], g_mem[128];
static uint64_t g_seed;

/* ---------------------------------------------------------------------- */
/* The snapshot                                                             */

/*
 * Two regions; a tenth of the blocks never touched, a tenth zero, the rest
 * stored (half random, half zero bytes), in a shuffled order over three
 * streams, so an LB holds blocks of both regions.
 */
static void make_snapshot(void)
{
	const struct halite_region reg[NREG] = { { g_rname[0], 0, g_rlen[0] },
						 { g_rname[1], 1ull << 32, g_rlen[1] } };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	uint64_t x = g_seed, order[NMB];

	g_image = calloc(1, LEN);
	assert_non_null(g_image);
	for (uint64_t mb = 0; mb < NMB; mb++) {
		uint64_t k = t_rand(&x) % 10;

		g_kind[mb] = k == 0 ? 0 : k == 1 ? 1 : 2;
		if (g_kind[mb] == 2) {
			for (uint32_t i = 0; i < MB_SIZE / 2; i++)
				g_image[mb * MB_SIZE + i] = (uint8_t)t_rand(&x);
			g_image[mb * MB_SIZE + MB_SIZE - 1] = (uint8_t)mb | 1;
		}
		order[mb] = mb;
	}
	for (uint64_t i = NMB - 1; i > 0; i--) {
		uint64_t j = t_rand(&x) % (i + 1), tmp = order[i];

		order[i] = order[j];
		order[j] = tmp;
	}
	o.mb_pages = MB_SIZE / PAGE;
	o.vcpu_count = 3;
	o.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, g_snap, reg, NREG, &o), 0);
	for (uint64_t i = 0; i < NMB; i++) {
		uint64_t mb = order[i];

		if (g_kind[mb] == 1)
			assert_int_equal(halite_writer_put_zero(w, mb), 0);
		else if (g_kind[mb] == 2)
			assert_true(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, i % 3),
						      mb, g_image + mb * MB_SIZE) >= 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
}

static char *scratch(const char *name)
{
	char *p = malloc(320);

	assert_non_null(p);
	snprintf(p, 320, "%s/%s", t_tmpdir(), name);
	return p;
}

/* ---------------------------------------------------------------------- */
/* The adapter: one engine, its memory, its error                           */

enum { ENG_RESTORE, ENG_CLONE, ENG_COUNT };
static const char *const eng_name[ENG_COUNT] = { "restore", "clone" };

struct eng_opts {
	unsigned flags;		/* ENG_PREFETCH */
	unsigned retries;	/* read_retries; 0: the engine's default */
	uint32_t latency_us;	/* added to every LB read */
};
#define ENG_PREFETCH 0x1u

struct eng {
	int kind;
	struct r_log log;
	struct halite_restore *r;
	struct halite_template *t;
	struct halite_session *s;
	uint32_t nreg;
	char name[NREG][HALITE_MAX_REGION_NAME + 1];
	uint8_t *mem[NREG];
	uint64_t len[NREG];
	uint64_t first_mb[NREG];
	uint32_t mb_size;
};

static void eng_init(struct eng *e, int kind)
{
	memset(e, 0, sizeof(*e));
	e->kind = kind;
	r_log_init(&e->log, true);
}

static void remove_mem(void)
{
	char fill[160];

	snprintf(fill, sizeof(fill), "%s.fill", g_mem);
	unlink(g_mem);
	unlink(fill);
}

/*
 * Opens the engine on @file: 0, or the open's code (its message in the
 * log). A refused open leaves nothing to free but eng_free() is fine.
 */
static int eng_open(struct eng *e, const char *file, const struct eng_opts *eo)
{
	struct halite_restore_region reg[NREG];
	struct halite_reader *rd;
	int ret;

	if (e->kind == ENG_RESTORE) {
		HALITE_OPTS(halite_restore_opts, o);

		bool have;

		/*
		 * The file may be refused: then the regions are what it should
		 * hold, not what it says.
		 */
		have = !halite_reader_open(&rd, file, NULL);
		e->nreg = have ? halite_reader_info(rd)->region_count : NREG;
		e->mb_size = have ? halite_reader_info(rd)->mb_size : MB_SIZE;
		ret = e->nreg > NREG ? -EINVAL : 0;
		for (uint32_t i = 0; !ret && i < e->nreg; i++) {
			const struct halite_region_info *ri =
				have ? halite_reader_region(rd, i) : NULL;
			void *p;

			snprintf(e->name[i], sizeof(e->name[i]), "%s", ri ? ri->name : g_rname[i]);
			e->len[i] = ri ? ri->length : g_rlen[i];
			e->first_mb[i] = ri ? ri->first_mb : 0;
			p = mmap(NULL, e->len[i], PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (p == MAP_FAILED) {
				ret = -errno;
				break;
			}
			e->mem[i] = p;
			reg[i] = (struct halite_restore_region){ e->name[i], (uintptr_t)p,
								 e->len[i], HALITE_MEM_ANON, -1,
								 0 };
		}
		if (have)
			halite_reader_free(rd);
		if (ret)
			return ret;
		o.flags = HALITE_RESTORE_NO_READAHEAD |
			  (eo->flags & ENG_PREFETCH ? 0 : HALITE_RESTORE_NO_PREFETCH);
		o.read_retries = eo->retries;
		o.read_latency_us = eo->latency_us;
		o.log = r_log_fn;
		o.log_ctx = &e->log;
		o.log_level = HALITE_LOG_WARN;
		return halite_restore_open(&e->r, file, reg, e->nreg, &o);
	} else {
		HALITE_OPTS(halite_template_opts, o);

		o.flags = eo->flags & ENG_PREFETCH ? 0 : HALITE_TEMPLATE_NO_PREFETCH;
		o.read_retries = eo->retries;
		o.read_latency_us = eo->latency_us;
		o.log = r_log_fn;
		o.log_ctx = &e->log;
		o.log_level = HALITE_LOG_WARN;
		ret = halite_template_open(&e->t, file, g_mem, &o);
		if (ret)
			return ret;
		rd = halite_template_reader(e->t);
		e->nreg = halite_reader_info(rd)->region_count;
		e->mb_size = halite_reader_info(rd)->mb_size;
		for (uint32_t i = 0; i < e->nreg && i < NREG; i++) {
			const struct halite_region_info *ri = halite_reader_region(rd, i);
			uint64_t off;

			snprintf(e->name[i], sizeof(e->name[i]), "%s", ri->name);
			e->first_mb[i] = ri->first_mb;
			ret = halite_template_region(e->t, ri->name, &off, &e->len[i]);
			if (ret)
				return ret;
			e->mem[i] = mmap(NULL, e->len[i], PROT_READ | PROT_WRITE, MAP_PRIVATE,
					 halite_template_memfd(e->t), (off_t)off);
			if (e->mem[i] == MAP_FAILED) {
				e->mem[i] = NULL;
				return -errno;
			}
		}
		return 0;
	}
}

/* Starts serving faults on the memory eng_open() mapped: 0 or the engine's code. */
static int eng_start(struct eng *e)
{
	struct halite_session_region reg[NREG];
	HALITE_OPTS(halite_session_opts, o);

	if (e->kind == ENG_RESTORE)
		return halite_restore_start(e->r);
	for (uint32_t i = 0; i < e->nreg; i++)
		reg[i] = (struct halite_session_region){ e->name[i], (uintptr_t)e->mem[i],
							 e->len[i] };
	o.owner_uffd = -1;
	return halite_session_start(&e->s, e->t, reg, e->nreg, &o);
}

static int eng_open_start(struct eng *e, const char *file, const struct eng_opts *eo)
{
	int ret = eng_open(e, file, eo);

	return ret ? ret : eng_start(e);
}

/* 0 once every block is in and the ranges unregistered, -ETIMEDOUT, or the failure. */
static int eng_wait(struct eng *e, int ms)
{
	if (e->kind == ENG_RESTORE)
		return halite_restore_wait(e->r, ms);
	return halite_session_wait(e->s, ms);
}

static const char *eng_errmsg(struct eng *e)
{
	return e->kind == ENG_RESTORE ? halite_restore_errmsg(e->r) : halite_session_errmsg(e->s);
}

/* LB re-reads after a failed read or checksum. */
static uint64_t eng_retries(struct eng *e)
{
	if (e->kind == ENG_RESTORE) {
		struct halite_restore_stats st;

		halite_restore_stats(e->r, &st);
		return st.lb_retries;
	} else {
		struct halite_template_stats st;

		halite_template_stats(e->t, &st);
		return st.lb_retries;
	}
}

/* The guest address of block @mb (the file's numbering), or NULL. */
static uint8_t *eng_mb(const struct eng *e, uint64_t mb)
{
	for (uint32_t i = 0; i < e->nreg; i++)
		if (mb >= e->first_mb[i] && (mb - e->first_mb[i]) * e->mb_size < e->len[i])
			return e->mem[i] + (mb - e->first_mb[i]) * e->mb_size;
	return NULL;
}

/* Frees the engine (a cancel if it runs: the memory PROT_NONE first) and its memory. */
static void eng_free(struct eng *e)
{
	if (e->kind == ENG_RESTORE) {
		halite_restore_free(e->r);
	} else {
		halite_session_free(e->s);
		halite_template_free(e->t);
		remove_mem();
	}
	for (uint32_t i = 0; i < e->nreg; i++)
		if (e->mem[i])
			munmap(e->mem[i], e->len[i]);
	e->r = NULL;
	e->t = NULL;
	e->s = NULL;
	memset(e->mem, 0, sizeof(e->mem));
}

/* ---------------------------------------------------------------------- */
/* Guest threads and children                                               */

/* A guest thread reading one byte at @addr: it returns only if the engine serves it. */
struct toucher {
	const volatile uint8_t *addr;
	_Atomic int started, returned;
	_Atomic pid_t tid;
	uint8_t got;
};

static void *toucher_main(void *arg)
{
	struct toucher *t = arg;

	atomic_store(&t->tid, (pid_t)syscall(SYS_gettid));
	atomic_store(&t->started, 1);
	t->got = *t->addr;
	atomic_store(&t->returned, 1);
	return NULL;
}

static int toucher_start(struct toucher *t, const void *addr)
{
	pthread_t th;
	int ret;

	t->addr = addr;
	ret = pthread_create(&th, NULL, toucher_main, t);
	if (ret)
		return -ret;
	pthread_detach(th);
	while (!atomic_load(&t->started))
		r_sleep_us(100);
	return 0;
}

/* What a child saw, in shared memory; the parent asserts. */
#define MAXBLOCKED 4
struct child_res {
	int phase, err, ret;
	char what[256];		/* where it stopped on an unexpected error */
	char msg[512];
	uint64_t mismatches, checked, retries;
	uint64_t present;	/* pages of blocks that must never be installed, present */
	uint32_t nblocked;
	struct toucher t[MAXBLOCKED];
	char tstate[MAXBLOCKED];
};

static void child_fail(struct child_res *res, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4), noreturn));

static void child_fail(struct child_res *res, int err, const char *fmt, ...)
{
	va_list ap;

	res->err = err ? err : -EIO;
	va_start(ap, fmt);
	vsnprintf(res->what, sizeof(res->what), fmt, ap);
	va_end(ap);
	_exit(3);
}

/*
 * Runs @fn(@e, @arg, @res) in a forked child; it returns having freed @e
 * or not. Returns the child's wait status; fails the test on a hang or
 * an error the child recorded.
 */
static int run_child(void (*fn)(struct eng *, void *, struct child_res *), struct eng *e,
		     void *arg, struct child_res *res, const char *what)
{
	uint64_t t0;
	int st = 0;
	pid_t pid;

	memset(res, 0, sizeof(*res));
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		signal(SIGSEGV, SIG_DFL); /* sanitizers: let it kill the process */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fn(e, arg, res);
		_exit(0);
	}
	for (t0 = r_now_ms(); waitpid(pid, &st, WNOHANG) != pid; r_sleep_us(10000))
		if (r_now_ms() - t0 > 120000) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("%s, %s: the child hung in phase %d", what, eng_name[e->kind],
				 res->phase);
		}
	if (res->err)
		fail_msg("%s, %s: %s: %s", what, eng_name[e->kind], res->what,
			 halite_strerror(res->err));
	return st;
}

/*
 * The child's end where guest threads wait on memory never installed: they
 * never returned, are asleep in the fault, and the engine's free kills them
 * with SIGSEGV (the child must not reach its exit).
 */
static void __attribute__((noreturn)) child_free_blocked(struct eng *e, struct child_res *res)
{
	r_sleep_us(300000);
	for (uint32_t i = 0; i < res->nblocked; i++)
		res->tstate[i] = r_thread_state(getpid(), atomic_load(&res->t[i].tid));
	res->phase = 8;
	eng_free(e);
	r_sleep_us(10000000);
	res->phase = 9; /* the blocked threads were not killed */
	_exit(0);
}

/* The parent's side of child_free_blocked(). */
static void check_blocked(int st, const struct child_res *res, const char *what, int kind)
{
	assert_int_equal(res->phase, 8);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
		fail_msg("%s, %s: after the free the blocked threads' process %s %d, not SIGSEGV",
			 what, eng_name[kind], WIFSIGNALED(st) ? "died of signal" : "exited with",
			 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	assert_true(res->nblocked > 0);
	for (uint32_t i = 0; i < res->nblocked; i++) {
		assert_int_equal(atomic_load(&res->t[i].returned), 0);
		if (res->tstate[i] != 'S' && res->tstate[i] != 'D')
			fail_msg("%s, %s: blocked thread %u in state %c", what, eng_name[kind], i,
				 res->tstate[i]);
	}
	assert_int_equal(res->present, 0);
}

/* ---------------------------------------------------------------------- */
/* 1. Every byte exact                                                      */

struct reader_arg {
	struct eng *e;
	const uint8_t *image;
	uint64_t seed, mismatches, pages;
};

/* Every page of every region once, in a random order, compared with the snapshot. */
static void *read_all(void *arg)
{
	struct reader_arg *a = arg;
	uint64_t x = a->seed | 1, total = 0, *order;

	for (uint32_t i = 0; i < a->e->nreg; i++)
		total += a->e->len[i] / PAGE;
	order = malloc(total * sizeof(*order));
	if (!order)
		abort();
	for (uint64_t i = 0; i < total; i++)
		order[i] = i;
	for (uint64_t i = total - 1; i > 0; i--) {
		uint64_t j = t_rand(&x) % (i + 1), tmp = order[i];

		order[i] = order[j];
		order[j] = tmp;
	}
	for (uint64_t i = 0; i < total; i++) {
		uint64_t p = order[i], off = 0;
		uint32_t r = 0;

		while (p * PAGE >= off + a->e->len[r])
			off += a->e->len[r++];
		a->mismatches +=
			!!memcmp(a->e->mem[r] + (p * PAGE - off), a->image + p * PAGE, PAGE);
		a->pages++;
	}
	free(order);
	return NULL;
}

static void test_exact(void **state)
{
	const int kind = (int)(intptr_t)*state;
	struct eng_opts eo = { 0 };
	struct reader_arg a;
	struct eng e;
	pthread_t th;
	uint64_t off = 0, nkind[3] = { 0 };

	for (uint64_t mb = 0; mb < NMB; mb++)
		nkind[g_kind[mb]]++;
	assert_true(nkind[0] && nkind[1] && nkind[2]);
	eng_init(&e, kind);
	assert_int_equal(eng_open_start(&e, g_snap, &eo), 0);
	assert_int_equal(e.nreg, NREG);
	a = (struct reader_arg){ &e, g_image, g_seed + 1, 0, 0 };
	assert_int_equal(pthread_create(&th, NULL, read_all, &a), 0);
	pthread_join(th, NULL);
	assert_int_equal(a.pages, LEN / PAGE);
	assert_int_equal(a.mismatches, 0);
	assert_int_equal(eng_wait(&e, 30000), 0);
	for (uint32_t i = 0; i < NREG; i++) {
		assert_int_equal(r_uffd_registered(getpid(), (uintptr_t)e.mem[i], e.len[i]), 0);
		assert_memory_equal(e.mem[i], g_image + off, e.len[i]);
		off += e.len[i];
	}
	assert_int_equal(eng_retries(&e), 0);
	eng_free(&e);
}

/* ---------------------------------------------------------------------- */
/* 2. A corrupt locality block                                              */

struct bad_lb {
	const char *file;
	uint64_t lb;
	uint64_t mbs[64];
	uint32_t n;
};

static bool in_lb(const struct bad_lb *b, uint64_t mb)
{
	for (uint32_t i = 0; i < b->n; i++)
		if (b->mbs[i] == mb)
			return true;
	return false;
}

/* Pages of @b's blocks present in this process. */
static uint64_t lb_present(const struct eng *e, const struct bad_lb *b)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < b->n; i++)
		n += (uint64_t)r_pages_present(getpid(), (uintptr_t)eng_mb(e, b->mbs[i]),
					       MB_SIZE, NULL);
	return n;
}

/* Every page of a block not in @b: read and compared. */
static void read_others(struct eng *e, const struct bad_lb *b, struct child_res *res)
{
	for (uint64_t mb = 0; mb < NMB; mb++) {
		if (in_lb(b, mb))
			continue;
		res->mismatches += !!memcmp(eng_mb(e, mb), g_image + mb * MB_SIZE, MB_SIZE);
		res->checked++;
	}
}

static void corrupt_child(struct eng *e, void *arg, struct child_res *res)
{
	const struct bad_lb *b = arg;
	struct eng_opts eo = { 0 };
	int ret;

	ret = eng_open_start(e, b->file, &eo);
	if (ret)
		child_fail(res, ret, "open and start");
	res->phase = 1;
	read_others(e, b, res);
	res->phase = 2;
	/* Two threads on the bad LB: its first block and its last. */
	if (toucher_start(&res->t[0], eng_mb(e, b->mbs[0]) + 40) ||
	    toucher_start(&res->t[1], eng_mb(e, b->mbs[b->n - 1]) + MB_SIZE - 1))
		child_fail(res, -EAGAIN, "a guest thread");
	res->nblocked = 2;
	res->ret = eng_wait(e, 20000);
	snprintf(res->msg, sizeof(res->msg), "%s", eng_errmsg(e));
	res->retries = eng_retries(e);
	res->phase = 3;
	r_sleep_us(300000);
	res->present = lb_present(e, b);
	child_free_blocked(e, res);
}

/* An LB in the second half of the file of 2 stored blocks or more, and its members. */
static void pick_lb(const char *file, struct bad_lb *b, struct halite_lb_info *li)
{
	struct halite_reader *rd;
	const uint64_t *mbs;

	assert_int_equal(halite_reader_open(&rd, file, NULL), 0);
	for (b->lb = halite_reader_info(rd)->lb_count / 2; b->lb < halite_reader_info(rd)->lb_count;
	     b->lb++) {
		assert_int_equal(halite_reader_lb_members(rd, b->lb, &mbs, &b->n), 0);
		if (b->n >= 2 && b->n <= 64)
			break;
	}
	assert_true(b->n >= 2 && b->n <= 64);
	memcpy(b->mbs, mbs, b->n * sizeof(*mbs));
	assert_int_equal(halite_reader_lb_info(rd, b->lb, li), 0);
	halite_reader_free(rd);
}

/*
 * A copy of the snapshot at @path with one byte of @b's LB payload flipped;
 * its offset. The LB's entry in *@li.
 */
static uint64_t corrupt_copy(const char *path, struct bad_lb *b, struct halite_lb_info *li)
{
	uint64_t off;

	pick_lb(g_snap, b, li);
	b->file = path;
	assert_int_equal(r_copy_file(g_snap, path), 0);
	off = li->offset + li->used / 2;
	assert_int_equal(r_flip_byte(path, off, 0x10), 0);
	return off;
}

static void test_corrupt_lb(void **state)
{
	const int kind = (int)(intptr_t)*state;
	struct child_res *res = r_shared_alloc(sizeof(*res));
	char *path = scratch("corrupt.hlt");
	struct halite_lb_info li;
	struct bad_lb b;
	struct eng e;
	int st;

	corrupt_copy(path, &b, &li);
	eng_init(&e, kind);
	st = run_child(corrupt_child, &e, &b, res, "corrupt LB");
	fprintf(stderr, "  %s: LB %llu: %s; \"%s\"; %llu retries\n", eng_name[kind],
		(unsigned long long)b.lb, halite_strerror(res->ret), res->msg,
		(unsigned long long)res->retries);
	/* The other LBs' pages: every byte the snapshot's. */
	assert_int_equal(res->checked, NMB - b.n);
	assert_int_equal(res->mismatches, 0);
	assert_int_equal(res->ret, -HALITE_E_LB_CHECKSUM);
	if (!r_names_lb(res->msg, b.lb) || !strstr(res->msg, "locality block"))
		fail_msg("%s: the message \"%s\" does not name locality block %llu", eng_name[kind],
			 res->msg, (unsigned long long)b.lb);
	/* Read again as often as the default says (2) before failing. */
	assert_int_equal(res->retries, 2);
	check_blocked(st, res, "corrupt LB", kind);
	unlink(path);
	free(path);
	r_shared_free(res, sizeof(*res));
}

/* ---------------------------------------------------------------------- */
/* 3. A read failure that goes away                                         */

struct retry_arg {
	struct bad_lb b;
	uint64_t off;		/* the flipped byte */
	int map_fd;
	uint8_t *map;		/* the file, for mincore */
	struct halite_lb_info li;
	bool cached;		/* the file system keeps the file cached: cannot tell a read */
};

/* Whether any page of the LB is in the page cache. */
static bool lb_cached(const struct retry_arg *a)
{
	uint64_t first = a->li.offset / PAGE, last = (a->li.offset + a->li.used - 1) / PAGE;
	unsigned char vec[64];

	if (last - first + 1 > sizeof(vec) ||
	    mincore(a->map + first * PAGE, (last - first + 1) * PAGE, vec))
		return true;
	for (uint64_t p = 0; p <= last - first; p++)
		if (vec[p] & 1)
			return true;
	return false;
}

static void uncache(struct retry_arg *a)
{
	fdatasync(a->map_fd);
	posix_fadvise(a->map_fd, 0, 0, POSIX_FADV_DONTNEED);
}

/*
 * Each LB read returns after 500 ms: the engine reads the bad LB (its
 * pages come into the page cache), and before the 500 ms are over the
 * byte is put back, so the read fails its checksum and the re-read (from
 * the device: the engine drops the cached copy, or reads the fixed page)
 * verifies. Exactly one retry; every byte exact.
 */
static void retry_child(struct eng *e, void *arg, struct child_res *res)
{
	struct retry_arg *a = arg;
	struct eng_opts eo = { .latency_us = 500000 };
	uint64_t t0;
	int ret;

	ret = eng_open_start(e, a->b.file, &eo);
	if (ret)
		child_fail(res, ret, "open and start");
	uncache(a);
	if (lb_cached(a)) {
		a->cached = true;
		res->phase = 7;
		eng_free(e);
		_exit(0);
	}
	res->phase = 1;
	if (toucher_start(&res->t[0], eng_mb(e, a->b.mbs[0]) + 40))
		child_fail(res, -EAGAIN, "a guest thread");
	for (t0 = r_now_ms(); !lb_cached(a); r_sleep_us(200))
		if (r_now_ms() - t0 > 5000)
			child_fail(res, -ETIMEDOUT, "the engine never read LB %llu",
				   (unsigned long long)a->b.lb);
	r_sleep_us(50000);
	ret = r_flip_byte(a->b.file, a->off, 0x10);
	if (ret)
		child_fail(res, ret, "putting the byte back");
	res->phase = 2;
	for (t0 = r_now_ms(); !atomic_load(&res->t[0].returned); r_sleep_us(1000))
		if (r_now_ms() - t0 > 20000)
			child_fail(res, eng_wait(e, 0), "the fault on the LB never returned (%s)",
				   eng_errmsg(e));
	res->phase = 3;
	for (uint64_t mb = 0; mb < NMB; mb++) {
		res->mismatches += !!memcmp(eng_mb(e, mb), g_image + mb * MB_SIZE, MB_SIZE);
		res->checked++;
	}
	res->ret = eng_wait(e, 30000);
	snprintf(res->msg, sizeof(res->msg), "%s", eng_errmsg(e));
	res->retries = eng_retries(e);
	res->phase = 4;
	eng_free(e);
}

static void test_read_retry(void **state)
{
	const int kind = (int)(intptr_t)*state;
	struct child_res *res = r_shared_alloc(sizeof(*res));
	struct retry_arg *a = r_shared_alloc(sizeof(*a));
	char *path = scratch("retry.hlt");
	struct eng e;
	int st;

	/*
	 * The byte is put back once the LB's pages are in the page cache, a
	 * little later than the read that brought them; should the read
	 * still have seen the good byte (no retry: nothing was tested), the
	 * run is made again, up to three times.
	 */
	for (int attempt = 1; attempt <= 3; attempt++) {
		memset(a, 0, sizeof(*a));
		a->off = corrupt_copy(path, &a->b, &a->li);
		a->map_fd = open(path, O_RDWR | O_CLOEXEC);
		assert_true(a->map_fd >= 0);
		a->map = mmap(NULL, r_file_size(path), PROT_READ, MAP_SHARED, a->map_fd, 0);
		assert_true(a->map != MAP_FAILED);
		eng_init(&e, kind);
		st = run_child(retry_child, &e, a, res, "read retry");
		munmap(a->map, r_file_size(path));
		close(a->map_fd);
		if (a->cached) {
			fprintf(stderr, "  %s: the file system keeps %s cached: a read cannot be "
				"seen\n", eng_name[kind], path);
			unlink(path);
			skip();
		}
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		assert_int_equal(res->phase, 4);
		fprintf(stderr, "  %s: LB %llu: %s; %llu retries\n", eng_name[kind],
			(unsigned long long)a->b.lb, halite_strerror(res->ret),
			(unsigned long long)res->retries);
		/* Every byte exact, the one the thread read included, and done. */
		assert_int_equal(atomic_load(&res->t[0].returned), 1);
		assert_int_equal(res->t[0].got, g_image[a->b.mbs[0] * MB_SIZE + 40]);
		assert_int_equal(res->checked, NMB);
		assert_int_equal(res->mismatches, 0);
		assert_int_equal(res->ret, 0);
		if (res->retries)
			break;
	}
	/* The failed read was read again once, and verified. */
	assert_int_equal(res->retries, 1);
	unlink(path);
	free(path);
	r_shared_free(a, sizeof(*a));
	r_shared_free(res, sizeof(*res));
}

/* ---------------------------------------------------------------------- */
/* 4. A truncated file, a bad header                                        */

static void test_refused_file(void **state)
{
	const int kind = (int)(intptr_t)*state;
	static const char *const what[] = { "truncated to half", "no footer", "bad magic",
					    "a section's checksum" };
	static const int code[] = { -HALITE_E_INCOMPLETE, -HALITE_E_INCOMPLETE,
				    -HALITE_E_BAD_MAGIC, -HALITE_E_CHECKSUM };
	static const char *const says[] = { "incomplete", "incomplete", "not a Halite snapshot",
					    "section index" };
	char *path = scratch("refused.hlt");
	uint64_t size = r_file_size(g_snap);

	for (int k = 0; k < 4; k++) {
		struct eng_opts eo = { 0 };
		struct halite_reader *rd;
		struct eng e;
		int ret;

		assert_int_equal(r_copy_file(g_snap, path), 0);
		if (k == 0)
			assert_int_equal(truncate(path, (off_t)(size / 2)), 0);
		else if (k == 1)
			assert_int_equal(truncate(path, (off_t)(size - 64)), 0);
		else if (k == 2)
			assert_int_equal(r_flip_byte(path, 0, 0xff), 0);
		else {
			uint32_t type;
			uint64_t off, len;

			assert_int_equal(halite_reader_open(&rd, g_snap, NULL), 0);
			for (uint32_t i = 0; i < halite_reader_section_count(rd); i++) {
				assert_int_equal(halite_reader_section(rd, i, &type, &off, &len),
						 0);
				/* 1.1: open verifies the index (the map's chunks on use). */
				if (type == HALITE_SECTION_INDEX)
					assert_int_equal(r_flip_byte(path, off + len / 2, 0x40), 0);
			}
			halite_reader_free(rd);
		}
		/* The reader's own code, which both engines must return. */
		assert_int_equal(halite_reader_open(&rd, path, NULL), code[k]);
		eng_init(&e, kind);
		ret = eng_open(&e, path, &eo);
		fprintf(stderr, "  %s, %s: %s; \"%.*s\"\n", eng_name[kind], what[k],
			halite_strerror(ret), (int)(e.log.len ? e.log.len - 1 : 0), e.log.buf);
		if (ret != code[k])
			fail_msg("%s, %s: open returned %d (%s), expected %d (%s)", eng_name[kind],
				 what[k], ret, halite_strerror(ret), code[k],
				 halite_strerror(code[k]));
		/* Nothing opened, and a message naming the file and the reader's reason. */
		assert_null(e.r);
		assert_null(e.t);
		if (!r_log_has(&e.log, path) || !r_log_has(&e.log, says[k]))
			fail_msg("%s, %s: the message \"%s\" does not name %s and \"%s\"",
				 eng_name[kind], what[k], e.log.buf, path, says[k]);
		eng_free(&e);
		/* No memory file left behind by a refused template. */
		assert_int_equal(access(g_mem, F_OK), -1);
	}
	unlink(path);
	free(path);
}

/* ---------------------------------------------------------------------- */
/* 5. Format 1.1: a damaged index chunk                                     */

struct chunk_arg {
	const char *file;
	const uint8_t *img;
	struct bad_lb bad; /* blocks of the damaged chunk touched (never installed) */
};

static void chunk_child(struct eng *e, void *arg, struct child_res *res)
{
	struct chunk_arg *a = arg;
	struct halite_reader *rd;
	struct eng_opts eo = { 0 };
	int ret;

	ret = eng_open_start(e, a->file, &eo);
	if (ret)
		child_fail(res, ret, "open and start");
	ret = halite_reader_open(&rd, a->file, NULL);
	if (ret)
		child_fail(res, ret, "the reader");
	res->phase = 1;
	/*
	 * Every block of the good chunk, bytes compared. A block of it whose
	 * LB holds blocks of the damaged chunk cannot be looked up either (the
	 * LB's member list is checked against their entries): skipped.
	 */
	for (uint64_t mb = 0; mb < 8192; mb++) {
		struct halite_mb_loc loc;

		if (halite_reader_mb_lookup(rd, mb, &loc))
			continue;
		res->mismatches +=
			!!memcmp(eng_mb(e, mb), a->img + mb * R_CHUNKED_MB, R_CHUNKED_MB);
		res->checked++;
	}
	halite_reader_free(rd);
	res->phase = 2;
	/* Then a zero, a never-touched and a stored block of the damaged chunk. */
	for (uint32_t i = 0; i < a->bad.n; i++)
		if (toucher_start(&res->t[i], eng_mb(e, a->bad.mbs[i]) + 100))
			child_fail(res, -EAGAIN, "a guest thread");
	res->nblocked = a->bad.n;
	res->ret = eng_wait(e, 20000);
	snprintf(res->msg, sizeof(res->msg), "%s", eng_errmsg(e));
	res->phase = 3;
	r_sleep_us(300000);
	for (uint32_t i = 0; i < a->bad.n; i++)
		res->present += (uint64_t)r_pages_present(
			getpid(), (uintptr_t)eng_mb(e, a->bad.mbs[i]), R_CHUNKED_MB, NULL);
	child_free_blocked(e, res);
}

static void test_damaged_chunk(void **state)
{
	const int kind = (int)(intptr_t)*state;
	struct child_res *res = r_shared_alloc(sizeof(*res));
	struct chunk_arg a = { .bad = { .mbs = { 8192 + 8, 8192 + 9, 8192 + 10 }, .n = 3 } };
	struct halite_reader *rd;
	char *path = scratch("chunked.hlt");
	uint64_t good = 0;
	uint8_t *img = NULL;
	struct eng e;
	int st;

	assert_int_equal(r_write_chunked(path, &img), 0);
	assert_int_equal(r_damage_map_entry(path, 8192 + 7), 0);
	assert_int_equal(r_chunked_kind(a.bad.mbs[0]), 1);
	assert_int_equal(r_chunked_kind(a.bad.mbs[1]), 0);
	assert_int_equal(r_chunked_kind(a.bad.mbs[2]), 2);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	for (uint64_t mb = 0; mb < 8192; mb++) {
		struct halite_mb_loc loc;

		good += !halite_reader_mb_lookup(rd, mb, &loc);
	}
	halite_reader_free(rd);
	assert_true(good > 8192 - 256);
	a.file = path;
	a.img = img;
	eng_init(&e, kind);
	st = run_child(chunk_child, &e, &a, res, "damaged chunk");
	fprintf(stderr, "  %s: %s; \"%s\"\n", eng_name[kind], halite_strerror(res->ret), res->msg);
	assert_int_equal(res->checked, good);
	assert_int_equal(res->mismatches, 0);
	assert_int_equal(res->ret, -HALITE_E_CHECKSUM);
	if (!strstr(res->msg, "mb-map chunk 1 ") || !strstr(res->msg, "checksum mismatch"))
		fail_msg("%s: the message \"%s\" does not name mb-map chunk 1", eng_name[kind],
			 res->msg);
	check_blocked(st, res, "damaged chunk", kind);
	free(img);
	unlink(path);
	free(path);
	r_shared_free(res, sizeof(*res));
}

/* ---------------------------------------------------------------------- */
/* 6. The guest discards a page during the restore                         */

/* The first stored block at or after @from. */
static uint64_t stored_from(uint64_t from)
{
	while (from < NMB && g_kind[from] != 2)
		from++;
	assert_true(from < NMB);
	return from;
}

/*
 * Private anonymous memory (restore): a discarded page reads zeros from
 * then on, before or after the engine installed it. A private mapping of
 * the template file (clone): the kernel maps the file's page again, so it
 * reads the snapshot's bytes and the clone's own writes to it are gone
 * (madvise(2); session.c).
 */
static void test_discard(void **state)
{
	const int kind = (int)(intptr_t)*state;
	const uint64_t a = stored_from(NMB / 4), b = stored_from(NMB / 2);
	const uint64_t c = stored_from(3 * NMB / 4);
	static uint8_t zero[MB_SIZE];
	struct eng_opts eo = { 0 };
	const uint8_t *want;
	struct eng e;
	uint8_t *pa, *pb, *pc;

	eng_init(&e, kind);
	assert_int_equal(eng_open_start(&e, g_snap, &eo), 0);
	pa = eng_mb(&e, a);
	pb = eng_mb(&e, b);
	pc = eng_mb(&e, c);
	/* a: its second page discarded before the block was ever read. */
	assert_int_equal(madvise(pa + PAGE, PAGE, MADV_DONTNEED), 0);
	assert_memory_equal(pa, g_image + a * MB_SIZE, PAGE);
	want = kind == ENG_RESTORE ? zero : g_image + a * MB_SIZE + PAGE;
	assert_memory_equal(pa + PAGE, want, PAGE);
	/* b: read (installed), written, then wholly discarded. */
	assert_memory_equal(pb, g_image + b * MB_SIZE, MB_SIZE);
	pb[7] ^= 0xff;
	assert_int_equal(madvise(pb, MB_SIZE, MADV_DONTNEED), 0);
	want = kind == ENG_RESTORE ? zero : g_image + b * MB_SIZE;
	assert_memory_equal(pb, want, MB_SIZE);
	/* c: read, then its second page discarded: the first keeps its bytes. */
	assert_memory_equal(pc, g_image + c * MB_SIZE, MB_SIZE);
	assert_int_equal(madvise(pc + PAGE, PAGE, MADV_DONTNEED), 0);
	assert_memory_equal(pc, g_image + c * MB_SIZE, PAGE);
	want = kind == ENG_RESTORE ? zero : g_image + c * MB_SIZE + PAGE;
	assert_memory_equal(pc + PAGE, want, PAGE);
	/* The rest: every byte the snapshot's, and the restore completes. */
	for (uint64_t mb = 0; mb < NMB; mb++)
		if (mb != a && mb != b && mb != c)
			assert_memory_equal(eng_mb(&e, mb), g_image + mb * MB_SIZE, MB_SIZE);
	assert_int_equal(eng_wait(&e, 30000), 0);
	/* Done, unregistered: the discarded pages read as they did. */
	want = kind == ENG_RESTORE ? zero : g_image + a * MB_SIZE + PAGE;
	assert_memory_equal(pa + PAGE, want, PAGE);
	want = kind == ENG_RESTORE ? zero : g_image + b * MB_SIZE;
	assert_memory_equal(pb, want, MB_SIZE);
	eng_free(&e);
}

/* ---------------------------------------------------------------------- */
/* 7. Misuse                                                                */

/* Starts the engine with the regions @reg (eng_open()'s, changed): the code. */
static int start_with(struct eng *e, const struct halite_session_region *reg, uint32_t n,
		      unsigned flags)
{
	struct halite_restore_region rr[NREG + 1];
	HALITE_OPTS(halite_restore_opts, ro);
	HALITE_OPTS(halite_session_opts, so);
	struct halite_restore *r = (struct halite_restore *)(uintptr_t)0x1;
	struct halite_session *s = (struct halite_session *)(uintptr_t)0x1;
	int ret;

	r_log_reset(&e->log);
	if (e->kind == ENG_CLONE) {
		char why[512] = "";

		so.owner_uffd = -1;
		so.flags = flags;
		so.errbuf = why;
		so.errbuf_len = sizeof(why);
		ret = halite_session_start(&s, e->t, reg, n, &so);
		/* Out-parameters are written only on success. */
		assert_ptr_equal(s, (void *)(uintptr_t)0x1);
		/* A refusal explains itself in errbuf (the session is gone): kept as if logged. */
		if (ret)
			r_log_fn(&e->log, HALITE_LOG_WARN, why);
		assert_true(!ret || why[0]);
		return ret;
	}
	for (uint32_t i = 0; i < n; i++)
		rr[i] = (struct halite_restore_region){ reg[i].name, reg[i].host, reg[i].length,
							HALITE_MEM_ANON, -1, 0 };
	ro.flags = flags;
	ro.log = r_log_fn;
	ro.log_ctx = &e->log;
	ro.log_level = HALITE_LOG_WARN;
	ret = halite_restore_open(&r, g_snap, rr, n, &ro);
	assert_ptr_equal(r, (void *)(uintptr_t)0x1);
	return ret;
}

static void test_misuse(void **state)
{
	const int kind = (int)(intptr_t)*state;
	/* An unknown flag bit of each engine's start. */
	const unsigned bad_flag = kind == ENG_RESTORE ? HALITE_RESTORE_FLAGS_ALL + 1 :
						       HALITE_SESSION_FLAGS_ALL + 1;
	struct halite_session_region reg[NREG + 1];
	struct eng_opts eo = { 0 };
	struct eng e;

	eng_init(&e, kind);
	assert_int_equal(eng_open(&e, g_snap, &eo), 0);
	if (kind == ENG_RESTORE) {
		/* Only its memory is wanted: each case below opens a restore of its own. */
		halite_restore_free(e.r);
		e.r = NULL;
	}
	for (uint32_t i = 0; i < NREG; i++)
		reg[i] = (struct halite_session_region){ e.name[i], (uintptr_t)e.mem[i], e.len[i] };

	/* No regions, an unknown flag. */
	assert_int_equal(start_with(&e, reg, 0, 0), -EINVAL);
	assert_int_equal(start_with(&e, reg, NREG, bad_flag), -EINVAL);
	/* A region one page short, one given twice, a host address not page aligned. */
	reg[1].length -= PAGE;
	assert_int_equal(start_with(&e, reg, NREG, 0), -EINVAL);
	reg[1].length += PAGE;
	reg[1] = reg[0];
	assert_int_equal(start_with(&e, reg, NREG, 0), -EINVAL);
	reg[1] = (struct halite_session_region){ e.name[1], (uintptr_t)e.mem[1] + 8, e.len[1] };
	assert_int_equal(start_with(&e, reg, NREG, 0), -EINVAL);
	reg[1].host -= 8;
	/*
	 * A region the file does not have: the restore says "no such region"
	 * (restore.h), a session -EINVAL ("bad regions", template.h).
	 */
	reg[1].name = "pc.rom";
	assert_int_equal(start_with(&e, reg, NREG, 0),
			 kind == ENG_RESTORE ? -HALITE_E_NOT_FOUND : -EINVAL);
	reg[1].name = e.name[1];
	/* Waiting on nothing is -EINVAL; freeing nothing is fine. */
	if (kind == ENG_RESTORE) {
		assert_int_equal(halite_restore_wait(NULL, 0), -EINVAL);
		halite_restore_free(NULL);
	} else {
		assert_int_equal(halite_session_wait(NULL, 0), -EINVAL);
		halite_session_free(NULL);
		halite_template_free(NULL);
	}
	/* After all that, the memory is unregistered. */
	for (uint32_t i = 0; i < NREG; i++)
		assert_int_equal(r_uffd_registered(getpid(), reg[i].host, reg[i].length), 0);
	eng_free(&e);
}

/*
 * Misuse, the message: a region that does not match the file's is refused
 * with a message naming it, which the caller can read (failure-model.md,
 * "Misuse of the API": a clear error code and message).
 */
static void test_misuse_message(void **state)
{
	const int kind = (int)(intptr_t)*state;
	struct halite_session_region reg[NREG];
	struct eng_opts eo = { 0 };
	struct eng e;

	eng_init(&e, kind);
	assert_int_equal(eng_open(&e, g_snap, &eo), 0);
	halite_restore_free(e.r);
	e.r = NULL;
	for (uint32_t i = 0; i < NREG; i++)
		reg[i] = (struct halite_session_region){ e.name[i], (uintptr_t)e.mem[i], e.len[i] };
	reg[1].length -= PAGE;
	assert_int_equal(start_with(&e, reg, NREG, 0), -EINVAL);
	if (!r_log_has(&e.log, g_rname[1]))
		fail_msg("%s: the message \"%s\" does not name %s", eng_name[kind], e.log.buf,
			 g_rname[1]);
	reg[1].length += PAGE;
	reg[1].name = "pc.rom";
	/* The restore: "no such region" (restore.h); a session: -EINVAL (template.h). */
	assert_int_equal(start_with(&e, reg, NREG, 0),
			 kind == ENG_RESTORE ? -HALITE_E_NOT_FOUND : -EINVAL);
	if (!r_log_has(&e.log, "pc.rom"))
		fail_msg("%s: the message \"%s\" does not name pc.rom", eng_name[kind], e.log.buf);
	eng_free(&e);
}

/* ---------------------------------------------------------------------- */

static int setup(void **state)
{
	remove_mem();
	return 0;
}

static int teardown(void **state)
{
	remove_mem();
	return 0;
}

/* Each case twice, its state the engine, named for it. */
#define BOTH(fn)                                                                 \
	{ #fn " (restore)", fn, setup, teardown, (void *)(intptr_t)ENG_RESTORE }, \
	{ #fn " (clone)", fn, setup, teardown, (void *)(intptr_t)ENG_CLONE }

int main(void)
{
	const struct CMUnitTest tests[] = {
		BOTH(test_exact),	  BOTH(test_corrupt_lb), BOTH(test_read_retry),
		BOTH(test_refused_file), BOTH(test_damaged_chunk), BOTH(test_discard),
		BOTH(test_misuse),	  BOTH(test_misuse_message),
	};
	struct halite_uffd_caps caps;
	char *snap;
	int ret;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_MINOR_SHMEM) ||
	    !(caps.features & UFFD_FEATURE_THREAD_ID)) {
		fprintf(stderr, "no userfaultfd with MINOR_SHMEM and THREAD_ID: skipped\n");
		return 77;
	}
	g_seed = t_seed("test_both");
	snap = scratch("both.hlt");
	snprintf(g_snap, sizeof(g_snap), "%s", snap);
	free(snap);
	snprintf(g_mem, sizeof(g_mem), "/dev/shm/halite-both-%d.mem", (int)getpid());
	make_snapshot();
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(g_snap);
	free(g_image);
	remove_mem();
	return ret;
}
