/* SPDX-License-Identifier: MIT */
/*
 * Smoke test of the lazy restore engine (halite/restore.h), on a file the
 * writer makes: two regions, random, compressible, zero and never-touched
 * memory blocks saved in random order into three streams, 16 KiB locality
 * blocks so that there are a few hundred of them.
 * - prefetch on: two threads read every page in their own random order while
 *   the prefetcher runs, into private anonymous memory and into memfd
 *   memory; every byte equals the source, every block is counted exactly
 *   once, every LB read exactly once;
 * - demand only: one thread touches one page of each LB in file order;
 *   faults, blocks and LBs are counted exactly, and the trace says so;
 * - a corrupt LB: the thread touching it never returns, the restore fails
 *   with the LB's checksum after two more reads and names it, none of its
 *   pages is present, and freeing the restore turns the blocked thread's
 *   access into SIGSEGV.
 * The thorough tests are test_restore.c.
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
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "test_util.h"
#include "uffd.h"

#define PAGE 4096u
#define MB_SIZE (2 * PAGE)
#define LB_SIZE 16384u
#define NREG 2
#define WAIT_MS 60000

static uint64_t g_seed;

struct img {
	const char *name[NREG];
	size_t len[NREG];
	uint8_t *src[NREG];	 /* what the restored memory must hold */
	char path[512];
	uint64_t mb_total, lb_total, mb_stored, mb_holes;
};

static void img_make(struct img *im, const char *file)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region regs[NREG];
	struct halite_writer *w;
	struct halite_reader *rd;
	uint64_t seed = g_seed, n, *order;
	uint8_t *data;

	*im = (struct img){ .name = { "ram0", "ram1" }, .len = { 6u << 20, 2u << 20 } };
	snprintf(im->path, sizeof(im->path), "%s/%s", t_tmpdir(), file);
	for (int i = 0; i < NREG; i++) {
		im->src[i] = calloc(1, im->len[i]);
		assert_non_null(im->src[i]);
		regs[i] = (struct halite_region){ im->name[i], (uint64_t)i << 30, im->len[i] };
	}
	wo.lb_size = LB_SIZE;
	wo.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, im->path, regs, NREG, &wo), 0);
	n = halite_writer_mb_count(w);
	order = malloc(n * sizeof(*order));
	assert_non_null(order);
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = t_rand(&seed) % i, t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	for (uint64_t i = 0; i < n; i++) {
		uint64_t mb = order[i], per0 = im->len[0] / MB_SIZE;
		unsigned kind = (unsigned)(t_rand(&seed) % 8);
		uint32_t stream = HALITE_STREAM(i % 3 == 2 ? HALITE_STREAM_PHYSICAL
							   : HALITE_STREAM_VCPU, i % 3);

		data = mb < per0 ? im->src[0] + mb * MB_SIZE : im->src[1] + (mb - per0) * MB_SIZE;
		if (kind < 2)
			continue; /* never touched: zeros, never put */
		if (kind == 2) {
			assert_int_equal(halite_writer_put(w, stream, mb, data), 0); /* zero */
			continue;
		}
		t_fill(data, MB_SIZE, kind == 3 ? 100 : 50, &seed);
		assert_int_equal(halite_writer_put(w, stream, mb, data), 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
	free(order);
	assert_int_equal(halite_reader_open(&rd, im->path, NULL), 0);
	im->mb_total = halite_reader_info(rd)->mb_count;
	im->lb_total = halite_reader_info(rd)->lb_count;
	im->mb_stored = halite_reader_info(rd)->mb_stored;
	im->mb_holes = halite_reader_info(rd)->mb_zero + halite_reader_info(rd)->mb_untouched;
	assert_true(im->lb_total > 100);
	assert_true(im->mb_holes > 100);
	halite_reader_free(rd);
}

static void img_free(struct img *im)
{
	unlink(im->path);
	for (int i = 0; i < NREG; i++)
		free(im->src[i]);
}

/*
 * Empty guest memory: private anonymous, or a memfd's when @fd (which gets
 * the memfd, for the engine; the caller closes it).
 */
static uint8_t *mem_map(size_t len, int *fd)
{
	void *p;

	if (fd) {
		*fd = memfd_create("halite-restore-smoke", MFD_CLOEXEC);
		assert_true(*fd >= 0);
		assert_int_equal(ftruncate(*fd, (off_t)len), 0);
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	} else {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	}
	assert_true(p != MAP_FAILED);
	return p;
}

/* @fds: the memfds of shared memory, or NULL for anonymous memory. */
static void regions(const struct img *im, uint8_t *const mem[NREG], const int *fds,
		    struct halite_restore_region *reg)
{
	for (int i = 0; i < NREG; i++)
		reg[i] = (struct halite_restore_region){
			im->name[i], (uintptr_t)mem[i], im->len[i],
			fds ? HALITE_MEM_SHARED : HALITE_MEM_ANON, fds ? fds[i] : -1, 0,
		};
}

static uint8_t *mb_addr(const struct img *im, uint8_t *const mem[NREG], uint64_t mb)
{
	uint64_t per0 = im->len[0] / MB_SIZE;

	return mb < per0 ? mem[0] + mb * MB_SIZE : mem[1] + (mb - per0) * MB_SIZE;
}

static void log_stats(const char *what, const struct halite_restore_stats *st)
{
	fprintf(stderr,
		"%s: faults %llu (cached %llu, zero %llu, vcpu %llu), LBs %llu demand + %llu "
		"prefetch of %llu, MBs %llu fault + %llu pool + %llu prefetch + %llu zero of %llu, "
		"fault p50 %llu us p99 %llu us, ready %llu us, %llu ms\n",
		what, (unsigned long long)st->faults, (unsigned long long)st->faults_cached,
		(unsigned long long)st->faults_zero, (unsigned long long)st->faults_vcpu,
		(unsigned long long)st->lb_demand, (unsigned long long)st->lb_prefetch,
		(unsigned long long)st->lb_total, (unsigned long long)st->mb_fault,
		(unsigned long long)st->mb_pool, (unsigned long long)st->mb_prefetch,
		(unsigned long long)st->mb_zero, (unsigned long long)st->mb_total,
		(unsigned long long)st->fault_p50_ns / 1000,
		(unsigned long long)st->fault_p99_ns / 1000, (unsigned long long)st->ready_ns / 1000,
		(unsigned long long)st->duration_ns / 1000000);
}

/* ---- threads that touch guest memory ---- */

struct toucher {
	pthread_t thr;
	_Atomic pid_t tid;
	_Atomic int go, returned, segv;
	volatile uint8_t **pages; /* the order to read them in */
	size_t npages;
	uint64_t sum;
};

/*
 * Set while a toucher expects SIGSEGV. Volatile: to the compiler, the store
 * before the read loop is otherwise dead (nothing in the loop reads it).
 */
static __thread sigjmp_buf *volatile t_jmp;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	if (t_jmp)
		siglongjmp(*t_jmp, 1);
	signal(sig, SIG_DFL); /* not ours: crash as usual on return */
}

