/* SPDX-License-Identifier: MIT */
/*
 * userfaultfd probing, the handshake, and the compat definitions against the
 * running kernel: a MISSING fault resolved with UFFDIO_MOVE (struct layout
 * from halite/src/uffd.h) delivers exactly the moved bytes to the faulting
 * thread, and the fault reports that thread's id. Skips (77) where the kernel
 * has no userfaultfd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/errors.h>

#include "uffd.h"

#define PAGE 4096

static struct halite_uffd_caps g_caps;

static void test_probe(void **state)
{
	char names[512];

	halite_uffd_feature_names(g_caps.features, names, sizeof(names));
	fprintf(stderr, "userfaultfd features: %s\n", names);
	assert_true(g_caps.ioctls & (1ull << _UFFDIO_REGISTER));
	assert_string_equal(halite_uffd_feature_names(UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MOVE,
						      names, sizeof(names)),
			    "THREAD_ID|MOVE");
	assert_string_equal(halite_uffd_feature_names(1ull << 60, names, sizeof(names)),
			    "0x1000000000000000");
}

static void test_open_missing_feature(void **state)
{
	uint64_t missing = 0;
	int fd = halite_uffd_open(1ull << 62, &missing);

	assert_int_equal(fd, -HALITE_E_UNSUPPORTED);
	assert_int_equal(missing, 1ull << 62);
	fd = halite_uffd_open(UFFD_FEATURE_THREAD_ID, NULL);
	assert_true(fd >= 0);
	/* One handshake per descriptor. */
	assert_int_equal(halite_uffd_api(fd, 0, NULL), -EINVAL);
	close(fd);
}

struct toucher {
	volatile uint8_t *p;
	_Atomic pid_t tid; /* published before the fault, read by the handler */
	uint8_t seen;
};

static void *touch(void *arg)
{
	struct toucher *t = arg;

	atomic_store(&t->tid, gettid());
	t->seen = t->p[100]; /* faults; resolved by the test thread */
	return NULL;
}

static void test_move_resolves_fault(void **state)
{
	struct toucher t;
	struct uffd_msg msg;
	pthread_t th;
	uint8_t *dst, *src;
	int fd;

	if (!(g_caps.features & UFFD_FEATURE_MOVE)) {
		fprintf(stderr, "kernel has no UFFDIO_MOVE: skipped\n");
		skip();
	}
	fd = halite_uffd_open(UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MOVE, NULL);
	assert_true(fd >= 0);
	dst = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	src = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(dst != MAP_FAILED && src != MAP_FAILED);
	memset(src, 0x5a, PAGE);
	src[100] = 0xc3;
	{
		struct uffdio_register reg = {
			.range = { (uintptr_t)dst, PAGE }, .mode = UFFDIO_REGISTER_MODE_MISSING,
		};

		assert_int_equal(ioctl(fd, UFFDIO_REGISTER, &reg), 0);
		assert_true(reg.ioctls & (1ull << _UFFDIO_MOVE));
	}
	t = (struct toucher){ .p = dst };
	assert_int_equal(pthread_create(&th, NULL, touch, &t), 0);
	{
		struct pollfd pfd = { .fd = fd, .events = POLLIN };

		assert_int_equal(poll(&pfd, 1, 10000), 1);
	}
	assert_int_equal(read(fd, &msg, sizeof(msg)), sizeof(msg));
	assert_int_equal(msg.event, UFFD_EVENT_PAGEFAULT);
	assert_int_equal(msg.arg.pagefault.address & ~(uint64_t)(PAGE - 1), (uintptr_t)dst);
	assert_int_equal(msg.arg.pagefault.feat.ptid, atomic_load(&t.tid));
	{
		struct uffdio_move mv = { .dst = (uintptr_t)dst, .src = (uintptr_t)src, .len = PAGE };

		assert_int_equal(ioctl(fd, UFFDIO_MOVE, &mv), 0);
		assert_int_equal(mv.move, PAGE);
	}
	pthread_join(th, NULL);
	assert_int_equal(t.seen, 0xc3);
	assert_int_equal(dst[0], 0x5a);
	/* The page moved: the source is now a hole reading as zero. */
	assert_int_equal(src[100], 0);
	munmap(dst, PAGE);
	munmap(src, PAGE);
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_probe),
		cmocka_unit_test(test_open_missing_feature),
		cmocka_unit_test(test_move_resolves_fault),
	};
	int ret = halite_uffd_probe(&g_caps);

	if (ret) {
		fprintf(stderr, "userfaultfd unavailable (%s): skipped\n", halite_strerror(ret));
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL) ? 1 : 0;
}
