/* SPDX-License-Identifier: MIT */
/*
 * Copy-on-access lazy save engine (include/halite/save.h).
 *
 * Arming (guest paused): each region's pages are moved aside with
 * mremap(MREMAP_DONTUNMAP) to a "shadow" mapping that keeps the
 * snapshot-instant contents, and the now empty guest range is registered
 * with userfaultfd MISSING. Cost: two syscalls per region.
 *
 * Threads:
 * - fault thread: reads first-touch faults; claims the memory block, gives it
 *   back with one UFFDIO_COPY from the shadow (which wakes the thread), and
 *   only then queues the block, tagged with the faulting thread's stream.
 *   Nothing slower than that one copy happens before the wake.
 * - background thread: claims the blocks no fault has claimed, in physical
 *   order, giving each back to the guest the same way; throttled (paper,
 *   section 6): it runs only when no fault has come for bg_idle_us, or when
 *   it falls behind bg_min_rate.
 * - compression pool: encodes queued blocks from the shadow.
 * - writer thread: retires queued blocks strictly in queue order (a reorder
 *   point after the parallel pool), so each stream's locality blocks hold its
 *   blocks in the order the guest touched them, then finishes the file.
 *
 * Claiming: each block has one claim byte, set once by whichever of the two
 * producers gets there first; only the claimer queues it, so every block is
 * saved exactly once. The shadow is never written after arming, so whichever
 * thread reads it sees the snapshot instant. A fault on a block the
 * background claimed but has not yet given back is answered from the shadow
 * too; the later copy then fails with EEXIST, which is a normal race.
 *
 * Untouched blocks: a shadow block with no page present (or swapped) was
 * never touched by the guest; it is recorded as such and, for the guest, a
 * copy from the shadow's hole gives zeros, which is what it was.
 *
 * Shadows are unmapped when the save ends: until then a block's snapshot
 * bytes stay readable (the page-table walk will need that).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <halite/save.h>

#include "endian_util.h"
#include "export.h"
#include "log_internal.h"
#include "opts.h"
#include "pool.h"
#include "stats.h"
#include "uffd.h"

#define FAULT_BATCH 64
#define HLT_PAGES_MAX 64 /* pages per memory block this engine handles */
#define PAGEMAP_PRESENT (1ull << 63)
#define PAGEMAP_SWAPPED (1ull << 62)

struct sregion {
	char *name;
	uint64_t gpa, length;
	uint8_t *host;	 /* registered with userfaultfd */
	uint8_t *shadow; /* snapshot-instant contents */
	uint64_t first_mb, nmb;
	bool registered;
};

enum item_kind { ITEM_DATA, ITEM_ZERO, ITEM_UNTOUCHED };

struct item {
	struct item *next;
	uint64_t mb;
	uint32_t stream;
	int kind;
	bool ready;	  /* encoded; under q_lock */
	uint32_t len;	  /* encoded length */
	bool compressed;
	struct halite_save *s;
	uint8_t buf[];	  /* mb_size */
};

enum { S_CREATED, S_RUNNING, S_DONE, S_FAILED };

struct halite_save {
	struct halite_save_opts o;
	char *path;
	struct halite_writer *w;
	struct sregion *regions;
	uint32_t nregions;
	uint32_t mb_size;
	int codec;
	uint64_t mb_total;
	_Atomic uint8_t *claim;

	int uffd;
	int stop_fd;	   /* eventfd: wakes the fault thread */
	int pagemap_fd;
	pthread_t fault_thr, bg_thr, writer_thr;
	bool threads_started;
	bool bg_started;
	struct halite_pool *pool;

	/* the queue: producers append, the writer retires from the head */
	pthread_mutex_t q_lock;
	pthread_cond_t q_cond;
	struct item *q_head, *q_tail;

	/* state, result, and waiting for them */
	pthread_mutex_t st_lock;
	pthread_cond_t st_cond;
	int state;
	int error;
	_Atomic bool stopping;	/* background and fault threads: wind down */
	_Atomic uint64_t last_fault_ns;

