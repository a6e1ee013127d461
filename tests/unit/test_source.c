/* SPDX-License-Identifier: MIT */
/*
 * The snapshot source alone (halite/restore/source.h), with a consumer that
 * only records what it is told, on a file the writer makes (16 KiB LBs):
 * - the prefetcher, one read in flight: its first list in that order, then
 *   every other LB in file order, each exactly once, counted;
 * - demand reads by the readers: every LB queued lands once as demand;
 * - a read from the page cache on the caller's thread;
 * - a corrupt LB, on demand and prefetched: read 3 times (2 retries), then
 *   FAILED and named with its offset; never handed to the consumer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "source.h"
#include "test_util.h"

#define MB_SIZE 8192u
#define LB_SIZE 16384u
#define MEM (2u << 20)
#define MAXLB 1024u

static char g_path[512], g_bad[512];
static struct halite_logger g_log; /* silent */
static uint64_t g_bad_lb, g_bad_off;

/* What the consumer was told, in order. */
struct cons {
	struct src *s;
	struct halite_reader *rd;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t order[MAXLB];
	int how[MAXLB];
	uint64_t n, nfailed, failed_lb;
	int failed_err, bad_bufs;
	char msg[512];
};

static void c_landed(void *ctx, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	struct cons *c = ctx;

	/* Verified before it came: verifying again must agree. */
	if (halite_reader_verify_lb(c->rd, lb, buf))
		c->bad_bufs++;
	halite_reader_free_lb(buf);
	pthread_mutex_lock(&c->s->lk);
	atomic_store(&c->s->st[lb], LB_DONE);
	pthread_mutex_unlock(&c->s->lk);
	pthread_mutex_lock(&c->mu);
	if (c->n < MAXLB) {
		c->order[c->n] = lb;
		c->how[c->n] = how;
	}
	c->n++;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

static void c_failed(void *ctx, uint64_t lb, int err, const char *msg)
{
	struct cons *c = ctx;

	pthread_mutex_lock(&c->mu);
	c->nfailed++;
	c->failed_lb = lb;
	c->failed_err = err;
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

static void c_error(void *ctx, int err, const char *msg)
{
	fail_msg("source error %d: %s", err, msg);
}

static const struct src_ops c_ops = { .landed = c_landed, .failed = c_failed,
				      .error = c_error };

/* Wait until @want LBs landed and @fails failed (10 s at most). */
static void c_wait(struct cons *c, uint64_t want, uint64_t fails)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&c->mu);
	while ((c->n < want || c->nfailed < fails) &&
	       pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&c->mu);
	assert_true(c->n >= want && c->nfailed >= fails);
}

static void mkfile(void)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region reg = { "ram", 0, MEM };
	struct halite_writer *w;
	struct halite_reader *rd;
	struct halite_lb_info li;
	uint64_t seed = 7;
	uint8_t *data = malloc(MB_SIZE);
	char cmd[1100];
	uint8_t x;
	int fd;

	assert_non_null(data);
	snprintf(g_path, sizeof(g_path), "%s/src.hlt", t_tmpdir());
	snprintf(g_bad, sizeof(g_bad), "%s/bad.hlt", t_tmpdir());
	wo.lb_size = LB_SIZE;
	wo.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, g_path, &reg, 1, &wo), 0);
	for (uint64_t mb = 0; mb < MEM / MB_SIZE; mb++) {
		t_fill(data, MB_SIZE, 50, &seed);
		assert_int_equal(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, mb % 2),
						   mb, data), 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
	free(data);
	/* A copy with one byte of an LB's payload flipped. */
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", g_path, g_bad);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(halite_reader_open(&rd, g_path, NULL), 0);
	g_bad_lb = halite_reader_info(rd)->lb_count / 2;
	assert_int_equal(halite_reader_lb_info(rd, g_bad_lb, &li), 0);
	g_bad_off = li.offset;
	halite_reader_free(rd);
	fd = open(g_bad, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &x, 1, (off_t)g_bad_off + 100), 1);
	x ^= 0x40;
	assert_int_equal(pwrite(fd, &x, 1, (off_t)g_bad_off + 100), 1);
	close(fd);
}

/* A source over @path for @c: @readers, prefetch with one read in flight if @prefetch. */
static void c_open(struct cons *c, struct src *s, const char *path, unsigned readers,
		   bool prefetch, int *fd)
{
	struct src_opts o = {
		.readers = readers, .ra_readers = 1, .read_retries = 2, .prefetch = prefetch,
		.queue_depth = 1, .prefetch_idle_us = 1, .prefetch_min_rate = 1,
		.inline_reads = true, .thread_name = "t-src",
	};

	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->s = s;
	assert_int_equal(halite_reader_open(&c->rd, path, NULL), 0);
	*fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(*fd >= 0);
	assert_int_equal(src_init(s, c->rd, path, *fd, &o, &c_ops, c, &g_log), 0);
}

static void c_close(struct cons *c, struct src *s, int fd)
{
	src_join(s);
	src_destroy(s);
	close(fd);
	halite_reader_free(c->rd);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
}

