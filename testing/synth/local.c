// SPDX-License-Identifier: MIT
/*
 * The guest in this process: its memory, its vCPU threads, their control
 * (start, pause, resume, stop) and what the API reads of them. In child mode
 * this runs in the child (child.c serves the parent from these calls); the
 * public API (guest.c) calls it directly otherwise.
 *
 * Parking. The state (created, run, pause, stop) changes under g->mu; a vCPU
 * loads it relaxed before each access and, when it is not "run", parks under
 * g->mu and counts itself in nparked. pause() sets "pause" and waits for
 * nparked == nvcpus: an access in flight always completes first, and the
 * mutex hand-off makes every write a vCPU did visible to the caller.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "stats.h"

/* --- vCPUs --- */

static void vcpu_access(struct synth_vcpu *vc, uint64_t va, bool wr)
{
	struct synth_guest *g = vc->g;
	uint64_t gpa = 0, *w, v;
	struct tlb_entry *t = NULL;
	bool hit = false;

	if (vc->tlb) {
		t = &vc->tlb[(va >> PG_SHIFT) % g->o.tlb_entries];
		/* In A/D mode a write through an entry whose D was not set must walk. */
		hit = t->tag == (va >> PG_SHIFT) + 1 &&
		      (!wr || !(g->o.flags & SYNTH_F_AD_BITS) || (t->gpa & 1));
		if (hit)
			gpa = (t->gpa & ~(PG_SIZE - 1)) | (va & (PG_SIZE - 1));
	}
	if (!hit) {
		__atomic_store_n(&vc->walks, vc->walks + 1, __ATOMIC_RELAXED);
		if (synth_mmu_translate(vc, va, wr, &gpa)) {
			__atomic_store_n(&vc->faults, vc->faults + 1, __ATOMIC_RELAXED);
			return;
		}
		if (t) {
			t->tag = (va >> PG_SHIFT) + 1;
			t->gpa = (gpa & ~(PG_SIZE - 1)) | (wr ? 1 : 0);
		}
	}
	/*
	 * Relaxed atomics: the guest's memory is also read by the engine (and
	 * by process_vm_readv, uffd copies) while we run, like a real guest's.
	 * The RMW is deliberately not locked: a plain guest store.
	 */
	w = (uint64_t *)(g->mem + (gpa & ~7ull));
	v = __atomic_load_n(w, __ATOMIC_RELAXED);
	if (wr) {
		__atomic_store_n(w, v + SYNTH_WRITE_ADD, __ATOMIC_RELAXED);
		__atomic_store_n(&vc->writes, vc->writes + 1, __ATOMIC_RELAXED);
	} else {
		vc->sink += v;
	}
	if (g->o.log_mode)
		synth_log_append(vc, (gpa >> PG_SHIFT) | (wr ? SYNTH_LOG_WRITE : 0));
}

/* One step of the pattern; false when the trace is finished. */
static bool vcpu_step(struct synth_vcpu *vc, uint64_t i)
{
	struct synth_guest *g = vc->g;
	uint64_t va, u;
	bool wr;

	switch (g->o.pattern) {
	case SYNTH_PAT_SEQ:
		u = i % vc->ws_units;
		va = vc->unit_va[u] + (((i / vc->ws_units) * 8) & (PG_SIZE - 1));
		wr = synth_rand(&vc->rng) % 100 < g->o.write_pct;
		break;
	case SYNTH_PAT_RANDOM:
		u = synth_rand(&vc->rng) % vc->ws_units;
		va = vc->unit_va[u] + (synth_rand(&vc->rng) % (PG_SIZE / 8)) * 8;
		wr = synth_rand(&vc->rng) % 100 < g->o.write_pct;
		break;
	default:
		if (!vc->rep_n || (i >= vc->rep_n && !(g->o.flags & SYNTH_F_TRACE_LOOP)))
			return false;
		u = i % vc->rep_n;
		va = vc->rep_va[u];
		wr = vc->rep_wr[u];
		break;
	}
	if (vc->rec)
		synth_trace_append(vc, va, wr);
	vcpu_access(vc, va, wr);
	return true;
}

