/* SPDX-License-Identifier: MIT */
/*
 * The lazy save engine on in-process private anonymous memory, with vCPU
 * threads that keep writing through the save:
 * - exact content: the file decodes to the memory at the snapshot instant,
 *   compared with a copy taken then, for every codec;
 * - exact locality: with the background off, each vCPU stream holds exactly
 *   the blocks that vCPU touched first, in its order; with it on, each vCPU
 *   stream is in that vCPU's order, the physical stream ascends, and counts
 *   add up to the memory size;
 * - failure: a write error mid-save (the file size limit's EFBIG from the
 *   kernel; ENOSPC and EIO injected), an internal check that fails (as a
 *   bug would make it) and a cancel leave the guest's memory exactly as
 *   without the save, the guest running, and no file behind;
 * each for private anonymous memory, shared memory (memfd) of this process,
 * and shared memory of a child process that owns the guest (the engine works
 * from outside through a userfaultfd created in the child, as with QEMU);
 * and content and failure for a hugetlbfs memfd of 2 MiB pages (the test
 * reserves the huge pages it needs if it may, else skips that part).
 * The fault thread's scheduling: with every thread on one CPU, a save whose
 * fault thread is SCHED_FIFO (where this process may) still finishes exactly
 * (its waits on the background thread's copies must let it run), and the
 * stats say which the fault thread was; HALITE_SAVE_NO_REALTIME keeps it
 * ordinary.
 * A copy (HALITE_MEM_COPY, as halite-qemu saves video memory) beside each
 * kind of guest memory: saved exactly, its holes as never touched and its
 * zero pages as zero, at the head of the physical stream, the caller's
 * memory neither written nor dropped; with and without the background
 * thread.
 *
 * Each vCPU owns a slice of memory and sweeps it page by page, writing a
 * per-page counter word; everything else in a page keeps its initial
 * contents, so the memory "as without the save" is known exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "test_reader_util.h"
#include "test_util.h"
#include "save_test.h"
#include "uffd.h"

#define PAGE 4096u
#define MB_SIZE (2 * PAGE)
#define NVCPU 3

static uint64_t g_seed;
/* run_save(): more flags, and what stats.fault_realtime must say (-1: anything). */
static unsigned g_flags;
static int g_expect_rt = -1;

enum mode { ANON, SHARED, EXTERNAL, HUGETLB };
static const char *const mode_name[] = { "anonymous", "shared", "external", "hugetlbfs" };

/* In MAP_SHARED memory, so that a child guest and the test see the same. */
struct guest {
	enum mode mode;
	int memfd;
	pid_t child;
	int sock;		/* EXTERNAL: to the child */
	_Atomic int drop_req;	/* EXTERNAL: the engine asks the child to MADV_DONTNEED */
	_Atomic int drop_ret;
	uint64_t drop_addr, drop_len;
	uint8_t *mem;
	size_t len;
	size_t slice;		/* bytes per vCPU */
	size_t ws;		/* of which each vCPU sweeps the first ws bytes */
	pthread_t thr[NVCPU];
	_Atomic pid_t tid[NVCPU];
	pid_t tids[NVCPU];
	_Atomic int pause_req;
	_Atomic int parked;
	_Atomic int stop;
	_Atomic uint64_t passes[NVCPU]; /* completed sweeps */
	/* first-touch order after the snapshot, per vCPU: MB numbers */
	uint64_t *order[NVCPU];
	size_t norder[NVCPU];
	_Atomic int recording;
	uint8_t *seen;		/* per MB: touched by someone since the snapshot */
};

struct vcpu_arg {
	struct guest *g;
	int i;
};

static void *vcpu_main(void *arg)
{
	struct vcpu_arg *a = arg;
	struct guest *g = a->g;
	int i = a->i;
	uint8_t *base = g->mem + (size_t)i * g->slice;

	atomic_store(&g->tid[i], gettid());
	while (!atomic_load(&g->stop)) {
		size_t off;

		for (off = 0; off < g->ws && !atomic_load(&g->stop); off += PAGE) {
			uint64_t mb = ((size_t)i * g->slice + off) / MB_SIZE;

			if (atomic_load(&g->pause_req)) {
				atomic_fetch_add(&g->parked, 1);
				while (atomic_load(&g->pause_req))
					usleep(100);
				atomic_fetch_sub(&g->parked, 1);
			}
			if (atomic_load(&g->recording) && !g->seen[mb]) {
				g->seen[mb] = 1; /* slices are disjoint: no other writer */
				g->order[i][g->norder[i]++] = mb;
			}
			/* A read, then a write: both are first touches to the engine. */
			*(volatile uint64_t *)(base + off + 8) += *(volatile uint64_t *)(base + off + 16) * 0;
			(*(volatile uint64_t *)(base + off))++;
		}
		if (off >= g->ws) /* only whole sweeps count */
			atomic_fetch_add(&g->passes[i], 1);
	}
	return NULL;
}

