/* SPDX-License-Identifier: MIT */
/* A snapshot source's reads and failure messages, shared by both engines (source.h). */
#include <stdio.h>

#include <halite/errors.h>

#include "source.h"

int src_read_lb(struct halite_reader *rd, uint64_t lb, void *buf, _Atomic uint64_t *bytes_read)
{
	int ret = halite_reader_read_lb(rd, lb, buf);

	/* A checksum mismatch read the bytes too: they count as read. */
	if (!ret || ret == -HALITE_E_LB_CHECKSUM)
		atomic_fetch_add(bytes_read, halite_reader_info(rd)->lb_size);
	return ret;
}

void src_lb_errmsg(struct halite_reader *rd, uint64_t lb, const char *why, char *buf, size_t len)
{
	struct halite_lb_info li = { 0 };

	if (halite_reader_lb_info(rd, lb, &li))
		snprintf(buf, len, "locality block %llu: %s", (unsigned long long)lb, why);
	else
		snprintf(buf, len, "locality block %llu at offset %llu: %s", (unsigned long long)lb,
			 (unsigned long long)li.offset, why);
}
