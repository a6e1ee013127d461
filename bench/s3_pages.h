/* SPDX-License-Identifier: MIT */
/*
 * Private to halite-bench-remote-restore: the remote benchmark's
 * page-granular peer, a plain userfaultfd handler over S3. Guest memory's
 * raw image (halite-inspect extract) is one object; every missing-page
 * fault on the registered memory is one ranged GET of its 4 KiB through the
 * project's S3 client, then UFFDIO_COPY. Nothing is read ahead and nothing
 * is skipped: a zero or never-touched page costs a request like any other,
 * as a handler that knows only the image would.
 */
#ifndef HALITE_BENCH_S3_PAGES_H
#define HALITE_BENCH_S3_PAGES_H

#include <stddef.h>
#include <stdint.h>

#define S3_PAGES_MAX_THREADS 64u

struct s3_pages;

struct s3_pages_stats {
	uint64_t faults;	/* pagefault messages read */
	uint64_t pages;		/* pages fetched and installed (one GET each) */
	uint64_t gets;		/* GETs begun (first attempts; any time) */
	/* Once stopped (the clients' own counters), else 0: */
	uint64_t requests;	/* sent to the store, retries included */
	uint64_t bytes;		/* response bodies */
	uint64_t connects;
	int error;		/* the first failure (< 0), else 0 */
};

/*
 * Register [@mem, @mem + @len) (page aligned, anonymous, never touched)
 * with a userfaultfd and start @threads handler threads, each with its own
 * S3 client of @url (the environment's AWS_* configuration). 0, or -errno
 * or a negative HALITE_S3_E_* code with a sentence in @err.
 */
int s3_pages_start(struct s3_pages **p, void *mem, uint64_t len, const char *url,
		   unsigned threads, char *err, size_t errlen);

/* Counts so far (or final, after s3_pages_stop()). */
void s3_pages_stats(struct s3_pages *p, struct s3_pages_stats *st);

/* The first failure's sentence ("GET of page 0x1000: ..."), or "" (none, or not yet written). */
const char *s3_pages_errmsg(struct s3_pages *p);

/*
 * Whether the page at @off was fetched (then its bytes came from the store).
 */
int s3_pages_fetched(const struct s3_pages *p, uint64_t off);

/*
 * Stop the threads and unregister the memory: memory never fetched reads as
 * zeros from then on. The faulting threads must not be blocked any more
 * (the guest stopped first). NULL is fine.
 */
void s3_pages_stop(struct s3_pages *p);

/* s3_pages_stop() and free. NULL is fine. */
void s3_pages_free(struct s3_pages *p);

#endif
