// SPDX-License-Identifier: MIT
/*
 * The template source and clone sessions (halite/restore/template.c, session.c):
 * every clone's memory exact, each locality block read and decoded once for
 * all clones, writes private to their clone, a template reopened over its
 * files keeping what it had, a session taken over (ATTACH) after its
 * handler went away, a corrupt LB failing only the clones that need it,
 * the hot set mapped before a clone runs, saved as a restore trace of
 * version 2 and read back (an old-format one too), a relayouted snapshot's
 * hot prefix taken as the hot set, and bad arguments refused.
 *
 * Clones are this process's threads over private mappings of the memory
 * file (owner_pid 0) or forked children that hand their userfaultfd over
 * (owner_pid set), as halite-cloned's clones do.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include <halite/halite.h>
#include <halite/template.h>

#include "restore_util.h"
#include "test_util.h"
#include "uffd.h"

#define MB_SIZE 8192u
#define NMB 1024u
#define LEN ((uint64_t)NMB * MB_SIZE)
#define PAGE 4096u

static uint8_t *g_image;	/* what every clone must read */
static uint8_t g_kind[NMB];	/* 0 untouched, 1 zero, 2 stored */
static char g_snap[64], g_snap2[64], g_mem[96], g_hot[96];

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static uint64_t g_order[NMB];	/* the order blocks are written in */

static void write_snapshot(const char *path, const char *relayout_meta);

/* 1024 blocks: a tenth zero, a tenth never touched, the rest half random, in 3 streams. */
static void make_snapshot(void)
{
	uint64_t x = 0x1234567, order[NMB];

	g_image = calloc(1, LEN);
	assert_non_null(g_image);
	for (uint32_t mb = 0; mb < NMB; mb++) {
		uint64_t r = rnd(&x) % 10;

		g_kind[mb] = r == 0 ? 0 : r == 1 ? 1 : 2;
		if (g_kind[mb] == 2)
			for (uint32_t i = 0; i < MB_SIZE / 2; i++)
				g_image[(uint64_t)mb * MB_SIZE + i] = (uint8_t)rnd(&x);
		g_image[(uint64_t)mb * MB_SIZE + MB_SIZE - 1] = g_kind[mb] == 2 ? (uint8_t)mb | 1 : 0;
		order[mb] = mb;
	}
	for (uint32_t i = NMB - 1; i > 0; i--) {
		uint64_t j = rnd(&x) % (i + 1), tmp = order[i];

		order[i] = order[j];
		order[j] = tmp;
	}
	snprintf(g_snap, sizeof(g_snap), "/tmp/halite-tpl-%d.hlt", (int)getpid());
	snprintf(g_snap2, sizeof(g_snap2), "/tmp/halite-tpl-%d-2.hlt", (int)getpid());
	memcpy(g_order, order, sizeof(order));
	write_snapshot(g_snap, NULL);
}

/* The image in g_order, with metadata halite.relayout = @relayout_meta if set. */
static void write_snapshot(const char *path, const char *relayout_meta)
{
	const struct halite_region reg = { "pc.ram", 0, LEN };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	const uint64_t *order = g_order;

	o.mb_pages = MB_SIZE / PAGE;
	o.vcpu_count = 1;
	o.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, path, &reg, 1, &o), 0);
	if (relayout_meta)
		assert_int_equal(halite_writer_set_meta(w, "halite.relayout", relayout_meta,
							(uint32_t)strlen(relayout_meta)), 0);
	for (uint32_t i = 0; i < NMB; i++) {
		uint64_t mb = order[i];

		if (g_kind[mb] == 1)
			assert_int_equal(halite_writer_put_zero(w, mb), 0);
		else if (g_kind[mb] == 2)
			assert_true(halite_writer_put(w, (uint32_t)(i % 3), mb,
						      g_image + mb * MB_SIZE) >= 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
}

static void remove_mem(void)
{
	char fill[128];

	snprintf(fill, sizeof(fill), "%s.fill", g_mem);
	unlink(g_mem);
	unlink(fill);
	unlink(g_hot);
}

static int setup(void **state)
{
	struct halite_uffd_caps caps;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_MINOR_SHMEM)) {
		fprintf(stderr, "no userfaultfd with MINOR_SHMEM: skipped\n");
		exit(77);
	}
	snprintf(g_mem, sizeof(g_mem), "/dev/shm/halite-tpl-%d.mem", (int)getpid());
	snprintf(g_hot, sizeof(g_hot), "/tmp/halite-tpl-%d.hot", (int)getpid());
	remove_mem();
	return 0;
}

/* Clones of the running test (ext_start()), killed here if it fails before ext_end(). */
static pid_t g_kids[8];
static char g_mnt[96];

static int teardown(void **state)
{
	for (unsigned i = 0; i < 8; i++)
		if (g_kids[i]) {
			kill(g_kids[i], SIGKILL);
			waitpid(g_kids[i], NULL, 0);
			g_kids[i] = 0;
		}
	if (g_mnt[0]) {
		umount2(g_mnt, MNT_DETACH);
		rmdir(g_mnt);
		g_mnt[0] = 0;
	}
	remove_mem();
	return 0;
}

static struct halite_template *open_tpl(unsigned flags, uint32_t latency_us)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template *t;

	o.flags = flags;
	o.read_latency_us = latency_us;
	o.hotset_path = g_hot;
	o.hot_window_ms = 60000;
	assert_int_equal(halite_template_open(&t, g_snap, g_mem, &o), 0);
	return t;
}

static uint8_t *map_clone(struct halite_template *t)
{
	uint64_t off, len;
	void *p;

	assert_int_equal(halite_template_region(t, "pc.ram", &off, &len), 0);
	assert_int_equal(len, LEN);
	p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE, halite_template_memfd(t),
		 (off_t)off);
	assert_true(p != MAP_FAILED);
	return p;
}

static struct halite_session *start_local(struct halite_template *t, uint8_t *mem, unsigned flags)
{
	const struct halite_session_region r = { "pc.ram", (uint64_t)(uintptr_t)mem, LEN };
	HALITE_OPTS(halite_session_opts, o);
	struct halite_session *s;
	int ret;

	o.flags = flags;
	o.owner_uffd = -1;
	ret = halite_session_start(&s, t, &r, 1, &o);
	if (ret)
		fail_msg("session: %s", halite_strerror(ret));
	return s;
}

struct toucher {
	uint8_t *mem;
	uint64_t seed;
	int mismatches;
};

/* Every page once, in a random order, each compared with the image. */
static void *touch_all(void *arg)
{
	struct toucher *tc = arg;
	uint64_t x = tc->seed | 1, order[LEN / PAGE];

	for (uint64_t i = 0; i < LEN / PAGE; i++)
		order[i] = i;
	for (uint64_t i = LEN / PAGE - 1; i > 0; i--) {
		uint64_t j = rnd(&x) % (i + 1), tmp = order[i];

		order[i] = order[j];
		order[j] = tmp;
	}
	for (uint64_t i = 0; i < LEN / PAGE; i++)
		if (memcmp(tc->mem + order[i] * PAGE, g_image + order[i] * PAGE, PAGE))
			tc->mismatches++;
	return NULL;
}

static void check_tpl_once(struct halite_template *t)
{
	struct halite_template_stats st;

	halite_template_stats(t, &st);
	assert_true(st.complete);
	assert_int_equal(st.mb_in, st.mb_stored);
	/* Each LB read and decoded once, whatever number of clones asked. */
	assert_int_equal(st.lb_demand + st.lb_prefetch + st.lb_in_at_open, st.lb_total);
	assert_int_equal(st.mb_decoded + st.mb_in_at_open, st.mb_stored);
	assert_int_equal(st.bytes_read, (st.lb_demand + st.lb_prefetch) * 65536); /* default LB size */
	assert_int_equal(st.lb_failed, 0);
}