static void *toucher_main(void *arg)
{
	struct toucher *t = arg;
	sigjmp_buf jb;

	atomic_store(&t->tid, gettid());
	while (!atomic_load(&t->go))
		usleep(100);
	if (sigsetjmp(jb, 1)) {
		t_jmp = NULL;
		atomic_store(&t->segv, 1);
		return NULL;
	}
	t_jmp = &jb;
	for (size_t i = 0; i < t->npages; i++)
		t->sum += *t->pages[i];
	t_jmp = NULL;
	atomic_store(&t->returned, 1);
	return NULL;
}

static void toucher_start(struct toucher *t)
{
	assert_int_equal(pthread_create(&t->thr, NULL, toucher_main, t), 0);
	while (!atomic_load(&t->tid))
		usleep(100);
}

/* Every page of both regions, in an order of this toucher's own. */
static void all_pages_shuffled(struct toucher *t, const struct img *im, uint8_t *const mem[NREG],
			       uint64_t *seed)
{
	size_t n = 0;

	t->npages = (im->len[0] + im->len[1]) / PAGE;
	t->pages = malloc(t->npages * sizeof(*t->pages));
	assert_non_null(t->pages);
	for (int r = 0; r < NREG; r++)
		for (size_t off = 0; off < im->len[r]; off += PAGE)
			t->pages[n++] = mem[r] + off;
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)(t_rand(seed) % i);
		volatile uint8_t *p = t->pages[i - 1];

		t->pages[i - 1] = t->pages[j];
		t->pages[j] = p;
	}
}

/* ---- the cases ---- */