	struct halite_root *roots;
	uint32_t nroots, roots_cap;
	pthread_mutex_t roots_lock;

	/* statistics */
	uint64_t arm_start_ns, arm_ns, done_ns;
	_Atomic uint64_t n_faults, n_faults_vcpu, n_faults_other, n_bg, n_saved;
	_Atomic uint64_t n_stored, n_zero, n_untouched, raw_bytes, stored_bytes;
	struct halite_hist fault_hist;

	struct halite_logger log;
	char errmsg[256];
};

__attribute__((format(printf, 3, 4)))
static int sfail(struct halite_save *s, int err, const char *fmt, ...)
{
	char msg[sizeof(s->errmsg)];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(msg) - 8)
		snprintf(msg + n, sizeof(msg) - (size_t)n, ": %s", halite_strerror(err));
	pthread_mutex_lock(&s->st_lock);
	if (!s->errmsg[0])
		memcpy(s->errmsg, msg, sizeof(msg));
	pthread_mutex_unlock(&s->st_lock);
	halite_logf(&s->log, HALITE_LOG_ERROR, "%s", msg);
	return err < 0 ? err : -err;
}

/* The first error wins; everything winds down from there. */
static void set_failed(struct halite_save *s, int err)
{
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = err;
	}
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	eventfd_write(s->stop_fd, 1);
}

static const struct sregion *region_of_mb(const struct halite_save *s, uint64_t mb)
{
	uint32_t lo = 0, hi = s->nregions;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (s->regions[mid].first_mb <= mb)
			lo = mid;
		else
			hi = mid;
	}
	return &s->regions[lo];
}

static const struct sregion *region_of_addr(const struct halite_save *s, uint64_t addr)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		if (addr >= (uintptr_t)r->host && addr - (uintptr_t)r->host < r->length)
			return r;
	}
	return NULL;
}

static uint32_t stream_of_tid(const struct halite_save *s, uint32_t tid)
{
	for (uint32_t i = 0; i < s->o.nvcpus; i++)
		if ((uint32_t)s->o.vcpu_tids[i] == tid)
			return HALITE_STREAM(HALITE_STREAM_VCPU, i);
	return HALITE_STREAM(HALITE_STREAM_OTHER, 0);
}

/* Was any page of the shadow block ever populated (present or swapped)? */
static int shadow_touched(struct halite_save *s, const uint8_t *p, uint32_t len)
{
	uint64_t e[HLT_PAGES_MAX];
	uint32_t n = len / 4096;
	ssize_t got;

	got = pread(s->pagemap_fd, e, n * sizeof(e[0]), (off_t)((uintptr_t)p / 4096 * 8));
	if (got != (ssize_t)(n * sizeof(e[0])))
		return got < 0 ? -errno : -EIO;
	for (uint32_t i = 0; i < n; i++)
		if (e[i] & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED))
			return 1;
	return 0;
}

/*
 * Give memory block @mb back to the guest from the shadow. A block another
 * thread already gave back (EEXIST) only needs its waiters woken.
 */
static int give_back(struct halite_save *s, const struct sregion *r, uint64_t mb, bool wake)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	uint32_t len = s->mb_size;
	struct uffdio_copy c = {
		.dst = (uintptr_t)r->host + off,
		.src = (uintptr_t)r->shadow + off,
		.len = len,
		.mode = wake ? 0 : UFFDIO_COPY_MODE_DONTWAKE,
	};

	for (;;) {
		if (!ioctl(s->uffd, UFFDIO_COPY, &c))
			return 0;
		if (errno == EEXIST) {
			struct uffdio_range rg = { c.dst, len };

			return wake && ioctl(s->uffd, UFFDIO_WAKE, &rg) ? -errno : 0;
		}
		if (errno != EAGAIN)
			return -errno;
		/* EAGAIN: the mm changed under the copy, or a partial copy; retry the rest. */
		if (c.copy > 0) {
			c.dst += (uint64_t)c.copy;
			c.src += (uint64_t)c.copy;
			c.len -= (uint64_t)c.copy;
		}
		c.copy = 0;
	}
}

static void compress_task(void *arg);

