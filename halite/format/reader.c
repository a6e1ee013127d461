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
 * Format 1.1 files (chunked index) open in time independent of memory size
 * (reader_index.c).
 *
 * This file opens a reader (the files, then every section validated:
 * reader_sections.c for those every file has, the optional ones here) and
 * answers what open found; reader_lb.c reads locality blocks.
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
#include "reader_io.h"
#include "reader_test.h"
#include "zalloc.h"

#include "reader_int.h"

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
	dup = rd_first_duplicate(n, rd_kv_key, kv->v);
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
		ret = rd_load_section(r, s, &buf);
		if (ret)
			return ret;
		switch (s->type) {
		case HALITE_SECTION_REGIONS:
			ret = rd_parse_regions(r, buf, s->length);
			break;
		case HALITE_SECTION_INDEX:
			ret = rd_parse_index(r, buf, s->length);
			continue;
		case HALITE_SECTION_LB_TABLE:
			ret = rd_parse_lb_table(r, buf, s->length);
			if (!ret)
				ret = rd_check_stream_seqs(r);
			break;
		case HALITE_SECTION_MB_MAP:
			ret = rd_parse_map(r, buf, s->length);
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

/*
 * An object of an S3 store (s3://) is read with ranged GETs of the version
 * its HEAD saw (io_s3.c). Opening reads the header, the footer, the
 * directory and the sections, each a request if nothing is kept: the head
 * and the tail of the object are fetched first in one GET each (one for a
 * small object), and, once the directory says where the sections start,
 * whatever of them lies below the tail in one more (rd_readahead_sections()).
 * RD_TAIL_RA covers a small file's footer, directory and sections;
 * RD_SECTIONS_RA_MAX bounds what open fetches beyond that.
 */
#define RD_HEAD_RA ((uint64_t)4096)
#define RD_TAIL_RA ((uint64_t)64 << 10)
#define RD_SECTIONS_RA_MAX ((uint64_t)16 << 20)

static int rd_readahead_ends(struct halite_reader *r)
{
	uint64_t size = r->info.file_size;
	int ret;

	if (size <= RD_HEAD_RA + RD_TAIL_RA)
		return halite_io_readahead(r->meta_io, 0, size);
	ret = halite_io_readahead(r->meta_io, 0, RD_HEAD_RA);
	if (!ret)
		ret = halite_io_readahead(r->meta_io, size - RD_TAIL_RA, RD_TAIL_RA);
	return ret;
}

/* The sections open reads, from the lowest to the tail already kept, in one GET. */
static int rd_readahead_sections(struct halite_reader *r)
{
	uint64_t size = r->info.file_size, tail, lo = UINT64_MAX;
	bool chunked = find_dir(r, HALITE_SECTION_INDEX) != NULL;

	if (halite_io_fd(r->meta_io) >= 0 || size <= RD_HEAD_RA + RD_TAIL_RA)
		return 0;
	tail = size - RD_TAIL_RA;
	for (uint32_t i = 0; i < r->ndir; i++) {
		const struct rdir *s = &r->dir[i];

		/* A 1.1 file's index comes in chunk by chunk, on use. */
		if (chunked && (s->type == HALITE_SECTION_LB_TABLE ||
				s->type == HALITE_SECTION_MB_MAP ||
				s->type == HALITE_SECTION_LB_MEMBERS))
			continue;
		if (s->length && s->offset < lo)
			lo = s->offset;
	}
	if (lo >= tail || tail - lo > RD_SECTIONS_RA_MAX)
		return 0;
	return halite_io_readahead(r->meta_io, lo, tail - lo);
}

static int open_files(struct halite_reader *r, const struct halite_reader_opts *o)
{
	HALITE_OPTS(halite_io_opts, io_opts);
	struct stat st;
	int ret;

	io_opts.backend = HALITE_IO_PSYNC;
	/* The version another reader of the path read, and what it fetched at open. */
	if (o->same_as && o->same_as->meta_io && !strcmp(o->same_as->path, r->path)) {
		ret = halite_io_reopen(&r->meta_io, o->same_as->meta_io, r->path,
				       O_RDONLY | O_CLOEXEC, &io_opts);
		if (!ret)
			ret = halite_io_share_kept(r->meta_io, o->same_as->meta_io);
	} else {
		ret = halite_io_open(&r->meta_io, r->path, O_RDONLY | O_CLOEXEC, 0, &io_opts);
	}
	if (ret && halite_io_is_s3_path(r->path) && halite_io_open_errmsg()[0])
		/* The store's or the configuration's own sentence names the problem. */
		return rfail_said(r, ret, "%s: cannot open: %s", r->path, halite_io_open_errmsg());
	if (ret)
		return rfail(r, ret, "%s: cannot open", r->path);
	if (halite_io_fd(r->meta_io) < 0) {
		/* An object: its size is the HEAD's. */
		ret = halite_io_size(r->meta_io, &r->info.file_size);
		if (ret)
			return rfail(r, ret, "%s: size", r->path);
	} else {
		if (fstat(halite_io_fd(r->meta_io), &st))
			return rfail(r, -errno, "%s: fstat", r->path);
		if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
			return rfail_said(r, -EINVAL, "%s: not a regular file (%s)", r->path,
					  rd_file_kind(st.st_mode));
		r->info.file_size = (uint64_t)st.st_size;
	}
	io_opts.flags = (o->flags & HALITE_READER_DIRECT) ? HALITE_IO_DIRECT : 0;
	io_opts.read_latency_us = o->read_latency_us;
	ret = halite_io_reopen(&r->lb_io, r->meta_io, r->path, O_RDONLY | O_CLOEXEC, &io_opts);
	if (ret)
		return rfail(r, ret, "%s: cannot open for locality-block reads%s", r->path,
			     io_opts.flags ? " (O_DIRECT)" : "");
	if (halite_io_fd(r->meta_io) < 0) {
		ret = rd_readahead_ends(r);
		if (ret)
			return rfail(r, ret, "%s: reading its head and tail", r->path);
	}
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

		if (size < 8 || rd_read_at(r, m, 8, 0, "magic") || memcmp(m, HLT_HDR_MAGIC, 8))
			return size ? rfail_said(r, HALITE_E_BAD_MAGIC, "%s: not a Halite snapshot "
						 "(it does not start with a Halite header)", r->path) :
				rfail_said(r, HALITE_E_BAD_MAGIC, "%s: not a Halite snapshot (empty file)",
					   r->path);
		return rfail_said(r, HALITE_E_TRUNCATED, "%s: incomplete: %llu bytes, shorter "
				  "than a Halite header; it cannot be restored", r->path, ULL(size));
	}
	ret = rd_read_at(r, hdr, sizeof(hdr), 0, "header");
	if (!ret)
		ret = rd_parse_header(r, hdr);
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
	ret = rd_read_at(r, ftr, sizeof(ftr), size - HLT_FTR_SIZE, "footer");
	if (!ret)
		ret = rd_parse_footer(r, ftr);
	if (!ret)
		ret = rd_check_padding(r);
	if (!ret)
		ret = rd_read_at(r, dir, (size_t)r->ndir * HLT_DIR_ENTRY_SIZE, r->dir_off, "directory");
	if (!ret)
		ret = rd_parse_directory(r, dir, halite_get_le64(ftr + HLT_FTR_DIR_CHECKSUM));
	if (!ret) {
		ret = rd_readahead_sections(r);
		if (ret)
			return rfail(r, ret, "%s: reading its sections", r->path);
		ret = load_sections(r);
	}
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
	if (!ret)
		/* Valid through its footer: its uuid may key the host's LB cache (io.h). */
		halite_io_cache_key(r->meta_io, r->info.uuid);
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

HALITE_EXPORT void halite_reader_store_stats(const struct halite_reader *r,
					    struct halite_store_stats *st)
{
	halite_io_store_stats(r->meta_io, st);
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
	rd_lazy_free(r);
	free(r->device_state);
	free(r->roots);
	kvs_free(&r->meta);
	kvs_free(&r->stats);
	pthread_mutex_destroy(&r->err_lock);
	free(r->path);
	free(r);
}

struct halite_io *halite_reader_io(const struct halite_reader *r)
{
	return r->meta_io;
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

HALITE_EXPORT int halite_reader_meta_find(const struct halite_reader *r, const char *key,
					  const void **value, uint32_t *len)
{
	/* The reader refused a file with a key twice: the first is the only one. */
	for (uint32_t i = 0; i < r->meta.n; i++)
		if (!strcmp(r->meta.v[i].key, key)) {
			*value = r->meta.v[i].value;
			*len = r->meta.v[i].len;
			return 0;
		}
	return -HALITE_E_NOT_FOUND;
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
	ret = rd_load_section(r, &r->dir[idx], &buf);
	if (!ret)
		free(buf);
	return ret;
}