/* Four clones at once, no prefetch: every page exact, every LB read once. */
static void test_clones_exact(void **state)
{
	struct halite_template *t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	struct halite_session *s[4];
	struct toucher tc[4];
	pthread_t th[4];
	uint8_t *mem[4];
	struct halite_template_stats ts;
	uint64_t nempty = 0, zero_faults = 0, neighbours = 0, asked = 0;

	for (uint32_t mb = 0; mb < NMB; mb++)
		nempty += g_kind[mb] != 2;
	for (int i = 0; i < 4; i++) {
		mem[i] = map_clone(t);
		s[i] = start_local(t, mem[i], 0);
		tc[i] = (struct toucher){ mem[i], 17 + (uint64_t)i, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, touch_all, &tc[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		struct halite_session_stats ss;

		pthread_join(th[i], NULL);
		assert_int_equal(tc[i].mismatches, 0);
		assert_int_equal(halite_session_wait(s[i], 10000), 0);
		halite_session_stats(s[i], &ss);
		assert_true(ss.done);
		assert_int_equal(ss.faults, ss.faults_cached + ss.faults_read + ss.faults_zero);
		/*
		 * A zero block faults at most once (both its pages get the zero
		 * page); none faults once another clone completed the template
		 * (the session is done and gone).
		 */
		assert_true(ss.faults_zero <= nempty);
		zero_faults += ss.faults_zero;
		neighbours += ss.mb_neighbours;
		asked += ss.lb_read;
		assert_int_equal(ss.bytes_read, ss.lb_read * 65536);
		assert_int_equal(memcmp(mem[i], g_image, LEN), 0);
	}
	/* Zero blocks got the zero page; blocks were mapped beside faulting ones. */
	assert_true(zero_faults > 0 && neighbours > 0);
	check_tpl_once(t);
	halite_template_stats(t, &ts);
	assert_int_equal(ts.lb_prefetch, 0);
	/* No prefetch: every LB read was asked for first by exactly one clone. */
	assert_int_equal(asked, ts.lb_demand);
	/* The later clones found blocks in, or joined a read in flight. */
	assert_true(ts.hits > 0);
	for (int i = 0; i < 4; i++) {
		halite_session_free(s[i]);
		munmap(mem[i], LEN);
	}
	halite_template_free(t);
	remove_mem();
}

/* A clone's writes are its own: the next clone and the file see the snapshot. */
static void test_writes_private(void **state)
{
	struct halite_template *t = open_tpl(0, 0);
	uint8_t *a = map_clone(t), *b = map_clone(t), *page = malloc(PAGE);
	struct halite_session *sa = start_local(t, a, 0), *sb;
	struct toucher tc = { 0 };

	for (uint64_t p = 0; p < LEN / PAGE; p += 3)
		a[p * PAGE + 5] ^= 0xff;
	sb = start_local(t, b, 0);
	tc.mem = b;
	tc.seed = 99;
	touch_all(&tc);
	assert_int_equal(tc.mismatches, 0);
	assert_int_equal(halite_session_wait(sa, 10000), 0);
	assert_int_equal(halite_session_wait(sb, 10000), 0);
	for (uint64_t p = 0; p < LEN / PAGE; p++) {
		assert_int_equal(a[p * PAGE + 5], g_image[p * PAGE + 5] ^ (p % 3 ? 0 : 0xff));
		assert_int_equal(pread(halite_template_memfd(t), page, PAGE, (off_t)(p * PAGE)), PAGE);
		if (g_kind[p * PAGE / MB_SIZE] == 2)
			assert_memory_equal(page, g_image + p * PAGE, PAGE);
	}
	check_tpl_once(t);
	halite_session_free(sa);
	halite_session_free(sb);
	munmap(a, LEN);
	munmap(b, LEN);
	free(page);
	halite_template_free(t);
	remove_mem();
}

/*
 * Reopened over its files, a template keeps the blocks it had; a block
 * with no fill byte (half written when its process died) is decoded again.
 */
static void test_reopen(void **state)
{
	struct halite_template *t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	struct halite_template_stats st;
	uint8_t *mem = map_clone(t), junk[MB_SIZE];
	struct halite_session *s = start_local(t, mem, 0);
	uint64_t in, half = 0;
	struct toucher tc = { 0 };
	int fd;

	for (uint32_t mb = 0; mb < NMB / 2; mb++)
		assert_int_equal(mem[(uint64_t)mb * MB_SIZE], g_image[(uint64_t)mb * MB_SIZE]);
	halite_template_stats(t, &st);
	in = st.mb_in;
	assert_true(in > 0 && in < st.mb_stored);
	/* Let the session map nothing more: stop it (no fault waits), then the template. */
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);

	/* Scribble over a stored block the template does not have (its fill byte 0). */
	{
		char fill[128];
		uint8_t map[NMB];

		snprintf(fill, sizeof(fill), "%s.fill", g_mem);
		fd = open(fill, O_RDONLY);
		assert_true(fd >= 0);
		assert_int_equal(pread(fd, map, NMB, 64), NMB);
		close(fd);
		for (uint32_t mb = NMB - 1; mb > NMB / 2; mb--)
			if (g_kind[mb] == 2 && !map[mb]) {
				half = mb;
				break;
			}
		assert_true(half > 0);
	}
	memset(junk, 0xa5, sizeof(junk));
	fd = open(g_mem, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, junk, MB_SIZE, (off_t)(half * MB_SIZE)), MB_SIZE);
	close(fd);

	t = open_tpl(0, 0);
	halite_template_stats(t, &st);
	/* At least what it had when asked (LBs being decoded then finished since). */
	assert_true(st.mb_in_at_open >= in && st.mb_in_at_open < st.mb_stored);
	in = st.mb_in_at_open;
	mem = map_clone(t);
	s = start_local(t, mem, 0);
	tc.mem = mem;
	tc.seed = 5;
	touch_all(&tc);
	assert_int_equal(tc.mismatches, 0);
	assert_int_equal(halite_session_wait(s, 10000), 0);
	check_tpl_once(t);
	halite_template_stats(t, &st);
	assert_int_equal(st.mb_decoded, st.mb_stored - in);
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);

	/* Complete, reopened: nothing is read again. */
	t = open_tpl(0, 0);
	assert_int_equal(halite_template_wait(t, 1000), 0);
	halite_template_stats(t, &st);
	assert_int_equal(st.mb_in_at_open, st.mb_stored);
	assert_int_equal(st.lb_in_at_open, st.lb_total);
	assert_int_equal(st.lb_demand + st.lb_prefetch + st.bytes_read + st.mb_decoded, 0);
	halite_template_free(t);
	remove_mem();
}

/*
 * A clone in a child process, as halite-cloned runs them: it maps the
 * memory file, makes a userfaultfd and sends it, then answers requests
 * "hash [off, off+len)" by reading its memory.
 */
struct ext {
	pid_t pid;
	int sock, uffd;
	uint64_t host, len;
};

struct ext_req {
	uint64_t off, len;
};

/*
 * Pages a clone touched in a thread of its own (a request of length 0),
 * shared with the test: 1 once the touch returned. A touch that must never
 * return (a damaged block) is seen without blocking the clone's answers.
 */
#define TOUCHED_MAX 16384u
static _Atomic uint8_t *g_touched;
static int g_touched_fd = -1; /* its memfd, which the clone maps after its exec */

struct ext_touch {
	volatile uint8_t *p;
	uint64_t page;
};

static void *ext_touch_main(void *arg)
{
	struct ext_touch *et = arg;

	(void)*et->p;
	if (g_touched && et->page < TOUCHED_MAX)
		atomic_store(&g_touched[et->page], 1);
	free(et);
	return NULL;
}

