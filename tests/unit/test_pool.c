// SPDX-License-Identifier: MIT
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <halite/errors.h>

#include "pool.h"

#define NTASKS 10000

struct counter {
	unsigned runs[NTASKS];
	unsigned long total;
};

struct task_arg {
	struct counter *c;
	unsigned idx;
};

static void count_task(void *p)
{
	struct task_arg *a = p;

	__atomic_fetch_add(&a->c->runs[a->idx], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&a->c->total, 1, __ATOMIC_RELAXED);
}

static void test_each_task_once(void **state)
{
	static struct counter c;
	static struct task_arg args[NTASKS];
	struct halite_pool *pool;
	unsigned i;

	memset(&c, 0, sizeof(c));
	assert_int_equal(halite_pool_create(&pool, 4, "t-once"), 0);
	assert_int_equal(halite_pool_size(pool), 4);
	for (i = 0; i < NTASKS; i++) {
		args[i].c = &c;
		args[i].idx = i;
		assert_int_equal(halite_pool_submit(pool, count_task, &args[i]), 0);
	}
	halite_pool_wait(pool);
	/* wait() returned: all done, no atomics needed to look. */
	assert_int_equal(c.total, NTASKS);
	for (i = 0; i < NTASKS; i++)
		assert_int_equal(c.runs[i], 1);

	/* The pool is reusable after a wait. */
	for (i = 0; i < 100; i++)
		assert_int_equal(halite_pool_submit(pool, count_task, &args[i]), 0);
	halite_pool_wait(pool);
	assert_int_equal(c.total, NTASKS + 100);
	assert_int_equal(c.runs[0], 2);
	halite_pool_free(pool);
}

/* wait() must also wait for tasks already taken off the queue and still running. */
struct slow {
	unsigned long done;
};

static void slow_task(void *p)
{
	struct slow *s = p;

	usleep(50000);
	__atomic_fetch_add(&s->done, 1, __ATOMIC_RELAXED);
}