static void run_prefetch(bool shared)
{
	struct img im;
	uint8_t *mem[NREG];
	struct halite_restore_region reg[NREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct toucher t[2] = { 0 };
	pid_t tids[2];
	int fds[NREG];
	uint64_t seed = g_seed ^ 0x5bd1e995;

	img_make(&im, shared ? "prefetch-shared.hlt" : "prefetch-anon.hlt");
	for (int i = 0; i < NREG; i++)
		mem[i] = mem_map(im.len[i], shared ? &fds[i] : NULL);
	for (int i = 0; i < 2; i++) {
		all_pages_shuffled(&t[i], &im, mem, &seed);
		toucher_start(&t[i]);
		tids[i] = atomic_load(&t[i].tid);
	}
	regions(&im, mem, shared ? fds : NULL, reg);
	o.vcpu_tids = tids;
	o.nvcpus = 2;
	o.prefetch_idle_us = 500;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, im.path, reg, NREG, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	for (int i = 0; i < 2; i++)
		atomic_store(&t[i].go, 1);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i].thr, NULL);
		assert_true(atomic_load(&t[i].returned));
		free(t[i].pages);
	}
	halite_restore_stats(r, &st);
	log_stats(shared ? "prefetch, memfd" : "prefetch, anonymous", &st);
	assert_true(st.done);
	assert_int_equal(st.error, 0);
	assert_int_equal(st.mb_total, im.mb_total);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_int_equal(st.mb_zero, im.mb_holes);
	assert_int_equal(st.lb_total, im.lb_total);
	assert_int_equal(st.lb_demand + st.lb_prefetch, st.lb_total);
	assert_int_equal(st.lb_retries, 0);
	assert_int_equal(st.bytes_read, st.lb_total * LB_SIZE);
	/* Only the two touchers faulted: the compare below runs after the unregister. */
	assert_int_equal(st.faults_vcpu, st.faults);
	assert_true(st.faults_cached + st.faults_zero <= st.faults);
	assert_true(st.vm_access_pct < 0);
	for (int i = 0; i < NREG; i++) {
		assert_memory_equal(mem[i], im.src[i], im.len[i]);
		munmap(mem[i], im.len[i]);
		if (shared)
			close(fds[i]);
	}
	halite_restore_free(r);
	img_free(&im);
}

static void test_prefetch_anon(void **state)
{
	run_prefetch(false);
}

static void test_prefetch_shared(void **state)
{
	run_prefetch(true);
}

/* The whole of @path as a string (free() it). */
static char *slurp(const char *path)
{
	char *buf = t_slurp(path, NULL);

	assert_non_null(buf);
	return buf;
}

/* docs/restore-trace.md, as demand-only reading of @first[lb] for each LB left it. */
static void check_trace(const char *path, struct halite_restore *r,
			const struct halite_restore_stats *st, const uint64_t *first)
{
	static const char *const names[] = {
		"ready_ns", "duration_ns", "mb_total", "mb_fault", "mb_pool", "mb_prefetch",
		"mb_zero", "faults", "faults_cached", "faults_zero", "faults_vcpu", "lb_total",
		"lb_demand", "lb_prefetch", "lb_retries", "bytes_read", "mb_staged",
		"mb_staged_accessed", "vm_access_pct", "fault_p50_ns", "fault_p99_ns", "done",
		"error", "lb_hot",
	};
	const uint8_t *uuid = halite_reader_info(halite_restore_reader(r))->uuid;
	char *text = slurp(path), *save = NULL, *line, want[128];
	uint64_t lb = 0;
	size_t i = 0;

	line = strtok_r(text, "\n", &save);
	assert_string_equal(line, "halite-restore-trace 1");
	line = strtok_r(NULL, "\n", &save);
	strcpy(want, "file-uuid ");
	for (int k = 0; k < 16; k++)
		sprintf(want + strlen(want), "%02x", uuid[k]);
	assert_string_equal(line, want);
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		line = strtok_r(NULL, "\n", &save);
		assert_non_null(line);
		snprintf(want, sizeof(want), "stat %s ", names[i]);
		assert_memory_equal(line, want, strlen(want));
	}
	for (; (line = strtok_r(NULL, "\n", &save)); lb++) {
		unsigned long long idx, t, fmb;
		unsigned staged, acc;
		char how[16];

		assert_int_equal(sscanf(line, "lb %llu %15s %llu %llu %u %u", &idx, how, &t, &fmb,
					&staged, &acc), 6);
		assert_int_equal(idx, lb);
		assert_string_equal(how, "demand");
		assert_int_equal(fmb, first[lb]);
		assert_int_equal(staged, 0);
		assert_int_equal(acc, 0);
		assert_true(t <= st->duration_ns);
	}
	assert_int_equal(lb, st->lb_total);
	free(text);
	text = slurp(path);
	snprintf(want, sizeof(want), "\nstat faults %llu\n", (unsigned long long)st->faults);
	assert_non_null(strstr(text, want));
	snprintf(want, sizeof(want), "\nstat mb_pool %llu\n", (unsigned long long)st->mb_pool);
	assert_non_null(strstr(text, want));
	assert_non_null(strstr(text, "\nstat vm_access_pct -1.00\nstat fault_p50_ns "));
	assert_non_null(strstr(text, "\nstat done 1\nstat error 0\nstat lb_hot 0\n"));
	free(text);
}

