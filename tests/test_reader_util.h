/* SPDX-License-Identifier: MIT */
/* Shared by the tests that read snapshot files back. */
#ifndef HALITE_TEST_READER_UTIL_H
#define HALITE_TEST_READER_UTIL_H

#include <halite/format.h>

/*
 * The memory blocks of @stream in file order: its locality blocks in the
 * order written, each block's members in the order of their bytes. @out holds
 * mb_count entries. Returns how many, or a negative error.
 */
static inline long t_stream_mbs(struct halite_reader *r, uint32_t stream, uint64_t *out)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	long n = 0;

	for (uint64_t lb = 0; lb < fi->lb_count; lb++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t cnt;
		int ret = halite_reader_lb_info(r, lb, &li);

		if (!ret && li.stream == stream)
			ret = halite_reader_lb_members(r, lb, &mbs, &cnt);
		else
			cnt = 0;
		if (ret)
			return ret;
		for (uint32_t j = 0; j < cnt; j++)
			out[n++] = mbs[j];
	}
	return n;
}

#endif
