/* SPDX-License-Identifier: MIT */
/*
 * What the restore's session registers (guest_session.h does the
 * registering): each region's mode and the ioctls it needs, the
 * userfaultfd's features; and shared files refusing hole punches while the
 * restore runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "discard.h"
#include "restore_int.h"
#include "uffd.h"

void rs_session_regions(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++) {
		const struct rregion *g = &r->regions[i];
		struct gs_region *sg = &r->gs.regions[i];

		*sg = (struct gs_region){
			.name = g->name, .host = g->host, .length = g->length,
			.page = (uint32_t)(g->hpage ? g->hpage : r->page),
			.shared = g->kind == HALITE_MEM_SHARED,
			/* A copy is no memory of the descriptor's: a placeholder. */
			.placeholder = g->kind == HALITE_MEM_COPY,
			.mode = UFFDIO_REGISTER_MODE_MISSING,
			.need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_ZEROPAGE | 1ull << _UFFDIO_WAKE,
			.hint = "private anonymous or shared memfd/tmpfs/hugetlbfs memory",
		};
		/*
		 * hugetlbfs: a page being assembled in the page cache faults MINOR
		 * until UFFDIO_CONTINUE shows it (huge.c); no zero page there.
		 */
		if (g->hpage) {
			sg->mode |= UFFDIO_REGISTER_MODE_MINOR;
			sg->need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_CONTINUE |
				   1ull << _UFFDIO_WAKE;
		}
	}
}

int rs_open_uffd(struct halite_restore *r)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | HALITE_GMEM_EVENTS;
	unsigned flags = (r->o.flags & HALITE_RESTORE_ATTACH) ? HALITE_UFFD_TAKEOVER : 0;

	if (r->has_shared)
		want |= UFFD_FEATURE_MISSING_SHMEM;
	/* hugetlbfs faults report the huge page's address unless asked not to. */
	if (r->has_huge)
		want |= UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS |
			UFFD_FEATURE_EXACT_ADDRESS;
	return gs_open_uffd(&r->gs, r->external ? r->o.owner_uffd : -1, want, flags);
}

/* Shared regions' files refuse hole punches while the restore needs them (discard.h). */
void rs_refuse_discards(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++) {
		struct rregion *g = &r->regions[i];
		int ret;

		if (g->kind != HALITE_MEM_SHARED)
			continue;
		if (g->hpage) {
			/* No file flags there: said, not refused (docs/failure-model.md). */
			halite_logf(&r->log, HALITE_LOG_INFO, "region '%s' (hugetlbfs): a hole "
				    "punched in its file during the restore cannot be refused: a huge "
				    "page discarded before it is in would be filled again", g->name);
			continue;
		}
		ret = halite_discard_refuse(g->fd, &g->discards_refused);
		if (ret)
			halite_logf(&r->log, HALITE_LOG_WARN, "region '%s': its file cannot refuse "
				    "hole punches (%s): a discard (balloon, virtio-mem) of a page "
				    "not yet restored would be filled again by the restore", g->name,
				    strerror(-ret));
	}
}

void rs_allow_discards(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++)
		halite_discard_release(r->regions[i].fd, &r->regions[i].discards_refused, &r->log,
				       r->regions[i].name);
}
