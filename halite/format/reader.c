/* SPDX-License-Identifier: MIT */
/*
 * Format v1 reader (docs/format.md, section 6).
 *
 * The file may come from anywhere, so nothing in it is trusted until checked:
 * every length and offset is range-checked (without overflow) before it is
 * used or allocated from, every allocation is bounded by the file's size, and
 * every checksum is verified before the bytes it covers are parsed. Open
 * validates all metadata; a locality block's bytes are verified when it is
 * read, before anything is decoded from it.
 *
 * Format 1.1 files (chunked index) open in time independent of memory size:
 * open verifies the index section (a checksum per chunk of the mb-map,
 * lb-table and lb-members sections), and each chunk is read, verified and
 * parsed into its place in the same arrays a 1.0 open fills when a lookup
 * first needs it. An LB's member list is checked against the map (the tiling
 * rule, docs/format.md 5.2) the first time it or one of its MBs is looked up.
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

/* @msg as the reader's error (errmsg) and to its log; returns -|err|. */
static int rfail_store(struct halite_reader *r, int err, const char *msg)
{
	pthread_mutex_lock(&r->err_lock);
	snprintf(r->errmsg, sizeof(r->errmsg), "%s", msg);
	pthread_mutex_unlock(&r->err_lock);
	halite_logf(&r->log, HALITE_LOG_ERROR, "%s", msg);
	return err < 0 ? err : -err;
}

__attribute__((format(printf, 3, 4)))
static int rfail(struct halite_reader *r, int err, const char *fmt, ...)
{
	char msg[sizeof(r->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	return rfail_store(r, err, msg);
}

/*
 * rfail() for a sentence that says everything already: the open failures a
 * user meets first, worded the same for every tool, without the code's
 * generic text after them.
 */
static int rfail_said(struct halite_reader *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int rfail_said(struct halite_reader *r, int err, const char *fmt, ...)
{
	char msg[sizeof(r->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return rfail_store(r, err, msg);
}

/* What a file that is not a regular one is: "a directory", ... */
static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFDIR:
		return "a directory";
	case S_IFCHR:
		return "a character device";
	case S_IFIFO:
		return "a FIFO";
	case S_IFSOCK:
		return "a socket";
	}
	return "not a file";
}

#define ULL(x) ((unsigned long long)(x))

/* Incompatible features this build reads (tests narrow it: reader_test.h). */
static uint64_t known_incompat = HLT_INCOMPAT_KNOWN;

void halite_reader_test_known_incompat(uint64_t mask)
{
	known_incompat = mask;
}

/*
 * The arrays sized by memory (map, LB table, member lists) come from
 * zalloc.h: a 1.1 open that touches none of them takes the same time at
 * 1 GiB and 1 TiB.
 */
#define zalloc halite_zalloc
#define zfree halite_zfree

/* ---- header, footer, directory ---- */

static int parse_header(struct halite_reader *r, const uint8_t *h)
{
	struct halite_file_info *fi = &r->info;
	uint64_t mb_size;

	if (memcmp(h, HLT_HDR_MAGIC, 8))
		return rfail_said(r, HALITE_E_BAD_MAGIC, "%s: not a Halite snapshot (it does not "
				  "start with a Halite header)", r->path);
	fi->version_major = halite_get_le16(h + HLT_HDR_VERSION_MAJOR);
	fi->version_minor = halite_get_le16(h + HLT_HDR_VERSION_MINOR);
	/* Before the checksum: another major version may place it elsewhere. */
	if (fi->version_major != HALITE_FORMAT_MAJOR)
		return rfail(r, HALITE_E_VERSION, "%s: format version %u.%u (this build reads %u.x)",
			     r->path, fi->version_major, fi->version_minor, HALITE_FORMAT_MAJOR);
	if (halite_get_le64(h + HLT_HDR_CHECKSUM) != hlt_hash(h, HLT_HDR_CHECKSUM, 0))
		return rfail(r, HALITE_E_CHECKSUM, "%s: header checksum mismatch", r->path);
	if (halite_get_le32(h + HLT_HDR_HEADER_SIZE) != HLT_HDR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: header size %u, expected %u", r->path,
			     halite_get_le32(h + HLT_HDR_HEADER_SIZE), HLT_HDR_SIZE);
	fi->incompat_flags = halite_get_le64(h + HLT_HDR_INCOMPAT);
	fi->compat_flags = halite_get_le64(h + HLT_HDR_COMPAT);
	if (fi->incompat_flags & ~known_incompat)
		return rfail(r, HALITE_E_INCOMPAT, "%s: unknown incompatible features 0x%llx "
			     "(format %u.%u; this build reads up to %u.%u)", r->path,
			     ULL(fi->incompat_flags & ~known_incompat), fi->version_major,
			     fi->version_minor, HALITE_FORMAT_MAJOR, HALITE_FORMAT_MINOR);
	if (halite_get_le16(h + HLT_HDR_RESERVED0) ||
	    !halite_all_zero(h + HLT_HDR_RESERVED1, HLT_HDR_RESERVED1_LEN))
		return rfail(r, HALITE_E_RESERVED, "%s: reserved header bytes are not zero", r->path);
	fi->page_size = halite_get_le32(h + HLT_HDR_PAGE_SIZE);
	fi->mb_pages = halite_get_le32(h + HLT_HDR_MB_PAGES);
	fi->lb_size = halite_get_le32(h + HLT_HDR_LB_SIZE);
	fi->codec = h[HLT_HDR_CODEC];
	fi->codec_level = (int8_t)h[HLT_HDR_CODEC_LEVEL];
	fi->data_offset = halite_get_le64(h + HLT_HDR_DATA_OFFSET);
	memcpy(fi->uuid, h + HLT_HDR_UUID, 16);
	fi->created_ns = halite_get_le64(h + HLT_HDR_CREATED);
	mb_size = (uint64_t)fi->page_size * fi->mb_pages;
	if (!halite_is_pow2(fi->page_size) || fi->page_size < 4096 ||
	    fi->page_size > HLT_MAX_PAGE_SIZE || !fi->mb_pages || fi->mb_pages > HLT_MAX_MB_PAGES ||
	    !halite_is_pow2(fi->lb_size) || fi->lb_size < HALITE_MIN_LB_SIZE ||
	    fi->lb_size > HALITE_MAX_LB_SIZE || mb_size > fi->lb_size)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: invalid geometry: page %u, %u pages per MB, LB %u", r->path,
			     fi->page_size, fi->mb_pages, fi->lb_size);
	if (fi->codec == HALITE_CODEC_DEFAULT || !halite_codec_name(fi->codec))
		return rfail(r, HALITE_E_NO_CODEC, "%s: codec id %d", r->path, fi->codec);
	/* Offsets must fit off_t; this also keeps data_offset + footer from wrapping. */
	if (fi->data_offset < HLT_DATA_ALIGN || fi->data_offset % HLT_DATA_ALIGN ||
	    fi->data_offset > (uint64_t)INT64_MAX - HLT_FTR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: data offset %llu", r->path,
			     ULL(fi->data_offset));
	fi->mb_size = (uint32_t)mb_size;
	r->lb_shift = (unsigned)__builtin_ctz(fi->lb_size);
	r->file_seed = hlt_file_seed(fi->uuid);
	return 0;
}

static int read_at(struct halite_reader *r, void *buf, uint64_t len, uint64_t off,
		   const char *what)
{
	int ret = halite_io_read(r->meta_io, buf, len, off);

	if (ret)
		return rfail(r, ret, "%s: reading %s (%llu bytes at offset %llu)", r->path, what,
			     ULL(len), ULL(off));
	return 0;
}

static int check_padding(struct halite_reader *r)
{
	uint8_t buf[4096];

	for (uint64_t off = HLT_HDR_SIZE; off < r->info.data_offset;) {
		uint64_t n = HALITE_MIN((uint64_t)sizeof(buf), r->info.data_offset - off);
		int ret = read_at(r, buf, n, off, "header padding");

		if (ret)
			return ret;
		if (!halite_all_zero(buf, n))
			return rfail(r, HALITE_E_RESERVED, "%s: header padding is not zero", r->path);
		off += n;
	}
	return 0;
}

static int parse_footer(struct halite_reader *r, const uint8_t *f)
{
	struct halite_file_info *fi = &r->info;
	uint64_t lb_count, dir_off, nsec, lb_bytes;

	if (memcmp(f, HLT_FTR_MAGIC, 8) ||
	    halite_get_le64(f + HLT_FTR_CHECKSUM) != hlt_hash(f, HLT_FTR_CHECKSUM, 0) ||
	    memcmp(f + HLT_FTR_UUID, fi->uuid, 16))
		return rfail_said(r, HALITE_E_INCOMPLETE,
				  "%s: incomplete: the save that wrote it did not finish, or the file "
				  "was cut short (no valid footer); it cannot be restored", r->path);
	if (halite_get_le32(f + HLT_FTR_RESERVED))
		return rfail(r, HALITE_E_RESERVED, "%s: reserved footer bytes are not zero", r->path);
	lb_count = halite_get_le64(f + HLT_FTR_LB_COUNT);
	dir_off = halite_get_le64(f + HLT_FTR_DIR_OFFSET);
	nsec = halite_get_le32(f + HLT_FTR_SECTION_COUNT);
	if (nsec < HLT_MIN_SECTIONS || nsec > HLT_MAX_SECTIONS)
		return rfail(r, HALITE_E_CORRUPT, "%s: %llu sections (%u to %u allowed)", r->path,
			     ULL(nsec), HLT_MIN_SECTIONS, HLT_MAX_SECTIONS);
	if (dir_off > fi->file_size ||
	    fi->file_size - dir_off != nsec * HLT_DIR_ENTRY_SIZE + HLT_FTR_SIZE)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: directory at %llu with %llu entries does not end at the footer",
			     r->path, ULL(dir_off), ULL(nsec));
	/* lb_end = data_offset + lb_count * lb_size <= dir_off, without overflow */
	if (dir_off < fi->data_offset || lb_count > (dir_off - fi->data_offset) >> r->lb_shift)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: %llu locality blocks of %u bytes do not fit before offset %llu",
			     r->path, ULL(lb_count), fi->lb_size, ULL(dir_off));
	lb_bytes = lb_count << r->lb_shift;
	fi->lb_count = lb_count;
	r->lb_end = fi->data_offset + lb_bytes;
	r->dir_off = dir_off;
	r->ndir = (uint32_t)nsec;
	return 0;
}

