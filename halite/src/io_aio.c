// SPDX-License-Identifier: MIT
/*
 * Linux native AIO backend (libaio). Only truly asynchronous with O_DIRECT:
 * on buffered files io_submit(2) performs the transfer before it returns,
 * which is still correct, just not overlapped.
 */
#include <errno.h>
#include <stdlib.h>

#include <halite/errors.h>

#include "io_internal.h"

static int aio_init(struct halite_io *io)
{
	int ret;

	io->aio.ctx = 0;
	io->aio.events = calloc(io->qd, sizeof(*io->aio.events));
	if (!io->aio.events)
		return -ENOMEM;
	/* libaio returns -errno rather than setting errno. */
	ret = io_setup((int)io->qd, &io->aio.ctx);
	if (ret < 0) {
		free(io->aio.events);
		io->aio.events = NULL;
		/*
		 * EAGAIN: the system-wide fs.aio-max-nr is used up, which is
		 * a refusal as final as ENOSYS/EPERM for this handle.
		 */
		if (ret == -ENOSYS || ret == -EPERM || ret == -EACCES || ret == -EAGAIN)
			return -HALITE_E_UNSUPPORTED;
		return ret;
	}
	return 0;
}

static int aio_submit(struct halite_io *io, struct io_req *req)
{
	struct iocb *cb = &req->iocb;
	size_t n = io_req_chunk(io, req);
	int ret;

	if (req->write)
		io_prep_pwrite(cb, io->fd, req->buf + req->done, n,
			       (long long)(req->off + req->done));
	else
		io_prep_pread(cb, io->fd, req->buf + req->done, n,
			      (long long)(req->off + req->done));
	cb->data = req;
	do
		ret = io_submit(io->aio.ctx, 1, &cb);
	while (ret == -EINTR);
	if (ret == 1) {
		io->active++;
		return 0;
	}
	return ret < 0 ? ret : -EIO;
}

static int aio_wait(struct halite_io *io, unsigned min, uint64_t timeout_ns)
{
	struct timespec ts = { 0, 0 }, *tsp = &ts;
	int ret, i;

	if (min && timeout_ns == UINT64_MAX) {
		tsp = NULL;
	} else if (min) {
		ts.tv_sec = (time_t)(timeout_ns / 1000000000u);
		ts.tv_nsec = (long)(timeout_ns % 1000000000u);
	}
	ret = io_getevents(io->aio.ctx, min, io->qd, io->aio.events, tsp);
	if (ret == -EINTR)
		return 0;
	if (ret < 0)
		return ret;
	io->active -= (unsigned)ret;
	for (i = 0; i < ret; i++) {
		struct io_event *ev = &io->aio.events[i];

		/* res is unsigned long in the ABI; errors are negative longs. */
		halite_io_req_complete(io, ev->data, (int64_t)(long)ev->res);
	}
	return ret;
}

static void aio_exit(struct halite_io *io)
{
	io_destroy(io->aio.ctx);
	free(io->aio.events);
}

const struct io_backend_ops halite_io_aio_ops = {
	.id = HALITE_IO_AIO,
	.init = aio_init,
	.submit = aio_submit,
	.wait = aio_wait,
	.exit = aio_exit,
};