/* Park until running (and not done) or stopping; returns the state. */
static int vcpu_park(struct synth_vcpu *vc, bool done)
{
	struct synth_guest *g = vc->g;
	int st;

	pthread_mutex_lock(&g->mu);
	if (done && !vc->done) {
		vc->done = true;
		g->ndone++;
		pthread_cond_broadcast(&g->cv_parked);
	}
	if (g->state == ST_RUN && !vc->done) {
		pthread_mutex_unlock(&g->mu);
		return ST_RUN;
	}
	g->nparked++;
	pthread_cond_broadcast(&g->cv_parked);
	while (g->state != ST_STOP && (g->state != ST_RUN || vc->done))
		pthread_cond_wait(&g->cv_run, &g->mu);
	g->nparked--;
	st = g->state;
	pthread_mutex_unlock(&g->mu);
	return st;
}

static void *vcpu_main(void *arg)
{
	struct synth_vcpu *vc = arg;
	struct synth_guest *g = vc->g;
	char name[16];
	uint64_t i = 0;

	vc->tid = (pid_t)syscall(SYS_gettid);
	snprintf(name, sizeof(name), "synth-vcpu%u", vc->idx);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		uint64_t lim = __atomic_load_n(&vc->limit, __ATOMIC_RELAXED);
		bool done = lim && i >= lim;

		if (done || __atomic_load_n(&g->state, __ATOMIC_RELAXED) != ST_RUN) {
			if (vcpu_park(vc, done) == ST_STOP)
				break;
			i = vc->accesses; /* synth_vcpu_seek() may have moved it */
			continue;
		}
		if (!vcpu_step(vc, i)) {
			if (vcpu_park(vc, true) == ST_STOP)
				break;
			continue;
		}
		__atomic_store_n(&vc->accesses, ++i, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* --- memory --- */

static int map_memory(struct synth_guest *g)
{
	size_t len = (size_t)(g->nframes << PG_SHIFT);
	void *p;
	int ret;

	if (g->o.mem_host) {
		g->mem = g->o.mem_host;
		return 0;
	}
	if (g->o.backing == SYNTH_MEM_SHARED) {
		g->memfd = memfd_create("halite-synth", MFD_CLOEXEC);
		if (g->memfd < 0)
			return -errno;
		if (ftruncate(g->memfd, (off_t)len))
			return -errno;
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd, 0);
	} else {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	}
	if (p == MAP_FAILED) {
		ret = -errno;
		synth_err(g, "cannot map %zu bytes of guest memory: %s", len, strerror(errno));
		return ret;
	}
	g->mem = p;
	/*
	 * Guest pages are 4 KiB to the host as well: with THP one write would
	 * populate the 2 MiB around it and "never touched" would be a lie, and
	 * an engine's faults would come in 2 MiB.
	 */
	madvise(p, len, MADV_NOHUGEPAGE); /* shmem THP honours it too */
	return 0;
}

/* A vCPU's random state at step 0. */
static uint64_t vcpu_seed(const struct synth_opts *o, unsigned v)
{
	return synth_seed(o->seed, 0x76637075ull << 8 | v); /* "vcpu" */
}

static int alloc_vcpus(struct synth_guest *g)
{
	const struct synth_opts *o = &g->o;
	uint64_t span = synth_vspan(o);

	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		vc->g = g;
		vc->idx = v;
		vc->limit = o->max_accesses;
		vc->vbase = o->vbase + v * span;
		vc->vspan = span;
		vc->map_units = o->map_bytes / PG_SIZE;
		vc->ws_units = o->ws_bytes / PG_SIZE;
		vc->rng = vcpu_seed(o, v);
		vc->unit_va = malloc((vc->map_units + 1) * sizeof(uint64_t));
		vc->unit_gpa = malloc((vc->map_units + 1) * sizeof(uint64_t));
		if (!vc->unit_va || !vc->unit_gpa)
			return -ENOMEM;
		if (o->log_mode && !(vc->log = malloc(o->log_entries * sizeof(uint64_t))))
			return -ENOMEM;
		if (o->tlb_entries && !(vc->tlb = calloc(o->tlb_entries, sizeof(*vc->tlb))))
			return -ENOMEM;
		if (o->trace_out && !(vc->rec = malloc((size_t)REC_BUF * SYNTH_TRACE_REC)))
			return -ENOMEM;
	}
	return 0;
}

