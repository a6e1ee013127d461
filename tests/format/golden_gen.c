/* SPDX-License-Identifier: MIT */
/*
 * Write the golden files (one per codec and format version) into a directory:
 *
 *   golden_gen DIR
 *
 * Run once per format version, when it was released; the output is
 * committed in tests/golden/ and must never be regenerated (see the README
 * there). A file that exists is left alone (never overwritten): run on
 * tests/golden, it writes only a new version's files. Content: golden_data.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/halite.h>

#include "golden_data.h"

#define CHECK(call)                                                                         \
	do {                                                                                \
		int ret_ = (call);                                                          \
		if (ret_) {                                                                 \
			fprintf(stderr, "golden_gen: %s: %s (%s)\n", #call,               \
				halite_strerror(ret_), w ? halite_writer_errmsg(w) : "");   \
			exit(1);                                                            \
		}                                                                           \
	} while (0)

static void write_one(const char *dir, const struct golden_codec *gc)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	uint8_t data[GOLDEN_MB_SIZE], dev[GOLDEN_DEV_LEN];
	char *path;

	if (asprintf(&path, "%s/%s", dir, gc->file) < 0)
		exit(1);
	if (access(path, F_OK) == 0) {
		fprintf(stderr, "golden_gen: %s exists, kept; golden files are never regenerated\n",
			path);
		free(path);
		return;
	}
	o.page_size = GOLDEN_PAGE;
	o.mb_pages = GOLDEN_MB_PAGES;
	o.lb_size = GOLDEN_LB_SIZE;
	o.codec = gc->codec;
	o.level = gc->level;
	o.vcpu_count = GOLDEN_VCPUS;
	o.flags = gc->minor == 0 ? HALITE_WRITER_V1_0 : 0;
	CHECK(halite_writer_create(&w, path, golden_regions, GOLDEN_NREGIONS, &o));
	if (halite_writer_mb_count(w) != GOLDEN_NMB)
		exit(1);
	for (size_t i = 0; i < GOLDEN_NPUTS; i++) {
		uint64_t mb = golden_puts[i].mb;

		if (mb == G_FLUSH) {
			CHECK(halite_writer_flush_stream(w, golden_puts[i].stream));
			continue;
		}
		if (golden_class_of[mb] == G_ZERO_PUT) {
			CHECK(halite_writer_put_zero(w, mb));
			continue;
		}
		golden_mb_data(mb, halite_writer_mb_bytes(w, mb), data);
		CHECK(halite_writer_put(w, golden_puts[i].stream, mb, data));
	}
	for (size_t i = 0; i < GOLDEN_NROOTS; i++)
		CHECK(halite_writer_add_root(w, &golden_roots[i]));
	golden_device_state(dev);
	CHECK(halite_writer_set_device_state(w, dev, sizeof(dev)));
	for (size_t i = 0; i < GOLDEN_NMETA; i++)
		CHECK(halite_writer_set_meta(w, golden_meta[i].key, golden_meta[i].value,
					     golden_meta[i].len));
	CHECK(halite_writer_set_meta(w, "codec", halite_codec_name(gc->codec),
				     (uint32_t)strlen(halite_codec_name(gc->codec))));
	for (size_t i = 0; i < GOLDEN_NSTATS; i++)
		CHECK(halite_writer_set_stat(w, golden_stats[i].key, golden_stats[i].value));
	CHECK(halite_writer_finish(w));
	halite_writer_free(w, true);
	printf("%s\n", path);
	free(path);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < GOLDEN_NFILES; i++)
		write_one(argv[1], &golden_codecs[i]);
	return 0;
}
