/* SPDX-License-Identifier: MIT */
/*
 * The userfaultfd layer the engines share (halite/src/uffd.h, fault_loop.h):
 * acquiring a descriptor, new or another handler's (whether its handshake
 * was done decides TAKEOVER and EXACT), registering a range that must offer
 * an ioctl, a range another descriptor holds, and the fault loop's skeleton
 * end to end: a thread faults on a registered page, serve() installs it with
 * UFFDIO_COPY, and the loop ends by next(), by a stop_fd value, or by
 * failed() when reading the descriptor fails. Skips (77) where userfaultfd
 * is not permitted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/errors.h>

#include "fault_loop.h"
#include "gmem.h"
#include "uffd.h"

#define PAGE 4096

/* A userfaultfd as another process would pass it: no handshake yet. */
static int raw_uffd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	assert_true(fd >= 0);
	return fd;
}

static void *map_pages(size_t n)
{
	void *p = mmap(NULL, n * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	return p;
}

static void test_acquire_new(void **state)
{
	uint64_t missing = 0, have = 0;
	const char *why = "unset";
	int fd;

	(void)state;
	fd = halite_uffd_acquire(-1, UFFD_FEATURE_THREAD_ID, 0, &missing, &why);
	assert_true(fd >= 0);
	assert_null(why);
	assert_int_equal(halite_uffd_handshaken(fd, &have), 1);
	assert_true(have & UFFD_FEATURE_THREAD_ID);
	close(fd);

	fd = halite_uffd_acquire(-1, 1ull << 62, 0, &missing, &why);
	assert_int_equal(fd, -HALITE_E_UNSUPPORTED);
	assert_int_equal(missing, 1ull << 62);
}

/* No TAKEOVER: the handshake is ours, on our dup; the owner keeps its copy. */
static void test_adopt_handshake_ours(void **state)
{
	int owner = raw_uffd(), fd, again;
	uint64_t have = 0;
	const char *why = "unset";

	(void)state;
	assert_int_equal(halite_uffd_handshaken(owner, &have), 0);
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID, 0, NULL, &why);
	assert_true(fd >= 0 && fd != owner);
	assert_null(why);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	/* One file: the owner's copy has had the handshake too. */
	assert_int_equal(halite_uffd_handshaken(owner, &have), 1);
	assert_true(have & UFFD_FEATURE_THREAD_ID);
	/* A second handler without TAKEOVER: the handshake was someone else's. */
	again = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID, 0, NULL, &why);
	assert_int_equal(again, -HALITE_E_STATE);
	close(fd);
	close(owner);
}

static void test_adopt_takeover(void **state)
{
	int owner = raw_uffd(), fd;
	uint64_t missing = 0;
	const char *why;

	(void)state;
	/* EXACT with TAKEOVER: a descriptor never set up has nothing to take over. */
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID,
				 HALITE_UFFD_TAKEOVER | HALITE_UFFD_EXACT, NULL, &why);
	assert_int_equal(fd, -HALITE_E_STATE);
	assert_non_null(why);
	assert_non_null(strstr(why, "never set up"));
	/* TAKEOVER alone: the handshake not done is ours to do. */
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID, HALITE_UFFD_TAKEOVER, NULL, &why);
	assert_true(fd >= 0);
	assert_null(why);
	close(fd);
	/* Now done: taken over when it asked for what we want... */
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID,
				 HALITE_UFFD_TAKEOVER | HALITE_UFFD_EXACT, &missing, &why);
	assert_true(fd >= 0);
	close(fd);
	/* ...refused when it did not, saying what it lacks. */
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EVENT_REMOVE,
				 HALITE_UFFD_TAKEOVER, &missing, &why);
	assert_int_equal(fd, -HALITE_E_UNSUPPORTED);
	assert_int_equal(missing, UFFD_FEATURE_EVENT_REMOVE);
	/* EXACT without TAKEOVER: a handshake done means another handler has it. */
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID, HALITE_UFFD_EXACT, NULL, &why);
	assert_int_equal(fd, -HALITE_E_STATE);
	assert_non_null(why);
	assert_non_null(strstr(why, "another handler"));
	close(owner);

	/* EXACT without TAKEOVER on a fresh descriptor: ours to set up. */
	owner = raw_uffd();
	fd = halite_uffd_acquire(owner, UFFD_FEATURE_THREAD_ID, HALITE_UFFD_EXACT, NULL, &why);
	assert_true(fd >= 0);
	close(fd);
	close(owner);
}

