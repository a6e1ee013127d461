// SPDX-License-Identifier: MIT
/*
 * File I/O: the handle, synchronous calls, and the request bookkeeping that
 * all asynchronous backends share (io_uring.c, io_aio.c, io_psync.c).
 *
 * Backend choice. An explicit backend is used or refused: when the kernel
 * will not give it (io_uring disabled by sysctl or seccomp, no aio, aio-max-nr
 * reached) halite_io_open() fails with -HALITE_E_UNSUPPORTED. The default
 * tries io_uring, then libaio, then psync, which always works.
 *
 * O_DIRECT. A file system that does not do direct I/O fails open(2) (or
 * F_SETFL) with EINVAL; with HALITE_IO_DIRECT that is reported as
 * -HALITE_E_UNSUPPORTED, so a caller can tell "not here" from a bad argument
 * and retry buffered if it wants to. Note that tmpfs accepts O_DIRECT since
 * Linux 6.6, procfs and sysfs do not. Alignment is left to the kernel, which
 * answers -EINVAL.
 *
 * Read latency. Every read completes no earlier than read_latency_us after
 * it started: synchronous reads sleep out the rest before returning;
 * asynchronous reads are stamped with a due time at submit and reap holds
 * their completion back until then. Writes are never delayed.
 *
 * Limits: queue_depth is at most 4096 (-EINVAL beyond). Reaping with min
 * greater than what is in flight is -EINVAL rather than a wait forever.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/errors.h>

#include "io_internal.h"
#include "opts.h"
#include "stats.h"

#define IO_QD_DEFAULT 32u
/* HALITE_IO_QD_MAX: far more than any engine keeps in flight; bounds the slot array. */

const char *halite_io_backend_name(int backend)
{
	switch (backend) {
	case HALITE_IO_URING:
		return "io_uring";
	case HALITE_IO_AIO:
		return "libaio";
	case HALITE_IO_PSYNC:
		return "psync";
	case HALITE_IO_S3:
		return "s3";
	}
	return NULL;
}

int halite_io_backend_parse(const char *name)
{
	int b;

	if (!name)
		return -EINVAL;
	for (b = HALITE_IO_URING; b <= HALITE_IO_PSYNC; b++)
		if (!strcmp(name, halite_io_backend_name(b)))
			return b;
	return -EINVAL;
}

static int io_opts_get(struct halite_io_opts *o, const struct halite_io_opts *user)
{
	int err = halite_opts_copy(o, sizeof(*o), user);

	if (err)
		return err;
	if (o->flags & ~HALITE_IO_DIRECT)
		return -EINVAL;
	if (o->backend < HALITE_IO_DEFAULT || o->backend > HALITE_IO_PSYNC)
		return -EINVAL;
	if (o->queue_depth > HALITE_IO_QD_MAX)
		return -EINVAL;
	return 0;
}

static const struct io_backend_ops *io_backend_ops(int backend)
{
	switch (backend) {
	case HALITE_IO_URING:
		return &halite_io_uring_ops;
	case HALITE_IO_AIO:
		return &halite_io_aio_ops;
	default:
		return &halite_io_psync_ops;
	}
}

/* @s3: an object's state, which the handle then owns (freed here on failure). */
static int io_create(struct halite_io **iop, int fd, bool direct,
		     const struct halite_io_opts *o, struct io_s3 *s3)
{
	static const int fallback[] = { HALITE_IO_URING, HALITE_IO_AIO, HALITE_IO_PSYNC };
	struct halite_io *io;
	unsigned i;
	int err = -HALITE_E_UNSUPPORTED;

	io = calloc(1, sizeof(*io));
	if (!io) {
		halite_io_s3_free(s3);
		return -ENOMEM;
	}
	io->fd = fd;
	io->s3 = s3;
	io->direct = direct;
	io->qd = o->queue_depth ? o->queue_depth : IO_QD_DEFAULT;
	io->latency_ns = (uint64_t)o->read_latency_us * 1000u;
	io->chunk_max = IO_CHUNK_MAX;
	io->reqs = calloc(io->qd, sizeof(*io->reqs));
	if (!io->reqs) {
		halite_io_s3_free(s3);
		free(io);
		return -ENOMEM;
	}
	for (i = io->qd; i-- > 0;) {
		io->reqs[i].next = io->free;
		io->free = &io->reqs[i];
	}

	if (s3) {
		/* An object has one backend, whatever was asked for files. */
		io->ops = &halite_io_s3_ops;
		err = io->ops->init(io);
	} else if (o->backend != HALITE_IO_DEFAULT) {
		io->ops = io_backend_ops(o->backend);
		err = io->ops->init(io);
	} else {
		for (i = 0; i < sizeof(fallback) / sizeof(fallback[0]); i++) {
			io->ops = io_backend_ops(fallback[i]);
			err = io->ops->init(io);
			if (err != -HALITE_E_UNSUPPORTED)
				break;
		}
	}
	if (err) {
		halite_io_s3_free(s3);
		free(io->reqs);
		free(io);
		return err;
	}
	*iop = io;
	return 0;
}

