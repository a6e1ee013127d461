/* SPDX-License-Identifier: MIT */
/*
 * Guest memory through one userfaultfd: events, installs, the gone pages and
 * where each region's pages are now (gmem.h says what and why).
 *
 * Where pages are: a map of extents {cur, len, region, off}, sorted by their
 * current address and disjoint, starts as one extent per region. An UNMAP
 * cuts extents (their pages become gone); a REMAP cuts and re-inserts them
 * at the new address. Until the first of either, a region's page is at
 * host + off and no lookup searches backwards. Extents are few (one per
 * region plus one per move), so every change rebuilds the array.
 *
 * Gone pages: one bit per page of each region, set under the write lock and
 * never cleared: once the guest discarded or unmapped a page, the snapshot's
 * bytes have no business there again, whatever it does with the page next.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "endian_util.h"
#include "gmem.h"

#define READ_BATCH 64
/*
 * How long an install that found a page unmapped (ENOENT) waits for the
 * UNMAP event that explains it: munmap queues the event just after it drops
 * the mmap lock, so the window is a scheduling delay, not I/O. Long enough
 * for a preempted thread on a loaded machine; a page still unexplained
 * after it is an error, never silently skipped.
 */
#define ENOENT_WAIT_NS 2000000000ull
#define ZEROS_MIN (2u << 20)

struct ext {
	uint64_t cur, len;
	uint64_t off;
	uint32_t ri;
};

struct halite_gmem {
	int uffd;
	struct halite_gmem_region *regions;
	uint32_t nregions;
	uint64_t *first_page; /* per region: its first bit in @gone */
	_Atomic uint64_t *gone;
	uint8_t *zeros;	      /* zeros_len bytes that read as zeros, never written */
	uint64_t zeros_len;

	pthread_rwlock_t lk;  /* read: an install's check-and-ioctl; write: reading events */
	struct ext *ext;      /* under lk */
	uint32_t next;
	_Atomic bool moved;   /* some extent is no longer where its region was */

	pthread_mutex_t q_lk; /* page faults read by halite_gmem_sync(), for the fault thread */
	struct uffd_msg *q;
	size_t q_head, q_len, q_cap;
	int fault_efd;

	_Atomic bool ended;
	_Atomic uint64_t n_discarded, n_unmapped, n_remaps, n_events;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int halite_gmem_create(struct halite_gmem **gp, int uffd, const struct halite_gmem_region *r,
		       uint32_t n)
{
	pthread_rwlockattr_t ra;
	struct halite_gmem *g;
	uint64_t pages = 0;

	if (!gp || uffd < 0 || !r || !n)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (!r[i].page || (r[i].page & (r[i].page - 1)) || r[i].length % r[i].page ||
		    r[i].host % r[i].page)
			return -EINVAL;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->uffd = uffd;
	g->fault_efd = -1;
	pthread_rwlockattr_init(&ra);
	/*
	 * Installs hold the read side all the time; the fault thread's read of
	 * the events must not starve behind them.
	 */
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&g->lk, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_mutex_init(&g->q_lk, NULL);
	g->nregions = n;
	g->regions = malloc(n * sizeof(*g->regions));
	g->first_page = malloc(n * sizeof(*g->first_page));
	g->ext = malloc(n * sizeof(*g->ext));
	if (!g->regions || !g->first_page || !g->ext)
		goto nomem;
	memcpy(g->regions, r, n * sizeof(*r));
	g->zeros_len = ZEROS_MIN;
	for (uint32_t i = 0; i < n; i++) {
		g->first_page[i] = pages;
		pages += r[i].length / r[i].page;
		g->zeros_len = HALITE_MAX(g->zeros_len, (uint64_t)r[i].page);
		/* A placeholder (no memory) has no extent: no address is ever its. */
		if (r[i].length)
			g->ext[g->next++] = (struct ext){ r[i].host, r[i].length, 0, i };
	}
	/* Sorted by address; the engines' regions may come in any order. */
	for (uint32_t i = 1; i < g->next; i++)
		for (uint32_t j = i; j > 0 && g->ext[j - 1].cur > g->ext[j].cur; j--) {
			struct ext t = g->ext[j];

			g->ext[j] = g->ext[j - 1];
			g->ext[j - 1] = t;
		}
	for (uint32_t i = 1; i < g->next; i++)
		if (g->ext[i - 1].cur + g->ext[i - 1].len > g->ext[i].cur) {
			halite_gmem_free(g);
			return -EINVAL;
		}
	/* calloc'ed: pages of the bitmap appear only where a bit is set. */
	g->gone = calloc((pages + 63) / 64 ? (pages + 63) / 64 : 1, sizeof(*g->gone));
	g->zeros = mmap(NULL, g->zeros_len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			-1, 0);
	g->fault_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!g->gone || g->zeros == MAP_FAILED || g->fault_efd < 0) {
		if (g->zeros == MAP_FAILED)
			g->zeros = NULL;
		goto nomem;
	}
	*gp = g;
	return 0;
nomem:
	halite_gmem_free(g);
	return -ENOMEM;
}

