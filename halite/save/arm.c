/* SPDX-License-Identifier: MIT */
/*
 * A save's regions and userfaultfd set up at create, and each region armed
 * at the snapshot instant: registered, its pages moved aside or its owner's
 * page-table entries dropped; and all that undone when arming fails.
 *
 * Arming (guest paused), per region, a few syscalls each:
 * - private anonymous memory: the pages move aside with
 *   mremap(MREMAP_DONTUNMAP) to a "shadow" mapping that keeps the
 *   snapshot-instant contents; the now empty guest range is registered with
 *   userfaultfd MISSING. A block is given back with UFFDIO_COPY from the
 *   shadow, which nothing ever writes.
 * - shared memory (memfd/tmpfs), ours or another process's: the range is
 *   registered MINOR|MISSING and the owner's page-table entries dropped; the
 *   data stays in the page cache, which the guest writes as soon as a block
 *   is given back (UFFDIO_CONTINUE). So the claimer first copies the block
 *   through the engine's own read-only mapping of the file ("view") into the
 *   region's shadow, a sparse anonymous mapping that then holds the
 *   snapshot-instant bytes of every claimed block, as for anonymous memory.
 * - hugetlbfs: as shared memory, but the kernel maps and faults whole huge
 *   pages, so a fault claims, copies and gives back every block of its huge
 *   page at once (serve_huge_fault()). Blocks are read with pread(), which
 *   reads a hole as zeros without allocating a huge page (a read through a
 *   mapping would); hugetlbfs cannot tell holes (SEEK_DATA says "all data"),
 *   so never-touched memory there is saved as zero blocks.
 * - a copy (HALITE_MEM_COPY): the caller's memory, which nobody writes while
 *   the save runs, serves as the region's shadow as it is. Nothing is
 *   registered, nothing is given back, and its pages are never dropped
 *   (save_release_block()): they are the caller's. The background thread
 *   saves all of it first (save_copies()), so that the caller gets it back
 *   soon.
 *
 * Shared memory the VMM gives back: a hole punched in the file of a block
 * not yet copied would lose it, and no event reports it. guard_discards()
 * makes the file refuse punches until teardown; where it cannot, it notes
 * which pages held data at the instant and copy_checked() (fault.c) fails
 * the save on a block that lost one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "discard.h"
#include "uffd.h"

#include "save_int.h"

/* Our read-only window on a shared region's file, and its shadow. */
int save_map_view(struct halite_save *s, struct sregion *r)
{
	struct statfs sf;
	void *v, *sh;

	if (fstatfs(r->fd, &sf))
		return sfail(s, -errno, "region '%s': fstatfs", r->name);
	if (sf.f_type == HUGETLBFS_MAGIC) {
		/* No view: reading a hole through it would allocate a huge page. */
		r->hpage = (uint64_t)sf.f_bsize;
		s->has_huge = true;
		if (r->hpage % s->mb_size || r->host % r->hpage || r->length % r->hpage ||
		    r->fd_off % r->hpage)
			return sfail(s, -EINVAL, "region '%s': on hugetlbfs, host address, length "
				     "and file offset must be multiples of its page size %llu",
				     r->name, (unsigned long long)r->hpage);
	} else {
		char path[64];
		int ro;

		/*
		 * Through a read-only descriptor of the file: an append-only file
		 * (a save or restore refusing discards, halite/src/discard.h)
		 * refuses new shared mappings through a writable one, even
		 * PROT_READ ones, and then a second save would fail here, not say
		 * that the memory is being saved.
		 */
		snprintf(path, sizeof(path), "/proc/self/fd/%d", r->fd);
		ro = open(path, O_RDONLY | O_CLOEXEC);
		v = mmap(NULL, r->length, PROT_READ, MAP_SHARED, ro >= 0 ? ro : r->fd,
			 (off_t)r->fd_off);
		if (ro >= 0)
			close(ro);
		if (v == MAP_FAILED)
			return sfail(s, -errno, "region '%s': mapping its file", r->name);
		r->view = v;
	}
	s->max_page = HALITE_MAX(s->max_page, HALITE_MAX(r->hpage, 4096));
	sh = mmap(NULL, r->length, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (sh == MAP_FAILED)
		return sfail(s, -errno, "region '%s': a shadow of %llu bytes", r->name,
			     (unsigned long long)r->length);
	r->shadow = sh;
	return 0;
}

/*
 * Our own userfaultfd, or the one created inside the owner (whose copy the
 * owner keeps: if this process dies, the owner's faults then block rather
 * than the ranges losing their registration and reading zeros).
 */
int save_open_uffd(struct halite_save *s, uint64_t *missing)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | HALITE_GMEM_EVENTS;
	int ret;

	/*
	 * Another process's private memory moves aside with an mremap run in
	 * it while the range is registered: with EVENT_REMAP that mremap would
	 * take the registration along and wait for us to read its event. A
	 * move of that memory by the guest is then not followed (QEMU does not
	 * move guest RAM).
	 */
	if (s->ext_anon)
		want &= ~(uint64_t)UFFD_FEATURE_EVENT_REMAP;
	if (s->has_shared)
		want |= UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_MISSING_SHMEM;
	/* hugetlbfs faults report the huge page's address unless asked not to. */
	if (s->has_huge)
		want |= UFFD_FEATURE_MINOR_HUGETLBFS | UFFD_FEATURE_MISSING_HUGETLBFS |
			UFFD_FEATURE_EXACT_ADDRESS;
	/* The owner's descriptor is new: the handshake is ours (no TAKEOVER). */
	ret = halite_uffd_acquire(s->o.owner_pid ? s->o.owner_uffd : -1, want, 0, missing, NULL);
	if (ret < 0)
		return ret;
	s->uffd = ret;
	return 0;
}

