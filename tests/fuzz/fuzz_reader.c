/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: halite_reader_open on arbitrary bytes, then every read-side
 * call on whatever opens.
 *
 * Each input is tried twice: as given, which mostly exercises the checksum
 * checks, and re-sealed (every checksum recomputed, LBs included, by
 * corrupt_util.c), so that mutations reach the range and consistency checks
 * and the codecs behind the checksums. The file goes to a memfd and the
 * reader opens it by /proc/self/fd/N, as it would a real path.
 *
 * Besides crashes and sanitizer reports, the target aborts when the reader
 * breaks a promise of format.h on a file it accepted (members tile their LB,
 * lookups stay inside the file, region names are unique, ...), so the fuzzer
 * also finds files that open but should not have.
 *
 * Built as a libFuzzer binary (fuzz_reader, clang, HALITE_FUZZ=ON) and as a
 * plain regression program over the committed corpus (fuzz_reader_regress).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <halite/halite.h>

#include "corrupt_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_INPUT (8u << 20)
#define MAX_MB_LOOKUPS (1u << 16)
#define MAX_LB_WALK (1u << 16)
#define MAX_LB_READS 4u
#define MAX_MB_READS 8u

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "fuzz_reader: %s:%d: broken promise: %s\n",  \
				__FILE__, __LINE__, #cond);                           \
			abort();                                                      \
		}                                                                     \
	} while (0)

static int memfd = -1;
static char memfd_path[64];

static void put_input(const uint8_t *data, size_t size)
{
	size_t done = 0;

	if (memfd < 0) {
		memfd = memfd_create("halite-fuzz", MFD_CLOEXEC);
		if (memfd < 0) {
			perror("memfd_create");
			abort();
		}
		snprintf(memfd_path, sizeof(memfd_path), "/proc/self/fd/%d", memfd);
	}
	if (ftruncate(memfd, 0)) {
		perror("ftruncate");
		abort();
	}
	while (done < size) {
		ssize_t n = pwrite(memfd, data + done, size - done, (off_t)done);

		if (n <= 0) {
			perror("pwrite");
			abort();
		}
		done += (size_t)n;
	}
}

/* A failure is a negative errno or a Halite code, never anything else. */
static void check_error(int ret)
{
	CHECK(ret < 0);
	CHECK(-ret < 4096 || (-ret >= HALITE_E_BASE && -ret < HALITE_E_MAX));
}

static void exercise_regions(struct halite_reader *r, const struct halite_file_info *fi)
{
	uint64_t first = 0;

	CHECK(fi->region_count >= 1);
	for (uint32_t i = 0; i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(r, i);
		size_t n;

		CHECK(ri);
		n = strlen(ri->name);
		CHECK(n >= 1 && n <= HALITE_MAX_REGION_NAME);
		CHECK(halite_reader_find_region(r, ri->name) == (int)i);
		CHECK(ri->first_mb == first);
		CHECK(ri->length && ri->length % fi->page_size == 0);
		CHECK(ri->gpa % fi->page_size == 0);
		CHECK(ri->mb_count == ri->length / fi->mb_size + (ri->length % fi->mb_size != 0));
		first += ri->mb_count;
	}
	CHECK(first == fi->mb_count);
	CHECK(!halite_reader_region(r, fi->region_count));
	CHECK(halite_reader_find_region(r, "") == -HALITE_E_NOT_FOUND);
}

/*
 * A 1.1 file's chunks, before anything checked them: a lookup gives an entry
 * in range or fails with a format error, never anything else.
 */
static void exercise_lazy(struct halite_reader *r, const struct halite_file_info *fi)
{
	uint64_t n = fi->mb_count < MAX_MB_LOOKUPS ? fi->mb_count : MAX_MB_LOOKUPS;
	struct halite_mb_loc loc;
	const uint64_t *mbs;
	uint32_t count;

	for (uint64_t m = 0; m < n; m++) {
		int ret = halite_reader_mb_lookup(r, m, &loc);

		if (ret) {
			check_error(ret);
			continue;
		}
		CHECK(loc.state <= HALITE_MB_STORED);
		if (loc.state == HALITE_MB_STORED)
			CHECK(loc.lb < fi->lb_count && loc.offset + (uint64_t)loc.length <= fi->lb_size);
	}
	for (uint64_t lb = 0; lb < fi->lb_count && lb < 16; lb++) {
		int ret = halite_reader_lb_members(r, lb, &mbs, &count);

		if (ret) {
			check_error(ret);
			continue;
		}
		for (uint32_t j = 0; j < count; j++)
			CHECK(mbs[j] < fi->mb_count);
	}
}