static int cmp_dir_offset(const void *a, const void *b)
{
	const struct rdir *x = *(struct rdir *const *)a, *y = *(struct rdir *const *)b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_directory(struct halite_reader *r, const uint8_t *d, uint64_t want_sum)
{
	struct rdir *sorted[HLT_MAX_SECTIONS];
	bool have[HALITE_SECTION_LB_MEMBERS + 1] = { false };
	bool chunked = r->info.incompat_flags & HLT_INCOMPAT_CHUNKED_INDEX;

	if (hlt_hash(d, (size_t)r->ndir * HLT_DIR_ENTRY_SIZE, r->file_seed) != want_sum)
		return rfail(r, HALITE_E_CHECKSUM, "%s: section directory checksum mismatch",
			     r->path);
	for (uint32_t i = 0; i < r->ndir; i++) {
		const uint8_t *e = d + (size_t)i * HLT_DIR_ENTRY_SIZE;
		struct rdir *s = &r->dir[i];

		s->type = halite_get_le32(e + HLT_DIR_TYPE);
		s->offset = halite_get_le64(e + HLT_DIR_OFFSET);
		s->length = halite_get_le64(e + HLT_DIR_LENGTH);
		s->checksum = halite_get_le64(e + HLT_DIR_CHECKSUM);
		if (halite_get_le32(e + HLT_DIR_RESERVED))
			return rfail(r, HALITE_E_RESERVED, "%s: section %u: reserved field not zero",
				     r->path, i);
		if (s->offset < r->lb_end || s->offset > r->dir_off ||
		    s->length > r->dir_off - s->offset)
			return rfail(r, HALITE_E_CORRUPT,
				     "%s: section %u (type 0x%x) at %llu+%llu lies outside %llu..%llu",
				     r->path, i, s->type, ULL(s->offset), ULL(s->length),
				     ULL(r->lb_end), ULL(r->dir_off));
		for (uint32_t j = 0; j < i; j++)
			if (r->dir[j].type == s->type)
				return rfail(r, HALITE_E_CORRUPT, "%s: section type 0x%x appears twice",
					     r->path, s->type);
		if (!(s->type & HALITE_SECTION_OPTIONAL)) {
			if (!halite_section_name(s->type))
				return rfail(r, HALITE_E_UNKNOWN_SECTION,
					     "%s: required section type 0x%x is unknown to this build",
					     r->path, s->type);
			if (!chunked && (s->type == HALITE_SECTION_INDEX ||
					 s->type == HALITE_SECTION_LB_MEMBERS))
				return rfail(r, HALITE_E_CORRUPT, "%s: section %s in a file without "
					     "the chunked-index flag", r->path,
					     halite_section_name(s->type));
			have[s->type] = true;
		}
		sorted[i] = s;
	}
	for (uint32_t t = HALITE_SECTION_REGIONS;
	     t <= (chunked ? HALITE_SECTION_LB_MEMBERS : HALITE_SECTION_LB_TABLE); t++)
		if (!have[t])
			return rfail(r, HALITE_E_CORRUPT, "%s: required section %s is missing",
				     r->path, halite_section_name(t));
	qsort(sorted, r->ndir, sizeof(sorted[0]), cmp_dir_offset);
	for (uint32_t i = 1; i < r->ndir; i++)
		if (sorted[i - 1]->offset + sorted[i - 1]->length > sorted[i]->offset)
			return rfail(r, HALITE_E_CORRUPT, "%s: sections %s and %s overlap", r->path,
				     halite_section_name(sorted[i - 1]->type) ?: "(unknown)",
				     halite_section_name(sorted[i]->type) ?: "(unknown)");
	return 0;
}

static const struct rdir *find_dir(const struct halite_reader *r, uint32_t type)
{
	for (uint32_t i = 0; i < r->ndir; i++)
		if (r->dir[i].type == type)
			return &r->dir[i];
	return NULL;
}

/* Read a section whole and verify it. Its length is bounded by the file's. */
static int load_section(struct halite_reader *r, const struct rdir *s, uint8_t **out)
{
	const char *name = halite_section_name(s->type) ?: "(unknown)";
	uint8_t *buf = malloc(s->length ? s->length : 1);
	int ret;

	if (!buf)
		return rfail(r, -ENOMEM, "%s: section %s (%llu bytes)", r->path, name,
			     ULL(s->length));
	ret = read_at(r, buf, s->length, s->offset, name);
	if (!ret && hlt_hash(buf, s->length, r->file_seed) != s->checksum)
		ret = rfail(r, HALITE_E_CHECKSUM, "%s: section %s at offset %llu: checksum mismatch",
			    r->path, name, ULL(s->offset));
	if (ret) {
		free(buf);
		return ret;
	}
	*out = buf;
	return 0;
}

/* ---- required sections ---- */

static const char *region_name(const void *base, uint32_t i)
{
	return ((const struct halite_region_info *)base)[i].name;
}

static const char *kv_key(const void *base, uint32_t i)
{
	return ((const struct rkv *)base)[i].key;
}

struct name_ref {
	const char *name;
	uint32_t idx;
};

static int cmp_name_ref(const void *a, const void *b)
{
	return strcmp(((const struct name_ref *)a)->name, ((const struct name_ref *)b)->name);
}

/*
 * Names must be unique; sort rather than compare all pairs, so that 65536
 * entries cannot make open take seconds. Returns 0, 1 + the index of an
 * entry whose name appears twice, or -ENOMEM.
 */
static int first_duplicate(uint32_t n, const char *(*name)(const void *base, uint32_t i),
			   const void *base)
{
	struct name_ref *v = malloc((n ? n : 1) * sizeof(*v));
	int dup = 0;

	if (!v)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		v[i] = (struct name_ref){ name(base, i), i };
	qsort(v, n, sizeof(*v), cmp_name_ref);
	for (uint32_t i = 1; i < n && !dup; i++)
		if (!strcmp(v[i - 1].name, v[i].name))
			dup = (int)v[i].idx + 1;
	free(v);
	return dup;
}

static int parse_regions(struct halite_reader *r, const uint8_t *p, uint64_t len)
{
	uint64_t pos = HLT_REG_HDR_SIZE, first = 0, mem = 0;
	uint32_t n;
	int dup;

	if (len < HLT_REG_HDR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: regions section too short", r->path);
	n = halite_get_le32(p);
	if (halite_get_le32(p + 4))
		return rfail(r, HALITE_E_RESERVED, "%s: regions: reserved field not zero", r->path);
	if (!n || n > HLT_MAX_REGIONS || n > (len - HLT_REG_HDR_SIZE) / HLT_REG_ENTRY_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: %u regions in a %llu-byte section", r->path,
			     n, ULL(len));
	r->regions = calloc(n, sizeof(*r->regions));
	if (!r->regions)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		struct halite_region_info *ri = &r->regions[i];
		const uint8_t *e = p + pos;
		uint16_t nlen;

		if (len - pos < HLT_REG_ENTRY_SIZE)
			return rfail(r, HALITE_E_CORRUPT, "%s: region %u truncated", r->path, i);
		nlen = halite_get_le16(e + HLT_REG_NAME_LEN);
		if (!halite_all_zero(e + HLT_REG_RESERVED, 6))
			return rfail(r, HALITE_E_RESERVED, "%s: region %u: reserved bytes", r->path, i);
		if (!nlen || nlen > HALITE_MAX_REGION_NAME ||
		    hlt_pad8(nlen) > len - pos - HLT_REG_ENTRY_SIZE)
			return rfail(r, HALITE_E_CORRUPT, "%s: region %u: name length %u", r->path, i,
				     nlen);
		memcpy(ri->name, e + HLT_REG_ENTRY_SIZE, nlen);
		ri->name[nlen] = 0;
		if (strlen(ri->name) != nlen ||
		    !halite_all_zero(e + HLT_REG_ENTRY_SIZE + nlen, hlt_pad8(nlen) - nlen))
			return rfail(r, HALITE_E_CORRUPT, "%s: region %u: NUL in name or padding",
				     r->path, i);
		ri->gpa = halite_get_le64(e + HLT_REG_GPA);
		ri->length = halite_get_le64(e + HLT_REG_LENGTH);
		ri->first_mb = halite_get_le64(e + HLT_REG_FIRST_MB);
		if (!ri->length || ri->length % r->info.page_size || ri->gpa % r->info.page_size)
			return rfail(r, HALITE_E_CORRUPT, "%s: region '%s': gpa 0x%llx length %llu",
				     r->path, ri->name, ULL(ri->gpa), ULL(ri->length));
		ri->mb_count = hlt_region_mbs(ri->length, r->info.mb_size);
		if (ri->first_mb != first)
			return rfail(r, HALITE_E_CORRUPT, "%s: region '%s': first MB %llu, expected %llu",
				     r->path, ri->name, ULL(ri->first_mb), ULL(first));
		/* Each MB needs 8 map bytes in the file: this bounds first, mem. */
		if (ri->mb_count > r->info.file_size / 8 - first)
			return rfail(r, HALITE_E_CORRUPT, "%s: region '%s' is larger than the file "
				     "could describe", r->path, ri->name);
		first += ri->mb_count;
		mem += ri->length;
		pos += HLT_REG_ENTRY_SIZE + hlt_pad8(nlen);
	}
	if (pos != len)
		return rfail(r, HALITE_E_CORRUPT, "%s: regions section has %llu trailing bytes",
			     r->path, ULL(len - pos));
	dup = first_duplicate(n, region_name, r->regions);
	if (dup)
		return dup < 0 ? dup : rfail(r, HALITE_E_CORRUPT, "%s: region name '%s' twice",
					     r->path, r->regions[dup - 1].name);
	r->info.region_count = n;
	r->info.mb_count = first;
	r->info.memory_bytes = mem;
	return 0;
}

HALITE_EXPORT uint32_t halite_reader_mb_bytes(const struct halite_reader *r, uint64_t mb)
{
	const struct halite_region_info *ri;
	uint64_t off;

	if (mb >= r->info.mb_count)
		return 0;
	ri = &r->regions[halite_find_first_mb(r->regions, r->info.region_count, sizeof(*ri),
					      offsetof(struct halite_region_info, first_mb), mb)];
	off = (mb - ri->first_mb) * r->info.mb_size;
	return (uint32_t)HALITE_MIN((uint64_t)r->info.mb_size, ri->length - off);
}

/* LB table entry @i from @e into r->lbs[i], checked (5.3). */
static int lbt_entry(struct halite_reader *r, uint64_t i, const uint8_t *e)
{
	struct rlb *lb = &r->lbs[i];

	lb->stream = halite_get_le32(e + HLT_LBT_STREAM);
	lb->seq = halite_get_le32(e + HLT_LBT_SEQ);
	lb->used = halite_get_le32(e + HLT_LBT_USED);
	lb->mb_count = halite_get_le32(e + HLT_LBT_MB_COUNT);
	lb->checksum = halite_get_le64(e + HLT_LBT_CHECKSUM);
	if (!lb->used || lb->used > r->info.lb_size || !lb->mb_count)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: locality block %llu: %u bytes used, %u memory blocks",
			     r->path, ULL(i), lb->used, lb->mb_count);
	return 0;
}

