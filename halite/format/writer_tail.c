/* SPDX-License-Identifier: MIT */
/*
 * The writer's tail, through one buffer: the sections, the directory and the
 * footer (written last, once every LB it vouches for is written), the 1.1
 * chunked index, and the commit that renames the finished file over the
 * target.
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

struct tail {
	struct halite_writer *w;
	uint8_t *buf;
	size_t len;
	uint64_t off; /* file offset of buf[0] */
	XXH3_state_t hash;
	uint64_t sec_start;
	struct wdirent dir[HLT_MAX_SECTIONS];
	uint32_t ndir;
	/* 1.1: the chunk checksums of the section being written, for the index. */
	struct wchunks *ck;
};

/*
 * Format 1.1's chunked index (docs/format.md 5.7): what the index section
 * says of the mb-map, lb-table and lb-members sections, gathered as they
 * are written.
 */
struct wchunks {
	XXH3_state_t h;
	uint32_t type, esize;
	uint64_t per, in, c; /* entries per chunk, entries in chunk c so far */
	uint64_t *sum;
};

struct windex {
	struct wchunks map, lbt, mem;
	uint64_t *lbt_first; /* first member of each lb-table chunk */
	uint64_t *members;   /* stored MBs by LB, each LB's in offset order */
	uint64_t stored, zero, compressed, bytes;
};

static uint64_t tail_pos(const struct tail *t)
{
	return t->off + t->len;
}

static int tail_flush(struct tail *t)
{
	int ret;

	if (!t->len)
		return 0;
	ret = halite_io_write(t->w->io, t->buf, t->len, t->off);
	if (ret)
		return wfail_io(t->w, ret, "%s: writing sections at offset %llu", t->w->path,
				(unsigned long long)t->off);
	t->off += t->len;
	t->len = 0;
	return 0;
}

static int tail_raw(struct tail *t, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		size_t chunk = HALITE_MIN(n, TAIL_BUF_SIZE - t->len);
		int ret;

		memcpy(t->buf + t->len, b, chunk);
		t->len += chunk;
		b += chunk;
		n -= chunk;
		if (t->len == TAIL_BUF_SIZE) {
			ret = tail_flush(t);
			if (ret)
				return ret;
		}
	}
	return 0;
}

static int tail_put(struct tail *t, const void *p, size_t n)
{
	XXH3_64bits_update(&t->hash, p, n);
	return tail_raw(t, p, n);
}

/*
 * @n whole entries of @esize bytes: tail_put, and with a 1.1 index being
 * gathered (t->ck), into the checksums of the chunks they fall in.
 */
static int tail_entries(struct tail *t, const uint8_t *p, uint64_t n, uint32_t esize)
{
	struct wchunks *k = t->ck;
	int ret = tail_put(t, p, n * esize);

	while (!ret && k && n) {
		uint64_t take = HALITE_MIN(n, k->per - k->in);

		if (!k->in)
			XXH3_64bits_reset_withSeed(&k->h, hlt_chunk_seed(t->w->file_seed, k->type, k->c));
		XXH3_64bits_update(&k->h, p, take * esize);
		k->in += take;
		if (k->in == k->per) {
			k->sum[k->c++] = XXH3_64bits_digest(&k->h);
			k->in = 0;
		}
		n -= take;
		p += take * esize;
	}
	return ret;
}

/* The last, partial chunk's checksum. */
static void chunks_end(struct wchunks *k)
{
	if (k && k->in) {
		k->sum[k->c++] = XXH3_64bits_digest(&k->h);
		k->in = 0;
	}
}

static int tail_zeros(struct tail *t, size_t n, bool hashed)
{
	static const uint8_t zeros[8];

	while (n) {
		size_t c = HALITE_MIN(n, sizeof(zeros));
		int ret = hashed ? tail_put(t, zeros, c) : tail_raw(t, zeros, c);

		if (ret)
			return ret;
		n -= c;
	}
	return 0;
}

