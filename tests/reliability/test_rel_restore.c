// SPDX-License-Identifier: MIT
/*
 * The restore engine under what guests and callers really do (issue 12):
 *
 *   straddle   a memory block whose pages lie in two mappings (a VMA split by
 *              madvise(MADV_DONTDUMP)): every byte restored (item 4; before,
 *              ENOENT was taken as success and block 0 read 8 KiB of zeros)
 *   enoent     memory unregistered behind the engine's back: the restore
 *              fails naming it, never reports done (item 4)
 *   discard    pages the guest discards (MADV_DONTNEED) read zero from then
 *              on, whether the restore had installed them or not; unmapped
 *              memory is left alone; a moved range is restored where it went
 *              (item 3)
 *   free       halite_restore_free() at random moments while three threads
 *              fault, hundreds of times (item 5; before: SIGSEGV in
 *              halite_pool_submit(pool=NULL), about 1 run in 4)
 *   attach     the handler killed mid-restore; a new one takes over the
 *              owner's userfaultfd (HALITE_RESTORE_ATTACH) and finishes: every
 *              byte exact, the owner's threads all return (item 8)
 *
 *   test_rel_restore [CASE...]     all cases by default
 *   REL_FREE_ITERS=N               iterations of "free" (default 300)
 *
 * Exit 0 pass, 1 fail, 77 no userfaultfd.
 */
#define _GNU_SOURCE
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <linux/userfaultfd.h>

#include <halite/restore.h>

#include "rel.h"

#define NMB 512u		   /* 4 MiB of guest memory */
#define LEN ((size_t)NMB * REL_MB)
#define LB_SIZE 32768u		   /* 4 blocks per locality block */

static uint8_t *g_image;	   /* what a restore must give back */
static char *g_path;
static uint64_t g_seed;

/* Every 16th block zero, the others random: stored in physical order. */
static void make_snapshot(void)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_region reg = { "ram", 0, LEN };
	struct halite_writer *w;
	uint64_t s = g_seed;

	g_image = malloc(LEN);
	REQUIRE(g_image, "malloc");
	for (uint64_t mb = 0; mb < NMB; mb++) {
		uint8_t *p = g_image + mb * REL_MB;

		if (mb % 16 == 5)
			memset(p, 0, REL_MB);
		else
			t_fill(p, REL_MB, 60, &s);
	}
	g_path = rel_path("restore.hlt");
	o.lb_size = LB_SIZE;
	o.flags = HALITE_WRITER_NO_SYNC;
	REQUIRE(!halite_writer_create(&w, g_path, &reg, 1, &o), "writer_create");
	for (uint64_t mb = 0; mb < NMB; mb++)
		REQUIRE(!halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), mb,
					   g_image + mb * REL_MB), "put %llu", (unsigned long long)mb);
	REQUIRE(!halite_writer_finish(w), "finish");
	halite_writer_free(w, true);
}

static void check_sums(const struct halite_restore_stats *st, const char *what)
{
	CHECK(st->done && !st->error, "%s: done %d error %d", what, st->done, st->error);
	CHECK(st->mb_fault + st->mb_pool + st->mb_prefetch + st->mb_zero + st->mb_present ==
	      st->mb_total, "%s: blocks %llu+%llu+%llu+%llu+%llu != %llu", what,
	      (unsigned long long)st->mb_fault, (unsigned long long)st->mb_pool,
	      (unsigned long long)st->mb_prefetch, (unsigned long long)st->mb_zero,
	      (unsigned long long)st->mb_present, (unsigned long long)st->mb_total);
}

/* Bytes of @mem that differ from the image, outside [skip_lo, skip_hi). */
static size_t diff_bytes(const uint8_t *mem, size_t lo, size_t hi, size_t skip_lo, size_t skip_hi)
{
	size_t n = 0;

	for (size_t i = lo; i < hi; i++)
		if ((i < skip_lo || i >= skip_hi) && mem[i] != g_image[i])
			n++;
	return n;
}


/* ---- straddle ---- */

