/* SPDX-License-Identifier: MIT */
/*
 * Private: the byte layout of format v1, as tabled in docs/format.md. Every
 * offset the reader and writer use is named here and nowhere else.
 */
#ifndef HALITE_FORMAT_LAYOUT_H
#define HALITE_FORMAT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include <halite/format.h>

/* Header (docs/format.md section 3). */
#define HLT_HDR_MAGIC "\x89HLT\r\n\x1a\n"
#define HLT_HDR_SIZE 128u
#define HLT_HDR_VERSION_MAJOR 8
#define HLT_HDR_VERSION_MINOR 10
#define HLT_HDR_HEADER_SIZE 12
#define HLT_HDR_INCOMPAT 16
#define HLT_HDR_COMPAT 24
#define HLT_HDR_PAGE_SIZE 32
#define HLT_HDR_MB_PAGES 36
#define HLT_HDR_LB_SIZE 40
#define HLT_HDR_CODEC 44
#define HLT_HDR_CODEC_LEVEL 45
#define HLT_HDR_RESERVED0 46 /* 2 bytes */
#define HLT_HDR_DATA_OFFSET 48
#define HLT_HDR_UUID 56
#define HLT_HDR_CREATED 72
#define HLT_HDR_RESERVED1 80 /* 40 bytes */
#define HLT_HDR_RESERVED1_LEN 40u
#define HLT_HDR_CHECKSUM 120

/* Files this version writes put the first locality block here. */
#define HLT_DATA_OFFSET 4096u
#define HLT_DATA_ALIGN 4096u

/* Footer (section 4). */
#define HLT_FTR_MAGIC "HLTFOOT1"
#define HLT_FTR_SIZE 64u
#define HLT_FTR_UUID 8
#define HLT_FTR_LB_COUNT 24
#define HLT_FTR_DIR_OFFSET 32
#define HLT_FTR_SECTION_COUNT 40
#define HLT_FTR_RESERVED 44
#define HLT_FTR_DIR_CHECKSUM 48
#define HLT_FTR_CHECKSUM 56

/* Section directory (section 5). */
#define HLT_DIR_ENTRY_SIZE 32u
#define HLT_DIR_TYPE 0
#define HLT_DIR_RESERVED 4
#define HLT_DIR_OFFSET 8
#define HLT_DIR_LENGTH 16
#define HLT_DIR_CHECKSUM 24
#define HLT_MIN_SECTIONS 3u
#define HLT_MAX_SECTIONS 64u

/* regions (5.1) */
#define HLT_REG_HDR_SIZE 8u
#define HLT_REG_ENTRY_SIZE 32u
#define HLT_REG_GPA 0
#define HLT_REG_LENGTH 8
#define HLT_REG_FIRST_MB 16
#define HLT_REG_NAME_LEN 24
#define HLT_REG_RESERVED 26 /* 6 bytes */
#define HLT_MAX_REGIONS 65536u

/* lb-table (5.3) */
#define HLT_LBT_ENTRY_SIZE 24u
#define HLT_LBT_STREAM 0
#define HLT_LBT_SEQ 4
#define HLT_LBT_USED 8
#define HLT_LBT_MB_COUNT 12
#define HLT_LBT_CHECKSUM 16

/*
 * Format 1.1's chunked index (5.7, 5.8). Files with the flag carry the index
 * and lb-members sections; the mb-map, lb-table and lb-members sections are
 * read and verified chunk by chunk on first use, not at open.
 */
#define HLT_INCOMPAT_CHUNKED_INDEX 0x1ull
#define HLT_INCOMPAT_KNOWN HLT_INCOMPAT_CHUNKED_INDEX
#define HLT_IDX_MAP_CHUNK 0    /* u32: entries per mb-map chunk */
#define HLT_IDX_LBT_CHUNK 4    /* u32: entries per lb-table chunk */
#define HLT_IDX_MEM_CHUNK 8    /* u32: entries per lb-members chunk */
#define HLT_IDX_RESERVED 12    /* u32 */
#define HLT_IDX_MB_STORED 16
#define HLT_IDX_MB_ZERO 24
#define HLT_IDX_MB_COMPRESSED 32
#define HLT_IDX_STORED_BYTES 40
#define HLT_IDX_HDR_SIZE 48u
#define HLT_IDX_MAP_ENTRY 8u   /* checksum */
#define HLT_IDX_LBT_ENTRY 16u  /* u64 first member, checksum */
#define HLT_IDX_MEM_ENTRY 8u   /* checksum */
#define HLT_IDX_MIN_CHUNK 64u
#define HLT_IDX_MAX_CHUNK (1u << 20)
/* What this writer uses: 64 KiB mb-map and lb-members chunks, 48 KiB lb-table chunks. */
#define HLT_MAP_CHUNK 8192u
#define HLT_LBT_CHUNK 2048u
#define HLT_MEM_CHUNK 8192u

/* Seed of chunk @c of section @type: unlike any other chunk's or LB's of the file. */
static inline uint64_t hlt_chunk_seed(uint64_t file_seed, uint32_t type, uint64_t c)
{
	return file_seed + ((uint64_t)type << 48) + c;
}

/* vcpus (5.4) */
#define HLT_VCPU_HDR_SIZE 8u
#define HLT_VCPU_ROOT_SIZE 16u

/* metadata and save-stats (5.6) */
#define HLT_KV_HDR_SIZE 8u
#define HLT_KV_ENTRY_HDR 8u
#define HLT_MAX_KV 65536u
#define HLT_MAX_KV_VALUE (1u << 20)

#define HLT_MAX_PAGE_SIZE (4u << 20)
#define HLT_MAX_MB_PAGES 1024u

static inline uint64_t hlt_pad8(uint64_t v)
{
	return (v + 7) & ~(uint64_t)7;
}

/* MB map entries (5.2). */
#define HLT_MB_STATE_MASK 0x3u
#define HLT_MB_STATE_INVALID 3u
#define HLT_MB_COMPRESSED 0x4u

/* lb_shift = log2(lb_size). */
static inline uint64_t hlt_mb_max_lbs(unsigned lb_shift)
{
	return (uint64_t)1 << (61 - 2 * lb_shift);
}

static inline uint64_t hlt_mb_encode_stored(unsigned lb_shift, uint64_t lb, uint32_t offset,
					    uint32_t length, int compressed)
{
	return HALITE_MB_STORED | (compressed ? HLT_MB_COMPRESSED : 0) |
	       (uint64_t)offset << 3 | (uint64_t)(length - 1) << (3 + lb_shift) |
	       lb << (3 + 2 * lb_shift);
}

/*
 * Decode an entry's fields without judging them against the file (the reader
 * does that): 0, or -HALITE_E_CORRUPT for state 3, -HALITE_E_RESERVED for
 * bits set in a zero/untouched entry.
 */
int hlt_mb_decode(uint64_t e, unsigned lb_shift, struct halite_mb_loc *loc);

/* qsort_r order of MB indices by their map entries' offsets in the LB (stored MBs). */
struct hlt_offset_key {
	const uint64_t *map;
	unsigned lb_shift;
};
int hlt_cmp_offset(const void *a, const void *b, void *key);

/* XXH3(uuid, 0): the seed of every LB, section and directory checksum. */
uint64_t hlt_file_seed(const uint8_t uuid[16]);
uint64_t hlt_hash(const void *p, size_t len, uint64_t seed);

/* Number of MBs in a region of @length bytes. */
static inline uint64_t hlt_region_mbs(uint64_t length, uint32_t mb_size)
{
	return length / mb_size + (length % mb_size != 0);
}

#endif