static int tail_begin(struct tail *t)
{
	int ret = tail_zeros(t, hlt_pad8(tail_pos(t)) - tail_pos(t), false);

	t->sec_start = tail_pos(t);
	XXH3_64bits_reset_withSeed(&t->hash, t->w->file_seed);
	return ret;
}

static void tail_end(struct tail *t, uint32_t type)
{
	t->dir[t->ndir++] = (struct wdirent){
		.type = type,
		.offset = t->sec_start,
		.length = tail_pos(t) - t->sec_start,
		.checksum = XXH3_64bits_digest(&t->hash),
	};
}

static int put_regions(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_REG_ENTRY_SIZE] = { 0 };
	int ret;

	halite_put_le32(e, w->nregions);
	ret = tail_put(t, e, HLT_REG_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < w->nregions; i++) {
		const struct wregion *r = &w->regions[i];
		size_t nlen = strlen(r->name);

		memset(e, 0, sizeof(e));
		halite_put_le64(e + HLT_REG_GPA, r->gpa);
		halite_put_le64(e + HLT_REG_LENGTH, r->length);
		halite_put_le64(e + HLT_REG_FIRST_MB, r->first_mb);
		halite_put_le16(e + HLT_REG_NAME_LEN, (uint16_t)nlen);
		ret = tail_put(t, e, sizeof(e));
		if (!ret)
			ret = tail_put(t, r->name, nlen);
		if (!ret)
			ret = tail_zeros(t, hlt_pad8(nlen) - nlen, true);
	}
	return ret;
}

/* @n u64 entries (the mb-map, lb-members), little-endian, into the chunks being gathered. */
static int put_u64s(struct tail *t, const uint64_t *v, uint64_t n)
{
	uint8_t chunk[4096];
	int ret = 0;

	for (uint64_t i = 0; !ret && i < n; i += sizeof(chunk) / 8) {
		uint64_t k = HALITE_MIN((uint64_t)sizeof(chunk) / 8, n - i);

		for (uint64_t j = 0; j < k; j++)
			halite_put_le64(chunk + 8 * j, v[i + j]);
		ret = tail_entries(t, chunk, k, 8);
	}
	chunks_end(t->ck);
	return ret;
}

static int put_map(struct tail *t)
{
	return put_u64s(t, t->w->map, t->w->mb_count);
}

static int put_lb_table(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_LBT_ENTRY_SIZE];
	int ret = 0;

	for (uint64_t i = 0; !ret && i < w->lb_count; i++) {
		halite_put_le32(e + HLT_LBT_STREAM, w->lbs[i].stream);
		halite_put_le32(e + HLT_LBT_SEQ, w->lbs[i].seq);
		halite_put_le32(e + HLT_LBT_USED, w->lbs[i].used);
		halite_put_le32(e + HLT_LBT_MB_COUNT, w->lbs[i].mb_count);
		halite_put_le64(e + HLT_LBT_CHECKSUM, w->lbs[i].checksum);
		ret = tail_entries(t, e, 1, sizeof(e));
	}
	chunks_end(t->ck);
	return ret;
}

static int chunks_alloc(struct wchunks *k, uint32_t type, uint64_t per, uint64_t entries)
{
	k->type = type;
	k->per = per;
	k->sum = calloc((entries + per - 1) / per + 1, sizeof(*k->sum));
	return k->sum ? 0 : -ENOMEM;
}

static void index_free(struct windex *x)
{
	free(x->map.sum);
	free(x->lbt.sum);
	free(x->mem.sum);
	free(x->lbt_first);
	free(x->members);
}

/*
 * What a 1.1 index needs beyond the map and LB table: the totals, and each
 * LB's members in offset order (the seal that packed them is long gone).
 */