static void test_prefetch_order(void **state)
{
	static const uint64_t first[] = { 5, 3, 9 };
	struct cons c;
	struct src s;
	uint64_t lbs, k = 0;
	int fd;

	c_open(&c, &s, g_path, 1, true, &fd);
	lbs = s.lb_total;
	assert_true(lbs > 16 && lbs <= MAXLB);
	s.first = first;
	s.nfirst = 3;
	assert_int_equal(src_start(&s), 0);
	c_wait(&c, lbs, 0);
	src_join(&s);
	assert_int_equal(c.n, lbs);
	assert_int_equal(c.bad_bufs, 0);
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(c.order[i], first[i]);
	for (uint64_t lb = 0; lb < lbs; lb++) {
		if (lb == 3 || lb == 5 || lb == 9)
			continue;
		assert_int_equal(c.order[3 + k++], lb);
	}
	for (uint64_t i = 0; i < lbs; i++)
		assert_int_equal(c.how[i], SRC_PREFETCH);
	assert_int_equal(atomic_load(&s.n_prefetch), lbs);
	assert_int_equal(atomic_load(&s.n_first), 3);
	assert_int_equal(atomic_load(&s.n_demand), 0);
	assert_int_equal(atomic_load(&s.n_retries), 0);
	assert_int_equal(atomic_load(&s.n_bytes), lbs * LB_SIZE);
	c_close(&c, &s, fd);
}

static void test_demand(void **state)
{
	struct cons c;
	struct src s;
	uint64_t lbs;
	int fd;

	c_open(&c, &s, g_path, 3, false, &fd);
	lbs = s.lb_total;
	assert_int_equal(src_start(&s), 0);
	pthread_mutex_lock(&s.lk);
	for (uint64_t lb = 0; lb < lbs; lb++) {
		atomic_store(&s.st[lb], LB_READING);
		assert_int_equal(src_queue_push(&s, lb), 0);
	}
	pthread_mutex_unlock(&s.lk);
	src_wake(&s, 3);
	c_wait(&c, lbs, 0);
	src_join(&s);
	assert_int_equal(c.n, lbs);
	assert_int_equal(c.bad_bufs, 0);
	for (uint64_t i = 0; i < lbs; i++)
		assert_int_equal(c.how[i], SRC_DEMAND);
	assert_int_equal(atomic_load(&s.n_demand), lbs);
	assert_int_equal(atomic_load(&s.n_prefetch), 0);
	assert_int_equal(atomic_load(&s.n_bytes), lbs * LB_SIZE);
	c_close(&c, &s, fd);
}

static void test_read_cached(void **state)
{
	uint8_t *tmp = malloc(MB_SIZE), buf[4096];
	struct cons c;
	struct src s;
	int fd;

	c_open(&c, &s, g_path, 0, false, &fd);
	/* Read it all once: every page in the page cache. */
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	atomic_store(&s.st[2], LB_READING);
	assert_true(src_read_cached(&s, 2, tmp));
	assert_int_equal(c.n, 1);
	assert_int_equal(c.order[0], 2);
	assert_int_equal(c.how[0], SRC_DEMAND);
	assert_int_equal(atomic_load(&s.n_demand), 1);
	assert_int_equal(atomic_load(&s.n_bytes), LB_SIZE);
	c_close(&c, &s, fd);
	free(tmp);
}

static void check_bad(struct cons *c, struct src *s)
{
	char want[128];

	snprintf(want, sizeof(want), "locality block %llu at offset %llu: checksum mismatch "
		 "after 3 reads", (unsigned long long)g_bad_lb, (unsigned long long)g_bad_off);
	assert_int_equal(c->nfailed, 1);
	assert_int_equal(c->failed_lb, g_bad_lb);
	assert_int_equal(c->failed_err, -HALITE_E_LB_CHECKSUM);
	assert_string_equal(c->msg, want);
	assert_int_equal(atomic_load(&s->st[g_bad_lb]), LB_FAILED);
	assert_int_equal(atomic_load(&s->n_retries), 2);
	for (uint64_t i = 0; i < c->n; i++)
		assert_true(c->order[i] != g_bad_lb);
	assert_int_equal(c->bad_bufs, 0);
}

static void test_corrupt_demand(void **state)
{
	struct cons c;
	struct src s;
	int fd;

	c_open(&c, &s, g_bad, 1, false, &fd);
	assert_int_equal(src_start(&s), 0);
	pthread_mutex_lock(&s.lk);
	atomic_store(&s.st[g_bad_lb], LB_READING);
	assert_int_equal(src_queue_push(&s, g_bad_lb), 0);
	pthread_mutex_unlock(&s.lk);
	src_wake(&s, 1);
	c_wait(&c, 0, 1);
	src_join(&s);
	check_bad(&c, &s);
	assert_int_equal(c.n, 0);
	assert_int_equal(atomic_load(&s.n_bytes), 3 * LB_SIZE); /* each read whole */
	c_close(&c, &s, fd);
}

static void test_corrupt_prefetch(void **state)
{
	struct cons c;
	struct src s;
	int fd;

	c_open(&c, &s, g_bad, 0, true, &fd);
	assert_int_equal(src_start(&s), 0);
	c_wait(&c, s.lb_total - 1, 1);
	src_join(&s);
	check_bad(&c, &s);
	assert_int_equal(c.n, s.lb_total - 1);
	assert_int_equal(atomic_load(&s.n_prefetch), s.lb_total - 1);
	assert_int_equal(atomic_load(&s.n_bytes), (s.lb_total + 2) * LB_SIZE);
	c_close(&c, &s, fd);
}

static int setup(void **state)
{
	mkfile();
	return 0;
}

static int teardown(void **state)
{
	unlink(g_path);
	unlink(g_bad);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefetch_order),
		cmocka_unit_test(test_demand),
		cmocka_unit_test(test_read_cached),
		cmocka_unit_test(test_corrupt_demand),
		cmocka_unit_test(test_corrupt_prefetch),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
