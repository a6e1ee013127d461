/* SPDX-License-Identifier: MIT */
/*
 * A session (guest_session.h): one guest's userfaultfd, regions, gmem,
 * fault thread, counters, error and end, shared by the single restore and
 * every clone session; what a fault means is the install strategy's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>

#include "fault_loop.h"
#include "guest_session.h"
#include "pool.h"
#include "uffd.h"

#define ULL(x) ((unsigned long long)(x))

void gs_init(struct gsession *s, const struct gs_ops *ops, const struct halite_logger *log)
{
	*s = (struct gsession){ .ops = ops, .log = log, .uffd = -1, .stop_fd = -1,
				.start_ns = halite_now_ns(),
				.page = (uint64_t)sysconf(_SC_PAGESIZE) };
	pthread_mutex_init(&s->mu, NULL);
	halite_cond_init_mono(&s->cv);
	halite_hist_init(&s->hist);
}

int gs_setup(struct gsession *s, uint32_t nregions, const pid_t *vcpus, uint32_t nvcpus)
{
	s->regions = calloc(nregions ? nregions : 1, sizeof(*s->regions));
	if (!s->regions)
		return -ENOMEM;
	s->nregions = nregions;
	if (nvcpus) {
		s->vcpus = malloc(nvcpus * sizeof(*s->vcpus));
		if (!s->vcpus)
			return -ENOMEM;
		memcpy(s->vcpus, vcpus, nvcpus * sizeof(*s->vcpus));
		s->nvcpus = nvcpus;
	}
	return 0;
}

void gs_destroy(struct gsession *s)
{
	if (!s->ops)
		return; /* never initialised */
	gs_stop_thread(s);
	halite_gmem_free(s->gm);
	s->gm = NULL;
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	free(s->regions);
	free(s->vcpus);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	s->ops = NULL;
}

/* ---- the error and the end ---- */

void gs_errmsg_level(struct gsession *s, const char *msg, int level)
{
	bool first;

	pthread_mutex_lock(&s->mu);
	first = !s->errmsg[0];
	if (first)
		snprintf(s->errmsg, sizeof(s->errmsg), "%s", msg);
	pthread_mutex_unlock(&s->mu);
	/* Once failed, every thread's next install fails too: one error is news. */
	if (s->log)
		halite_logf(s->log, first ? level : HALITE_LOG_DEBUG, "%s", msg);
}

