// SPDX-License-Identifier: MIT
/*
 * Memory-block codecs.
 *
 * Every block is a self-contained unit in the codec's own standard format:
 * an LZ4 block (no frame), a zlib stream (RFC 1950, with its Adler-32), or a
 * zstd frame (content size recorded, no content checksum: the file format
 * checksums what is stored). Blocks are small (a few pages) and both sides
 * know the exact decompressed size, so decompression is one shot into the
 * caller's buffer with an exact size check.
 *
 * Levels, 0 always meaning the codec's default:
 *   lz4   <= 2: LZ4_compress_fast, acceleration -level when negative (as the
 *              lz4 CLI's --fast=N), else 1; >= 3: LZ4 HC at min(level, 12),
 *              which is where the lz4 CLI switches to HC too.
 *   zlib  1..9 (larger values clamp to 9, negative to 1); 0 = 6.
 *   zstd  passed through (negative = fast modes); 0 = 3.
 * The writer takes only halite_codec_level_range()'s; the clamps above are
 * for callers of halite_compress() itself.
 *
 * Contexts: zstd and zlib contexts and the LZ4 HC state are 100-300 KiB
 * each, which a per-call malloc/free would set up again for every block, so
 * each thread keeps its own in a pthread key and reuses them; they are freed
 * when the thread exits. Nothing is shared between threads. Cost: a thread
 * that used every codec on 4-8 KiB blocks at default levels holds about
 * 0.8 MiB (zstd CCtx 150 KiB + DCtx 95 KiB, deflate 270 KiB, inflate 40 KiB,
 * LZ4 HC 260 KiB) until it exits; zstd contexts grow to ~1.3 MiB for large
 * inputs, and zstd itself shrinks a context that stays oversized. If the key
 * cannot be created, each call allocates and frees its own contexts.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <lz4hc.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <halite/codec.h>
#include <halite/errors.h>

#include "export.h"

/* The API returns lengths as int; lz4 also caps at LZ4_MAX_INPUT_SIZE. */
#define CODEC_MAX_LEN ((size_t)LZ4_MAX_INPUT_SIZE)

struct codec_ctx {
	ZSTD_CCtx *zc;
	ZSTD_DCtx *zd;
	void *lz4hc;
	z_stream def;
	z_stream inf;
	int def_level; /* 0: def not initialized */
	int inf_ready;
};

static pthread_key_t codec_key;
static int codec_key_err;
static pthread_once_t codec_once = PTHREAD_ONCE_INIT;

static void codec_ctx_free(void *p)
{
	struct codec_ctx *c = p;

	if (!c)
		return;
	ZSTD_freeCCtx(c->zc);
	ZSTD_freeDCtx(c->zd);
	free(c->lz4hc);
	if (c->def_level)
		deflateEnd(&c->def);
	if (c->inf_ready)
		inflateEnd(&c->inf);
	free(c);
}

static void codec_key_init(void)
{
	codec_key_err = pthread_key_create(&codec_key, codec_ctx_free);
}

/*
 * This thread's contexts; *tmp is set when they are a one-off that the caller
 * must free with codec_ctx_free().
 */
static struct codec_ctx *codec_ctx_get(int *tmp)
{
	struct codec_ctx *c;