static int index_build(struct halite_writer *w, struct windex *x)
{
	uint64_t *fill, nlbt = (w->lb_count + HLT_LBT_CHUNK - 1) / HLT_LBT_CHUNK, at = 0;
	struct hlt_offset_key key = { w->map, w->lb_shift };

	for (uint64_t m = 0; m < w->mb_count; m++) {
		struct halite_mb_loc loc;

		hlt_mb_decode(w->map[m], w->lb_shift, &loc);
		x->zero += loc.state == HALITE_MB_ZERO;
		if (loc.state != HALITE_MB_STORED)
			continue;
		x->stored++;
		x->compressed += loc.compressed;
		x->bytes += loc.length;
	}
	x->members = malloc((x->stored + 1) * sizeof(*x->members));
	x->lbt_first = calloc(nlbt + 1, sizeof(*x->lbt_first));
	fill = malloc((w->lb_count + 1) * sizeof(*fill));
	if (!x->members || !x->lbt_first || !fill ||
	    chunks_alloc(&x->map, HALITE_SECTION_MB_MAP, HLT_MAP_CHUNK, w->mb_count) ||
	    chunks_alloc(&x->lbt, HALITE_SECTION_LB_TABLE, HLT_LBT_CHUNK, w->lb_count) ||
	    chunks_alloc(&x->mem, HALITE_SECTION_LB_MEMBERS, HLT_MEM_CHUNK, x->stored)) {
		free(fill);
		return wfail_io(w, -ENOMEM, "chunked index of %llu memory blocks",
				(unsigned long long)w->mb_count);
	}
	for (uint64_t i = 0; i < w->lb_count; i++) {
		if (i % HLT_LBT_CHUNK == 0)
			x->lbt_first[i / HLT_LBT_CHUNK] = at;
		fill[i] = at;
		at += w->lbs[i].mb_count;
	}
	for (uint64_t m = 0; m < w->mb_count; m++)
		if ((w->map[m] & HLT_MB_STATE_MASK) == HALITE_MB_STORED)
			x->members[fill[w->map[m] >> (3 + 2 * w->lb_shift)]++] = m;
	for (uint64_t i = 0; i < w->lb_count; i++)
		qsort_r(x->members + fill[i] - w->lbs[i].mb_count, w->lbs[i].mb_count,
			sizeof(*x->members), hlt_cmp_offset, &key);
	free(fill);
	return 0;
}

static int put_members(struct tail *t, const struct windex *x)
{
	return put_u64s(t, x->members, x->stored);
}

static int put_index(struct tail *t, const struct windex *x)
{
	uint8_t h[HLT_IDX_HDR_SIZE] = { 0 }, e[HLT_IDX_LBT_ENTRY];
	int ret;

	halite_put_le32(h + HLT_IDX_MAP_CHUNK, HLT_MAP_CHUNK);
	halite_put_le32(h + HLT_IDX_LBT_CHUNK, HLT_LBT_CHUNK);
	halite_put_le32(h + HLT_IDX_MEM_CHUNK, HLT_MEM_CHUNK);
	halite_put_le64(h + HLT_IDX_MB_STORED, x->stored);
	halite_put_le64(h + HLT_IDX_MB_ZERO, x->zero);
	halite_put_le64(h + HLT_IDX_MB_COMPRESSED, x->compressed);
	halite_put_le64(h + HLT_IDX_STORED_BYTES, x->bytes);
	ret = tail_put(t, h, sizeof(h));
	for (uint64_t c = 0; !ret && c < x->map.c; c++) {
		halite_put_le64(e, x->map.sum[c]);
		ret = tail_put(t, e, HLT_IDX_MAP_ENTRY);
	}
	for (uint64_t c = 0; !ret && c < x->lbt.c; c++) {
		halite_put_le64(e, x->lbt_first[c]);
		halite_put_le64(e + 8, x->lbt.sum[c]);
		ret = tail_put(t, e, HLT_IDX_LBT_ENTRY);
	}
	for (uint64_t c = 0; !ret && c < x->mem.c; c++) {
		halite_put_le64(e, x->mem.sum[c]);
		ret = tail_put(t, e, HLT_IDX_MEM_ENTRY);
	}
	return ret;
}

static int put_vcpus(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_VCPU_ROOT_SIZE];
	int ret;

	halite_put_le32(e, w->vcpu_count);
	halite_put_le32(e + 4, w->nroots);
	ret = tail_put(t, e, HLT_VCPU_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < w->nroots; i++) {
		halite_put_le32(e, w->roots[i].vcpu);
		halite_put_le32(e + 4, w->roots[i].mode);
		halite_put_le64(e + 8, w->roots[i].cr3);
		ret = tail_put(t, e, sizeof(e));
	}
	return ret;
}

