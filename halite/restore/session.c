// SPDX-License-Identifier: MIT
/*
 * A clone's session (template.h): its userfaultfd, its waiting faults, its
 * statistics. The whole fault path is here:
 *
 *   fault (addr) -> region, offset -> memory block
 *     zero or never touched  -> zero page (UFFDIO_ZEROPAGE: anonymous, private)
 *     in the memory file     -> UFFDIO_CONTINUE (the shared page cache page,
 *                               read-only in the clone; a write copies it)
 *     not yet                -> tpl_request(): the template reads its LB once
 *                               for every clone, then block_in() here maps
 *                               it (UFFDIO_CONTINUE) and wakes the thread
 *     its LB failed          -> the session fails, naming the LB; the thread
 *                               stays blocked
 *   then the other blocks of its LB that are in are mapped too (without
 *   waking anyone): what the guest touched next during the save, as a
 *   single restore installs a whole LB, so the clone does not fault on them.
 *
 * Installs go through gmem (halite/src/gmem.h), which applies the clone's
 * discards, unmaps and moves; the regions count as shared memory there (a
 * discard of a private file mapping keeps the file's data, which the next
 * fault maps again: what the kernel does for such a mapping).
 *
 * Done: once the template has every block and nothing of this session
 * waits, its ranges are unregistered and the clone runs without us.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/template.h>

#include "fault_loop.h"
#include "gmem.h"
#include "guest_fault.h"
#include "log_internal.h"
#include "opts.h"
#include "stats.h"
#include "template_int.h"
#include "uffd.h"

#define TAG_PREMAP 0 /* a request made at start: no fault to time */

struct sregion {
	const struct tpl_region *tr;
	uint64_t host, length;
	bool registered;
};

struct halite_session {
	struct tpl_client cl;
	struct halite_template *t;
	struct halite_session_opts o;
	pid_t *vcpus;
	struct sregion *regs;
	uint32_t nregs;
	uint32_t mb_size;
	int uffd;
	struct halite_gmem *gm;

	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	uint64_t start_ns, ready_ns, done_ns;

	pthread_mutex_t mu;	/* below (the histogram is lock-free) */
	pthread_cond_t cv;
	bool done;
	int error;
	char errmsg[512];
	struct halite_hist hist;

	_Atomic uint8_t *mapped; /* per memory block: mapped in the clone by us */
	uint64_t mb_total;

	_Atomic uint64_t faults, faults_cached, faults_read, faults_zero, faults_vcpu, premapped;
	_Atomic uint64_t mb_neighbours;
};

static int s_fail(struct halite_session *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int s_fail(struct halite_session *s, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&s->mu);
	if (!s->error) {
		s->error = err;
		va_start(ap, fmt);
		halite_vformat_error(s->errmsg, sizeof(s->errmsg), err, fmt, ap);
		va_end(ap);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return err;
}

static bool failed(struct halite_session *s)
{
	bool f;

	pthread_mutex_lock(&s->mu);
	f = s->error != 0;
	pthread_mutex_unlock(&s->mu);
	return f;
}

/* The session region holding block @mb, and the block's offset and length in it. */
static struct sregion *mb_place(struct halite_session *s, uint64_t mb, uint32_t *ri, uint64_t *off,
				uint64_t *len)
{
	for (uint32_t i = 0; i < s->nregs; i++) {
		const struct tpl_region *tr = s->regs[i].tr;

		if (mb >= tr->first_mb && mb - tr->first_mb < tr->mb_count) {
			*ri = i;
			*off = (mb - tr->first_mb) * s->mb_size;
			*len = tr->length - *off < s->mb_size ? tr->length - *off : s->mb_size;
			return &s->regs[i];
		}
	}
	return NULL;
}

static int install(struct halite_session *s, uint64_t mb, int mode, unsigned flags)
{
	uint64_t off, len;
	uint32_t ri;
	int ret;

	if (!mb_place(s, mb, &ri, &off, &len))
		return -HALITE_E_INTERNAL;
	ret = halite_gmem_fill(s->gm, ri, off, len, NULL, mode, flags);
	if (!ret)
		atomic_store_explicit(&s->mapped[mb], 1, memory_order_relaxed);
	if (ret == -ESRCH)
		return s_fail(s, ret, "the clone (pid %d) is gone", (int)s->o.owner_pid);
	if (ret)
		return s_fail(s, ret, "region '%s' offset %llu: installing memory block %llu",
			      s->regs[ri].tr->name, (unsigned long long)off, (unsigned long long)mb);
	return 0;
}

/* The other blocks of @mb's LB that are in, mapped without waking anyone. */
static void map_neighbours(struct halite_session *s, uint64_t mb)
{
	const uint64_t *mbs;
	uint32_t n, ri;
	uint64_t off, len;

	if (tpl_lb_members(s->t, mb, &mbs, &n))
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t m = mbs[i];

		if (m == mb || atomic_load_explicit(&s->mapped[m], memory_order_relaxed) ||
		    tpl_mb_state(s->t, m) != TPL_MB_IN || !mb_place(s, m, &ri, &off, &len))
			continue;
		if (install(s, m, HALITE_GMEM_CONTINUE, HALITE_GMEM_DONTWAKE))
			return;
		atomic_fetch_add(&s->mb_neighbours, 1);
	}
}

