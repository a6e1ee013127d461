/* SPDX-License-Identifier: MIT */
/*
 * What guest memory holds at start: a new restore refuses memory already
 * populated; a take-over (HALITE_RESTORE_ATTACH) marks what is in already
 * as installed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "discard.h"
#include "endian_util.h"
#include "restore_int.h"

#define MINCORE_CHUNK_PAGES 65536u

/*
 * Memory already populated would never fault, and would keep whatever it
 * holds instead of the snapshot: refused. Shared memory: data anywhere in
 * the file range (the page cache, or swap: SEEK_DATA counts both). This
 * process's anonymous memory, and copies (which the engine writes only
 * where the file has data): mincore() sees pages mapped here (the zero
 * page of a read included); a page swapped out is not seen. Another
 * process's anonymous memory: its page tables and swap, through
 * /proc/PID/pagemap (which needs ptrace rights over it).
 */
static int present_pages(struct halite_restore *r, const struct rregion *g, uint64_t *bits);

/* PAGEMAP_SCAN (linux/fs.h since 6.7; Debian 12's headers predate it). */
#ifndef PAGEMAP_SCAN
struct page_region {
	uint64_t start, end, categories;
};

struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#endif

/*
 * The first page of [@start, @start + @len) of process @pid (0: this one)
 * in a category of @mask (PAGE_IS_*), by PAGEMAP_SCAN, which walks only the
 * page tables there are: an untouched range costs the same at 1 GiB and
 * 64 GiB, where mincore() fills a byte per page (16 MiB at 64 GiB, ~10 ms)
 * and /proc/PID/pagemap reads 8 bytes per page (128 MiB at 64 GiB). 0 none,
 * 1 with *@first, -errno when the kernel cannot (the caller then reads page
 * by page); another process's needs ptrace rights over it.
 */
static int first_present(pid_t pid, uint64_t start, uint64_t len, uint64_t mask, uint64_t *first)
{
	struct page_region reg;
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = start, .end = start + len,
		.vec = (uint64_t)(uintptr_t)&reg, .vec_len = 1, .max_pages = 1,
		.category_anyof_mask = mask, .return_mask = mask,
	};
	char path[64];
	int fd, n;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/pagemap");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = ioctl(fd, PAGEMAP_SCAN, &a);
	n = n < 0 ? -errno : n;
	close(fd);
	if (n > 0)
		*first = reg.start;
	return n < 0 ? n : n > 0;
}

/*
 * The first page of region @g (this process's memory) that is populated,
 * into *@first: 1, 0 none, or the failure. PAGEMAP_SCAN where the kernel has
 * it, else mincore() chunk by chunk.
 */
static int first_populated(struct halite_restore *r, const struct rregion *g, uint64_t *first)
{
	size_t vlen = MINCORE_CHUNK_PAGES;
	unsigned char *vec;
	int ret = first_present(0, g->host, g->length, PAGE_IS_PRESENT, first);

	if (ret >= 0)
		return ret;
	vec = malloc(vlen);
	if (!vec)
		return -ENOMEM;
	ret = 0;
	for (uint64_t off = 0; off < g->length && !ret; off += vlen * r->page) {
		uint64_t len = HALITE_MIN(g->length - off, (uint64_t)vlen * r->page);

		if (mincore((void *)(uintptr_t)(g->host + off), len, vec)) {
			ret = rs_fail(r, -errno, "region '%s': mincore at 0x%llx (is it mapped?)",
				    g->name, ULL(g->host + off));
			break;
		}
		for (uint64_t i = 0; i < len / r->page && !ret; i++) {
			if (vec[i] & 1) {
				*first = g->host + off + i * r->page;
				ret = 1;
			}
		}
	}
	free(vec);
	return ret;
}

/* first_populated() for another process's memory, without PAGEMAP_SCAN. */
static int first_in_pagemap(struct halite_restore *r, const struct rregion *g, uint64_t *first)
{
	uint64_t npages = g->length / r->page;
	uint64_t *bits = calloc(npages / 64 + 1, sizeof(*bits));
	int ret;

	if (!bits)
		return -ENOMEM;
	ret = present_pages(r, g, bits);
	for (uint64_t p = 0; !ret && p < npages; p++)
		if (bits[p / 64] & (1ull << (p % 64))) {
			*first = g->host + p * r->page;
			ret = 1;
		}
	free(bits);
	return ret;
}

