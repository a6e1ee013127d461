/* SPDX-License-Identifier: MIT */
/*
 * Test helpers: view, rebuild and re-seal v1 files (see corrupt_util.h).
 *
 * Checksums are computed here straight from docs/format.md with libxxhash,
 * not through halite/format/layout.c, so that a seeding or range mistake in the
 * implementation cannot hide behind the same mistake in the tests.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "corrupt_util.h"
#include "endian_util.h"

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "corrupt_util: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

uint64_t cu_file_seed(const uint8_t *b)
{
	return XXH3_64bits_withSeed(b + HLT_HDR_UUID, 16, 0);
}

int cu_view(const uint8_t *b, size_t len, struct cu_view *v)
{
	const uint8_t *f;
	uint32_t lb_size;

	memset(v, 0, sizeof(*v));
	v->size = len;
	if (len < HLT_HDR_SIZE + HLT_FTR_SIZE)
		return -1;
	v->data_offset = halite_get_le64(b + HLT_HDR_DATA_OFFSET);
	lb_size = halite_get_le32(b + HLT_HDR_LB_SIZE);
	f = b + len - HLT_FTR_SIZE;
	v->lb_count = halite_get_le64(f + HLT_FTR_LB_COUNT);
	v->dir_off = halite_get_le64(f + HLT_FTR_DIR_OFFSET);
	v->nsec = halite_get_le32(f + HLT_FTR_SECTION_COUNT);
	if (!halite_is_pow2(lb_size) || lb_size > HALITE_MAX_LB_SIZE || v->nsec > HLT_MAX_SECTIONS ||
	    v->dir_off > len - HLT_FTR_SIZE ||
	    (uint64_t)v->nsec * HLT_DIR_ENTRY_SIZE > len - HLT_FTR_SIZE - v->dir_off)
		return -1;
	v->lb_size = lb_size;
	if (v->data_offset > len || v->lb_count > (len - v->data_offset) / lb_size)
		return -1;
	v->lb_end = v->data_offset + v->lb_count * lb_size;
	if (v->dir_off < v->lb_end || v->dir_off < HLT_HDR_SIZE)
		return -1;
	for (uint32_t i = 0; i < v->nsec; i++) {
		const uint8_t *e = b + v->dir_off + (uint64_t)i * HLT_DIR_ENTRY_SIZE;

		v->sec[i].type = halite_get_le32(e + HLT_DIR_TYPE);
		v->sec[i].off = halite_get_le64(e + HLT_DIR_OFFSET);
		v->sec[i].len = halite_get_le64(e + HLT_DIR_LENGTH);
		v->sec[i].dir_pos = v->dir_off + (uint64_t)i * HLT_DIR_ENTRY_SIZE;
	}
	return 0;
}

const struct cu_sec *cu_find(const struct cu_view *v, uint32_t type)
{
	for (uint32_t i = 0; i < v->nsec; i++)
		if (v->sec[i].type == type)
			return &v->sec[i];
	return NULL;
}

static bool in_file(uint64_t off, uint64_t n, uint64_t size)
{
	return off <= size && n <= size - off;
}

void cu_reseal(uint8_t *b, size_t len, unsigned flags)
{
	struct cu_view v;
	uint64_t seed;
	uint8_t *f;

	if (len < HLT_HDR_SIZE)
		return;
	/*
	 * Inner checksums first: on hostile input a table may overlap what
	 * covers it, and the header and footer checksums must come out right
	 * whatever the writes before them touched.
	 */
	seed = cu_file_seed(b);
	f = b + len - HLT_FTR_SIZE;
	if (len >= HLT_HDR_SIZE + HLT_FTR_SIZE && cu_view(b, len, &v) == 0) {
		const struct cu_sec *lbt = cu_find(&v, HALITE_SECTION_LB_TABLE);

		if ((flags & CU_RESEAL_LBS) && lbt && in_file(lbt->off, lbt->len, len)) {
			uint64_t n = HALITE_MIN(v.lb_count, lbt->len / HLT_LBT_ENTRY_SIZE);

			for (uint64_t i = 0; i < n; i++)
				halite_put_le64(b + lbt->off + i * HLT_LBT_ENTRY_SIZE + HLT_LBT_CHECKSUM,
						XXH3_64bits_withSeed(b + v.data_offset + i * v.lb_size,
								     v.lb_size, seed + i));
		}
		for (uint32_t i = 0; i < v.nsec; i++)
			if (in_file(v.sec[i].off, v.sec[i].len, len))
				halite_put_le64(b + v.sec[i].dir_pos + HLT_DIR_CHECKSUM,
						XXH3_64bits_withSeed(b + v.sec[i].off, v.sec[i].len,
								     seed));
		halite_put_le64(f + HLT_FTR_DIR_CHECKSUM,
				XXH3_64bits_withSeed(b + v.dir_off,
						     (size_t)v.nsec * HLT_DIR_ENTRY_SIZE, seed));
	}
	halite_put_le64(b + HLT_HDR_CHECKSUM, XXH3_64bits_withSeed(b, HLT_HDR_CHECKSUM, 0));
	if (len >= HLT_HDR_SIZE + HLT_FTR_SIZE)
		halite_put_le64(f + HLT_FTR_CHECKSUM, XXH3_64bits_withSeed(f, HLT_FTR_CHECKSUM, 0));
}

