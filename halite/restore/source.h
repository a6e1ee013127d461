/* SPDX-License-Identifier: MIT */
/*
 * Private to restore/: a snapshot source, what owns one snapshot file's
 * reading for its consumers. The single restore (restore.c and its files)
 * is a source with one consumer; the clone service's template (template.c)
 * one with many sessions behind it.
 *
 * source.c           the LB states, the demand queue and its reader threads,
 *                    stream readahead, a read from the page cache, an LB's
 *                    read verified and retried from the device, its failure
 * source_prefetch.c  the prefetcher: a "first" list, then file order,
 *                    queue_depth reads in flight, throttled
 *
 * Every LB the source reads is verified before a consumer sees it
 * (ops.landed); one whose every read failed is FAILED before ops.failed
 * hears of it, its message naming the LB and its offset. The consumer
 * keeps its own per-LB extras (waiters, buffers) under the source's lock.
 * The design: docs/architecture.md, "The snapshot source".
 */
#ifndef HALITE_RESTORE_SOURCE_H
#define HALITE_RESTORE_SOURCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/format.h>

#include "io.h"
#include "log_internal.h"
#include "s3.h"

/*
 * A locality block's state, each LB read once: IDLE (not read), READING
 * (one read in flight, or queued for one; whoever wants its blocks waits
 * for it), CACHED (the single restore: its verified bytes held while its
 * blocks are installed), DONE (every block in), FAILED (every read failed,
 * or the consumer could not take it). Zero is IDLE: the array starts
 * zeroed. Written under the source's lock; read without it.
 */
enum { LB_IDLE, LB_READING, LB_CACHED, LB_DONE, LB_FAILED };

/* How an LB came in (ops.landed): a consumer asked for it, or nobody did. */
enum { SRC_DEMAND = 1, SRC_PREFETCH = 2 };

/* Stream readahead: the queue of LBs to read ahead. */
#define SRC_RA_QUEUE 256u

/*
 * What a consumer is told, each on the source's threads (or, for
 * src_read_cached(), on the caller's), never under the source's lock.
 */
struct src_ops {
	/*
	 * LB @lb is verified in @buf (halite_reader_alloc_lb(); the callee
	 * takes it), counted already; @how SRC_DEMAND or SRC_PREFETCH; @tmp
	 * the calling thread's scratch of mb_size bytes. The LB is READING
	 * until the consumer says otherwise.
	 */
	void (*landed)(void *ctx, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp);
	/* Every read of @lb failed (@err the last); it is FAILED; @msg names it. */
	void (*failed)(void *ctx, uint64_t lb, int err, const char *msg);
	/*
	 * The prefetcher: 0 to read on, else hold back (what it has in flight
	 * still lands) and, with nothing in flight, nap this many µs. NULL:
	 * never.
	 */
	uint32_t (*hold)(void *ctx);
	/* May stream readahead queue LBs now? NULL: yes. */
	bool (*ra_ok)(void *ctx);
	/* A source thread cannot go on (@msg without the error's text). */
	void (*error)(void *ctx, int err, const char *msg);
};

struct src_opts {
	unsigned readers;	   /* demand reader threads */
	unsigned ra_readers;	   /* ... of which readahead may take at most this many */
	unsigned readahead;	   /* LBs of a stream read ahead after a demand read; 0: none */
	unsigned read_retries;	   /* reads of a failing LB after the first */
	bool prefetch;		   /* run the prefetcher */
	bool first_unthrottled;	   /* the first list is read unthrottled */
	bool inline_reads;	   /* src_read_cached() may read (buffered, no added latency) */
	unsigned queue_depth;	   /* prefetch reads in flight */
	uint32_t prefetch_idle_us; /* src_prefetch_may() */
	uint64_t prefetch_min_rate;
	int io_backend;		   /* the prefetcher's halite_io */
	unsigned io_flags;
	uint32_t read_latency_us;
	const char *thread_name;   /* its readers' name; the prefetcher's is "halite-prefetch" */
};

struct src {
	struct src_opts o;
	const struct src_ops *ops;
	void *ctx;
	struct halite_reader *rd;
	const char *path;	   /* the caller's, for messages and the prefetcher's open */
	int fd;			   /* page-cache reads and drops; the caller's */
	uint32_t lb_size, mb_size;
	uint64_t lb_total;
	unsigned span;		   /* LBs one reader's read may cover (an object's: read_span()) */
	struct halite_logger *log;

	_Atomic uint8_t *st;	   /* LB_* per LB */
	/*
	 * lk guards the LB states, the demand and readahead queues; a
	 * consumer's per-LB waiter lists may live under it too (both
	 * consumers keep theirs there, so a waiter added under lk is one the
	 * landing sees). q_cond wakes readers: signal it after unlocking
	 * (src_queue_push()).
	 */
	pthread_mutex_t lk;
	pthread_cond_t q_cond;
	uint64_t *q;		   /* demand queue: a ring of LB indices */
	size_t q_cap, q_head, q_len;
	/*
	 * Stream readahead: ra_next[lb] is 1 + the next LB of lb's stream (file
	 * order), 0 until looked up, UINT64_MAX for none (src_ra_next()); raq a
	 * ring of LBs to read ahead, oldest dropped when full; ra_busy readers
	 * reading one now.
	 */
	uint64_t *ra_next;
	uint64_t raq[SRC_RA_QUEUE];
	size_t raq_head, raq_len;
	unsigned ra_busy;

	/* The prefetch order: first[0..nfirst) (NULL: LBs 0..nfirst-1), then file order. */
	const uint64_t *first;
	uint64_t nfirst;
	struct halite_io *io;	   /* the prefetcher's, NULL without */
	_Atomic uint64_t last_fault_ns; /* the consumer's last fault: the throttle */