/*
 * An object is read only, and O_DIRECT means nothing for it: its bytes
 * arrive in the caller's buffer from the network.
 */
static int io_open_s3(struct halite_io **iop, const char *path, int oflags,
		      const struct halite_io *from, const struct halite_io_opts *o)
{
	struct io_s3 *x;
	int err;

	if ((oflags & O_ACCMODE) != O_RDONLY || (oflags & (O_CREAT | O_TRUNC)))
		return -EROFS;
	err = halite_io_s3_open(&x, path, from);
	if (err)
		return err;
	return io_create(iop, -1, false, o, x);
}

int halite_io_open(struct halite_io **iop, const char *path, int oflags, unsigned mode,
		   const struct halite_io_opts *opts)
{
	struct halite_io_opts o;
	bool direct;
	int fd, err;

	err = io_opts_get(&o, opts);
	if (err)
		return err;
	if (halite_io_is_s3_path(path))
		return io_open_s3(iop, path, oflags, NULL, &o);
	if (o.flags & HALITE_IO_DIRECT)
		oflags |= O_DIRECT;
	direct = oflags & O_DIRECT;

	fd = open(path, oflags | O_CLOEXEC, (mode_t)mode);
	if (fd < 0) {
		/* O_DIRECT is the one flag an otherwise good open refuses with EINVAL. */
		if (errno == EINVAL && direct)
			return -HALITE_E_UNSUPPORTED;
		return -errno;
	}
	err = io_create(iop, fd, direct, &o, NULL);
	if (err)
		close(fd);
	return err;
}

int halite_io_reopen(struct halite_io **iop, const struct halite_io *from, const char *path,
		     int oflags, const struct halite_io_opts *opts)
{
	struct halite_io_opts o;
	int err;

	if (!from || !from->s3)
		return halite_io_open(iop, path, oflags, 0, opts);
	err = io_opts_get(&o, opts);
	if (err)
		return err;
	return io_open_s3(iop, path, oflags, from, &o);
}

/* On failure the caller keeps @fd, unchanged. */
int halite_io_from_fd(struct halite_io **iop, int fd, const struct halite_io_opts *opts)
{
	struct halite_io_opts o;
	int fl, err;

	err = io_opts_get(&o, opts);
	if (err)
		return err;
	fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	if ((o.flags & HALITE_IO_DIRECT) && !(fl & O_DIRECT)) {
		if (fcntl(fd, F_SETFL, fl | O_DIRECT) < 0)
			return errno == EINVAL ? -HALITE_E_UNSUPPORTED : -errno;
	}
	err = io_create(iop, fd, (fl & O_DIRECT) || (o.flags & HALITE_IO_DIRECT), &o, NULL);
	if (err && (o.flags & HALITE_IO_DIRECT) && !(fl & O_DIRECT))
		fcntl(fd, F_SETFL, fl);
	return err;
}

void halite_io_test_set_chunk(struct halite_io *io, size_t n)
{
	io->chunk_max = n ? n : IO_CHUNK_MAX;
}

int halite_io_fd(const struct halite_io *io)
{
	return io->fd;
}

int halite_io_backend(const struct halite_io *io)
{
	return io->ops->id;
}

int halite_io_is_direct(const struct halite_io *io)
{
	return io->direct;
}

/* off_t is signed: the whole transfer must end at or below INT64_MAX. */
static bool io_range_ok(size_t len, uint64_t off)
{
	return off <= INT64_MAX && len <= INT64_MAX - off;
}

static void io_sleep_until(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / 1000000000u),
		.tv_nsec = (long)(ns % 1000000000u),
	};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

int64_t halite_io_pio(const struct halite_io *io, bool write, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	while (done < len) {
		size_t n = len - done < io->chunk_max ? len - done : io->chunk_max;
		ssize_t r;

		if (write)
			r = pwrite(io->fd, (char *)buf + done, n, (off_t)(off + done));
		else
			r = pread(io->fd, (char *)buf + done, n, (off_t)(off + done));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return write ? -EIO : -HALITE_E_TRUNCATED;
		done += (size_t)r;
		/*
		 * A direct read that stops short of an alignment boundary hit
		 * the end of the file. Asking for the rest at the unaligned
		 * position gets 0 from ext4 and XFS (EOF is checked first) but
		 * EINVAL from file systems that check alignment first.
		 */
		if (io->direct && !write && done < len && done % HALITE_IO_ALIGN)
			return -HALITE_E_TRUNCATED;
	}
	return (int64_t)len;
}

