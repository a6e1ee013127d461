/* SPDX-License-Identifier: MIT */
/*
 * Locality blocks: each stream's open LB filled by the puts, sealed when
 * full or flushed, and written asynchronously in ascending file order.
 *
 * An MB's map entry can only be written once its LB has an index, and LBs are
 * numbered in the order they are written; so members of an open LB are kept
 * beside it and their entries filled in when it is sealed. Until then the
 * entry holds the invalid state 3, which marks "put, pending" and is never
 * written to the file.
 *
 * Locality-block writes are asynchronous (io_uring, libaio, or pwrite done at
 * submit; halite/src/io.h). Sealing an LB checksums it, submits the write of
 * the stream's buffer, and hands the stream a fresh buffer; the written one
 * comes back to a free list when its write completes. LBs get their index and
 * file offset when sealed, so writes are submitted in ascending file order:
 * the file still grows front to back. Sealing waits for a completion only
 * when queue_depth writes are in flight, and collects whatever else has
 * completed without waiting, so a failed write is seen early. Everything is
 * collected before the sections and the footer are written: the footer is
 * still written only once every LB it vouches for has been written.
 */
#define _GNU_SOURCE /* O_DIRECT, qsort_r, asprintf */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "endian_util.h"
#include "io_internal.h"
#include "writer_test.h"
#include "export.h"
#include "layout.h"
#include "log_internal.h"
#include "opts.h"

#include "writer_int.h"

HALITE_EXPORT uint32_t halite_writer_mb_bytes(const struct halite_writer *w, uint64_t mb)
{
	const struct wregion *r;
	uint64_t off;

	if (mb >= w->mb_count)
		return 0;
	r = region_of(w->regions, w->nregions, mb);
	off = (mb - r->first_mb) * w->mb_size;
	return (uint32_t)HALITE_MIN((uint64_t)w->mb_size, r->length - off);
}

static struct wstream *find_stream(struct halite_writer *w, uint32_t id, bool create)
{
	struct wstream *s;

	if (w->nstreams && w->streams[w->last_stream].id == id)
		return &w->streams[w->last_stream];
	for (uint32_t i = 0; i < w->nstreams; i++) {
		if (w->streams[i].id == id) {
			w->last_stream = i;
			return &w->streams[i];
		}
	}
	if (!create)
		return NULL;
	if (grow32((void **)&w->streams, sizeof(*w->streams), &w->streams_cap, w->nstreams + 1))
		return NULL;
	s = &w->streams[w->nstreams];
	*s = (struct wstream){ .id = id };
	s->buf = halite_io_alloc(w->lb_size);
	if (!s->buf)
		return NULL;
	w->last_stream = w->nstreams++;
	return s;
}

static uint64_t lb_offset(const struct halite_writer *w, uint64_t idx)
{
	return HLT_DATA_OFFSET + idx * w->lb_size;
}

/* The same failure, and words, whether the write failed at submit or at completion. */
static int lb_write_failed(struct halite_writer *w, int err, uint64_t idx)
{
	return wfail_io(w, err, "%s: writing locality block %llu at offset %llu", w->path,
			(unsigned long long)idx, (unsigned long long)lb_offset(w, idx));
}

/*
 * Collect completed LB writes, waiting until at least @min have completed
 * (min <= in flight): their buffers go back to the free list. Returns 0 or,
 * when a write failed, its error, and the writer is failed.
 *
 * Writes complete in any order: after a failure the rest are waited for, and
 * the one reported is the first failed LB in file order, the one a
 * synchronous writer would have stopped at. Only the first failure of a
 * writer is reported (logged, errmsg); later calls just return the error.
 */
static int lb_reap(struct halite_writer *w, unsigned min)
{
	struct halite_io_done done[REAP_BATCH];
	uint64_t bad_lb = UINT64_MAX;
	int bad_err = 0;

	while (halite_io_inflight(w->io)) {
		int n = halite_io_reap(w->io, done, REAP_BATCH, HALITE_MIN(min, REAP_BATCH));

		if (n < 0) {
			/* Cannot wait: the writes may still be running (close waits). */
			if (bad_err)
				break;
			if (w->state == W_FAILED)
				return n;
			return wfail_io(w, n, "%s: waiting for locality-block writes", w->path);
		}
		for (int i = 0; i < n; i++) {
			struct wflight *f = &w->flight[done[i].tag];
			int64_t res = done[i].res;

			/* The I/O layer continues short transfers: short is a failure. */
			if (res != (int64_t)w->lb_size && f->lb < bad_lb) {
				bad_lb = f->lb;
				bad_err = res < 0 ? (int)res : -EIO;
			}
			w->lb_free[w->nlb_free++] = f->buf;
			f->buf = NULL;
			w->slot_free[w->nslot_free++] = (uint32_t)done[i].tag;
		}
		min -= HALITE_MIN(min, (unsigned)n);
		if (bad_err)
			min = halite_io_inflight(w->io);
		if (!min && (unsigned)n < REAP_BATCH)
			break;
	}
	if (!bad_err)
		return 0;
	if (w->state == W_FAILED)
		return bad_err;
	return lb_write_failed(w, bad_err, bad_lb);
}

/* Wait for every LB write in flight. */
int wr_lb_drain(struct halite_writer *w)
{
	return lb_reap(w, halite_io_inflight(w->io));
}

/*
 * An idle LB buffer for a stream whose buffer is about to be submitted: from
 * the free list, else a new one. Each stream always holds one buffer (its
 * own, allocated with it), and a new one is made only when none is idle and
 * fewer than qd writes are in flight, so there are never more than qd
 * buffers in flight or idle: qd + nstreams in all, and the free list (qd
 * entries) cannot overflow.
 */