	pthread_cond_t pf_cond;	   /* the prefetcher, done, waits here until the source stops */
	pthread_t *thr, pf_thr;
	unsigned nthr;
	bool pf_started;
	_Atomic bool failed;	   /* read nothing more (the consumer failed) */
	_Atomic bool stopping;	   /* the threads exit */

	_Atomic uint64_t n_demand, n_prefetch, n_retries, n_bytes, n_first;
};

/*
 * At open: @s for @rd (the caller keeps it, and @path, @log, @fd), its LB
 * states zeroed, the prefetcher's file open when o.prefetch. Threads
 * start with src_start(). 0, or -errno with a message through ops.error.
 */
int src_init(struct src *s, struct halite_reader *rd, const char *path, int fd,
	     const struct src_opts *o, const struct src_ops *ops, void *ctx,
	     struct halite_logger *log);
/* The readers, and the prefetcher (o.prefetch). 0 or -errno (those started run on). */
int src_start(struct src *s);
/* Tell the threads to exit (any thread may). */
void src_stop(struct src *s);
/* src_stop(), and join them (not from one of them). */
void src_join(struct src *s);
/* After src_join(): what src_init() allocated. Fine on a zeroed @s. */
void src_destroy(struct src *s);

/* Under lk: queue @lb (READING) for the demand readers. 0 or -ENOMEM. */
int src_queue_push(struct src *s, uint64_t lb);
/* Under lk: stream readahead after a demand read of @lb; how many readers to signal. */
size_t src_ra_push(struct src *s, uint64_t lb);
/* Under lk: @lb's successor in its stream, or UINT64_MAX (looked up on first use). */
uint64_t src_ra_next(struct src *s, uint64_t lb);
/* Wake @n readers (after unlocking lk). */
static inline void src_wake(struct src *s, size_t n)
{
	while (n--)
		pthread_cond_signal(&s->q_cond);
}
/* Under lk: may the caller read a READING LB with src_read_cached() now? */
static inline bool src_inline_ok(const struct src *s)
{
	return s->o.inline_reads && !s->q_len;
}
/*
 * The caller reads @lb (READING, its own) itself when all of it is in the
 * page cache: landed as a demand read (with @tmp), its readahead queued.
 * False when not all of it is cached or it does not verify: queue it then.
 */
bool src_read_cached(struct src *s, uint64_t lb, uint8_t *tmp);
/* LBs an object's read covers at most (src_read_run(): a bit each). */
#define SRC_SPAN_MAX 64u
/*
 * LBs @lb .. @lb + @n - 1 (READING, the caller's; @n at most SRC_SPAN_MAX)
 * into @bufs in one request (halite_io_read_run()), each verified: a bit
 * set for each that did not come in verified (all when the request
 * failed), for the caller to read alone (src_read_lb_retrying()).
 */
uint64_t src_read_run(struct src *s, uint64_t lb, unsigned n, uint8_t *const *bufs);
/* One LB into @buf, verified, read again on failure. 0 or the last failure. */
int src_read_lb_retrying(struct src *s, uint64_t lb, uint8_t *buf, unsigned *reads);

/*
 * A failure that reading again cannot mend: an object of an S3 store that
 * was replaced answers every conditional GET the same way (io_s3.c), and the
 * S3 client has retried what is worth retrying already.
 */
static inline bool src_read_final(int err)
{
	/* A store out of reach was retried for HALITE_S3_RETRY_FOR already (io_s3.c). */
	return err == -HALITE_S3_E_CHANGED || err == -HALITE_S3_E_NETWORK ||
	       err == -HALITE_S3_E_STORE;
}
/* Before reading @lb again after @err: counted, logged, its page-cache copy dropped. */
void src_lb_retrying(struct src *s, uint64_t lb, int err, unsigned reads);
/* Every read of @lb failed: FAILED, named, ops.failed. */
void src_lb_failed(struct src *s, uint64_t lb, int err, unsigned reads);
/* @lb cannot be had (@msg says why): FAILED, then ops.failed. */
void src_lb_fail(struct src *s, uint64_t lb, int err, const char *msg);
/* A source thread cannot go on: ops.error, if the consumer has one. */
void src_error(struct src *s, int err, const char *msg);
/* A verified LB to its consumer (not after src.failed: then freed). */
void src_land(struct src *s, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp);

/* The prefetcher thread (source_prefetch.c; @arg: the source). */
void *src_prefetch_main(void *arg);

/*
 * The prefetch throttle: a background read may go at @now when no fault
 * came for @idle_us (the last at @last_fault), or when the reads @issued
 * (bytes) since @since are behind @min_rate (bytes/s). Faults take the
 * device first; the rate keeps the guest's whole memory coming in even
 * while it faults without pause.
 */
static inline bool src_prefetch_may(uint64_t now, uint64_t last_fault, uint32_t idle_us,
				    uint64_t since, uint64_t min_rate, uint64_t issued)
{
	/* @last_fault may be a little after @now, read by another thread. */
	if (now > last_fault && now - last_fault >= (uint64_t)idle_us * 1000)
		return true;
	return (double)issued < (double)(now - since) * (double)min_rate / 1e9;
}

/*
 * One read of LB @lb into @buf, verified (halite_reader_read_lb()): 0 or
 * its error. A read that came back whole, its checksum good or not, adds
 * the LB's size to *@bytes_read.
 */
int src_read_lb(struct halite_reader *rd, uint64_t lb, void *buf, _Atomic uint64_t *bytes_read);

/*
 * "locality block N at offset O: @why" into @buf (without the offset when
 * the LB table cannot say it).
 */
void src_lb_errmsg(struct halite_reader *rd, uint64_t lb, const char *why, char *buf, size_t len);

#endif