/* ---- model ---- */

int cu_parse(const uint8_t *b, size_t len, struct cu_model *m)
{
	struct cu_view v;

	memset(m, 0, sizeof(*m));
	if (cu_view(b, len, &v))
		return -1;
	m->head_len = v.lb_end;
	m->head = xmalloc(m->head_len);
	memcpy(m->head, b, m->head_len);
	m->lb_count = v.lb_count;
	for (uint32_t i = 0; i < v.nsec; i++) {
		struct cu_msec *s = &m->sec[m->nsec++];

		if (!in_file(v.sec[i].off, v.sec[i].len, len)) {
			cu_model_free(m);
			return -1;
		}
		s->type = v.sec[i].type;
		s->len = v.sec[i].len;
		s->data = xmalloc(s->len);
		memcpy(s->data, b + v.sec[i].off, s->len);
	}
	return 0;
}

void cu_model_free(struct cu_model *m)
{
	free(m->head);
	for (uint32_t i = 0; i < m->nsec; i++)
		free(m->sec[i].data);
	memset(m, 0, sizeof(*m));
}

void cu_model_copy(struct cu_model *dst, const struct cu_model *src)
{
	*dst = *src;
	dst->head = xmalloc(src->head_len);
	memcpy(dst->head, src->head, src->head_len);
	for (uint32_t i = 0; i < src->nsec; i++) {
		dst->sec[i].data = xmalloc(src->sec[i].len);
		memcpy(dst->sec[i].data, src->sec[i].data, src->sec[i].len);
	}
}

struct cu_msec *cu_msec(struct cu_model *m, uint32_t type)
{
	for (uint32_t i = 0; i < m->nsec; i++)
		if (m->sec[i].type == type)
			return &m->sec[i];
	return NULL;
}

void cu_set_section(struct cu_model *m, uint32_t type, const void *data, size_t len)
{
	struct cu_msec *s = cu_msec(m, type);

	if (!s) {
		if (m->nsec >= HALITE_ARRAY_SIZE(m->sec))
			abort();
		s = &m->sec[m->nsec++];
		*s = (struct cu_msec){ .type = type };
	}
	free(s->data);
	s->data = xmalloc(len);
	memcpy(s->data, data, len);
	s->len = len;
}

void cu_del_section(struct cu_model *m, uint32_t type)
{
	struct cu_msec *s = cu_msec(m, type);

	if (!s)
		return;
	free(s->data);
	memmove(s, s + 1, (size_t)(m->sec + m->nsec - (s + 1)) * sizeof(*s));
	m->nsec--;
}

uint8_t *cu_build(const struct cu_model *m, size_t *lenp)
{
	uint64_t pos = m->head_len, dir_off;
	uint64_t offs[HALITE_ARRAY_SIZE(m->sec)];
	uint8_t *b, *f;
	size_t len;

	for (uint32_t i = 0; i < m->nsec; i++) {
		pos = hlt_pad8(pos) + m->sec[i].gap;
		offs[i] = pos;
		pos += m->sec[i].len;
	}
	dir_off = hlt_pad8(pos);
	len = dir_off + (size_t)m->nsec * HLT_DIR_ENTRY_SIZE + HLT_FTR_SIZE;
	b = xmalloc(len);
	memset(b, 0, len);
	memcpy(b, m->head, m->head_len);
	for (uint32_t i = 0; i < m->nsec; i++) {
		uint8_t *e = b + dir_off + (size_t)i * HLT_DIR_ENTRY_SIZE;

		memcpy(b + offs[i], m->sec[i].data, m->sec[i].len);
		halite_put_le32(e + HLT_DIR_TYPE, m->sec[i].type);
		halite_put_le32(e + HLT_DIR_RESERVED, m->sec[i].reserved);
		halite_put_le64(e + HLT_DIR_OFFSET, offs[i]);
		halite_put_le64(e + HLT_DIR_LENGTH, m->sec[i].len);
	}
	f = b + len - HLT_FTR_SIZE;
	memcpy(f, HLT_FTR_MAGIC, 8);
	memcpy(f + HLT_FTR_UUID, b + HLT_HDR_UUID, 16);
	halite_put_le64(f + HLT_FTR_LB_COUNT, m->lb_count);
	halite_put_le64(f + HLT_FTR_DIR_OFFSET, dir_off);
	halite_put_le32(f + HLT_FTR_SECTION_COUNT, m->nsec);
	cu_reseal(b, len, 0);
	*lenp = len;
	return b;
}

/* ---- files ---- */

uint8_t *cu_read_file(const char *path, size_t *lenp)
{
	struct stat st;
	uint8_t *b;
	size_t got = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) || st.st_size < 0) {
		close(fd);
		return NULL;
	}
	b = xmalloc((size_t)st.st_size);
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, b + got, (size_t)st.st_size - got);

		if (n <= 0) {
			free(b);
			close(fd);
			return NULL;
		}
		got += (size_t)n;
	}
	close(fd);
	*lenp = got;
	return b;
}

int cu_write_file(const char *path, const void *b, size_t len)
{
	const uint8_t *p = b;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		return -errno;
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			int err = -errno;

			close(fd);
			return err;
		}
		p += n;
		len -= (size_t)n;
	}
	return close(fd) ? -errno : 0;
}
