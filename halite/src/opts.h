/* SPDX-License-Identifier: MIT */
/*
 * Private: options structs that start with their size (libbpf's OPTS_VALID).
 * A caller built against an older header passes a smaller struct: the fields
 * it does not know stay zero, i.e. default. A caller built against a newer
 * header passes a larger one: accepted only if every field this build does
 * not know is zero, so a request we cannot honour is never silently dropped.
 */
#ifndef HALITE_OPTS_H
#define HALITE_OPTS_H

#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "endian_util.h"

/* Copy *src (NULL = defaults) into *dst of dst_sz bytes. 0 or -EINVAL. */
static inline int halite_opts_copy(void *dst, size_t dst_sz, const void *src)
{
	size_t src_sz;

	memset(dst, 0, dst_sz);
	if (!src) {
		*(size_t *)dst = dst_sz;
		return 0;
	}
	src_sz = *(const size_t *)src;
	if (src_sz < sizeof(size_t))
		return -EINVAL;
	if (src_sz > dst_sz && !halite_all_zero((const char *)src + dst_sz, src_sz - dst_sz))
		return -EINVAL;
	memcpy(dst, src, HALITE_MIN(src_sz, dst_sz));
	*(size_t *)dst = dst_sz;
	return 0;
}

#endif