static void ext_child(int sock, int memfd, uint64_t off, uint64_t len)
{
	uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, memfd, (off_t)off);
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	uint64_t host = (uint64_t)(uintptr_t)mem;
	struct iovec iov = { &host, sizeof(host) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	struct ext_req rq;

	if (mem == MAP_FAILED || uffd < 0)
		_exit(2);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &uffd, sizeof(int));
	if (sendmsg(sock, &mh, 0) != sizeof(host))
		_exit(2);
	while (read(sock, &rq, sizeof(rq)) == sizeof(rq)) {
		uint64_t h;

		if (!rq.len) {
			struct ext_touch *et = malloc(sizeof(*et));
			pthread_t th;

			if (!et)
				_exit(2);
			*et = (struct ext_touch){ mem + rq.off, rq.off / PAGE };
			if (pthread_create(&th, NULL, ext_touch_main, et))
				_exit(2);
			pthread_detach(th);
			continue;
		}
		h = XXH3_64bits(mem + rq.off, rq.len);

		if (write(sock, &h, sizeof(h)) != sizeof(h))
			_exit(2);
	}
	_exit(0);
}


/*
 * The clone is this program run again (main(): --ext-child), not a bare
 * fork: the template's threads (readers, prefetcher, decode pool) run at
 * the fork, and a forked child that then allocates or starts threads can
 * find a lock one of them held frozen forever (seen under ASan: the clone
 * never touched its memory). Between fork and exec only fcntl() and
 * execv() run, both async-signal-safe.
 */
