/* SPDX-License-Identifier: MIT */
/*
 * Restore onto hugetlbfs: the unit of installation is the huge page.
 *
 * The kernel maps a hugetlbfs page whole, so no memory block of a huge page
 * can reach the guest before every other one: a huge page (2 MiB; 1 GiB
 * pages work the same, one fault then waits for 1 GiB) becomes visible only
 * once all its stored blocks are decoded into it, its zero and never-touched
 * blocks being the zeros of a fresh page. Its blocks lie in several locality
 * blocks (an LB of 64 KiB holds 8 to a few dozen of the 256 blocks of 8 KiB
 * of a 2 MiB page, and a file saved from 4 KiB memory spreads a huge page
 * over many LBs, each also holding blocks of other huge pages).
 *
 * Mechanism: the page is assembled in place, in the file's page cache, and
 * shown to the guest with UFFDIO_CONTINUE. The region is registered MISSING
 * and MINOR (UFFD_FEATURE_MINOR_HUGETLBFS): a guest access to a page that is
 * a hole faults MISSING, and one to a page present in the page cache but not
 * yet mapped for the guest faults MINOR, so a page being assembled faults
 * into the engine like a hole until its UFFDIO_CONTINUE, which maps the whole
 * page and wakes its threads (checked by test_restore_huge: a thread touching
 * a half-written page stays blocked until the CONTINUE). Every block is
 * decoded straight into the engine's own shared mapping of the file (g->map,
 * never registered), by whichever thread installs it: the fault thread or a
 * demand reader for the blocks of pages a fault waits for, the pool for the
 * rest of each LB, as for any memory. The thread that writes a page's last
 * stored block makes it visible (hp_complete()).
 *
 * Why not MISSING faults and one UFFDIO_COPY of a complete 2 MiB buffer
 * (how memfd/tmpfs regions are restored, block by block)? Measured on this
 * project's 2-core machine, one 2 MiB page of LZ4 blocks (8 KiB, half
 * compressible) installed by one thread: 0.93 ms in place (fallocate, which
 * zeroes the page, 0.24; decoding into it 0.69; UFFDIO_CONTINUE 0.003)
 * against 0.88 ms through a buffer (decoding 0.60; UFFDIO_COPY 0.27): the
 * same within 6%. But a page's blocks come from several LBs that land at
 * different times, so a buffer would have to hold each partly assembled page
 * (2 MiB of extra memory each, as many as pages touched by the LBs in
 * memory, up to all of guest memory for a file saved from 4 KiB pages) or
 * keep LBs in memory until every page they touch is complete, or read them
 * again. Assembling in the page cache uses the memory the guest gets anyway:
 * every LB is still read once and every block decoded once, whatever the
 * layout, and a fault waits for the LBs of its page only.
 *
 * Allocation: the engine's mapping reserves the pages of the range at open
 * (rs_huge_region()), and each page is allocated with fallocate() before
 * its first block is written, so a shortage of huge pages fails the
 * restore (ENOMEM at open; ENOSPC later only after a hole punch released
 * the reservation) instead of a SIGBUS in the engine's write. A hole
 * punched in the file during the restore (hugetlbfs can refuse none: no
 * file flags) drops a page being assembled: the blocks written after it
 * land in a fresh page of zeros, and the guest, which discarded the page,
 * sees zeros and snapshot bytes there, never a byte that was not verified;
 * halite-qemu refuses hugetlbfs RAM with a balloon or virtio-mem device.
 *
 * States, per huge page (struct rhp): @written counts the stored blocks
 * decoded into it, @stored is its number of stored blocks (counted at the
 * first use, so open does not walk the memory map), @in says it is complete
 * and mapped for the guest. A memory block's MB_INSTALLED means decoded into
 * its page, not visible: the fault path asks @in. @wanted (set under lk by
 * the fault thread) makes readers landing an LB write that page's blocks
 * before handing the LB to the pool; @waiters are the faults to count as
 * served when the page comes in (the CONTINUE wakes their threads).
 *
 * Failure: a page missing a block of an LB that failed is never completed,
 * so its faulting threads stay blocked, as for other memory; what was
 * written of it stays in the page cache, unmapped for the guest.
 *
 * Taking over (ATTACH): a page is in when the owner's page tables map it
 * (pagemap: only UFFDIO_CONTINUE or a copy map a page there); a page in the
 * page cache but not mapped was being assembled, and is written again whole
 * (its stored blocks; its zero blocks were never written).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include "endian_util.h"
#include "restore_int.h"
#include "uffd.h"

/* Huge page of region @g holding region offset @off. */
static struct rhp *hp_at(struct halite_restore *r, const struct rregion *g, uint64_t off)
{
	return &r->hps[g->first_hp + off / g->hpage];
}