static void test_demand_exact(void **state)
{
	struct img im;
	uint8_t *mem[NREG];
	struct halite_restore_region reg[NREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_reader *rd;
	struct toucher t = { 0 };
	char trace[600];
	uint64_t *first;
	pid_t tid;

	img_make(&im, "demand.hlt");
	snprintf(trace, sizeof(trace), "%s.trace", im.path);
	for (int i = 0; i < NREG; i++)
		mem[i] = mem_map(im.len[i], NULL);
	regions(&im, mem, NULL, reg);
	/* One page of each LB, in file order: the first page of its first block. */
	assert_int_equal(halite_reader_open(&rd, im.path, NULL), 0);
	first = calloc(im.lb_total, sizeof(*first));
	t.pages = calloc(im.lb_total, sizeof(*t.pages));
	assert_true(first && t.pages);
	for (uint64_t lb = 0; lb < im.lb_total; lb++) {
		const uint64_t *mbs;
		uint32_t n;

		assert_int_equal(halite_reader_lb_members(rd, lb, &mbs, &n), 0);
		first[lb] = mbs[0];
		t.pages[lb] = mb_addr(&im, mem, mbs[0]);
	}
	t.npages = im.lb_total;
	halite_reader_free(rd);
	toucher_start(&t);
	tid = atomic_load(&t.tid);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	o.vcpu_tids = &tid;
	o.nvcpus = 1;
	o.trace_path = trace;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, im.path, reg, NREG, &o), 0);
	assert_int_equal(halite_restore_wait(r, 0), -HALITE_E_STATE);
	assert_int_equal(halite_restore_start(r), 0);
	assert_int_equal(halite_restore_start(r), -HALITE_E_STATE);
	/* Nothing touched, nothing prefetched: not done. */
	assert_int_equal(halite_restore_wait(r, 50), -ETIMEDOUT);
	atomic_store(&t.go, 1);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	pthread_join(t.thr, NULL);
	assert_true(atomic_load(&t.returned));
	halite_restore_stats(r, &st);
	log_stats("demand", &st);
	assert_true(st.done);
	assert_int_equal(st.error, 0);
	assert_int_equal(st.faults, im.lb_total);
	assert_int_equal(st.faults_cached, 0);
	assert_int_equal(st.faults_zero, 0);
	assert_int_equal(st.faults_vcpu, im.lb_total);
	assert_int_equal(st.lb_demand, im.lb_total);
	assert_int_equal(st.lb_prefetch, 0);
	assert_int_equal(st.lb_retries, 0);
	assert_int_equal(st.mb_fault, im.lb_total);
	assert_int_equal(st.mb_pool, im.mb_stored - im.lb_total);
	assert_int_equal(st.mb_prefetch, 0);
	assert_int_equal(st.mb_zero, im.mb_holes);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_true(st.fault_p50_ns > 0 && st.fault_p50_ns <= st.fault_p99_ns);
	for (int i = 0; i < NREG; i++)
		assert_memory_equal(mem[i], im.src[i], im.len[i]);
	check_trace(trace, r, &st, first);
	halite_restore_free(r);
	for (int i = 0; i < NREG; i++)
		munmap(mem[i], im.len[i]);
	unlink(trace);
	free(first);
	free(t.pages);
	img_free(&im);
}

/* How many of @lb's stored blocks are resident (both pages). */
static uint32_t lb_resident(struct halite_reader *rd, const struct img *im,
			    uint8_t *const mem[NREG], uint64_t lb, uint32_t *n)
{
	const uint64_t *mbs;
	uint32_t in = 0;

	assert_int_equal(halite_reader_lb_members(rd, lb, &mbs, n), 0);
	for (uint32_t i = 0; i < *n; i++) {
		unsigned char vec[MB_SIZE / PAGE];

		assert_int_equal(mincore(mb_addr(im, mem, mbs[i]), MB_SIZE, vec), 0);
		in += (vec[0] & vec[1] & 1);
	}
	return in;
}

