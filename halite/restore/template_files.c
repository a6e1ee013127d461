/* SPDX-License-Identifier: MIT */
/*
 * The template's files: the memory file that holds every decoded block
 * (made or reopened, its space reserved) and its fill file, one byte per
 * block that is in, so a reopened template keeps what it decoded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <halite/errors.h>

#include "endian_util.h"
#include "template_src.h"

static void fill_header(const struct halite_template *t, uint8_t *h)
{
	memset(h, 0, FILL_HDR);
	memcpy(h, FILL_MAGIC, 8);
	memcpy(h + 8, t->fi->uuid, 16);
	halite_put_le64(h + 24, t->fi->mb_count);
	halite_put_le64(h + 32, t->mem_size);
	halite_put_le32(h + 40, t->fi->mb_size);
}

/*
 * Create @path (O_EXCL, mode 0600: 1), or open the one there (0), refusing
 * what another user could have put or changed under us: a symbolic link
 * (not followed), anything but a regular file, a file of another uid, or
 * one that group or others may write. Clones map the memory file, so its
 * bytes are their memory.
 */
static int open_own(struct halite_template *t, const char *path, const char *what, int *fdp)
{
	struct stat st;
	int fd;

	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		*fdp = fd;
		return 1;
	}
	if (errno != EEXIST)
		return tpl_fail(t, -errno, "creating the %s %s", what, path);
	fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == ELOOP)
		return tpl_fail(t, -EPERM, "the %s %s is a symbolic link, which the template does "
				"not follow; remove it", what, path);
	if (fd < 0)
		return tpl_fail(t, -errno, "opening the %s %s", what, path);
	*fdp = fd;
	if (fstat(fd, &st))
		return tpl_fail(t, -errno, "%s", path);
	if (!S_ISREG(st.st_mode))
		return tpl_fail(t, -EPERM, "the %s %s is not a regular file; remove it", what, path);
	if (st.st_uid != geteuid())
		return tpl_fail(t, -EPERM, "the %s %s belongs to uid %u, not to this process's "
				"uid %u; remove it", what, path, (unsigned)st.st_uid,
				(unsigned)geteuid());
	if (st.st_mode & 022)
		return tpl_fail(t, -EPERM, "the %s %s may be written by group or others (mode "
				"%04o); remove it, or chmod it 0600", what, path,
				(unsigned)(st.st_mode & 07777));
	return 0;
}

/* Reserve @len bytes at @off of @fd (tmpfs: the pages are allocated now). 0 or -errno. */
static int reserve_range(int fd, uint64_t off, uint64_t len)
{
	int ret;

	if (!len)
		return 0;
	do
		ret = fallocate(fd, 0, (off_t)off, (off_t)len);
	while (ret && errno == EINTR);
	return ret ? -errno : 0;
}

/*
 * Reserve the space every stored block will take in the memory file (runs
 * of neighbouring stored blocks, one fallocate() each; zero and
 * never-touched blocks stay holes) and the whole fill map, so that filling
 * them later cannot run out of room: on a full tmpfs a store to a shared
 * mapping is SIGBUS, for the fill map's bytes as for memory. A block whose
 * map entry fails is not reserved (it is never decoded; its sessions fail).
 */