static void guest_pause(struct guest *g)
{
	atomic_store(&g->pause_req, 1);
	while (atomic_load(&g->parked) != NVCPU)
		usleep(50);
}

static void guest_resume(struct guest *g)
{
	atomic_store(&g->pause_req, 0);
}

static void *shared_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	return p;
}

static void start_vcpus(struct guest *g)
{
	static struct vcpu_arg args[NVCPU];

	for (int i = 0; i < NVCPU; i++) {
		args[i] = (struct vcpu_arg){ g, i };
		if (pthread_create(&g->thr[i], NULL, vcpu_main, &args[i]))
			abort();
	}
}

/*
 * The child owns the guest: vCPU threads, and a userfaultfd created here and
 * handed to the test. It keeps its own copy open, as QEMU would. It serves
 * page-table drops until told to stop.
 */
static void child_main(struct guest *g)
{
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (uffd < 0)
		_exit(3);
	if (t_send_fd(g->sock, uffd))
		abort();
	start_vcpus(g);
	while (!atomic_load(&g->stop)) {
		if (atomic_load(&g->drop_req) == 1) {
			int r = madvise((void *)(uintptr_t)g->drop_addr, g->drop_len, MADV_DONTNEED);

			atomic_store(&g->drop_ret, r ? -errno : 0);
			atomic_store(&g->drop_req, 2);
		}
		usleep(100);
	}
	for (int i = 0; i < NVCPU; i++)
		pthread_join(g->thr[i], NULL);
	_exit(0);
}

/* halite_drop_ptes_fn for the child guest. */
static int child_drop_ptes(void *ctx, uint64_t addr, uint64_t len)
{
	struct guest *g = ctx;

	g->drop_addr = addr;
	g->drop_len = len;
	atomic_store(&g->drop_req, 1);
	while (atomic_load(&g->drop_req) != 2)
		usleep(50);
	atomic_store(&g->drop_req, 0);
	return atomic_load(&g->drop_ret);
}

/*
 * Memory: @len bytes in NVCPU slices; each vCPU's working set (the first @ws
 * bytes of its slice) is a quarter random, the rest text-like; the rest of
 * the slice is never touched at all (unpopulated, or a hole in the memfd).
 * Returns with the guest parked; EXTERNAL sets *uffd to the child's.
 */
static struct guest *guest_init(enum mode mode, size_t len, size_t ws, uint64_t *seed, int *uffd)
{
	struct guest *g = shared_alloc(sizeof(*g));

	g->mode = mode;
	g->len = len;
	g->slice = len / NVCPU;
	g->ws = ws;
	g->memfd = -1;
	assert_int_equal(g->slice % MB_SIZE, 0);
	assert_int_equal(g->ws % MB_SIZE, 0);
	if (mode == ANON) {
		g->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	} else {
		g->memfd = memfd_create("guest", MFD_CLOEXEC | (mode == HUGETLB ? MFD_HUGETLB : 0));
		assert_true(g->memfd >= 0);
		assert_int_equal(ftruncate(g->memfd, (off_t)len), 0);
		g->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd, 0);
	}
	assert_true(g->mem != MAP_FAILED);
	/*
	 * With transparent huge pages the first write to a 2 MiB extent
	 * populates all of it, and the "never touched" tail would be present
	 * and zero (the engine then records it as zero, which is right but not
	 * what this test counts).
	 */
	if (mode != HUGETLB)
		assert_int_equal(madvise(g->mem, len, MADV_NOHUGEPAGE), 0);
	for (int i = 0; i < NVCPU; i++) {
		uint8_t *b = g->mem + (size_t)i * g->slice;

		t_fill(b, ws / 4, 100, seed);
		t_fill(b + ws / 4, ws - ws / 4, 20, seed);
		g->order[i] = shared_alloc(len / MB_SIZE * sizeof(uint64_t));
	}
	g->seen = shared_alloc(len / MB_SIZE);
	atomic_store(&g->pause_req, 1); /* start parked */
	if (mode == EXTERNAL) {
		int sv[2];

		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
		pid_t pid;

		g->sock = sv[1];
		/* Not g->child = fork(): g is shared, and the child would write 0. */
		pid = fork();
		assert_true(pid >= 0);
		if (!pid) {
			close(sv[0]);
			child_main(g);
		}
		g->child = pid;
		close(sv[1]);
		*uffd = t_recv_fd(sv[0]);
		close(sv[0]);
		assert_true(*uffd >= 0);
	} else {
		start_vcpus(g);
	}
	t_wait_parked(&g->parked, NVCPU, g->tid, g->tids);
	return g;
}

