// SPDX-License-Identifier: MIT
/*
 * io_uring backend: one SQE per request chunk, submitted at once so the
 * transfer overlaps with whatever the caller does before reaping.
 *
 * Uses only what liburing 2.3 (Debian 12) provides and IORING_OP_READ/WRITE
 * (Linux 5.6), which are probed: a kernel that sets up a ring but lacks them
 * counts as refusing io_uring.
 */
#include <errno.h>

#include <halite/errors.h>

#include "io_internal.h"

/* CQEs taken per peek; copied out before completing, see uring_wait(). */
#define URING_BATCH 64

static int uring_init(struct halite_io *io)
{
	struct io_uring_probe *probe;
	bool ok;
	int ret;

	/* CQ is twice the SQ by default, so qd requests can never overflow it. */
	ret = io_uring_queue_init(io->qd, &io->ring, 0);
	if (ret < 0) {
		/*
		 * EPERM: io_uring_disabled sysctl or seccomp; ENOSYS: not
		 * built or filtered; EACCES/EOPNOTSUPP from LSMs and odd
		 * kernels. Anything else (ENOMEM, EMFILE) is a real error.
		 */
		if (ret == -EPERM || ret == -ENOSYS || ret == -EACCES || ret == -EOPNOTSUPP)
			return -HALITE_E_UNSUPPORTED;
		return ret;
	}
	probe = io_uring_get_probe_ring(&io->ring);
	ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
	     io_uring_opcode_supported(probe, IORING_OP_WRITE);
	io_uring_free_probe(probe);
	if (!ok) {
		io_uring_queue_exit(&io->ring);
		return -HALITE_E_UNSUPPORTED;
	}
	return 0;
}

static int uring_submit(struct halite_io *io, struct io_req *req)
{
	struct io_uring_sqe *sqe;
	size_t n = io_req_chunk(io, req);

	/* Each request has at most one SQE out and there are qd of them. */
	sqe = io_uring_get_sqe(&io->ring);
	if (!sqe)
		return -EBUSY;
	if (req->write)
		io_uring_prep_write(sqe, io->fd, req->buf + req->done, (unsigned)n,
				    req->off + req->done);
	else
		io_uring_prep_read(sqe, io->fd, req->buf + req->done, (unsigned)n,
				   req->off + req->done);
	io_uring_sqe_set_data(sqe, req);
	io->active++;
	/*
	 * A failed io_uring_enter (EAGAIN, EBUSY, EINTR) leaves the SQE in the
	 * ring, so the request is queued either way; uring_wait() submits
	 * leftovers before it waits.
	 */
	io_uring_submit(&io->ring);
	return 0;
}

static int uring_wait(struct halite_io *io, unsigned min, uint64_t timeout_ns)
{
	struct io_uring_cqe *cqes[URING_BATCH];
	struct io_req *reqs[URING_BATCH];
	int64_t res[URING_BATCH];
	struct io_uring_cqe *cqe;
	unsigned i, n;
	int ret, handled = 0;

	/* Waiting also submits SQEs an earlier failed enter left behind. */
	if (min && timeout_ns == UINT64_MAX) {
		ret = io_uring_submit_and_wait(&io->ring, 1);
	} else if (min) {
		struct __kernel_timespec ts = {
			.tv_sec = (long long)(timeout_ns / 1000000000u),
			.tv_nsec = (long long)(timeout_ns % 1000000000u),
		};

		ret = io_uring_submit_and_wait_timeout(&io->ring, &cqe, 1, &ts, NULL);
	} else if (io_uring_sq_ready(&io->ring)) {
		ret = io_uring_submit(&io->ring);
	} else {
		ret = 0;
	}
	/* ETIME, EINTR, EAGAIN, EBUSY: the caller looks again. */
	if (ret < 0 && ret != -ETIME && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
		return ret;

	/*
	 * Completing a request may queue its continuation; copy the CQEs out
	 * and release them first so that completion never runs with ring
	 * entries held.
	 */
	for (;;) {
		n = io_uring_peek_batch_cqe(&io->ring, cqes, URING_BATCH);
		if (!n)
			break;
		for (i = 0; i < n; i++) {
			reqs[i] = io_uring_cqe_get_data(cqes[i]);
			res[i] = cqes[i]->res;
		}
		io_uring_cq_advance(&io->ring, n);
		io->active -= n;
		for (i = 0; i < n; i++)
			halite_io_req_complete(io, reqs[i], res[i]);
		handled += (int)n;
	}
	return handled;
}

static void uring_exit(struct halite_io *io)
{
	io_uring_queue_exit(&io->ring);
}

const struct io_backend_ops halite_io_uring_ops = {
	.id = HALITE_IO_URING,
	.init = uring_init,
	.submit = uring_submit,
	.wait = uring_wait,
	.exit = uring_exit,
};