int save_make_gmem(struct halite_save *s)
{
	struct halite_gmem_region *gr = calloc(s->nregions, sizeof(*gr));
	int ret;

	if (!gr)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];
		bool copy = r->kind == HALITE_MEM_COPY;

		/* A copy is no guest memory of the descriptor's: a placeholder. */
		gr[i] = (struct halite_gmem_region){ copy ? 0 : r->host, copy ? 0 : r->length,
						     (uint32_t)(r->hpage ? r->hpage : 4096),
						     r->kind == HALITE_MEM_SHARED };
	}
	ret = halite_gmem_create(&s->gm, s->uffd, gr, s->nregions);
	free(gr);
	return ret ? sfail(s, ret, "guest memory map (regions overlap?)") : 0;
}

/* The regions' files may lose pages again. */
void save_allow_discards(struct halite_save *s)
{
	for (uint32_t i = 0; i < s->nregions; i++)
		halite_discard_release(s->regions[i].fd, &s->regions[i].discards_refused, &s->log,
				       s->regions[i].name);
}

/*
 * Shared memory, at the snapshot instant: a hole punched in the file before
 * a block is saved would lose the block (halite/src/discard.h), so the file
 * refuses punches until the save ends. Where it cannot, the pages holding
 * data now are noted, and copy_checked() holds every block to them.
 * hugetlbfs can do neither (no file flags, no SEEK_DATA): said once.
 */
static int guard_discards(struct halite_save *s, struct sregion *r)
{
	int ret;

	ret = s->test_no_refusal ? -EPERM : halite_discard_refuse(r->fd, &r->discards_refused);
	if (!ret)
		return 0;
	if (r->hpage) {
		halite_logf(&s->log, HALITE_LOG_WARN, "region '%s' (hugetlbfs): a hole punched in "
			    "its file during the save (a balloon or virtio-mem discard) can be "
			    "neither refused nor seen: its blocks not yet saved would be saved as "
			    "zeros", r->name);
		return 0;
	}
	halite_logf(&s->log, HALITE_LOG_INFO, "region '%s': its file cannot refuse hole punches "
		    "(%s): each block is checked against what the file held at the snapshot "
		    "instant instead", r->name, strerror(-ret));
	r->had_data = calloc(r->length / 4096 / 64 + 1, sizeof(*r->had_data));
	if (!r->had_data)
		return sfail(s, -ENOMEM, "region '%s': a bitmap of its pages", r->name);
	ret = halite_file_data_pages(r->fd, r->fd_off, r->length, 4096, r->had_data);
	return ret ? sfail(s, ret, "region '%s': which pages hold data (SEEK_DATA)", r->name) : 0;
}

/* Undo arming of regions [0, n): their pages go back where they were. */
void save_disarm_regions(struct halite_save *s, uint32_t n)
{
	save_allow_discards(s);
	for (uint32_t i = 0; i < n; i++) {
		struct sregion *r = &s->regions[i];

		if (r->registered) {
			halite_uffd_unregister(s->uffd, r->host, r->length);
			r->registered = false;
		}
		if (r->aside) {
			/* Another process's: its pages go back inside it, over the empty range. */
			uint64_t res;
			int ret = s->o.remap(s->o.drop_ctx, r->aside, r->length, r->host, &res);

			if (ret)
				halite_logf(&s->log, HALITE_LOG_ERROR, "region '%s': moving process %d's "
					    "pages back from 0x%llx: %s; they are still there", r->name,
					    (int)s->o.owner_pid, (unsigned long long)r->aside,
					    strerror(-ret));
			else
				r->aside = 0;
		} else if (r->shadow && r->kind == HALITE_MEM_ANON && !s->o.owner_pid) {
			/* Nothing was touched yet: move the pages straight back. */
			mremap(r->shadow, r->length, r->length, MREMAP_MAYMOVE | MREMAP_FIXED,
			       (void *)(uintptr_t)r->host);
			r->shadow = NULL;
		}
	}
}