/* The template's answer to tpl_request() (tpl_client.block_in), from a reader thread. */
static void block_in(struct tpl_client *c, uint64_t mb, uint64_t tag, int err)
{
	struct halite_session *s = (struct halite_session *)((char *)c -
							     offsetof(struct halite_session, cl));
	char msg[512];

	if (err) {
		tpl_errmsg_mb(s->t, mb, msg, sizeof(msg));
		s_fail(s, err, "%s", msg);
		return; /* its threads stay blocked: never an unverified byte */
	}
	if (install(s, mb, HALITE_GMEM_CONTINUE, 0))
		return;
	if (tag != TAG_PREMAP)
		guest_fault_timed(&s->hist, tag);
	map_neighbours(s, mb);
}

static void serve(struct halite_session *s, const struct uffd_msg *m, uint64_t now)
{
	uint64_t addr = m->arg.pagefault.address, off, mb;
	bool hot_time = now - s->start_ns < (uint64_t)tpl_hot_window_ms(s->t) * 1000000;
	uint32_t ri, vcpu;
	int ret;

	/* Outside guest memory: served as the mapping holds; its error is not the session's. */
	if (!guest_fault_place(s->gm, m, addr, &ri, &off, &ret))
		return;
	mb = s->regs[ri].tr->first_mb + off / s->mb_size;
	atomic_fetch_add(&s->faults, 1);
	vcpu = guest_vcpu_of(s->vcpus, s->o.nvcpus, m->arg.pagefault.feat.ptid);
	if (vcpu)
		atomic_fetch_add(&s->faults_vcpu, 1);
	tpl_fault_seen(s->t);

	ret = tpl_mb_state(s->t, mb);
	if (ret < 0) {
		char msg[512];

		/* Its map entry cannot be read: not a zero block. The thread stays blocked. */
		tpl_errmsg_mb(s->t, mb, msg, sizeof(msg));
		s_fail(s, ret, "%s", msg);
		return;
	}
	if (ret == TPL_MB_EMPTY) {
		atomic_fetch_add(&s->faults_zero, 1);
		if (!install(s, mb, HALITE_GMEM_ZERO, HALITE_GMEM_ZERO_GONE))
			guest_fault_timed(&s->hist, now);
		return;
	}
	/* Noted before the request: once it is answered the clone runs on. */
	if (hot_time && !(s->o.flags & HALITE_SESSION_NO_HOT_RECORD))
		tpl_hot_note(s->t, mb, vcpu, now, s->start_ns);
	ret = tpl_request(s->t, &s->cl, mb, now);
	if (ret == 1) {
		atomic_fetch_add(&s->faults_cached, 1);
		if (!install(s, mb, HALITE_GMEM_CONTINUE, 0)) {
			guest_fault_timed(&s->hist, now);
			map_neighbours(s, mb);
		}
	} else if (ret == 0) {
		atomic_fetch_add(&s->faults_read, 1);
	} else {
		char msg[512];

		tpl_errmsg_mb(s->t, mb, msg, sizeof(msg));
		s_fail(s, ret, "%s", msg);
	}
}