int synth_local_create(struct synth_guest **gp, const struct synth_opts *o)
{
	struct synth_guest *g = calloc(1, sizeof(*g));
	int ret;

	if (!g)
		return -ENOMEM;
	g->o = *o;
	g->log.fn = o->log_fn;
	g->log.ctx = o->log_ctx;
	g->log.level = HALITE_LOG_DEBUG;
	g->memfd = -1;
	g->trace_fd = -1;
	g->nvcpus = o->nvcpus;
	g->nframes = o->mem_bytes >> PG_SHIFT;
	g->state = ST_CREATED;

	pthread_mutex_init(&g->ctl_mu, NULL);
	pthread_mutex_init(&g->mu, NULL);
	pthread_mutex_init(&g->trace_mu, NULL);
	ret = halite_cond_init_mono(&g->cv_run);
	if (!ret)
		ret = halite_cond_init_mono(&g->cv_parked);
	if (ret) {
		free(g);
		return ret;
	}
	g->mu_ok = true;

	ret = alloc_vcpus(g);
	if (ret)
		goto fail;
	if (o->pattern == SYNTH_PAT_TRACE) {
		ret = synth_trace_load(g);
		if (ret)
			goto fail;
	}
	g->kinds = calloc(g->nframes, 1);
	if (!g->kinds) {
		ret = -ENOMEM;
		goto fail;
	}
	if (o->log_mode == SYNTH_LOG_FIRST &&
	    !(g->touched = calloc((g->nframes + 63) / 64, sizeof(uint64_t)))) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = map_memory(g);
	if (ret)
		goto fail;
	if (o->flags & SYNTH_F_ATTACH) {
		/*
		 * The same builder, the same allocation order, into scratch
		 * memory that is thrown away: every layout fact (CR3s, units,
		 * kinds) is what the guest made with these options has, and
		 * guest memory stays untouched for whoever fills it.
		 */
		size_t len = (size_t)(g->nframes << PG_SHIFT);
		void *scratch = mmap(NULL, len, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (scratch == MAP_FAILED) {
			ret = -errno;
			goto fail;
		}
		ret = synth_build_tables(g, scratch);
		munmap(scratch, len);
	} else {
		ret = synth_build_tables(g, g->mem);
	}
	if (ret)
		goto fail;
	ret = synth_fill(g, !(o->flags & SYNTH_F_ATTACH));
	if (ret)
		goto fail;
	if (o->trace_out) {
		ret = synth_trace_open_out(g);
		if (ret)
			goto fail;
	}

	g->info.host_addr = g->mem;
	g->info.local_addr = g->mem;
	g->info.mem_bytes = o->mem_bytes;
	g->info.gpa_base = 0;
	g->info.memfd = g->memfd;
	g->info.owner_pid = getpid();
	g->info.nvcpus = g->nvcpus;
	g->info.paging_levels = o->paging_levels;
	g->info.backing = o->backing;
	g->info.stride = o->stride;

	for (unsigned v = 0; v < g->nvcpus; v++) {
		ret = -pthread_create(&g->vcpu[v].thread, NULL, vcpu_main, &g->vcpu[v]);
		if (ret)
			goto fail;
		g->vcpu[v].thread_ok = true;
	}
	/* Created paused: every vCPU parked, so its tid is known. */
	pthread_mutex_lock(&g->mu);
	while (g->nparked < g->nvcpus)
		pthread_cond_wait(&g->cv_parked, &g->mu);
	pthread_mutex_unlock(&g->mu);
	*gp = g;
	return 0;

fail:
	synth_local_free(g);
	return ret;
}

void synth_local_free(struct synth_guest *g)
{
	synth_local_stop(g);
	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		free(vc->unit_va);
		free(vc->unit_gpa);
		free(vc->rep_va);
		free(vc->rep_wr);
		free(vc->log);
		free(vc->tlb);
		free(vc->rec);
	}
	if (g->mem && !g->o.mem_host)
		munmap(g->mem, (size_t)(g->nframes << PG_SHIFT));
	if (g->memfd >= 0)
		close(g->memfd);
	if (g->trace_fd >= 0)
		close(g->trace_fd);
	free(g->kinds);
	free(g->touched);
	if (g->mu_ok) {
		pthread_cond_destroy(&g->cv_run);
		pthread_cond_destroy(&g->cv_parked);
	}
	pthread_mutex_destroy(&g->mu);
	pthread_mutex_destroy(&g->ctl_mu);
	pthread_mutex_destroy(&g->trace_mu);
	free(g);
}