static void guest_stop(struct guest *g)
{
	atomic_store(&g->stop, 1);
	guest_resume(g);
	if (g->mode == EXTERNAL) {
		int st;

		assert_int_equal(waitpid(g->child, &st, 0), g->child);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	} else {
		for (int i = 0; i < NVCPU; i++)
			pthread_join(g->thr[i], NULL);
	}
}

static void guest_free(struct guest *g)
{
	munmap(g->mem, g->len);
	if (g->memfd >= 0)
		close(g->memfd);
	for (int i = 0; i < NVCPU; i++)
		munmap(g->order[i], g->len / MB_SIZE * sizeof(uint64_t));
	munmap(g->seen, g->len / MB_SIZE);
	munmap(g, sizeof(*g));
}


/* Let the vCPUs run a bit, then the snapshot instant: what memory holds then (calloc'ed). */
static uint8_t *run_to_snapshot(struct guest *g, size_t len)
{
	uint8_t *snap;

	guest_resume(g);
	usleep(20000);
	guest_pause(g);
	snap = calloc(1, len);
	t_copy_resident(snap, g->mem, len);
	return snap;
}

static char *tmp_path(const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", t_tmpdir(), name) > 0);
	return p;
}

static void skip_without_uffd(void)
{
	struct halite_uffd_caps caps;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_THREAD_ID)) {
		fprintf(stderr, "no userfaultfd with THREAD_ID: skipped\n");
		exit(77);
	}
}

/* Compare the file with the snapshot copy, block by block. */
static void check_content(const char *path, const uint8_t *snap, size_t len, size_t untouched,
			  size_t zero, const struct halite_save_stats *st)
{
	struct halite_reader *r;
	const struct halite_file_info *fi;
	uint8_t out[MB_SIZE];

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	fi = halite_reader_info(r);
	assert_int_equal(fi->mb_count, len / MB_SIZE);
	assert_int_equal(fi->mb_stored, st->mb_stored);
	assert_int_equal(fi->mb_zero, st->mb_zero);
	assert_int_equal(fi->mb_untouched, st->mb_untouched);
	assert_int_equal(fi->mb_stored + fi->mb_zero + fi->mb_untouched, fi->mb_count);
	/* Exactly the never-touched tails; no working-set block is all zero. */
	assert_int_equal(fi->mb_untouched, untouched / MB_SIZE);
	assert_int_equal(fi->mb_zero, zero / MB_SIZE);
	for (uint64_t mb = 0; mb < fi->mb_count; mb++) {
		assert_int_equal(halite_reader_read_mb(r, mb, out), 0);
		if (memcmp(out, snap + mb * MB_SIZE, MB_SIZE)) {
			fprintf(stderr, "memory block %llu differs from the snapshot\n",
				(unsigned long long)mb);
			fail();
		}
	}
	halite_reader_free(r);
}

static size_t stream_mbs(struct halite_reader *r, uint32_t stream, uint64_t *out)
{
	long n = t_stream_mbs(r, stream, out);

	assert_true(n >= 0);
	return (size_t)n;
}

/* save-stats: faults_vcpuN is the number of blocks vCPU N's first touch saved. */
static void check_fault_stats(const char *path, const struct guest *g, bool exact)
{
	struct halite_reader *r;
	uint64_t sum = 0, total = ~0ull;

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	for (uint32_t i = 0; i < halite_reader_stat_count(r); i++) {
		const char *key;
		uint64_t v;
		unsigned n;

		assert_int_equal(halite_reader_stat(r, i, &key, &v), 0);
		if (sscanf(key, "faults_vcpu%u", &n) == 1) {
			assert_true(n < NVCPU);
			if (exact) /* no background: each vCPU saved all it touched */
				assert_int_equal(v, g->norder[n]);
			sum += v;
		} else if (!strcmp(key, "faults_vcpu")) {
			total = v;
		}
	}
	assert_int_equal(sum, total);
	halite_reader_free(r);
}

/*
 * hugetlbfs: a fault saves its whole huge page into the faulting vCPU's
 * stream, so vCPU @vcpu's stream holds only blocks of its own slice (one
 * huge page), the block it touched first leading (if it is there at all:
 * the background may have saved it).
 */