static void case_straddle(bool shared)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { "ram", 0, LEN, HALITE_MEM_ANON, -1, 0 };
	struct halite_restore_stats st;
	struct halite_restore *r;
	const char *what = shared ? "straddle, memfd" : "straddle, anonymous";
	int fd = -1, ret;
	uint8_t *mem = shared ? rel_map_memfd(LEN, &fd) : rel_map_anon(LEN);

	printf("%s\n", what);
	/* Block 0's second page, and block 7's, each a mapping of their own. */
	REQUIRE(!madvise(mem + REL_PAGE, REL_PAGE, MADV_DONTDUMP), "madvise");
	REQUIRE(!madvise(mem + 7 * REL_MB + REL_PAGE, REL_PAGE, MADV_DONTDUMP), "madvise");
	reg.host = (uintptr_t)mem;
	if (shared) {
		reg.kind = HALITE_MEM_SHARED;
		reg.fd = fd;
	}
	REQUIRE(!halite_restore_open(&r, g_path, &reg, 1, &o), "open");
	ret = halite_restore_start(r);
	REQUIRE(!ret, "start: %s", halite_restore_errmsg(r));
	ret = halite_restore_wait(r, 60000);
	CHECK(ret == 0, "%s: wait %d: %s", what, ret, halite_restore_errmsg(r));
	halite_restore_stats(r, &st);
	check_sums(&st, what);
	CHECK(diff_bytes(mem, 0, REL_MB, 0, 0) == 0, "%s: block 0: %zu bytes differ", what,
	      diff_bytes(mem, 0, REL_MB, 0, 0));
	CHECK(diff_bytes(mem, 0, LEN, 0, 0) == 0, "%s: %zu bytes differ", what,
	      diff_bytes(mem, 0, LEN, 0, 0));
	halite_restore_free(r);
	munmap(mem, LEN);
	if (fd >= 0)
		close(fd);
}

/* ---- enoent ---- */

static void case_enoent(void)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { "ram", 0, LEN, HALITE_MEM_ANON, -1, 0 };
	struct halite_restore *r;
	uint8_t *mem = rel_map_anon(LEN);
	int uffd = rel_raw_uffd(), ret;
	uint64_t t0;
	struct uffdio_range rg = { (uintptr_t)mem + 300 * REL_MB, 4 * REL_MB };

	printf("enoent: memory unregistered behind the engine's back\n");
	reg.host = (uintptr_t)mem;
	/* This process as an owner that keeps its own copy of the descriptor. */
	o.owner_pid = getpid();
	o.owner_uffd = uffd;
	/* The prefetcher waits a second before it installs anything: time to sabotage. */
	o.prefetch_idle_us = 1000000;
	o.prefetch_min_rate = 1;
	REQUIRE(!halite_restore_open(&r, g_path, &reg, 1, &o), "open");
	REQUIRE(!halite_restore_start(r), "start: %s", halite_restore_errmsg(r));
	t0 = rel_now_ms();
	REQUIRE(!ioctl(uffd, UFFDIO_UNREGISTER, &rg), "unregister: %s", strerror(errno));
	/* The prefetcher's installs of blocks 300..303 must find them unregistered. */
	ret = halite_restore_wait(r, 20000);
	CHECK(ret == -ENOENT, "enoent: wait %d (%s), want -ENOENT", ret, halite_strerror(ret));
	CHECK(strstr(halite_restore_errmsg(r), "no longer mapped") &&
	      strstr(halite_restore_errmsg(r), "'ram'"), "enoent: message '%s'",
	      halite_restore_errmsg(r));
	CHECK(rel_now_ms() - t0 < 15000, "enoent: took %llu ms",
	      (unsigned long long)(rel_now_ms() - t0));
	halite_restore_free(r);
	close(uffd);
	munmap(mem, LEN);
}

/* ---- discard ---- */

/* A page's first word, read from a thread (it may fault): true when it returned. */

static uint64_t img_word(size_t off)
{
	uint64_t v;

	memcpy(&v, g_image + off, sizeof(v));
	return v;
}