int gs_fail(struct gsession *s, int err, const char *fmt, ...)
{
	char msg[sizeof(s->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	gs_errmsg_level(s, msg, HALITE_LOG_ERROR);
	return err < 0 ? err : -err;
}

bool gs_end(struct gsession *s, int err)
{
	if (err)
		atomic_store(&s->failed, true);
	pthread_mutex_lock(&s->mu);
	if (s->ending || s->state != GS_RUNNING) {
		pthread_mutex_unlock(&s->mu);
		return false;
	}
	s->ending = true;
	s->done_ns = halite_now_ns();
	pthread_mutex_unlock(&s->mu);
	if (atomic_load(&s->faults_again))
		halite_logf(s->log, HALITE_LOG_DEBUG, "%llu faults delivered again (woken before "
			    "they were answered), counted once",
			    (unsigned long long)atomic_load(&s->faults_again));
	/* Before the state: a caller woken by wait() finds what it wrote complete. */
	if (s->ops->ending)
		s->ops->ending(s, err);
	pthread_mutex_lock(&s->mu);
	s->state = err ? GS_FAILED : GS_DONE;
	s->error = err;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return true;
}

int gs_wait(struct gsession *s, int timeout_ms)
{
	struct timespec dl;
	int ret = 0, state, err;

	if (timeout_ms >= 0)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&s->mu);
	while ((s->state == GS_RUNNING || s->state == GS_CREATED) && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&s->cv, &s->mu)
				     : pthread_cond_timedwait(&s->cv, &s->mu, &dl);
	state = s->state;
	err = s->error;
	pthread_mutex_unlock(&s->mu);
	if (state == GS_RUNNING || state == GS_CREATED)
		return -ETIMEDOUT;
	return state == GS_FAILED ? err : 0;
}

int gs_state(struct gsession *s, int *err)
{
	int state;

	pthread_mutex_lock(&s->mu);
	state = s->state;
	if (err)
		*err = s->error;
	pthread_mutex_unlock(&s->mu);
	return state;
}

void gs_running(struct gsession *s)
{
	pthread_mutex_lock(&s->mu);
	s->state = GS_RUNNING;
	s->running_ns = halite_now_ns();
	pthread_mutex_unlock(&s->mu);
}

/* ---- the userfaultfd and the regions ---- */

int gs_open_uffd(struct gsession *s, int owner_uffd, uint64_t want, unsigned flags)
{
	uint64_t missing = 0;
	const char *why;
	char names[160];

	s->uffd = halite_uffd_acquire(owner_uffd, want, flags, &missing, &why);
	if (s->uffd >= 0)
		return 0;
	if (why)
		return gs_fail(s, s->uffd, "owner_uffd %d %s", owner_uffd, why);
	/* Our dup of the owner's descriptor failed. */
	if (owner_uffd >= 0 && (s->uffd == -EBADF || s->uffd == -EMFILE))
		return gs_fail(s, s->uffd, "owner_uffd %d", owner_uffd);
	return gs_fail(s, s->uffd, "userfaultfd%s%s", missing ? " lacks " : "",
		       missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
}

/* The ioctls of @need, named ("UFFDIO_COPY and UFFDIO_ZEROPAGE"). */
static const char *ioctl_names(uint64_t need, char *buf, size_t len)
{
	static const struct { int bit; const char *name; } names[] = {
		{ _UFFDIO_COPY, "UFFDIO_COPY" }, { _UFFDIO_ZEROPAGE, "UFFDIO_ZEROPAGE" },
		{ _UFFDIO_CONTINUE, "UFFDIO_CONTINUE" },
	};
	size_t n = 0;

	buf[0] = 0;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (need & 1ull << names[i].bit)
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s",
					      n ? " and " : "", names[i].name);
	return buf;
}

static int register_region(struct gsession *s, struct gs_region *g)
{
	/* Registering again with the same descriptor (a take-over) is allowed. */
	int ret = halite_uffd_register(s->uffd, g->host, g->length, g->mode, g->need);
	bool minor = g->mode & UFFDIO_REGISTER_MODE_MINOR;
	char names[96];

	if (ret == -EBUSY)
		return gs_fail(s, -EBUSY, "region '%s' is already registered with another "
			       "userfaultfd: a save or restore of this memory is running", g->name);
	if (ret && ret != -HALITE_E_UNSUPPORTED)
		return gs_fail(s, ret, "region '%s' at 0x%llx: UFFDIO_REGISTER %s (%s?)", g->name,
			       ULL(g->host), minor ? "MISSING|MINOR" : "MISSING", g->hint);
	g->registered = true;
	if (ret)
		return gs_fail(s, ret, "region '%s': no %s on this memory", g->name,
			       ioctl_names(g->need & ~(1ull << _UFFDIO_WAKE), names,
					   sizeof(names)));
	return 0;
}

int gs_register_all(struct gsession *s)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		int ret = s->regions[i].placeholder ? 0 : register_region(s, &s->regions[i]);

		if (ret)
			return ret;
	}
	return 0;
}

void gs_unregister_regions(struct gsession *s)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct gs_region *g = &s->regions[i];

		if (g->registered && !halite_uffd_unregister(s->uffd, g->host, g->length))
			g->registered = false;
	}
}

int gs_make_gmem(struct gsession *s)
{
	struct halite_gmem_region *gr = calloc(s->nregions ? s->nregions : 1, sizeof(*gr));
	int ret;

	if (!gr)
		return gs_fail(s, -ENOMEM, "guest memory map");
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct gs_region *g = &s->regions[i];

		/* A placeholder keeps the region numbers: no memory of the descriptor's. */
		gr[i] = (struct halite_gmem_region){ g->placeholder ? 0 : g->host,
						     g->placeholder ? 0 : g->length, g->page,
						     g->shared };
	}
	ret = halite_gmem_create(&s->gm, s->uffd, gr, s->nregions);
	free(gr);
	return ret ? gs_fail(s, ret, "guest memory map") : 0;
}

