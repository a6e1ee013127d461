// SPDX-License-Identifier: MIT
/*
 * The template source and clone sessions (restore/template.c, session.c):
 * every clone's memory exact, each locality block read and decoded once for
 * all clones, writes private to their clone, a template reopened over its
 * files keeping what it had, a session taken over (ATTACH) after its
 * handler went away, a corrupt LB failing only the clones that need it,
 * the hot set mapped before a clone runs, and bad arguments refused.
 *
 * Clones are this process's threads over private mappings of the memory
 * file (owner_pid 0) or forked children that hand their userfaultfd over
 * (owner_pid set), as halite-cloned's clones do.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#include <halite/halite.h>
#include <halite/template.h>

#include "uffd.h"

#define MB_SIZE 8192u
#define NMB 1024u
#define LEN ((uint64_t)NMB * MB_SIZE)
#define PAGE 4096u

static uint8_t *g_image;	/* what every clone must read */
static uint8_t g_kind[NMB];	/* 0 untouched, 1 zero, 2 stored */
static char g_snap[64], g_mem[96], g_hot[96];

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* 1024 blocks: a tenth zero, a tenth never touched, the rest half random, in 3 streams. */
static void make_snapshot(void)
{
	const struct halite_region reg = { "pc.ram", 0, LEN };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
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
	o.mb_pages = MB_SIZE / PAGE;
	o.vcpu_count = 1;
	o.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, g_snap, &reg, 1, &o), 0);
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

static int teardown(void **state)
{
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
	uint64_t host;
};

struct ext_req {
	uint64_t off, len;
};

static void ext_child(int sock, int memfd, uint64_t off)
{
	uint8_t *mem = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE, memfd, (off_t)off);
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
		uint64_t h = XXH3_64bits(mem + rq.off, rq.len);

		if (write(sock, &h, sizeof(h)) != sizeof(h))
			_exit(2);
	}
	_exit(0);
}

static void ext_start(struct ext *e, struct halite_template *t)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &e->host, sizeof(e->host) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	uint64_t off;
	int sv[2];

	assert_int_equal(halite_template_region(t, "pc.ram", &off, NULL), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	e->pid = fork();
	assert_true(e->pid >= 0);
	if (!e->pid) {
		close(sv[0]);
		ext_child(sv[1], halite_template_memfd(t), off);
	}
	close(sv[1]);
	e->sock = sv[0];
	assert_int_equal(recvmsg(e->sock, &mh, 0), sizeof(e->host));
	assert_non_null(CMSG_FIRSTHDR(&mh));
	memcpy(&e->uffd, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof(int));
}

static int ext_session(struct ext *e, struct halite_template *t, unsigned flags,
		       struct halite_session **s)
{
	const struct halite_session_region r = { "pc.ram", e->host, LEN };
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

/* The answer within @ms: 1 and *h, or 0 when none came (the clone is blocked). */
static int ext_answer(struct ext *e, int ms, uint64_t *h)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	setsockopt(e->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return read(e->sock, h, sizeof(*h)) == sizeof(*h);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_clones_exact, setup, teardown),
		cmocka_unit_test_setup_teardown(test_writes_private, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attach, setup, teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_lb, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hot_set, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
	};
	int ret;

	make_snapshot();
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(g_snap);
	free(g_image);
	return ret;
}