/* After the wake: allocation is fine from here on. */
static int enqueue(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched)
{
	struct item *it = malloc(sizeof(*it) + s->mb_size);

	if (!it)
		return -ENOMEM;
	*it = (struct item){ .mb = mb, .stream = stream, .s = s,
			     .kind = touched ? ITEM_DATA : ITEM_UNTOUCHED,
			     .ready = !touched };
	pthread_mutex_lock(&s->q_lock);
	if (s->q_tail)
		s->q_tail->next = it;
	else
		s->q_head = it;
	s->q_tail = it;
	if (it->ready)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (touched && halite_pool_submit(s->pool, compress_task, it))
		return -ENOMEM; /* the item stays queued, never ready: the save fails */
	return 0;
}

static void compress_task(void *arg)
{
	struct item *it = arg;
	struct halite_save *s = it->s;
	const struct sregion *r = region_of_mb(s, it->mb);
	const uint8_t *src = r->shadow + (it->mb - r->first_mb) * s->mb_size;
	int n;

	if (halite_all_zero(src, s->mb_size)) {
		it->kind = ITEM_ZERO;
	} else {
		n = halite_compress(s->codec, s->o.level, src, s->mb_size, it->buf,
				    s->mb_size - 1);
		if (n > 0) {
			it->len = (uint32_t)n;
			it->compressed = true;
		} else {
			memcpy(it->buf, src, s->mb_size);
			it->len = s->mb_size;
			it->compressed = false;
		}
	}
	pthread_mutex_lock(&s->q_lock);
	it->ready = true;
	if (s->q_head == it)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
}

/* ---- fault thread ---- */

static int serve_fault(struct halite_save *s, const struct uffd_msg *m)
{
	uint64_t t0 = halite_now_ns();
	uint64_t addr = m->arg.pagefault.address;
	const struct sregion *r = region_of_addr(s, addr);
	uint32_t stream;
	uint64_t mb;
	bool won;
	int ret, touched = 0;

	if (!r)
		return sfail(s, -EFAULT, "fault at 0x%llx outside every region",
			     (unsigned long long)addr);
	mb = r->first_mb + (addr - (uintptr_t)r->host) / s->mb_size;
	won = !atomic_exchange(&s->claim[mb], 1);
	/*
	 * Before the copy: reading the shadow's hole maps the zero page there,
	 * after which the block would look touched. One pagemap read.
	 */
	if (won) {
		touched = shadow_touched(s, r->shadow + (mb - r->first_mb) * s->mb_size,
					 s->mb_size);
		if (touched < 0)
			return sfail(s, touched, "pagemap of memory block %llu",
				     (unsigned long long)mb);
	}
	ret = give_back(s, r, mb, true);
	if (ret)
		return sfail(s, ret, "giving memory block %llu back to the guest",
			     (unsigned long long)mb);
	atomic_store(&s->last_fault_ns, halite_now_ns());
	halite_hist_add(&s->fault_hist, halite_now_ns() - t0);
	atomic_fetch_add(&s->n_faults, 1);
	if (!won)
		return 0;
	stream = stream_of_tid(s, m->arg.pagefault.feat.ptid);
	atomic_fetch_add(HALITE_STREAM_KIND(stream) == HALITE_STREAM_VCPU ? &s->n_faults_vcpu
									  : &s->n_faults_other,
			 1);
	return enqueue(s, mb, stream, touched > 0);
}

static void *fault_main(void *arg)
{
	struct halite_save *s = arg;
	struct uffd_msg msgs[FAULT_BATCH];

	/*
	 * Serve faults until the ranges are unregistered, even after a failure:
	 * the abort path gives every block back and a faulting vCPU must
	 * always be woken.
	 */
	for (;;) {
		struct pollfd p[2] = { { s->uffd, POLLIN, 0 }, { s->stop_fd, POLLIN, 0 } };
		ssize_t n;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents) {
			uint64_t v;

			/* A stop request with value 2 means "exit": ranges are gone. */
			eventfd_read(s->stop_fd, &v);
			if (v >= 2)
				break;
		}
		if (!(p[0].revents & POLLIN))
			continue;
		n = read(s->uffd, msgs, sizeof(msgs));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			set_failed(s, sfail(s, -errno, "reading userfaultfd"));
			break;
		}
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msgs[0]); i++) {
			int ret;

			if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			ret = serve_fault(s, &msgs[i]);
			if (ret)
				set_failed(s, ret);
		}
	}
	return NULL;
}

