// SPDX-License-Identifier: MIT
/*
 * A snapshot file copied with one metadata entry set to another value, the
 * way anyone with the public reader and writer API can craft one: what a
 * clone service must not trust (tests/clone/test_clone_qemu_confine.py).
 * Memory blocks are copied decoded (the writer encodes them again), every
 * section and other entry as it is.
 *
 *   clone_meta_set IN OUT KEY VALUE-FILE   (the value: VALUE-FILE's bytes)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/format.h>

#include "test_util.h"

static int copy(struct halite_reader *r, struct halite_writer *w, const char *key,
		const void *value, uint32_t vlen)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	const struct halite_root *roots;
	uint32_t vcount, nroots, len;
	const void *dev, *val;
	const char *k;
	uint64_t devlen, v;
	void *buf = malloc(fi->mb_size);
	int ret = buf ? 0 : -1;

	for (uint64_t mb = 0; !ret && mb < fi->mb_count; mb++) {
		struct halite_mb_loc loc;

		ret = halite_reader_mb_lookup(r, mb, &loc);
		if (ret || loc.state == HALITE_MB_UNTOUCHED)
			continue;
		if (loc.state == HALITE_MB_ZERO) {
			ret = halite_writer_put_zero(w, mb);
			continue;
		}
		ret = halite_reader_read_mb(r, mb, buf);
		if (!ret)
			ret = halite_writer_put(w, 0, mb, buf);
	}
	free(buf);
	if (!ret && !halite_reader_vcpus(r, &vcount, &roots, &nroots))
		for (uint32_t i = 0; i < nroots && !ret; i++)
			ret = halite_writer_add_root(w, &roots[i]);
	if (!ret && !halite_reader_device_state(r, &dev, &devlen))
		ret = halite_writer_set_device_state(w, dev, devlen);
	for (uint32_t i = 0; !ret && i < halite_reader_meta_count(r); i++) {
		ret = halite_reader_meta(r, i, &k, &val, &len);
		if (!ret && strcmp(k, key))
			ret = halite_writer_set_meta(w, k, val, len);
	}
	if (!ret)
		ret = halite_writer_set_meta(w, key, value, vlen);
	for (uint32_t i = 0; !ret && i < halite_reader_stat_count(r); i++) {
		ret = halite_reader_stat(r, i, &k, &v);
		if (!ret)
			ret = halite_writer_set_stat(w, k, v);
	}
	return ret ? ret : halite_writer_finish(w);
}

int main(int argc, char **argv)
{
	HALITE_OPTS(halite_writer_opts, wo);
	const struct halite_file_info *fi;
	struct halite_reader *r = NULL;
	struct halite_writer *w = NULL;
	struct halite_region *regions;
	const struct halite_root *roots;
	uint32_t vcount = 0, nroots;
	size_t vlen = 0;
	char *value;
	int ret;

	if (argc != 5) {
		fprintf(stderr, "usage: clone_meta_set IN OUT KEY VALUE-FILE\n");
		return 2;
	}
	value = t_slurp(argv[4], &vlen);
	ret = value ? halite_reader_open(&r, argv[1], NULL) : -1;
	if (ret) {
		fprintf(stderr, "clone_meta_set: %s: cannot read (%d)\n", value ? argv[1] : argv[4],
			ret);
		return 1;
	}
	fi = halite_reader_info(r);
	regions = calloc(fi->region_count, sizeof(*regions));
	for (uint32_t i = 0; regions && i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(r, i);

		regions[i] = (struct halite_region){ ri->name, ri->gpa, ri->length };
	}
	if (!halite_reader_vcpus(r, &vcount, &roots, &nroots))
		wo.vcpu_count = vcount;
	wo.page_size = fi->page_size;
	wo.mb_pages = fi->mb_pages;
	wo.lb_size = fi->lb_size;
	wo.codec = fi->codec;
	wo.level = fi->codec_level;
	wo.flags = HALITE_WRITER_NO_SYNC;
	ret = regions ? halite_writer_create(&w, argv[2], regions, fi->region_count, &wo) : -1;
	if (!ret)
		ret = copy(r, w, argv[3], value, (uint32_t)vlen);
	if (ret)
		fprintf(stderr, "clone_meta_set: %s: %s %s (%d)\n", argv[2],
			w ? halite_writer_errmsg(w) : "", halite_reader_errmsg(r), ret);
	halite_writer_free(w, true);
	halite_reader_free(r);
	free(regions);
	free(value);
	return ret ? 1 : 0;
}
