// SPDX-License-Identifier: MIT
/*
 * I/O backends. Files go to $HALITE_TEST_DIR, else the current directory
 * (ctest runs in the build tree). O_DIRECT cases look for a file system that
 * takes it and skip when none does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <halite/errors.h>

#include "io.h"
#include "io_internal.h"
#include "s3.h"
#include "stats.h"
#include "test_util.h"

static uint64_t seed;

/* A per-case stream derived from the printed seed (xorshift must not start at 0). */
static uint64_t sub_seed(uint64_t k)
{
	uint64_t s = seed ^ (k * 0x9e3779b97f4a7c15ull);

	return s ? s : 1;
}
static const char *test_dir = ".";
static char direct_dir[4096]; /* "" when no file system here takes O_DIRECT */

static const int backends[] = { HALITE_IO_URING, HALITE_IO_AIO, HALITE_IO_PSYNC };

#define TAG(i) (0xfeed000000000000ull | (uint64_t)(i))

static void temp_path(char *buf, size_t len, const char *dir)
{
	int fd;

	snprintf(buf, len, "%s/halite-io-XXXXXX", dir);
	fd = mkstemp(buf);
	assert_true(fd >= 0);
	close(fd);
}

/* Open @path with @backend; NULL (after printing why) if the kernel refuses. */
static struct halite_io *open_io(int backend, const char *path, unsigned qd, unsigned flags,
				 uint32_t latency_us)
{
	struct halite_io_opts o = {
		.sz = sizeof(o),
		.backend = backend,
		.queue_depth = qd,
		.flags = flags,
		.read_latency_us = latency_us,
	};
	struct halite_io *io = NULL;
	int ret;

	ret = halite_io_open(&io, path, O_RDWR | O_CREAT, 0600, &o);
	if (ret == -HALITE_E_UNSUPPORTED) {
		print_message("# %s%s refused here: %s\n", halite_io_backend_name(backend),
			      flags & HALITE_IO_DIRECT ? " with O_DIRECT" : "",
			      halite_strerror(ret));
		return NULL;
	}
	assert_int_equal(ret, 0);
	assert_non_null(io);
	assert_int_equal(halite_io_backend(io), backend);
	assert_int_equal(halite_io_is_direct(io), !!(flags & HALITE_IO_DIRECT));
	return io;
}

/* open_io() on a new file in @dir, its name in @path; the test skipped when the backend refuses. */
static struct halite_io *open_temp_io(int backend, char *path, size_t len, const char *dir,
				      unsigned qd, unsigned flags, uint32_t latency_us)
{
	struct halite_io *io;

	temp_path(path, len, dir);
	io = open_io(backend, path, qd, flags, latency_us);
	if (!io) {
		unlink(path);
		skip();
	}
	return io;
}

/* Reap until at least @min; check each completion against the expectations. */
static unsigned reap_check(struct halite_io *io, unsigned min, unsigned nreq,
			   const size_t *lens, unsigned *seen)
{
	struct halite_io_done done[64];
	unsigned got = 0;
	int n, i;

	while (got < min) {
		n = halite_io_reap(io, done, 64, min - got > 64 ? 64 : min - got);
		assert_true(n >= 0);
		for (i = 0; i < n; i++) {
			uint64_t idx = done[i].tag & 0xffffffffu;

			assert_int_equal(done[i].tag & ~0xffffffffull, TAG(0));
			assert_true(idx < nreq);
			assert_int_equal(seen[idx], 0);
			seen[idx] = 1;
			assert_int_equal(done[i].res, (int64_t)lens[idx]);
		}
		got += (unsigned)n;
	}
	return got;
}

/*
 * @nreq requests of random lengths in separate 64 KiB slots: written async,
 * read back sync and async. With O_DIRECT everything is aligned.
 */