static void exercise_map(struct halite_reader *r, const struct halite_file_info *fi)
{
	uint64_t n = fi->mb_count < MAX_MB_LOOKUPS ? fi->mb_count : MAX_MB_LOOKUPS;
	struct halite_mb_loc loc;

	for (uint64_t m = 0; m < n; m++) {
		uint32_t bytes = halite_reader_mb_bytes(r, m);

		CHECK(bytes >= 1 && bytes <= fi->mb_size);
		CHECK(halite_reader_mb_lookup(r, m, &loc) == 0);
		CHECK(loc.state <= HALITE_MB_STORED);
		if (loc.state != HALITE_MB_STORED)
			continue;
		CHECK(loc.lb < fi->lb_count);
		CHECK(loc.length >= 1 && loc.offset + (uint64_t)loc.length <= fi->lb_size);
		CHECK(loc.compressed ? loc.length < bytes : loc.length == bytes);
		CHECK(!(loc.compressed && fi->codec == HALITE_CODEC_NONE));
	}
	CHECK(halite_reader_mb_lookup(r, fi->mb_count, &loc) == -ERANGE);
	CHECK(halite_reader_mb_bytes(r, fi->mb_count) == 0);

	/* The first block that is not stored decodes to zeros without an LB. */
	for (uint64_t m = 0; m < n; m++) {
		uint8_t *out;

		CHECK(halite_reader_mb_lookup(r, m, &loc) == 0);
		if (loc.state == HALITE_MB_STORED)
			continue;
		out = malloc(fi->mb_size);
		CHECK(out);
		memset(out, 0xa5, fi->mb_size);
		CHECK(halite_reader_decode_mb(r, m, NULL, out) == 0);
		for (uint32_t i = 0; i < halite_reader_mb_bytes(r, m); i++)
			CHECK(out[i] == 0);
		free(out);
		break;
	}
}

static void exercise_lbs(struct halite_reader *r, const struct halite_file_info *fi)
{
	uint64_t n = fi->lb_count < MAX_LB_WALK ? fi->lb_count : MAX_LB_WALK;
	uint8_t *buf = NULL, *out = NULL;
	struct halite_lb_info li;
	const uint64_t *mbs;
	uint32_t count;

	for (uint64_t lb = 0; lb < n; lb++) {
		uint64_t used = 0;
		char sn[32];

		CHECK(halite_reader_lb_info(r, lb, &li) == 0);
		CHECK(li.used >= 1 && li.used <= fi->lb_size && li.mb_count >= 1);
		CHECK(li.offset == fi->data_offset + lb * fi->lb_size);
		CHECK(halite_stream_name(li.stream, sn, sizeof(sn)) == sn && sn[0]);
		CHECK(halite_reader_lb_members(r, lb, &mbs, &count) == 0);
		CHECK(count == li.mb_count);
		for (uint32_t j = 0; j < count; j++) {
			struct halite_mb_loc loc;

			CHECK(mbs[j] < fi->mb_count);
			CHECK(halite_reader_mb_lookup(r, mbs[j], &loc) == 0);
			CHECK(loc.state == HALITE_MB_STORED && loc.lb == lb);
			CHECK(loc.offset == used); /* tiles the LB in offset order */
			used += loc.length;
		}
		CHECK(used == li.used);
	}
	CHECK(halite_reader_lb_info(r, fi->lb_count, &li) == -ERANGE);
	CHECK(halite_reader_lb_members(r, fi->lb_count, &mbs, &count) == -ERANGE);

	if (!fi->lb_count)
		return;
	buf = halite_reader_alloc_lb(r);
	out = malloc(fi->mb_size);
	CHECK(buf && out);
	CHECK(halite_reader_read_lb(r, fi->lb_count, buf) == -ERANGE);
	CHECK(halite_reader_verify_lb(r, fi->lb_count, buf) == -ERANGE);
	for (uint64_t lb = 0; lb < fi->lb_count && lb < MAX_LB_READS; lb++) {
		int ret = halite_reader_read_lb(r, lb, buf);

		if (ret) {
			check_error(ret);
			CHECK(halite_reader_errmsg(r)[0]);
			continue;
		}
		CHECK(halite_reader_verify_lb(r, lb, buf) == 0);
		CHECK(halite_reader_lb_members(r, lb, &mbs, &count) == 0);
		for (uint32_t j = 0; j < count; j++) {
			ret = halite_reader_decode_mb(r, mbs[j], buf, out);
			if (ret)
				CHECK(ret == -HALITE_E_CODEC || ret == -ENOMEM);
		}
	}
	/* read_mb on the first few stored blocks, wherever they are. */
	for (uint64_t m = 0, done = 0; m < fi->mb_count && m < MAX_MB_LOOKUPS && done < MAX_MB_READS;
	     m++) {
		struct halite_mb_loc loc;
		int ret;

		CHECK(halite_reader_mb_lookup(r, m, &loc) == 0);
		if (loc.state != HALITE_MB_STORED)
			continue;
		ret = halite_reader_read_mb(r, m, out);
		if (ret)
			check_error(ret);
		done++;
	}
	free(out);
	halite_reader_free_lb(buf);
}