static void check_huge_stream(struct halite_reader *r, int vcpu, const struct guest *g)
{
	uint64_t *got = calloc(g->len / MB_SIZE, sizeof(uint64_t));
	size_t n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VCPU, vcpu), got);
	uint64_t lo = (uint64_t)vcpu * g->slice / MB_SIZE, hi = lo + g->slice / MB_SIZE;

	for (size_t j = 0; j < n; j++)
		if (got[j] < lo || got[j] >= hi)
			fail_msg("vCPU %d stream holds block %llu, outside its huge page", vcpu,
				 (unsigned long long)got[j]);
	/* Unless the background took it first, the faulting block leads. */
	for (size_t j = 1; j < n && g->norder[vcpu]; j++)
		if (got[j] == g->order[vcpu][0])
			fail_msg("vCPU %d stream: its first touch %llu is not first", vcpu,
				 (unsigned long long)got[j]);
	free(got);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Stored MBs of @stream must appear in @order (the vCPU's first touches) in
 * the same relative order; with @exact, they must be all of the stored ones.
 */
static void check_vcpu_stream(struct halite_reader *r, int vcpu, const struct guest *g, bool exact)
{
	uint64_t *got = calloc(g->len / MB_SIZE, sizeof(uint64_t));
	size_t n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_VCPU, vcpu), got), k = 0;
	size_t stored_in_order = 0;

	for (size_t j = 0; j < g->norder[vcpu]; j++) {
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_mb_lookup(r, g->order[vcpu][j], &loc), 0);
		if (loc.state != HALITE_MB_STORED)
			continue;
		stored_in_order++;
		if (k < n && got[k] == g->order[vcpu][j])
			k++;
		else if (exact)
			fail_msg("vCPU %d stream: block %zu is %llu, first touch order says %llu", vcpu,
				 k, (unsigned long long)(k < n ? got[k] : ~0ull),
				 (unsigned long long)g->order[vcpu][j]);
	}
	/* Every block in the stream was matched, in order. */
	assert_int_equal(k, n);
	if (exact)
		assert_int_equal(n, stored_in_order);
	free(got);
}