static void ext_start(struct ext *e, struct halite_template *t)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &e->host, sizeof(e->host) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	char a[5][32];
	char *argv[] = { "test_template", "--ext-child", a[0], a[1], a[2], a[3], a[4], NULL };
	int sv[2], memfd = halite_template_memfd(t);
	uint64_t off;

	assert_int_equal(halite_template_region(t, "pc.ram", &off, &e->len), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	snprintf(a[0], sizeof(a[0]), "%d", sv[1]);
	snprintf(a[1], sizeof(a[1]), "%d", memfd);
	snprintf(a[2], sizeof(a[2]), "%llu", (unsigned long long)off);
	snprintf(a[3], sizeof(a[3]), "%llu", (unsigned long long)e->len);
	snprintf(a[4], sizeof(a[4]), "%d", g_touched_fd);
	e->pid = fork();
	assert_true(e->pid >= 0);
	if (!e->pid) {
		/* The child's own descriptor table: these stay open across its exec. */
		fcntl(sv[1], F_SETFD, 0);
		fcntl(memfd, F_SETFD, 0);
		if (g_touched_fd >= 0)
			fcntl(g_touched_fd, F_SETFD, 0);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(sv[1]);
	for (unsigned i = 0; i < 8; i++)
		if (!g_kids[i]) {
			g_kids[i] = e->pid;
			break;
		}
	e->sock = sv[0];
	assert_int_equal(recvmsg(e->sock, &mh, 0), sizeof(e->host));
	assert_non_null(CMSG_FIRSTHDR(&mh));
	memcpy(&e->uffd, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof(int));
}

static int ext_session(struct ext *e, struct halite_template *t, unsigned flags,
		       struct halite_session **s)
{
	const struct halite_session_region r = { "pc.ram", e->host, e->len };
	HALITE_OPTS(halite_session_opts, o);

	o.flags = flags;
	o.owner_pid = e->pid;
	o.owner_uffd = e->uffd;
	return halite_session_start(s, t, &r, 1, &o);
}

static void ext_ask(struct ext *e, uint64_t off, uint64_t len)
{
	struct ext_req rq = { off, len };

	assert_int_equal(write(e->sock, &rq, sizeof(rq)), sizeof(rq));
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The answer within @ms: 1 and *h, or 0 when none came (the clone is blocked). */
static int ext_answer(struct ext *e, int ms, uint64_t *h)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	uint64_t end = mono_ns() + (uint64_t)ms * 1000000, now;
	ssize_t n;

	setsockopt(e->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* A signal (a clone's thread ending, ...) is not the end of the wait. */
	while ((n = read(e->sock, h, sizeof(*h))) < 0 && errno == EINTR &&
	       (now = mono_ns()) < end) {
		tv.tv_sec = (time_t)((end - now) / 1000000000);
		tv.tv_usec = (suseconds_t)((end - now) % 1000000000 / 1000);
		setsockopt(e->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}
	return n == sizeof(*h);
}

/* Block @mb as the clone reads it: answered within 10 s, and exactly the snapshot's. */
static void ext_check_mb(struct ext *e, uint64_t mb)
{
	uint64_t h;

	ext_ask(e, mb * MB_SIZE, MB_SIZE);
	assert_int_equal(ext_answer(e, 10000, &h), 1);
	assert_int_equal(h, XXH3_64bits(g_image + mb * MB_SIZE, MB_SIZE));
}

static void ext_end(struct ext *e)
{
	int st;

	kill(e->pid, SIGKILL);
	waitpid(e->pid, &st, 0);
	for (unsigned i = 0; i < 8; i++)
		if (g_kids[i] == e->pid)
			g_kids[i] = 0;
	close(e->sock);
	close(e->uffd);
}

/* The first stored block of LB @lb's (by the reader). */
static uint64_t block_of_lb(struct halite_template *t, uint64_t lb)
{
	const uint64_t *mbs;
	uint32_t n;

	assert_int_equal(halite_reader_lb_members(halite_template_reader(t), lb, &mbs, &n), 0);
	assert_true(n > 0);
	return mbs[0];
}

/*
 * The handler goes away while a fault waits (a daemon killed): the clone
 * stays blocked; a new session that takes the descriptor over (ATTACH)
 * answers it, exactly.
 */
static void test_attach(void **state)
{
	/* Demand reads only, each 2 s: the fault below waits while its handler goes. */
	struct halite_template *t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 2000000);
	struct halite_session_stats ss;
	struct halite_session *s;
	const uint64_t *mbs;
	uint32_t n;
	struct ext e;
	uint64_t mb, h, lb = 3;

	ext_start(&e, t);
	assert_int_equal(ext_session(&e, t, 0, &s), 0);
	mb = block_of_lb(t, lb);
	ext_ask(&e, mb * MB_SIZE, MB_SIZE);
	do {
		usleep(1000);
		halite_session_stats(s, &ss);
	} while (!ss.faults);
	halite_session_free(s); /* the fault read, its LB being read */
	assert_int_equal(ext_answer(&e, 600, &h), 0);
	/* The descriptor had its handshake: without ATTACH that is refused. */
	assert_int_equal(ext_session(&e, t, 0, &s), -HALITE_E_STATE);
	assert_int_equal(ext_session(&e, t, HALITE_SESSION_ATTACH, &s), 0);
	assert_int_equal(ext_answer(&e, 10000, &h), 1);
	assert_int_equal(h, XXH3_64bits(g_image + mb * MB_SIZE, MB_SIZE));
	/* The rest of that LB, now in: served exactly by the new session. */
	assert_int_equal(halite_reader_lb_members(halite_template_reader(t), lb, &mbs, &n), 0);
	for (uint32_t i = 0; i < n; i++)
		ext_check_mb(&e, mbs[i]);
	halite_session_free(s);
	ext_end(&e);
	halite_template_free(t);
	remove_mem();
}

/* A corrupt LB fails the clone that needs it, naming the LB; the other clone is exact. */
static void test_corrupt_lb(void **state)
{
	struct halite_template *t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	struct halite_lb_info li;
	struct halite_session *sa, *sb;
	struct ext a, b;
	uint64_t bad, h, lb = 2;
	char want[64];
	uint8_t x;
	int fd;

	/* Flip a byte inside LB 2's payload. */
	assert_int_equal(halite_reader_lb_info(halite_template_reader(t), lb, &li), 0);
	bad = block_of_lb(t, lb);
	fd = open(g_snap, O_RDWR);
	assert_int_equal(pread(fd, &x, 1, (off_t)li.offset + 100), 1);
	x ^= 0x40;
	assert_int_equal(pwrite(fd, &x, 1, (off_t)li.offset + 100), 1);
	ext_start(&a, t);
	ext_start(&b, t);
	assert_int_equal(ext_session(&a, t, 0, &sa), 0);
	assert_int_equal(ext_session(&b, t, 0, &sb), 0);
	ext_ask(&a, bad * MB_SIZE, MB_SIZE);
	assert_int_equal(halite_session_wait(sa, 10000), -HALITE_E_LB_CHECKSUM);
	snprintf(want, sizeof(want), "locality block %llu at offset", (unsigned long long)lb);
	assert_non_null(strstr(halite_session_errmsg(sa), want));
	assert_int_equal(ext_answer(&a, 300, &h), 0); /* blocked, never zeros */
	for (uint32_t mb = 0; mb < NMB; mb++) {
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_mb_lookup(halite_template_reader(t), mb, &loc), 0);
		if (loc.state == HALITE_MB_STORED && loc.lb == lb)
			continue;
		ext_check_mb(&b, mb);
	}
	assert_int_equal(halite_session_wait(sb, 100), -ETIMEDOUT); /* never complete */
	x ^= 0x40;
	assert_int_equal(pwrite(fd, &x, 1, (off_t)li.offset + 100), 1);
	close(fd);
	halite_session_free(sa);
	halite_session_free(sb);
	ext_end(&a);
	ext_end(&b);
	halite_template_free(t);
	remove_mem();
}

/* The format 1.1 file of two mb-map chunks: r_write_chunked() (restore_util.h). */
#define C_MB R_CHUNKED_MB
#define C_NMB R_CHUNKED_NMB
#define C_LEN R_CHUNKED_LEN
#define c_kind r_chunked_kind

/*
 * A format 1.1 file whose second mb-map chunk is damaged: it opens (chunks
 * are checked on use). A clone faults on every block: those of the damaged
 * chunk, zero and never-touched ones too, never complete (no zero page, no
 * stale byte) and the session fails naming the chunk; every block of the
 * good chunk is exact; the template's error says it, and no block of the
 * damaged chunk is ever marked in (prefetch included).
 */
static void test_damaged_chunk(void **state)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template_stats st;
	struct halite_template *t;
	struct halite_session *s;
	struct halite_reader *rd;
	char path[96], fill[128];
	uint8_t *img = NULL, map[C_NMB];
	uint64_t nbad = 0;
	struct ext e;
	int fd;

#ifdef __SANITIZE_THREAD__
	/*
	 * Each blocked fault runs on a thread of the forked clone, and
	 * ThreadSanitizer does not support threads started after a fork of a
	 * multi-threaded process (it dies). The release and ASan runs hold it.
	 */
	skip();
#endif
	snprintf(path, sizeof(path), "/tmp/halite-tpl-%d-c.hlt", (int)getpid());
	assert_int_equal(r_write_chunked(path, &img), 0);
	assert_int_equal(r_damage_map_entry(path, 8192 + 7), 0);
	g_touched_fd = memfd_create("touched", MFD_CLOEXEC);
	assert_true(g_touched_fd >= 0);
	assert_int_equal(ftruncate(g_touched_fd, TOUCHED_MAX), 0);
	g_touched = mmap(NULL, TOUCHED_MAX, PROT_READ | PROT_WRITE, MAP_SHARED, g_touched_fd, 0);
	assert_true(g_touched != MAP_FAILED);

	assert_int_equal(halite_template_open(&t, path, g_mem, &o), 0);
	ext_start(&e, t);
	assert_int_equal(e.len, C_LEN);
	assert_int_equal(ext_session(&e, t, 0, &s), 0);
	/* Every block of the damaged chunk, each touched in a thread of its own. */
	for (uint64_t mb = 8192; mb < C_NMB; mb++)
		ext_ask(&e, mb * C_MB, 0);
	assert_int_equal(halite_session_wait(s, 10000), -HALITE_E_CHECKSUM);
	if (!strstr(halite_session_errmsg(s), "mb-map chunk 1 ") ||
	    !strstr(halite_session_errmsg(s), "checksum mismatch"))
		fail_msg("session error: '%s'", halite_session_errmsg(s));
	/*
	 * The rest, every block, bytes compared: the session serves it on. A
	 * stored block of the good chunk whose LB holds blocks of the damaged
	 * one cannot be looked up either (its LB's member list is checked
	 * against their entries): as the reader says, it never completes.
	 */
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	for (uint64_t mb = 0; mb < 8192; mb++) {
		struct halite_mb_loc loc;
		uint64_t h;

		if (halite_reader_mb_lookup(rd, mb, &loc)) {
			ext_ask(&e, mb * C_MB, 0);
			nbad++;
			continue;
		}
		ext_ask(&e, mb * C_MB, C_MB);
		if (ext_answer(&e, 10000, &h) != 1) {
			struct halite_session_stats ss;

			halite_session_stats(s, &ss);
			halite_template_stats(t, &st);
			fail_msg("block %llu (kind %d) not answered (faults %llu read %llu cached %llu "
				 "zero %llu; template in %llu failed %llu requests %llu)",
				 (unsigned long long)mb, c_kind(mb), (unsigned long long)ss.faults,
				 (unsigned long long)ss.faults_read, (unsigned long long)ss.faults_cached,
				 (unsigned long long)ss.faults_zero, (unsigned long long)st.mb_in,
				 (unsigned long long)st.lb_failed, (unsigned long long)st.requests);
		}
		if (h != XXH3_64bits(img + mb * C_MB, C_MB))
			fail_msg("block %llu (kind %d) differs", (unsigned long long)mb, c_kind(mb));
	}
	assert_true(nbad < 256);
	usleep(300000);
	for (uint64_t mb = 0; mb < C_NMB; mb++)
		if (atomic_load(&g_touched[mb]))
			fail_msg("block %llu of the damaged chunk (kind %d) was answered",
				 (unsigned long long)mb, c_kind(mb));
	halite_template_stats(t, &st);
	assert_int_equal(st.error, -HALITE_E_CHECKSUM);
	assert_false(st.complete);
	if (!strstr(halite_template_errmsg(t), "mb-map chunk 1 "))
		fail_msg("template error: '%s'", halite_template_errmsg(t));
	assert_int_equal(halite_template_wait(t, 100), -HALITE_E_CHECKSUM);
	/* No block of the damaged chunk is in the file (its fill byte 0). */
	snprintf(fill, sizeof(fill), "%s.fill", g_mem);
	fd = open(fill, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, map, C_NMB, 64), C_NMB);
	close(fd);
	for (uint64_t mb = 0; mb < C_NMB; mb++) {
		struct halite_mb_loc loc;
		bool good = mb < 8192 && !halite_reader_mb_lookup(rd, mb, &loc);

		assert_int_equal(map[mb], good && c_kind(mb) == 2);
	}
	halite_reader_free(rd);

	halite_session_free(s);
	ext_end(&e);
	halite_template_free(t);
	munmap((void *)g_touched, TOUCHED_MAX);
	g_touched = NULL;
	close(g_touched_fd);
	g_touched_fd = -1;
	free(img);
	unlink(path);
	remove_mem();
}

/* The whole of @path as a string (free() it). */
static char *slurp(const char *path)
{
	char *buf = t_slurp(path, NULL);

	assert_non_null(buf);
	return buf;
}

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* "halite-restore-trace 2\nfile-uuid HEX\n" of @snap. */
static void trace_head(const char *snap, char *buf, size_t len)
{
	struct halite_reader *r;
	const uint8_t *u;
	int n;

	assert_int_equal(halite_reader_open(&r, snap, NULL), 0);
	u = halite_reader_info(r)->uuid;
	n = snprintf(buf, len, "halite-restore-trace 2\nfile-uuid ");
	for (int i = 0; i < 16; i++)
		n += snprintf(buf + n, len - (size_t)n, "%02x", u[i]);
	snprintf(buf + n, len - (size_t)n, "\n");
	halite_reader_free(r);
}