static void test_adopt_not_uffd(void **state)
{
	int p[2], fd;
	const char *why;

	(void)state;
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	fd = halite_uffd_acquire(p[0], 0, HALITE_UFFD_TAKEOVER, NULL, &why);
	assert_true(fd < 0);
	assert_non_null(why);
	assert_non_null(strstr(why, "not a userfaultfd"));
	close(p[0]);
	close(p[1]);
	fd = halite_uffd_acquire(p[0], 0, 0, NULL, &why); /* closed: no descriptor */
	assert_int_equal(fd, -EBADF);
}

static void test_register(void **state)
{
	int fd = halite_uffd_acquire(-1, 0, 0, NULL, NULL), other;
	uint8_t *p = map_pages(2);
	uint64_t addr = (uintptr_t)p;

	(void)state;
	assert_true(fd >= 0);
	/* Private memory registered MISSING offers COPY, never CONTINUE. */
	assert_int_equal(halite_uffd_register(fd, addr, 2 * PAGE, UFFDIO_REGISTER_MODE_MISSING,
					      1ull << _UFFDIO_CONTINUE),
			 -HALITE_E_UNSUPPORTED);
	/* It is registered all the same, for the caller to unregister. */
	assert_int_equal(halite_uffd_register(fd, addr, 2 * PAGE, UFFDIO_REGISTER_MODE_MISSING,
					      1ull << _UFFDIO_COPY),
			 0);
	other = halite_uffd_acquire(-1, 0, 0, NULL, NULL);
	assert_true(other >= 0);
	assert_int_equal(halite_uffd_register(other, addr, PAGE, UFFDIO_REGISTER_MODE_MISSING, 0),
			 -EBUSY);
	assert_int_equal(halite_uffd_unregister(fd, addr, 2 * PAGE), 0);
	assert_int_equal(halite_uffd_register(other, addr, PAGE, UFFDIO_REGISTER_MODE_MISSING, 0),
			 0);
	assert_int_equal(halite_uffd_unregister(other, addr, PAGE), 0);
	assert_int_equal(halite_uffd_unregister(fd, addr + 1, PAGE), -EINVAL);
	close(other);
	close(fd);
	munmap(p, 2 * PAGE);
}

/* ---- the fault loop ---- */

struct loop_test {
	int uffd;
	uint8_t *guest, *src;
	_Atomic int served;	/* faults installed by serve() */
	_Atomic int wakeups;	/* calls of next() */
	_Atomic uint64_t stop_seen;
	_Atomic int failed_err;
	int end_after;		/* next() ends the loop once this many were served */
	int end_after_idle;	/* or after this many wake-ups with none (0: never) */
	_Atomic bool running;
};

static void loop_serve(void *ctx, const struct uffd_msg *m, int n, uint64_t t0)
{
	struct loop_test *t = ctx;

	(void)t0;
	for (int i = 0; i < n; i++) {
		uint64_t page = m[i].arg.pagefault.address & ~(uint64_t)(PAGE - 1);
		struct uffdio_copy c = {
			.dst = page,
			.src = (uintptr_t)t->src + (page - (uintptr_t)t->guest),
			.len = PAGE,
		};

		assert_int_equal(m[i].event, UFFD_EVENT_PAGEFAULT);
		assert_int_equal(ioctl(t->uffd, UFFDIO_COPY, &c), 0);
		atomic_fetch_add(&t->served, 1);
	}
}