/* --- control --- */

/* Under ctl_mu and mu: from created (start) or paused (resume) to running. */
int synth_local_run(struct synth_guest *g, bool start)
{
	int ret = 0;

	pthread_mutex_lock(&g->ctl_mu);
	pthread_mutex_lock(&g->mu);
	if (g->state == ST_STOP)
		ret = -ESRCH;
	else if (start && g->state != ST_CREATED)
		ret = -EALREADY;
	else if (!start && g->state == ST_CREATED)
		ret = -EINVAL;
	if (!ret && g->state != ST_RUN) {
		__atomic_store_n(&g->state, ST_RUN, __ATOMIC_RELAXED);
		pthread_cond_broadcast(&g->cv_run);
	}
	pthread_mutex_unlock(&g->mu);
	pthread_mutex_unlock(&g->ctl_mu);
	return ret;
}

/* timeout_ms < 0: forever. */
int synth_local_pause(struct synth_guest *g, long timeout_ms)
{
	struct timespec dl;
	int ret = 0;

	if (timeout_ms >= 0)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&g->ctl_mu);
	pthread_mutex_lock(&g->mu);
	if (g->state == ST_STOP) {
		ret = -ESRCH;
		goto out;
	}
	if (g->state == ST_RUN) {
		__atomic_store_n(&g->state, ST_PAUSE, __ATOMIC_RELAXED);
		pthread_cond_broadcast(&g->cv_run);
	}
	while (g->nparked < g->nvcpus && !ret) {
		if (timeout_ms < 0)
			pthread_cond_wait(&g->cv_parked, &g->mu);
		else if (pthread_cond_timedwait(&g->cv_parked, &g->mu, &dl) == ETIMEDOUT)
			ret = g->nparked < g->nvcpus ? -ETIMEDOUT : 0;
	}
out:
	pthread_mutex_unlock(&g->mu);
	pthread_mutex_unlock(&g->ctl_mu);
	return ret;
}

int synth_local_stop(struct synth_guest *g)
{
	int ret = 0;

	pthread_mutex_lock(&g->ctl_mu);
	pthread_mutex_lock(&g->mu);
	__atomic_store_n(&g->state, ST_STOP, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&g->cv_run);
	pthread_mutex_unlock(&g->mu);
	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		if (vc->thread_ok) {
			pthread_join(vc->thread, NULL);
			vc->thread_ok = false;
		}
		if (vc->rec && g->trace_fd >= 0) {
			int r = synth_trace_flush_vcpu(vc);

			ret = ret ? ret : r;
		}
	}
	pthread_mutex_unlock(&g->ctl_mu);
	return ret;
}

