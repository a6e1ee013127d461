/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library and by tools
 * halite-inspect (parallel import and verify) and halite-synth
 * (halite_common). A fixed-size thread pool: the save engine compresses on
 * it, the restore engine installs the rest of a locality block on it.
 */
#ifndef HALITE_POOL_H
#define HALITE_POOL_H

#include <pthread.h>

struct halite_pool;

/*
 * pthread_create() of a library thread: it starts with every signal
 * blocked, so that signals meant for the application are never delivered
 * to a thread with no strategy for them (the pool's workers start so too).
 * 0 or -errno.
 */
int halite_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

typedef void (*halite_task_fn)(void *arg);

/*
 * Start @nthreads workers (1..256; 0 = the number of online CPUs). @name (at
 * most 15 chars) names the threads for ps/top/gdb. Returns 0 or -errno.
 */
int halite_pool_create(struct halite_pool **pool, unsigned nthreads, const char *name);

/* Number of worker threads. */
unsigned halite_pool_size(const struct halite_pool *pool);

/*
 * Queue fn(arg). Tasks start in submission order; any thread may submit,
 * including a task. Returns 0, -ENOMEM, or -HALITE_E_STATE after the pool
 * began shutting down.
 */
int halite_pool_submit(struct halite_pool *pool, halite_task_fn fn, void *arg);

/*
 * Block until every task submitted so far (and tasks they submitted) has
 * finished. Must not be called from a task.
 */
void halite_pool_wait(struct halite_pool *pool);

/* Finish queued tasks, join the workers, free. NULL is fine. */
void halite_pool_free(struct halite_pool *pool);

#endif