void halite_gmem_free(struct halite_gmem *g)
{
	if (!g)
		return;
	if (g->zeros)
		munmap(g->zeros, g->zeros_len);
	if (g->fault_efd >= 0)
		close(g->fault_efd);
	pthread_rwlock_destroy(&g->lk);
	pthread_mutex_destroy(&g->q_lk);
	free((void *)g->gone);
	free(g->regions);
	free(g->first_page);
	free(g->ext);
	free(g->q);
	free(g);
}

/* ---- pages: gone bits and addresses ---- */

static uint64_t page_bit(const struct halite_gmem *g, uint32_t ri, uint64_t off)
{
	return g->first_page[ri] + off / g->regions[ri].page;
}

bool halite_gmem_gone(const struct halite_gmem *g, uint32_t ri, uint64_t off)
{
	uint64_t b = page_bit(g, ri, off);

	return atomic_load_explicit(&g->gone[b / 64], memory_order_relaxed) & (1ull << (b % 64));
}

/* Under the write lock. Returns how many pages were not gone before. */
static uint64_t set_gone(struct halite_gmem *g, uint32_t ri, uint64_t off, uint64_t len)
{
	uint64_t page = g->regions[ri].page, n = 0;

	for (uint64_t o = off - off % page; o < off + len; o += page) {
		uint64_t b = page_bit(g, ri, o);
		uint64_t bit = 1ull << (b % 64);

		if (!(atomic_fetch_or(&g->gone[b / 64], bit) & bit))
			n++;
	}
	return n;
}