static void async_round_trip(int backend, unsigned qd, bool direct, size_t chunk)
{
	enum { NREQ = 200, SLOT = 65536 };
	char path[4200];
	struct halite_io *io;
	unsigned char *src, *dst;
	size_t lens[NREQ];
	unsigned seen[NREQ];
	uint64_t s = sub_seed((uint64_t)backend * 1000 + qd);
	unsigned i, pending = 0;
	int ret;

	io = open_temp_io(backend, path, sizeof(path), direct ? direct_dir : test_dir, qd, direct ? HALITE_IO_DIRECT : 0, 0);
	if (chunk)
		halite_io_test_set_chunk(io, chunk);
	src = halite_io_alloc((size_t)NREQ * SLOT);
	dst = halite_io_alloc((size_t)NREQ * SLOT);
	assert_non_null(src);
	assert_non_null(dst);
	t_fill(src, (size_t)NREQ * SLOT, 100, &s);
	memset(dst, 0, (size_t)NREQ * SLOT);
	for (i = 0; i < NREQ; i++) {
		uint64_t r = t_rand(&s);

		lens[i] = direct ? HALITE_IO_ALIGN * (1 + r % 16) : 1 + r % SLOT;
	}

	memset(seen, 0, sizeof(seen));
	for (i = 0; i < NREQ; i++) {
		for (;;) {
			ret = halite_io_submit_write(io, src + (size_t)i * SLOT, lens[i],
						     (uint64_t)i * SLOT, TAG(i));
			if (ret != -EAGAIN)
				break;
			/* Full: exactly qd in flight, never more. */
			assert_int_equal(halite_io_inflight(io), qd);
			pending -= reap_check(io, 1, NREQ, lens, seen);
		}
		assert_int_equal(ret, 0);
		pending++;
		assert_int_equal(halite_io_inflight(io), pending);
		assert_true(pending <= qd);
	}
	reap_check(io, pending, NREQ, lens, seen);
	assert_int_equal(halite_io_inflight(io), 0);
	for (i = 0; i < NREQ; i++)
		assert_int_equal(seen[i], 1);

	/* Synchronous reads see what the asynchronous writes wrote. */
	for (i = 0; i < NREQ; i += 7) {
		assert_int_equal(halite_io_read(io, dst + (size_t)i * SLOT, lens[i],
						(uint64_t)i * SLOT), 0);
		assert_memory_equal(dst + (size_t)i * SLOT, src + (size_t)i * SLOT, lens[i]);
	}
	memset(dst, 0, (size_t)NREQ * SLOT);

	memset(seen, 0, sizeof(seen));
	pending = 0;
	for (i = 0; i < NREQ; i++) {
		for (;;) {
			ret = halite_io_submit_read(io, dst + (size_t)i * SLOT, lens[i],
						    (uint64_t)i * SLOT, TAG(i));
			if (ret != -EAGAIN)
				break;
			pending -= reap_check(io, 1, NREQ, lens, seen);
		}
		assert_int_equal(ret, 0);
		pending++;
	}
	reap_check(io, pending, NREQ, lens, seen);
	for (i = 0; i < NREQ; i++) {
		assert_int_equal(seen[i], 1);
		assert_memory_equal(dst + (size_t)i * SLOT, src + (size_t)i * SLOT, lens[i]);
	}

	halite_io_close(io);
	unlink(path);
	halite_io_free(src);
	halite_io_free(dst);
}

static void test_async_qd1(void **state)
{
	async_round_trip(*(int *)*state, 1, false, 0);
}

static void test_async_qd32(void **state)
{
	async_round_trip(*(int *)*state, 32, false, 0);
}

/* Every transfer cut into 1000-byte pieces: the continuation path. */
static void test_async_short(void **state)
{
	async_round_trip(*(int *)*state, 8, false, 1000);
}

static void test_direct_async(void **state)
{
	if (!direct_dir[0]) {
		print_message("# no file system here takes O_DIRECT\n");
		skip();
	}
	async_round_trip(*(int *)*state, 32, true, 0);
	async_round_trip(*(int *)*state, 4, true, HALITE_IO_ALIGN);
}