int synth_local_wait_done(struct synth_guest *g, unsigned timeout_ms)
{
	struct timespec dl;
	int ret = 0;

	if (!g->o.max_accesses &&
	    (g->o.pattern != SYNTH_PAT_TRACE || (g->o.flags & SYNTH_F_TRACE_LOOP)))
		return -EINVAL;
	if (timeout_ms)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&g->mu);
	while (g->ndone < g->nvcpus && !ret) {
		if (!timeout_ms)
			pthread_cond_wait(&g->cv_parked, &g->mu);
		else if (pthread_cond_timedwait(&g->cv_parked, &g->mu, &dl) == ETIMEDOUT)
			ret = g->ndone < g->nvcpus ? -ETIMEDOUT : 0;
	}
	pthread_mutex_unlock(&g->mu);
	return ret;
}

/* Returns with ctl_mu held when the guest is not running; else -EBUSY. */
static int lock_quiet(struct synth_guest *g)
{
	pthread_mutex_lock(&g->ctl_mu);
	pthread_mutex_lock(&g->mu);
	if (g->state == ST_RUN || g->nparked < g->nvcpus) {
		bool stopped = g->state == ST_STOP;

		pthread_mutex_unlock(&g->mu);
		if (stopped)
			return 0; /* threads joined or joining under ctl_mu: quiet */
		pthread_mutex_unlock(&g->ctl_mu);
		return -EBUSY;
	}
	pthread_mutex_unlock(&g->mu);
	return 0;
}

/* --- what the API reads and sets --- */