/* The stored blocks of the page at region offset @hpo, counted once. */
/*
 * Into *@stored; 0 or the failure (rs_fail()). Counting looks up every block
 * of the page, so a 1.1 file's index chunks for all of them come in here:
 * once it has succeeded, lookups of the page's blocks cannot fail.
 */
static int hp_stored(struct halite_restore *r, const struct rregion *g, struct rhp *hp,
		     uint64_t hpo, uint32_t *stored)
{
	uint32_t n = atomic_load(&hp->stored);
	uint64_t mb0 = g->first_mb + hpo / r->mb_size;

	if (n) {
		*stored = n - 1;
		return 0;
	}
	for (uint64_t mb = mb0; mb < mb0 + g->hpage / r->mb_size; mb++) {
		struct halite_mb_loc loc;
		int ret = halite_reader_mb_lookup(r->rd, mb, &loc);

		if (ret)
			return rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
				       halite_reader_errmsg(r->rd));
		n += loc.state == HALITE_MB_STORED;
	}
	/* Any thread counts the same: no CAS needed. */
	atomic_store(&hp->stored, n + 1);
	*stored = n;
	return 0;
}

static const struct rs_strategy huge_strategy;

int rs_huge_region(struct halite_restore *r, struct rregion *g)
{
	struct statfs sf;
	void *m;

	if (fstatfs(g->fd, &sf))
		return rs_fail(r, -errno, "region '%s': fstatfs of its file", g->name);
	if (sf.f_type != HUGETLBFS_MAGIC)
		return 0;
	g->hpage = (uint64_t)sf.f_bsize;
	if (g->hpage % r->mb_size || g->host % g->hpage || g->length % g->hpage ||
	    g->fd_off % g->hpage)
		return rs_fail(r, -EINVAL, "region '%s': on hugetlbfs, its host address, length and "
			       "file offset must be multiples of its page size %llu, and that of "
			       "the file's memory blocks (%u bytes)", g->name, ULL(g->hpage),
			       r->mb_size);
	/*
	 * Where blocks are decoded. Not NORESERVE: the mapping reserves every
	 * page of the range that is not reserved yet (the guest's own mapping
	 * reserved it, unless it was made NORESERVE or a hole punch emptying
	 * the range released it, as halite-qemu's does), so neither the
	 * engine's allocations nor the guest's later faults on pages left holes
	 * can find the pool empty; the reservation stays with the file after
	 * the mapping goes. A shortage fails here, before anything starts.
	 */
	m = mmap(NULL, g->length, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, (off_t)g->fd_off);
	if (m == MAP_FAILED && errno == ENOMEM)
		return rs_fail(r, -ENOMEM, "region '%s': cannot reserve its %llu huge pages of %llu "
			       "bytes: too few free (reserve more: vm.nr_hugepages)", g->name,
			       ULL(g->length / g->hpage), ULL(g->hpage));
	if (m == MAP_FAILED)
		return rs_fail(r, -errno, "region '%s': mapping its hugetlbfs file to write into "
			       "it (open for reading and writing?)", g->name);
	g->map = m;
	r->has_huge = true;
	r->huge = &huge_strategy;
	return 0;
}

static int huge_init(struct halite_restore *r)
{
	if (!r->has_huge)
		return 0;
	for (uint32_t i = 0; i < r->nregions; i++) {
		struct rregion *g = &r->regions[i];

		if (!g->hpage)
			continue;
		g->first_hp = r->nhp;
		r->nhp += g->length / g->hpage;
	}
	r->hps = calloc(r->nhp, sizeof(*r->hps));
	return r->hps ? 0 : -ENOMEM;
}