static void test_sync(void **state)
{
	int backend = *(int *)*state;
	size_t len = 1u << 20;
	unsigned char *src = malloc(len), *dst = malloc(len);
	uint64_t s = sub_seed(7);
	struct halite_io *io;
	char path[4200];

	io = open_temp_io(backend, path, sizeof(path), test_dir, 0, 0, 0);
	t_fill(src, len, 100, &s);
	assert_int_equal(halite_io_write(io, src, len, 12345), 0);
	assert_int_equal(halite_io_sync(io), 0);
	assert_int_equal(halite_io_read(io, dst, len, 12345), 0);
	assert_memory_equal(dst, src, len);
	/* Continued in pieces, same bytes. */
	halite_io_test_set_chunk(io, 777);
	memset(dst, 0, len);
	assert_int_equal(halite_io_read(io, dst, len, 12345), 0);
	assert_memory_equal(dst, src, len);
	assert_int_equal(halite_io_write(io, src, 5000, 12345 + len), 0);
	assert_int_equal(halite_io_read(io, dst, 5000, 12345 + len), 0);
	assert_memory_equal(dst, src, 5000);
	/* Beyond off_t. */
	assert_int_equal(halite_io_read(io, dst, 1, (uint64_t)INT64_MAX), -EINVAL);
	assert_int_equal(halite_io_submit_read(io, dst, 2, (uint64_t)INT64_MAX, 1), -EINVAL);
	halite_io_close(io);
	unlink(path);
	free(src);
	free(dst);
}

static void test_truncated(void **state)
{
	int backend = *(int *)*state;
	unsigned char buf[16384];
	struct halite_io_done d[4];
	struct halite_io *io;
	char path[4200];

	io = open_temp_io(backend, path, sizeof(path), test_dir, 4, 0, 0);
	memset(buf, 0x5a, sizeof(buf));
	assert_int_equal(halite_io_write(io, buf, 10000, 0), 0);

	assert_int_equal(halite_io_read(io, buf, 10000, 0), 0);
	assert_int_equal(halite_io_read(io, buf, 8192, 4096), -HALITE_E_TRUNCATED);
	assert_int_equal(halite_io_read(io, buf, 100, 20000), -HALITE_E_TRUNCATED);

	assert_int_equal(halite_io_submit_read(io, buf, 8192, 4096, 1), 0);
	assert_int_equal(halite_io_submit_read(io, buf, 10000, 0, 2), 0);
	assert_int_equal(halite_io_submit_read(io, buf, 1, 10000, 3), 0);
	/* Zero length completes at once with 0. */
	assert_int_equal(halite_io_submit_read(io, buf, 0, 0, 4), 0);
	assert_int_equal(halite_io_inflight(io), 4);
	assert_int_equal(halite_io_reap(io, d, 4, 4), 4);
	for (int i = 0; i < 4; i++) {
		switch (d[i].tag) {
		case 1:
		case 3:
			assert_int_equal(d[i].res, -HALITE_E_TRUNCATED);
			break;
		case 2:
			assert_int_equal(d[i].res, 10000);
			break;
		case 4:
			assert_int_equal(d[i].res, 0);
			break;
		default:
			fail_msg("unexpected tag %llu", (unsigned long long)d[i].tag);
		}
	}
	assert_int_equal(halite_io_inflight(io), 0);
	halite_io_close(io);
	unlink(path);
}

/*
 * Fault injection "write failure" on both paths: a write the budget does not
 * cover writes nothing; synchronously it returns the error, asynchronously it
 * is accepted and completes with it; writes that fit still go through.
 */
