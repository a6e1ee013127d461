/* SPDX-License-Identifier: MIT */
/*
 * Private: the format v1 reader's state, for its files (reader.c,
 * reader_lb.c, reader_index.c, reader_sections.c), and the calls between
 * them, each file calling only those listed after it.
 */
#ifndef HALITE_READER_INT_H
#define HALITE_READER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/format.h>

#include "layout.h"
#include "log_internal.h"
#include "zalloc.h"

struct rlb {
	uint32_t stream, seq, used, mb_count;
	uint64_t checksum;
};

struct rdir {
	uint32_t type;
	uint64_t offset, length, checksum;
};

struct rkv {
	const char *key;
	const uint8_t *value;
	uint32_t len;
};

struct rkvs {
	uint8_t *section;
	char *keys;
	struct rkv *v;
	uint32_t n;
};

/*
 * One chunked section of a 1.1 file: chunk c holds entries
 * [c << shift, (c + 1) << shift) and is in place once ok[c] is set (release,
 * after its entries are written; readers load it with acquire).
 */
#define CHUNK_LOCKS 16
struct rchunks {
	uint32_t type, esize, shift;
	uint64_t off, entries, n;
	const uint8_t *sum;	/* n checksums, little-endian, stride sum_stride */
	uint32_t sum_stride;
	atomic_uchar *ok;
	int (*parse)(struct halite_reader *r, uint64_t c, uint64_t first, uint64_t cnt,
		     const uint8_t *p);
	pthread_mutex_t lock[CHUNK_LOCKS];
};

struct rlazy {
	struct rchunks map, lbt, mem;
	uint8_t *index;		/* the index section, verified at open */
	atomic_uchar *lb_ok;	/* lb_count: member list checked against the map */
	atomic_ullong *mb_ok;	/* mb_count bits: a member of the LB its entry names */
	bool locks;		/* the chunks' locks are initialised */
};

struct halite_reader {
	char *path;
	struct halite_io *meta_io; /* buffered: header, footer, sections */
	struct halite_io *lb_io;   /* locality blocks, O_DIRECT if asked */
	struct halite_file_info info;
	unsigned lb_shift;
	uint64_t file_seed;
	uint64_t lb_end, dir_off;

	struct rdir dir[HLT_MAX_SECTIONS];
	uint32_t ndir;

	struct halite_region_info *regions;
	uint64_t *map;
	struct rlb *lbs;
	uint64_t *members;  /* stored MBs grouped by LB, each group in offset order */
	uint64_t *lb_first; /* lb_count + 1 prefix sums into members */
	struct rlazy *lz;   /* 1.1 files: what of the four arrays above is in place */

	uint8_t *device_state;
	uint64_t device_state_len;
	bool has_device_state;
	bool has_vcpus;
	uint32_t vcpu_count;
	struct halite_root *roots;
	uint32_t nroots;
	struct rkvs meta, stats;

	struct halite_logger log;
	pthread_mutex_t err_lock;
	char errmsg[512];
};

#define ULL(x) ((unsigned long long)(x))


/*
 * The arrays sized by memory (map, LB table, member lists) come from
 * zalloc.h: a 1.1 open that touches none of them takes the same time at
 * 1 GiB and 1 TiB.
 */
#define zalloc halite_zalloc
#define zfree halite_zfree


/*
 * The lookups take a const reader but may bring in a 1.1 file's chunks: the
 * arrays they fill are the reader's cache, not its state as the caller sees it.
 */
static inline struct halite_reader *cache_of(const struct halite_reader *r)
{
	return (struct halite_reader *)r;
}

static inline const struct rdir *find_dir(const struct halite_reader *r, uint32_t type)
{
	for (uint32_t i = 0; i < r->ndir; i++)
		if (r->dir[i].type == type)
			return &r->dir[i];
	return NULL;
}

/* reader_index.c: format 1.1's chunked index, read on first use. */
int rd_parse_index(struct halite_reader *r, uint8_t *p, uint64_t len);
void rd_lazy_free(struct halite_reader *r);
int rd_lazy_lookup(struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc);
int rd_need_chunk(struct halite_reader *r, struct rchunks *ch, uint64_t c);
int rd_need_members(struct halite_reader *r, uint64_t lb);

/* reader_sections.c: errors; header, footer, directory; the required sections. */
__attribute__((format(printf, 3, 4)))
int rfail(struct halite_reader *r, int err, const char *fmt, ...);
__attribute__((format(printf, 3, 4)))
int rfail_said(struct halite_reader *r, int err, const char *fmt, ...);
const char *rd_file_kind(mode_t mode);
int rd_read_at(struct halite_reader *r, void *buf, uint64_t len, uint64_t off, const char *what);
int rd_parse_header(struct halite_reader *r, const uint8_t *h);
int rd_check_padding(struct halite_reader *r);
int rd_parse_footer(struct halite_reader *r, const uint8_t *f);
int rd_parse_directory(struct halite_reader *r, const uint8_t *d, uint64_t want_sum);
int rd_load_section(struct halite_reader *r, const struct rdir *s, uint8_t **out);
const char *rd_kv_key(const void *base, uint32_t i);
int rd_first_duplicate(uint32_t n, const char *(*name)(const void *base, uint32_t i),
		       const void *base);
int rd_parse_regions(struct halite_reader *r, const uint8_t *p, uint64_t len);
int rd_lbt_entry(struct halite_reader *r, uint64_t i, const uint8_t *e);
int rd_map_entry(struct halite_reader *r, uint64_t m, uint64_t e, bool lbs_in,
		 struct halite_mb_loc *loc);
int rd_parse_lb_table(struct halite_reader *r, const uint8_t *p, uint64_t len);
int rd_check_stream_seqs(struct halite_reader *r);
int rd_parse_map(struct halite_reader *r, const uint8_t *p, uint64_t len);

#endif