static void test_wait_running(void **state)
{
	struct halite_pool *pool;
	struct slow s = { 0 };
	unsigned i;

	assert_int_equal(halite_pool_create(&pool, 4, "t-running"), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(halite_pool_submit(pool, slow_task, &s), 0);
	/* Let the workers empty the queue: the tasks are now running. */
	usleep(10000);
	halite_pool_wait(pool);
	assert_int_equal(__atomic_load_n(&s.done, __ATOMIC_RELAXED), 4);
	halite_pool_free(pool);
}

/* A tree: each task submits two children until depth 0. */
struct tree {
	struct halite_pool *pool;
	unsigned long nodes;
	int submit_errors;
};

struct node {
	struct tree *t;
	unsigned depth;
};

static void tree_task(void *p);

static void tree_spawn(struct tree *t, unsigned depth)
{
	struct node *n = malloc(sizeof(*n));

	n->t = t;
	n->depth = depth;
	if (halite_pool_submit(t->pool, tree_task, n)) {
		__atomic_fetch_add(&t->submit_errors, 1, __ATOMIC_RELAXED);
		free(n);
	}
}

static void tree_task(void *p)
{
	struct node *n = p;
	struct tree *t = n->t;
	unsigned depth = n->depth;

	free(n);
	/* Give wait() a chance to wrongly see an empty queue between levels. */
	if (depth % 3 == 0)
		usleep(100);
	__atomic_fetch_add(&t->nodes, 1, __ATOMIC_RELAXED);
	if (depth) {
		tree_spawn(t, depth - 1);
		tree_spawn(t, depth - 1);
	}
}

static void test_nested_wait(void **state)
{
	struct tree t = { 0 };

	assert_int_equal(halite_pool_create(&t.pool, 3, "t-nested"), 0);
	tree_spawn(&t, 10);
	halite_pool_wait(t.pool);
	/* Every descendant, not just the first level. */
	assert_int_equal(t.nodes, (1ul << 11) - 1);
	assert_int_equal(t.submit_errors, 0);
	halite_pool_free(t.pool);
}

static void test_free_drains(void **state)
{
	struct tree t = { 0 };

	/* free() with work queued and running: everything still runs, nested too. */
	assert_int_equal(halite_pool_create(&t.pool, 2, "t-drain"), 0);
	tree_spawn(&t, 8);
	tree_spawn(&t, 8);
	halite_pool_free(t.pool);
	assert_int_equal(t.nodes, 2 * ((1ul << 9) - 1));
	assert_int_equal(t.submit_errors, 0);
}

/* FIFO: with one worker, tasks run in submission order. */
struct order {
	unsigned next;
	unsigned seq[64];
};

struct order_arg {
	struct order *o;
	unsigned id;
};

static void order_task(void *p)
{
	struct order_arg *a = p;

	a->o->seq[a->o->next++] = a->id;
}

static void test_fifo(void **state)
{
	struct halite_pool *pool;
	struct order o = { 0 };
	struct order_arg args[64];
	unsigned i;

	assert_int_equal(halite_pool_create(&pool, 1, "t-fifo"), 0);
	for (i = 0; i < 64; i++) {
		args[i].o = &o;
		args[i].id = i;
		assert_int_equal(halite_pool_submit(pool, order_task, &args[i]), 0);
	}
	halite_pool_wait(pool);
	assert_int_equal(o.next, 64);
	for (i = 0; i < 64; i++)
		assert_int_equal(o.seq[i], i);
	halite_pool_free(pool);
}

/* Workers are named "<name>-<index>", shortened to Linux's 15 characters. */
struct name_arg {
	pthread_mutex_t lock;
	pthread_cond_t two;	/* broadcast when the second task starts */
	char names[4][16];
	unsigned n;
};

/*
 * Records its worker's name, then holds that worker until a second task has
 * started: with two workers and four tasks, the second can only start on
 * the other worker, so both take part whatever the scheduler does. (A
 * deadline keeps a broken pool from hanging the test; the asserts catch it.)
 */
static void name_task(void *p)
{
	struct name_arg *a = p;
	struct timespec dl;
	char buf[16];

	pthread_getname_np(pthread_self(), buf, sizeof(buf));
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	pthread_mutex_lock(&a->lock);
	if (a->n < 4)
		memcpy(a->names[a->n++], buf, sizeof(buf));
	pthread_cond_broadcast(&a->two);
	while (a->n < 2 && pthread_cond_timedwait(&a->two, &a->lock, &dl) == 0)
		;
	pthread_mutex_unlock(&a->lock);
}

static void test_names(void **state)
{
	struct halite_pool *pool;
	struct name_arg a = { .lock = PTHREAD_MUTEX_INITIALIZER, .two = PTHREAD_COND_INITIALIZER };
	unsigned i, j;

	assert_int_equal(halite_pool_create(&pool, 2, "a-very-long-pool-name"), 0);
	for (i = 0; i < 4; i++)
		assert_int_equal(halite_pool_submit(pool, name_task, &a), 0);
	halite_pool_wait(pool);
	halite_pool_free(pool);
	assert_int_equal(a.n, 4);
	for (i = 0; i < 4; i++) {
		assert_true(!strcmp(a.names[i], "a-very-long-p-0") ||
			    !strcmp(a.names[i], "a-very-long-p-1"));
	}
	/* Both workers took part. */
	for (i = 1, j = 0; i < 4; i++)
		j |= strcmp(a.names[i], a.names[0]) != 0;
	assert_true(j);
}

static void test_create_args(void **state)
{
	struct halite_pool *pool = (struct halite_pool *)0x1;

	assert_int_equal(halite_pool_create(&pool, 257, "x"), -EINVAL);
	/* Out-parameter untouched on failure. */
	assert_ptr_equal(pool, (struct halite_pool *)0x1);
	assert_int_equal(halite_pool_create(&pool, 0, NULL), 0);
	assert_true(halite_pool_size(pool) >= 1);
	halite_pool_wait(pool); /* nothing submitted: returns at once */
	halite_pool_free(pool);
	halite_pool_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_each_task_once),
		cmocka_unit_test(test_wait_running),
		cmocka_unit_test(test_nested_wait),
		cmocka_unit_test(test_free_drains),
		cmocka_unit_test(test_fifo),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_create_args),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