static void run_save(enum mode mode, int codec, bool background, int fail)
{
	size_t len = 3 * 2 * 1024 * 1024; /* 6 MiB, 2 MiB a vCPU */
	/* Without the background thread every block must be touched to finish. */
	size_t ws = background ? len / NVCPU / 8 * 7 : len / NVCPU;

	struct guest *g;
	uint64_t seed = g_seed;
	int uffd = -1;
	uint8_t *snap, *expect;
	char *path = tmp_path("save.hlt");
	struct halite_save_region reg;
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save *s;
	struct halite_save_stats st;
	uint64_t passes_at_snap[NVCPU];
	int ret;

	g = guest_init(mode, len, ws, &seed, &uffd);
	snap = run_to_snapshot(g, len);
	for (int i = 0; i < NVCPU; i++)
		passes_at_snap[i] = atomic_load(&g->passes[i]);

	reg = (struct halite_save_region){
		.name = "pc.ram", .gpa = 0, .length = len, .host = (uintptr_t)g->mem,
		.kind = mode == ANON ? HALITE_MEM_ANON : HALITE_MEM_SHARED, .fd = g->memfd,
	};
	if (mode == EXTERNAL) {
		o.owner_pid = g->child;
		o.owner_uffd = uffd;
		o.drop_ptes = child_drop_ptes;
		o.drop_ctx = g;
	}
	o.codec = codec;
	o.vcpu_tids = g->tids;
	o.nvcpus = NVCPU;
	o.flags = g_flags | HALITE_SAVE_NO_SYNC | (background ? 0 : HALITE_SAVE_NO_BACKGROUND);
	/* One failure keeps its partial file, to see the reader refuse it. */
	if (fail == EIO)
		o.flags |= HALITE_SAVE_KEEP_INCOMPLETE;
	o.workers = 2;
	if (fail == ECANCELED) {
		/* Faults only: still running when cancelled. */
		o.bg_idle_us = 60u * 1000 * 1000;
		o.bg_min_rate = 1;
	}
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), 0);
	if (uffd >= 0)
		close(uffd); /* the engine keeps a dup; the child keeps its own */
	if (fail == ENOSPC || fail == EIO)
		halite_save_test_fail_writes(s, 200 << 10, fail);
	if (fail == HALITE_E_INTERNAL)
		halite_save_test_fail_check(s, 100);
	assert_int_equal(halite_save_set_meta(s, "test.mode", mode_name[mode],
					      (uint32_t)strlen(mode_name[mode])), 0);
	atomic_store(&g->recording, 1);
	ret = halite_save_arm(s);
	assert_int_equal(ret, 0);
	/* Metadata belongs to the file's start: not once armed. */
	assert_int_equal(halite_save_set_meta(s, "late", "x", 1), -HALITE_E_STATE);
	if (fail == EFBIG) {
		/* The file may not grow past 256 KiB: a write fails with EFBIG. */
		struct rlimit rl = { 256 << 10, RLIM_INFINITY };

		signal(SIGXFSZ, SIG_IGN);
		assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
	}
	guest_resume(g);

	if (fail == ECANCELED) {
		usleep(50000);
		ret = halite_save_cancel(s);
	} else {
		ret = halite_save_wait(s, 60000);
	}
	halite_save_stats(s, &st);
	/* The guest keeps running after the save, failed or not. */
	for (int i = 0; i < NVCPU; i++) {
		uint64_t p0 = atomic_load(&g->passes[i]);
		int ms = 0;

		/* A vCPU left blocked in a fault would never move again. */
		while (atomic_load(&g->passes[i]) == p0 && ms++ < 2000)
			usleep(1000);
		assert_true(atomic_load(&g->passes[i]) > p0);
	}
	guest_stop(g);
	if (fail) {
		struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };

		setrlimit(RLIMIT_FSIZE, &rl);
		assert_int_equal(ret, -fail);
		assert_int_equal(st.error, -fail);
		assert_false(st.done);
		assert_non_null(strstr(halite_save_errmsg(s),
				       fail == ECANCELED ? "cancelled"
				       : fail == HALITE_E_INTERNAL ? "retired in claim state"
				       : "locality block"));
		if (fail == ENOSPC || fail == EIO || fail == EFBIG) {
			const char *at = strstr(halite_save_errmsg(s), path);

			/* One sentence that names the file once, however deep the failure. */
			assert_non_null(at);
			assert_null(strstr(at + 1, path));
		}
	} else {
		assert_int_equal(ret, 0);
		assert_true(st.done);
		assert_int_equal(st.mb_saved, len / MB_SIZE);
		assert_int_equal(st.faults_vcpu + st.mb_background, st.mb_saved);
		if (!background)
			assert_int_equal(st.mb_background, 0);
		if (g_expect_rt >= 0)
			assert_int_equal(st.fault_realtime, g_expect_rt);
		assert_true(st.fault_max_ns >= st.fault_p99_ns);
	}
	halite_save_free(s);

	/*
	 * The guest's memory is what it would be without the save: initial
	 * bytes everywhere, but the counter word of each page incremented once
	 * per completed sweep (plus one for pages of the sweep in progress).
	 */
	expect = malloc(len);
	memcpy(expect, snap, len);
	for (int i = 0; i < NVCPU; i++) {
		/*
		 * Sweeps finished since the snapshot: the first was partial and
		 * one more may be in progress, so each page's counter moved by
		 * that number, give or take one.
		 */
		int64_t swept = (int64_t)(atomic_load(&g->passes[i]) - passes_at_snap[i]);

		for (size_t off = 0; off < g->ws; off += PAGE) {
			uint8_t *e = expect + (size_t)i * g->slice + off;
			const uint8_t *m = g->mem + (size_t)i * g->slice + off;
			uint64_t before, now;

			memcpy(&before, e, 8);
			memcpy(&now, m, 8);
			assert_true((int64_t)(now - before) >= swept - 1);
			assert_true((int64_t)(now - before) <= swept + 1);
			memcpy(e, &now, 8);
		}
	}
	assert_memory_equal(g->mem, expect, len);

	if (fail == EIO) {
		struct halite_reader *r = NULL;
		char errbuf[256] = "", *kept = tmp_path("save.hlt.incomplete");
		HALITE_OPTS(halite_reader_opts, ro);

		/* Kept beside the target, never under its name. */
		assert_int_equal(access(path, F_OK), -1);
		ro.errbuf = errbuf;
		ro.errbuf_len = sizeof(errbuf);
		assert_int_equal(halite_reader_open(&r, kept, &ro), -HALITE_E_INCOMPLETE);
		assert_non_null(strstr(errbuf, "did not finish"));
		unlink(kept);
		free(kept);
	} else if (fail) {
		char *kept = tmp_path("save.hlt.incomplete");

		assert_int_equal(access(path, F_OK), -1); /* no partial file left */
		assert_int_equal(access(kept, F_OK), -1);
		free(kept);
	} else {
		struct halite_reader *r;

		/*
		 * hugetlbfs cannot tell a hole: the tails of the vCPUs' huge pages
		 * are present and zero, saved as zero blocks.
		 */
		if (mode == HUGETLB)
			check_content(path, snap, len, 0, len - NVCPU * ws, &st);
		else
			check_content(path, snap, len, len - NVCPU * ws, 0, &st);
		check_fault_stats(path, g, !background);
		{
			struct stat sb;

			assert_int_equal(stat(path, &sb), 0);
			assert_int_equal(st.file_bytes, (uint64_t)sb.st_size);
		}
		assert_int_equal(halite_reader_open(&r, path, NULL), 0);
		{
			const char *key;
			const void *val;
			uint32_t vlen, k;

			for (k = 0; k < halite_reader_meta_count(r); k++) {
				assert_int_equal(halite_reader_meta(r, k, &key, &val, &vlen), 0);
				if (strcmp(key, "test.mode") == 0)
					break;
			}
			assert_true(k < halite_reader_meta_count(r));
			assert_int_equal(vlen, strlen(mode_name[mode]));
			assert_memory_equal(val, mode_name[mode], vlen);
		}
		for (int i = 0; i < NVCPU && mode != HUGETLB; i++)
			check_vcpu_stream(r, i, g, !background);
		for (int i = 0; i < NVCPU && mode == HUGETLB; i++)
			check_huge_stream(r, i, g);
		{
			uint64_t *phys = calloc(len / MB_SIZE, sizeof(uint64_t));
			size_t n = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), phys);
			uint64_t *sorted = malloc(n * sizeof(uint64_t) + 1);

			memcpy(sorted, phys, n * sizeof(uint64_t));
			qsort(sorted, n, sizeof(uint64_t), cmp_u64);
			assert_memory_equal(sorted, phys, n * sizeof(uint64_t));
			if (!background)
				assert_int_equal(n, 0);
			free(sorted);
			free(phys);
		}
		halite_reader_free(r);
		unlink(path);
	}
	fprintf(stderr, "%s, codec %s, background %d: %llu faults (%llu vCPU), %llu background, "
		"p50 %llu ns p99 %llu ns, arm %llu ns\n",
		mode_name[mode], halite_codec_name(codec ? codec : HALITE_CODEC_LZ4), background,
		(unsigned long long)st.faults, (unsigned long long)st.faults_vcpu,
		(unsigned long long)st.mb_background, (unsigned long long)st.fault_p50_ns,
		(unsigned long long)st.fault_p99_ns, (unsigned long long)st.arm_ns);
	free(expect);
	free(snap);
	free(path);
	guest_free(g);
}

