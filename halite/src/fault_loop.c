// SPDX-License-Identifier: MIT
/* The fault loop's skeleton (fault_loop.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>

#include "fault_loop.h"
#include "stats.h"

void halite_fault_loop_run(const struct halite_fault_loop *l)
{
	struct uffd_msg msgs[HALITE_FAULT_BATCH];

	for (;;) {
		struct pollfd p[3] = { { l->uffd, POLLIN, 0 },
				       { halite_gmem_fault_fd(l->gm), POLLIN, 0 },
				       { l->stop_fd, POLLIN, 0 } };
		int timeout = l->timeout_ms ? l->timeout_ms(l->ctx) : -1;
		int n = 0;

		if (poll(p, l->stop_fd >= 0 ? 3 : 2, timeout) < 0 && errno != EINTR)
			return;
		if (l->stop_fd >= 0 && p[2].revents) {
			eventfd_t v = 0;

			eventfd_read(l->stop_fd, &v);
			if (!l->stop || l->stop(l->ctx, v))
				return;
		}
		if ((p[0].revents & POLLIN) || (p[1].revents & POLLIN)) {
			n = halite_gmem_take_faults(l->gm, msgs, HALITE_FAULT_BATCH);
			if (n < 0) {
				if (l->failed)
					l->failed(l->ctx, n);
				return;
			}
			if (n)
				l->serve(l->ctx, msgs, n, halite_now_ns());
		}
		if (l->next && !l->next(l->ctx, n))
			return;
	}
}
