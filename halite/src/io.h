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
 *
 * A path "s3://BUCKET/KEY" opens an object of an S3 store instead, read
 * only, with ranged GETs of the version a HEAD saw at open (io_s3.c): the
 * same calls work on it (reads, submit/reap), halite_io_fd() is -1 and
 * halite_io_size() replaces fstat().
 */
#ifndef HALITE_IO_H
#define HALITE_IO_H

#include <stdbool.h>
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
	/* Internal: chosen by an s3:// path, never by an option. */
	HALITE_IO_S3 = 100,
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

/* Same file as @from, or for an object the same version without a new HEAD; else as halite_io_open(). */
int halite_io_reopen(struct halite_io **io, const struct halite_io *from, const char *path,
		     int oflags, const struct halite_io_opts *opts);

/* The descriptor, or -1 for an object of an S3 store: nothing of the page cache applies. */
int halite_io_fd(const struct halite_io *io);
int halite_io_backend(const struct halite_io *io); /* the backend in use */
int halite_io_is_direct(const struct halite_io *io);

/*
 * Read exactly @len bytes at @off. Returns 0, -HALITE_E_TRUNCATED when the
 * file ends first, or -errno. Retries short reads and EINTR.
 */
int halite_io_read(struct halite_io *io, void *buf, size_t len, uint64_t off);

/*
 * Read @n pieces of @len bytes each, back to back in the file from @off,
 * into @bufs[0..n-1]: for an object one request (one ranged GET; each piece
 * answered by the host's LB cache, or kept in it, as a read of its own), a
 * read each for a file. 0, or as halite_io_read() for the first piece that
 * failed; the pieces before it are read.
 */
int halite_io_read_run(struct halite_io *io, uint8_t *const *bufs, unsigned n, size_t len,
		       uint64_t off);

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

/* Whether @path names an object of an S3 store ("s3://..."). */
bool halite_io_is_s3_path(const char *path);

/* The file's or object's size in bytes; -EINVAL for a file that is not regular. */
int halite_io_size(const struct halite_io *io, uint64_t *size);

/*
 * For an object (@io a halite_io_reopen() of @from): keep copies of the
 * ranges @from keeps (halite_io_readahead()), so that what they hold costs
 * @io no request either. Files: nothing to do. 0 or -ENOMEM.
 */
int halite_io_share_kept(struct halite_io *io, const struct halite_io *from);

/*
 * For an object: fetch [@off, @off + @len) in one GET and keep it, so that
 * later reads inside it cost no request (at most a few ranges are kept, for
 * the handle's life). Not to be called while other threads read through
 * @io. Files: nothing to do, 0. 0 or a negative code.
 */
int halite_io_readahead(struct halite_io *io, uint64_t off, uint64_t len);

/*
 * Why the calling thread's last halite_io_open() of an object failed, in
 * one sentence ("s3://b/k: no region: set AWS_REGION, ...", "HEAD ...:
 * 403 AccessDenied ..."), or "".
 */
const char *halite_io_open_errmsg(void);

/*
 * The last failed request's sentence for an object ("GET s3://b/k: 412
 * ...") into @buf (@len bytes), or "" for a file or none. Any thread.
 */
void halite_io_errmsg(const struct halite_io *io, char *buf, size_t len);

/* "s3://BUCKET/KEY" for an object; NULL for a file. */
const char *halite_io_url(const struct halite_io *io);

/* The ETag every read of an object is conditional on; NULL for a file. */
const char *halite_io_etag(const struct halite_io *io);

struct halite_s3_stats;
/* Requests and bytes of an object's clients so far (all handles on the version); zeros for a file. */
void halite_io_s3_stats(const struct halite_io *io, struct halite_s3_stats *st);

/*
 * The host's LB cache: an object opened while HALITE_CACHE_DIR names a
 * directory keeps what it reads there (HALITE_CACHE_SIZE bytes at most,
 * default below; lbcache.h), shared by every process on the host that
 * names the same directory. Reads are answered from it only once
 * halite_io_cache_key() has named the snapshot: the cache is keyed by the
 * snapshot's uuid and the offset, not by the object's name.
 */
#define HALITE_CACHE_SIZE_DEFAULT (8ull << 30)
/* The snapshot @uuid is what every handle on this object version reads. Files: nothing. */
void halite_io_cache_key(struct halite_io *io, const uint8_t uuid[16]);
/* Forget the cached bytes at @off (about to be read again after a bad checksum). */
void halite_io_cache_drop(struct halite_io *io, uint64_t off);

struct halite_store_stats;
/* The store's requests and bytes and the cache's answers (halite_store_stats); zeros for a file. */
void halite_io_store_stats(const struct halite_io *io, struct halite_store_stats *st);

/* Close; in-flight requests are waited for first. NULL is fine. */
void halite_io_close(struct halite_io *io);

/* Buffer aligned to HALITE_IO_ALIGN, length rounded up to it; NULL on ENOMEM. */
void *halite_io_alloc(size_t len);
void halite_io_free(void *p);

#endif