/*
 * Guest memory of @mode and a copy of 1 MiB in this process: random data,
 * zero pages written, holes, and a last page of text. The copy's blocks
 * are saved as they are, and its memory is left as it was.
 */
static void run_copy(enum mode mode, bool background)
{
	size_t len = 3 * 2 * 1024 * 1024, clen = 1u << 20;
	size_t ws = background ? len / NVCPU / 8 * 7 : len / NVCPU;
	struct guest *g;
	uint64_t seed = g_seed ^ 0xc0b7, *phys;
	int uffd = -1;
	uint8_t *snap, *copy, *before, out[MB_SIZE];
	unsigned char vec[(1u << 20) / PAGE];
	char *path = tmp_path("copy.hlt");
	struct halite_save_region reg[2];
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save *s;
	struct halite_save_stats st;
	struct halite_reader *r;
	const struct halite_file_info *fi;
	uint64_t first, n_phys;

	copy = mmap(NULL, clen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(copy != MAP_FAILED);
	assert_int_equal(madvise(copy, clen, MADV_NOHUGEPAGE), 0);
	t_fill(copy, 256 << 10, 60, &seed);		 /* stored */
	memset(copy + (256 << 10), 0, 64 << 10);	 /* zero, written */
	memset(copy + clen - PAGE, 'v', PAGE);		 /* stored; holes before it */
	before = calloc(1, clen);
	t_copy_resident(before, copy, clen);

	g = guest_init(mode, len, ws, &seed, &uffd);
	snap = run_to_snapshot(g, len);
	reg[0] = (struct halite_save_region){
		.name = "pc.ram", .gpa = 0, .length = len, .host = (uintptr_t)g->mem,
		.kind = mode == ANON ? HALITE_MEM_ANON : HALITE_MEM_SHARED, .fd = g->memfd,
	};
	reg[1] = (struct halite_save_region){
		.name = "0000:00:01.0/vga.vram", .gpa = 0xfd000000, .length = clen,
		.host = (uintptr_t)copy, .kind = HALITE_MEM_COPY, .fd = -1,
	};
	if (mode == EXTERNAL) {
		o.owner_pid = g->child;
		o.owner_uffd = uffd;
		o.drop_ptes = child_drop_ptes;
		o.drop_ctx = g;
	}
	o.vcpu_tids = g->tids;
	o.nvcpus = NVCPU;
	o.flags = HALITE_SAVE_NO_SYNC | (background ? 0 : HALITE_SAVE_NO_BACKGROUND);
	o.workers = 2;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_save_create(&s, path, reg, 2, &o), 0);
	if (uffd >= 0)
		close(uffd);
	assert_int_equal(halite_save_arm(s), 0);
	guest_resume(g);
	assert_int_equal(halite_save_wait(s, 60000), 0);
	halite_save_stats(s, &st);
	assert_true(st.done);
	assert_int_equal(st.mb_saved, (len + clen) / MB_SIZE);
	assert_int_equal(st.faults_vcpu + st.faults_other + st.mb_background, st.mb_saved);
	/* The copies count as the background's, even when arm saved them. */
	assert_true(st.mb_background >= clen / MB_SIZE);
	halite_save_free(s);
	guest_stop(g);

	/*
	 * The caller's memory as it was: not written, not dropped, and blocks
	 * that are holes still holes (checked before the compare, whose reads
	 * would map the zero page there; a block's compression reads the hole
	 * beside the last page).
	 */
	assert_int_equal(mincore(copy, clen, vec), 0);
	for (size_t p = 0; p < clen / PAGE; p++)
		if ((vec[p] & 1) != (p < (320u << 10) / PAGE || p >= (clen - MB_SIZE) / PAGE))
			fail_msg("%s: page %zu of the copy is %spresent", mode_name[mode], p,
				 vec[p] & 1 ? "" : "not ");
	assert_memory_equal(copy, before, clen);

	assert_int_equal(halite_reader_open(&r, path, NULL), 0);
	fi = halite_reader_info(r);
	assert_int_equal(fi->region_count, 2);
	assert_string_equal(halite_reader_region(r, 1)->name, "0000:00:01.0/vga.vram");
	assert_int_equal(halite_reader_region(r, 1)->gpa, 0xfd000000);
	first = halite_reader_region(r, 1)->first_mb;
	assert_int_equal(first, len / MB_SIZE);
	for (uint64_t mb = 0; mb < fi->mb_count; mb++) {
		const uint8_t *want = mb < first ? snap + mb * MB_SIZE : before + (mb - first) * MB_SIZE;
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_read_mb(r, mb, out), 0);
		if (memcmp(out, want, MB_SIZE))
			fail_msg("%s: memory block %llu differs from the snapshot", mode_name[mode],
				 (unsigned long long)mb);
		if (mb < first)
			continue;
		assert_int_equal(halite_reader_mb_lookup(r, mb, &loc), 0);
		{
			uint64_t off = (mb - first) * MB_SIZE;
			int want_state = off < (256u << 10) || off == clen - MB_SIZE ? HALITE_MB_STORED :
					 off < (320u << 10) ? HALITE_MB_ZERO : HALITE_MB_UNTOUCHED;

			assert_int_equal(loc.state, want_state);
		}
	}
	/* The copy's stored blocks open the physical stream, in order. */
	phys = calloc(fi->mb_count, sizeof(*phys));
	n_phys = stream_mbs(r, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), phys);
	assert_true(n_phys >= (256u << 10) / MB_SIZE + 1);
	for (uint64_t i = 0; i < (256u << 10) / MB_SIZE; i++)
		assert_int_equal(phys[i], first + i);
	assert_int_equal(phys[(256u << 10) / MB_SIZE], first + clen / MB_SIZE - 1);
	free(phys);
	halite_reader_free(r);
	unlink(path);
	fprintf(stderr, "copy beside %s memory, background %d: %llu faults, %llu background\n",
		mode_name[mode], background, (unsigned long long)st.faults,
		(unsigned long long)st.mb_background);
	free(before);
	free(snap);
	free(path);
	munmap(copy, clen);
	guest_free(g);
}