static bool loop_next(void *ctx, int n)
{
	struct loop_test *t = ctx;
	int w = atomic_fetch_add(&t->wakeups, 1) + 1;

	if (t->end_after && atomic_load(&t->served) >= t->end_after)
		return false;
	return !(t->end_after_idle && !n && w >= t->end_after_idle);
}

static bool loop_stop(void *ctx, uint64_t v)
{
	struct loop_test *t = ctx;

	atomic_store(&t->stop_seen, v);
	return v >= 2;
}

static void loop_failed(void *ctx, int err)
{
	atomic_store(&((struct loop_test *)ctx)->failed_err, err);
}

static int loop_timeout(void *ctx)
{
	(void)ctx;
	return 10;
}

struct runner {
	struct halite_fault_loop l;
	struct loop_test *t;
	pthread_t thr;
};

static void *run_loop(void *arg)
{
	struct runner *r = arg;

	halite_fault_loop_run(&r->l);
	atomic_store(&r->t->running, false);
	return NULL;
}

static void start_loop(struct runner *r, struct loop_test *t, struct halite_gmem *gm, int stop_fd)
{
	r->t = t;
	r->l = (struct halite_fault_loop){
		.gm = gm, .uffd = t->uffd, .stop_fd = stop_fd, .ctx = t,
		.serve = loop_serve, .next = loop_next, .failed = loop_failed,
	};
	atomic_store(&t->running, true);
}

/* Until @cond or 10 s: a broken loop fails the test rather than hanging it. */
#define WAIT_FOR(cond)                                                          \
	do {                                                                    \
		struct timespec ts_ = { 0, 1000000 };                           \
		for (int i_ = 0; i_ < 10000 && !(cond); i_++)                  \
			nanosleep(&ts_, NULL);                                  \
		assert_true(cond);                                              \
	} while (0)

struct toucher {
	volatile uint8_t *p;
	uint8_t seen[2];
};

static void *touch(void *arg)
{
	struct toucher *t = arg;

	t->seen[0] = t->p[100];		/* faults: the loop installs page 0 */
	t->seen[1] = t->p[PAGE + 7];	/* and page 1 */
	return NULL;
}

/* A guest of two registered pages, its source bytes, its gmem, and a loop. */
struct guest {
	struct loop_test t;
	struct halite_gmem *gm;
	struct runner r;
};

static int setup_guest(void **state)
{
	struct guest *g = calloc(1, sizeof(*g));
	struct loop_test *t = &g->t;
	struct halite_gmem_region gr;

	assert_non_null(g);
	t->uffd = halite_uffd_acquire(-1, UFFD_FEATURE_THREAD_ID, 0, NULL, NULL);
	assert_true(t->uffd >= 0);
	t->guest = map_pages(2);
	t->src = map_pages(2);
	memset(t->src, 0x5a, 2 * PAGE);
	t->src[100] = 0xc3;
	t->src[PAGE + 7] = 0x3c;
	assert_int_equal(halite_uffd_register(t->uffd, (uintptr_t)t->guest, 2 * PAGE,
					      UFFDIO_REGISTER_MODE_MISSING, 1ull << _UFFDIO_COPY),
			 0);
	gr = (struct halite_gmem_region){ (uintptr_t)t->guest, 2 * PAGE, PAGE, false };
	assert_int_equal(halite_gmem_create(&g->gm, t->uffd, &gr, 1), 0);
	*state = g;
	return 0;
}

static int teardown_guest(void **state)
{
	struct guest *g = *state;

	halite_uffd_unregister(g->t.uffd, (uintptr_t)g->t.guest, 2 * PAGE);
	halite_gmem_free(g->gm);
	close(g->t.uffd);
	munmap(g->t.guest, 2 * PAGE);
	munmap(g->t.src, 2 * PAGE);
	free(g);
	return 0;
}

