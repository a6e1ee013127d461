/* SPDX-License-Identifier: MIT */
/*
 * Private: the format v1 writer's state, for its files (writer.c,
 * writer_tail.c, writer_lb.c), its small helpers, and the calls between
 * them, each file calling only those listed after it.
 */
#ifndef HALITE_WRITER_INT_H
#define HALITE_WRITER_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "endian_util.h"
#include "io_internal.h"
#include "layout.h"
#include "log_internal.h"

#define HLT_MB_PENDING HLT_MB_STATE_INVALID
#define TAIL_BUF_SIZE (1u << 20)
/*
 * LB writes in flight by default: 8 x 64 KiB keeps a disk busy while the
 * caller fills the next blocks, for 8 extra buffers.
 */
#define WRITER_QD_DEFAULT 8u
/* Completions collected per halite_io_reap() call. */
#define REAP_BATCH 16u

_Static_assert(HALITE_WRITER_MAX_QUEUE_DEPTH == HALITE_IO_QD_MAX,
	       "the writer's queue depth goes straight to halite_io_open()");

struct wmember {
	uint64_t mb;
	uint32_t offset;
	uint32_t length;
	bool compressed;
};

struct wstream {
	uint32_t id;
	uint32_t seq;	   /* seq of the open LB */
	uint8_t *buf;	   /* lb_size bytes, I/O aligned; owned by the stream */
	uint32_t used;
	struct wmember *memb;
	uint32_t nmemb, memb_cap;
};

struct wregion {
	char *name;
	uint64_t gpa, length, first_mb, mb_count;
};

struct wlb {
	uint32_t stream, seq, used, mb_count;
	uint64_t checksum;
};

/* An LB write in flight; its slot index is the request's tag. */
struct wflight {
	uint64_t lb;	   /* LB index: names it and its offset if the write fails */
	uint8_t *buf;	   /* owned by the kernel until the completion is reaped */
};

struct wkv {
	char *key;
	uint8_t *value;
	uint32_t len;
};

struct wkvs {
	struct wkv *v;
	uint32_t n, cap;
};

struct wdirent {
	uint32_t type;
	uint64_t offset, length, checksum;
};

enum { W_OPEN, W_FAILED, W_FINISHED };

struct halite_writer {
	char *path;		/* the target */
	char *tmp_path;		/* the file until finish renames it; NULL once it has */
	char *incomplete_path;	/* where an unfinished file is kept: TARGET.incomplete */
	struct halite_io *io;
	int state;
	unsigned flags;

	uint32_t page_size, mb_pages, mb_size, lb_size, lb_shift;
	int codec, level;
	uint8_t uuid[16];
	uint64_t file_seed;

	struct wregion *regions;
	uint32_t nregions;
	uint64_t mb_count;
	uint64_t *map;

	struct wstream *streams;
	uint32_t nstreams, streams_cap, last_stream;

	struct wlb *lbs;
	uint64_t lb_count, lbs_cap;

	/* Asynchronous LB writes: qd slots, and the LB buffers no one holds. */
	unsigned qd;
	struct wflight *flight;	/* qd; .buf == NULL when the slot is free */
	uint32_t *slot_free;	/* qd; a stack of free slot indices */
	uint32_t nslot_free;
	uint8_t **lb_free;	/* qd; a stack of idle lb_size buffers (lb_buf_get) */
	uint32_t nlb_free;

	uint8_t *scratch; /* compression output, mb_size */

	uint8_t *device_state;
	uint64_t device_state_len;
	bool has_device_state;
	uint32_t vcpu_count;
	struct halite_root *roots;
	uint32_t nroots, roots_cap;
	struct wkvs meta, stats;

	struct halite_logger log;
	char errmsg[256];
};


__attribute__((format(printf, 3, 4)))
static inline int wfail(struct halite_writer *w, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(w->errmsg, sizeof(w->errmsg), err, fmt, ap);
	va_end(ap);
	halite_logf(&w->log, HALITE_LOG_ERROR, "%s", w->errmsg);
	return err < 0 ? err : -err;
}

/* An I/O failure leaves the file inconsistent: no further writes. */
#define wfail_io(w, err, ...) ((w)->state = W_FAILED, wfail((w), (err), __VA_ARGS__))

static inline int grow(void **p, size_t elem, uint64_t *cap, uint64_t need)
{
	uint64_t ncap = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return 0;
	while (ncap < need)
		ncap *= 2;
	np = realloc(*p, ncap * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = ncap;
	return 0;
}

static inline int grow32(void **p, size_t elem, uint32_t *cap, uint32_t need)
{
	uint64_t c = *cap;
	int ret = grow(p, elem, &c, need);

	if (!ret)
		*cap = (uint32_t)c;
	return ret;
}


/* Format 1.0 asked for: no chunked index, minor 0, no incompat flag. */
static inline bool v1_0(const struct halite_writer *w)
{
	return w->flags & HALITE_WRITER_V1_0;
}


static inline const struct wregion *region_of(const struct wregion *r, uint32_t n, uint64_t mb)
{
	return &r[halite_find_first_mb(r, n, sizeof(*r), offsetof(struct wregion, first_mb), mb)];
}

/* writer_lb.c: locality blocks. */
int wr_seal(struct halite_writer *w, struct wstream *st);
int wr_lb_drain(struct halite_writer *w);

#endif