static int reserve(struct halite_template *t, uint64_t fill_size)
{
	uint64_t run_off = 0, run_len = 0, mbsz = t->fi->mb_size;
	uint64_t need = t->mb_stored * mbsz;
	int ret = 0;

	for (uint32_t i = 0; i < t->nregions && !ret; i++) {
		const struct tpl_region *g = &t->regions[i];

		for (uint64_t k = 0; k < g->mb_count && !ret; k++) {
			uint64_t mb = g->first_mb + k, off = g->offset + k * mbsz;
			uint64_t len = g->length - k * mbsz < mbsz ? g->length - k * mbsz : mbsz;
			struct halite_mb_loc loc;

			if (tpl_mb_lookup(t, mb, &loc)) {
				/*
				 * A failed chunk is read again at every use: skip
				 * the rest of its smallest possible span (64
				 * entries, 64-aligned: docs/format.md 5.7) rather
				 * than re-read it for each entry.
				 */
				k += 63 - mb % 64;
				continue;
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			if (run_len && run_off + run_len == off) {
				run_len += len;
				continue;
			}
			ret = reserve_range(t->memfd, run_off, run_len);
			run_off = off;
			run_len = len;
		}
	}
	if (!ret)
		ret = reserve_range(t->memfd, run_off, run_len);
	if (ret)
		return tpl_fail(t, ret, "reserving %llu MiB for the template memory file %s",
				ULL((need + (1 << 20) - 1) >> 20), t->mem_path);
	ret = reserve_range(t->fillfd, 0, fill_size);
	if (ret)
		return tpl_fail(t, ret, "reserving %llu KiB for the template fill map %s",
				ULL((fill_size + 1023) >> 10), t->fill_path);
	return 0;
}

static void uuid_hex(const uint8_t *u, char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", u[i]);
}

/* Reuse the files if they are this snapshot's (1), else start them over (0). */
int tpl_open_files(struct halite_template *t)
{
	uint64_t fill_size = FILL_HDR + t->fi->mb_count;
	uint8_t want[FILL_HDR], have[FILL_HDR] = { 0 };
	struct statfs sfs;
	struct stat st, ro;
	bool reuse = false;
	int ret;

	ret = open_own(t, t->mem_path, "template memory file", &t->memfd);
	if (ret < 0)
		return ret;
	t->created_mem = ret;
	if (fstatfs(t->memfd, &sfs))
		return tpl_fail(t, -errno, "%s", t->mem_path);
	if (sfs.f_type != TMPFS_MAGIC)
		return tpl_fail(t, -HALITE_E_UNSUPPORTED, "template memory file %s is not on tmpfs "
				"(clones map it and fault on it as shared memory)", t->mem_path);
	/* The same file, read-only for the clones: not whatever the path names by now. */
	t->ro_fd = open(t->mem_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (t->ro_fd < 0)
		return tpl_fail(t, -errno, "%s", t->mem_path);
	if (fstat(t->memfd, &st) || fstat(t->ro_fd, &ro) || st.st_dev != ro.st_dev ||
	    st.st_ino != ro.st_ino)
		return tpl_fail(t, -EPERM, "the template memory file %s was replaced while it was "
				"being opened", t->mem_path);
	ret = open_own(t, t->fill_path, "template fill map", &t->fillfd);
	if (ret < 0)
		return ret;
	t->created_fill = ret;

	fill_header(t, want);
	if (!fstat(t->fillfd, &st) && (uint64_t)st.st_size >= FILL_HDR &&
	    pread(t->fillfd, have, FILL_HDR, 0) == FILL_HDR) {
		reuse = (uint64_t)st.st_size == fill_size && !memcmp(have, want, FILL_HDR) &&
			!fstat(t->memfd, &st) && (uint64_t)st.st_size == t->mem_size;
	}
	if (!reuse && (t->o.flags & HALITE_TEMPLATE_NO_RESET) &&
	    (!t->created_mem || !t->created_fill)) {
		char h[33], w[33];

		uuid_hex(want + 8, w);
		if (memcmp(have, FILL_MAGIC, 8))
			return tpl_fail(t, -HALITE_E_STATE, "the template memory file %s exists and "
					"its fill map %s names no snapshot (none, or damaged), not "
					"snapshot %s: not starting them over "
					"(HALITE_TEMPLATE_NO_RESET); remove both, or use another path",
					t->mem_path, t->fill_path, w);
		uuid_hex(have + 8, h);
		return tpl_fail(t, -HALITE_E_STATE, "the template memory file %s belongs to "
				"snapshot %s%s, not to snapshot %s: not starting it over "
				"(HALITE_TEMPLATE_NO_RESET; clones may map it); remove it and %s, or "
				"use another path", t->mem_path, h,
				memcmp(have + 8, want + 8, 16) ? "" : " with another layout", w,
				t->fill_path);
	}
	if (!reuse) {
		/* Start over: drop any old contents, then size both files. */
		if (ftruncate(t->memfd, 0) || ftruncate(t->memfd, (off_t)t->mem_size) ||
		    ftruncate(t->fillfd, 0) || ftruncate(t->fillfd, (off_t)fill_size) ||
		    pwrite(t->fillfd, want, FILL_HDR, 0) != FILL_HDR)
			return tpl_fail(t, -errno, "sizing %s and its fill map", t->mem_path);
	}
	ret = reserve(t, fill_size);
	if (ret) {
		/* Started over: give back what was reserved (a reused pair keeps its blocks). */
		if (!reuse && !t->created_mem) {
			(void)!ftruncate(t->memfd, 0);
			(void)!ftruncate(t->memfd, (off_t)t->mem_size);
		}
		return ret;
	}
	t->fillmap = mmap(NULL, fill_size, PROT_READ | PROT_WRITE, MAP_SHARED, t->fillfd, 0);
	if (t->fillmap == MAP_FAILED) {
		t->fillmap = NULL;
		return tpl_fail(t, -errno, "mapping %s", t->fill_path);
	}
	t->fill = (_Atomic uint8_t *)(t->fillmap + FILL_HDR);
	return reuse ? 1 : 0;
}

/* Remove what this open created, if the path still names it (a failed open leaves nothing). */
void tpl_remove_created(struct halite_template *t)
{
	struct stat a, b;

	if (t->created_mem && t->memfd >= 0 && !fstat(t->memfd, &a) &&
	    !lstat(t->mem_path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		unlink(t->mem_path);
	if (t->created_fill && t->fillfd >= 0 && !fstat(t->fillfd, &a) &&
	    !lstat(t->fill_path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		unlink(t->fill_path);
}

/* Count what a reopened template has, and forget bytes of blocks that cannot be in. */
void tpl_count_in(struct halite_template *t)
{
	uint64_t in = 0;

	for (uint64_t mb = 0; mb < t->fi->mb_count; mb++) {
		struct halite_mb_loc loc;

		if (!atomic_load_explicit(&t->fill[mb], memory_order_relaxed))
			continue;
		/*
		 * A block whose entry cannot be read now is not served from the
		 * file: its byte goes, and its sessions fail on their own lookup.
		 */
		if (tpl_mb_lookup(t, mb, &loc) || loc.state != HALITE_MB_STORED) {
			atomic_store(&t->fill[mb], 0);
			continue;
		}
		in++;
	}
	atomic_store(&t->mb_in, in);
	t->mb_in_at_open = in;
	/* An LB all of whose blocks are in is never read again. */
	for (uint64_t lb = 0; lb < t->fi->lb_count; lb++) {
		const uint64_t *mbs;
		uint32_t n;
		bool all = !halite_reader_lb_members(t->rd, lb, &mbs, &n);

		for (uint32_t i = 0; all && i < n; i++)
			all = atomic_load_explicit(&t->fill[mbs[i]], memory_order_relaxed);
		if (all) {
			atomic_store(&t->src.st[lb], LB_DONE);
			t->lb_in_at_open++;
		}
	}
}
