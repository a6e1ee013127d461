/* SPDX-License-Identifier: MIT */
/*
 * Memory-block codecs. Each memory block is compressed on its own so that a
 * restore decompresses exactly the block that faulted (paper, section 6).
 *
 * The numeric values are the codec ids stored in the file header
 * (docs/format.md); 0 means "the default" in options structs and is never
 * stored.
 */
#ifndef HALITE_CODEC_H
#define HALITE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum halite_codec {
	HALITE_CODEC_DEFAULT = 0, /* options only: lz4 */
	HALITE_CODEC_NONE = 1,
	HALITE_CODEC_LZ4 = 2,
	HALITE_CODEC_ZLIB = 3,
	HALITE_CODEC_ZSTD = 4,
	HALITE_CODEC_MAX,
};

/* "none", "lz4", "zlib", "zstd"; NULL for an unknown id. Thread-safe. */
const char *halite_codec_name(int codec);

/* Codec id for @name (as above), or -HALITE_E_NO_CODEC. */
int halite_codec_parse(const char *name);

/*
 * The levels @codec accepts (0, the default, always is one): lz4 -128 .. 12
 * (negative: the lz4 CLI's --fast=N; 3 and up: LZ4 HC), zlib 0 .. 9,
 * zstd -128 .. 22 (negative: its fast modes), none 0 .. 0. The file header
 * stores the level in one signed byte. 0, or -HALITE_E_NO_CODEC.
 */
int halite_codec_level_range(int codec, int *min, int *max);

/*
 * Compress @src_len bytes into @dst (capacity @dst_cap) at @level (0 = the
 * codec's default). Returns the compressed length, or -HALITE_E_LIMIT when the
 * result would not be smaller than @src_len or not fit in @dst_cap: the caller
 * then stores the block raw. Thread-safe: no shared state.
 */
int halite_compress(int codec, int level, const void *src, size_t src_len,
		    void *dst, size_t dst_cap);

/*
 * Decompress @src_len bytes into exactly @dst_len bytes at @dst. Returns 0, or
 * -HALITE_E_CODEC when the input is malformed or does not decode to exactly
 * @dst_len bytes; never reads or writes outside the given buffers, whatever
 * the input. Thread-safe.
 */
int halite_decompress(int codec, const void *src, size_t src_len, void *dst,
		      size_t dst_len);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_CODEC_H */