static void test_loop_serves_until_next(void **state)
{
	struct guest *g = *state;
	struct toucher to = { .p = g->t.guest };
	pthread_t th;

	g->t.end_after = 2;
	start_loop(&g->r, &g->t, g->gm, -1);
	assert_int_equal(pthread_create(&g->r.thr, NULL, run_loop, &g->r), 0);
	assert_int_equal(pthread_create(&th, NULL, touch, &to), 0);
	pthread_join(th, NULL);
	WAIT_FOR(!atomic_load(&g->t.running));
	pthread_join(g->r.thr, NULL);
	assert_int_equal(atomic_load(&g->t.served), 2);
	assert_int_equal(to.seen[0], 0xc3);
	assert_int_equal(to.seen[1], 0x3c);
	assert_memory_equal(g->t.guest, g->t.src, 2 * PAGE);
	assert_int_equal(atomic_load(&g->t.failed_err), 0);
}

static void test_loop_next_after_timeouts(void **state)
{
	struct guest *g = *state;

	g->t.end_after_idle = 3;
	start_loop(&g->r, &g->t, g->gm, -1);
	g->r.l.timeout_ms = loop_timeout;
	run_loop(&g->r); /* wakes up empty-handed three times, then next() ends it */
	assert_int_equal(atomic_load(&g->t.wakeups), 3);
	assert_int_equal(atomic_load(&g->t.served), 0);
}

static void test_loop_stop_value(void **state)
{
	struct guest *g = *state;
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);

	assert_true(efd >= 0);
	start_loop(&g->r, &g->t, g->gm, efd);
	g->r.l.stop = loop_stop;
	assert_int_equal(pthread_create(&g->r.thr, NULL, run_loop, &g->r), 0);
	/* A value stop() declines: the loop goes on. */
	eventfd_write(efd, 1);
	WAIT_FOR(atomic_load(&g->t.stop_seen) == 1 && atomic_load(&g->t.wakeups) >= 1);
	assert_true(atomic_load(&g->t.running));
	eventfd_write(efd, 2);
	WAIT_FOR(!atomic_load(&g->t.running));
	pthread_join(g->r.thr, NULL);
	assert_int_equal(atomic_load(&g->t.stop_seen), 2);

	/* No stop(): any value ends it. */
	start_loop(&g->r, &g->t, g->gm, efd);
	eventfd_write(efd, 1);
	run_loop(&g->r);
	assert_false(atomic_load(&g->t.running));
	close(efd);
}

static void test_loop_read_fails(void **state)
{
	struct halite_gmem_region gr = { 0, PAGE, PAGE, false };
	struct loop_test t = { 0 };
	struct halite_gmem *gm;
	struct runner r;

	(void)state;
	/*
	 * A directory polls readable and fails every read (EISDIR): the loop
	 * must hand that to failed() and end, not spin.
	 */
	t.uffd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(t.uffd >= 0);
	assert_int_equal(halite_gmem_create(&gm, t.uffd, &gr, 1), 0);
	start_loop(&r, &t, gm, -1);
	run_loop(&r);
	assert_int_equal(atomic_load(&t.failed_err), -EISDIR);
	assert_int_equal(atomic_load(&t.wakeups), 0);
	halite_gmem_free(gm);
	close(t.uffd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_acquire_new),
		cmocka_unit_test(test_adopt_handshake_ours),
		cmocka_unit_test(test_adopt_takeover),
		cmocka_unit_test(test_adopt_not_uffd),
		cmocka_unit_test(test_register),
		cmocka_unit_test_setup_teardown(test_loop_serves_until_next, setup_guest, teardown_guest),
		cmocka_unit_test_setup_teardown(test_loop_next_after_timeouts, setup_guest, teardown_guest),
		cmocka_unit_test_setup_teardown(test_loop_stop_value, setup_guest, teardown_guest),
		cmocka_unit_test(test_loop_read_fails),
	};
	struct halite_uffd_caps caps;
	int ret = halite_uffd_probe(&caps);

	if (ret) {
		fprintf(stderr, "userfaultfd not permitted (%s): skipped\n", halite_strerror(ret));
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
}
