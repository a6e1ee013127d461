/* SPDX-License-Identifier: MIT */
/*
 * Private: guest memory as both engines reach it through one userfaultfd.
 *
 * The engines think in regions and offsets; the kernel in addresses of the
 * owner's mappings, which the guest (or its VMM) may change while an engine
 * runs. This module keeps the two in step and owns every write into guest
 * memory through the descriptor:
 *
 * - Non-cooperative events (UFFD_FEATURE_EVENT_REMOVE, _UNMAP, _REMAP), read
 *   with the page faults and applied at once, per page: a page of private
 *   memory the guest discarded (MADV_DONTNEED/REMOVE/FREE) or any page it
 *   unmapped is "gone": the engine never installs its snapshot bytes again,
 *   and a fault on it gets zeros, which is what a discard means. A moved
 *   range (mremap) keeps its pages: later faults and installs follow it. A
 *   discard of shared memory only drops the owner's page-table entries (the
 *   page cache keeps the data) and marks nothing; a hole punched in the file
 *   is for the engines to prevent or detect (halite/src/discard.h).
 * - Installs (UFFDIO_COPY, _ZEROPAGE, _CONTINUE), page by page where a range
 *   crosses mappings (a VMA split by madvise): a page already present
 *   (EEXIST) is skipped and woken, a gone page is skipped or zero-filled,
 *   and ENOENT is success only for a page known gone or after the engine
 *   unregistered (halite_gmem_ended()); anything else is an error.
 *
 * Ordering. The kernel blocks a discarding thread until its REMOVE event is
 * read, and zaps the pages only after that read; an install that lands
 * between the read and the zap is zapped with them, one that lands after it
 * would put back what the guest discarded. So events are read under the
 * write side of a lock whose read side every install holds from its check of
 * the gone bits to the end of its ioctl: an install either finished before
 * the read (and is zapped) or sees the bits. Installs drop the read side
 * before they wait: EAGAIN (the kernel's "mm changing": an event is pending)
 * is answered by reading the events, from whichever thread got it, so the
 * fault thread can never wait on an event only it would read. Page faults
 * read by another thread are queued for the fault thread, which
 * halite_gmem_fault_fd() wakes.
 */
#ifndef HALITE_GMEM_H
#define HALITE_GMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uffd.h"

/* The events both engines ask for (UFFDIO_API), and apply here. */
#define HALITE_GMEM_EVENTS \
	(UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP)

struct halite_gmem;

struct halite_gmem_region {
	uint64_t host;	 /* registered range in the owner's address space */
	/*
	 * A multiple of @page. 0: a placeholder, which keeps the engines'
	 * region numbers for a region that is not guest memory reached through
	 * the descriptor (HALITE_MEM_COPY): no address is in it, and it must
	 * never be filled or woken.
	 */
	uint64_t length;
	uint32_t page;	 /* the mapping's page size: 4 KiB, or a huge page */
	bool shared;	 /* a discard keeps the data in the page cache */
};

struct halite_gmem_stats {
	uint64_t pages_discarded; /* private pages the guest discarded (REMOVE) */
	uint64_t pages_unmapped;  /* pages the guest unmapped (UNMAP) */
	uint64_t remaps;	  /* ranges it moved (REMAP) */
	uint64_t events;	  /* non-cooperative events read */
};

/*
 * @uffd is borrowed (the engine closes it after halite_gmem_free()). Regions
 * are copied. 0, -EINVAL or -ENOMEM.
 */
int halite_gmem_create(struct halite_gmem **g, int uffd, const struct halite_gmem_region *r,
		       uint32_t n);
void halite_gmem_free(struct halite_gmem *g);

/* halite_gmem_fill() modes */
enum { HALITE_GMEM_COPY, HALITE_GMEM_ZERO, HALITE_GMEM_CONTINUE };
/* halite_gmem_fill() flags */
#define HALITE_GMEM_ZERO_GONE 0x1u /* gone pages get zeros (a fault on one); else skipped */
#define HALITE_GMEM_DONTWAKE 0x2u  /* leave the faulting threads asleep */
#define HALITE_GMEM_WRITE 0x4u	   /* zero fills copy zeros, sparing the COW of the zero page */

/*
 * Fill [@off, @off + @len) of region @ri, page aligned: COPY from @src (@len
 * bytes, read in this process), ZERO, or CONTINUE (map the page cache; a
 * page that is a hole gets zeros, which is what it holds). See the top for
 * what is skipped. 0, or -errno: -ENOENT for a page that is neither mapped
 * nor known gone, -ESRCH when the owner is gone, others from the ioctls.
 * Thread-safe.
 */
int halite_gmem_fill(struct halite_gmem *g, uint32_t ri, uint64_t off, uint64_t len,
		     const void *src, int mode, unsigned flags);

/* Wake the threads faulting in [@off, @off + @len) of region @ri. */
int halite_gmem_wake(struct halite_gmem *g, uint32_t ri, uint64_t off, uint64_t len);

/*
 * Answer a fault no region holds (an address a REMAP left behind, or a
 * fault read before the range moved): what the mapping holds, zeros for a
 * missing page or the page cache for a minor fault; a page no longer mapped
 * only needs its thread woken. 0 or -errno.
 */
int halite_gmem_serve_stray(struct halite_gmem *g, const struct uffd_msg *m);

/*
 * Region and offset of the page holding @addr now, or false. Thread-safe.
 */
bool halite_gmem_lookup(struct halite_gmem *g, uint64_t addr, uint32_t *ri, uint64_t *off);

/* Was page @off of region @ri discarded or unmapped since the engine started? */
bool halite_gmem_gone(const struct halite_gmem *g, uint32_t ri, uint64_t off);

/*
 * Read every message there is: events are applied, page faults queued for
 * halite_gmem_take_faults(). Returns how many page faults were queued, or
 * -errno (-EBADF, ...; EAGAIN is not an error). Thread-safe.
 */
int halite_gmem_sync(struct halite_gmem *g);

/*
 * The fault thread: up to @max page faults, those queued by other threads
 * first, then what the descriptor has now (its events applied). Returns
 * how many, or -errno when reading the descriptor failed.
 */
int halite_gmem_take_faults(struct halite_gmem *g, struct uffd_msg *out, int max);

/*
 * An eventfd that becomes readable when page faults were queued by a thread
 * other than the one that takes them: the fault thread polls it beside the
 * userfaultfd. halite_gmem_take_faults() drains it.
 */
int halite_gmem_fault_fd(const struct halite_gmem *g);

/*
 * The engine has unregistered (or is about to unregister) every range:
 * from now on ENOENT from an install means exactly that, and is success.
 */
void halite_gmem_ended(struct halite_gmem *g);

/*
 * Call @fn for each range of guest memory where it is now: the regions as
 * moved since, without what was unmapped. Under the read lock: @fn must not
 * call back into this module.
 */
void halite_gmem_ranges(struct halite_gmem *g,
			void (*fn)(void *ctx, uint32_t ri, uint64_t host, uint64_t len), void *ctx);

/*
 * The end: halite_gmem_ended(), then unregister every range where it is
 * now and where it was at the start (a REMAP leaves the old range behind,
 * registered), and wake their threads. 0, or the first error other than
 * for a range that is no longer mapped.
 */
int halite_gmem_unregister(struct halite_gmem *g);

void halite_gmem_stats(struct halite_gmem *g, struct halite_gmem_stats *st);

#endif