/* ---- background thread ---- */

static void bg_throttle(struct halite_save *s, uint64_t start_ns, uint64_t saved_bytes)
{
	uint64_t idle_ns = (uint64_t)s->o.bg_idle_us * 1000;

	while (!atomic_load(&s->stopping)) {
		uint64_t now = halite_now_ns();
		uint64_t since_fault = now - atomic_load(&s->last_fault_ns);
		/* The rate floor: bytes this thread should have saved by now. */
		uint64_t owed = (now - start_ns) / 1000 * (s->o.bg_min_rate / 1000) / 1000;
		struct timespec ts = { 0, 200000 };

		if (since_fault >= idle_ns || saved_bytes < owed)
			return;
		nanosleep(&ts, NULL);
	}
}

static void *bg_main(void *arg)
{
	struct halite_save *s = arg;
	uint64_t start = halite_now_ns(), saved = 0;

	for (uint32_t i = 0; i < s->nregions && !atomic_load(&s->stopping); i++) {
		const struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; mb < r->first_mb + r->nmb; mb++) {
			int ret, touched;

			if (atomic_load(&s->claim[mb]))
				continue;
			bg_throttle(s, start, saved);
			if (atomic_load(&s->stopping))
				break;
			if (atomic_exchange(&s->claim[mb], 1))
				continue;
			touched = shadow_touched(s, r->shadow + (mb - r->first_mb) * s->mb_size,
						 s->mb_size);
			ret = touched < 0 ? touched : 0;
			/* An untouched block stays a hole until the guest wants it. */
			if (touched > 0)
				ret = give_back(s, r, mb, false);
			if (!ret)
				ret = enqueue(s, mb, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0),
					      touched > 0);
			if (ret) {
				set_failed(s, sfail(s, ret, "background save of memory block %llu",
						    (unsigned long long)mb));
				return NULL;
			}
			atomic_fetch_add(&s->n_bg, 1);
			saved += s->mb_size;
		}
	}
	return NULL;
}

/* ---- writer thread ---- */

static int retire(struct halite_save *s, struct item *it)
{
	int ret = 0;

	switch (it->kind) {
	case ITEM_UNTOUCHED:
		atomic_fetch_add(&s->n_untouched, 1);
		break;
	case ITEM_ZERO:
		ret = halite_writer_put_zero(s->w, it->mb);
		atomic_fetch_add(&s->n_zero, 1);
		break;
	default:
		ret = halite_writer_put_encoded(s->w, it->stream, it->mb, it->buf, it->len,
						it->compressed);
		atomic_fetch_add(&s->n_stored, 1);
		atomic_fetch_add(&s->raw_bytes, s->mb_size);
		atomic_fetch_add(&s->stored_bytes, it->len);
		break;
	}
	if (ret)
		return sfail(s, ret, "saving memory block %llu: %s", (unsigned long long)it->mb,
			     halite_writer_errmsg(s->w));
	atomic_fetch_add(&s->n_saved, 1);
	return 0;
}

static int finish_file(struct halite_save *s)
{
	struct halite_save_stats st;
	int ret = 0;

	halite_save_stats(s, &st);
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots && !ret; i++)
		ret = halite_writer_add_root(s->w, &s->roots[i]);
	pthread_mutex_unlock(&s->roots_lock);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "arm_ns", st.arm_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults", st.faults);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_vcpu", st.faults_vcpu);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_other", st.faults_other);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "mb_background", st.mb_background);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p50_ns", st.fault_p50_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p99_ns", st.fault_p99_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "duration_ns", halite_now_ns() - s->arm_start_ns);
	if (!ret)
		ret = halite_writer_finish(s->w);
	if (ret)
		return sfail(s, ret, "finishing %s: %s", s->path, halite_writer_errmsg(s->w));
	return 0;
}