/* Everything is in: unregister, and the clone is on its own. */
static void finish(struct halite_session *s)
{
	int ret = halite_gmem_unregister(s->gm);

	for (uint32_t i = 0; i < s->nregs; i++)
		s->regs[i].registered = false;
	if (ret)
		s_fail(s, ret, "unregistering the clone's memory");
	pthread_mutex_lock(&s->mu);
	s->done = !s->error;
	s->done_ns = halite_now_ns();
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static int fault_timeout(void *ctx)
{
	(void)ctx;
	/* The end is looked for between faults: when nothing comes, every 20 ms. */
	return 20;
}

static void fault_serve(void *ctx, const struct uffd_msg *m, int n, uint64_t t0)
{
	(void)t0;
	for (int i = 0; i < n; i++)
		serve(ctx, &m[i], halite_now_ns());
}

static bool fault_next(void *ctx, int n)
{
	struct halite_session *s = ctx;

	if (atomic_load(&s->stop))
		return false;
	/* A failed session keeps the faulting threads blocked (and keeps reading). */
	if (!n && !failed(s) && tpl_complete(s->t) && !tpl_pending(s->t, &s->cl)) {
		finish(s);
		return false;
	}
	return true;
}

static void fault_read_failed(void *ctx, int err)
{
	s_fail(ctx, err, "reading the clone's userfaultfd");
}

static void *fault_main(void *arg)
{
	struct halite_session *s = arg;
	struct halite_fault_loop loop = {
		.gm = s->gm, .uffd = s->uffd, .stop_fd = -1, .ctx = s,
		.timeout_ms = fault_timeout, .serve = fault_serve, .next = fault_next,
		.failed = fault_read_failed,
	};

	if (!atomic_load(&s->stop))
		halite_fault_loop_run(&loop);
	return NULL;
}

static int open_uffd(struct halite_session *s)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MISSING_SHMEM |
			UFFD_FEATURE_MINOR_SHMEM | HALITE_GMEM_EVENTS;
	unsigned flags = HALITE_UFFD_EXACT |
			 ((s->o.flags & HALITE_SESSION_ATTACH) ? HALITE_UFFD_TAKEOVER : 0);
	uint64_t missing = 0;
	const char *why;
	char names[160];

	s->uffd = halite_uffd_acquire(s->o.owner_pid ? s->o.owner_uffd : -1, want, flags,
				      &missing, &why);
	if (s->uffd >= 0)
		return 0;
	if (why)
		return s_fail(s, s->uffd, "owner_uffd %d %s", s->o.owner_uffd, why);
	/* Our dup of the owner's descriptor failed. */
	if (s->o.owner_pid && (s->uffd == -EBADF || s->uffd == -EMFILE))
		return s_fail(s, s->uffd, "owner_uffd %d", s->o.owner_uffd);
	return s_fail(s, s->uffd, "userfaultfd%s%s", missing ? " lacks " : "",
		      missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
}

static int register_regions(struct halite_session *s)
{
	uint64_t mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR;
	uint64_t need = 1ull << _UFFDIO_CONTINUE | 1ull << _UFFDIO_ZEROPAGE | 1ull << _UFFDIO_WAKE;

	for (uint32_t i = 0; i < s->nregs; i++) {
		struct sregion *g = &s->regs[i];
		int ret = halite_uffd_register(s->uffd, g->host, g->length, mode, need);

		if (ret == -EBUSY)
			return s_fail(s, -EBUSY, "region '%s' is registered with another "
				      "userfaultfd", g->tr->name);
		if (ret && ret != -HALITE_E_UNSUPPORTED)
			return s_fail(s, ret, "region '%s' at 0x%llx: UFFDIO_REGISTER "
				      "MISSING|MINOR (a private mapping of the template memory "
				      "file?)", g->tr->name, (unsigned long long)g->host);
		g->registered = true;
		if (ret)
			return s_fail(s, ret, "region '%s': no UFFDIO_CONTINUE "
				      "and UFFDIO_ZEROPAGE on this memory", g->tr->name);
	}
	return 0;
}

/* Wait until no request of this session is pending: 0, or its failure. */
static int settle(struct halite_session *s)
{
	while (tpl_pending(s->t, &s->cl) && !failed(s))
		usleep(200);
	return failed(s) ? s->error : 0;
}

/* Ask for @mb and map it (now, or in block_in() once it is in): 0 or < 0. */
static int premap_one(struct halite_session *s, uint64_t mb)
{
	int ret = tpl_request(s->t, &s->cl, mb, TAG_PREMAP);

	if (ret == 1)
		return install(s, mb, HALITE_GMEM_CONTINUE, HALITE_GMEM_DONTWAKE);
	return ret;
}

/*
 * Map the hot set before the clone runs: the hot blocks, then the rest of
 * their LBs (the clone touched those too, without a fault of its own),
 * reading what is not in yet.
 */
static int premap_hot(struct halite_session *s)
{
	uint64_t *mbs, n, mapped = 0;
	int ret = tpl_hot_list(s->t, &mbs, &n);

	if (ret)
		return ret;
	for (uint64_t i = 0; i < n && ret >= 0; i++) {
		ret = premap_one(s, mbs[i]);
		mapped += ret >= 0;
		if (ret < 0 && ret != -EINVAL && !failed(s)) {
			char msg[512];

			/* Its LB or its own map entry failed: named, as a fault's would be. */
			tpl_errmsg_mb(s->t, mbs[i], msg, sizeof(msg));
			s_fail(s, ret, "mapping the hot set: %s", msg);
		}
	}
	if (ret >= 0)
		ret = settle(s);
	for (uint64_t i = 0; i < n && ret >= 0; i++) {
		const uint64_t *lbm;
		uint32_t k;

		ret = tpl_lb_members(s->t, mbs[i], &lbm, &k);
		if (ret == -HALITE_E_NOT_FOUND) {
			ret = 0;
			continue;
		}
		if (ret < 0) {
			char msg[512];

			tpl_errmsg_mb(s->t, mbs[i], msg, sizeof(msg));
			s_fail(s, ret, "mapping the hot set: %s", msg);
			break;
		}
		for (uint32_t j = 0; j < k && ret >= 0; j++) {
			if (atomic_load_explicit(&s->mapped[lbm[j]], memory_order_relaxed))
				continue;
			ret = premap_one(s, lbm[j]);
			if (ret >= 0)
				atomic_fetch_add(&s->mb_neighbours, 1);
		}
	}
	if (ret >= 0)
		ret = settle(s);
	free(mbs);
	if (ret < 0) {
		/* A failed hot LB fails this clone now, before it runs. */
		if (!failed(s))
			s_fail(s, ret, "mapping the hot set");
		return ret;
	}
	atomic_store(&s->premapped, mapped);
	return 0;
}

static int check_regions(struct halite_session *s, const struct halite_session_region *r,
			 uint32_t n)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);

	s->regs = calloc(n ? n : 1, sizeof(*s->regs));
	if (!s->regs)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		int ti = r[i].name ? tpl_find_region(s->t, r[i].name) : -EINVAL;
		const struct tpl_region *tr;

		if (ti < 0)
			return s_fail(s, -EINVAL, "region '%s' is not in the template",
				      r[i].name ? r[i].name : "(null)");
		tr = tpl_region_at(s->t, (uint32_t)ti);
		for (uint32_t j = 0; j < i; j++)
			if (s->regs[j].tr == tr)
				return s_fail(s, -EINVAL, "region '%s' given twice", tr->name);
		if (r[i].length != tr->length || r[i].host % page)
			return s_fail(s, -EINVAL, "region '%s': %llu bytes at 0x%llx, the template's "
				      "is %llu bytes (host-page aligned)", tr->name,
				      (unsigned long long)r[i].length,
				      (unsigned long long)r[i].host,
				      (unsigned long long)tr->length);
		s->regs[i] = (struct sregion){ .tr = tr, .host = r[i].host, .length = r[i].length };
	}
	s->nregs = n;
	return 0;
}

