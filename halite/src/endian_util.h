/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library and by tools
 * halite-inspect, halite-cycle, halite-synth and the benchmarks
 * (halite_common). Little-endian load/store for on-disk structures: never
 * cast a struct to or from file bytes; every field goes through these.
 */
#ifndef HALITE_ENDIAN_UTIL_H
#define HALITE_ENDIAN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t halite_get_le16(const void *p)
{
	const uint8_t *b = p;
	return (uint16_t)(b[0] | (uint16_t)b[1] << 8);
}

static inline uint32_t halite_get_le32(const void *p)
{
	const uint8_t *b = p;
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static inline uint64_t halite_get_le64(const void *p)
{
	const uint8_t *b = p;
	return (uint64_t)halite_get_le32(b) | (uint64_t)halite_get_le32(b + 4) << 32;
}

static inline void halite_put_le16(void *p, uint16_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}

static inline void halite_put_le32(void *p, uint32_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
}

static inline void halite_put_le64(void *p, uint64_t v)
{
	halite_put_le32(p, (uint32_t)v);
	halite_put_le32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

static inline int halite_is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/* 1 when all @len bytes at @p are zero. */
static inline int halite_all_zero(const void *p, size_t len)
{
	const uint8_t *b = p;
	return len == 0 || (b[0] == 0 && memcmp(b, b + 1, len - 1) == 0);
}

/*
 * Regions are kept sorted by their first memory block: the index of the last
 * of the @n elements (each @stride bytes, at least one) whose uint64_t at byte
 * @field is <= @key, i.e. the region holding block @key.
 */
static inline uint32_t halite_find_first_mb(const void *base, uint32_t n, size_t stride,
					    size_t field, uint64_t key)
{
	uint32_t lo = 0, hi = n;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		uint64_t v;

		memcpy(&v, (const char *)base + (size_t)mid * stride + field, sizeof(v));
		if (v <= key)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

#define HALITE_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HALITE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HALITE_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