static void case_discard_demand(void)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { "ram", 0, LEN, HALITE_MEM_ANON, -1, 0 };
	struct halite_restore_stats st;
	struct halite_restore *r;
	uint8_t *mem = rel_map_anon(LEN);
	const size_t a = 40 * REL_MB, b = 80 * REL_MB, c = 120 * REL_MB;
	uint64_t v;

	printf("discard: demand faults only\n");
	reg.host = (uintptr_t)mem;
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	REQUIRE(!halite_restore_open(&r, g_path, &reg, 1, &o), "open");
	REQUIRE(!halite_restore_start(r), "start: %s", halite_restore_errmsg(r));

	/* Block a: its second page discarded before the block was ever read. */
	REQUIRE(!madvise(mem + a + REL_PAGE, REL_PAGE, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(mem + a, &v, 10000) && v == img_word(a), "discard: block a, first page");
	CHECK(rel_read_word(mem + a + REL_PAGE, &v, 10000) && v == 0,
	      "discard: block a, discarded page reads %llx, not zero", (unsigned long long)v);
	CHECK(rel_nonzero(mem + a + REL_PAGE, REL_PAGE) == 0, "discard: block a page 2");
	CHECK(!memcmp(mem + a, g_image + a, REL_PAGE), "discard: block a page 1 bytes");

	/* Block b: installed, then wholly discarded: zeros, never the snapshot again. */
	CHECK(rel_read_word(mem + b, &v, 10000) && v == img_word(b), "discard: block b before");
	REQUIRE(!madvise(mem + b, REL_MB, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(mem + b + REL_PAGE, &v, 10000) && v == 0, "discard: block b after, %llx",
	      (unsigned long long)v);
	CHECK(rel_nonzero(mem + b, REL_MB) == 0, "discard: block b bytes");

	/* Block c: installed, then its second page discarded: the first keeps its bytes. */
	CHECK(rel_read_word(mem + c, &v, 10000) && v == img_word(c), "discard: block c before");
	REQUIRE(!madvise(mem + c + REL_PAGE, REL_PAGE, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(mem + c + REL_PAGE, &v, 10000) && v == 0, "discard: block c page 2 after");
	CHECK(!memcmp(mem + c, g_image + c, REL_PAGE), "discard: block c page 1 bytes");

	/* The rest comes by faults: touch every page from here. */
	for (size_t off = 0; off < LEN; off += REL_PAGE)
		CHECK(rel_read_word(mem + off, &v, 10000), "discard: page at %zu never returned", off);
	CHECK(halite_restore_wait(r, 60000) == 0, "discard: wait: %s", halite_restore_errmsg(r));
	halite_restore_stats(r, &st);
	check_sums(&st, "discard (demand)");
	CHECK(st.pages_discarded == 4, "discard: %llu pages discarded, want 4",
	      (unsigned long long)st.pages_discarded);
	CHECK(rel_nonzero(mem + a + REL_PAGE, REL_PAGE) == 0 &&
	      rel_nonzero(mem + b, REL_MB) == 0 && rel_nonzero(mem + c + REL_PAGE, REL_PAGE) == 0,
	      "discard: discarded pages after done");
	CHECK(diff_bytes(mem, 0, a + REL_PAGE, 0, 0) == 0 &&
	      diff_bytes(mem, a + REL_MB, b, 0, 0) == 0 &&
	      diff_bytes(mem, b + REL_MB, c + REL_PAGE, 0, 0) == 0 &&
	      diff_bytes(mem, c + REL_MB, LEN, 0, 0) == 0, "discard: other bytes differ");
	halite_restore_free(r);
	munmap(mem, LEN);
}

/*
 * With the prefetcher: a range discarded at once, another unmapped, another
 * moved, while the restore runs; whatever the engine had done with them by
 * then, discarded bytes read zero, the moved range holds its snapshot bytes
 * at its new address, and the restore completes.
 */
static void case_discard_prefetch(void)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { "ram", 0, LEN, HALITE_MEM_ANON, -1, 0 };
	struct halite_restore_stats st;
	struct halite_restore *r;
	uint8_t *mem = rel_map_anon(LEN), *dst;
	const size_t d0 = 200 * REL_MB, d1 = 264 * REL_MB; /* discarded */
	const size_t u0 = 300 * REL_MB, u1 = 332 * REL_MB; /* unmapped */
	const size_t m0 = 400 * REL_MB, m1 = 464 * REL_MB; /* moved */
	void *spot;
	int ret;

	printf("discard: with the prefetcher, discard, unmap and move\n");
	/* Somewhere to move to, reserved now. */
	spot = mmap(NULL, m1 - m0, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(spot != MAP_FAILED, "mmap");
	reg.host = (uintptr_t)mem;
	o.prefetch_idle_us = 100;
	REQUIRE(!halite_restore_open(&r, g_path, &reg, 1, &o), "open");
	REQUIRE(!halite_restore_start(r), "start: %s", halite_restore_errmsg(r));
	REQUIRE(!madvise(mem + d0, d1 - d0, MADV_DONTNEED), "madvise");
	REQUIRE(!munmap(mem + u0, u1 - u0), "munmap");
	dst = mremap(mem + m0, m1 - m0, m1 - m0, MREMAP_MAYMOVE | MREMAP_FIXED, spot);
	REQUIRE(dst == spot, "mremap: %s", strerror(errno));
	ret = halite_restore_wait(r, 60000);
	CHECK(ret == 0, "discard+: wait %d: %s", ret, halite_restore_errmsg(r));
	halite_restore_stats(r, &st);
	check_sums(&st, "discard (prefetch)");
	CHECK(st.pages_discarded == (d1 - d0) / REL_PAGE, "discard+: %llu pages discarded",
	      (unsigned long long)st.pages_discarded);
	CHECK(st.pages_unmapped == (u1 - u0) / REL_PAGE, "discard+: %llu pages unmapped",
	      (unsigned long long)st.pages_unmapped);
	CHECK(rel_nonzero(mem + d0, d1 - d0) == 0, "discard+: %zu discarded bytes not zero",
	      rel_nonzero(mem + d0, d1 - d0));
	CHECK(!memcmp(dst, g_image + m0, m1 - m0), "discard+: the moved range differs");
	CHECK(diff_bytes(mem, 0, d0, 0, 0) == 0 && diff_bytes(mem, d1, u0, 0, 0) == 0 &&
	      diff_bytes(mem, u1, m0, 0, 0) == 0 && diff_bytes(mem, m1, LEN, 0, 0) == 0,
	      "discard+: the rest differs");
	halite_restore_free(r);
	munmap(mem, d0 + (d1 - d0) + (u0 - d1));
	munmap(mem + u1, m0 - u1);
	munmap(mem + m1, LEN - m1);
	munmap(dst, m1 - m0);
}

/* ---- an owner process: the memory and its userfaultfd live there ---- */

struct owner_res {
	_Atomic uint64_t touches, mismatches, passes;
	_Atomic int stop;
};

struct owner {
	pid_t pid;
	int uffd;	    /* our copy of the owner's */
	int memfd;	    /* shared memory: the owner's file, opened here; else -1 */
	uint8_t *mem;	    /* the same address in both */
	int sock;	    /* owner_go() */
	struct owner_res *res;
};

struct owner_thr {
	struct owner *ow;
	unsigned idx;
	bool verify;	    /* each first visit compared with the image, then full passes */
};

static void *owner_toucher(void *arg)
{
	struct owner_thr *t = arg;
	struct owner *ow = t->ow;
	uint64_t s = g_seed ^ (0x9e3779b97f4a7c15ull * (t->idx + 1));

	while (!atomic_load(&ow->res->stop)) {
		if (t->verify) {
			/* A pass over every page, in a random walk: compare, count. */
			for (size_t k = 0; k < LEN / REL_PAGE && !atomic_load(&ow->res->stop); k++) {
				size_t p = (size_t)(t_rand(&s) % (LEN / REL_PAGE)) * REL_PAGE;

				if (memcmp(ow->mem + p, g_image + p, REL_PAGE))
					atomic_fetch_add(&ow->res->mismatches, 1);
				atomic_fetch_add(&ow->res->touches, 1);
			}
			for (size_t p = 0; p < LEN && !atomic_load(&ow->res->stop); p += REL_PAGE)
				if (memcmp(ow->mem + p, g_image + p, REL_PAGE))
					atomic_fetch_add(&ow->res->mismatches, 1);
			atomic_fetch_add(&ow->res->passes, 1);
			return NULL;
		}
		(void)*(volatile uint8_t *)(ow->mem + (t_rand(&s) % (LEN / REL_PAGE)) * REL_PAGE);
		atomic_fetch_add(&ow->res->touches, 1);
	}
	return NULL;
}

/*
 * Fork an owner: @mem mapped here before the fork (anonymous: the child's
 * copy at the same address) or a memfd the child creates; the child makes a
 * userfaultfd, sends it (and the memfd) over, and runs @nthr threads that
 * touch its memory, each verifying what it reads when @verify.
 */
static void owner_start(struct owner *ow, bool shared, unsigned nthr, bool verify)
{
	int sv[2];

	*ow = (struct owner){ .memfd = -1 };
	ow->res = rel_shared(sizeof(*ow->res));
	if (!shared)
		ow->mem = mmap(NULL, LEN, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	else
		/* Reserved here so both sides agree on the address; the child maps over it. */
		ow->mem = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(ow->mem != MAP_FAILED, "mmap");
	REQUIRE(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), "socketpair");
	ow->pid = fork();
	REQUIRE(ow->pid >= 0, "fork");
	if (!ow->pid) {
		struct owner_thr t[8];
		pthread_t thr[8];
		int fd, mfd = -1;

		close(sv[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (shared) {
			mfd = memfd_create("halite-rel-owner", MFD_CLOEXEC);
			if (mfd < 0 || ftruncate(mfd, LEN) ||
			    mmap(ow->mem, LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mfd,
				 0) != ow->mem)
				_exit(3);
		}
		madvise(ow->mem, LEN, MADV_NOHUGEPAGE);
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (fd < 0 || rel_send_fd(sv[1], fd) || (shared && rel_send_fd(sv[1], mfd)))
			_exit(3);
		/* Wait for "go": the handler has registered the memory. */
		if (read(sv[1], &(char){ 0 }, 1) != 1)
			_exit(3);
		for (unsigned i = 0; i < nthr; i++) {
			t[i] = (struct owner_thr){ ow, i, verify };
			pthread_create(&thr[i], NULL, owner_toucher, &t[i]);
		}
		for (unsigned i = 0; i < nthr; i++)
			pthread_join(thr[i], NULL);
		/* Stay, holding the descriptor, until killed. */
		for (;;)
			pause();
	}
	close(sv[1]);
	ow->uffd = rel_recv_fd(sv[0]);
	REQUIRE(ow->uffd >= 0, "recv uffd");
	if (shared) {
		ow->memfd = rel_recv_fd(sv[0]);
		REQUIRE(ow->memfd >= 0, "recv memfd");
	}
	ow->sock = sv[0];
}

/* The handler has registered the memory: the owner's threads may start (from any process). */
static void owner_go(struct owner *ow)
{
	REQUIRE(write(ow->sock, "g", 1) == 1, "go");
}

static void owner_stop(struct owner *ow)
{
	atomic_store(&ow->res->stop, 1);
	kill(ow->pid, SIGKILL);
	waitpid(ow->pid, NULL, 0);
	close(ow->sock);
	close(ow->uffd);
	if (ow->memfd >= 0)
		close(ow->memfd);
	munmap(ow->mem, LEN);
	munmap(ow->res, sizeof(*ow->res));
}

static struct halite_restore_region owner_region(const struct owner *ow)
{
	struct halite_restore_region reg = { "ram", (uintptr_t)ow->mem, LEN, HALITE_MEM_ANON,
					     -1, 0 };

	if (ow->memfd >= 0) {
		reg.kind = HALITE_MEM_SHARED;
		reg.fd = ow->memfd;
	}
	return reg;
}

/* ---- free ---- */

static void case_free(void)
{
	const char *env = getenv("REL_FREE_ITERS");
	unsigned iters = env ? (unsigned)atoi(env) : 1000, crashed = 0;
	uint64_t s = g_seed ^ 0xf2ee;

	printf("free: %u restores freed at random moments while three threads fault\n", iters);
	for (unsigned i = 0; i < iters; i++) {
		HALITE_OPTS(halite_restore_opts, o);
		struct halite_restore_region reg;
		struct halite_restore *r;
		struct owner ow;
		unsigned delay = (unsigned)(t_rand(&s) % 1000);
		pid_t pid;
		int st;

		owner_start(&ow, i % 2, 3, false);
		reg = owner_region(&ow);
		/*
		 * The restorer in a child of its own: a crash is counted, not
		 * the end of the test; sanitizers report it on stderr.
		 */
		pid = fork();
		REQUIRE(pid >= 0, "fork");
		if (!pid) {
			/* A hang (a use after free can be one) is a failure too. */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			alarm(30);
			o.owner_pid = ow.pid;
			o.owner_uffd = ow.uffd;
			o.workers = 2;
			o.demand_readers = 4;
			if (halite_restore_open(&r, g_path, &reg, 1, &o) || halite_restore_start(r))
				_exit(3);
			owner_go(&ow);
			rel_sleep_us(delay);
			halite_restore_free(r);
			_exit(0);
		}
		REQUIRE(waitpid(pid, &st, 0) == pid, "waitpid");
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			crashed++;
			printf("  iteration %u (delay %u us, %s): restorer %s %d\n", i, delay,
			       i % 2 ? "memfd" : "anonymous", WIFSIGNALED(st) ? "killed by signal" :
			       "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		}
		owner_stop(&ow);
	}
	CHECK(crashed == 0, "free: %u of %u freed restores crashed or failed", crashed, iters);
}

/* ---- attach ---- */

static void case_attach(bool shared)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg;
	struct halite_restore_stats st;
	struct halite_restore *r;
	struct owner ow;
	const char *what = shared ? "attach, memfd" : "attach, anonymous";
	uint64_t before, t0;
	pid_t pid;
	int ret;

	printf("%s: handler killed mid-restore, another takes over\n", what);
	owner_start(&ow, shared, 3, true);
	reg = owner_region(&ow);
	pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (!pid) {
		/* The first handler: slow reads, so that it dies with most not in. */
		o.owner_pid = ow.pid;
		o.owner_uffd = ow.uffd;
		o.read_latency_us = 2000;
		o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
		if (halite_restore_open(&r, g_path, &reg, 1, &o) || halite_restore_start(r))
			_exit(3);
		owner_go(&ow);
		for (;;)
			pause();
	}
	/* Let it serve a while, then kill it outright. */
	t0 = rel_now_ms();
	while (atomic_load(&ow.res->touches) < 100 && rel_now_ms() - t0 < 20000)
		rel_sleep_us(1000);
	CHECK(atomic_load(&ow.res->touches) >= 100, "%s: the first handler served %llu touches",
	      what, (unsigned long long)atomic_load(&ow.res->touches));
	kill(pid, SIGKILL);
	REQUIRE(waitpid(pid, NULL, 0) == pid, "waitpid");
	/*
	 * Without a handler the owner's threads run on only over pages already
	 * in, until each meets one that is not: then nothing moves, and none
	 * has finished. Settled: no touch for half a second.
	 */
	t0 = rel_now_ms();
	do {
		before = atomic_load(&ow.res->touches);
		rel_sleep_us(500000);
	} while (atomic_load(&ow.res->touches) != before && rel_now_ms() - t0 < 10000);
	CHECK(atomic_load(&ow.res->touches) == before && atomic_load(&ow.res->passes) == 0,
	      "%s: the owner ran on without a handler (%llu -> %llu touches, %llu passes)", what,
	      (unsigned long long)before, (unsigned long long)atomic_load(&ow.res->touches),
	      (unsigned long long)atomic_load(&ow.res->passes));
	/* The new handler. */
	o = (struct halite_restore_opts){ .sz = sizeof(o) };
	o.owner_pid = ow.pid;
	o.owner_uffd = ow.uffd;
	o.flags = HALITE_RESTORE_ATTACH;
	ret = halite_restore_open(&r, g_path, &reg, 1, &o);
	REQUIRE(!ret, "%s: open: %s", what, halite_strerror(ret));
	ret = halite_restore_start(r);
	CHECK(ret == 0, "%s: start %d: %s", what, ret, halite_restore_errmsg(r));
	if (!ret) {
		ret = halite_restore_wait(r, 60000);
		CHECK(ret == 0, "%s: wait %d: %s", what, ret, halite_restore_errmsg(r));
		halite_restore_stats(r, &st);
		check_sums(&st, what);
		CHECK(st.mb_present > 0 && st.mb_present < st.mb_total - st.mb_zero,
		      "%s: %llu blocks found in", what, (unsigned long long)st.mb_present);
		printf("  %llu blocks were in already, %llu faults after the take-over\n",
		       (unsigned long long)st.mb_present, (unsigned long long)st.faults);
		t0 = rel_now_ms();
		while (atomic_load(&ow.res->passes) < 3 && rel_now_ms() - t0 < 60000)
			rel_sleep_us(1000);
		CHECK(atomic_load(&ow.res->passes) == 3, "%s: %llu of 3 owner threads finished",
		      what, (unsigned long long)atomic_load(&ow.res->passes));
		CHECK(atomic_load(&ow.res->mismatches) == 0, "%s: %llu pages differed", what,
		      (unsigned long long)atomic_load(&ow.res->mismatches));
	}
	halite_restore_free(r);
	owner_stop(&ow);
}

int main(int argc, char **argv)
{
	rel_begin("test_rel_restore");
	g_seed = t_seed("test_rel_restore");
	make_snapshot();
	if (rel_wanted(argc, argv, "straddle")) {
		case_straddle(false);
		case_straddle(true);
	}
	if (rel_wanted(argc, argv, "enoent"))
		case_enoent();
	if (rel_wanted(argc, argv, "discard")) {
		case_discard_demand();
		case_discard_prefetch();
	}
	if (rel_wanted(argc, argv, "attach")) {
		case_attach(false);
		case_attach(true);
	}
	if (rel_wanted(argc, argv, "free"))
		case_free();
	unlink(g_path);
	return check_result();
}