static void test_fail_writes(void **state)
{
	int backend = *(int *)*state;
	unsigned char buf[8192], back[4096];
	struct halite_io_done d[4];
	int64_t res[3] = { 0 };
	struct halite_io *io;
	struct stat st;
	char path[4200];
	int n = 0;

	io = open_temp_io(backend, path, sizeof(path), test_dir, 4, 0, 0);
	memset(buf, 0x5a, sizeof(buf));
	halite_io_test_fail_writes(io, 3 * 4096, ENOSPC);
	assert_int_equal(halite_io_submit_write(io, buf, 4096, 0, 0), 0);
	assert_int_equal(halite_io_submit_write(io, buf, 4096, 4096, 1), 0);
	/* 4096 left: two pages do not fit. */
	assert_int_equal(halite_io_submit_write(io, buf, 8192, 8192, 2), 0);
	while (n < 3) {
		int r = halite_io_reap(io, d, 4, 1);

		assert_true(r > 0);
		for (int i = 0; i < r; i++)
			res[d[i].tag] = d[i].res;
		n += r;
	}
	assert_int_equal(res[0], 4096);
	assert_int_equal(res[1], 4096);
	assert_int_equal(res[2], -ENOSPC);
	assert_int_equal(halite_io_write(io, buf, 4096, 8192), 0);
	assert_int_equal(halite_io_write(io, buf, 1, 12288), -ENOSPC);
	halite_io_test_fail_writes(io, 0, EIO);
	assert_int_equal(halite_io_submit_write(io, buf, 4096, 12288, 0), 0);
	assert_int_equal(halite_io_reap(io, d, 4, 1), 1);
	assert_int_equal(d[0].res, -EIO);
	/* Only what fitted reached the file. */
	assert_int_equal(fstat(halite_io_fd(io), &st), 0);
	assert_int_equal(st.st_size, 3 * 4096);
	assert_int_equal(halite_io_read(io, back, 4096, 8192), 0);
	assert_memory_equal(back, buf, 4096);
	halite_io_close(io);
	unlink(path);
}

static void test_queue_full(void **state)
{
	int backend = *(int *)*state;
	unsigned char buf[3][4096];
	struct halite_io_done d[4];
	struct halite_io *io;
	char path[4200];

	io = open_temp_io(backend, path, sizeof(path), test_dir, 2, 0, 0);
	memset(buf, 1, sizeof(buf));
	assert_int_equal(halite_io_submit_write(io, buf[0], 4096, 0, 10), 0);
	assert_int_equal(halite_io_submit_write(io, buf[1], 4096, 4096, 11), 0);
	assert_int_equal(halite_io_submit_write(io, buf[2], 4096, 8192, 12), -EAGAIN);
	assert_int_equal(halite_io_inflight(io), 2);
	/* min beyond what is in flight would wait forever. */
	assert_int_equal(halite_io_reap(io, d, 4, 3), -EINVAL);
	assert_int_equal(halite_io_reap(io, d, 0, 0), 0);
	assert_int_equal(halite_io_reap(io, d, 1, 1), 1);
	assert_int_equal(halite_io_reap(io, d + 1, 4, 1), 1);
	assert_true((d[0].tag == 10 && d[1].tag == 11) || (d[0].tag == 11 && d[1].tag == 10));
	assert_int_equal(halite_io_inflight(io), 0);
	/* Closing with requests in flight waits for them. */
	assert_int_equal(halite_io_submit_write(io, buf[2], 4096, 8192, 12), 0);
	halite_io_close(io);
	unlink(path);
}