/*
 * MB map entry @e of MB @m into r->map[m], checked against everything but
 * the LB table's used bytes (@lbs_in: when the table is in place to check
 * those, as in a 1.0 open; a 1.1 reader checks them with the LB's tiling).
 */
static int map_entry(struct halite_reader *r, uint64_t m, uint64_t e, bool lbs_in,
		     struct halite_mb_loc *loc)
{
	uint32_t bytes;
	int ret = hlt_mb_decode(e, r->lb_shift, loc);

	if (ret)
		return rfail(r, ret, "%s: memory block %llu: map entry 0x%016llx", r->path, ULL(m),
			     ULL(e));
	r->map[m] = e;
	if (loc->state != HALITE_MB_STORED)
		return 0;
	bytes = halite_reader_mb_bytes(r, m); /* a region lookup: stored blocks only */
	if (loc->lb >= r->info.lb_count ||
	    (lbs_in && loc->offset + (uint64_t)loc->length > r->lbs[loc->lb].used) ||
	    (loc->compressed ? loc->length >= bytes : loc->length != bytes) ||
	    (loc->compressed && r->info.codec == HALITE_CODEC_NONE))
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: memory block %llu: LB %llu offset %u length %u%s is invalid",
			     r->path, ULL(m), ULL(loc->lb), loc->offset, loc->length,
			     loc->compressed ? " (compressed)" : "");
	return 0;
}