/* Wait until the engine has installed @want blocks other than zero ones. */
static void wait_installed(struct halite_restore *r, uint64_t want, struct halite_restore_stats *st)
{
	for (int i = 0; i < WAIT_MS; i++) {
		halite_restore_stats(r, st);
		if (st->mb_fault + st->mb_pool + st->mb_prefetch >= want)
			return;
		usleep(1000);
	}
	fail_msg("only %llu of %llu blocks installed",
		 (unsigned long long)(st->mb_fault + st->mb_pool + st->mb_prefetch),
		 (unsigned long long)want);
}

/*
 * Stream readahead, without the background prefetcher: a fault on a block
 * of a stream's LB k reads k on demand and its stream's next two LBs ahead
 * (prefetched: installed by the pool, no fault); the LB after them stays
 * unread until a fault asks for it. Counts and residency checked after each
 * touch, and every installed byte against the source.
 */
static void test_readahead(void **state)
{
	struct img im;
	uint8_t *mem[NREG];
	struct halite_restore_region reg[NREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_reader *rd;
	uint64_t chain[6], want = 0;
	uint32_t n[6], nch = 0, stream;
	struct halite_lb_info li;

	img_make(&im, "readahead.hlt");
	for (int i = 0; i < NREG; i++)
		mem[i] = mem_map(im.len[i], NULL);
	regions(&im, mem, NULL, reg);
	/* vCPU 1's stream, its first six LBs in order (file order is seq order). */
	assert_int_equal(halite_reader_open(&rd, im.path, NULL), 0);
	stream = HALITE_STREAM(HALITE_STREAM_VCPU, 1);
	for (uint64_t lb = 0; lb < im.lb_total && nch < 6; lb++) {
		assert_int_equal(halite_reader_lb_info(rd, lb, &li), 0);
		if (li.stream == stream) {
			assert_int_equal(li.seq, nch);
			chain[nch++] = lb;
		}
	}
	assert_int_equal(nch, 6);
	o.flags = HALITE_RESTORE_NO_PREFETCH;
	o.readahead = 2;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, im.path, reg, NREG, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);

	for (int round = 0; round < 2; round++) {
		uint64_t k = (uint64_t)round * 3; /* LBs 0 and 3 of the chain */
		const uint64_t *mbs;
		uint32_t cnt;

		assert_int_equal(halite_reader_lb_members(rd, chain[k], &mbs, &cnt), 0);
		(void)*(volatile uint8_t *)mb_addr(&im, mem, mbs[0]);
		want += n[k] = cnt;
		for (int j = 1; j <= 2; j++) {
			assert_int_equal(halite_reader_lb_members(rd, chain[k + j], &mbs, &cnt), 0);
			want += n[k + j] = cnt;
		}
		wait_installed(r, want, &st);
		assert_int_equal(st.faults, round + 1);
		assert_int_equal(st.lb_demand, round + 1);
		assert_int_equal(st.lb_prefetch, 2 * (round + 1));
		assert_int_equal(st.mb_fault, round + 1);
		assert_int_equal(st.mb_pool + st.mb_fault, n[0] + (round ? n[3] : 0));
		assert_int_equal(st.mb_prefetch, n[1] + n[2] + (round ? n[4] + n[5] : 0));
		for (int j = 0; j < 3; j++) {
			uint32_t all, in = lb_resident(rd, &im, mem, chain[k + j], &all);

			assert_int_equal(in, all);
		}
		if (!round) {
			uint32_t all, in = lb_resident(rd, &im, mem, chain[3], &all);

			assert_int_equal(in, 0);
		}
	}
	/* Every installed byte is the source's (the rest reads as nothing yet). */
	for (int j = 0; j < 6; j++) {
		const uint64_t *mbs;
		uint32_t cnt;

		assert_int_equal(halite_reader_lb_members(rd, chain[j], &mbs, &cnt), 0);
		for (uint32_t i = 0; i < cnt; i++) {
			uint64_t mb = mbs[i], per0 = im.len[0] / MB_SIZE;
			const uint8_t *src = mb < per0 ? im.src[0] + mb * MB_SIZE
						       : im.src[1] + (mb - per0) * MB_SIZE;

			assert_memory_equal(mb_addr(&im, mem, mb), src, MB_SIZE);
		}
	}
	log_stats("readahead", &st);
	halite_restore_free(r);
	halite_reader_free(rd);
	for (int i = 0; i < NREG; i++)
		munmap(mem[i], im.len[i]);
	img_free(&im);
}