static void test_latency(void **state)
{
	const uint32_t lat_us = 30000;
	const uint64_t lat_ns = lat_us * 1000ull;
	int backend = *(int *)*state;
	unsigned char buf[4][4096];
	struct halite_io_done d[4];
	struct halite_io *io;
	uint64_t t0, t_last;
	char path[4200];
	int n, i;

	io = open_temp_io(backend, path, sizeof(path), test_dir, 8, 0, lat_us);
	memset(buf, 3, sizeof(buf));
	assert_int_equal(halite_io_write(io, buf, sizeof(buf), 0), 0);

	/* Synchronous: returns no earlier than the latency. */
	t0 = halite_now_ns();
	assert_int_equal(halite_io_read(io, buf[0], 4096, 0), 0);
	assert_true(halite_now_ns() - t0 >= lat_ns);
	/* Errors are late too: a truncated read still "went to the disk". */
	t0 = halite_now_ns();
	assert_int_equal(halite_io_read(io, buf[0], 4096, 1 << 20), -HALITE_E_TRUNCATED);
	assert_true(halite_now_ns() - t0 >= lat_ns);

	/* Asynchronous: held back at reap until due. */
	t0 = halite_now_ns();
	t_last = t0;
	for (i = 0; i < 4; i++) {
		t_last = halite_now_ns();
		assert_int_equal(halite_io_submit_read(io, buf[i], 4096, (uint64_t)i * 4096, i), 0);
	}
	n = halite_io_reap(io, d, 4, 0);
	assert_true(n >= 0);
	if (halite_now_ns() - t0 < lat_ns)
		assert_int_equal(n, 0);
	n += halite_io_reap(io, d + n, 4 - (unsigned)n, 4 - (unsigned)n);
	assert_int_equal(n, 4);
	assert_true(halite_now_ns() - t_last >= lat_ns);
	for (i = 0; i < 4; i++)
		assert_int_equal(d[i].res, 4096);

	/* One at a time, each held for its own latency. */
	for (i = 0; i < 3; i++) {
		t0 = halite_now_ns();
		assert_int_equal(halite_io_submit_read(io, buf[0], 4096, 0, 99), 0);
		assert_int_equal(halite_io_reap(io, d, 1, 1), 1);
		assert_true(halite_now_ns() - t0 >= lat_ns);
		assert_int_equal(d[0].tag, 99);
	}
	halite_io_close(io);
	unlink(path);
}

static void test_direct_sync(void **state)
{
	int backend = *(int *)*state;
	struct halite_io_done d[2];
	struct halite_io *io;
	unsigned char *a, *b;
	char path[4200];
	uint64_t s = sub_seed(9);
	int ret;

	if (!direct_dir[0]) {
		print_message("# no file system here takes O_DIRECT\n");
		skip();
	}
	io = open_temp_io(backend, path, sizeof(path), direct_dir, 4, HALITE_IO_DIRECT, 0);
	a = halite_io_alloc(3 * HALITE_IO_ALIGN);
	b = halite_io_alloc(3 * HALITE_IO_ALIGN);
	t_fill(a, 3 * HALITE_IO_ALIGN, 100, &s);
	assert_int_equal(halite_io_write(io, a, 2 * HALITE_IO_ALIGN, HALITE_IO_ALIGN), 0);
	assert_int_equal(halite_io_read(io, b, 2 * HALITE_IO_ALIGN, HALITE_IO_ALIGN), 0);
	assert_memory_equal(a, b, 2 * HALITE_IO_ALIGN);
	/*
	 * Alignment is the kernel's to enforce: block file systems answer
	 * EINVAL, tmpfs (O_DIRECT since 6.6) just copies. Either is fine.
	 */
	ret = halite_io_read(io, b, HALITE_IO_ALIGN, 1);
	assert_true(ret == 0 || ret == -EINVAL);

	/* A tail that ends off alignment: truncated, not EINVAL. */
	assert_int_equal(ftruncate(halite_io_fd(io), 2 * HALITE_IO_ALIGN + 1000), 0);
	assert_int_equal(halite_io_read(io, b, 2 * HALITE_IO_ALIGN, HALITE_IO_ALIGN),
			 -HALITE_E_TRUNCATED);
	assert_int_equal(halite_io_read(io, b, HALITE_IO_ALIGN, 2 * HALITE_IO_ALIGN),
			 -HALITE_E_TRUNCATED);
	assert_int_equal(halite_io_read(io, b, HALITE_IO_ALIGN, 0), 0);
	assert_int_equal(halite_io_submit_read(io, b, 2 * HALITE_IO_ALIGN, HALITE_IO_ALIGN, 5), 0);
	assert_int_equal(halite_io_submit_read(io, b + 2 * HALITE_IO_ALIGN, HALITE_IO_ALIGN, 0, 6),
			 0);
	assert_int_equal(halite_io_reap(io, d, 2, 2), 2);
	for (int i = 0; i < 2; i++)
		assert_int_equal(d[i].res, d[i].tag == 5 ? -HALITE_E_TRUNCATED
							 : (int64_t)HALITE_IO_ALIGN);
	halite_io_close(io);
	unlink(path);
	halite_io_free(a);
	halite_io_free(b);
}

