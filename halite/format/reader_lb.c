/* SPDX-License-Identifier: MIT */
/*
 * The reader's lookups and data: where an MB is, an LB's entry and members,
 * and an LB's bytes read and verified before anything is decoded from them,
 * then its MBs decoded.
 */
#define _GNU_SOURCE /* O_DIRECT, qsort_r */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include "endian_util.h"
#include "io.h"
#include "export.h"
#include "layout.h"
#include "log_internal.h"
#include "opts.h"
#include "reader_test.h"
#include "zalloc.h"

#include "reader_int.h"
#include "reader_io.h"

HALITE_EXPORT int halite_reader_mb_lookup(const struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc)
{
	if (mb >= r->info.mb_count)
		return -ERANGE;
	if (r->lz)
		return rd_lazy_lookup(cache_of(r), mb, loc);
	/* Validated at open. */
	return hlt_mb_decode(r->map[mb], r->lb_shift, loc);
}

/* LB @lb's table entry in place (a 1.1 file's chunk of it). */
static int need_lbt(const struct halite_reader *r, uint64_t lb)
{
	return r->lz ? rd_need_chunk(cache_of(r), &r->lz->lbt, lb >> r->lz->lbt.shift) : 0;
}

HALITE_EXPORT int halite_reader_lb_info(const struct halite_reader *r, uint64_t lb, struct halite_lb_info *info)
{
	const struct rlb *e;

	int ret;

	if (lb >= r->info.lb_count)
		return -ERANGE;
	ret = need_lbt(r, lb);
	if (ret) {
		memset(info, 0, sizeof(*info));
		return ret;
	}
	e = &r->lbs[lb];
	*info = (struct halite_lb_info){
		.stream = e->stream,
		.seq = e->seq,
		.used = e->used,
		.mb_count = e->mb_count,
		.checksum = e->checksum,
		.offset = r->info.data_offset + (lb << r->lb_shift),
	};
	return 0;
}

HALITE_EXPORT int halite_reader_lb_members(const struct halite_reader *r, uint64_t lb, const uint64_t **mbs,
			     uint32_t *count)
{
	int ret;

	if (lb >= r->info.lb_count)
		return -ERANGE;
	ret = rd_need_members(cache_of(r), lb);
	if (ret) {
		*count = 0;
		return ret;
	}
	*mbs = r->members + r->lb_first[lb];
	*count = r->lbs[lb].mb_count; /* lb_first[lb + 1] - lb_first[lb] */
	return 0;
}

HALITE_EXPORT int halite_reader_verify_lb(struct halite_reader *r, uint64_t lb, const void *buf)
{
	uint64_t got;
	char sn[32];
	int ret;

	if (lb >= r->info.lb_count)
		return -ERANGE;
	ret = need_lbt(r, lb);
	if (ret)
		return ret;
	got = hlt_hash(buf, r->info.lb_size, r->file_seed + lb);
	if (got != r->lbs[lb].checksum)
		return rfail(r, HALITE_E_LB_CHECKSUM,
			     "%s: locality block %llu (offset %llu, stream %s, seq %u): checksum "
			     "%016llx, expected %016llx",
			     r->path, ULL(lb), ULL(r->info.data_offset + (lb << r->lb_shift)),
			     halite_stream_name(r->lbs[lb].stream, sn, sizeof(sn)), r->lbs[lb].seq,
			     ULL(got), ULL(r->lbs[lb].checksum));
	return 0;
}

int halite_reader_read_lb_run(struct halite_reader *r, uint64_t lb, unsigned n,
			      uint8_t *const *bufs, uint64_t *bad)
{
	uint64_t off;
	int ret;

	if (!n || n > 64 || lb >= r->info.lb_count || n > r->info.lb_count - lb)
		return -ERANGE;
	*bad = n == 64 ? UINT64_MAX : (1ull << n) - 1;
	off = r->info.data_offset + (lb << r->lb_shift);
	ret = halite_io_read_run(r->lb_io, bufs, n, r->info.lb_size, off);
	if (ret)
		return rfail(r, ret, "%s: reading locality blocks %llu to %llu at offset %llu",
			     r->path, ULL(lb), ULL(lb + n - 1), ULL(off));
	*bad = 0;
	for (unsigned i = 0; i < n; i++)
		if (halite_reader_verify_lb(r, lb + i, bufs[i]))
			*bad |= 1ull << i;
	return 0;
}

HALITE_EXPORT int halite_reader_read_lb(struct halite_reader *r, uint64_t lb, void *buf)
{
	uint64_t off;
	int ret;

	if (lb >= r->info.lb_count)
		return -ERANGE;
	off = r->info.data_offset + (lb << r->lb_shift);
	ret = halite_io_read(r->lb_io, buf, r->info.lb_size, off);
	if (ret)
		return rfail(r, ret, "%s: reading locality block %llu at offset %llu", r->path,
			     ULL(lb), ULL(off));
	return halite_reader_verify_lb(r, lb, buf);
}

HALITE_EXPORT void *halite_reader_alloc_lb(const struct halite_reader *r)
{
	return halite_io_alloc(r->info.lb_size);
}

HALITE_EXPORT void halite_reader_free_lb(void *buf)
{
	halite_io_free(buf);
}

HALITE_EXPORT int halite_reader_decode_mb(struct halite_reader *r, uint64_t mb, const void *lb_buf, void *out)
{
	struct halite_mb_loc loc;
	uint32_t bytes;
	int ret;

	ret = halite_reader_mb_lookup(r, mb, &loc);
	if (ret)
		return ret;
	bytes = halite_reader_mb_bytes(r, mb);
	if (loc.state != HALITE_MB_STORED) {
		memset(out, 0, bytes);
		return 0;
	}
	if (!loc.compressed) {
		memcpy(out, (const uint8_t *)lb_buf + loc.offset, bytes);
		return 0;
	}
	ret = halite_decompress(r->info.codec, (const uint8_t *)lb_buf + loc.offset, loc.length,
				out, bytes);
	if (ret)
		return rfail(r, ret, "%s: memory block %llu in locality block %llu does not decode",
			     r->path, ULL(mb), ULL(loc.lb));
	return 0;
}

HALITE_EXPORT int halite_reader_read_mb(struct halite_reader *r, uint64_t mb, void *out)
{
	struct halite_mb_loc loc;
	void *buf;
	int ret;

	ret = halite_reader_mb_lookup(r, mb, &loc);
	if (ret || loc.state != HALITE_MB_STORED)
		return ret ? ret : halite_reader_decode_mb(r, mb, NULL, out);
	buf = halite_reader_alloc_lb(r);
	if (!buf)
		return -ENOMEM;
	ret = halite_reader_read_lb(r, loc.lb, buf);
	if (!ret)
		ret = halite_reader_decode_mb(r, mb, buf, out);
	halite_reader_free_lb(buf);
	return ret;
}
