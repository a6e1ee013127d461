/* SPDX-License-Identifier: MIT */
/* Format v1 helpers shared by the reader and the writer. */
#include <stdio.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "export.h"
#include "layout.h"

uint64_t hlt_hash(const void *p, size_t len, uint64_t seed)
{
	return XXH3_64bits_withSeed(p, len, seed);
}

uint64_t hlt_file_seed(const uint8_t uuid[16])
{
	return XXH3_64bits_withSeed(uuid, 16, 0);
}

int hlt_mb_decode(uint64_t e, unsigned lb_shift, struct halite_mb_loc *loc)
{
	uint64_t mask = ((uint64_t)1 << lb_shift) - 1;
	uint32_t state = e & HLT_MB_STATE_MASK;

	if (state == HLT_MB_STATE_INVALID)
		return -HALITE_E_CORRUPT;
	if (state != HALITE_MB_STORED) {
		if (e >> 2)
			return -HALITE_E_RESERVED;
		*loc = (struct halite_mb_loc){ .state = state };
		return 0;
	}
	*loc = (struct halite_mb_loc){
		.state = HALITE_MB_STORED,
		.compressed = (e & HLT_MB_COMPRESSED) != 0,
		.offset = (uint32_t)((e >> 3) & mask),
		.length = (uint32_t)((e >> (3 + lb_shift)) & mask) + 1,
		.lb = e >> (3 + 2 * lb_shift),
	};
	return 0;
}

int hlt_cmp_offset(const void *a, const void *b, void *key)
{
	const struct hlt_offset_key *k = key;
	uint64_t mask = ((uint64_t)1 << k->lb_shift) - 1;
	uint64_t x = (k->map[*(const uint64_t *)a] >> 3) & mask;
	uint64_t y = (k->map[*(const uint64_t *)b] >> 3) & mask;

	return x < y ? -1 : x > y;
}

HALITE_EXPORT const char *halite_stream_name(uint32_t stream, char *buf, size_t len)
{
	uint32_t index = HALITE_STREAM_INDEX(stream);

	switch (HALITE_STREAM_KIND(stream)) {
	case HALITE_STREAM_VCPU:
		snprintf(buf, len, "vcpu%u", index);
		break;
	case HALITE_STREAM_VIRTUAL:
		snprintf(buf, len, index ? "virtual.%u" : "virtual", index);
		break;
	case HALITE_STREAM_PHYSICAL:
		snprintf(buf, len, index ? "physical.%u" : "physical", index);
		break;
	case HALITE_STREAM_OTHER:
		snprintf(buf, len, index ? "other.%u" : "other", index);
		break;
	default:
		snprintf(buf, len, "kind%u.%u", HALITE_STREAM_KIND(stream), index);
		break;
	}
	return buf;
}

HALITE_EXPORT const char *halite_section_name(uint32_t type)
{
	switch (type) {
	case HALITE_SECTION_REGIONS:
		return "regions";
	case HALITE_SECTION_MB_MAP:
		return "mb-map";
	case HALITE_SECTION_LB_TABLE:
		return "lb-table";
	case HALITE_SECTION_INDEX:
		return "index";
	case HALITE_SECTION_LB_MEMBERS:
		return "lb-members";
	case HALITE_SECTION_VCPUS:
		return "vcpus";
	case HALITE_SECTION_DEVICE_STATE:
		return "device-state";
	case HALITE_SECTION_METADATA:
		return "metadata";
	case HALITE_SECTION_SAVE_STATS:
		return "save-stats";
	}
	return NULL;
}