static void test_default_backend(void **state)
{
	struct halite_io *io = NULL;
	char path[4200];

	temp_path(path, sizeof(path), test_dir);
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, NULL), 0);
	print_message("# default backend here: %s\n", halite_io_backend_name(halite_io_backend(io)));
	assert_true(halite_io_backend(io) >= HALITE_IO_URING &&
		    halite_io_backend(io) <= HALITE_IO_PSYNC);
	assert_int_equal(halite_io_is_direct(io), 0);
	assert_true(halite_io_fd(io) >= 0);
	halite_io_close(io);
	halite_io_close(NULL);
	unlink(path);
}

static void test_opts(void **state)
{
	struct {
		struct halite_io_opts o;
		uint64_t future;
	} big = { .o.sz = sizeof(big) };
	struct halite_io_opts o = { .sz = sizeof(o) };
	struct halite_io *io = (struct halite_io *)0x1;
	char path[4200];

	temp_path(path, sizeof(path), test_dir);
	o.sz = 0;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &o), -EINVAL);
	o.sz = sizeof(o);
	o.flags = 0x80;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &o), -EINVAL);
	o.flags = 0;
	o.backend = 7;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &o), -EINVAL);
	o.backend = HALITE_IO_PSYNC;
	o.queue_depth = 1u << 20;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &o), -EINVAL);
	big.future = 1;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &big.o), -EINVAL);
	assert_ptr_equal(io, (struct halite_io *)0x1);
	/* Nothing was opened, so nothing leaked: a missing file is -ENOENT. */
	assert_int_equal(halite_io_open(&io, "/nonexistent/x", O_RDONLY, 0, NULL), -ENOENT);

	/* A newer caller's larger struct with its extra field zero is fine. */
	big.future = 0;
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &big.o), 0);
	halite_io_close(io);
	/* An older, shorter one gets defaults for the rest. */
	o.sz = offsetof(struct halite_io_opts, queue_depth);
	o.backend = HALITE_IO_PSYNC;
	o.queue_depth = 999999; /* beyond sz: ignored */
	assert_int_equal(halite_io_open(&io, path, O_RDWR, 0, &o), 0);
	assert_int_equal(halite_io_backend(io), HALITE_IO_PSYNC);
	halite_io_close(io);
	unlink(path);
}

static void test_from_fd(void **state)
{
	struct halite_io_opts o = { .sz = sizeof(o), .backend = HALITE_IO_PSYNC };
	struct halite_io *io;
	char path[4200];
	char buf[8] = "abcdefg";
	int fd;

	temp_path(path, sizeof(path), test_dir);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(halite_io_from_fd(&io, fd, &o), 0);
	assert_int_equal(halite_io_fd(io), fd);
	assert_int_equal(halite_io_write(io, buf, 8, 0), 0);
	halite_io_close(io);
	/* The handle owned the descriptor. */
	assert_int_equal(fcntl(fd, F_GETFD), -1);
	assert_int_equal(errno, EBADF);
	assert_int_equal(halite_io_from_fd(&io, fd, &o), -EBADF);

	if (direct_dir[0]) {
		unlink(path);
		temp_path(path, sizeof(path), direct_dir);
		fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		o.flags = HALITE_IO_DIRECT;
		assert_int_equal(halite_io_from_fd(&io, fd, &o), 0);
		assert_int_equal(halite_io_is_direct(io), 1);
		assert_true(fcntl(fd, F_GETFL) & O_DIRECT);
		halite_io_close(io);
	}
	unlink(path);
}