/*
 * Register @r for its kind, with the ioctl its give-backs need. @first: the
 * registration at arm that refuses memory another userfaultfd has. 0, or the
 * save's failure naming the region.
 */
static int register_region(struct halite_save *s, struct sregion *r, bool first)
{
	bool shared = r->kind == HALITE_MEM_SHARED;
	uint64_t mode = shared ? UFFDIO_REGISTER_MODE_MINOR | UFFDIO_REGISTER_MODE_MISSING
			       : UFFDIO_REGISTER_MODE_MISSING;
	uint64_t need = 1ull << (shared ? _UFFDIO_CONTINUE : _UFFDIO_COPY);
	int ret = halite_uffd_register(s->uffd, r->host, r->length, mode, need);

	if (ret == -EBUSY && first)
		return sfail(s, -EBUSY, "region '%s' is already registered with another "
			     "userfaultfd: a save or restore of this memory is running", r->name);
	if (ret && ret != -HALITE_E_UNSUPPORTED)
		return sfail(s, ret, "region '%s': UFFDIO_REGISTER%s", r->name,
			     first && shared ? " MINOR|MISSING (shared memory on tmpfs/memfd?)" : "");
	r->registered = true;
	if (ret)
		return sfail(s, -HALITE_E_UNSUPPORTED, "region '%s': no UFFDIO_%s", r->name,
			     shared ? "CONTINUE" : "COPY");
	return 0;
}

int save_arm_region(struct halite_save *s, struct sregion *r)
{
	bool shared = r->kind == HALITE_MEM_SHARED;
	int ret;

	/* A copy: nobody else writes it, nothing to trap. */
	if (r->kind == HALITE_MEM_COPY) {
		atomic_store_explicit(&r->armed, true, memory_order_release);
		return 0;
	}
	/*
	 * Memory another userfaultfd has (a save or a restore of it running)
	 * is refused here, before anything changes: registering says EBUSY.
	 * Then unregistered again until the region is ready: private memory's
	 * registration would follow its pages to the shadow (EVENT_REMAP), and
	 * shared memory would fault before its discard guard is in place. The
	 * guest is paused: nothing faults in between.
	 */
	ret = register_region(s, r, true);
	if (ret)
		return ret;
	if (!shared && s->o.owner_pid) {
		/*
		 * Another process's private memory: its pages move aside inside it
		 * while the range stays registered, so that any access from now on
		 * faults to us rather than finding a fresh zero page in the gap.
		 * Without EVENT_REMAP (save_open_uffd()) the registration stays with the
		 * range and the mremap does not wait for us.
		 */
		uint64_t aside = 0;
		int ret2 = s->o.remap(s->o.drop_ctx, r->host, r->length, 0, &aside);

		if (ret2 || !aside)
			return sfail(s, ret2 ? ret2 : -EIO, "region '%s': moving the owner's pages "
				     "aside (mremap MREMAP_DONTUNMAP inside process %d)", r->name,
				     (int)s->o.owner_pid);
		r->aside = aside;
		atomic_store_explicit(&r->armed, true, memory_order_release);
		goto registered;
	}
	ret = halite_uffd_unregister(s->uffd, r->host, r->length);
	if (ret)
		return sfail(s, ret, "region '%s': UFFDIO_UNREGISTER", r->name);
	r->registered = false;
	if (!shared) {
		/*
		 * glibc's mremap() passes a fifth argument whether or not there is
		 * one, and with MREMAP_DONTUNMAP this kernel refuses an unaligned
		 * new_address even without MREMAP_FIXED: leaving it out fails with
		 * EINVAL depending on what a register happens to hold.
		 */
		void *sh = mremap((void *)(uintptr_t)r->host, r->length, r->length,
				  MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);

		if (sh == MAP_FAILED)
			return sfail(s, -errno, "region '%s': mremap(MREMAP_DONTUNMAP) (private "
				     "anonymous memory in one mapping is required)", r->name);
		r->shadow = sh;
	} else {
		ret = guard_discards(s, r);
		if (ret)
			return ret;
	}
	/* What the fault thread reads of the region, published to it (serve_fault()). */
	atomic_store_explicit(&r->armed, true, memory_order_release);
	ret = register_region(s, r, false);
	if (ret)
		return ret;
registered:
	if (!shared)
		return 0;
	/*
	 * Registered first, then the owner's page-table entries go: from here
	 * every access, read or write, faults. The data stays in the file.
	 */
	if (s->o.owner_pid)
		ret = s->o.drop_ptes(s->o.drop_ctx, r->host, r->length);
	else
		ret = madvise((void *)(uintptr_t)r->host, r->length, MADV_DONTNEED) ? -errno : 0;
	if (ret)
		return sfail(s, ret, "region '%s': dropping the owner's page-table entries",
			     r->name);
	return 0;
}
