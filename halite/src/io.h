/* SPDX-License-Identifier: MIT */
/*
 * Private: file I/O backends.
 *
 * One interface over io_uring (default), libaio and plain pread/pwrite,
 * buffered or O_DIRECT, with an optional fixed latency added to every read to
 * model slow disks or remote storage in benchmarks.
 *
 * Synchronous calls (halite_io_read/write/sync) are thread-safe and use
 * pread/pwrite on the descriptor whatever the backend. Asynchronous calls
 * (submit/reap) belong to one thread at a time: the owner of the handle.
 */
#ifndef HALITE_IO_H
#define HALITE_IO_H

#include <stddef.h>
#include <stdint.h>

#include <halite/format.h>

/*
 * The public HALITE_IO_BACKEND_* numbers (format.h: the writer's io_backend
 * option) are these, so an option value passes straight through.
 */
enum halite_io_backend {
	/* io_uring if the kernel allows it, else libaio, else psync */
	HALITE_IO_DEFAULT = HALITE_IO_BACKEND_DEFAULT,
	HALITE_IO_URING = HALITE_IO_BACKEND_URING,
	HALITE_IO_AIO = HALITE_IO_BACKEND_AIO,
	HALITE_IO_PSYNC = HALITE_IO_BACKEND_PSYNC,
};
_Static_assert(HALITE_IO_DEFAULT == 0 && HALITE_IO_URING == 1 && HALITE_IO_AIO == 2 &&
		       HALITE_IO_PSYNC == 3,
	       "enum halite_io_backend is part of the public ABI (format.h)");

/* queue_depth at most (halite_io_open() answers -EINVAL beyond). */
#define HALITE_IO_QD_MAX 4096u

/* Alignment (bytes) of buffers, offsets and lengths for O_DIRECT. */
#define HALITE_IO_ALIGN 4096u

#define HALITE_IO_DIRECT 0x1u /* open with O_DIRECT; fails if the file system refuses */

struct halite_io_opts {
	size_t sz;		   /* sizeof(struct halite_io_opts) */
	int backend;		   /* enum halite_io_backend */
	unsigned queue_depth;	   /* async requests in flight at most; 0 = 32 */
	unsigned flags;		   /* HALITE_IO_* */
	uint32_t read_latency_us;  /* added to every read, sync or async; 0 = none */
};

struct halite_io_done {
	uint64_t tag; /* as given at submit */
	int64_t res;  /* bytes transferred, or -errno */
};

struct halite_io;

/* "io_uring", "libaio", "psync"; NULL for unknown. */
const char *halite_io_backend_name(int backend);
/* Backend id for @name, or -EINVAL. */
int halite_io_backend_parse(const char *name);

/*
 * Open @path with @oflags (O_RDONLY, or O_WRONLY|O_CREAT|O_TRUNC, ...; O_DIRECT
 * is added from opts->flags) and @mode. An explicitly requested backend that
 * the kernel refuses is an error (-HALITE_E_UNSUPPORTED); the default falls
 * back. Returns 0 or -errno; *io is written only on success.
 */
int halite_io_open(struct halite_io **io, const char *path, int oflags, unsigned mode,
		   const struct halite_io_opts *opts);

/* Same, over an already open descriptor, which the handle then owns. */
int halite_io_from_fd(struct halite_io **io, int fd, const struct halite_io_opts *opts);

int halite_io_fd(const struct halite_io *io);
int halite_io_backend(const struct halite_io *io); /* the backend in use */
int halite_io_is_direct(const struct halite_io *io);

/*
 * Read exactly @len bytes at @off. Returns 0, -HALITE_E_TRUNCATED when the
 * file ends first, or -errno. Retries short reads and EINTR.
 */
int halite_io_read(struct halite_io *io, void *buf, size_t len, uint64_t off);

/* Write exactly @len bytes at @off. Returns 0 or -errno (-ENOSPC, -EIO, ...). */
int halite_io_write(struct halite_io *io, const void *buf, size_t len, uint64_t off);

/* fdatasync. Returns 0 or -errno. */
int halite_io_sync(struct halite_io *io);

/*
 * Queue an asynchronous read or write of exactly @len bytes (short transfers
 * are completed internally). Returns 0, -EAGAIN when queue_depth requests are
 * already in flight (reap first), or -errno.
 */
int halite_io_submit_read(struct halite_io *io, void *buf, size_t len, uint64_t off,
			  uint64_t tag);
int halite_io_submit_write(struct halite_io *io, const void *buf, size_t len, uint64_t off,
			   uint64_t tag);

/* Requests submitted and not yet reaped. */
unsigned halite_io_inflight(const struct halite_io *io);

/*
 * Collect up to @max completions into @done, waiting until at least @min have
 * completed (min <= inflight). Returns the number collected or -errno.
 */
int halite_io_reap(struct halite_io *io, struct halite_io_done *done, unsigned max,
		   unsigned min);

/* Close; in-flight requests are waited for first. NULL is fine. */
void halite_io_close(struct halite_io *io);

/* Buffer aligned to HALITE_IO_ALIGN, length rounded up to it; NULL on ENOMEM. */
void *halite_io_alloc(size_t len);
void halite_io_free(void *p);

#endif