/* The @i-th block of kind @kind (0 untouched, 1 zero, 2 stored). */
static uint64_t nth_kind(int kind, unsigned i)
{
	for (uint32_t mb = 0; mb < NMB; mb++)
		if (g_kind[mb] == kind && !i--)
			return mb;
	fail_msg("no block %u of kind %d", i, kind);
	return 0;
}

static uint64_t hot_mb(struct halite_template *t, uint64_t *prefix)
{
	struct halite_template_stats st;

	halite_template_stats(t, &st);
	if (prefix)
		*prefix = st.hot_mb_prefix;
	return st.hot_mb;
}

/*
 * The hot set: what a clone touched in its first moments, saved; a later
 * template's clone started with PREMAP_HOT has it mapped and never faults
 * on it.
 */
static void test_hot_set(void **state)
{
	struct halite_template *t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	struct halite_template_stats st;
	struct halite_session_stats ss;
	uint8_t *mem = map_clone(t);
	struct halite_session *s = start_local(t, mem, 0);
	uint64_t nhot = 0;

	for (uint32_t mb = 0; mb < NMB; mb += 7) {
		assert_int_equal(mem[(uint64_t)mb * MB_SIZE + 1], g_image[(uint64_t)mb * MB_SIZE + 1]);
		nhot += g_kind[mb] == 2;
	}
	halite_template_stats(t, &st);
	/* Stored blocks it faulted on (not the zero page, not those mapped beside them). */
	assert_true(st.hot_mb > 0 && st.hot_mb <= nhot);
	nhot = st.hot_mb;
	assert_int_equal(halite_template_hotset_save(t), 0);
	halite_session_free(s);
	munmap(mem, LEN);
	/*
	 * A restore trace of version 2 as a template writes it: header, uuid,
	 * learn line, a touch line per hot block in first-fault order. Which
	 * blocks fault is up to neighbours mapped after a fault: each is a
	 * block the clone touched, stored, in its touch order (ascending), and
	 * the first touched block of every LB must be there (nothing else had
	 * mapped it).
	 */
	{
		struct halite_reader *rd = halite_template_reader(t);
		char head[128], *txt = slurp(g_hot), *line, *save = NULL;
		uint8_t lb_seen[NMB] = { 0 };
		uint64_t n = 0, prev_mb = 0, prev_t = 0, want_first = 0, got_first = 0;
		uint8_t listed[NMB] = { 0 };

		trace_head(g_snap, head, sizeof(head));
		assert_memory_equal(txt, head, strlen(head));
		line = strtok_r(txt + strlen(head), "\n", &save);
		assert_string_equal(line, "learn 60000 0");
		while ((line = strtok_r(NULL, "\n", &save))) {
			unsigned long long tn, mb;
			char kind[16];
			int end = 0;

			assert_int_equal(sscanf(line, "touch %llu - %llu %15s%n", &tn, &mb, kind, &end), 3);
			assert_int_equal((size_t)end, strlen(line));
			assert_string_equal(kind, "stored");
			assert_true(mb < NMB && g_kind[mb] == 2 && mb % 7 == 0);
			assert_true(n == 0 || (mb > prev_mb && tn >= prev_t));
			listed[mb] = 1;
			prev_mb = mb;
			prev_t = tn;
			n++;
		}
		assert_int_equal(n, nhot);
		for (uint32_t mb = 0; mb < NMB; mb += 7) {
			struct halite_mb_loc loc;

			if (g_kind[mb] != 2)
				continue;
			assert_int_equal(halite_reader_mb_lookup(rd, mb, &loc), 0);
			if (lb_seen[loc.lb])
				continue;
			lb_seen[loc.lb] = 1;
			want_first++;
			got_first += listed[mb];
		}
		assert_int_equal(got_first, want_first);
		free(txt);
	}
	halite_template_free(t);
	/* A fresh memory file: the hot set is all that is carried over. */
	{
		char fill[128];

		snprintf(fill, sizeof(fill), "%s.fill", g_mem);
		unlink(g_mem);
		unlink(fill);
	}
	t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	halite_template_stats(t, &st);
	assert_int_equal(st.mb_in_at_open, 0);
	assert_int_equal(st.hot_mb, nhot);
	mem = map_clone(t);
	s = start_local(t, mem, HALITE_SESSION_PREMAP_HOT | HALITE_SESSION_NO_HOT_RECORD);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.mb_premapped, nhot);
	for (uint32_t mb = 0; mb < NMB; mb += 7)
		if (g_kind[mb] == 2)
			assert_int_equal(mem[(uint64_t)mb * MB_SIZE + 1],
					 g_image[(uint64_t)mb * MB_SIZE + 1]);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.faults, 0);
	/* A damaged hot set is ignored. */
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);
	{
		int fd = open(g_hot, O_WRONLY);

		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, "x", 1, 40), 1);
		close(fd);
	}
	t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	halite_template_stats(t, &st);
	assert_int_equal(st.hot_mb, 0);
	halite_template_free(t);
	remove_mem();
}

/*
 * Any version 2 trace of the snapshot is read as a hot set: a learning
 * restore's (stat and lb lines skipped, its stored blocks' touches taken in
 * order, zero ones not); saved again as a template writes it, t_ns and
 * vCPUs kept, what sessions add after them. Traces that break the format
 * or are another snapshot's are ignored.
 */
