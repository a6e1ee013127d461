/* SPDX-License-Identifier: MIT */
/*
 * The reader's checks at open, of what every file has: its header, footer
 * and section directory, and the required sections (regions, LB table, MB
 * map), each length and offset range-checked and each checksum verified
 * before the bytes it covers are parsed; and the reader's error messages.
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
int rfail(struct halite_reader *r, int err, const char *fmt, ...)
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
int rfail_said(struct halite_reader *r, int err, const char *fmt, ...)
{
	char msg[sizeof(r->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return rfail_store(r, err, msg);
}

/* What a file that is not a regular one is: "a directory", ... */
const char *rd_file_kind(mode_t mode)
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

/* Incompatible features this build reads (tests narrow it: reader_test.h). */
static uint64_t known_incompat = HLT_INCOMPAT_KNOWN;

void halite_reader_test_known_incompat(uint64_t mask)
{
	known_incompat = mask;
}

int rd_parse_header(struct halite_reader *r, const uint8_t *h)
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

int rd_read_at(struct halite_reader *r, void *buf, uint64_t len, uint64_t off,
	       const char *what)
{
	int ret = halite_io_read(r->meta_io, buf, len, off);

	if (ret)
		return rfail(r, ret, "%s: reading %s (%llu bytes at offset %llu)", r->path, what,
			     ULL(len), ULL(off));
	return 0;
}

int rd_check_padding(struct halite_reader *r)
{
	uint8_t buf[4096];

	for (uint64_t off = HLT_HDR_SIZE; off < r->info.data_offset;) {
		uint64_t n = HALITE_MIN((uint64_t)sizeof(buf), r->info.data_offset - off);
		int ret = rd_read_at(r, buf, n, off, "header padding");

		if (ret)
			return ret;
		if (!halite_all_zero(buf, n))
			return rfail(r, HALITE_E_RESERVED, "%s: header padding is not zero", r->path);
		off += n;
	}
	return 0;
}

int rd_parse_footer(struct halite_reader *r, const uint8_t *f)
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

int rd_parse_directory(struct halite_reader *r, const uint8_t *d, uint64_t want_sum)
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

/* Read a section whole and verify it. Its length is bounded by the file's. */
int rd_load_section(struct halite_reader *r, const struct rdir *s, uint8_t **out)
{
	const char *name = halite_section_name(s->type) ?: "(unknown)";
	uint8_t *buf = malloc(s->length ? s->length : 1);
	int ret;

	if (!buf)
		return rfail(r, -ENOMEM, "%s: section %s (%llu bytes)", r->path, name,
			     ULL(s->length));
	ret = rd_read_at(r, buf, s->length, s->offset, name);
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


static const char *region_name(const void *base, uint32_t i)
{
	return ((const struct halite_region_info *)base)[i].name;
}

const char *rd_kv_key(const void *base, uint32_t i)
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
int rd_first_duplicate(uint32_t n, const char *(*name)(const void *base, uint32_t i),
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

int rd_parse_regions(struct halite_reader *r, const uint8_t *p, uint64_t len)
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
	dup = rd_first_duplicate(n, region_name, r->regions);
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
int rd_lbt_entry(struct halite_reader *r, uint64_t i, const uint8_t *e)
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
int rd_map_entry(struct halite_reader *r, uint64_t m, uint64_t e, bool lbs_in,
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

int rd_parse_lb_table(struct halite_reader *r, const uint8_t *p, uint64_t len)
{
	uint64_t n = r->info.lb_count;

	if (len / HLT_LBT_ENTRY_SIZE != n || len % HLT_LBT_ENTRY_SIZE)
		return rfail(r, HALITE_E_CORRUPT, "%s: LB table of %llu bytes for %llu blocks",
			     r->path, ULL(len), ULL(n));
	r->lbs = zalloc((n ? n : 1) * sizeof(*r->lbs));
	if (!r->lbs)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		int ret = rd_lbt_entry(r, i, p + i * HLT_LBT_ENTRY_SIZE);

		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Within a stream, seq runs 0, 1, 2, ... in file order. Count per stream with
 * an open-addressing table sized from lb_count (bounded by the file size).
 */
int rd_check_stream_seqs(struct halite_reader *r)
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

int rd_parse_map(struct halite_reader *r, const uint8_t *p, uint64_t len)
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
		int ret = rd_map_entry(r, m, halite_get_le64(p + 8 * m), true, &loc);

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