void gs_wake_all(struct gsession *s)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		int ret;

		if (s->regions[i].placeholder)
			continue;
		ret = halite_gmem_wake(s->gm, i, 0, s->regions[i].length);
		if (ret && s->log)
			halite_logf(s->log, HALITE_LOG_WARN, "region '%s': UFFDIO_WAKE: %s",
				    s->regions[i].name, strerror(-ret));
	}
}

int gs_unregister(struct gsession *s)
{
	int ret = halite_gmem_unregister(s->gm);

	for (uint32_t i = 0; i < s->nregions; i++)
		s->regions[i].registered = false;
	return ret;
}

static void protect_none(void *ctx, uint32_t ri, uint64_t host, uint64_t len)
{
	struct gsession *s = ctx;

	if (mprotect((void *)(uintptr_t)host, len, PROT_NONE) && s->log)
		halite_logf(s->log, HALITE_LOG_ERROR, "region '%s': mprotect(PROT_NONE) after a "
			    "failed restore: %s", s->regions[ri].name, strerror(errno));
}

void gs_protect_none(struct gsession *s)
{
	for (uint32_t i = 0; s->gm && i < s->nregions; i++)
		if (s->regions[i].registered) {
			/* Where the memory is now: moves included. */
			halite_gmem_ranges(s->gm, protect_none, s);
			return;
		}
}

/* ---- the fault thread ---- */

static void serve_one(struct gsession *s, const struct uffd_msg *m, uint64_t t0)
{
	uint64_t addr = m->arg.pagefault.address & ~(s->page - 1);
	struct gs_fault f = {
		.write = m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE,
		.tid = m->arg.pagefault.feat.ptid,
		.t0 = t0,
	};

	if (!halite_gmem_lookup(s->gm, addr, &f.ri, &f.off)) {
		/* Outside guest memory now (left behind by a move): what the mapping holds. */
		int ret = halite_gmem_serve_stray(s->gm, m);

		if (ret && s->ops->stray_failed)
			s->ops->stray_failed(s, addr, ret);
		return;
	}
	f.vcpu = gs_vcpu_of(s, f.tid);
	if (f.tid) {
		struct gs_last_fault *l = &s->last[f.tid % GS_LAST_FAULTS];

		f.again = l->tid == f.tid && l->addr == addr;
		*l = (struct gs_last_fault){ f.tid, addr };
	}
	s->ops->fault(s, &f);
}

static int loop_timeout(void *ctx)
{
	struct gsession *s = ctx;

	return s->ops->timeout_ms ? s->ops->timeout_ms(s) : -1;
}

static void loop_serve(void *ctx, const struct uffd_msg *m, int n, uint64_t t0)
{
	for (int i = 0; i < n; i++)
		serve_one(ctx, &m[i], t0);
}

static bool loop_next(void *ctx, int n)
{
	struct gsession *s = ctx;

	return s->ops->next ? s->ops->next(s, n) : true;
}

static void loop_failed(void *ctx, int err)
{
	struct gsession *s = ctx;

	gs_end(s, gs_fail(s, err, "reading the userfaultfd"));
}

static void *fault_main(void *arg)
{
	struct gsession *s = arg;
	struct halite_fault_loop loop = {
		.gm = s->gm, .uffd = s->uffd, .stop_fd = s->stop_fd, .ctx = s,
		.timeout_ms = loop_timeout, .serve = loop_serve, .next = loop_next,
		.failed = loop_failed,
	};

	pthread_setname_np(pthread_self(), "halite-fault");
	/*
	 * Serve until told to stop or the strategy ends it: also after done
	 * (messages read before the ranges were unregistered) and after a
	 * failure (a fault that raced an install is still woken).
	 */
	halite_fault_loop_run(&loop);
	return NULL;
}

int gs_start_thread(struct gsession *s)
{
	int ret;

	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->stop_fd < 0)
		return -errno;
	ret = halite_thread_start(&s->thread, fault_main, s);
	s->thread_started = !ret;
	return ret;
}

void gs_stop_thread(struct gsession *s)
{
	if (!s->thread_started)
		return;
	eventfd_write(s->stop_fd, 1);
	pthread_join(s->thread, NULL);
	s->thread_started = false;
}
