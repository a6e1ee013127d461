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
 * This is the continue strategy of a session (guest_session.h): the
 * session owns the userfaultfd, the regions, the fault thread, the counters
 * and the end. Installs go through its gmem (halite/src/gmem.h), which
 * applies the clone's discards, unmaps and moves; the regions count as
 * shared memory there (a
 * discard of a private file mapping keeps the file's data, which the next
 * fault maps again: what the kernel does for such a mapping).
 *
 * Done: once the template has every block and nothing of this session
 * waits, its ranges are unregistered and the clone runs without us.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/template.h>

#include "guest_session.h"
#include "opts.h"
#include "template_int.h"
#include "uffd.h"

#define TAG_PREMAP 0 /* a request made at start: no fault to time */

struct halite_session {
	struct gsession gs;	/* the guest: uffd, regions (as given), thread, counters, end */
	struct tpl_client cl;
	struct halite_template *t;
	struct halite_session_opts o;
	const struct tpl_region **trs; /* per session region: the template's */
	uint32_t nregs;
	uint32_t mb_size;
	uint64_t ready_ns;	/* the hot set mapped: the clone may run */

	_Atomic uint8_t *mapped; /* per memory block: mapped in the clone by us */
	uint64_t mb_total;

	_Atomic uint64_t faults_read, premapped, mb_neighbours;
};

static struct halite_session *of_gs(struct gsession *g)
{
	return (struct halite_session *)((char *)g - offsetof(struct halite_session, gs));
}

