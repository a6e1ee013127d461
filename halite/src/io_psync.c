// SPDX-License-Identifier: MIT
/*
 * pread/pwrite backend: an "asynchronous" request is carried out in full at
 * submit and parked on the done list, where reap finds it (after its read
 * latency, if any). Always available.
 */
#include "io_internal.h"

static int psync_init(struct halite_io *io)
{
	return 0;
}

static int psync_submit(struct halite_io *io, struct io_req *req)
{
	int64_t r = halite_io_pio(io, req->write, req->buf + req->done, req->len - req->done,
			   req->off + req->done);

	halite_io_req_finish(io, req, r < 0 ? r : (int64_t)req->len);
	return 0;
}

static int psync_wait(struct halite_io *io, unsigned min, uint64_t timeout_ns)
{
	return 0;
}

static void psync_exit(struct halite_io *io)
{
}

const struct io_backend_ops halite_io_psync_ops = {
	.id = HALITE_IO_PSYNC,
	.init = psync_init,
	.submit = psync_submit,
	.wait = psync_wait,
	.exit = psync_exit,
};