static void *writer_main(void *arg)
{
	struct halite_save *s = arg;
	int ret = 0;

	while (atomic_load(&s->n_saved) < s->mb_total) {
		struct item *it;

		pthread_mutex_lock(&s->q_lock);
		while (!atomic_load(&s->stopping) && !(s->q_head && s->q_head->ready))
			pthread_cond_wait(&s->q_cond, &s->q_lock);
		if (atomic_load(&s->stopping)) {
			pthread_mutex_unlock(&s->q_lock);
			return NULL;
		}
		it = s->q_head;
		s->q_head = it->next;
		if (!s->q_head)
			s->q_tail = NULL;
		pthread_mutex_unlock(&s->q_lock);
		ret = retire(s, it);
		free(it);
		if (ret) {
			set_failed(s, ret);
			return NULL;
		}
	}
	ret = finish_file(s);
	pthread_mutex_lock(&s->st_lock);
	if (ret && s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = ret;
	} else if (!ret && s->state == S_RUNNING) {
		s->state = S_DONE;
	}
	s->done_ns = halite_now_ns();
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	if (ret)
		set_failed(s, ret);
	atomic_store(&s->stopping, true);
	return NULL;
}

/* ---- create, arm, wait, teardown ---- */

HALITE_EXPORT int halite_save_create(struct halite_save **sp, const char *path,
				     const struct halite_save_region *regions, uint32_t nregions,
				     const struct halite_save_opts *opts)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region *wr = NULL;
	struct halite_save *s;
	uint64_t missing = 0;
	int ret;

	if (!sp || !path || !regions || !nregions)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->uffd = s->stop_fd = s->pagemap_fd = -1;
	pthread_mutex_init(&s->q_lock, NULL);
	pthread_cond_init(&s->q_cond, NULL);
	pthread_mutex_init(&s->st_lock, NULL);
	pthread_cond_init(&s->st_cond, NULL);
	pthread_mutex_init(&s->roots_lock, NULL);
	halite_hist_init(&s->fault_hist);
	ret = halite_opts_copy(&s->o, sizeof(s->o), opts);
	if (ret || (s->o.flags & ~HALITE_SAVE_FLAGS_ALL) || (s->o.nvcpus && !s->o.vcpu_tids)) {
		ret = -EINVAL;
		goto err;
	}
	s->log = (struct halite_logger){ s->o.log, s->o.log_ctx, s->o.log_level };
	if (!s->o.bg_idle_us)
		s->o.bg_idle_us = 2000;
	if (!s->o.bg_min_rate)
		s->o.bg_min_rate = 64ull << 20;
	if (s->o.nvcpus) {
		pid_t *t = malloc(s->o.nvcpus * sizeof(*t));

		if (!t) {
			ret = -ENOMEM;
			goto err;
		}
		memcpy(t, s->o.vcpu_tids, s->o.nvcpus * sizeof(*t));
		s->o.vcpu_tids = t;
	}
	s->path = strdup(path);
	s->regions = calloc(nregions, sizeof(*s->regions));
	wr = calloc(nregions, sizeof(*wr));
	if (!s->path || !s->regions || !wr) {
		ret = -ENOMEM;
		goto err;
	}
	s->nregions = nregions;
	for (uint32_t i = 0; i < nregions; i++) {
		wr[i] = (struct halite_region){ regions[i].name, regions[i].gpa, regions[i].length };
		s->regions[i].name = strdup(regions[i].name ? regions[i].name : "");
		s->regions[i].gpa = regions[i].gpa;
		s->regions[i].length = regions[i].length;
		s->regions[i].host = regions[i].host;
		if (!s->regions[i].name) {
			ret = -ENOMEM;
			goto err;
		}
	}
	wo.codec = s->o.codec;
	wo.level = s->o.level;
	wo.mb_pages = s->o.mb_pages;
	wo.lb_size = s->o.lb_size;
	wo.vcpu_count = s->o.nvcpus;
	wo.flags = (s->o.flags & HALITE_SAVE_NO_SYNC) ? HALITE_WRITER_NO_SYNC : 0;
	wo.log = s->o.log;
	wo.log_ctx = s->o.log_ctx;
	wo.log_level = s->o.log_level;
	ret = halite_writer_create(&s->w, path, wr, nregions, &wo);
	if (ret)
		goto err;
	s->mb_size = halite_writer_mb_size(s->w);
	s->codec = s->o.codec ? s->o.codec : HALITE_CODEC_LZ4;
	s->mb_total = halite_writer_mb_count(s->w);
	for (uint32_t i = 0; i < nregions; i++) {
		struct sregion *r = &s->regions[i];

		/* Blocks are given back whole: regions must hold whole blocks. */
		if (r->length % s->mb_size || (uintptr_t)r->host % 4096) {
			ret = sfail(s, -EINVAL, "region '%s': length %llu not a multiple of the "
				    "memory-block size %u, or host address not page aligned",
				    r->name, (unsigned long long)r->length, s->mb_size);
			goto err;
		}
		r->first_mb = i ? s->regions[i - 1].first_mb + s->regions[i - 1].nmb : 0;
		r->nmb = r->length / s->mb_size;
	}
	if (s->mb_size / 4096 > HLT_PAGES_MAX) {
		ret = sfail(s, -EINVAL, "memory blocks of more than %u pages", HLT_PAGES_MAX);
		goto err;
	}
	s->claim = calloc(s->mb_total, 1);
	if (!s->claim) {
		ret = -ENOMEM;
		goto err;
	}
	s->uffd = halite_uffd_open(UFFD_FEATURE_THREAD_ID, &missing);
	if (s->uffd < 0) {
		char names[128];

		ret = sfail(s, s->uffd, "userfaultfd%s%s",
			    missing ? " lacks " : "",
			    missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
		goto err;
	}
	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (s->stop_fd < 0 || s->pagemap_fd < 0) {
		ret = sfail(s, -errno, "eventfd or /proc/self/pagemap");
		goto err;
	}
	ret = halite_pool_create(&s->pool, s->o.workers, "halite-save");
	if (ret)
		goto err;
	free(wr);
	*sp = s;
	return 0;
err:
	free(wr);
	halite_save_free(s);
	return ret;
}