static void test_corrupt_lb(void **state)
{
	struct img im;
	uint8_t *mem[NREG], *p;
	struct halite_restore_region reg[NREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_reader *rd;
	struct halite_lb_info li;
	struct sigaction sa = { .sa_sigaction = on_segv, .sa_flags = SA_SIGINFO }, old;
	struct toucher t = { 0 };
	const uint64_t *mbs;
	uint32_t n;
	uint64_t bad;
	char want[64];
	uint8_t byte;
	struct timespec dl;
	int fd;

	img_make(&im, "corrupt.hlt");
	for (int i = 0; i < NREG; i++)
		mem[i] = mem_map(im.len[i], NULL);
	regions(&im, mem, NULL, reg);
	bad = im.lb_total / 2;
	assert_int_equal(halite_reader_open(&rd, im.path, NULL), 0);
	assert_int_equal(halite_reader_lb_info(rd, bad, &li), 0);
	assert_int_equal(halite_reader_lb_members(rd, bad, &mbs, &n), 0);
	p = mb_addr(&im, mem, mbs[0]);
	/* One flipped byte in the middle of the LB's data. */
	fd = open(im.path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)(li.offset + li.used / 2)), 1);
	byte ^= 0x10;
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)(li.offset + li.used / 2)), 1);
	close(fd);

	t.pages = calloc(1, sizeof(*t.pages));
	assert_non_null(t.pages);
	t.pages[0] = p;
	t.npages = 1;
	assert_int_equal(sigaction(SIGSEGV, &sa, &old), 0);
	toucher_start(&t);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	assert_int_equal(halite_restore_open(&r, im.path, reg, NREG, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	atomic_store(&t.go, 1);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), -HALITE_E_LB_CHECKSUM);
	fprintf(stderr, "failed as it should: %s\n", halite_restore_errmsg(r));
	snprintf(want, sizeof(want), "locality block %llu at offset %llu", (unsigned long long)bad,
		 (unsigned long long)li.offset);
	assert_non_null(strstr(halite_restore_errmsg(r), want));
	halite_restore_stats(r, &st);
	assert_false(st.done);
	assert_int_equal(st.error, -HALITE_E_LB_CHECKSUM);
	assert_int_equal(st.lb_retries, 2);
	assert_int_equal(st.lb_demand, 0);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch, 0);
	usleep(100000);
	assert_false(atomic_load(&t.returned));
	assert_false(atomic_load(&t.segv));
	/* None of the LB's pages ever reached memory. */
	for (uint32_t i = 0; i < n; i++) {
		unsigned char vec[MB_SIZE / PAGE];

		assert_int_equal(mincore(mb_addr(&im, mem, mbs[i]), MB_SIZE, vec), 0);
		for (unsigned k = 0; k < MB_SIZE / PAGE; k++)
			assert_int_equal(vec[k] & 1, 0);
	}
	halite_reader_free(rd);
	/* Freed: the blocked thread wakes into PROT_NONE, never into zeros. */
	halite_restore_free(r);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 30;
	assert_int_equal(pthread_timedjoin_np(t.thr, NULL, &dl), 0);
	assert_true(atomic_load(&t.segv));
	assert_false(atomic_load(&t.returned));
	sigaction(SIGSEGV, &old, NULL);
	for (int i = 0; i < NREG; i++)
		munmap(mem[i], im.len[i]);
	free(t.pages);
	img_free(&im);
}

static void skip_without_uffd(void)
{
	struct halite_uffd_caps caps;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_THREAD_ID) ||
	    !(caps.features & UFFD_FEATURE_MISSING_SHMEM)) {
		fprintf(stderr, "no userfaultfd with THREAD_ID and MISSING_SHMEM: skipped\n");
		exit(77);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefetch_anon),
		cmocka_unit_test(test_prefetch_shared),
		cmocka_unit_test(test_demand_exact),
		cmocka_unit_test(test_readahead),
		cmocka_unit_test(test_corrupt_lb),
	};
	int ret;

	skip_without_uffd();
	g_seed = t_seed("test_restore_smoke");
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