static void test_copy_region(void **state)
{
	for (enum mode m = ANON; m <= EXTERNAL; m++) {
		run_copy(m, true);
		run_copy(m, false);
	}
}

static void test_vcpu_locality_exact(void **state)
{
	for (enum mode m = ANON; m <= EXTERNAL; m++)
		run_save(m, HALITE_CODEC_LZ4, false, 0);
}

static void test_every_codec_with_background(void **state)
{
	for (enum mode m = ANON; m <= EXTERNAL; m++)
		for (int c = HALITE_CODEC_NONE; c < HALITE_CODEC_MAX; c++)
			run_save(m, c, true, 0);
}

static void test_write_error_restores_guest(void **state)
{
	static const int errs[] = { EFBIG, ENOSPC, EIO };

	for (enum mode m = ANON; m <= EXTERNAL; m++)
		for (size_t e = 0; e < sizeof(errs) / sizeof(errs[0]); e++)
			run_save(m, HALITE_CODEC_NONE, true, errs[e]);
}

/*
 * Make sure @n free 2 MiB huge pages exist, reserving more if this process
 * may; *old gets the setting to put back (or -1 when unchanged). False: none.
 */
static bool huge_pages(long n, long *old)
{
	long total = -1, free_pages = -1;
	char line[128];
	FILE *f = fopen("/proc/meminfo", "r");

	*old = -1;
	while (f && fgets(line, sizeof(line), f)) {
		sscanf(line, "HugePages_Total: %ld", &total);
		sscanf(line, "HugePages_Free: %ld", &free_pages);
	}
	if (f)
		fclose(f);
	if (free_pages >= n)
		return true;
	f = total >= 0 ? fopen("/proc/sys/vm/nr_hugepages", "w") : NULL;
	if (!f)
		return false;
	fprintf(f, "%ld\n", total + n - free_pages);
	if (fclose(f))
		return false;
	*old = total;
	f = fopen("/proc/meminfo", "r");
	while (f && fgets(line, sizeof(line), f))
		sscanf(line, "HugePages_Free: %ld", &free_pages);
	if (f)
		fclose(f);
	return free_pages >= n;
}