static void test_hot_trace_read(void **state)
{
	uint64_t s1 = nth_kind(2, 0), s2 = nth_kind(2, 5), s3 = nth_kind(2, 9), s4 = UINT64_MAX,
		 z1 = nth_kind(1, 0), u1 = nth_kind(0, 0);
	char head[128], body[1024], want[1024], *txt;
	struct halite_session_stats ss;
	struct halite_template *t;
	struct halite_session *s;
	uint8_t *mem;

	trace_head(g_snap, head, sizeof(head));
	snprintf(body, sizeof(body),
		 "%sstat ready_ns 1\nstat done 1\nlb 0 prefetch 5 - 0 0\nlearn 5000 1\n"
		 "touch 10 0 %llu stored\ntouch 20 - %llu zero\ntouch 30 1 %llu stored\n"
		 "touch 30 - %llu untouched\ntouch 31 - %llu stored\n",
		 head, (unsigned long long)s1, (unsigned long long)z1, (unsigned long long)s2,
		 (unsigned long long)u1, (unsigned long long)s3);
	write_file(g_hot, body, strlen(body));
	t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	assert_int_equal(hot_mb(t, NULL), 3);
	/* s4: in none of their LBs, which the premap maps whole. */
	{
		struct halite_reader *rd = halite_template_reader(t);
		struct halite_mb_loc a, b, c, d;

		assert_int_equal(halite_reader_mb_lookup(rd, s1, &a), 0);
		assert_int_equal(halite_reader_mb_lookup(rd, s2, &b), 0);
		assert_int_equal(halite_reader_mb_lookup(rd, s3, &c), 0);
		for (unsigned i = 10; s4 == UINT64_MAX; i++) {
			uint64_t mb = nth_kind(2, i);

			assert_int_equal(halite_reader_mb_lookup(rd, mb, &d), 0);
			if (d.lb != a.lb && d.lb != b.lb && d.lb != c.lb)
				s4 = mb;
		}
	}
	mem = map_clone(t);
	s = start_local(t, mem, HALITE_SESSION_PREMAP_HOT);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.mb_premapped, 3);
	/* A block not in the hot set: learned, after the three. */
	assert_int_equal(mem[s4 * MB_SIZE + 1], g_image[s4 * MB_SIZE + 1]);
	assert_int_equal(hot_mb(t, NULL), 4);
	assert_int_equal(halite_template_hotset_save(t), 0);
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);
	txt = slurp(g_hot);
	snprintf(want, sizeof(want),
		 "%slearn 60000 0\ntouch 10 0 %llu stored\ntouch 30 1 %llu stored\n"
		 "touch 31 - %llu stored\ntouch ",
		 head, (unsigned long long)s1, (unsigned long long)s2, (unsigned long long)s3);
	assert_memory_equal(txt, want, strlen(want));
	{
		unsigned long long tn, mb;
		int end = 0;

		assert_int_equal(sscanf(txt + strlen(want) - 6, "touch %llu - %llu stored\n%n",
					&tn, &mb, &end), 2);
		assert_true(tn >= 31);
		assert_int_equal(mb, s4);
		assert_int_equal(strlen(txt + strlen(want) - 6), (size_t)end);
	}
	free(txt);

	/* Bad ones: each ignored whole (hot_mb 0), the template opens. */
	{
		char alt[1200];
		const char *bad[][2] = {
			{ "halite-restore-trace 2\n", "halite-restore-trace 1\n" },
			{ "file-uuid ", "file-uuid 0" },	  /* 33 digits */
			{ "learn 5000 1\n", "learn 5000 2\n" },
			{ "learn 5000 1\n", "" },		  /* no learn line */
			{ "touch 30 1", "touch 9 1" },		  /* t_ns back */
			{ " zero\n", " stored\n" },		  /* kind not the file's */
			{ "touch 31 - ", "touch 31 -  " },	  /* two spaces */
			{ "stat done 1\n", "stat done 1\r\n" },
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			char *p = strstr(body, bad[i][0]);

			assert_non_null(p);
			snprintf(alt, sizeof(alt), "%.*s%s%s", (int)(p - body), body, bad[i][1],
				 p + strlen(bad[i][0]));
			write_file(g_hot, alt, strlen(alt));
			t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
			if (hot_mb(t, NULL) != 0)
				fail_msg("bad hot set %zu taken: %s", i, alt);
			halite_template_free(t);
		}
		/* A block twice; no final newline; another snapshot's uuid. */
		snprintf(alt, sizeof(alt), "%stouch 40 - %llu stored\n", body,
			 (unsigned long long)s1);
		write_file(g_hot, alt, strlen(alt));
		t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
		assert_int_equal(hot_mb(t, NULL), 0);
		halite_template_free(t);
		write_file(g_hot, body, strlen(body) - 1);
		t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
		assert_int_equal(hot_mb(t, NULL), 0);
		halite_template_free(t);
		write_snapshot(g_snap2, NULL);
		trace_head(g_snap2, alt, sizeof(alt));
		assert_true(strlen(alt) == strlen(head) && memcmp(alt, head, strlen(head)));
		memcpy(body, alt, strlen(alt));
		write_file(g_hot, body, strlen(body));
		t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
		assert_int_equal(hot_mb(t, NULL), 0);
		halite_template_free(t);
		unlink(g_snap2);
	}
	remove_mem();
}

/*
 * A hot set file of the format before the trace ("HLTHOT01", a daemon's
 * state directory from before) is still read, and saved as a trace; a
 * damaged one is ignored.
 */
static void test_hot_old_format(void **state)
{
	uint64_t mbs[3] = { nth_kind(2, 7), nth_kind(2, 2), nth_kind(2, 30) };
	uint8_t buf[40 + 8 * 3];
	char head[128], want[512], *txt;
	struct halite_template *t;
	struct halite_reader *r;
	uint64_t h;

	assert_int_equal(halite_reader_open(&r, g_snap, NULL), 0);
	memcpy(buf, "HLTHOT01", 8);
	memcpy(buf + 8, halite_reader_info(r)->uuid, 16);
	halite_reader_free(r);
	for (int i = 0; i < 8; i++)
		buf[24 + i] = (uint8_t)(3ull >> (8 * i));
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < 8; i++)
			buf[32 + 8 * k + i] = (uint8_t)(mbs[k] >> (8 * i));
	h = XXH3_64bits(buf, sizeof(buf) - 8);
	for (int i = 0; i < 8; i++)
		buf[sizeof(buf) - 8 + i] = (uint8_t)(h >> (8 * i));
	write_file(g_hot, buf, sizeof(buf));
	t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	assert_int_equal(hot_mb(t, NULL), 3);
	assert_int_equal(halite_template_hotset_save(t), 0);
	halite_template_free(t);
	trace_head(g_snap, head, sizeof(head));
	snprintf(want, sizeof(want),
		 "%slearn 60000 0\ntouch 0 - %llu stored\ntouch 0 - %llu stored\n"
		 "touch 0 - %llu stored\n", head, (unsigned long long)mbs[0],
		 (unsigned long long)mbs[1], (unsigned long long)mbs[2]);
	txt = slurp(g_hot);
	assert_string_equal(txt, want);
	free(txt);

	buf[33] ^= 1; /* a block number: the checksum no longer matches */
	write_file(g_hot, buf, sizeof(buf));
	t = open_tpl(HALITE_TEMPLATE_NO_PREFETCH, 0);
	assert_int_equal(hot_mb(t, NULL), 0);
	halite_template_free(t);
	remove_mem();
}

/*
 * A relayouted snapshot (metadata halite.relayout hot-lbs=K): the stored
 * blocks of LBs 0..K-1 are the hot set without any hot set file; a clone
 * started with PREMAP_HOT has exactly those mapped, with the snapshot's
 * bytes, and never faults on them. Learned blocks come first and are all
 * that is saved; a bad value is ignored.
 */
static void test_hot_relayouted(void **state)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_session_stats ss;
	struct halite_template *t;
	struct halite_session *s;
	struct halite_reader *rd;
	uint64_t want = 0, pre, other = UINT64_MAX;
	uint8_t inpre[NMB] = { 0 };
	char head[128], line[256], *txt;
	uint8_t *mem;

	write_snapshot(g_snap2, "traces=1 hot-lbs=3 hot-blocks=24 source-uuid=00");
	o.flags = HALITE_TEMPLATE_NO_PREFETCH;
	o.hot_window_ms = 60000;
	assert_int_equal(halite_template_open(&t, g_snap2, g_mem, &o), 0);
	rd = halite_template_reader(t);
	for (uint64_t lb = 0; lb < 3; lb++) {
		const uint64_t *mbs;
		uint32_t n;

		assert_int_equal(halite_reader_lb_members(rd, lb, &mbs, &n), 0);
		for (uint32_t i = 0; i < n; i++)
			inpre[mbs[i]] = 1;
		want += n;
	}
	assert_true(want >= 3);
	for (uint32_t mb = 0; mb < NMB && other == UINT64_MAX; mb++)
		if (g_kind[mb] == 2 && !inpre[mb])
			other = mb;
	assert_int_equal(hot_mb(t, &pre), want);
	assert_int_equal(pre, want);
	mem = map_clone(t);
	s = start_local(t, mem, HALITE_SESSION_PREMAP_HOT | HALITE_SESSION_NO_HOT_RECORD);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.mb_premapped, want);
	for (uint32_t mb = 0; mb < NMB; mb++)
		if (inpre[mb])
			assert_memory_equal(mem + (uint64_t)mb * MB_SIZE,
					    g_image + (uint64_t)mb * MB_SIZE, MB_SIZE);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.faults, 0);
	/* Nothing else was mapped: a stored block outside the prefix faults. */
	assert_int_equal(mem[other * MB_SIZE + 1], g_image[other * MB_SIZE + 1]);
	halite_session_stats(s, &ss);
	assert_int_equal(ss.faults, 1);
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);

	/* Learned and prefix: the learned block first, only it saved. */
	o.hotset_path = g_hot;
	assert_int_equal(halite_template_open(&t, g_snap2, g_mem, &o), 0);
	mem = map_clone(t);
	s = start_local(t, mem, 0);
	assert_int_equal(mem[other * MB_SIZE + 1], g_image[other * MB_SIZE + 1]);
	assert_int_equal(hot_mb(t, &pre), want + 1);
	assert_int_equal(pre, want);
	assert_int_equal(halite_template_hotset_save(t), 0);
	halite_session_free(s);
	munmap(mem, LEN);
	halite_template_free(t);
	txt = slurp(g_hot);
	trace_head(g_snap2, head, sizeof(head));
	assert_memory_equal(txt, head, strlen(head));
	snprintf(line, sizeof(line), " - %llu stored\n", (unsigned long long)other);
	assert_memory_equal(txt + strlen(head), "learn 60000 0\ntouch ", 20);
	assert_string_equal(txt + strlen(txt) - strlen(line), line);
	assert_int_equal(strchr(txt + strlen(head) + 14, '\n') - txt + 1, (long)strlen(txt));
	free(txt);
	assert_int_equal(halite_template_open(&t, g_snap2, g_mem, &o), 0);
	assert_int_equal(hot_mb(t, &pre), want + 1);
	assert_int_equal(pre, want);
	halite_template_free(t);

	/* A value that is not hot-lbs=K (K at most the LB count): no prefix. */
	remove_mem();
	write_snapshot(g_snap2, "traces=1 hot-lbs=100000 hot-blocks=24");
	o.hotset_path = NULL;
	assert_int_equal(halite_template_open(&t, g_snap2, g_mem, &o), 0);
	assert_int_equal(hot_mb(t, NULL), 0);
	halite_template_free(t);
	unlink(g_snap2);
	remove_mem();
}