static void huge_free(struct halite_restore *r)
{
	for (uint64_t i = 0; r->hps && i < r->nhp; i++) {
		struct fault_waiter *w;

		while ((w = r->hps[i].waiters)) {
			r->hps[i].waiters = w->next;
			free(w);
		}
	}
	free(r->hps);
	for (uint32_t i = 0; r->regions && i < r->nregions; i++)
		if (r->regions[i].map)
			munmap(r->regions[i].map, r->regions[i].length);
}

/*
 * Is the file range empty? hugetlbfs counts its allocated pages in the
 * inode's blocks, but has no SEEK_DATA (everything is "data") and no
 * cachestat: so a file with pages somewhere is asked page by page, by
 * UFFDIO_CONTINUE on a scratch mapping registered MINOR, which maps a page
 * the file holds and fails with EFAULT on a hole, allocating nothing.
 */
static int huge_check_empty(struct halite_restore *r, const struct rregion *g)
{
	struct stat st;
	uint64_t found = UINT64_MAX;
	void *m;
	int fd, ret = 0;

	if (fstat(g->fd, &st))
		return rs_fail(r, -errno, "region '%s': fstat of its file", g->name);
	if (!st.st_blocks)
		return 0;
	m = mmap(NULL, g->length, PROT_READ, MAP_SHARED | MAP_NORESERVE, g->fd, (off_t)g->fd_off);
	if (m == MAP_FAILED)
		return rs_fail(r, -errno, "region '%s': mapping its file", g->name);
	fd = halite_uffd_open(UFFD_FEATURE_MINOR_HUGETLBFS, NULL);
	ret = fd < 0 ? fd : halite_uffd_register(fd, (uintptr_t)m, g->length,
						 UFFDIO_REGISTER_MODE_MINOR, 0);
	if (ret) {
		ret = rs_fail(r, ret, "region '%s': which huge pages its file holds (userfaultfd "
			      "MINOR)", g->name);
	}
	for (uint64_t o = 0; !ret && o < g->length && found == UINT64_MAX; o += g->hpage) {
		struct uffdio_continue c = { .range = { (uintptr_t)m + o, g->hpage },
					     .mode = UFFDIO_CONTINUE_MODE_DONTWAKE };

		if (!ioctl(fd, UFFDIO_CONTINUE, &c) || errno == EEXIST)
			found = o;
		else if (errno != EFAULT)
			ret = rs_fail(r, -errno, "region '%s': which huge pages its file holds "
				      "(UFFDIO_CONTINUE)", g->name);
	}
	if (fd >= 0)
		close(fd);
	munmap(m, g->length);
	if (!ret && found != UINT64_MAX)
		ret = rs_fail(r, -EEXIST, "region '%s': its file already holds the huge page at "
			      "offset %llu of the region; a restore needs an empty range (punch a "
			      "hole first)", g->name, ULL(found));
	return ret;
}

static void huge_attach(struct halite_restore *r, const struct rregion *g, const uint64_t *bits)
{
	for (uint64_t o = 0; o < g->length; o += g->hpage) {
		uint64_t p = o / r->page;

		/* Mapped for the guest: whole (hugetlbfs maps whole pages) and complete. */
		if ((bits[p / 64] >> (p % 64)) & 1) {
			atomic_store(&hp_at(r, g, o)->in, 1);
			atomic_store(&hp_at(r, g, o)->alloc, 1);
		}
	}
}

static bool huge_in(struct halite_restore *r, uint64_t mb)
{
	const struct rregion *g = rs_region_of_mb(r, mb);

	return atomic_load(&hp_at(r, g, (mb - g->first_mb) * r->mb_size)->in);
}

static bool huge_wanted(struct halite_restore *r, uint64_t mb)
{
	const struct rregion *g = rs_region_of_mb(r, mb);
	struct rhp *hp;

	if (!g->hpage)
		return false;
	hp = hp_at(r, g, (mb - g->first_mb) * r->mb_size);
	return atomic_load(&hp->wanted) && !atomic_load(&hp->in);
}

/*
 * Every stored block is in the page at region offset @hpo (none: it is a
 * page of zeros, a hole until now): map it for the guest, which wakes the
 * threads faulting on it, then count their faults served. 0 or -errno.
 */
