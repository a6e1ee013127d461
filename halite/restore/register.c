/* SPDX-License-Identifier: MIT */
/*
 * The guest memory's registration: the userfaultfd (our own or the owner's,
 * through halite/src/uffd.h), each region registered, the gmem map of the
 * regions, and shared files refusing hole punches while the restore runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "discard.h"
#include "restore_int.h"
#include "uffd.h"

int rs_open_uffd(struct halite_restore *r)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | HALITE_GMEM_EVENTS, missing = 0;
	unsigned flags = (r->o.flags & HALITE_RESTORE_ATTACH) ? HALITE_UFFD_TAKEOVER : 0;
	const char *why;
	char names[128];

	if (r->has_shared)
		want |= UFFD_FEATURE_MISSING_SHMEM;
	/* hugetlbfs faults report the huge page's address unless asked not to. */
	if (r->has_huge)
		want |= UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS |
			UFFD_FEATURE_EXACT_ADDRESS;
	r->uffd = halite_uffd_acquire(r->external ? r->o.owner_uffd : -1, want, flags, &missing,
				      &why);
	if (r->uffd >= 0)
		return 0;
	if (why)
		return rs_fail(r, r->uffd, "owner_uffd %d %s", r->o.owner_uffd, why);
	/* Our dup of the owner's descriptor failed. */
	if (r->external && (r->uffd == -EBADF || r->uffd == -EMFILE))
		return rs_fail(r, r->uffd, "owner_uffd %d", r->o.owner_uffd);
	return rs_fail(r, r->uffd, "userfaultfd%s%s", missing ? " lacks " : "",
		       missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
}

int rs_register_region(struct halite_restore *r, struct rregion *g)
{
	uint64_t mode = UFFDIO_REGISTER_MODE_MISSING;
	uint64_t need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_ZEROPAGE | 1ull << _UFFDIO_WAKE;
	int ret;

	/*
	 * hugetlbfs: a page being assembled in the page cache faults MINOR
	 * until UFFDIO_CONTINUE shows it (huge.c); no zero page there.
	 */
	if (g->hpage) {
		mode |= UFFDIO_REGISTER_MODE_MINOR;
		need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_CONTINUE | 1ull << _UFFDIO_WAKE;
	}
	/* Registering again with the same descriptor (ATTACH) is allowed. */
	ret = halite_uffd_register(r->uffd, g->host, g->length, mode, need);
	if (ret == -EBUSY)
		return rs_fail(r, -EBUSY, "region '%s' is already registered with another "
			     "userfaultfd: a save or restore of this memory is running", g->name);
	if (ret && ret != -HALITE_E_UNSUPPORTED)
		return rs_fail(r, ret, "region '%s': UFFDIO_REGISTER %s (private anonymous "
			     "or shared memfd/tmpfs/hugetlbfs memory?)", g->name,
			     g->hpage ? "MISSING|MINOR" : "MISSING");
	g->registered = true;
	if (ret)
		return rs_fail(r, ret, "region '%s': no UFFDIO_COPY and %s on this memory",
			       g->name, g->hpage ? "UFFDIO_CONTINUE" : "UFFDIO_ZEROPAGE");
	return 0;
}

void rs_unregister_all(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++) {
		struct rregion *g = &r->regions[i];

		if (g->registered && !halite_uffd_unregister(r->uffd, g->host, g->length))
			g->registered = false;
	}
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

int rs_make_gmem(struct halite_restore *r)
{
	struct halite_gmem_region *gr = calloc(r->nregions, sizeof(*gr));
	int ret;

	if (!gr)
		return -ENOMEM;
	for (uint32_t i = 0; i < r->nregions; i++) {
		bool copy = r->regions[i].kind == HALITE_MEM_COPY;

		/* A copy is no memory of the descriptor's: a placeholder. */
		gr[i] = (struct halite_gmem_region){ copy ? 0 : r->regions[i].host,
						     copy ? 0 : r->regions[i].length,
						     (uint32_t)(r->regions[i].hpage ? r->regions[i].hpage :
								r->page),
						     r->regions[i].kind == HALITE_MEM_SHARED };
	}
	ret = halite_gmem_create(&r->gm, r->uffd, gr, r->nregions);
	free(gr);
	return ret ? rs_fail(r, ret, "guest memory map") : 0;
}