static int put_kvs(struct tail *t, const struct wkvs *kvs)
{
	uint8_t e[HLT_KV_ENTRY_HDR] = { 0 };
	int ret;

	halite_put_le32(e, kvs->n);
	ret = tail_put(t, e, HLT_KV_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < kvs->n; i++) {
		size_t klen = strlen(kvs->v[i].key);
		size_t n = klen + kvs->v[i].len;

		memset(e, 0, sizeof(e));
		halite_put_le16(e, (uint16_t)klen);
		halite_put_le32(e + 4, kvs->v[i].len);
		ret = tail_put(t, e, sizeof(e));
		if (!ret)
			ret = tail_put(t, kvs->v[i].key, klen);
		if (!ret)
			ret = tail_put(t, kvs->v[i].value, kvs->v[i].len);
		if (!ret)
			ret = tail_zeros(t, hlt_pad8(n) - n, true);
	}
	return ret;
}

static int put_section(struct tail *t, uint32_t type, int (*fn)(struct tail *t, const void *arg),
		       const void *arg)
{
	int ret = tail_begin(t);

	if (!ret)
		ret = fn(t, arg);
	if (!ret)
		tail_end(t, type);
	return ret;
}

static int fn_regions(struct tail *t, const void *arg) { return put_regions(t); }
static int fn_map(struct tail *t, const void *arg) { return put_map(t); }
static int fn_lbt(struct tail *t, const void *arg) { return put_lb_table(t); }
static int fn_vcpus(struct tail *t, const void *arg) { return put_vcpus(t); }
static int fn_kvs(struct tail *t, const void *arg) { return put_kvs(t, arg); }
static int fn_members(struct tail *t, const void *arg) { return put_members(t, arg); }
static int fn_index(struct tail *t, const void *arg) { return put_index(t, arg); }

static int fn_device(struct tail *t, const void *arg)
{
	return tail_put(t, t->w->device_state, t->w->device_state_len);
}

static int put_dir_footer(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_DIR_ENTRY_SIZE], f[HLT_FTR_SIZE] = { 0 };
	uint64_t dir_off;
	int ret;

	ret = tail_begin(t);
	dir_off = tail_pos(t);
	for (uint32_t i = 0; !ret && i < t->ndir; i++) {
		memset(e, 0, sizeof(e));
		halite_put_le32(e + HLT_DIR_TYPE, t->dir[i].type);
		halite_put_le64(e + HLT_DIR_OFFSET, t->dir[i].offset);
		halite_put_le64(e + HLT_DIR_LENGTH, t->dir[i].length);
		halite_put_le64(e + HLT_DIR_CHECKSUM, t->dir[i].checksum);
		ret = tail_put(t, e, sizeof(e));
	}
	if (ret)
		return ret;
	memcpy(f, HLT_FTR_MAGIC, 8);
	memcpy(f + HLT_FTR_UUID, w->uuid, 16);
	halite_put_le64(f + HLT_FTR_LB_COUNT, w->lb_count);
	halite_put_le64(f + HLT_FTR_DIR_OFFSET, dir_off);
	halite_put_le32(f + HLT_FTR_SECTION_COUNT, t->ndir);
	halite_put_le64(f + HLT_FTR_DIR_CHECKSUM, XXH3_64bits_digest(&t->hash));
	halite_put_le64(f + HLT_FTR_CHECKSUM, hlt_hash(f, HLT_FTR_CHECKSUM, 0));
	/* The footer goes out in its own write, after everything it vouches for. */
	ret = tail_flush(t);
	if (!ret)
		ret = tail_raw(t, f, sizeof(f));
	if (!ret)
		ret = tail_flush(t);
	return ret;
}