/* procfs never does direct I/O: the refusal must come back as UNSUPPORTED. */
static void test_direct_refused(void **state)
{
	struct halite_io_opts o = { .sz = sizeof(o), .flags = HALITE_IO_DIRECT };
	struct halite_io *io = NULL;
	struct statfs sf;
	static const char *const tmpfs_dirs[] = { "/tmp", "/dev/shm" };
	char path[4200];
	size_t i;
	int ret;

	if (access("/proc/self/status", R_OK)) {
		print_message("# no /proc\n");
		skip();
	}
	assert_int_equal(halite_io_open(&io, "/proc/self/status", O_RDONLY, 0, &o),
			 -HALITE_E_UNSUPPORTED);
	assert_null(io);

	/* tmpfs: refused before Linux 6.6, accepted since; either way no other error. */
	for (i = 0; i < sizeof(tmpfs_dirs) / sizeof(tmpfs_dirs[0]); i++) {
		if (statfs(tmpfs_dirs[i], &sf) || sf.f_type != TMPFS_MAGIC) {
			print_message("# %s is not tmpfs\n", tmpfs_dirs[i]);
			continue;
		}
		if (access(tmpfs_dirs[i], W_OK))
			continue;
		temp_path(path, sizeof(path), tmpfs_dirs[i]);
		ret = halite_io_open(&io, path, O_RDWR, 0, &o);
		print_message("# O_DIRECT on tmpfs %s: %s\n", tmpfs_dirs[i],
			      ret ? halite_strerror(ret) : "accepted");
		assert_true(ret == 0 || ret == -HALITE_E_UNSUPPORTED);
		if (!ret)
			halite_io_close(io);
		unlink(path);
	}
}

static void test_names(void **state)
{
	int b;

	for (b = HALITE_IO_URING; b <= HALITE_IO_PSYNC; b++)
		assert_int_equal(halite_io_backend_parse(halite_io_backend_name(b)), b);
	assert_string_equal(halite_io_backend_name(HALITE_IO_URING), "io_uring");
	assert_string_equal(halite_io_backend_name(HALITE_IO_AIO), "libaio");
	assert_string_equal(halite_io_backend_name(HALITE_IO_PSYNC), "psync");
	assert_null(halite_io_backend_name(HALITE_IO_DEFAULT));
	assert_null(halite_io_backend_name(42));
	assert_int_equal(halite_io_backend_parse("uring"), -EINVAL);
	assert_int_equal(halite_io_backend_parse(NULL), -EINVAL);
}

/*
 * An s3:// path opens an object of an S3 store (io_s3.c); what is refused
 * before any request: writing, a URL that is not one, no configuration.
 * Reads against a real store are tests/s3/test_s3_read.c's.
 */
static void test_s3_refused(void **state)
{
	struct halite_io *io = NULL;

	assert_true(halite_io_is_s3_path("s3://b/k"));
	assert_false(halite_io_is_s3_path("/tmp/s3://b"));
	assert_false(halite_io_is_s3_path(NULL));
	assert_string_equal(halite_io_backend_name(HALITE_IO_S3), "s3");
	assert_int_equal(halite_io_backend_parse("s3"), -EINVAL); /* chosen by the path only */
	assert_int_equal(halite_io_open(&io, "s3://bucket-x/k", O_WRONLY | O_CREAT | O_TRUNC, 0600,
					NULL), -EROFS);
	assert_int_equal(halite_io_open(&io, "s3://bucket-x/k", O_RDWR, 0, NULL), -EROFS);
	assert_int_equal(halite_io_open(&io, "s3://Not_A_Bucket/k", O_RDONLY, 0, NULL),
			 -HALITE_S3_E_URL);
	assert_int_equal(halite_io_open(&io, "s3://bucket-x/", O_RDONLY, 0, NULL),
			 -HALITE_S3_E_URL);
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_PROFILE");
	setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null", 1);
	setenv("AWS_CONFIG_FILE", "/dev/null", 1);
	assert_int_equal(halite_io_open(&io, "s3://bucket-x/k", O_RDONLY, 0, NULL),
			 -HALITE_S3_E_CONFIG);
	assert_null(io);
	/* One strerror for the library's codes and the S3 client's. */
	assert_non_null(strstr(halite_strerror(-HALITE_S3_E_CHANGED), "changed"));
	assert_string_equal(halite_strerror(-HALITE_S3_E_NO_SUCH_KEY), "no such key");
}