static int hp_complete(struct halite_restore *r, const struct rregion *g, struct rhp *hp,
		       uint64_t hpo)
{
	uint32_t ri = (uint32_t)(g - r->regions);
	struct fault_waiter *w, *next;
	int ret;

	/* A hole (no stored block) gets zeros: gmem copies them in (EFAULT). */
	ret = halite_gmem_fill(r->gs.gm, ri, hpo, g->hpage, NULL, HALITE_GMEM_CONTINUE, 0);
	if (ret)
		return rs_install_failed(r, ret, g->first_mb + hpo / r->mb_size,
					 "UFFDIO_CONTINUE of its huge page");
	/* Under lk with the waiters: a fault queued after this sees @in (huge_fault). */
	pthread_mutex_lock(&r->src.lk);
	atomic_store(&hp->in, 1);
	w = hp->waiters;
	hp->waiters = NULL;
	pthread_mutex_unlock(&r->src.lk);
	for (; w; w = next) {
		next = w->next;
		rs_fault_served(r, w->t0);
		free(w);
	}
	return 0;
}

static int hp_alloc(struct halite_restore *r, const struct rregion *g, uint64_t hpo)
{
	int ret;

	do
		ret = fallocate(g->fd, FALLOC_FL_KEEP_SIZE, (off_t)(g->fd_off + hpo),
				(off_t)g->hpage);
	while (ret && errno == EINTR);
	if (!ret)
		return 0;
	return rs_fail(r, -errno, "region '%s': allocating its huge page at offset %llu%s",
		       g->name, ULL(hpo), errno == ENOSPC || errno == ENOMEM ?
		       " (no free huge page: reserve more, vm.nr_hugepages)" : "");
}

static int huge_write(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf, int by)
{
	const struct rregion *g = rs_region_of_mb(r, mb);
	uint64_t off = (mb - g->first_mb) * r->mb_size, hpo = off - off % g->hpage;
	struct rhp *hp = hp_at(r, g, off);
	uint32_t stored;
	int ret;

	/* Racing threads both allocate: the second fallocate finds the page there. */
	if (!atomic_load(&hp->alloc)) {
		ret = hp_alloc(r, g, hpo);
		if (ret)
			return ret;
		atomic_store(&hp->alloc, 1);
	}
	ret = halite_reader_decode_mb(r->rd, mb, lb_buf, g->map + off);
	if (ret)
		return rs_fail(r, ret, "memory block %llu does not decode", ULL(mb));
	rs_installed(r, mb, by);
	ret = hp_stored(r, g, hp, hpo, &stored);
	if (ret)
		return ret;
	/* Each write gets its own count: exactly one thread sees the last. */
	if (atomic_fetch_add(&hp->written, 1) + 1 != stored)
		return 0;
	return hp_complete(r, g, hp, hpo);
}

/*
 * Under lk, the page's LBs marked READING: is @lb the last of a run of them
 * in its stream? Readahead goes on from there (src_ra_push).
 */
static bool ra_end(struct halite_restore *r, uint64_t lb)
{
	uint64_t next = r->src.ra_next ? src_ra_next(&r->src, lb) : UINT64_MAX;

	return r->src.ra_next && (next == UINT64_MAX || atomic_load(&r->src.st[next]) == LB_IDLE);
}