static uint8_t *lb_buf_get(struct halite_writer *w)
{
	if (w->nlb_free)
		return w->lb_free[--w->nlb_free];
	return halite_io_alloc(w->lb_size);
}

int wr_seal(struct halite_writer *w, struct wstream *s)
{
	uint64_t idx = w->lb_count;
	uint32_t slot;
	uint8_t *next;
	struct wlb *lb;
	int ret;

	if (!s->used)
		return 0;
	if (idx >= hlt_mb_max_lbs(w->lb_shift))
		return wfail_io(w, -HALITE_E_LIMIT, "more than %llu locality blocks of %u bytes",
				(unsigned long long)hlt_mb_max_lbs(w->lb_shift), w->lb_size);
	if (grow((void **)&w->lbs, sizeof(*w->lbs), &w->lbs_cap, idx + 1))
		return wfail_io(w, -ENOMEM, "LB table");
	/* Wait for a slot only when all are taken; collect what is done either way. */
	ret = lb_reap(w, halite_io_inflight(w->io) >= w->qd ? 1 : 0);
	if (ret)
		return ret;
	next = lb_buf_get(w);
	if (!next)
		return wfail_io(w, -ENOMEM, "locality block buffer");
	memset(s->buf + s->used, 0, w->lb_size - s->used);
	lb = &w->lbs[idx];
	*lb = (struct wlb){
		.stream = s->id,
		.seq = s->seq,
		.used = s->used,
		.mb_count = s->nmemb,
		.checksum = hlt_hash(s->buf, w->lb_size, w->file_seed + idx),
	};
	slot = w->slot_free[--w->nslot_free];
	ret = halite_io_submit_write(w->io, s->buf, w->lb_size, lb_offset(w, idx), slot);
	if (ret) {
		w->slot_free[w->nslot_free++] = slot;
		w->lb_free[w->nlb_free++] = next;
		return lb_write_failed(w, ret, idx);
	}
	/* The buffer is the kernel's until its completion is reaped. */
	w->flight[slot] = (struct wflight){ .lb = idx, .buf = s->buf };
	s->buf = next;
	for (uint32_t i = 0; i < s->nmemb; i++) {
		const struct wmember *m = &s->memb[i];

		w->map[m->mb] = hlt_mb_encode_stored(w->lb_shift, idx, m->offset, m->length,
						     m->compressed);
	}
	w->lb_count++;
	s->seq++;
	s->used = 0;
	s->nmemb = 0;
	return 0;
}

static int check_put(struct halite_writer *w, uint64_t mb)
{
	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is %s",
			     w->state == W_FAILED ? "failed" : "finished");
	if (mb >= w->mb_count)
		return wfail(w, -ERANGE, "memory block %llu of %llu", (unsigned long long)mb,
			     (unsigned long long)w->mb_count);
	if (w->map[mb])
		return wfail(w, -HALITE_E_STATE, "memory block %llu saved twice",
			     (unsigned long long)mb);
	return 0;
}

HALITE_EXPORT int halite_writer_put_encoded(struct halite_writer *w, uint32_t stream, uint64_t mb,
			      const void *payload, uint32_t len, bool compressed)
{
	struct wstream *s;
	uint32_t bytes;
	int ret;

	ret = check_put(w, mb);
	if (ret)
		return ret;
	bytes = halite_writer_mb_bytes(w, mb);
	if (!len || (compressed ? len >= bytes : len != bytes) ||
	    (compressed && w->codec == HALITE_CODEC_NONE))
		return wfail(w, -EINVAL, "memory block %llu: %s length %u for %u bytes",
			     (unsigned long long)mb, compressed ? "compressed" : "raw", len, bytes);
	s = find_stream(w, stream, true);
	if (!s)
		return wfail(w, -ENOMEM, "stream");
	if (s->used + len > w->lb_size) {
		ret = wr_seal(w, s);
		if (ret)
			return ret;
	}
	if (grow32((void **)&s->memb, sizeof(*s->memb), &s->memb_cap, s->nmemb + 1))
		return wfail(w, -ENOMEM, "stream members");
	memcpy(s->buf + s->used, payload, len);
	s->memb[s->nmemb++] = (struct wmember){ mb, s->used, len, compressed };
	s->used += len;
	w->map[mb] = HLT_MB_PENDING;
	return 0;
}

HALITE_EXPORT int halite_writer_put(struct halite_writer *w, uint32_t stream, uint64_t mb, const void *data)
{
	uint32_t bytes;
	int ret, clen;

	ret = check_put(w, mb);
	if (ret)
		return ret;
	bytes = halite_writer_mb_bytes(w, mb);
	if (halite_all_zero(data, bytes)) {
		w->map[mb] = HALITE_MB_ZERO;
		return 0;
	}
	clen = halite_compress(w->codec, w->level, data, bytes, w->scratch, bytes - 1);
	if (clen > 0)
		return halite_writer_put_encoded(w, stream, mb, w->scratch, (uint32_t)clen, true);
	if (clen != -HALITE_E_LIMIT)
		return wfail(w, clen, "compressing memory block %llu", (unsigned long long)mb);
	return halite_writer_put_encoded(w, stream, mb, data, bytes, false);
}

HALITE_EXPORT int halite_writer_put_zero(struct halite_writer *w, uint64_t mb)
{
	int ret = check_put(w, mb);

	if (!ret)
		w->map[mb] = HALITE_MB_ZERO;
	return ret;
}

HALITE_EXPORT int halite_writer_flush_stream(struct halite_writer *w, uint32_t stream)
{
	struct wstream *s;
	int ret;

	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	s = find_stream(w, stream, false);
	ret = s ? wr_seal(w, s) : 0;
	return ret ? ret : wr_lb_drain(w);
}