int halite_io_read(struct halite_io *io, void *buf, size_t len, uint64_t off)
{
	uint64_t start = io->latency_ns ? halite_now_ns() : 0;
	int64_t r;

	if (!io_range_ok(len, off))
		return -EINVAL;
	if (io->s3)
		r = halite_io_s3_read(io, buf, len, off);
	else
		r = halite_io_pio(io, false, buf, len, off);
	if (io->latency_ns)
		io_sleep_until(start + io->latency_ns);
	return r < 0 ? (int)r : 0;
}

int halite_io_read_run(struct halite_io *io, uint8_t *const *bufs, unsigned n, size_t len,
		       uint64_t off)
{
	int ret = 0;

	if (n && !io_range_ok((size_t)n * len, off))
		return -EINVAL;
	if (io->s3 && n > 1) {
		uint64_t start = io->latency_ns ? halite_now_ns() : 0;

		ret = halite_io_s3_read_run(io, bufs, n, len, off);
		if (io->latency_ns)
			io_sleep_until(start + io->latency_ns);
		return ret;
	}
	for (unsigned i = 0; i < n && !ret; i++)
		ret = halite_io_read(io, bufs[i], len, off + (uint64_t)i * len);
	return ret;
}

/*
 * Fault injection "write failure": take @len bytes from the budget, or return
 * the injected error (the budget is left as it is) when it does not cover them.
 */
static int io_wr_budget_take(struct halite_io *io, size_t len)
{
	uint64_t left;

	if (!io->wr_err)
		return 0;
	left = atomic_load(&io->wr_budget);
	do {
		if (left < len)
			return -io->wr_err;
	} while (!atomic_compare_exchange_weak(&io->wr_budget, &left, left - len));
	return 0;
}

int halite_io_write(struct halite_io *io, const void *buf, size_t len, uint64_t off)
{
	int64_t r;
	int err;

	if (!io_range_ok(len, off))
		return -EINVAL;
	if (io->s3)
		return -EROFS;
	err = io_wr_budget_take(io, len);
	if (err)
		return err;
	r = halite_io_pio(io, true, (void *)buf, len, off);
	return r < 0 ? (int)r : 0;
}

void halite_io_test_fail_writes(struct halite_io *io, uint64_t after, int err)
{
	atomic_store(&io->wr_budget, after);
	io->wr_err = err < 0 ? -err : err;
}

int halite_io_sync(struct halite_io *io)
{
	if (io->s3)
		return -EROFS;
	return fdatasync(io->fd) ? -errno : 0;
}

void halite_io_req_finish(struct halite_io *io, struct io_req *req, int64_t res)
{
	req->res = res;
	req->next = NULL;
	if (io->done_tail)
		io->done_tail->next = req;
	else
		io->done_head = req;
	io->done_tail = req;
}

void halite_io_req_complete(struct halite_io *io, struct io_req *req, int64_t res)
{
	int err;

	if (res == -EINTR || res == -EAGAIN)
		goto again;
	if (res < 0) {
		halite_io_req_finish(io, req, res);
		return;
	}
	if (res == 0) {
		halite_io_req_finish(io, req, req->write ? -EIO : -HALITE_E_TRUNCATED);
		return;
	}
	req->done += (size_t)res;
	if (req->done >= req->len) {
		halite_io_req_finish(io, req, (int64_t)req->len);
		return;
	}
	if (io->direct && !req->write && req->done % HALITE_IO_ALIGN) {
		halite_io_req_finish(io, req, -HALITE_E_TRUNCATED);
		return;
	}
again:
	err = io->ops->submit(io, req);
	if (err)
		halite_io_req_finish(io, req, err);
}

static int io_queue_req(struct halite_io *io, bool write, void *buf, size_t len, uint64_t off,
		     uint64_t tag)
{
	struct io_req *req;
	int err;

	if (!io_range_ok(len, off))
		return -EINVAL;
	req = io->free;
	if (!req)
		return -EAGAIN;
	io->free = req->next;
	memset(req, 0, sizeof(*req));
	req->buf = buf;
	req->len = len;
	req->off = off;
	req->tag = tag;
	req->write = write;
	if (!write && io->latency_ns)
		req->due_ns = halite_now_ns() + io->latency_ns;
	io->inflight++;

	if (len == 0) {
		halite_io_req_finish(io, req, 0);
		return 0;
	}
	/*
	 * An injected write failure completes the request with the error, the
	 * way a full or failing disk answers an asynchronous write: submit
	 * succeeds and the caller learns of it at reap. Same for every backend.
	 */
	if (write) {
		err = io_wr_budget_take(io, len);
		if (err) {
			halite_io_req_finish(io, req, err);
			return 0;
		}
	}
	err = io->ops->submit(io, req);
	if (err) {
		io->inflight--;
		req->next = io->free;
		io->free = req;
	}
	return err;
}

