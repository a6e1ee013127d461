// SPDX-License-Identifier: MIT
/*
 * Fixed thread pool: one mutex, a FIFO of heap-allocated tasks, and a count
 * of tasks queued or running. halite_pool_wait() sleeps until that count is
 * zero, which covers nested submissions because a task's children are
 * counted before the task itself is uncounted.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/errors.h>

#include "pool.h"

#define POOL_MAX_THREADS 256u

struct pool_task {
	struct pool_task *next;
	halite_task_fn fn;
	void *arg;
};

struct pool_worker {
	struct halite_pool *pool;
	pthread_t thread;
	unsigned index;
};

struct halite_pool {
	pthread_mutex_t lock;
	pthread_cond_t work; /* queue not empty, or stopping */
	pthread_cond_t idle; /* pending dropped to zero */
	struct pool_task *head, *tail;
	unsigned long pending; /* queued + running */
	int stopping;
	unsigned nthreads;
	char name[16];
	struct pool_worker *workers;
};

/* The pool a worker thread belongs to, to catch wait() from a task. */
static __thread struct halite_pool *pool_self;

int halite_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int err;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -err;
}

static void *pool_worker_main(void *p)
{
	struct pool_worker *w = p;
	struct halite_pool *pool = w->pool;
	struct pool_task *t;
	char name[16];
	int plen;

	/*
	 * Linux limits thread names to 15 characters: shorten the pool name,
	 * never the index, so threads stay distinguishable in top and gdb.
	 */
	plen = 15 - snprintf(NULL, 0, "-%u", w->index);
	snprintf(name, sizeof(name), "%.*s-%u", plen, pool->name, w->index);
	pthread_setname_np(pthread_self(), name);
	pool_self = pool;

	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (!pool->head && !pool->stopping)
			pthread_cond_wait(&pool->work, &pool->lock);
		t = pool->head;
		if (!t)
			break; /* stopping, and nothing left */
		pool->head = t->next;
		if (!pool->head)
			pool->tail = NULL;
		pthread_mutex_unlock(&pool->lock);

		t->fn(t->arg);
		free(t);

		pthread_mutex_lock(&pool->lock);
		if (--pool->pending == 0)
			pthread_cond_broadcast(&pool->idle);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

static void pool_stop_join(struct halite_pool *pool, unsigned started)
{
	unsigned i;

	pthread_mutex_lock(&pool->lock);
	pool->stopping = 1;
	pthread_cond_broadcast(&pool->work);
	pthread_mutex_unlock(&pool->lock);
	for (i = 0; i < started; i++)
		pthread_join(pool->workers[i].thread, NULL);
}

static void pool_destroy(struct halite_pool *pool)
{
	pthread_cond_destroy(&pool->idle);
	pthread_cond_destroy(&pool->work);
	pthread_mutex_destroy(&pool->lock);
	free(pool->workers);
	free(pool);
}

int halite_pool_create(struct halite_pool **poolp, unsigned nthreads, const char *name)
{
	struct halite_pool *pool;
	sigset_t all, old;
	unsigned i;
	int err = 0;

	if (nthreads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		nthreads = n < 1 ? 1 : n > POOL_MAX_THREADS ? POOL_MAX_THREADS : (unsigned)n;
	}
	if (nthreads > POOL_MAX_THREADS)
		return -EINVAL;

	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	pool->workers = calloc(nthreads, sizeof(*pool->workers));
	if (!pool->workers) {
		free(pool);
		return -ENOMEM;
	}
	snprintf(pool->name, sizeof(pool->name), "%s", name && *name ? name : "halite");
	pool->nthreads = nthreads;
	pthread_mutex_init(&pool->lock, NULL);
	pthread_cond_init(&pool->work, NULL);
	pthread_cond_init(&pool->idle, NULL);

	/*
	 * Workers start with every signal blocked, so that signals meant for
	 * the application (SIGINT, SIGCHLD, ...) are never delivered to a
	 * library thread that has no handler strategy for them.
	 */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (i = 0; i < nthreads; i++) {
		pool->workers[i].pool = pool;
		pool->workers[i].index = i;
		err = pthread_create(&pool->workers[i].thread, NULL, pool_worker_main,
				     &pool->workers[i]);
		if (err)
			break;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	if (err) {
		pool_stop_join(pool, i);
		pool_destroy(pool);
		return -err;
	}
	*poolp = pool;
	return 0;
}

unsigned halite_pool_size(const struct halite_pool *pool)
{
	return pool->nthreads;
}

int halite_pool_submit(struct halite_pool *pool, halite_task_fn fn, void *arg)
{
	struct pool_task *t;

	t = malloc(sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->next = NULL;
	t->fn = fn;
	t->arg = arg;

	pthread_mutex_lock(&pool->lock);
	if (pool->stopping) {
		pthread_mutex_unlock(&pool->lock);
		free(t);
		return -HALITE_E_STATE;
	}
	if (pool->tail)
		pool->tail->next = t;
	else
		pool->head = t;
	pool->tail = t;
	pool->pending++;
	pthread_cond_signal(&pool->work);
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

void halite_pool_wait(struct halite_pool *pool)
{
	/* A task waiting for the pool would wait for itself. */
	assert(pool_self != pool);

	pthread_mutex_lock(&pool->lock);
	while (pool->pending)
		pthread_cond_wait(&pool->idle, &pool->lock);
	pthread_mutex_unlock(&pool->lock);
}

void halite_pool_free(struct halite_pool *pool)
{
	if (!pool)
		return;
	/*
	 * Drain before refusing new work: tasks still running may submit
	 * follow-up tasks, and those must run too. Once pending is zero no
	 * task is left to submit, so stopping cannot reject a nested one.
	 */
	halite_pool_wait(pool);
	pool_stop_join(pool, pool->nthreads);
	pool_destroy(pool);
}