static void test_alloc(void **state)
{
	static const size_t lens[] = { 0, 1, 4095, 4096, 4097, 1 << 20 };
	size_t i;

	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t rounded = lens[i] ? (lens[i] + 4095) & ~(size_t)4095 : 4096;
		unsigned char *p = halite_io_alloc(lens[i]);

		assert_non_null(p);
		assert_int_equal((uintptr_t)p % HALITE_IO_ALIGN, 0);
		/* The whole rounded length is usable: ASan would object otherwise. */
		memset(p, 0xee, rounded);
		halite_io_free(p);
	}
	assert_null(halite_io_alloc(SIZE_MAX));
	halite_io_free(NULL);
}

/* The first of $HALITE_TEST_DIR, the test directory, /var/tmp that takes O_DIRECT. */
static void find_direct_dir(void)
{
	const char *cands[] = { getenv("HALITE_TEST_DIR"), ".", "/var/tmp" };
	struct halite_io_opts o = { .sz = sizeof(o), .flags = HALITE_IO_DIRECT };
	struct halite_io *io;
	struct statfs sf;
	char path[4200];
	size_t i;
	int fd, ret;

	for (i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		if (!cands[i] || access(cands[i], W_OK))
			continue;
		snprintf(path, sizeof(path), "%s/halite-direct-XXXXXX", cands[i]);
		fd = mkstemp(path);
		if (fd < 0)
			continue;
		close(fd);
		ret = halite_io_open(&io, path, O_RDWR, 0, &o);
		unlink(path);
		statfs(cands[i], &sf);
		printf("# O_DIRECT in %s (f_type %#lx): %s\n", cands[i], (unsigned long)sf.f_type,
		       ret ? halite_strerror(ret) : "ok");
		if (ret == 0) {
			halite_io_close(io);
			snprintf(direct_dir, sizeof(direct_dir), "%s", cands[i]);
			return;
		}
	}
}

#define PER_BACKEND(fn)                                                                       \
	cmocka_unit_test_prestate(fn, (void *)&backends[0]),                                  \
	cmocka_unit_test_prestate(fn, (void *)&backends[1]),                                  \
	cmocka_unit_test_prestate(fn, (void *)&backends[2])

int main(void)
{
	const struct CMUnitTest tests[] = {
		PER_BACKEND(test_sync),
		PER_BACKEND(test_async_qd1),
		PER_BACKEND(test_async_qd32),
		PER_BACKEND(test_async_short),
		PER_BACKEND(test_truncated),
		PER_BACKEND(test_queue_full),
		PER_BACKEND(test_fail_writes),
		PER_BACKEND(test_latency),
		PER_BACKEND(test_direct_sync),
		PER_BACKEND(test_direct_async),
		cmocka_unit_test(test_default_backend),
		cmocka_unit_test(test_opts),
		cmocka_unit_test(test_from_fd),
		cmocka_unit_test(test_direct_refused),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_s3_refused),
		cmocka_unit_test(test_alloc),
	};

	seed = t_seed("unit_io");
	if (getenv("HALITE_TEST_DIR"))
		test_dir = getenv("HALITE_TEST_DIR");
	find_direct_dir();
	fflush(stdout);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