int halite_session_start(struct halite_session **sp, struct halite_template *t,
			 const struct halite_session_region *regions, uint32_t nregions,
			 const struct halite_session_opts *opts)
{
	struct halite_gmem_region *gr = NULL;
	struct halite_session *s;
	int ret;

	if (!sp || !t)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->start_ns = halite_now_ns();
	s->uffd = -1;
	s->t = t;
	s->cl.block_in = block_in;
	s->mb_size = tpl_mb_size(t);
	pthread_mutex_init(&s->mu, NULL);
	halite_cond_init_mono(&s->cv);
	halite_hist_init(&s->hist);
	ret = halite_opts_copy(&s->o, sizeof(s->o), opts);
	if (ret)
		s_fail(s, ret, "session options: fields this build does not know are set");
	else if (s->o.flags & ~HALITE_SESSION_FLAGS_ALL)
		ret = s_fail(s, -EINVAL, "flags 0x%x: unknown bits 0x%x", s->o.flags,
			     s->o.flags & ~HALITE_SESSION_FLAGS_ALL);
	else if (s->o.nvcpus && !s->o.vcpu_tids)
		ret = s_fail(s, -EINVAL, "nvcpus %u without vcpu_tids", s->o.nvcpus);
	else if (s->o.owner_pid && s->o.owner_uffd < 0)
		ret = s_fail(s, -EINVAL, "owner_pid %d without an owner_uffd", (int)s->o.owner_pid);
	else if (!s->o.owner_pid && (s->o.flags & HALITE_SESSION_ATTACH))
		ret = s_fail(s, -EINVAL, "HALITE_SESSION_ATTACH without an owner_pid");
	if (!ret && (!regions || !nregions || nregions > tpl_region_count(t)))
		ret = s_fail(s, -EINVAL, "%u regions given, the template has %u", nregions,
			     tpl_region_count(t));
	if (ret)
		goto err;
	if (s->o.nvcpus) {
		s->vcpus = malloc(s->o.nvcpus * sizeof(*s->vcpus));
		if (!s->vcpus) {
			ret = -ENOMEM;
			goto err;
		}
		memcpy(s->vcpus, s->o.vcpu_tids, s->o.nvcpus * sizeof(*s->vcpus));
	}
	s->o.vcpu_tids = NULL;
	s->mb_total = halite_reader_info(halite_template_reader(t))->mb_count;
	s->mapped = calloc(s->mb_total ? s->mb_total : 1, 1);
	if (!s->mapped) {
		ret = -ENOMEM;
		goto err;
	}
	ret = check_regions(s, regions, nregions);
	if (!ret)
		ret = open_uffd(s);
	if (ret)
		goto err;
	gr = calloc(s->nregs, sizeof(*gr));
	if (!gr) {
		ret = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < s->nregs; i++)
		gr[i] = (struct halite_gmem_region){ .host = s->regs[i].host,
						     .length = s->regs[i].length,
						     .page = (uint32_t)sysconf(_SC_PAGESIZE),
						     .shared = true };
	ret = halite_gmem_create(&s->gm, s->uffd, gr, s->nregs);
	free(gr);
	if (ret)
		goto err;
	ret = register_regions(s);
	if (ret)
		goto err;
	ret = -pthread_create(&s->thread, NULL, fault_main, s);
	if (ret)
		goto err;
	s->thread_started = true;
	/* Taking over: faults the dead handler read but never answered come again. */
	if (s->o.flags & HALITE_SESSION_ATTACH)
		for (uint32_t i = 0; i < s->nregs; i++)
			(void)halite_gmem_wake(s->gm, i, 0, s->regs[i].length);
	if (s->o.flags & HALITE_SESSION_PREMAP_HOT) {
		ret = premap_hot(s);
		if (ret)
			goto err;
	}
	s->ready_ns = halite_now_ns();
	*sp = s;
	return 0;
err:
	if (!s->error)
		s_fail(s, ret, "session");
	/* The session goes with its message: the caller's buffer keeps it. */
	if (s->o.errbuf && s->o.errbuf_len)
		snprintf(s->o.errbuf, s->o.errbuf_len, "%s", s->errmsg);
	halite_session_free(s);
	return ret;
}