/* The first message wins; the session has failed (its threads stay blocked). */
static int s_fail(struct halite_session *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int s_fail(struct halite_session *s, int err, const char *fmt, ...)
{
	char msg[sizeof(s->gs.errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	gs_errmsg_level(&s->gs, msg, HALITE_LOG_ERROR);
	gs_end(&s->gs, err);
	return err;
}

static bool failed(struct halite_session *s)
{
	return gs_failed(&s->gs);
}

/* The session region holding block @mb, and the block's offset and length in it. */
static bool mb_place(struct halite_session *s, uint64_t mb, uint32_t *ri, uint64_t *off,
		     uint64_t *len)
{
	for (uint32_t i = 0; i < s->nregs; i++) {
		const struct tpl_region *tr = s->trs[i];

		if (mb >= tr->first_mb && mb - tr->first_mb < tr->mb_count) {
			*ri = i;
			*off = (mb - tr->first_mb) * s->mb_size;
			*len = tr->length - *off < s->mb_size ? tr->length - *off : s->mb_size;
			return true;
		}
	}
	return false;
}

static int install(struct halite_session *s, uint64_t mb, int mode, unsigned flags)
{
	uint64_t off, len;
	uint32_t ri;
	int ret;

	if (!mb_place(s, mb, &ri, &off, &len))
		return -HALITE_E_INTERNAL;
	ret = halite_gmem_fill(s->gs.gm, ri, off, len, NULL, mode, flags);
	if (!ret)
		atomic_store_explicit(&s->mapped[mb], 1, memory_order_relaxed);
	if (ret == -ESRCH)
		return s_fail(s, ret, "the clone (pid %d) is gone", (int)s->o.owner_pid);
	if (ret)
		return s_fail(s, ret, "region '%s' offset %llu: installing memory block %llu",
			      s->trs[ri]->name, (unsigned long long)off, (unsigned long long)mb);
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
		gs_fault_served(&s->gs, tag);
	map_neighbours(s, mb);
}

/* The continue strategy's fault (gs_ops.fault). */
static void serve(struct gsession *g, const struct gs_fault *fault)
{
	struct gs_fault f = *fault;
	struct halite_session *s = of_gs(g);
	uint64_t now = halite_now_ns();
	bool hot_time = now - g->start_ns < (uint64_t)tpl_hot_window_ms(s->t) * 1000000;
	uint64_t mb = s->trs[f.ri]->first_mb + f.off / s->mb_size;
	int ret;

	/* Mapped: the thread was answered, and this is a new fault (after a discard, say). */
	f.again = f.again && !atomic_load_explicit(&s->mapped[mb], memory_order_relaxed);
	gs_count_fault(g, &f);
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
		gs_count_kind(&g->faults_zero, &f);
		if (!install(s, mb, HALITE_GMEM_ZERO, HALITE_GMEM_ZERO_GONE))
			gs_fault_served(g, now);
		return;
	}
	/* Noted before the request: once it is answered the clone runs on. */
	if (hot_time && !(s->o.flags & HALITE_SESSION_NO_HOT_RECORD))
		tpl_hot_note(s->t, mb, f.vcpu, now, g->start_ns);
	ret = tpl_request(s->t, &s->cl, mb, now);
	if (ret == 1) {
		gs_count_kind(&g->faults_cached, &f);
		if (!install(s, mb, HALITE_GMEM_CONTINUE, 0)) {
			gs_fault_served(g, now);
			map_neighbours(s, mb);
		}
	} else if (ret == 0) {
		gs_count_kind(&s->faults_read, &f);
	} else {
		char msg[512];

		tpl_errmsg_mb(s->t, mb, msg, sizeof(msg));
		s_fail(s, ret, "%s", msg);
	}
}

/* Everything is in: unregister, and the clone is on its own. */
static void finish(struct halite_session *s)
{
	int ret = gs_unregister(&s->gs);

	if (ret)
		s_fail(s, ret, "unregistering the clone's memory");
	else
		gs_end(&s->gs, 0);
}

static int fault_timeout(struct gsession *g)
{
	(void)g;
	/* The end is looked for between faults: when nothing comes, every 20 ms. */
	return 20;
}

static bool fault_next(struct gsession *g, int n)
{
	struct halite_session *s = of_gs(g);

	/* A failed session keeps the faulting threads blocked (and keeps reading). */
	if (!n && !failed(s) && tpl_complete(s->t) && !tpl_pending(s->t, &s->cl)) {
		finish(s);
		return false;
	}
	return true;
}

static const struct gs_ops continue_ops = {
	.fault = serve,
	.timeout_ms = fault_timeout,
	.next = fault_next,
};

/* Wait until no request of this session is pending: 0, or its failure. */
static int settle(struct halite_session *s)
{
	while (tpl_pending(s->t, &s->cl) && !failed(s))
		usleep(200);
	/* Failed: its end is being published, if it is not yet. */
	return failed(s) ? gs_wait(&s->gs, -1) : 0;
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

/* The regions given, checked against the template's, as the session's regions. */
static int check_regions(struct halite_session *s, const struct halite_session_region *r,
			 uint32_t n)
{
	s->trs = calloc(n ? n : 1, sizeof(*s->trs));
	if (!s->trs)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		int ti = r[i].name ? tpl_find_region(s->t, r[i].name) : -EINVAL;
		const struct tpl_region *tr;

		if (ti < 0)
			return s_fail(s, -EINVAL, "region '%s' is not in the template",
				      r[i].name ? r[i].name : "(null)");
		tr = tpl_region_at(s->t, (uint32_t)ti);
		for (uint32_t j = 0; j < i; j++)
			if (s->trs[j] == tr)
				return s_fail(s, -EINVAL, "region '%s' given twice", tr->name);
		if (r[i].length != tr->length || r[i].host % s->gs.page)
			return s_fail(s, -EINVAL, "region '%s': %llu bytes at 0x%llx, the template's "
				      "is %llu bytes (host-page aligned)", tr->name,
				      (unsigned long long)r[i].length,
				      (unsigned long long)r[i].host,
				      (unsigned long long)tr->length);
		s->trs[i] = tr;
		/* A private mapping of the memory file: MINOR faults where the file has it. */
		s->gs.regions[i] = (struct gs_region){
			.name = tr->name, .host = r[i].host, .length = r[i].length,
			.page = (uint32_t)s->gs.page, .shared = true,
			.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
			.need = 1ull << _UFFDIO_CONTINUE | 1ull << _UFFDIO_ZEROPAGE |
				1ull << _UFFDIO_WAKE,
			.hint = "a private mapping of the template memory file",
		};
	}
	s->nregs = n;
	return 0;
}

/* The options, checked. 0 or -EINVAL with the message. */
static int check_opts(struct halite_session *s, const struct halite_session_opts *opts)
{
	int ret = halite_opts_copy(&s->o, sizeof(s->o), opts);

	if (ret)
		return s_fail(s, ret, "session options: fields this build does not know are set");
	if (s->o.flags & ~HALITE_SESSION_FLAGS_ALL)
		return s_fail(s, -EINVAL, "flags 0x%x: unknown bits 0x%x", s->o.flags,
			      s->o.flags & ~HALITE_SESSION_FLAGS_ALL);
	if (s->o.nvcpus && !s->o.vcpu_tids)
		return s_fail(s, -EINVAL, "nvcpus %u without vcpu_tids", s->o.nvcpus);
	if (s->o.owner_pid && s->o.owner_uffd < 0)
		return s_fail(s, -EINVAL, "owner_pid %d without an owner_uffd",
			      (int)s->o.owner_pid);
	if (!s->o.owner_pid && (s->o.flags & HALITE_SESSION_ATTACH))
		return s_fail(s, -EINVAL, "HALITE_SESSION_ATTACH without an owner_pid");
	return 0;
}

int halite_session_start(struct halite_session **sp, struct halite_template *t,
			 const struct halite_session_region *regions, uint32_t nregions,
			 const struct halite_session_opts *opts)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MISSING_SHMEM |
			UFFD_FEATURE_MINOR_SHMEM | HALITE_GMEM_EVENTS;
	struct halite_session *s;
	unsigned uflags;
	int ret;

	if (!sp || !t)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	gs_init(&s->gs, &continue_ops, NULL);
	s->t = t;
	s->cl.block_in = block_in;
	s->mb_size = tpl_mb_size(t);
	ret = check_opts(s, opts);
	if (!ret && (!regions || !nregions || nregions > tpl_region_count(t)))
		ret = s_fail(s, -EINVAL, "%u regions given, the template has %u", nregions,
			     tpl_region_count(t));
	if (!ret)
		ret = gs_setup(&s->gs, nregions, s->o.vcpu_tids, s->o.nvcpus);
	s->o.vcpu_tids = NULL; /* the caller's; gs_setup() copied them */
	if (ret)
		goto err;
	s->mb_total = halite_reader_info(halite_template_reader(t))->mb_count;
	s->mapped = calloc(s->mb_total ? s->mb_total : 1, 1);
	if (!s->mapped) {
		ret = -ENOMEM;
		goto err;
	}
	ret = check_regions(s, regions, nregions);
	if (ret)
		goto err;
	uflags = HALITE_UFFD_EXACT |
		 ((s->o.flags & HALITE_SESSION_ATTACH) ? HALITE_UFFD_TAKEOVER : 0);
	ret = gs_open_uffd(&s->gs, s->o.owner_pid ? s->o.owner_uffd : -1, want, uflags);
	if (!ret)
		ret = gs_make_gmem(&s->gs);
	if (!ret)
		ret = gs_register_all(&s->gs);
	if (ret)
		goto err;
	gs_running(&s->gs);
	ret = gs_start_thread(&s->gs);
	if (ret) {
		s_fail(s, ret, "starting the fault thread");
		goto err;
	}
	/* Taking over: faults the dead handler read but never answered come again. */
	if (s->o.flags & HALITE_SESSION_ATTACH)
		gs_wake_all(&s->gs);
	if (s->o.flags & HALITE_SESSION_PREMAP_HOT) {
		ret = premap_hot(s);
		if (ret)
			goto err;
	}
	s->ready_ns = halite_now_ns();
	*sp = s;
	return 0;
err:
	if (!s->gs.errmsg[0])
		s_fail(s, ret, "session");
	/* The session goes with its message: the caller's buffer keeps it. */
	if (s->o.errbuf && s->o.errbuf_len)
		snprintf(s->o.errbuf, s->o.errbuf_len, "%s", s->gs.errmsg);
	halite_session_free(s);
	return ret;
}

int halite_session_wait(struct halite_session *s, int timeout_ms)
{
	if (!s)
		return -EINVAL;
	return gs_wait(&s->gs, timeout_ms);
}

void halite_session_stats(struct halite_session *s, struct halite_session_stats *st)
{
	uint64_t done_ns;
	int state, err;

	memset(st, 0, sizeof(*st));
	if (!s)
		return;
	st->ready_ns = s->ready_ns ? s->ready_ns - s->gs.start_ns : 0;
	st->faults = atomic_load(&s->gs.faults);
	st->faults_cached = atomic_load(&s->gs.faults_cached);
	st->faults_read = atomic_load(&s->faults_read);
	st->faults_zero = atomic_load(&s->gs.faults_zero);
	st->faults_vcpu = atomic_load(&s->gs.faults_vcpu);
	st->mb_premapped = atomic_load(&s->premapped);
	st->mb_neighbours = atomic_load(&s->mb_neighbours);
	st->lb_read = tpl_lb_asked(s->t, &s->cl);
	st->bytes_read = st->lb_read * tpl_lb_size(s->t);
	st->fault_p50_ns = halite_hist_quantile(&s->gs.hist, 0.50);
	st->fault_p99_ns = halite_hist_quantile(&s->gs.hist, 0.99);
	pthread_mutex_lock(&s->gs.mu);
	state = s->gs.state;
	err = s->gs.error;
	done_ns = s->gs.done_ns;
	pthread_mutex_unlock(&s->gs.mu);
	st->done = state == GS_DONE;
	st->error = err;
	if (s->ready_ns)
		st->duration_ns = (st->done ? done_ns : halite_now_ns()) - s->ready_ns;
}

const char *halite_session_errmsg(const struct halite_session *s)
{
	return s ? s->gs.errmsg : "";
}

void halite_session_free(struct halite_session *s)
{
	if (!s)
		return;
	gs_stop_thread(&s->gs);
	/* No callback can run on us after this. */
	tpl_detach(s->t, &s->cl);
	/*
	 * This process's memory, not done: closing the descriptor would let a
	 * waiting thread read the file's holes as zeros. Make it fault instead.
	 */
	if (!s->o.owner_pid && gs_state(&s->gs, NULL) != GS_DONE)
		gs_protect_none(&s->gs);
	gs_destroy(&s->gs);
	free(s->trs);
	free((void *)s->mapped);
	free(s);
}
