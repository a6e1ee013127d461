// SPDX-License-Identifier: MIT
/*
 * What a halite-qemu snapshot file says about the machine to bring back,
 * read and checked before QEMU starts (restore.c, clone.c): the device
 * state (its stream header and machine type), the vCPU count, the regions,
 * and which of them are device RAM (the qemu.device-ram record: region
 * names, each NUL-ended; files without it have guest RAM only). The
 * recorded command line and the rest of the qemu.* records are config.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "devstate.h"
#include "incoming.h"

static int failf(char *err, size_t len, int ret, const char *what, const char *detail)
{
	return hq_fail(err, len, ret, what, detail);
}

static int read_device_ram(struct hq_snapfile *f, const struct halite_reader *rd,
			   const char *path, char *err, size_t errlen)
{
	const char *p;
	const void *val = NULL;
	uint32_t len = 0;

	if (halite_reader_meta_find(rd, "qemu.device-ram", &val, &len))
		return 0;
	if (!len || ((const char *)val)[len - 1]) {
		snprintf(err, errlen, "%s: its qemu.device-ram is not a list of regions", path);
		return -HALITE_E_CORRUPT;
	}
	for (p = val; p < (const char *)val + len; p += strlen(p) + 1) {
		uint32_t x;

		for (x = 0; x < f->nregions && strcmp(f->regions[x].name, p); x++)
			;
		if (x == f->nregions || f->devram_of[x] || f->ndevram == HQ_MAX_DEVRAM) {
			snprintf(err, errlen, "%s: its qemu.device-ram names '%.64s', %s", path, p,
				 x == f->nregions ? "which is no region of it" :
				 f->devram_of[x] ? "twice" : "one too many");
			return -HALITE_E_CORRUPT;
		}
		f->devram_of[x] = true;
		f->devram[f->ndevram].name = f->regions[x].name;
		f->devram[f->ndevram++].length = f->regions[x].length;
	}
	return 0;
}

int hq_snapfile_read(struct hq_snapfile *f, const char *path, struct halite_reader **rdp,
		     char *err, size_t errlen)
{
	HALITE_OPTS(halite_reader_opts, o);
	struct halite_reader *rd = NULL;
	const struct halite_root *roots;
	uint32_t nroots;
	const void *dev;
	char msg[512] = "";
	int ret;

	*rdp = NULL;
	o.errbuf = msg;
	o.errbuf_len = sizeof(msg);
	ret = halite_reader_open(&rd, path, &o);
	if (ret)
		return msg[0] ? failf(err, errlen, ret, msg, NULL) :
		       failf(err, errlen, ret, path, halite_strerror(ret));
	ret = halite_reader_device_state(rd, &dev, &f->devlen);
	if (ret) {
		failf(err, errlen, ret, path, "no device state: not saved by " PROG);
		goto out;
	}
	ret = hq_device_stream_check(dev, f->devlen, f->machine, sizeof(f->machine), msg,
				     sizeof(msg));
	if (ret) {
		failf(err, errlen, ret, path, msg);
		goto out;
	}
	f->dev = malloc(f->devlen);
	if (!f->dev) {
		ret = failf(err, errlen, -ENOMEM, "out of memory", NULL);
		goto out;
	}
	memcpy(f->dev, dev, f->devlen);
	if (halite_reader_vcpus(rd, &f->vcpus, &roots, &nroots))
		f->vcpus = 0;
	f->mem_bytes = halite_reader_info(rd)->memory_bytes;
	f->nregions = halite_reader_info(rd)->region_count;
	if (f->nregions > HQ_MAX_REGIONS) {
		ret = failf(err, errlen, -HALITE_E_LIMIT, path,
			    "more regions than halite-qemu handles");
		goto out;
	}
	for (uint32_t i = 0; i < f->nregions; i++)
		f->regions[i] = *halite_reader_region(rd, i);
	ret = read_device_ram(f, rd, path, err, errlen);
out:
	if (ret)
		halite_reader_free(rd);
	else
		*rdp = rd;
	return ret;
}

int hq_snapfile_devram_map(struct hq_snapfile *f, uint32_t i, char *err, size_t errlen)
{
	uint64_t len = f->devram[i].length;
	void *p;

	if (f->devram[i].copy)
		return 0;
	/*
	 * Fresh pages, page-aligned: only what the file stores is written, the
	 * rest stays unpopulated (and hq_vm_write_pages() sees it so).
	 */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		 -1, 0);
	if (p == MAP_FAILED)
		return failf(err, errlen, -errno, "a copy of device RAM", strerror(errno));
	madvise(p, len, MADV_NOHUGEPAGE);
	f->devram[i].copy = p;
	return 0;
}

/* Region @ri's memory as saved, decoded into @out (zeros where nothing is stored). */
static int decode_region(struct halite_reader *rd, const struct halite_region_info *ri,
			 uint8_t *out, char *err, size_t errlen)
{
	const struct halite_file_info *fi = halite_reader_info(rd);
	void *lb = halite_reader_alloc_lb(rd);
	uint64_t have = UINT64_MAX;
	int ret = 0;

	if (!lb)
		return failf(err, errlen, -ENOMEM, "out of memory", NULL);
	for (uint64_t m = ri->first_mb; m < ri->first_mb + ri->mb_count && !ret; m++) {
		struct halite_mb_loc loc;

		ret = halite_reader_mb_lookup(rd, m, &loc);
		if (ret || loc.state != HALITE_MB_STORED)
			continue;
		/* A region's blocks mostly share LBs: read each once in a row. */
		if (loc.lb != have) {
			ret = halite_reader_read_lb(rd, loc.lb, lb);
			have = ret ? UINT64_MAX : loc.lb;
		}
		if (!ret)
			ret = halite_reader_decode_mb(rd, m, lb,
						      out + (m - ri->first_mb) * fi->mb_size);
	}
	halite_reader_free_lb(lb);
	if (ret)
		failf(err, errlen, ret, ri->name, halite_reader_errmsg(rd)[0] ?
		      halite_reader_errmsg(rd) : halite_strerror(ret));
	return ret;
}

int hq_snapfile_devram_decode(struct hq_snapfile *f, struct halite_reader *rd, char *err,
			      size_t errlen)
{
	for (uint32_t i = 0; i < f->ndevram; i++) {
		const struct halite_region_info *ri = NULL;
		int ret;

		for (uint32_t x = 0; x < f->nregions && !ri; x++)
			if (f->regions[x].name == f->devram[i].name)
				ri = &f->regions[x];
		ret = hq_snapfile_devram_map(f, i, err, errlen);
		if (!ret)
			ret = decode_region(rd, ri, f->devram[i].copy, err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

uint64_t hq_snapfile_devram_bytes(const struct hq_snapfile *f)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < f->ndevram; i++)
		n += f->devram[i].length;
	return n;
}

void hq_snapfile_free(struct hq_snapfile *f)
{
	for (uint32_t i = 0; i < f->ndevram; i++)
		if (f->devram[i].copy)
			munmap(f->devram[i].copy, f->devram[i].length);
	free(f->dev);
	f->dev = NULL;
	f->ndevram = 0;
}
