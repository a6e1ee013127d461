/* SPDX-License-Identifier: MIT */
/*
 * Private to io*.c: the handle, request slots and the backend operations.
 *
 * A request slot lives from submit to reap. A backend moves it through
 * "in the kernel" (counted in io->active) and hands each kernel completion to
 * halite_io_req_complete(), which continues short transfers or retires the request
 * onto the done list. Reap delivers retired requests once their due time
 * (the read latency) has passed.
 */
#ifndef HALITE_IO_INTERNAL_H
#define HALITE_IO_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include <libaio.h>
#include <liburing.h>

#include "io.h"

struct io_req {
	struct iocb iocb;	/* libaio only */
	struct io_req *next;	/* free list or done list */
	char *buf;
	size_t len;		/* total */
	size_t done;		/* transferred so far */
	uint64_t off;
	uint64_t tag;
	uint64_t due_ns;	/* earliest delivery (reads with latency) */
	int64_t res;
	bool write;
};

struct halite_io;

struct io_backend_ops {
	int id;
	/* 0, -HALITE_E_UNSUPPORTED if the kernel refuses, or -errno. */
	int (*init)(struct halite_io *io);
	/* Start the untransferred part of @req. */
	int (*submit)(struct halite_io *io, struct io_req *req);
	/*
	 * Hand kernel completions to halite_io_req_complete(), waiting for at least
	 * @min of them, at most @timeout_ns (UINT64_MAX: no limit) when
	 * min > 0. Returns the number handled, 0 on timeout, or -errno.
	 */
	int (*wait)(struct halite_io *io, unsigned min, uint64_t timeout_ns);
	void (*exit)(struct halite_io *io);
};

struct io_s3;

struct halite_io {
	int fd;			/* -1 for an object (s3) */
	struct io_s3 *s3;	/* the S3 backend's state, or NULL */
	bool direct;
	unsigned qd;
	uint64_t latency_ns;
	size_t chunk_max;	/* largest single kernel transfer */
	/* fault injection "write failure" (halite_io_test_fail_writes) */
	_Atomic uint64_t wr_budget; /* bytes that may still be written; UINT64_MAX = no limit */
	int wr_err;
	const struct io_backend_ops *ops;

	struct io_req *reqs;	/* qd slots */
	struct io_req *free;
	struct io_req *done_head, *done_tail;
	unsigned inflight;	/* submitted, not reaped */
	unsigned active;	/* in the kernel */

	union {
		struct io_uring ring;
		struct {
			io_context_t ctx;
			struct io_event *events; /* qd */
		} aio;
	};
};

extern const struct io_backend_ops halite_io_uring_ops;
extern const struct io_backend_ops halite_io_aio_ops;
extern const struct io_backend_ops halite_io_psync_ops;
extern const struct io_backend_ops halite_io_s3_ops;

/* io_s3.c: the object @url (HEAD), or another handle on @from's version. */
int halite_io_s3_open(struct io_s3 **x, const char *url, const struct halite_io *from);
/* A synchronous read of an object: 0, -HALITE_E_TRUNCATED, or a negative code. */
void halite_io_s3_free(struct io_s3 *x); /* its workers stopped; NULL is fine */
int halite_io_s3_read(struct halite_io *io, void *buf, size_t len, uint64_t off);
int halite_io_s3_read_run(struct halite_io *io, uint8_t *const *bufs, unsigned n, size_t len,
			  uint64_t off);

/*
 * Largest single kernel transfer by default: fits io_uring's 32-bit length
 * and keeps O_DIRECT alignment.
 */
#define IO_CHUNK_MAX ((size_t)1 << 30)

static inline size_t io_req_chunk(const struct halite_io *io, const struct io_req *req)
{
	size_t left = req->len - req->done;

	return left < io->chunk_max ? left : io->chunk_max;
}

/*
 * Fault injection "short transfer": split every kernel read and write into
 * pieces of at most @n bytes (0 restores the default), so tests reach the
 * code that continues short transfers. With O_DIRECT, @n must be a multiple
 * of HALITE_IO_ALIGN. Not for production use.
 */
void halite_io_test_set_chunk(struct halite_io *io, size_t n);

/*
 * Fault injection "write failure": once @after bytes have been written
 * through halite_io_write() or submitted with halite_io_submit_write(), a
 * write that does not fit in what is left writes nothing and fails with
 * -@err (ENOSPC, EIO, ...), as a full or failing disk would: halite_io_write()
 * returns it; an asynchronous write is accepted and completes with res =
 * -@err, whatever the backend. Not for production use.
 */
void halite_io_test_fail_writes(struct halite_io *io, uint64_t after, int err);

/*
 * A kernel completion of @res for @req, which is no longer active: continue a
 * short transfer, or retire the request.
 */
void halite_io_req_complete(struct halite_io *io, struct io_req *req, int64_t res);

/* Retire @req with its final result onto the done list. */
void halite_io_req_finish(struct halite_io *io, struct io_req *req, int64_t res);

/* pread/pwrite all of @len at @off, continuing short transfers: @len or -errno. */
int64_t halite_io_pio(const struct halite_io *io, bool write, void *buf, size_t len, uint64_t off);

#endif