static void snap_uuid(const char *path, char out[33])
{
	struct halite_reader *rd;

	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", halite_reader_info(rd)->uuid[i]);
	halite_reader_free(rd);
}

/* The last error a template logged (a failed open has no handle to ask). */
static char g_last_err[1024];

static void log_err(void *ctx, int level, const char *msg)
{
	(void)ctx;
	if (level == HALITE_LOG_ERROR)
		snprintf(g_last_err, sizeof(g_last_err), "%s", msg);
}

/* Open @snap over g_mem with @flags: its code; the template in *@tp if it opened. */
static int try_open(const char *snap, unsigned flags, struct halite_template **tp)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template *t = NULL;
	int ret;

	o.flags = flags | HALITE_TEMPLATE_NO_PREFETCH;
	o.log = log_err;
	o.log_level = HALITE_LOG_ERROR;
	g_last_err[0] = 0;
	ret = halite_template_open(&t, snap, g_mem, &o);
	if (tp && !ret)
		*tp = t;
	else
		halite_template_free(t);
	return ret;
}

/* The open refused with @want, its message holding @says. */
static void expect_refused(unsigned flags, int want, const char *says, const char *what)
{
	int ret = try_open(g_snap, flags, NULL);

	if (ret != want || !strstr(g_last_err, says))
		fail_msg("%s: %d '%s', want %d '...%s...'", what, ret, g_last_err, want, says);
}

/* The memory file as it is: inode, size, and a hash of its bytes. */
static void mem_id(const char *path, struct stat *st, uint64_t *h)
{
	size_t len = 0;
	char *b = t_slurp(path, &len);

	assert_non_null(b);
	assert_int_equal(stat(path, st), 0);
	*h = XXH3_64bits(b, len);
	free(b);
}

/*
 * The memory and fill files: created 0600 (the hot set too), never through
 * a symbolic link, never one another user owns or may write; with
 * HALITE_TEMPLATE_NO_RESET a memory file of another snapshot is left as it
 * is and the open fails naming both snapshots; without it, started over.
 */
static void test_files(void **state)
{
	char fill[128], other[128], u1[33], u2[33];
	struct halite_template_stats st;
	struct halite_template *t;
	struct stat a, b;
	uint64_t ha, hb;
	int fd;

	snprintf(fill, sizeof(fill), "%s.fill", g_mem);
	snprintf(other, sizeof(other), "%s.target", g_mem);

	/* Fresh: both 0600; the hot set file written 0600 too. */
	assert_int_equal(try_open(g_snap, 0, &t), 0);
	assert_int_equal(stat(g_mem, &a), 0);
	assert_int_equal(a.st_mode & 07777, 0600);
	assert_int_equal(stat(fill, &a), 0);
	assert_int_equal(a.st_mode & 07777, 0600);
	halite_template_free(t);
	t = open_tpl(0, 0);
	assert_int_equal(halite_template_hotset_save(t), 0);
	assert_int_equal(stat(g_hot, &a), 0);
	assert_int_equal(a.st_mode & 07777, 0600);
	halite_template_free(t);
	remove_mem();

	/* A symbolic link: not followed, nothing made where it points. */
	assert_int_equal(symlink(other, g_mem), 0);
	expect_refused(0, -EPERM, "is a symbolic link", "MEM a symlink");
	assert_int_equal(access(other, F_OK), -1);
	assert_int_equal(lstat(g_mem, &a), 0);
	assert_true(S_ISLNK(a.st_mode));
	remove_mem();
	/* The fill map a symbolic link: the same. */
	assert_int_equal(symlink(other, fill), 0);
	expect_refused(0, -EPERM, "is a symbolic link", "MEM.fill a symlink");
	assert_int_equal(access(other, F_OK), -1);
	remove_mem();

	/* Writable by others. */
	fd = open(g_mem, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(fchmod(fd, 0666), 0);
	close(fd);
	expect_refused(0, -EPERM, "may be written by group or others (mode 0666)", "MEM 0666");
	remove_mem();
	/* A fill map writable by the group. */
	fd = open(fill, O_CREAT | O_EXCL | O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(fchmod(fd, 0620), 0);
	close(fd);
	expect_refused(0, -EPERM, "may be written by group or others (mode 0620)", "fill 0620");
	remove_mem();
	/* Owned by another user (nobody): root only. */
	if (!geteuid()) {
		fd = open(g_mem, O_CREAT | O_EXCL | O_WRONLY, 0600);
		assert_true(fd >= 0);
		assert_int_equal(fchown(fd, 65534, 65534), 0);
		close(fd);
		expect_refused(0, -EPERM, "belongs to uid 65534", "MEM of nobody");
		remove_mem();
	} else {
		fprintf(stderr, "test_files: not root, the other user's file is not tried\n");
	}

	/* A memory file of another snapshot (complete), then NO_RESET over it. */
	write_snapshot(g_snap2, NULL);
	snap_uuid(g_snap, u1);
	snap_uuid(g_snap2, u2);
	assert_string_not_equal(u1, u2);
	assert_int_equal(halite_template_open(&t, g_snap2, g_mem, NULL), 0);
	assert_int_equal(halite_template_wait(t, 10000), 0);
	halite_template_free(t);
	mem_id(g_mem, &a, &ha);
	expect_refused(HALITE_TEMPLATE_NO_RESET, -HALITE_E_STATE, u2, "NO_RESET: the file's uuid");
	assert_non_null(strstr(g_last_err, u1));
	assert_non_null(strstr(g_last_err, "HALITE_TEMPLATE_NO_RESET"));
	mem_id(g_mem, &b, &hb);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_int_equal(a.st_size, b.st_size);
	assert_int_equal(ha, hb);
	/* The same snapshot with NO_RESET: reused, nothing read. */
	assert_int_equal(try_open(g_snap2, HALITE_TEMPLATE_NO_RESET, &t), 0);
	halite_template_stats(t, &st);
	assert_int_equal(st.mb_in_at_open, st.mb_stored);
	halite_template_free(t);
	/* Without the flag: started over, as before. */
	assert_int_equal(try_open(g_snap, 0, &t), 0);
	halite_template_stats(t, &st);
	assert_int_equal(st.mb_in_at_open, 0);
	mem_id(g_mem, &b, &hb);
	assert_int_equal(a.st_ino, b.st_ino);
	assert_true(ha != hb);
	halite_template_free(t);
	unlink(g_snap2);
	remove_mem();
}

/* g_mnt: a small tmpfs of the running test (test_enospc), unmounted by teardown. */

static bool mount_small(const char *size)
{
	char opts[32];

	snprintf(opts, sizeof(opts), "size=%s,mode=0700", size);
	return !mount("tmpfs", g_mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts);
}

static unsigned dir_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	unsigned n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	closedir(d);
	return n;
}

/*
 * Space is reserved at open: on a 4 MiB tmpfs the template of a snapshot
 * storing more than that fails the open with -ENOSPC and a message saying
 * so, no SIGBUS, no file left; on one that fits every clone page is exact.
 */
static void test_enospc(void **state)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template_stats st;
	struct halite_template *t = NULL;
	struct halite_session *s;
	struct toucher tc = { 0 };
	char mem[160];
	uint8_t *m;
	int ret;

	if (geteuid()) {
		fprintf(stderr, "test_enospc: not root (mount): skipped\n");
		skip();
	}
	snprintf(g_mnt, sizeof(g_mnt), "/tmp/halite-tpl-%d-mnt", (int)getpid());
	assert_int_equal(mkdir(g_mnt, 0700), 0);
	if (!mount_small("4m")) {
		fprintf(stderr, "test_enospc: cannot mount a tmpfs (%s): skipped\n", strerror(errno));
		rmdir(g_mnt);
		g_mnt[0] = 0;
		skip();
	}
	snprintf(mem, sizeof(mem), "%s/tpl.mem", g_mnt);
	o.log = log_err;
	o.log_level = HALITE_LOG_ERROR;
	g_last_err[0] = 0;
	ret = halite_template_open(&t, g_snap, mem, &o);
	if (ret != -ENOSPC || !strstr(g_last_err, "reserving ") ||
	    !strstr(g_last_err, "MiB for the template memory file") ||
	    !strstr(g_last_err, "No space left on device"))
		fail_msg("4 MiB tmpfs: %d '%s'", ret, g_last_err);
	assert_null(t);
	assert_int_equal(dir_entries(g_mnt), 0);
	assert_int_equal(umount2(g_mnt, MNT_DETACH), 0);

	/* Room enough: exact, every page. */
	assert_true(mount_small("16m"));
	o.flags = HALITE_TEMPLATE_NO_PREFETCH;
	assert_int_equal(halite_template_open(&t, g_snap, mem, &o), 0);
	m = map_clone(t);
	s = start_local(t, m, 0);
	tc.mem = m;
	tc.seed = 3;
	touch_all(&tc);
	assert_int_equal(tc.mismatches, 0);
	assert_int_equal(halite_session_wait(s, 10000), 0);
	halite_template_stats(t, &st);
	assert_true(st.complete);
	assert_int_equal(st.error, 0);
	halite_session_free(s);
	munmap(m, LEN);
	halite_template_free(t);
	assert_int_equal(umount2(g_mnt, MNT_DETACH), 0);
	rmdir(g_mnt);
	g_mnt[0] = 0;
}

