// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the snapshot a QEMU clone of an object template reads.
 *
 * `halite-qemu clone` takes its snapshot as descriptor 3 and reads from it
 * the header, the index, the metadata (its command line), the device state,
 * the vCPUs and the device RAM (video memory, which it writes into QEMU
 * itself); its guest RAM comes from the template memory file, which the
 * daemon's session serves. A clone gets neither the store's credentials
 * (clone_environ() leaves them out) nor the object's URL. So the daemon
 * makes it a file of its own: a memfd the object's size that holds the
 * object's bytes outside the locality blocks (header, sections, directory,
 * footer) and the LBs that hold device RAM, all read by the template's
 * reader: the version the template reads, what it kept at open, the LBs
 * through the host's LB cache and checked against the LB table. The guest RAM's LBs are holes:
 * they cost no memory, and a clone that read one would fail on its
 * checksum, never take zeros for memory. The memfd is sealed once written:
 * no clone can change what the others read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/format.h>

#include "cloned.h"
#include "io.h"
#include "reader_io.h"
#include "s3.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

/* Marks in @lbs (a bitmap of lb_count bits) the LBs that hold a block of a device-RAM region. */
static int mark_devram_lbs(struct halite_reader *r, uint8_t *lbs, char *err, size_t errlen)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	const void *val;
	const char *list = NULL;
	uint32_t len = 0;

	if (!halite_reader_meta_find(r, "qemu.device-ram", &val, &len) && len &&
	    !((const char *)val)[len - 1])
		list = val;
	else
		len = 0;
	for (uint32_t i = 0; i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(r, i);

		if (!cl_in_list(list, len, ri->name))
			continue;
		for (uint64_t mb = ri->first_mb; mb < ri->first_mb + ri->mb_count; mb++) {
			struct halite_mb_loc loc;
			int ret = halite_reader_mb_lookup(r, mb, &loc);

			if (ret) {
				snprintf(err, errlen, "memory block %llu of device RAM %s: %s",
					 (unsigned long long)mb, ri->name, halite_reader_errmsg(r));
				return ret;
			}
			if (loc.state == HALITE_MB_STORED && loc.lb < fi->lb_count)
				lbs[loc.lb / 8] |= (uint8_t)(1u << (loc.lb % 8));
		}
	}
	return 0;
}

/*
 * The object's bytes before its first LB and after its last, written at
 * their offsets in @fd: read through @r's own handle on the object, so of
 * the version the template reads (its ETag), and mostly from what @r kept
 * at open (head, tail, sections: no request).
 */
static int copy_outside_lbs(struct halite_reader *r, int fd, char *err, size_t errlen)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	uint64_t lb_end = fi->data_offset + fi->lb_count * (uint64_t)fi->lb_size;
	/* Bounded by the object's size, which the reader checked against its own fields. */
	const uint64_t off[2] = { 0, lb_end }, len[2] = { fi->data_offset, fi->file_size - lb_end };
	int ret = 0;

	for (int i = 0; i < 2 && !ret; i++) {
		uint8_t *buf = malloc(len[i] ? len[i] : 1);

		if (!buf) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		ret = halite_io_read(halite_reader_io(r), buf, len[i], off[i]);
		if (ret) {
			char why[512] = "";

			/* The store's own sentence, which names the request, for its failures. */
			if (ret <= -HALITE_S3_E_BASE)
				halite_io_errmsg(halite_reader_io(r), why, sizeof(why));
			snprintf(err, errlen, "bytes %llu..%llu: %s", (unsigned long long)off[i],
				 (unsigned long long)(off[i] + len[i]),
				 why[0] ? why : halite_strerror(ret));
		} else if (pwrite(fd, buf, len[i], (off_t)off[i]) != (ssize_t)len[i]) {
			ret = errno ? -errno : -EIO;
			snprintf(err, errlen, "writing the clones' snapshot: %s", strerror(-ret));
		}
		free(buf);
	}
	return ret;
}

/* The device-RAM LBs marked in @lbs, read (cache, store) and checked by @r, into @fd. */
static int copy_lbs(struct halite_reader *r, const uint8_t *lbs, int fd, char *err,
		    size_t errlen)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	void *buf = halite_reader_alloc_lb(r);
	int ret = 0;

	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint64_t lb = 0; lb < fi->lb_count && !ret; lb++) {
		off_t at = (off_t)(fi->data_offset + lb * fi->lb_size);

		if (!(lbs[lb / 8] & (1u << (lb % 8))))
			continue;
		ret = halite_reader_read_lb(r, lb, buf);
		if (ret) {
			snprintf(err, errlen, "locality block %llu: %s", (unsigned long long)lb,
				 halite_reader_errmsg(r));
		} else if (pwrite(fd, buf, fi->lb_size, at) != (ssize_t)fi->lb_size) {
			ret = errno ? -errno : -EIO;
			snprintf(err, errlen, "writing the clones' snapshot: %s", strerror(-ret));
		}
	}
	halite_reader_free_lb(buf);
	return ret;
}

/* What a clone will open: @fd's file must open as a snapshot, and be @uuid's. */
static int check_view(int fd, const char *uuid, char *err, size_t errlen)
{
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_reader *r;
	char path[32], got[33], why[512] = "";
	int ret;

	ro.errbuf = why;
	ro.errbuf_len = sizeof(why);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = halite_reader_open(&r, path, &ro);
	if (ret) {
		snprintf(err, errlen, "the clones' snapshot does not open: %s",
			 why[0] ? why : halite_strerror(ret));
		return ret;
	}
	for (int i = 0; i < 16; i++)
		snprintf(got + 2 * i, 3, "%02x", halite_reader_info(r)->uuid[i]);
	halite_reader_free(r);
	if (strcmp(got, uuid)) {
		snprintf(err, errlen, "the object was replaced: uuid %s, the template's is %s", got,
			 uuid);
		return -HALITE_S3_E_CHANGED;
	}
	return 0;
}

int s3clone_make(const struct tmpl *tp, int *out, char *err, size_t errlen)
{
	struct halite_reader *r = halite_template_reader(tp->t);
	const struct halite_file_info *fi = halite_reader_info(r);
	uint8_t *lbs = calloc(fi->lb_count / 8 + 1, 1); /* lb_count is bounded by the file's size */
	int fd = -1, ret;

	if (!lbs) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	fd = memfd_create("halite-clone-snapshot", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || fchmod(fd, 0600) || ftruncate(fd, (off_t)fi->file_size)) {
		ret = -errno;
		snprintf(err, errlen, "the clones' snapshot (memfd): %s", strerror(errno));
		goto out;
	}
	ret = mark_devram_lbs(r, lbs, err, errlen);
	if (!ret)
		ret = copy_outside_lbs(r, fd, err, errlen);
	if (!ret)
		ret = copy_lbs(r, lbs, fd, err, errlen);
	if (!ret && fcntl(fd, F_ADD_SEALS, SEALS)) {
		ret = -errno;
		snprintf(err, errlen, "sealing the clones' snapshot: %s", strerror(errno));
	}
	if (!ret)
		ret = check_view(fd, tp->uuid, err, errlen);
out:
	free(lbs);
	if (ret && fd >= 0)
		close(fd);
	if (!ret)
		*out = fd;
	return ret;
}
