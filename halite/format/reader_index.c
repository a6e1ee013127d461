/* SPDX-License-Identifier: MIT */
/*
 * Format 1.1's chunked index, read on first use: open verifies the index
 * section (a checksum per chunk of the mb-map, lb-table and lb-members
 * sections), and each chunk is read, verified and parsed into its place in
 * the same arrays a 1.0 open fills when a lookup first needs it. An LB's
 * member list is checked against the map (the tiling rule, docs/format.md
 * 5.2) the first time it or one of its MBs is looked up.
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
int rd_need_chunk(struct halite_reader *r, struct rchunks *ch, uint64_t c)
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
	ret = rd_read_at(r, buf, len, ch->off + first * ch->esize, name);
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
		int ret = rd_map_entry(r, first + j, halite_get_le64(p + 8 * j), false, &loc);

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
		int ret = rd_lbt_entry(r, first + j, p + j * HLT_LBT_ENTRY_SIZE);

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
int rd_need_members(struct halite_reader *r, uint64_t lb)
{
	struct rlazy *lz = r->lz;
	uint64_t start, expect = 0;
	uint32_t cnt;
	int ret;

	if (!lz || atomic_load_explicit(&lz->lb_ok[lb], memory_order_acquire))
		return 0;
	ret = rd_need_chunk(r, &lz->lbt, lb >> lz->lbt.shift);
	if (ret)
		return ret;
	start = r->lb_first[lb];
	cnt = r->lbs[lb].mb_count; /* start + cnt <= mb_stored: parse_lbt_chunk */
	for (uint64_t k = start >> lz->mem.shift; k <= (start + cnt - 1) >> lz->mem.shift; k++) {
		ret = rd_need_chunk(r, &lz->mem, k);
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
		ret = rd_need_chunk(r, &lz->map, m >> lz->map.shift);
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

void rd_lazy_free(struct halite_reader *r)
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
int rd_parse_index(struct halite_reader *r, uint8_t *p, uint64_t len)
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
int rd_lazy_lookup(struct halite_reader *r, uint64_t mb, struct halite_mb_loc *loc)
{
	struct rlazy *lz = r->lz;
	int ret = rd_need_chunk(r, &lz->map, mb >> lz->map.shift);

	if (ret)
		return ret;
	hlt_mb_decode(r->map[mb], r->lb_shift, loc); /* checked when its chunk came in */
	if (loc->state != HALITE_MB_STORED || mb_ok(lz, mb))
		return 0;
	ret = rd_need_members(r, loc->lb);
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
		ret = rd_need_members(r, lb);
	for (uint64_t c = 0; c < r->lz->map.n && !ret; c++)
		ret = rd_need_chunk(r, &r->lz->map, c);
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
	return ret ? ret : rd_check_stream_seqs(r);
}