static void exercise_sections(struct halite_reader *r)
{
	uint32_t n = halite_reader_section_count(r), type, vcpus, nroots, len;
	const struct halite_root *roots;
	uint64_t off, slen, dlen, v;
	const void *data, *value;
	const char *key;

	CHECK(n >= 3 && n <= 64);
	for (uint32_t i = 0; i < n; i++) {
		int ret;

		CHECK(halite_reader_section(r, i, &type, &off, &slen) == 0);
		ret = halite_reader_verify_section(r, i);
		/* Sections this build knows were verified at open. */
		if (halite_section_name(type))
			CHECK(ret == 0);
		else if (ret)
			CHECK(ret == -HALITE_E_CHECKSUM);
	}
	CHECK(halite_reader_section(r, n, &type, &off, &slen) == -ERANGE);
	CHECK(halite_reader_verify_section(r, n) == -ERANGE);

	if (halite_reader_device_state(r, &data, &dlen) == 0)
		CHECK(data || !dlen);
	if (halite_reader_vcpus(r, &vcpus, &roots, &nroots) == 0) {
		for (uint32_t i = 0; i < nroots; i++) {
			CHECK(roots[i].vcpu < vcpus || roots[i].vcpu == HALITE_VCPU_UNKNOWN);
			CHECK(roots[i].mode == HALITE_PAGING_4LEVEL ||
			      roots[i].mode == HALITE_PAGING_5LEVEL);
		}
	}
	for (uint32_t i = 0; i < halite_reader_meta_count(r); i++) {
		CHECK(halite_reader_meta(r, i, &key, &value, &len) == 0);
		CHECK(strlen(key) >= 1 && strlen(key) <= 255 && len <= (1u << 20));
		for (uint32_t j = 0; j < i && i < 256; j++) { /* quadratic: the first few */
			const char *k2;

			CHECK(halite_reader_meta(r, j, &k2, &value, &len) == 0);
			CHECK(strcmp(key, k2) != 0);
		}
	}
	CHECK(halite_reader_meta(r, halite_reader_meta_count(r), &key, &value, &len) == -ERANGE);
	for (uint32_t i = 0; i < halite_reader_stat_count(r); i++) {
		CHECK(halite_reader_stat(r, i, &key, &v) == 0);
		CHECK(strlen(key) >= 1 && strlen(key) <= 255);
	}
	CHECK(halite_reader_stat(r, halite_reader_stat_count(r), &key, &v) == -ERANGE);
}

static void one(const uint8_t *data, size_t size)
{
	HALITE_OPTS(halite_reader_opts, o);
	const struct halite_file_info *fi;
	struct halite_reader *r = NULL;
	char err[256];
	int ret;

	put_input(data, size);
	err[0] = 0;
	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	ret = halite_reader_open(&r, memfd_path, &o);
	if (ret) {
		check_error(ret);
		CHECK(r == NULL);
		CHECK(err[0]); /* a failed open explains itself */
		return;
	}
	fi = halite_reader_info(r);
	CHECK(fi->file_size == size);
	CHECK(fi->mb_untouched + fi->mb_zero + fi->mb_stored == fi->mb_count);
	CHECK(fi->mb_compressed <= fi->mb_stored);
	CHECK(fi->data_offset + fi->lb_count * fi->lb_size <= size);
	CHECK(fi->mb_size == fi->page_size * fi->mb_pages && fi->mb_size <= fi->lb_size);
	CHECK(halite_codec_name(fi->codec));
	exercise_regions(r, fi);
	/* 1.1: chunks on first use; once the full check passes, all holds as for 1.0. */
	if (fi->incompat_flags) {
		exercise_lazy(r, fi);
		ret = halite_reader_verify_index(r);
		if (ret) {
			check_error(ret);
			CHECK(halite_reader_errmsg(r)[0]);
			halite_reader_free(r);
			return;
		}
	}
	CHECK(halite_reader_verify_index(r) == 0);
	exercise_map(r, fi);
	exercise_lbs(r, fi);
	exercise_sections(r);
	halite_reader_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy;

	if (size > MAX_INPUT)
		return 0;
	one(data, size);
	copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	cu_reseal(copy, size, CU_RESEAL_LBS);
	if (memcmp(copy, data, size))
		one(copy, size);
	free(copy);
	return 0;
}