int synth_local_vcpu_seek(struct synth_guest *g, unsigned vcpu, uint64_t accesses)
{
	struct synth_vcpu *vc = &g->vcpu[vcpu];
	uint64_t draws;
	int ret = 0;

	/* The random draws of one step (vcpu_step): write choice, and unit and offset. */
	draws = g->o.pattern == SYNTH_PAT_SEQ ? 1 : g->o.pattern == SYNTH_PAT_RANDOM ? 3 : 0;
	pthread_mutex_lock(&g->mu);
	if (g->state != ST_CREATED) {
		ret = -EBUSY;
	} else {
		/* The thread is parked: it rereads its position under g->mu when it wakes. */
		vc->rng = vcpu_seed(&g->o, vcpu);
		for (uint64_t n = accesses * draws; n; n--)
			synth_rand(&vc->rng);
		__atomic_store_n(&vc->accesses, accesses, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&g->mu);
	return ret;
}

int synth_local_vcpu_limit(struct synth_guest *g, unsigned vcpu, uint64_t accesses)
{
	struct synth_vcpu *vc = &g->vcpu[vcpu];
	int ret = lock_quiet(g);

	if (ret)
		return ret;
	pthread_mutex_lock(&g->mu);
	__atomic_store_n(&vc->limit, accesses, __ATOMIC_RELAXED);
	/* Done only by the old limit: it runs again once resumed (a finished trace ends it again). */
	if (vc->done && (!accesses || accesses > vc->accesses)) {
		vc->done = false;
		g->ndone--;
	}
	pthread_mutex_unlock(&g->mu);
	pthread_mutex_unlock(&g->ctl_mu);
	return 0;
}

int synth_local_vcpu_pages(struct synth_guest *g, unsigned vcpu, uint64_t first, uint64_t *va,
			   uint64_t *gpa, size_t n)
{
	const struct synth_vcpu *vc = &g->vcpu[vcpu];

	n = synth_run_len(first, vc->map_units, n);
	if (!n)
		return 0;
	if (va)
		memcpy(va, vc->unit_va + first, n * sizeof(uint64_t));
	if (gpa)
		memcpy(gpa, vc->unit_gpa + first, n * sizeof(uint64_t));
	return (int)n;
}

int synth_local_frame_kinds(struct synth_guest *g, uint64_t first, uint8_t *kinds, size_t n)
{
	n = synth_run_len(first, g->nframes, n);
	if (n)
		memcpy(kinds, g->kinds + first, n);
	return (int)n;
}

void synth_local_vcpu_stats(struct synth_guest *g, unsigned vcpu, struct synth_vcpu_stats *st)
{
	struct synth_vcpu *vc = &g->vcpu[vcpu];

	st->accesses = __atomic_load_n(&vc->accesses, __ATOMIC_RELAXED);
	st->writes = __atomic_load_n(&vc->writes, __ATOMIC_RELAXED);
	st->faults = __atomic_load_n(&vc->faults, __ATOMIC_RELAXED);
	st->walks = __atomic_load_n(&vc->walks, __ATOMIC_RELAXED);
	st->log_len = __atomic_load_n(&vc->log_len, __ATOMIC_ACQUIRE);
	st->log_dropped = __atomic_load_n(&vc->log_dropped, __ATOMIC_RELAXED);
	pthread_mutex_lock(&g->mu);
	st->done = vc->done;
	pthread_mutex_unlock(&g->mu);
}

int synth_local_log_reset(struct synth_guest *g)
{
	int ret = lock_quiet(g);

	if (ret)
		return ret;
	synth_log_clear(g);
	pthread_mutex_unlock(&g->ctl_mu);
	return 0;
}

int synth_local_trace_flush(struct synth_guest *g)
{
	int ret = lock_quiet(g);

	if (ret)
		return ret;
	for (unsigned v = 0; v < g->nvcpus && !ret && g->trace_fd >= 0; v++)
		ret = synth_trace_flush_vcpu(&g->vcpu[v]);
	pthread_mutex_unlock(&g->ctl_mu);
	return ret;
}

static int pread_all(int fd, uint8_t *buf, uint64_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pread(fd, buf, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0) {
			memset(buf, 0, (size_t)len);
			return 0;
		}
		buf += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* Shared by the local and remote paths: a memfd read never fills holes. */
int synth_memfd_copy(int fd, uint64_t gpa, uint64_t len, void *buf)
{
	return pread_all(fd, buf, len, gpa);
}

static int anon_copy(struct synth_guest *g, uint64_t gpa, uint64_t len, uint8_t *buf)
{
	enum { CHUNK = 4096 };
	unsigned char vec[CHUNK];

	for (uint64_t done = 0; done < len;) {
		uint64_t n = (len - done) / PG_SIZE < CHUNK ? (len - done) / PG_SIZE : CHUNK;
		uint8_t *src = g->mem + gpa + done;

		/* Skip what was never populated: reading it would map the zero page. */
		if (mincore(src, n * PG_SIZE, vec)) {
			memcpy(buf + done, src, n * PG_SIZE);
		} else {
			for (uint64_t i = 0; i < n; i++) {
				if (vec[i] & 1)
					memcpy(buf + done + i * PG_SIZE, src + i * PG_SIZE, PG_SIZE);
				else
					memset(buf + done + i * PG_SIZE, 0, PG_SIZE);
			}
		}
		done += n * PG_SIZE;
	}
	return 0;
}

/* The range is checked: whole pages inside guest memory. */
int synth_local_copy_range(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf)
{
	int ret = lock_quiet(g);

	if (ret)
		return ret;
	if (g->memfd >= 0)
		ret = synth_memfd_copy(g->memfd, gpa, len, buf);
	else
		ret = anon_copy(g, gpa, len, buf);
	pthread_mutex_unlock(&g->ctl_mu);
	return ret;
}

int synth_local_get_uffd(void)
{
	/* Not UFFD_USER_MODE_ONLY: the vCPU's accesses come from user space
	 * anyway, but an engine also wants faults from process_vm_readv & co. */
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	return fd < 0 ? -errno : fd;
}

/* The range is checked, as for a copy. */
int synth_local_madvise_dontneed(struct synth_guest *g, uint64_t gpa, uint64_t len)
{
	if (len && madvise(g->mem + gpa, (size_t)len, MADV_DONTNEED))
		return -errno;
	return 0;
}