HALITE_EXPORT int halite_save_add_root(struct halite_save *s, const struct halite_root *root)
{
	int ret = 0;

	if (root->mode != HALITE_PAGING_4LEVEL && root->mode != HALITE_PAGING_5LEVEL)
		return -EINVAL;
	if (root->vcpu >= s->o.nvcpus && root->vcpu != HALITE_VCPU_UNKNOWN)
		return -EINVAL;
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots; i++)
		if (s->roots[i].cr3 == root->cr3 && s->roots[i].vcpu == root->vcpu)
			goto out; /* seen before: sampling repeats itself */
	if (s->nroots == s->roots_cap) {
		uint32_t cap = s->roots_cap ? 2 * s->roots_cap : 16;
		void *p = realloc(s->roots, cap * sizeof(*s->roots));

		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
		s->roots = p;
		s->roots_cap = cap;
	}
	s->roots[s->nroots++] = *root;
out:
	pthread_mutex_unlock(&s->roots_lock);
	return ret;
}

HALITE_EXPORT int halite_save_set_device_state(struct halite_save *s, const void *data,
					       uint64_t len)
{
	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	return halite_writer_set_device_state(s->w, data, len);
}

/* Undo arming of regions [0, n): their pages go back where they were. */
static void disarm_regions(struct halite_save *s, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct sregion *r = &s->regions[i];

		if (r->registered) {
			struct uffdio_range rg = { (uintptr_t)r->host, r->length };

			ioctl(s->uffd, UFFDIO_UNREGISTER, &rg);
			r->registered = false;
		}
		if (r->shadow) {
			/* Nothing was touched yet: move the pages straight back. */
			mremap(r->shadow, r->length, r->length, MREMAP_MAYMOVE | MREMAP_FIXED,
			       r->host);
			r->shadow = NULL;
		}
	}
}