static void put_huge_pages(long old)
{
	FILE *f = old >= 0 ? fopen("/proc/sys/vm/nr_hugepages", "w") : NULL;

	if (f) {
		fprintf(f, "%ld\n", old);
		fclose(f);
	}
}

static void test_hugetlbfs(void **state)
{
	long old; /* the guest is 3 huge pages of 2 MiB, one a vCPU */

	if (!huge_pages(3, &old)) {
		put_huge_pages(old);
		fprintf(stderr, "hugetlbfs part skipped: no 3 free 2 MiB huge pages and "
			"/proc/sys/vm/nr_hugepages not writable\n");
		skip();
	}
	run_save(HUGETLB, HALITE_CODEC_LZ4, true, 0);
	run_save(HUGETLB, HALITE_CODEC_ZSTD, true, 0);
	/* Not cancel: three faults save all of this guest before a cancel could come. */
	run_save(HUGETLB, HALITE_CODEC_NONE, true, ENOSPC);
	put_huge_pages(old);
}

/* May a thread of this process become SCHED_FIFO? */
static void *try_fifo(void *arg)
{
	struct sched_param sp = { .sched_priority = sched_get_priority_min(SCHED_FIFO) };

	*(bool *)arg = !pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
	return NULL;
}

static void test_realtime_fault_thread_one_cpu(void **state)
{
	cpu_set_t one, all;
	pthread_t t;
	bool may = false;

	assert_int_equal(pthread_create(&t, NULL, try_fifo, &may), 0);
	pthread_join(t, NULL);
	/* Threads inherit this one's CPU: the vCPUs' and the engine's. */
	assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	for (enum mode m = ANON; m <= EXTERNAL; m++) {
		g_expect_rt = may;
		run_save(m, HALITE_CODEC_LZ4, true, 0);
		g_flags = HALITE_SAVE_NO_REALTIME;
		g_expect_rt = 0;
		run_save(m, HALITE_CODEC_LZ4, true, 0);
		g_flags = 0;
	}
	g_expect_rt = -1;
	assert_int_equal(sched_setaffinity(0, sizeof(all), &all), 0);
	if (!may)
		fprintf(stderr, "note: SCHED_FIFO not allowed here; only the ordinary fault "
			"thread was run\n");
}

/*
 * HALITE_SAVE_DIRECT: the locality blocks go through O_DIRECT and the file
 * reads back the same; a flag bit beyond HALITE_SAVE_FLAGS_ALL is refused.
 */
static void test_direct(void **state)
{
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save_region reg = { .name = "r", .length = 1 << 20, .kind = HALITE_MEM_ANON };
	struct halite_save *s = NULL;
	char *path = tmp_path("flags.hlt");
	void *mem = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(mem != MAP_FAILED);
	reg.host = (uintptr_t)mem;
	o.flags = (HALITE_SAVE_FLAGS_ALL + 1) | HALITE_SAVE_NO_SYNC;
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), -EINVAL);
	assert_null(s);
	assert_int_equal(access(path, F_OK), -1);
	munmap(mem, 1 << 20);
	free(path);
	for (enum mode m = ANON; m <= SHARED; m++) {
		g_flags = HALITE_SAVE_DIRECT;
		run_save(m, HALITE_CODEC_LZ4, true, 0);
		g_flags = 0;
	}
}

static void test_cancel_restores_guest(void **state)
{
	for (enum mode m = ANON; m <= EXTERNAL; m++)
		run_save(m, HALITE_CODEC_LZ4, true, ECANCELED);
}

static void test_failed_check_restores_guest(void **state)
{
	for (enum mode m = ANON; m <= EXTERNAL; m++)
		run_save(m, HALITE_CODEC_LZ4, true, HALITE_E_INTERNAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vcpu_locality_exact),
		cmocka_unit_test(test_every_codec_with_background),
		cmocka_unit_test(test_write_error_restores_guest),
		cmocka_unit_test(test_cancel_restores_guest),
		cmocka_unit_test(test_failed_check_restores_guest),
		cmocka_unit_test(test_copy_region),
		cmocka_unit_test(test_hugetlbfs),
		cmocka_unit_test(test_realtime_fault_thread_one_cpu),
		cmocka_unit_test(test_direct),
	};
	int ret;

	skip_without_uffd();
	g_seed = t_seed("test_save");
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