static void huge_fault(struct halite_restore *r, uint64_t mb, const struct gs_fault *f)
{
	const struct rregion *g = &r->regions[f->ri];
	uint64_t hpo = f->off - f->off % g->hpage, mb0 = g->first_mb + hpo / r->mb_size;
	struct rhp *hp = hp_at(r, g, f->off);
	uint64_t queued[64], first = UINT64_MAX;
	struct halite_mb_loc loc;
	size_t nq = 0, nread = 0, wake = 0;
	struct fault_waiter *w;
	bool inline_read;
	uint32_t stored;
	int ret = hp_stored(r, g, hp, hpo, &stored);

	if (ret) {
		/* Its index is damaged: the restore fails, the page never completes. */
		rs_set_failed(r, ret);
		return;
	}
	pthread_mutex_lock(&r->src.lk);
	if (atomic_load(&hp->in)) {
		/* Raced with its completion, or the guest punched the page out since. */
		pthread_mutex_unlock(&r->src.lk);
		gs_count_kind(stored ? &r->gs.faults_cached : &r->gs.faults_zero, f);
		/* Present: EEXIST, woken; a hole: zeros, what a discard means. */
		ret = halite_gmem_fill(r->gs.gm, f->ri, hpo, g->hpage, NULL, HALITE_GMEM_CONTINUE, 0);
		if (ret)
			rs_set_failed(r, rs_fail(r, ret, "memory block %llu: waking a fault",
						 ULL(mb)));
		else
			rs_fault_served(r, f->t0);
		return;
	}
	w = malloc(sizeof(*w));
	if (!w) {
		pthread_mutex_unlock(&r->src.lk);
		rs_set_failed(r, rs_fail(r, -ENOMEM, "memory block %llu: waiter", ULL(mb)));
		return;
	}
	*w = (struct fault_waiter){ hp->waiters, mb, f->t0 };
	hp->waiters = w;
	if (atomic_load(&hp->wanted)) {
		/* Another fault on this page came first: its reads are on their way. */
		pthread_mutex_unlock(&r->src.lk);
		return;
	}
	atomic_store(&hp->wanted, 1);
	if (!stored) {
		/* A page of zeros, installed by this fault (only faults install these). */
		pthread_mutex_unlock(&r->src.lk);
		gs_count_kind(&r->gs.faults_zero, f);
		ret = hp_complete(r, g, hp, hpo);
		if (ret)
			rs_set_failed(r, ret);
		return;
	}
	/*
	 * Every LB holding a block of the page that nobody has read, the
	 * faulting block's first; those being read or in memory already write
	 * their blocks of it when they land, or in the pool. With nobody
	 * queued ahead, the fault thread reads the first itself if the page
	 * cache has it (src_read_cached), while the readers take the others.
	 */
	inline_read = src_inline_ok(&r->src);
	halite_reader_mb_lookup(r->rd, mb, &loc);
	if (loc.state == HALITE_MB_STORED && atomic_load(&r->src.st[loc.lb]) == LB_IDLE) {
		first = loc.lb;
		atomic_store(&r->src.st[first], LB_READING);
		r->lbs[first].fault_mb = mb;
		queued[nq++] = first;
		nread++;
		if (!inline_read) {
			ret = src_queue_push(&r->src, first);
			wake++;
		}
	}
	for (uint64_t m = mb0; m < mb0 + g->hpage / r->mb_size && !ret; m++) {
		struct rlb *b;

		halite_reader_mb_lookup(r->rd, m, &loc);
		if (loc.state != HALITE_MB_STORED)
			continue;
		b = &r->lbs[loc.lb];
		if (atomic_load(&r->src.st[loc.lb]) != LB_IDLE)
			continue;
		atomic_store(&r->src.st[loc.lb], LB_READING);
		/* For the trace: a block of the page in that LB (docs/restore-trace.md). */
		b->fault_mb = m;
		ret = src_queue_push(&r->src, loc.lb);
		wake++;
		nread++;
		if (nq < HALITE_ARRAY_SIZE(queued))
			queued[nq++] = loc.lb;
	}
	/*
	 * Readahead past the page's LBs: from the last of each stream's run of
	 * them (src_read_cached() does it for the one it reads).
	 */
	for (size_t i = 0; i < nq && !ret; i++)
		if ((queued[i] != first || !inline_read) && ra_end(r, queued[i]))
			wake += src_ra_push(&r->src, queued[i]);
	pthread_mutex_unlock(&r->src.lk);
	while (wake--)
		pthread_cond_signal(&r->src.q_cond);
	if (ret) {
		rs_set_failed(r, rs_fail(r, ret, "memory block %llu: demand queue", ULL(mb)));
		return;
	}
	if (!nread)
		/* Its blocks are all in memory or being read: nothing to read for it. */
		gs_count_kind(&r->gs.faults_cached, f);
	if (first != UINT64_MAX && inline_read && !src_read_cached(&r->src, first, r->fault_tmp)) {
		pthread_mutex_lock(&r->src.lk);
		ret = src_queue_push(&r->src, first);
		pthread_mutex_unlock(&r->src.lk);
		pthread_cond_signal(&r->src.q_cond);
		if (ret)
			rs_set_failed(r, rs_fail(r, ret, "memory block %llu: demand queue", ULL(mb)));
	}
}

static const struct rs_strategy huge_strategy = {
	.name = "huge pages",
	.init = huge_init,
	.free = huge_free,
	.check_empty = huge_check_empty,
	.attach = huge_attach,
	.fault = huge_fault,
	.wanted = huge_wanted,
	.write = huge_write,
	.in = huge_in,
};