HALITE_EXPORT int halite_save_arm(struct halite_save *s)
{
	int ret = 0;
	uint32_t i;

	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	s->arm_start_ns = halite_now_ns();
	for (i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];
		struct uffdio_register reg = {
			.range = { (uintptr_t)r->host, r->length },
			.mode = UFFDIO_REGISTER_MODE_MISSING,
		};
		void *sh = mremap(r->host, r->length, r->length,
				  MREMAP_MAYMOVE | MREMAP_DONTUNMAP);

		if (sh == MAP_FAILED) {
			ret = sfail(s, -errno, "region '%s': mremap(MREMAP_DONTUNMAP) (private "
				    "anonymous memory in one mapping is required)", r->name);
			break;
		}
		r->shadow = sh;
		if (ioctl(s->uffd, UFFDIO_REGISTER, &reg)) {
			ret = sfail(s, -errno, "region '%s': UFFDIO_REGISTER", r->name);
			i++;
			break;
		}
		r->registered = true;
		if (!(reg.ioctls & (1ull << _UFFDIO_COPY))) {
			ret = sfail(s, -HALITE_E_UNSUPPORTED, "region '%s': no UFFDIO_COPY", r->name);
			i++;
			break;
		}
	}
	if (ret) {
		disarm_regions(s, i);
		return ret;
	}
	s->arm_ns = halite_now_ns() - s->arm_start_ns;
	atomic_store(&s->last_fault_ns, halite_now_ns());
	s->state = S_RUNNING;
	ret = pthread_create(&s->fault_thr, NULL, fault_main, s);
	if (!ret) {
		ret = pthread_create(&s->writer_thr, NULL, writer_main, s);
		if (ret) {
			eventfd_write(s->stop_fd, 2);
			pthread_join(s->fault_thr, NULL);
		}
	}
	if (ret) {
		disarm_regions(s, s->nregions);
		s->state = S_CREATED;
		return sfail(s, -ret, "starting threads");
	}
	s->threads_started = true;
	if (!(s->o.flags & HALITE_SAVE_NO_BACKGROUND)) {
		ret = pthread_create(&s->bg_thr, NULL, bg_main, s);
		if (ret) {
			set_failed(s, sfail(s, -ret, "starting the background thread"));
			return halite_save_wait(s, -1);
		}
		s->bg_started = true;
	}
	return 0;
}

/*
 * The end, success or failure: make every block the guest's again, then drop
 * the registration and the shadows. On failure the file is left incomplete.
 */
static int teardown(struct halite_save *s)
{
	int ret = 0;

	if (!s->threads_started)
		return 0;
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (s->bg_started)
		pthread_join(s->bg_thr, NULL);
	s->bg_started = false;
	pthread_join(s->writer_thr, NULL);
	halite_pool_wait(s->pool);
	/*
	 * Every block that has snapshot bytes in the shadow and is not yet the
	 * guest's goes back now, claimed or not: after a failure this is what
	 * leaves the guest's memory exactly as without the save. The fault
	 * thread keeps serving meanwhile.
	 */
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; mb < r->first_mb + r->nmb && r->shadow; mb++) {
			int t = shadow_touched(s, r->shadow + (mb - r->first_mb) * s->mb_size,
					       s->mb_size);
			int e = t > 0 ? give_back(s, r, mb, true) : t;

			if (e && !ret)
				ret = sfail(s, e, "giving memory block %llu back at teardown",
					    (unsigned long long)mb);
		}
	}
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];
		struct uffdio_range rg = { (uintptr_t)r->host, r->length };

		if (r->registered && ioctl(s->uffd, UFFDIO_UNREGISTER, &rg) && !ret)
			ret = sfail(s, -errno, "region '%s': UFFDIO_UNREGISTER", r->name);
		r->registered = false;
	}
	eventfd_write(s->stop_fd, 2);
	pthread_join(s->fault_thr, NULL);
	for (uint32_t i = 0; i < s->nregions; i++) {
		if (s->regions[i].shadow)
			munmap(s->regions[i].shadow, s->regions[i].length);
		s->regions[i].shadow = NULL;
	}
	s->threads_started = false;
	return ret;
}