int halite_io_submit_read(struct halite_io *io, void *buf, size_t len, uint64_t off,
			  uint64_t tag)
{
	return io_queue_req(io, false, buf, len, off, tag);
}

int halite_io_submit_write(struct halite_io *io, const void *buf, size_t len, uint64_t off,
			   uint64_t tag)
{
	return io_queue_req(io, true, (void *)buf, len, off, tag);
}

unsigned halite_io_inflight(const struct halite_io *io)
{
	return io->inflight;
}

/* Move finished requests whose due time has passed into @done, in completion order. */
static unsigned io_deliver(struct halite_io *io, struct halite_io_done *done, unsigned max)
{
	struct io_req *req = io->done_head, *prev = NULL, *next;
	uint64_t now = 0;
	unsigned n = 0;

	while (req && n < max) {
		next = req->next;
		if (req->due_ns && !now)
			now = halite_now_ns();
		if (req->due_ns && req->due_ns > now) {
			prev = req;
		} else {
			if (prev)
				prev->next = next;
			else
				io->done_head = next;
			if (io->done_tail == req)
				io->done_tail = prev;
			done[n].tag = req->tag;
			done[n].res = req->res;
			n++;
			req->next = io->free;
			io->free = req;
			io->inflight--;
		}
		req = next;
	}
	return n;
}

static uint64_t io_earliest_due(const struct halite_io *io)
{
	const struct io_req *req;
	uint64_t due = UINT64_MAX;

	for (req = io->done_head; req; req = req->next)
		if (req->due_ns < due)
			due = req->due_ns;
	return due;
}

/* Errors from waiting that only mean "look again". */
static bool io_wait_transient(int r)
{
	return r >= 0 || r == -EINTR || r == -ETIME || r == -EAGAIN;
}

int halite_io_reap(struct halite_io *io, struct halite_io_done *done, unsigned max,
		   unsigned min)
{
	unsigned n = 0;
	uint64_t due, now;
	int r;

	if (min > max)
		min = max;
	if (min > io->inflight)
		return -EINVAL;
	if (max == 0)
		return 0;

	for (;;) {
		if (io->active) {
			r = io->ops->wait(io, 0, 0);
			if (!io_wait_transient(r))
				return n ? (int)n : r;
		}
		n += io_deliver(io, done + n, max - n);
		if (n >= min || n == max)
			return (int)n;

		/*
		 * Sleep until the kernel completes something or the first
		 * held-back read falls due, whichever comes first.
		 */
		due = io_earliest_due(io);
		if (io->active) {
			uint64_t timeout = UINT64_MAX;

			if (due != UINT64_MAX) {
				now = halite_now_ns();
				if (due <= now)
					continue;
				timeout = due - now;
			}
			r = io->ops->wait(io, 1, timeout);
			if (!io_wait_transient(r))
				return n ? (int)n : r;
		} else {
			/* min <= inflight: what is missing is on the done list. */
			io_sleep_until(due);
		}
	}
}

void halite_io_close(struct halite_io *io)
{
	if (!io)
		return;
	/*
	 * The kernel may still be writing into the caller's buffers; wait
	 * for it. Held-back completions are simply dropped. If waiting
	 * itself fails, the backend's exit (io_uring_queue_exit,
	 * io_destroy) still waits for or cancels what is left.
	 */
	while (io->active)
		if (!io_wait_transient(io->ops->wait(io, 1, UINT64_MAX)))
			break;
	io->ops->exit(io);
	if (io->fd >= 0)
		close(io->fd);
	free(io->reqs);
	free(io);
}

void *halite_io_alloc(size_t len)
{
	void *p;

	if (len == 0)
		len = 1;
	if (len > SIZE_MAX - (HALITE_IO_ALIGN - 1))
		return NULL;
	len = (len + HALITE_IO_ALIGN - 1) & ~(size_t)(HALITE_IO_ALIGN - 1);
	if (posix_memalign(&p, HALITE_IO_ALIGN, len))
		return NULL;
	return p;
}

void halite_io_free(void *p)
{
	free(p);
}