/*
 * A daemon keeps the snapshot's descriptor and opens the template through
 * /proc/self/fd/N: the snapshot it opened, even once its path names another
 * (renamed over it).
 */
static void test_proc_fd(void **state)
{
	char path[96], other[100], viafd[64], u1[33], u2[33], ut[33];
	struct halite_template *t;
	struct halite_session *s;
	struct toucher tc = { 0 };
	uint8_t *m;
	int fd;

	snprintf(path, sizeof(path), "/tmp/halite-tpl-%d-fd.hlt", (int)getpid());
	snprintf(other, sizeof(other), "%s.new", path);
	write_snapshot(path, NULL);
	snap_uuid(path, u1);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	/* Another snapshot, other bytes, renamed over the path. */
	for (uint64_t i = 0; i < LEN; i++)
		g_image[i] ^= 0x5a;
	write_snapshot(other, NULL);
	for (uint64_t i = 0; i < LEN; i++)
		g_image[i] ^= 0x5a;
	assert_int_equal(rename(other, path), 0);
	snap_uuid(path, u2);
	assert_string_not_equal(u1, u2);

	snprintf(viafd, sizeof(viafd), "/proc/self/fd/%d", fd);
	assert_int_equal(try_open(viafd, 0, &t), 0);
	for (int i = 0; i < 16; i++)
		snprintf(ut + 2 * i, 3, "%02x", halite_reader_info(halite_template_reader(t))->uuid[i]);
	assert_string_equal(ut, u1);
	m = map_clone(t);
	s = start_local(t, m, 0);
	tc.mem = m;
	tc.seed = 8;
	touch_all(&tc);
	assert_int_equal(tc.mismatches, 0);
	assert_int_equal(halite_session_wait(s, 10000), 0);
	halite_session_free(s);
	munmap(m, LEN);
	halite_template_free(t);
	close(fd);
	unlink(path);
	remove_mem();
}

static void test_bad_args(void **state)
{
	struct halite_template *t;
	struct halite_session *s;
	HALITE_OPTS(halite_session_opts, so);
	HALITE_OPTS(halite_template_opts, to);
	struct halite_session_region r = { "pc.ram", 0, LEN };
	char path[96];
	uint8_t *mem;

	/* Not tmpfs. */
	snprintf(path, sizeof(path), "/var/tmp/halite-tpl-%d.mem", (int)getpid());
	assert_int_equal(halite_template_open(&t, g_snap, path, NULL), -HALITE_E_UNSUPPORTED);
	unlink(path);
	snprintf(path, sizeof(path), "/var/tmp/halite-tpl-%d.mem.fill", (int)getpid());
	unlink(path);
	/* Not a snapshot. */
	assert_int_equal(halite_template_open(&t, "/etc/passwd", g_mem, NULL), -HALITE_E_BAD_MAGIC);
	to.flags = 0x80;
	assert_int_equal(halite_template_open(&t, g_snap, g_mem, &to), -EINVAL);

	t = open_tpl(0, 0);
	mem = map_clone(t);
	r.host = (uint64_t)(uintptr_t)mem;
	so.owner_uffd = -1;
	r.name = "nope";
	assert_int_equal(halite_session_start(&s, t, &r, 1, &so), -EINVAL);
	r.name = "pc.ram";
	r.length = LEN - PAGE;
	assert_int_equal(halite_session_start(&s, t, &r, 1, &so), -EINVAL);
	r.length = LEN;
	so.flags = HALITE_SESSION_ATTACH; /* nothing to take over in this process */
	assert_int_equal(halite_session_start(&s, t, &r, 1, &so), -EINVAL);
	so.flags = 0;
	so.owner_pid = getpid();
	so.owner_uffd = 0; /* stdin: not a userfaultfd */
	assert_true(halite_session_start(&s, t, &r, 1, &so) < 0);
	munmap(mem, LEN);
	halite_template_free(t);
	remove_mem();
}

/* A clone (ext_start()): --ext-child SOCK MEMFD OFFSET LENGTH TOUCHED-FD. */
static int ext_child_main(char **argv)
{
	int touched = atoi(argv[6]);

	if (touched >= 0) {
		g_touched = mmap(NULL, TOUCHED_MAX, PROT_READ | PROT_WRITE, MAP_SHARED, touched, 0);
		if (g_touched == MAP_FAILED)
			_exit(2);
	}
	ext_child(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], NULL, 10),
		  strtoull(argv[5], NULL, 10));
	return 2;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_clones_exact, setup, teardown),
		cmocka_unit_test_setup_teardown(test_writes_private, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attach, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_lb, setup, teardown),
		cmocka_unit_test_setup_teardown(test_damaged_chunk, setup, teardown),
		cmocka_unit_test_setup_teardown(test_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_enospc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_proc_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hot_set, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hot_trace_read, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hot_old_format, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hot_relayouted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
	};
	int ret;

	if (argc == 7 && !strcmp(argv[1], "--ext-child"))
		return ext_child_main(argv);
	make_snapshot();
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(g_snap);
	free(g_image);
	return ret;
}