int halite_session_wait(struct halite_session *s, int timeout_ms)
{
	struct timespec ts;
	int ret = 0;

	if (!s)
		return -EINVAL;
	halite_deadline(&ts, timeout_ms > 0 ? (uint64_t)timeout_ms * 1000000 : 0);
	pthread_mutex_lock(&s->mu);
	while (!s->done && !s->error) {
		if (timeout_ms < 0) {
			pthread_cond_wait(&s->cv, &s->mu);
		} else if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) {
			ret = -ETIMEDOUT;
			break;
		}
	}
	if (!ret && !s->done)
		ret = s->error;
	pthread_mutex_unlock(&s->mu);
	return ret;
}

void halite_session_stats(struct halite_session *s, struct halite_session_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (!s)
		return;
	st->ready_ns = s->ready_ns ? s->ready_ns - s->start_ns : 0;
	st->faults = atomic_load(&s->faults);
	st->faults_cached = atomic_load(&s->faults_cached);
	st->faults_read = atomic_load(&s->faults_read);
	st->faults_zero = atomic_load(&s->faults_zero);
	st->faults_vcpu = atomic_load(&s->faults_vcpu);
	st->mb_premapped = atomic_load(&s->premapped);
	st->mb_neighbours = atomic_load(&s->mb_neighbours);
	st->lb_read = tpl_lb_asked(s->t, &s->cl);
	st->bytes_read = st->lb_read * tpl_lb_size(s->t);
	pthread_mutex_lock(&s->mu);
	st->fault_p50_ns = halite_hist_quantile(&s->hist, 0.50);
	st->fault_p99_ns = halite_hist_quantile(&s->hist, 0.99);
	st->done = s->done;
	st->error = s->error;
	if (s->ready_ns)
		st->duration_ns = (s->done ? s->done_ns : halite_now_ns()) - s->ready_ns;
	pthread_mutex_unlock(&s->mu);
}

const char *halite_session_errmsg(const struct halite_session *s)
{
	return s ? s->errmsg : "";
}

void halite_session_free(struct halite_session *s)
{
	if (!s)
		return;
	atomic_store(&s->stop, true);
	if (s->thread_started)
		pthread_join(s->thread, NULL);
	/* No callback can run on us after this. */
	tpl_detach(s->t, &s->cl);
	/*
	 * This process's memory, not done: closing the descriptor would let a
	 * waiting thread read the file's holes as zeros. Make it fault instead.
	 */
	if (!s->o.owner_pid && !s->done)
		for (uint32_t i = 0; i < s->nregs; i++)
			if (s->regs[i].registered)
				(void)mprotect((void *)(uintptr_t)s->regs[i].host, s->regs[i].length,
					       PROT_NONE);
	halite_gmem_free(s->gm);
	if (s->uffd >= 0)
		close(s->uffd);
	free(s->regs);
	free(s->vcpus);
	free((void *)s->mapped);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