	*tmp = 0;
	pthread_once(&codec_once, codec_key_init);
	if (!codec_key_err) {
		c = pthread_getspecific(codec_key);
		if (c)
			return c;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (codec_key_err || pthread_setspecific(codec_key, c))
		*tmp = 1;
	return c;
}

static void codec_ctx_put(struct codec_ctx *c, int tmp)
{
	if (tmp)
		codec_ctx_free(c);
}

HALITE_EXPORT const char *halite_codec_name(int codec)
{
	switch (codec) {
	case HALITE_CODEC_NONE:
		return "none";
	case HALITE_CODEC_LZ4:
		return "lz4";
	case HALITE_CODEC_ZLIB:
		return "zlib";
	case HALITE_CODEC_ZSTD:
		return "zstd";
	}
	return NULL;
}

HALITE_EXPORT int halite_codec_parse(const char *name)
{
	int c;

	if (!name)
		return -HALITE_E_NO_CODEC;
	for (c = HALITE_CODEC_NONE; c < HALITE_CODEC_MAX; c++)
		if (!strcmp(name, halite_codec_name(c)))
			return c;
	return -HALITE_E_NO_CODEC;
}

HALITE_EXPORT int halite_codec_level_range(int codec, int *min, int *max)
{
	int lo = 0, hi = 0;

	switch (codec) {
	case HALITE_CODEC_NONE:
		break;
	case HALITE_CODEC_LZ4:
		lo = -128;
		hi = LZ4HC_CLEVEL_MAX;
		break;
	case HALITE_CODEC_ZLIB:
		hi = Z_BEST_COMPRESSION;
		break;
	case HALITE_CODEC_ZSTD:
		lo = -128;
		hi = ZSTD_maxCLevel();
		break;
	default:
		return -HALITE_E_NO_CODEC;
	}
	if (min)
		*min = lo;
	if (max)
		*max = hi;
	return 0;
}

static int lz4_compress(struct codec_ctx *c, int level, const void *src, int src_len,
			void *dst, int cap)
{
	int n;

	if (level < 3) {
		/*
		 * LZ4_compress_fast keeps its 16 KiB state on the stack and
		 * caps acceleration at 65537 itself; bound it first so that
		 * negating INT_MIN cannot overflow.
		 */
		int accel = level < -65537 ? 65537 : level < 0 ? -level : 1;

		n = LZ4_compress_fast(src, dst, src_len, cap, accel);
	} else {
		if (!c->lz4hc) {
			c->lz4hc = malloc((size_t)LZ4_sizeofStateHC());
			if (!c->lz4hc)
				return -ENOMEM;
		}
		n = LZ4_compress_HC_extStateHC(c->lz4hc, src, dst, src_len, cap,
					       level > LZ4HC_CLEVEL_MAX ? LZ4HC_CLEVEL_MAX : level);
	}
	/* 0 is LZ4's "did not fit" */
	return n > 0 ? n : -HALITE_E_LIMIT;
}

static int zlib_compress(struct codec_ctx *c, int level, const void *src, size_t src_len,
			 void *dst, size_t cap)
{
	int ret;

	if (level == 0)
		level = 6;
	else if (level < 1)
		level = 1;
	else if (level > 9)
		level = 9;

	if (c->def_level != level) {
		if (c->def_level)
			deflateEnd(&c->def);
		c->def_level = 0;
		memset(&c->def, 0, sizeof(c->def));
		if (deflateInit(&c->def, level) != Z_OK)
			return -ENOMEM;
		c->def_level = level;
	} else if (deflateReset(&c->def) != Z_OK) {
		return -EINVAL;
	}

	c->def.next_in = (Bytef *)src;
	c->def.avail_in = (uInt)src_len;
	c->def.next_out = dst;
	c->def.avail_out = (uInt)cap;
	ret = deflate(&c->def, Z_FINISH);
	if (ret == Z_STREAM_END)
		return (int)c->def.total_out;
	/* Z_OK / Z_BUF_ERROR with Z_FINISH: the output space ran out. */
	return -HALITE_E_LIMIT;
}

static int zstd_compress(struct codec_ctx *c, int level, const void *src, size_t src_len,
			 void *dst, size_t cap)
{
	size_t n;

	if (!c->zc) {
		c->zc = ZSTD_createCCtx();
		if (!c->zc)
			return -ENOMEM;
	}
	/* ZSTD_compressCCtx resets the parameters to @level each call. */
	n = ZSTD_compressCCtx(c->zc, dst, cap, src, src_len, level);
	if (!ZSTD_isError(n))
		return (int)n;
	if (ZSTD_getErrorCode(n) == ZSTD_error_memory_allocation)
		return -ENOMEM;
	/*
	 * Normally dstSize_tooSmall. Anything else also means "could not
	 * compress", and storing the block raw is always correct.
	 */
	return -HALITE_E_LIMIT;
}

HALITE_EXPORT int halite_compress(int codec, int level, const void *src, size_t src_len,
				  void *dst, size_t dst_cap)
{
	struct codec_ctx *c;
	size_t cap;
	int tmp, ret;

	if (codec <= HALITE_CODEC_DEFAULT || codec >= HALITE_CODEC_MAX)
		return -HALITE_E_NO_CODEC;
	/* Stored raw is never smaller, and empty input cannot shrink. */
	if (codec == HALITE_CODEC_NONE || src_len == 0 || src_len > CODEC_MAX_LEN)
		return -HALITE_E_LIMIT;

	/*
	 * Only a result smaller than the input is useful, so give the codec
	 * that as its capacity: it stops as soon as it cannot win.
	 */
	cap = dst_cap < src_len - 1 ? dst_cap : src_len - 1;
	if (cap == 0)
		return -HALITE_E_LIMIT;

	if (codec == HALITE_CODEC_LZ4 && level < 3)
		return lz4_compress(NULL, level, src, (int)src_len, dst, (int)cap);

	c = codec_ctx_get(&tmp);
	if (!c)
		return -ENOMEM;
	switch (codec) {
	case HALITE_CODEC_LZ4:
		ret = lz4_compress(c, level, src, (int)src_len, dst, (int)cap);
		break;
	case HALITE_CODEC_ZLIB:
		ret = zlib_compress(c, level, src, src_len, dst, cap);
		break;
	default:
		ret = zstd_compress(c, level, src, src_len, dst, cap);
		break;
	}
	codec_ctx_put(c, tmp);
	return ret;
}

static int zlib_decompress(struct codec_ctx *c, const void *src, size_t src_len, void *dst,
			   size_t dst_len)
{
	int ret;

	if (!c->inf_ready) {
		memset(&c->inf, 0, sizeof(c->inf));
		if (inflateInit(&c->inf) != Z_OK)
			return -ENOMEM;
		c->inf_ready = 1;
	} else if (inflateReset(&c->inf) != Z_OK) {
		return -EINVAL;
	}

	c->inf.next_in = (Bytef *)src;
	c->inf.avail_in = (uInt)src_len;
	c->inf.next_out = dst;
	c->inf.avail_out = (uInt)dst_len;
	ret = inflate(&c->inf, Z_FINISH);
	if (ret == Z_MEM_ERROR)
		return -ENOMEM;
	/*
	 * Z_STREAM_END means the Adler-32 matched. Trailing bytes after the
	 * stream are rejected too: a block is exactly one stream.
	 */
	if (ret != Z_STREAM_END || c->inf.avail_out != 0 || c->inf.avail_in != 0)
		return -HALITE_E_CODEC;
	return 0;
}

static int zstd_decompress(struct codec_ctx *c, const void *src, size_t src_len, void *dst,
			   size_t dst_len)
{
	size_t n;

	if (!c->zd) {
		c->zd = ZSTD_createDCtx();
		if (!c->zd)
			return -ENOMEM;
	}
	/*
	 * One shot into @dst: zstd bounds every copy by dst_len and uses
	 * @dst itself as the window, so a hostile window size cannot make
	 * it allocate. A declared content size other than dst_len fails
	 * with dstSize_tooSmall or returns a short count.
	 */
	n = ZSTD_decompressDCtx(c->zd, dst, dst_len, src, src_len);
	if (ZSTD_isError(n)) {
		if (ZSTD_getErrorCode(n) == ZSTD_error_memory_allocation)
			return -ENOMEM;
		return -HALITE_E_CODEC;
	}
	return n == dst_len ? 0 : -HALITE_E_CODEC;
}

HALITE_EXPORT int halite_decompress(int codec, const void *src, size_t src_len, void *dst,
				    size_t dst_len)
{
	struct codec_ctx *c;
	int tmp, ret;

	if (codec <= HALITE_CODEC_DEFAULT || codec >= HALITE_CODEC_MAX)
		return -HALITE_E_NO_CODEC;
	if (src_len > CODEC_MAX_LEN || dst_len > CODEC_MAX_LEN)
		return -HALITE_E_CODEC;

	switch (codec) {
	case HALITE_CODEC_NONE:
		if (src_len != dst_len)
			return -HALITE_E_CODEC;
		if (dst_len)
			memmove(dst, src, dst_len);
		return 0;
	case HALITE_CODEC_LZ4:
		/* The _safe decoder never reads or writes past either buffer. */
		if (src_len == 0)
			return -HALITE_E_CODEC;
		ret = LZ4_decompress_safe(src, dst, (int)src_len, (int)dst_len);
		return ret >= 0 && (size_t)ret == dst_len ? 0 : -HALITE_E_CODEC;
	}

	c = codec_ctx_get(&tmp);
	if (!c)
		return -ENOMEM;
	if (codec == HALITE_CODEC_ZLIB)
		ret = zlib_decompress(c, src, src_len, dst, dst_len);
	else
		ret = zstd_decompress(c, src, src_len, dst, dst_len);
	codec_ctx_put(c, tmp);
	return ret;
}