HALITE_EXPORT int halite_save_wait(struct halite_save *s, int timeout_ms)
{
	struct timespec dl;
	int ret = 0, state;

	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (dl.tv_nsec >= 1000000000) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_CREATED) {
		pthread_mutex_unlock(&s->st_lock);
		return -HALITE_E_STATE;
	}
	while (s->state == S_RUNNING && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&s->st_cond, &s->st_lock)
				     : pthread_cond_timedwait(&s->st_cond, &s->st_lock, &dl);
	state = s->state;
	pthread_mutex_unlock(&s->st_lock);
	if (state == S_RUNNING)
		return -ETIMEDOUT;
	ret = teardown(s);
	if (state == S_FAILED)
		return s->error;
	return ret;
}

HALITE_EXPORT int halite_save_cancel(struct halite_save *s)
{
	if (s->state == S_CREATED)
		return -HALITE_E_STATE;
	set_failed(s, sfail(s, -ECANCELED, "save cancelled"));
	return halite_save_wait(s, -1);
}

HALITE_EXPORT void halite_save_stats(struct halite_save *s, struct halite_save_stats *st)
{
	pthread_mutex_lock(&s->st_lock);
	*st = (struct halite_save_stats){
		.arm_ns = s->arm_ns,
		.duration_ns = s->done_ns ? s->done_ns - s->arm_start_ns
			       : s->arm_start_ns ? halite_now_ns() - s->arm_start_ns : 0,
		.mb_total = s->mb_total,
		.done = s->state == S_DONE,
		.error = s->state == S_FAILED ? s->error : 0,
	};
	pthread_mutex_unlock(&s->st_lock);
	st->mb_saved = atomic_load(&s->n_saved);
	st->mb_stored = atomic_load(&s->n_stored);
	st->mb_zero = atomic_load(&s->n_zero);
	st->mb_untouched = atomic_load(&s->n_untouched);
	st->faults = atomic_load(&s->n_faults);
	st->faults_vcpu = atomic_load(&s->n_faults_vcpu);
	st->faults_other = atomic_load(&s->n_faults_other);
	st->mb_background = atomic_load(&s->n_bg);
	st->raw_bytes = atomic_load(&s->raw_bytes);
	st->stored_bytes = atomic_load(&s->stored_bytes);
	/* Quantiles of a histogram other threads add to are approximate until done. */
	st->fault_p50_ns = halite_hist_quantile(&s->fault_hist, 0.5);
	st->fault_p99_ns = halite_hist_quantile(&s->fault_hist, 0.99);
}

HALITE_EXPORT void halite_save_free(struct halite_save *s)
{
	struct item *it;

	if (!s)
		return;
	if (s->threads_started) {
		if (s->state == S_RUNNING)
			set_failed(s, sfail(s, -ECANCELED, "save freed while running"));
		teardown(s);
	}
	halite_pool_free(s->pool);
	while ((it = s->q_head)) {
		s->q_head = it->next;
		free(it);
	}
	if (s->w)
		halite_writer_free(s->w, s->state != S_DONE &&
					 !(s->o.flags & HALITE_SAVE_KEEP_INCOMPLETE));
	for (uint32_t i = 0; s->regions && i < s->nregions; i++)
		free(s->regions[i].name);
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	if (s->pagemap_fd >= 0)
		close(s->pagemap_fd);
	free((void *)s->o.vcpu_tids);
	free(s->regions);
	free((void *)s->claim);
	free(s->roots);
	free(s->path);
	pthread_mutex_destroy(&s->q_lock);
	pthread_cond_destroy(&s->q_cond);
	pthread_mutex_destroy(&s->st_lock);
	pthread_cond_destroy(&s->st_cond);
	pthread_mutex_destroy(&s->roots_lock);
	free(s);
}

HALITE_EXPORT const char *halite_save_errmsg(const struct halite_save *s)
{
	return s->errmsg;
}