static int parse_lb_table(struct halite_reader *r, const uint8_t *p, uint64_t len)
{
	uint64_t n = r->info.lb_count;

	if (len / HLT_LBT_ENTRY_SIZE != n || len % HLT_LBT_ENTRY_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: LB table of %llu bytes for %llu blocks",
			     r->path, ULL(len), ULL(n));
	r->lbs = zalloc((n ? n : 1) * sizeof(*r->lbs));
	if (!r->lbs)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		int ret = lbt_entry(r, i, p + i * HLT_LBT_ENTRY_SIZE);

		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Within a stream, seq runs 0, 1, 2, ... in file order. Count per stream with
 * an open-addressing table sized from lb_count (bounded by the file size).
 */
static int check_stream_seqs(struct halite_reader *r)
{
	uint64_t n = r->info.lb_count, cap = 16;
	struct slot {
		uint32_t stream, next;
		bool used;
	} *t;
	int ret = 0;

	while (cap < 2 * n)
		cap *= 2;
	t = calloc(cap, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (uint64_t i = 0; i < n && !ret; i++) {
		const struct rlb *lb = &r->lbs[i];
		uint64_t h = (lb->stream * 0x9e3779b97f4a7c15ull) & (cap - 1);

		while (t[h].used && t[h].stream != lb->stream)
			h = (h + 1) & (cap - 1);
		if (!t[h].used)
			t[h] = (struct slot){ .stream = lb->stream, .used = true };
		if (lb->seq != t[h].next) {
			char sn[32];

			ret = rfail(r, HALITE_E_CORRUPT,
				    "%s: locality block %llu: stream %s seq %u, expected %u", r->path,
				    ULL(i), halite_stream_name(lb->stream, sn, sizeof(sn)), lb->seq,
				    t[h].next);
		}
		t[h].next++;
	}
	free(t);
	return ret;
}

static int parse_map(struct halite_reader *r, const uint8_t *p, uint64_t len)
{
	struct halite_file_info *fi = &r->info;
	uint64_t n = fi->mb_count, nlb = fi->lb_count;
	struct hlt_offset_key key;
	uint64_t *fill;

	if (len / 8 != n || len % 8)
		return rfail(r, HALITE_E_CORRUPT, "%s: MB map of %llu bytes for %llu memory blocks",
			     r->path, ULL(len), ULL(n));
	r->map = zalloc((n ? n : 1) * sizeof(*r->map));
	r->lb_first = zalloc((nlb + 1) * sizeof(*r->lb_first));
	if (!r->map || !r->lb_first)
		return -ENOMEM;
	for (uint64_t m = 0; m < n; m++) {
		struct halite_mb_loc loc;
		int ret = map_entry(r, m, halite_get_le64(p + 8 * m), true, &loc);

		if (ret)
			return ret;
		if (loc.state == HALITE_MB_UNTOUCHED) {
			fi->mb_untouched++;
			continue;
		}
		if (loc.state == HALITE_MB_ZERO) {
			fi->mb_zero++;
			continue;
		}
		fi->mb_stored++;
		fi->mb_compressed += loc.compressed;
		fi->stored_bytes += loc.length;
		r->lb_first[loc.lb + 1]++;
	}
	for (uint64_t i = 0; i < nlb; i++) {
		if (r->lb_first[i + 1] != r->lbs[i].mb_count)
			return rfail(r, HALITE_E_CORRUPT,
				     "%s: locality block %llu holds %llu memory blocks, table says %u",
				     r->path, ULL(i), ULL(r->lb_first[i + 1]), r->lbs[i].mb_count);
		r->lb_first[i + 1] += r->lb_first[i];
	}
	r->members = zalloc((fi->mb_stored ? fi->mb_stored : 1) * sizeof(*r->members));
	fill = malloc((nlb ? nlb : 1) * sizeof(*fill));
	if (!r->members || !fill) {
		free(fill);
		return -ENOMEM;
	}
	memcpy(fill, r->lb_first, nlb * sizeof(*fill));
	for (uint64_t m = 0; m < n; m++)
		if ((r->map[m] & HLT_MB_STATE_MASK) == HALITE_MB_STORED)
			r->members[fill[r->map[m] >> (3 + 2 * r->lb_shift)]++] = m;
	free(fill);

	/* Members must tile each LB's used bytes exactly (docs/format.md 5.2). */
	key = (struct hlt_offset_key){ r->map, r->lb_shift };
	for (uint64_t i = 0; i < nlb; i++) {
		uint64_t *mb = r->members + r->lb_first[i];
		uint64_t cnt = r->lb_first[i + 1] - r->lb_first[i];
		uint64_t expect = 0;

		qsort_r(mb, cnt, sizeof(*mb), hlt_cmp_offset, &key);
		for (uint64_t j = 0; j < cnt; j++) {
			struct halite_mb_loc loc;

			hlt_mb_decode(r->map[mb[j]], r->lb_shift, &loc);
			if (loc.offset != expect)
				return rfail(r, HALITE_E_CORRUPT,
					     "%s: locality block %llu: memory block %llu at %u, expected %llu",
					     r->path, ULL(i), ULL(mb[j]), loc.offset, ULL(expect));
			expect += loc.length;
		}
		if (expect != r->lbs[i].used)
			return rfail(r, HALITE_E_CORRUPT,
				     "%s: locality block %llu: memory blocks end at %llu, %u bytes used",
				     r->path, ULL(i), ULL(expect), r->lbs[i].used);
	}
	return 0;
}

/* ---- format 1.1: the chunked index, read on first use ---- */

static uint64_t chunk_sum(const struct rchunks *ch, uint64_t c)
{
	return halite_get_le64(ch->sum + c * ch->sum_stride);
}

/*
 * Chunk @c of @ch in place: read, verified against the index and parsed the
 * first time, by whichever thread needs it first (the others wait for it on
 * the chunk's lock). A chunk that fails is not marked, so every use reports
 * it again, and nothing from it is ever returned.
 */
static int need_chunk(struct halite_reader *r, struct rchunks *ch, uint64_t c)
{
	const char *name = halite_section_name(ch->type);
	pthread_mutex_t *lk = &ch->lock[c % CHUNK_LOCKS];
	uint64_t first, cnt, len;
	uint8_t *buf;
	int ret = 0;

	if (atomic_load_explicit(&ch->ok[c], memory_order_acquire))
		return 0;
	pthread_mutex_lock(lk);
	if (atomic_load_explicit(&ch->ok[c], memory_order_relaxed))
		goto out;
	first = c << ch->shift;
	cnt = HALITE_MIN(ch->entries - first, (uint64_t)1 << ch->shift);
	len = cnt * ch->esize;
	buf = malloc(len);
	if (!buf) {
		ret = rfail(r, -ENOMEM, "%s: %s chunk %llu", r->path, name, ULL(c));
		goto out;
	}
	ret = read_at(r, buf, len, ch->off + first * ch->esize, name);
	if (!ret && hlt_hash(buf, len, hlt_chunk_seed(r->file_seed, ch->type, c)) !=
			    chunk_sum(ch, c))
		ret = rfail(r, HALITE_E_CHECKSUM,
			    "%s: %s chunk %llu (entries %llu..%llu, %llu bytes at offset %llu): "
			    "checksum mismatch", r->path, name, ULL(c), ULL(first),
			    ULL(first + cnt - 1), ULL(len), ULL(ch->off + first * ch->esize));
	if (!ret)
		ret = ch->parse(r, c, first, cnt, buf);
	free(buf);
	if (!ret)
		atomic_store_explicit(&ch->ok[c], 1, memory_order_release);
out:
	pthread_mutex_unlock(lk);
	return ret;
}

static int parse_map_chunk(struct halite_reader *r, uint64_t c, uint64_t first, uint64_t cnt,
			   const uint8_t *p)
{
	for (uint64_t j = 0; j < cnt; j++) {
		struct halite_mb_loc loc;
		int ret = map_entry(r, first + j, halite_get_le64(p + 8 * j), false, &loc);

		if (ret)
			return ret;
	}
	return 0;
}

static int parse_lbt_chunk(struct halite_reader *r, uint64_t c, uint64_t first, uint64_t cnt,
			   const uint8_t *p)
{
	const struct rchunks *ch = &r->lz->lbt;
	uint64_t at = halite_get_le64(ch->sum + c * ch->sum_stride - 8);
	uint64_t end = c + 1 < ch->n ? halite_get_le64(ch->sum + (c + 1) * ch->sum_stride - 8)
				     : r->info.mb_stored;

	for (uint64_t j = 0; j < cnt; j++) {
		int ret = lbt_entry(r, first + j, p + j * HLT_LBT_ENTRY_SIZE);

		if (ret)
			return ret;
		r->lb_first[first + j] = at;
		at += r->lbs[first + j].mb_count;
	}
	if (at != end)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: lb-table chunk %llu: its blocks hold %llu memory blocks, the "
			     "index says %llu", r->path, ULL(c), ULL(at - r->lb_first[first]),
			     ULL(end - r->lb_first[first]));
	return 0;
}

static int parse_mem_chunk(struct halite_reader *r, uint64_t c, uint64_t first, uint64_t cnt,
			   const uint8_t *p)
{
	for (uint64_t j = 0; j < cnt; j++)
		r->members[first + j] = halite_get_le64(p + 8 * j);
	return 0;
}

static bool mb_ok(const struct rlazy *lz, uint64_t mb)
{
	return (atomic_load_explicit(&lz->mb_ok[mb / 64], memory_order_acquire) >> (mb % 64)) & 1;
}

/*
 * LB @lb's member list in place and checked against the map: every member a
 * stored MB the map puts in @lb, at offsets tiling its used bytes (5.2). Then
 * its members are marked, so that a lookup of an MB the map puts in an LB
 * whose list does not hold it is caught. No lock: threads that check the
 * same LB at once find the same and set the same bits.
 */
static int need_members(struct halite_reader *r, uint64_t lb)
{
	struct rlazy *lz = r->lz;
	uint64_t start, expect = 0;
	uint32_t cnt;
	int ret;

	if (!lz || atomic_load_explicit(&lz->lb_ok[lb], memory_order_acquire))
		return 0;
	ret = need_chunk(r, &lz->lbt, lb >> lz->lbt.shift);
	if (ret)
		return ret;
	start = r->lb_first[lb];
	cnt = r->lbs[lb].mb_count; /* start + cnt <= mb_stored: parse_lbt_chunk */
	for (uint64_t k = start >> lz->mem.shift; k <= (start + cnt - 1) >> lz->mem.shift; k++) {
		ret = need_chunk(r, &lz->mem, k);
		if (ret)
			return ret;
	}
	for (uint32_t j = 0; j < cnt; j++) {
		uint64_t m = r->members[start + j];
		struct halite_mb_loc loc;

		if (m >= r->info.mb_count)
			return rfail(r, HALITE_E_CORRUPT, "%s: lb-members: locality block %llu: "
				     "member %u is memory block %llu, past the last (%llu)", r->path,
				     ULL(lb), j, ULL(m), ULL(r->info.mb_count - 1));
		ret = need_chunk(r, &lz->map, m >> lz->map.shift);
		if (ret)
			return ret;
		hlt_mb_decode(r->map[m], r->lb_shift, &loc); /* checked when its chunk came in */
		if (loc.state != HALITE_MB_STORED)
			return rfail(r, HALITE_E_CORRUPT, "%s: lb-members: locality block %llu: "
				     "member %u is memory block %llu, which the map says is not stored",
				     r->path, ULL(lb), j, ULL(m));
		if (loc.lb != lb || loc.offset != expect)
			return rfail(r, HALITE_E_CORRUPT, "%s: lb-members: locality block %llu: "
				     "member %u is memory block %llu, expected at offset %llu, but the "
				     "map puts it in LB %llu at offset %u", r->path, ULL(lb), j, ULL(m),
				     ULL(expect), ULL(loc.lb), loc.offset);
		expect += loc.length;
	}
	if (expect != r->lbs[lb].used)
		return rfail(r, HALITE_E_CORRUPT,
			     "%s: locality block %llu: memory blocks end at %llu, %u bytes used",
			     r->path, ULL(lb), ULL(expect), r->lbs[lb].used);
	for (uint32_t j = 0; j < cnt; j++) {
		uint64_t m = r->members[start + j];

		atomic_fetch_or_explicit(&lz->mb_ok[m / 64], 1ull << (m % 64), memory_order_release);
	}
	atomic_store_explicit(&lz->lb_ok[lb], 1, memory_order_release);
	return 0;
}

static void chunks_init(struct rchunks *ch, uint32_t type, const struct rdir *s, uint32_t esize,
			uint32_t per, uint64_t entries,
			int (*parse)(struct halite_reader *, uint64_t, uint64_t, uint64_t,
				     const uint8_t *))
{
	ch->type = type;
	ch->off = s->offset;
	ch->esize = esize;
	ch->shift = (uint32_t)__builtin_ctz(per);
	ch->entries = entries;
	ch->n = (entries + per - 1) / per;
	ch->parse = parse;
	for (unsigned i = 0; i < CHUNK_LOCKS; i++)
		pthread_mutex_init(&ch->lock[i], NULL);
}

static void lazy_free(struct halite_reader *r)
{
	struct rlazy *lz = r->lz;

	if (!lz)
		return;
	struct rchunks *all[] = { &lz->map, &lz->lbt, &lz->mem };

	for (size_t i = 0; i < HALITE_ARRAY_SIZE(all); i++) {
		free(all[i]->ok);
		for (unsigned k = 0; lz->locks && k < CHUNK_LOCKS; k++)
			pthread_mutex_destroy(&all[i]->lock[k]);
	}
	free(lz->index);
	zfree(lz->lb_ok);
	zfree(lz->mb_ok);
	free(lz);
}

static bool chunk_entries_ok(uint32_t v)
{
	return halite_is_pow2(v) && v >= HLT_IDX_MIN_CHUNK && v <= HLT_IDX_MAX_CHUNK;
}

/*
 * The index section (5.7), verified: chunk sizes, totals and the lengths of
 * the sections it covers; nothing of those is read. Allocates the arrays a
 * 1.0 open fills, zero until their chunks come in (zalloc: O(1)).
 */
static int parse_index(struct halite_reader *r, uint8_t *p, uint64_t len)
{
	struct halite_file_info *fi = &r->info;
	const struct rdir *smap = find_dir(r, HALITE_SECTION_MB_MAP);
	const struct rdir *slbt = find_dir(r, HALITE_SECTION_LB_TABLE);
	const struct rdir *smem = find_dir(r, HALITE_SECTION_LB_MEMBERS);
	uint32_t pm, pl, pe;
	uint64_t nmap, nlbt, nmem, prev = 0;
	struct rlazy *lz;

	r->lz = lz = calloc(1, sizeof(*lz));
	if (!lz) {
		free(p);
		return -ENOMEM;
	}
	lz->index = p; /* owned from here on */
	if (len < HLT_IDX_HDR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: index section too short", r->path);
	pm = halite_get_le32(p + HLT_IDX_MAP_CHUNK);
	pl = halite_get_le32(p + HLT_IDX_LBT_CHUNK);
	pe = halite_get_le32(p + HLT_IDX_MEM_CHUNK);
	if (halite_get_le32(p + HLT_IDX_RESERVED))
		return rfail(r, HALITE_E_RESERVED, "%s: index: reserved field not zero", r->path);
	if (!chunk_entries_ok(pm) || !chunk_entries_ok(pl) || !chunk_entries_ok(pe))
		return rfail(r, HALITE_E_CORRUPT, "%s: index: chunks of %u, %u, %u entries (powers "
			     "of two, %u to %u)", r->path, pm, pl, pe, HLT_IDX_MIN_CHUNK,
			     HLT_IDX_MAX_CHUNK);
	fi->mb_stored = halite_get_le64(p + HLT_IDX_MB_STORED);
	fi->mb_zero = halite_get_le64(p + HLT_IDX_MB_ZERO);
	fi->mb_compressed = halite_get_le64(p + HLT_IDX_MB_COMPRESSED);
	fi->stored_bytes = halite_get_le64(p + HLT_IDX_STORED_BYTES);
	/* Each LB holds 1 .. lb_size bytes of at least one MB (5.3). */
	if (fi->mb_stored > fi->mb_count || fi->mb_zero > fi->mb_count - fi->mb_stored ||
	    fi->mb_compressed > fi->mb_stored || fi->mb_stored < fi->lb_count ||
	    (fi->mb_stored && !fi->lb_count) || fi->stored_bytes < fi->lb_count ||
	    fi->stored_bytes > fi->lb_count << r->lb_shift)
		return rfail(r, HALITE_E_CORRUPT, "%s: index: %llu stored (%llu compressed, %llu "
			     "bytes), %llu zero of %llu memory blocks in %llu locality blocks",
			     r->path, ULL(fi->mb_stored), ULL(fi->mb_compressed),
			     ULL(fi->stored_bytes), ULL(fi->mb_zero), ULL(fi->mb_count),
			     ULL(fi->lb_count));
	fi->mb_untouched = fi->mb_count - fi->mb_stored - fi->mb_zero;
	if (smap->length / 8 != fi->mb_count || smap->length % 8 ||
	    slbt->length / HLT_LBT_ENTRY_SIZE != fi->lb_count || slbt->length % HLT_LBT_ENTRY_SIZE ||
	    smem->length / 8 != fi->mb_stored || smem->length % 8)
		return rfail(r, HALITE_E_CORRUPT, "%s: mb-map, lb-table, lb-members of %llu, %llu, "
			     "%llu bytes for %llu memory blocks (%llu stored) in %llu locality blocks",
			     r->path, ULL(smap->length), ULL(slbt->length), ULL(smem->length),
			     ULL(fi->mb_count), ULL(fi->mb_stored), ULL(fi->lb_count));
	chunks_init(&lz->map, HALITE_SECTION_MB_MAP, smap, 8, pm, fi->mb_count, parse_map_chunk);
	chunks_init(&lz->lbt, HALITE_SECTION_LB_TABLE, slbt, HLT_LBT_ENTRY_SIZE, pl, fi->lb_count,
		    parse_lbt_chunk);
	chunks_init(&lz->mem, HALITE_SECTION_LB_MEMBERS, smem, 8, pe, fi->mb_stored,
		    parse_mem_chunk);
	lz->locks = true;
	nmap = lz->map.n;
	nlbt = lz->lbt.n;
	nmem = lz->mem.n;
	/* Counts are bounded by the file's size (the section lengths above). */
	if (len != HLT_IDX_HDR_SIZE + nmap * HLT_IDX_MAP_ENTRY + nlbt * HLT_IDX_LBT_ENTRY +
		   nmem * HLT_IDX_MEM_ENTRY)
		return rfail(r, HALITE_E_CORRUPT, "%s: index of %llu bytes for %llu + %llu + %llu "
			     "chunks", r->path, ULL(len), ULL(nmap), ULL(nlbt), ULL(nmem));
	lz->map.sum = p + HLT_IDX_HDR_SIZE;
	lz->map.sum_stride = HLT_IDX_MAP_ENTRY;
	lz->lbt.sum = lz->map.sum + nmap * HLT_IDX_MAP_ENTRY + 8; /* after the first member */
	lz->lbt.sum_stride = HLT_IDX_LBT_ENTRY;
	lz->mem.sum = lz->lbt.sum - 8 + nlbt * HLT_IDX_LBT_ENTRY;
	lz->mem.sum_stride = HLT_IDX_MEM_ENTRY;
	/* First members: 0, then up by at least one per LB, to at most mb_stored. */
	for (uint64_t c = 0; c < nlbt; c++) {
		uint64_t v = halite_get_le64(lz->lbt.sum + c * HLT_IDX_LBT_ENTRY - 8);
		uint64_t lbs = HALITE_MIN(fi->lb_count - (c << lz->lbt.shift), (uint64_t)pl);

		if (c ? v < prev : v != 0)
			return rfail(r, HALITE_E_CORRUPT, "%s: index: lb-table chunk %llu starts at "
				     "member %llu", r->path, ULL(c), ULL(v));
		if (v > fi->mb_stored || fi->mb_stored - v < lbs)
			return rfail(r, HALITE_E_CORRUPT, "%s: index: lb-table chunk %llu starts at "
				     "member %llu of %llu", r->path, ULL(c), ULL(v),
				     ULL(fi->mb_stored));
		prev = v;
	}
	lz->map.ok = calloc(nmap + 1, 1);
	lz->lbt.ok = calloc(nlbt + 1, 1);
	lz->mem.ok = calloc(nmem + 1, 1);
	lz->lb_ok = zalloc(fi->lb_count + 1);
	lz->mb_ok = zalloc((fi->mb_count / 64 + 1) * 8);
	r->map = zalloc((fi->mb_count + 1) * 8);
	r->lbs = zalloc((fi->lb_count + 1) * sizeof(*r->lbs));
	r->lb_first = zalloc((fi->lb_count + 1) * 8);
	r->members = zalloc((fi->mb_stored + 1) * 8);
	if (!lz->map.ok || !lz->lbt.ok || !lz->mem.ok || !lz->lb_ok || !lz->mb_ok || !r->map ||
	    !r->lbs || !r->lb_first || !r->members)
		return rfail(r, -ENOMEM, "%s: index of %llu memory blocks", r->path,
			     ULL(fi->mb_count));
	r->lb_first[fi->lb_count] = fi->mb_stored;
	return 0;
}

/* A stored MB's entry is used only once its LB's member list vouches for it. */
static int lazy_lookup(struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc)
{
	struct rlazy *lz = r->lz;
	int ret = need_chunk(r, &lz->map, mb >> lz->map.shift);

	if (ret)
		return ret;
	hlt_mb_decode(r->map[mb], r->lb_shift, loc); /* checked when its chunk came in */
	if (loc->state != HALITE_MB_STORED || mb_ok(lz, mb))
		return 0;
	ret = need_members(r, loc->lb);
	if (!ret && !mb_ok(lz, mb))
		ret = rfail(r, HALITE_E_CORRUPT, "%s: memory block %llu: the map puts it in "
			    "locality block %llu at offset %u, whose member list does not hold it",
			    r->path, ULL(mb), ULL(loc->lb), loc->offset);
	return ret;
}

HALITE_EXPORT int halite_reader_verify_index(struct halite_reader *r)
{
	struct halite_file_info *fi = &r->info;
	uint64_t stored = 0, zero = 0, compressed = 0, bytes = 0;
	int ret = 0;

	if (!r->lz)
		return 0; /* a 1.0 open checked it all */
	for (uint64_t lb = 0; lb < fi->lb_count && !ret; lb++)
		ret = need_members(r, lb);
	for (uint64_t c = 0; c < r->lz->map.n && !ret; c++)
		ret = need_chunk(r, &r->lz->map, c);
	for (uint64_t m = 0; m < fi->mb_count && !ret; m++) {
		struct halite_mb_loc loc;

		hlt_mb_decode(r->map[m], r->lb_shift, &loc);
		zero += loc.state == HALITE_MB_ZERO;
		if (loc.state != HALITE_MB_STORED)
			continue;
		if (!mb_ok(r->lz, m))
			ret = rfail(r, HALITE_E_CORRUPT, "%s: memory block %llu: the map puts it in "
				    "locality block %llu, whose member list does not hold it",
				    r->path, ULL(m), ULL(loc.lb));
		stored++;
		compressed += loc.compressed;
		bytes += loc.length;
	}
	if (!ret && (stored != fi->mb_stored || zero != fi->mb_zero ||
		     compressed != fi->mb_compressed || bytes != fi->stored_bytes))
		ret = rfail(r, HALITE_E_CORRUPT, "%s: index totals (%llu stored, %llu zero, %llu "
			    "compressed, %llu bytes) do not match the map (%llu, %llu, %llu, %llu)",
			    r->path, ULL(fi->mb_stored), ULL(fi->mb_zero), ULL(fi->mb_compressed),
			    ULL(fi->stored_bytes), ULL(stored), ULL(zero), ULL(compressed),
			    ULL(bytes));
	return ret ? ret : check_stream_seqs(r);
}

/* ---- optional sections ---- */

static int parse_vcpus(struct halite_reader *r, const uint8_t *p, uint64_t len)
{
	uint32_t n;

	if (len < HLT_VCPU_HDR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: vcpus section too short", r->path);
	r->vcpu_count = halite_get_le32(p);
	n = halite_get_le32(p + 4);
	if ((len - HLT_VCPU_HDR_SIZE) / HLT_VCPU_ROOT_SIZE != n ||
	    (len - HLT_VCPU_HDR_SIZE) % HLT_VCPU_ROOT_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: vcpus section: %u roots in %llu bytes",
			     r->path, n, ULL(len));
	r->roots = calloc(n ? n : 1, sizeof(*r->roots));
	if (!r->roots)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = p + HLT_VCPU_HDR_SIZE + (size_t)i * HLT_VCPU_ROOT_SIZE;
		struct halite_root *root = &r->roots[i];

		root->vcpu = halite_get_le32(e);
		root->mode = halite_get_le32(e + 4);
		root->cr3 = halite_get_le64(e + 8);
		if ((root->vcpu >= r->vcpu_count && root->vcpu != HALITE_VCPU_UNKNOWN) ||
		    (root->mode != HALITE_PAGING_4LEVEL && root->mode != HALITE_PAGING_5LEVEL))
			return rfail(r, HALITE_E_CORRUPT, "%s: root %u: vCPU %u, paging mode %u",
				     r->path, i, root->vcpu, root->mode);
	}
	r->nroots = n;
	r->has_vcpus = true;
	return 0;
}

static int parse_kvs(struct halite_reader *r, struct rkvs *kv, uint8_t *p, uint64_t len,
		     bool u64_values, const char *what)
{
	uint64_t pos = HLT_KV_HDR_SIZE;
	char *keys;
	uint32_t n;
	int dup;

	kv->section = p; /* owned from here on */
	if (len < HLT_KV_HDR_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: %s section too short", r->path, what);
	if (halite_get_le32(p + 4))
		return rfail(r, HALITE_E_RESERVED, "%s: %s: reserved field not zero", r->path, what);
	n = halite_get_le32(p);
	if (n > HLT_MAX_KV || n > (len - HLT_KV_HDR_SIZE) / HLT_KV_ENTRY_HDR)
		return rfail(r, HALITE_E_CORRUPT, "%s: %s: %u entries in %llu bytes", r->path, what,
			     n, ULL(len));
	kv->v = calloc(n ? n : 1, sizeof(*kv->v));
	kv->keys = keys = malloc(len + n + 1); /* each key fits in its entry */
	if (!kv->v || !keys)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = p + pos;
		uint16_t klen;
		uint32_t vlen;
		uint64_t size;

		if (len - pos < HLT_KV_ENTRY_HDR)
			return rfail(r, HALITE_E_CORRUPT, "%s: %s entry %u truncated", r->path, what, i);
		klen = halite_get_le16(e);
		vlen = halite_get_le32(e + 4);
		size = hlt_pad8((uint64_t)HLT_KV_ENTRY_HDR + klen + vlen);
		if (halite_get_le16(e + 2))
			return rfail(r, HALITE_E_RESERVED, "%s: %s entry %u: reserved field", r->path,
				     what, i);
		if (!klen || klen > 255 || vlen > HLT_MAX_KV_VALUE || size > len - pos ||
		    (u64_values && vlen != 8) ||
		    !halite_all_zero(e + HLT_KV_ENTRY_HDR + klen + vlen,
				     size - HLT_KV_ENTRY_HDR - klen - vlen))
			return rfail(r, HALITE_E_CORRUPT, "%s: %s entry %u: key %u, value %u bytes",
				     r->path, what, i, klen, vlen);
		memcpy(keys, e + HLT_KV_ENTRY_HDR, klen);
		keys[klen] = 0;
		if (strlen(keys) != klen)
			return rfail(r, HALITE_E_CORRUPT, "%s: %s entry %u: NUL in key", r->path, what, i);
		kv->v[i] = (struct rkv){ keys, e + HLT_KV_ENTRY_HDR + klen, vlen };
		keys += klen + 1;
		pos += size;
	}
	if (pos != len)
		return rfail(r, HALITE_E_CORRUPT, "%s: %s section has trailing bytes", r->path, what);
	dup = first_duplicate(n, kv_key, kv->v);
	if (dup)
		return dup < 0 ? dup : rfail(r, HALITE_E_CORRUPT, "%s: %s: key '%s' twice", r->path,
					     what, kv->v[dup - 1].key);
	kv->n = n;
	return 0;
}

static int load_sections(struct halite_reader *r)
{
	static const uint32_t order[] = {
		HALITE_SECTION_REGIONS, HALITE_SECTION_INDEX, HALITE_SECTION_LB_TABLE,
		HALITE_SECTION_MB_MAP, HALITE_SECTION_VCPUS, HALITE_SECTION_DEVICE_STATE, HALITE_SECTION_METADATA,
		HALITE_SECTION_SAVE_STATS,
	};
	int ret = 0;

	for (size_t i = 0; i < HALITE_ARRAY_SIZE(order) && !ret; i++) {
		const struct rdir *s = find_dir(r, order[i]);
		uint8_t *buf = NULL;

		/* With a chunked index (1.1), those come in chunk by chunk when used. */
		if (!s || (r->lz && (s->type == HALITE_SECTION_LB_TABLE ||
				     s->type == HALITE_SECTION_MB_MAP)))
			continue;
		ret = load_section(r, s, &buf);
		if (ret)
			return ret;
		switch (s->type) {
		case HALITE_SECTION_REGIONS:
			ret = parse_regions(r, buf, s->length);
			break;
		case HALITE_SECTION_INDEX:
			ret = parse_index(r, buf, s->length);
			continue;
		case HALITE_SECTION_LB_TABLE:
			ret = parse_lb_table(r, buf, s->length);
			if (!ret)
				ret = check_stream_seqs(r);
			break;
		case HALITE_SECTION_MB_MAP:
			ret = parse_map(r, buf, s->length);
			break;
		case HALITE_SECTION_VCPUS:
			ret = parse_vcpus(r, buf, s->length);
			break;
		case HALITE_SECTION_DEVICE_STATE:
			r->device_state = buf;
			r->device_state_len = s->length;
			r->has_device_state = true;
			continue;
		case HALITE_SECTION_METADATA:
			ret = parse_kvs(r, &r->meta, buf, s->length, false, "metadata");
			continue;
		case HALITE_SECTION_SAVE_STATS:
			ret = parse_kvs(r, &r->stats, buf, s->length, true, "save-stats");
			continue;
		}
		free(buf);
	}
	return ret;
}

static int open_files(struct halite_reader *r, const struct halite_reader_opts *o)
{
	HALITE_OPTS(halite_io_opts, io_opts);
	struct stat st;
	int ret;

	io_opts.backend = HALITE_IO_PSYNC;
	ret = halite_io_open(&r->meta_io, r->path, O_RDONLY | O_CLOEXEC, 0, &io_opts);
	if (ret)
		return rfail(r, ret, "%s: cannot open", r->path);
	if (fstat(halite_io_fd(r->meta_io), &st))
		return rfail(r, -errno, "%s: fstat", r->path);
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		return rfail_said(r, -EINVAL, "%s: not a regular file (%s)", r->path,
				  file_kind(st.st_mode));
	r->info.file_size = (uint64_t)st.st_size;
	io_opts.flags = (o->flags & HALITE_READER_DIRECT) ? HALITE_IO_DIRECT : 0;
	io_opts.read_latency_us = o->read_latency_us;
	ret = halite_io_open(&r->lb_io, r->path, O_RDONLY | O_CLOEXEC, 0, &io_opts);
	if (ret)
		return rfail(r, ret, "%s: cannot open for locality-block reads%s", r->path,
			     io_opts.flags ? " (O_DIRECT)" : "");
	return 0;
}

static int open_validate(struct halite_reader *r, const struct halite_reader_opts *o)
{
	uint8_t hdr[HLT_HDR_SIZE], ftr[HLT_FTR_SIZE], dir[HLT_MAX_SECTIONS * HLT_DIR_ENTRY_SIZE];
	uint64_t size;
	int ret;

	ret = open_files(r, o);
	if (ret)
		return ret;
	size = r->info.file_size;
	if (size < HLT_HDR_SIZE) {
		uint8_t m[8];

		if (size < 8 || read_at(r, m, 8, 0, "magic") || memcmp(m, HLT_HDR_MAGIC, 8))
			return size ? rfail_said(r, HALITE_E_BAD_MAGIC, "%s: not a Halite snapshot "
						 "(it does not start with a Halite header)", r->path) :
				rfail_said(r, HALITE_E_BAD_MAGIC, "%s: not a Halite snapshot (empty file)",
					   r->path);
		return rfail_said(r, HALITE_E_TRUNCATED, "%s: incomplete: %llu bytes, shorter "
				  "than a Halite header; it cannot be restored", r->path, ULL(size));
	}
	ret = read_at(r, hdr, sizeof(hdr), 0, "header");
	if (!ret)
		ret = parse_header(r, hdr);
	if (ret)
		return ret;
	/*
	 * A valid header and no valid footer: the save died or the file was cut.
	 * A valid footer makes the file complete, and from then on an
	 * inconsistent field (say, data_offset past the directory) is corruption.
	 */
	if (size < HLT_HDR_SIZE + HLT_FTR_SIZE)
		return rfail_said(r, HALITE_E_INCOMPLETE,
				  "%s: incomplete: the save that wrote it did not finish, or the file "
				  "was cut short (%llu bytes, no room for a footer); it cannot be "
				  "restored", r->path, ULL(size));
	ret = read_at(r, ftr, sizeof(ftr), size - HLT_FTR_SIZE, "footer");
	if (!ret)
		ret = parse_footer(r, ftr);
	if (!ret)
		ret = check_padding(r);
	if (!ret)
		ret = read_at(r, dir, (size_t)r->ndir * HLT_DIR_ENTRY_SIZE, r->dir_off, "directory");
	if (!ret)
		ret = parse_directory(r, dir, halite_get_le64(ftr + HLT_FTR_DIR_CHECKSUM));
	if (!ret)
		ret = load_sections(r);
	return ret;
}

HALITE_EXPORT int halite_reader_open(struct halite_reader **rp, const char *path,
		       const struct halite_reader_opts *opts)
{
	struct halite_reader_opts o;
	struct halite_reader *r;
	int ret;

	if (!rp || !path)
		return -EINVAL;
	ret = halite_opts_copy(&o, sizeof(o), opts);
	if (ret)
		return ret;
	if (o.flags & ~HALITE_READER_FLAGS_ALL)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->err_lock, NULL);
	r->log = (struct halite_logger){ o.log, o.log_ctx, o.log_level };
	r->info.codec = HALITE_CODEC_DEFAULT;
	r->path = strdup(path);
	ret = r->path ? open_validate(r, &o) : -ENOMEM;
	if (ret) {
		if (o.errbuf && o.errbuf_len)
			snprintf(o.errbuf, o.errbuf_len, "%s",
				 r->errmsg[0] ? r->errmsg : halite_strerror(ret));
		halite_reader_free(r);
		return ret;
	}
	*rp = r;
	return 0;
}

static void kvs_free(struct rkvs *kv)
{
	free(kv->section);
	free(kv->keys);
	free(kv->v);
}

HALITE_EXPORT void halite_reader_free(struct halite_reader *r)
{
	if (!r)
		return;
	halite_io_close(r->meta_io);
	halite_io_close(r->lb_io);
	free(r->regions);
	zfree(r->map);
	zfree(r->lbs);
	zfree(r->members);
	zfree(r->lb_first);
	lazy_free(r);
	free(r->device_state);
	free(r->roots);
	kvs_free(&r->meta);
	kvs_free(&r->stats);
	pthread_mutex_destroy(&r->err_lock);
	free(r->path);
	free(r);
}

HALITE_EXPORT const char *halite_reader_errmsg(const struct halite_reader *r)
{
	return r->errmsg;
}

HALITE_EXPORT const struct halite_file_info *halite_reader_info(const struct halite_reader *r)
{
	return &r->info;
}

HALITE_EXPORT const struct halite_region_info *halite_reader_region(const struct halite_reader *r,
						      uint32_t idx)
{
	return idx < r->info.region_count ? &r->regions[idx] : NULL;
}

HALITE_EXPORT int halite_reader_find_region(const struct halite_reader *r, const char *name)
{
	for (uint32_t i = 0; i < r->info.region_count; i++)
		if (!strcmp(r->regions[i].name, name))
			return (int)i;
	return -HALITE_E_NOT_FOUND;
}

/*
 * The lookups take a const reader but may bring in a 1.1 file's chunks: the
 * arrays they fill are the reader's cache, not its state as the caller sees it.
 */
static struct halite_reader *cache_of(const struct halite_reader *r)
{
	return (struct halite_reader *)r;
}

HALITE_EXPORT int halite_reader_mb_lookup(const struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc)
{
	if (mb >= r->info.mb_count)
		return -ERANGE;
	if (r->lz)
		return lazy_lookup(cache_of(r), mb, loc);
	/* Validated at open. */
	return hlt_mb_decode(r->map[mb], r->lb_shift, loc);
}

/* LB @lb's table entry in place (a 1.1 file's chunk of it). */
static int need_lbt(const struct halite_reader *r, uint64_t lb)
{
	return r->lz ? need_chunk(cache_of(r), &r->lz->lbt, lb >> r->lz->lbt.shift) : 0;
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
	ret = need_members(cache_of(r), lb);
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

HALITE_EXPORT int halite_reader_device_state(struct halite_reader *r, const void **data, uint64_t *len)
{
	if (!r->has_device_state)
		return -HALITE_E_NOT_FOUND;
	*data = r->device_state;
	*len = r->device_state_len;
	return 0;
}

HALITE_EXPORT int halite_reader_vcpus(const struct halite_reader *r, uint32_t *vcpu_count,
			const struct halite_root **roots, uint32_t *root_count)
{
	if (!r->has_vcpus)
		return -HALITE_E_NOT_FOUND;
	*vcpu_count = r->vcpu_count;
	*roots = r->roots;
	*root_count = r->nroots;
	return 0;
}

HALITE_EXPORT uint32_t halite_reader_meta_count(const struct halite_reader *r)
{
	return r->meta.n;
}

HALITE_EXPORT int halite_reader_meta(const struct halite_reader *r, uint32_t idx, const char **key,
		       const void **value, uint32_t *len)
{
	if (idx >= r->meta.n)
		return -ERANGE;
	*key = r->meta.v[idx].key;
	*value = r->meta.v[idx].value;
	*len = r->meta.v[idx].len;
	return 0;
}

HALITE_EXPORT uint32_t halite_reader_stat_count(const struct halite_reader *r)
{
	return r->stats.n;
}

HALITE_EXPORT int halite_reader_stat(const struct halite_reader *r, uint32_t idx, const char **key,
		       uint64_t *value)
{
	if (idx >= r->stats.n)
		return -ERANGE;
	*key = r->stats.v[idx].key;
	*value = halite_get_le64(r->stats.v[idx].value);
	return 0;
}

HALITE_EXPORT uint32_t halite_reader_section_count(const struct halite_reader *r)
{
	return r->ndir;
}

HALITE_EXPORT int halite_reader_section(const struct halite_reader *r, uint32_t idx, uint32_t *type,
			  uint64_t *offset, uint64_t *length)
{
	if (idx >= r->ndir)
		return -ERANGE;
	*type = r->dir[idx].type;
	*offset = r->dir[idx].offset;
	*length = r->dir[idx].length;
	return 0;
}

HALITE_EXPORT int halite_reader_verify_section(struct halite_reader *r, uint32_t idx)
{
	uint8_t *buf = NULL;
	int ret;

	if (idx >= r->ndir)
		return -ERANGE;
	ret = load_section(r, &r->dir[idx], &buf);
	if (!ret)
		free(buf);
	return ret;
}