/*
 * The new name must survive a crash too. Past the rename the file is
 * complete and in place, so a failure here is a warning, not a failed save
 * (a caller would remove or report a snapshot that is there); EINVAL is a
 * file system that has nothing to sync for directories.
 */
static void sync_dir(struct halite_writer *w)
{
	char *copy = strdup(w->path);
	int fd, err = ENOMEM;

	if (copy) {
		fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		err = fd < 0 ? errno : fsync(fd) ? errno : 0;
		if (fd >= 0)
			close(fd);
		free(copy);
	}
	if (err && err != EINVAL)
		halite_logf(&w->log, HALITE_LOG_WARN, "%s: syncing its directory: %s (the file "
			    "is complete; a crash now could lose its new name)", w->path,
			    strerror(err));
}

/*
 * Put the complete file in the target's place. fdatasync comes first: after
 * a crash the target's name must never point at a file whose blocks did not
 * reach the disk. Until the rename, every failure leaves the target as it was.
 */
static int commit(struct halite_writer *w)
{
	int ret;

	if (!(w->flags & HALITE_WRITER_NO_SYNC)) {
		ret = halite_io_sync(w->io);
		if (ret)
			return wfail_io(w, ret, "%s: fdatasync", w->path);
	}
	/*
	 * A restore that opened the older file since create checked keeps
	 * reading it (its inode): the complete new snapshot is not given up.
	 */
	if (rename(w->tmp_path, w->path))
		return wfail_io(w, -errno, "%s: renaming the new file over it", w->path);
	free(w->tmp_path);
	w->tmp_path = NULL;
	w->state = W_FINISHED;
	if (!(w->flags & HALITE_WRITER_NO_SYNC))
		sync_dir(w);
	return 0;
}

HALITE_EXPORT int halite_writer_finish(struct halite_writer *w)
{
	struct tail t = { .w = w };
	struct windex x = { 0 };
	int ret = 0, fd;

	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	for (uint32_t i = 0; !ret && i < w->nstreams; i++)
		ret = wr_seal(w, &w->streams[i]);
	/* The tail goes after the LBs, and the footer after all it vouches for. */
	if (!ret)
		ret = wr_lb_drain(w);
	if (ret)
		return ret;
	/* Sections are not block sized: leave O_DIRECT for the tail. */
	fd = halite_io_fd(w->io);
	if ((w->flags & HALITE_WRITER_DIRECT) &&
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT))
		return wfail_io(w, -errno, "%s: clearing O_DIRECT", w->path);
	t.buf = malloc(TAIL_BUF_SIZE);
	if (!t.buf)
		return wfail_io(w, -ENOMEM, "section buffer");
	t.off = HLT_DATA_OFFSET + w->lb_count * w->lb_size;

	if (!v1_0(w))
		ret = index_build(w, &x);
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_REGIONS, fn_regions, NULL);
	t.ck = v1_0(w) ? NULL : &x.map;
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_MB_MAP, fn_map, NULL);
	t.ck = v1_0(w) ? NULL : &x.lbt;
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_LB_TABLE, fn_lbt, NULL);
	t.ck = &x.mem;
	if (!ret && !v1_0(w))
		ret = put_section(&t, HALITE_SECTION_LB_MEMBERS, fn_members, &x);
	t.ck = NULL;
	if (!ret && !v1_0(w))
		ret = put_section(&t, HALITE_SECTION_INDEX, fn_index, &x);
	if (!ret && (w->vcpu_count || w->nroots))
		ret = put_section(&t, HALITE_SECTION_VCPUS, fn_vcpus, NULL);
	if (!ret && w->has_device_state)
		ret = put_section(&t, HALITE_SECTION_DEVICE_STATE, fn_device, NULL);
	if (!ret && w->meta.n)
		ret = put_section(&t, HALITE_SECTION_METADATA, fn_kvs, &w->meta);
	if (!ret && w->stats.n)
		ret = put_section(&t, HALITE_SECTION_SAVE_STATS, fn_kvs, &w->stats);
	if (!ret)
		ret = put_dir_footer(&t);
	free(t.buf);
	index_free(&x);
	return ret ? ret : commit(w);
}