/* Under lk (either side): the extent holding @addr, or NULL. */
static const struct ext *ext_of(const struct halite_gmem *g, uint64_t addr)
{
	uint32_t lo = 0, hi = g->next;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (g->ext[mid].cur + g->ext[mid].len <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < g->next && g->ext[lo].cur <= addr ? &g->ext[lo] : NULL;
}

/* Under lk: where page @off of region @ri is now, or UINT64_MAX (unmapped). */
static uint64_t addr_of(const struct halite_gmem *g, uint32_t ri, uint64_t off)
{
	if (!atomic_load_explicit(&g->moved, memory_order_relaxed))
		return g->regions[ri].host + off;
	for (uint32_t i = 0; i < g->next; i++) {
		const struct ext *e = &g->ext[i];

		if (e->ri == ri && off >= e->off && off - e->off < e->len)
			return e->cur + (off - e->off);
	}
	return UINT64_MAX;
}

bool halite_gmem_lookup(struct halite_gmem *g, uint64_t addr, uint32_t *ri, uint64_t *off)
{
	const struct ext *e;
	bool found = false;

	pthread_rwlock_rdlock(&g->lk);
	e = ext_of(g, addr);
	if (e) {
		*ri = e->ri;
		*off = e->off + (addr - e->cur);
		found = true;
	}
	pthread_rwlock_unlock(&g->lk);
	return found;
}

/* ---- events ---- */

/*
 * Under the write lock: take [start, end) out of the map. Each piece taken
 * out is marked gone when @gone, else appended to @moved (for a REMAP).
 */
static int ext_cut(struct halite_gmem *g, uint64_t start, uint64_t end, bool gone,
		   struct ext **moved, uint32_t *nmoved)
{
	struct ext *out = malloc((g->next + 2) * sizeof(*out));
	uint32_t n = 0;

	if (!out)
		return -ENOMEM;
	for (uint32_t i = 0; i < g->next; i++) {
		struct ext e = g->ext[i];
		uint64_t lo = HALITE_MAX(e.cur, start), hi = HALITE_MIN(e.cur + e.len, end);

		if (lo >= hi) {
			out[n++] = e;
			continue;
		}
		if (e.cur < lo)
			out[n++] = (struct ext){ e.cur, lo - e.cur, e.off, e.ri };
		if (gone) {
			atomic_fetch_add(&g->n_unmapped,
					 set_gone(g, e.ri, e.off + (lo - e.cur), hi - lo));
		} else if (moved) {
			struct ext *m = realloc(*moved, (*nmoved + 1) * sizeof(**moved));

			if (!m) {
				free(out);
				return -ENOMEM;
			}
			*moved = m;
			m[(*nmoved)++] = (struct ext){ lo, hi - lo, e.off + (lo - e.cur), e.ri };
		}
		if (hi < e.cur + e.len)
			out[n++] = (struct ext){ hi, e.cur + e.len - hi, e.off + (hi - e.cur), e.ri };
	}
	free(g->ext);
	g->ext = out;
	g->next = n;
	atomic_store(&g->moved, true);
	return 0;
}

static int ext_insert(struct halite_gmem *g, const struct ext *add, uint32_t nadd)
{
	struct ext *e = realloc(g->ext, (g->next + nadd) * sizeof(*e));

	if (!e)
		return -ENOMEM;
	g->ext = e;
	for (uint32_t k = 0; k < nadd; k++) {
		uint32_t i = g->next++;

		while (i > 0 && e[i - 1].cur > add[k].cur) {
			e[i] = e[i - 1];
			i--;
		}
		e[i] = add[k];
	}
	return 0;
}

/* A REMOVE: private pages in [start, end) are gone; shared ones keep their data. */
static void on_remove(struct halite_gmem *g, uint64_t start, uint64_t end)
{
	for (uint32_t i = 0; i < g->next; i++) {
		const struct ext *e = &g->ext[i];
		uint64_t lo = HALITE_MAX(e->cur, start), hi = HALITE_MIN(e->cur + e->len, end);

		if (lo < hi && !g->regions[e->ri].shared)
			atomic_fetch_add(&g->n_discarded,
					 set_gone(g, e->ri, e->off + (lo - e->cur), hi - lo));
	}
}

/*
 * A REMAP: [from, from + len) is now at [to, to + len). Whatever of ours was
 * at the destination was unmapped by the move (its UNMAP event may come
 * after this one): gone.
 */
static int on_remap(struct halite_gmem *g, uint64_t from, uint64_t to, uint64_t len)
{
	struct ext *moved = NULL;
	uint32_t nmoved = 0;
	int ret;

	ret = ext_cut(g, from, from + len, false, &moved, &nmoved);
	if (!ret)
		ret = ext_cut(g, to, to + len, true, NULL, NULL);
	for (uint32_t i = 0; i < nmoved; i++)
		moved[i].cur = moved[i].cur - from + to;
	if (!ret)
		ret = ext_insert(g, moved, nmoved);
	free(moved);
	atomic_fetch_add(&g->n_remaps, 1);
	return ret;
}

/* Under the write lock. A page fault goes to @faults (the caller's). */
static int apply(struct halite_gmem *g, const struct uffd_msg *m)
{
	switch (m->event) {
	case UFFD_EVENT_REMOVE:
		atomic_fetch_add(&g->n_events, 1);
		on_remove(g, m->arg.remove.start, m->arg.remove.end);
		return 0;
	case UFFD_EVENT_UNMAP:
		atomic_fetch_add(&g->n_events, 1);
		return ext_cut(g, m->arg.remove.start, m->arg.remove.end, true, NULL, NULL);
	case UFFD_EVENT_REMAP:
		atomic_fetch_add(&g->n_events, 1);
		return on_remap(g, m->arg.remap.from, m->arg.remap.to, m->arg.remap.len);
	default:
		return 0; /* FORK is never asked for */
	}
}

/*
 * Under the write lock: read up to @max messages into @buf; events applied.
 * Returns how many page faults are left at the front of @buf, or -errno.
 */
static int read_locked(struct halite_gmem *g, struct uffd_msg *buf, size_t max)
{
	ssize_t n = read(g->uffd, buf, max * sizeof(*buf));
	int nf = 0, ret;

	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	for (ssize_t i = 0; i < n / (ssize_t)sizeof(*buf); i++) {
		if (buf[i].event == UFFD_EVENT_PAGEFAULT) {
			buf[nf++] = buf[i];
			continue;
		}
		ret = apply(g, &buf[i]);
		if (ret)
			return ret;
	}
	return nf;
}

static int queue_faults(struct halite_gmem *g, const struct uffd_msg *m, int n)
{
	pthread_mutex_lock(&g->q_lk);
	if (g->q_len + (size_t)n > g->q_cap) {
		size_t cap = HALITE_MAX(2 * g->q_cap, g->q_len + (size_t)n + 64);
		struct uffd_msg *q = malloc(cap * sizeof(*q));

		if (!q) {
			pthread_mutex_unlock(&g->q_lk);
			return -ENOMEM;
		}
		for (size_t i = 0; i < g->q_len; i++)
			q[i] = g->q[(g->q_head + i) % g->q_cap];
		free(g->q);
		g->q = q;
		g->q_cap = cap;
		g->q_head = 0;
	}
	for (int i = 0; i < n; i++)
		g->q[(g->q_head + g->q_len++) % g->q_cap] = m[i];
	pthread_mutex_unlock(&g->q_lk);
	return 0;
}

int halite_gmem_sync(struct halite_gmem *g)
{
	struct uffd_msg buf[READ_BATCH];
	int total = 0, n;

	pthread_rwlock_wrlock(&g->lk);
	do {
		n = read_locked(g, buf, READ_BATCH);
		if (n > 0 && queue_faults(g, buf, n))
			n = -ENOMEM;
		if (n > 0)
			total += n;
	} while (n > 0);
	pthread_rwlock_unlock(&g->lk);
	if (total)
		eventfd_write(g->fault_efd, 1);
	return n < 0 ? n : total;
}

int halite_gmem_take_faults(struct halite_gmem *g, struct uffd_msg *out, int max)
{
	int n = 0, got;
	eventfd_t v;

	eventfd_read(g->fault_efd, &v);
	pthread_mutex_lock(&g->q_lk);
	while (n < max && g->q_len) {
		out[n++] = g->q[g->q_head];
		g->q_head = (g->q_head + 1) % g->q_cap;
		g->q_len--;
	}
	pthread_mutex_unlock(&g->q_lk);
	if (n == max)
		return n;
	/* Then what the kernel has now, queued ones first: faults keep their order. */
	pthread_rwlock_wrlock(&g->lk);
	got = read_locked(g, out + n, (size_t)(max - n));
	pthread_rwlock_unlock(&g->lk);
	if (got < 0)
		return n ? n : got;
	return n + got;
}

int halite_gmem_fault_fd(const struct halite_gmem *g)
{
	return g->fault_efd;
}

void halite_gmem_ended(struct halite_gmem *g)
{
	atomic_store(&g->ended, true);
}

void halite_gmem_ranges(struct halite_gmem *g,
			void (*fn)(void *ctx, uint32_t ri, uint64_t host, uint64_t len), void *ctx)
{
	pthread_rwlock_rdlock(&g->lk);
	for (uint32_t i = 0; i < g->next; i++)
		fn(ctx, g->ext[i].ri, g->ext[i].cur, g->ext[i].len);
	pthread_rwlock_unlock(&g->lk);
}

static int unregister_range(int uffd, uint64_t host, uint64_t len)
{
	struct uffdio_range rg = { host, len };
	int ret = 0;

	/* EINVAL/ENOMEM: some of it is no longer mapped, or not ours: nothing to drop there. */
	if (ioctl(uffd, UFFDIO_UNREGISTER, &rg) && errno != EINVAL && errno != ENOMEM &&
	    errno != ENOENT)
		ret = -errno;
	/* Unregistering woke nobody who was waiting: threads stay queued on the context. */
	if (ioctl(uffd, UFFDIO_WAKE, &rg) && errno != ENOENT && !ret)
		ret = -errno;
	return ret;
}

int halite_gmem_unregister(struct halite_gmem *g)
{
	int ret = 0, e;

	halite_gmem_ended(g);
	pthread_rwlock_rdlock(&g->lk);
	for (uint32_t i = 0; i < g->next; i++) {
		e = unregister_range(g->uffd, g->ext[i].cur, g->ext[i].len);
		if (e && !ret)
			ret = e;
	}
	pthread_rwlock_unlock(&g->lk);
	if (atomic_load(&g->moved))
		for (uint32_t i = 0; i < g->nregions; i++)
			if (g->regions[i].length)
				unregister_range(g->uffd, g->regions[i].host, g->regions[i].length);
	return ret;
}

void halite_gmem_stats(struct halite_gmem *g, struct halite_gmem_stats *st)
{
	*st = (struct halite_gmem_stats){
		.pages_discarded = atomic_load(&g->n_discarded),
		.pages_unmapped = atomic_load(&g->n_unmapped),
		.remaps = atomic_load(&g->n_remaps),
		.events = atomic_load(&g->n_events),
	};
}

/* ---- installs ---- */

/*
 * One ioctl on [dst, dst + len); *done gets the bytes it filled before a
 * failure. 0 or errno.
 */
static int fill_ioctl(struct halite_gmem *g, int mode, uint64_t dst, const void *src,
		      uint64_t len, bool wake, uint64_t *done)
{
	int ret;

	*done = 0;
	if (mode == HALITE_GMEM_COPY) {
		struct uffdio_copy c = { .dst = dst, .src = (uintptr_t)src, .len = len,
					 .mode = wake ? 0 : UFFDIO_COPY_MODE_DONTWAKE };

		ret = ioctl(g->uffd, UFFDIO_COPY, &c) ? errno : 0;
		if (ret && c.copy > 0)
			*done = (uint64_t)c.copy;
	} else if (mode == HALITE_GMEM_ZERO) {
		struct uffdio_zeropage z = { .range = { dst, len },
					     .mode = wake ? 0 : UFFDIO_ZEROPAGE_MODE_DONTWAKE };

		ret = ioctl(g->uffd, UFFDIO_ZEROPAGE, &z) ? errno : 0;
		if (ret && z.zeropage > 0)
			*done = (uint64_t)z.zeropage;
	} else {
		struct uffdio_continue c = { .range = { dst, len },
					     .mode = wake ? 0 : UFFDIO_CONTINUE_MODE_DONTWAKE };

		ret = ioctl(g->uffd, UFFDIO_CONTINUE, &c) ? errno : 0;
		if (ret && c.mapped > 0)
			*done = (uint64_t)c.mapped;
	}
	return ret;
}

/* Zero fills of writes copy zeros: the zero page would be copied at once. */
static int zero_mode(unsigned flags)
{
	return (flags & HALITE_GMEM_WRITE) ? HALITE_GMEM_COPY : HALITE_GMEM_ZERO;
}

struct fill {
	struct halite_gmem *g;
	uint32_t ri;
	uint64_t off, len;   /* the whole request */
	const uint8_t *src;
	int mode;
	unsigned flags;
	bool skipped;	     /* a page left to someone else: wake the range at the end */
	uint64_t enoent_since;
	unsigned again;	     /* EAGAIN turns with no event to read yet */
};

/*
 * One page @o of the request, under the read lock taken here. Returns 0
 * (done, or skipped), 1 to try the same page again, or -errno.
 */
static int fill_page(struct fill *f, uint64_t o)
{
	struct halite_gmem *g = f->g;
	uint64_t page = g->regions[f->ri].page, dst, done;
	const void *src = f->src ? f->src + o : NULL;
	int mode = f->mode, ret;
	bool wake = !(f->flags & HALITE_GMEM_DONTWAKE);

	pthread_rwlock_rdlock(&g->lk);
	if (halite_gmem_gone(g, f->ri, f->off + o)) {
		if (!(f->flags & HALITE_GMEM_ZERO_GONE)) {
			pthread_rwlock_unlock(&g->lk);
			f->skipped = true;
			return 0;
		}
		/* What the guest's discard left: zeros, never the snapshot's bytes. */
		mode = zero_mode(f->flags);
		src = g->zeros;
	}
	dst = addr_of(g, f->ri, f->off + o);
	if (dst == UINT64_MAX) {
		/* Unmapped: its gone bit was set with the cut, under this lock. */
		pthread_rwlock_unlock(&g->lk);
		return 0;
	}
	ret = fill_ioctl(g, mode, dst, src, page, wake, &done);
	if (ret == EFAULT && mode == HALITE_GMEM_CONTINUE)
		/* A hole in the file: nothing to map, and zeros is what it holds. */
		ret = fill_ioctl(g, HALITE_GMEM_COPY, dst, g->zeros, page, wake, &done);
	pthread_rwlock_unlock(&g->lk);
	switch (ret) {
	case 0:
		f->enoent_since = 0;
		f->again = 0;
		return 0;
	case EEXIST:
		/* There already (a raced install, or the guest's own since): not ours to replace. */
		f->skipped = true;
		return 0;
	case EAGAIN:
		/* An event is pending: read it (from this thread if need be), then again. */
		ret = halite_gmem_sync(g);
		if (ret < 0)
			return ret;
		/*
		 * The event is not queued yet: the thread changing the mapping
		 * has still to get there. Past a few yields, sleep: the save's
		 * fault thread may be SCHED_FIFO, and its sched_yield() lets no
		 * ordinary thread (that one) run on this CPU.
		 */
		if (!ret && f->again++ < 16) {
			sched_yield();
		} else if (!ret) {
			struct timespec ts = { 0, 20000 };

			nanosleep(&ts, NULL);
		}
		return 1;
	case ENOENT:
		if (atomic_load(&g->ended) || halite_gmem_gone(g, f->ri, f->off + o))
			return 0;
		/*
		 * Not mapped there, and no event has said why: the UNMAP event of
		 * a munmap comes just after the unmap. Read events until it
		 * explains the page, or give up: never skip a page silently.
		 */
		if (!f->enoent_since)
			f->enoent_since = now_ns();
		else if (now_ns() - f->enoent_since > ENOENT_WAIT_NS)
			return -ENOENT;
		ret = halite_gmem_sync(g);
		if (ret < 0)
			return ret;
		if (!ret) {
			struct timespec ts = { 0, 1000000 };

			nanosleep(&ts, NULL);
		}
		return 1;
	default:
		return -ret;
	}
}

int halite_gmem_fill(struct halite_gmem *g, uint32_t ri, uint64_t off, uint64_t len,
		     const void *src, int mode, unsigned flags)
{
	uint64_t page = g->regions[ri].page;
	struct fill f = { g, ri, off, len, src, mode, flags, false, 0, 0 };
	bool wake = !(flags & HALITE_GMEM_DONTWAKE);
	uint64_t o = 0;
	int ret;

	if (off % page || len % page || off + len > g->regions[ri].length)
		return -EINVAL;
	if (mode == HALITE_GMEM_ZERO)
		mode = f.mode = zero_mode(flags);
	if (mode == HALITE_GMEM_COPY && !src) {
		/* Zeros of any length, in pieces of the zero buffer. */
		for (uint64_t p = 0; p < len; p += g->zeros_len) {
			ret = halite_gmem_fill(g, ri, off + p, HALITE_MIN(len - p, g->zeros_len),
					       g->zeros, mode, flags);
			if (ret)
				return ret;
		}
		return 0;
	}
	/*
	 * The common case, one ioctl for the whole range: nothing gone, nothing
	 * moved. Anything else goes on page by page from where it stopped.
	 */
	if (!atomic_load_explicit(&g->moved, memory_order_relaxed)) {
		bool clean = true;
		uint64_t done;

		pthread_rwlock_rdlock(&g->lk);
		for (uint64_t p = 0; p < len && clean; p += page)
			clean = !halite_gmem_gone(g, ri, off + p);
		if (clean && !atomic_load(&g->moved)) {
			ret = fill_ioctl(g, mode, g->regions[ri].host + off,
					 mode == HALITE_GMEM_COPY ? src : NULL, len, wake, &done);
			pthread_rwlock_unlock(&g->lk);
			if (!ret)
				return 0;
			o = done - done % page;
		} else {
			pthread_rwlock_unlock(&g->lk);
		}
	}
	while (o < len) {
		ret = fill_page(&f, o);
		if (ret < 0)
			return ret;
		if (!ret)
			o += page;
	}
	/* The kernel woke nothing for pages it did not fill. */
	return f.skipped && wake ? halite_gmem_wake(g, ri, off, len) : 0;
}

int halite_gmem_wake(struct halite_gmem *g, uint32_t ri, uint64_t off, uint64_t len)
{
	uint64_t page = g->regions[ri].page;
	int ret = 0;

	pthread_rwlock_rdlock(&g->lk);
	for (uint64_t o = 0; o < len && !ret;) {
		uint64_t a = addr_of(g, ri, off + o), n = page;
		struct uffdio_range rg;

		/* Runs of pages still next to each other: one wake each. */
		while (a != UINT64_MAX && o + n < len && addr_of(g, ri, off + o + n) == a + n)
			n += page;
		rg = (struct uffdio_range){ a, n };
		if (a != UINT64_MAX && ioctl(g->uffd, UFFDIO_WAKE, &rg) && errno != ENOENT)
			ret = -errno;
		o += n;
	}
	pthread_rwlock_unlock(&g->lk);
	return ret;
}

int halite_gmem_serve_stray(struct halite_gmem *g, const struct uffd_msg *m)
{
	uint64_t addr = m->arg.pagefault.address & ~4095ull, done;
	bool minor = m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR;
	int ret = fill_ioctl(g, minor ? HALITE_GMEM_CONTINUE : HALITE_GMEM_ZERO, addr, NULL, 4096,
			     true, &done);

	if (ret == EEXIST || ret == ENOENT || ret == EFAULT) {
		/* Present already, or not mapped any more: the thread only needs waking. */
		struct uffdio_range rg = { addr, 4096 };

		if (ioctl(g->uffd, UFFDIO_WAKE, &rg) && errno != ENOENT)
			return -errno;
		return 0;
	}
	return -ret;
}