int rs_check_unpopulated(struct halite_restore *r, const struct rregion *g)
{
	uint64_t first = 0;
	int ret;

	if (g->hpage)
		return r->huge->check_empty(r, g);
	if (g->kind == HALITE_MEM_SHARED) {
		off_t d = lseek(g->fd, (off_t)g->fd_off, SEEK_DATA);

		if (d < 0 && errno != ENXIO)
			return rs_fail(r, -errno, "region '%s': SEEK_DATA in its file", g->name);
		if (d >= 0 && (uint64_t)d < g->fd_off + g->length)
			return rs_fail(r, -EEXIST, "region '%s': its file already holds data at "
				     "offset %llu of the region; a restore needs an empty range (punch "
				     "a hole first)", g->name, ULL((uint64_t)d - g->fd_off));
		return 0;
	}
	if (r->external && g->kind != HALITE_MEM_COPY) {
		/*
		 * Another process's memory: its page tables and swap, by
		 * PAGEMAP_SCAN on its pagemap where the kernel has it (halite-qemu's
		 * path for QEMU's default RAM: the cost of the pages mapped, not of
		 * memory's size), else its pagemap read page by page.
		 */
		ret = first_present(r->o.owner_pid, g->host, g->length,
				    PAGE_IS_PRESENT | PAGE_IS_SWAPPED, &first);
		if (ret < 0)
			ret = first_in_pagemap(r, g, &first);
		if (ret > 0)
			return rs_fail(r, -EEXIST, "region '%s': the page at offset %llu is already "
				       "populated in process %d; a restore needs memory that was never "
				       "touched", g->name, ULL(first - g->host), (int)r->o.owner_pid);
		return ret < 0 ? rs_fail(r, ret, "region '%s': which pages are populated (pagemap)",
					 g->name) : 0;
	}
	ret = first_populated(r, g, &first);
	if (ret > 0)
		return rs_fail(r, -EEXIST, "region '%s': the page at offset %llu is already "
			       "populated; a restore needs mapped memory that was never touched",
			       g->name, ULL(first - g->host));
	return ret;
}

/*
 * ATTACH: which pages are in already, one bit per page of @g into @bits.
 * Shared memory: what its file holds. Private memory and hugetlbfs (whose
 * page cache may hold pages being assembled, huge.c): what the owner's page
 * tables or swap hold (/proc/PID/pagemap).
 */
#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)

static int present_pages(struct halite_restore *r, const struct rregion *g, uint64_t *bits)
{
	uint64_t npages = g->length / r->page;
	char path[64];
	int fd, ret = 0;

	if (g->kind == HALITE_MEM_SHARED && !g->hpage)
		return halite_file_data_pages(g->fd, g->fd_off, g->length, r->page, bits);
	snprintf(path, sizeof(path), "/proc/%d/pagemap", r->external ? (int)r->o.owner_pid :
		 (int)getpid());
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (uint64_t p = 0; p < npages && !ret;) {
		uint64_t e[512];
		uint64_t n = HALITE_MIN(npages - p, (uint64_t)HALITE_ARRAY_SIZE(e));
		ssize_t got = pread(fd, e, n * sizeof(e[0]),
				    (off_t)((g->host / r->page + p) * sizeof(e[0])));

		if (got != (ssize_t)(n * sizeof(e[0]))) {
			ret = got < 0 ? -errno : -EIO;
			break;
		}
		for (uint64_t i = 0; i < n; i++, p++)
			if (e[i] & (PM_PRESENT | PM_SWAPPED))
				bits[p / 64] |= 1ull << (p % 64);
	}
	close(fd);
	return ret;
}

/*
 * ATTACH: a stored block all of whose pages are in is installed (mb_present);
 * an LB all of whose blocks are is done. A block partly in is installed
 * again later, page by page: the pages there are kept (EEXIST), whatever
 * the guest wrote to them since.
 */
int rs_attach_scan(struct halite_restore *r)
{
	uint32_t ppm = r->mb_size / (uint32_t)r->page;

	for (uint32_t i = 0; i < r->nregions; i++) {
		const struct rregion *g = &r->regions[i];
		uint64_t *bits;
		int ret;

		/* A copy is this process's, new: fill_copies() fills it again. */
		if (g->kind == HALITE_MEM_COPY)
			continue;
		bits = calloc((g->length / r->page + 63) / 64 + 1, sizeof(*bits));
		if (!bits)
			return -ENOMEM;
		ret = present_pages(r, g, bits);
		if (ret) {
			free(bits);
			return rs_fail(r, ret, "region '%s': which pages are in already", g->name);
		}
		if (g->hpage)
			r->huge->attach(r, g, bits);
		for (uint64_t k = 0; k < g->nmb; k++) {
			uint64_t mb = g->first_mb + k, p0 = k * ppm;
			struct halite_mb_loc loc;
			bool all = true;

			/* A 1.1 file's index chunk comes in here; damaged, the take-over fails. */
			ret = halite_reader_mb_lookup(r->rd, mb, &loc);
			if (ret) {
				free(bits);
				return rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
					       halite_reader_errmsg(r->rd));
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			for (uint64_t p = p0; p < p0 + ppm && all; p++)
				all = (bits[p / 64] >> (p % 64)) & 1;
			if (all) {
				atomic_store(&r->mb[mb], MB_INSTALLED);
				r->n_mb_present++;
			}
		}
		free(bits);
	}
	for (uint64_t lb = 0; lb < r->lb_total; lb++) {
		const uint64_t *mbs;
		uint32_t n, k;
		int ret = halite_reader_lb_members(r->rd, lb, &mbs, &n);

		if (ret)
			return rs_fail(r, ret, "locality block %llu: %s", ULL(lb),
				       halite_reader_errmsg(r->rd));
		for (k = 0; k < n && atomic_load(&r->mb[mbs[k]]) == MB_INSTALLED; k++)
			;
		if (k == n) {
			atomic_store(&r->src.st[lb], LB_DONE);
			atomic_fetch_add(&r->lb_done, 1);
		}
	}
	halite_logf(&r->log, HALITE_LOG_INFO, "attach: %llu memory blocks and %llu locality "
		    "blocks already in", ULL(r->n_mb_present), ULL(atomic_load(&r->lb_done)));
	return 0;
}
