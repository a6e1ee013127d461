/* SPDX-License-Identifier: MIT */
/*
 * halite-bench micro: the paper's microbenchmark (section 8.1) on the
 * synthetic guest, and the restore peers of issue 5 beside it.
 *
 * 1. Source. A guest (4 vCPUs, 16-page stride, a quarter of memory mapped
 *    and accessed, data compressing to --compress percent, each vCPU
 *    sequentially over its own region, --write-pct of accesses writing)
 *    runs max_accesses = --passes laps over its working set per vCPU. When
 *    the slowest vCPU is half-way it is paused: the snapshot instant. Each
 *    vCPU's position is recorded (also stored in the file as device state),
 *    a ground-truth copy of memory is taken (not timed), halite_save is
 *    armed and the guest resumed; the save completes while the guest runs
 *    on, so the vCPU streams hold the order in which it touched memory
 *    after the snapshot.
 * 2. relayout (relayout.h): random, physical and locality files, the raw
 *    image and the working-set file, from that one saved file (halite.hlt
 *    is the saved file). raw.img is compared with the ground truth.
 * 3. Baseline: a fresh guest with the same options (memory filled at
 *    creation: nothing to restore), vCPUs seeked to the snapshot positions,
 *    timed from start to all vCPUs done; the median of --baseline-runs.
 * 4. For every storage condition (--cache x --latency) and every
 *    organisation and peer: method_prepare (bench/peers.h), a guest attached
 *    to the method's memory (SYNTH_F_ATTACH, mem_host), vCPUs seeked, then
 *    t0, method_start, synth_start, first access (any vCPU's counter past
 *    its seek position), all done: run_s from t0, restore_overhead_s =
 *    run_s - baseline_s. Then method_finish for the counts.
 * 5. VM access %: one more run per organisation with
 *    HALITE_RESTORE_TRACK_ACCESS (warm cache, --track-latency), its
 *    percentage reported on that organisation's rows.
 *
 * Correctness, never timing: every run's vCPUs must have 0 failed
 * translations (page tables restored right), and the first run of each
 * method compares guest memory with the snapshot: pages the restored guest
 * cannot have written must be equal byte for byte; in its working set every
 * 64-bit word must be the snapshot's plus k * SYNTH_WRITE_ADD with k no more
 * than the guest's visits to that word since the snapshot (sequential
 * pattern: lap L writes only word L mod 512 of each page). For 4k-on-demand
 * and working-set, which never bring in what the guest did not touch, only
 * the page tables and touched working-set pages are compared.
 *
 * Output: a table on stdout, or with --json one JSON object; progress on
 * stderr. Never asserts timings. Exit 0 when every run completed and every
 * check passed, 1 otherwise, 2 usage, 77 without userfaultfd.
 *
 * A run whose guest does not finish (a method that failed with vCPUs
 * blocked in userfaultfd faults) cannot be cleaned up in-process: the bench
 * prints what it has and exits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "bench_util.h"
#include "cli.h"
#include "clones.h"
#include "fault.h"
#include "peers.h"
#include "relayout.h"
#include "stats.h"
#include "synth.h"
#include "trace_file.h"
#include "uffd.h"

#define PROG "halite-bench"
/* The prefix of what micro says on stderr (docs/cli.md). */
#define ME PROG ": micro"
#define MIB ((uint64_t)1 << 20)
#define MAX_LAT 8
#define NAMES 8
#define WORDS_PER_PAGE (SYNTH_PAGE_SIZE / 8u)

/* The eight rows of Figure 2: four organisations of one file, four peers. */
static const struct mdef {
	const char *name;
	bool org;
	int method;	/* enum method_kind */
	int layout;	/* enum relayout_org, organisations only */
} defs[NAMES] = {
	{ "random", true, METHOD_HALITE, ORG_RANDOM },
	{ "physical", true, METHOD_HALITE, ORG_PHYSICAL },
	{ "locality", true, METHOD_HALITE, ORG_LOCALITY },
	{ "halite", true, METHOD_HALITE, ORG_HALITE },
	{ "eager", false, METHOD_EAGER, -1 },
	{ "4k-on-demand", false, METHOD_4K, -1 },
	{ "mmap-private", false, METHOD_MMAP, -1 },
	{ "working-set", false, METHOD_WS, -1 },
};

struct params {
	uint64_t mem_mib;
	unsigned vcpus;
	unsigned compress_pct;
	unsigned write_pct;
	unsigned zero_pct, untouched_pct;
	uint64_t passes;
	unsigned baseline_runs;
	int codec;
	bool cache[2];			/* [0] warm, [1] cold */
	bool cache_cold_first;
	uint32_t lat[MAX_LAT];
	unsigned nlat;
	uint32_t track_lat;
	bool track;
	bool no_readahead;		/* the engine's stream readahead off (ablation) */
	unsigned selected;		/* bit per defs[] entry */
	const char *dir;
	const char *trace;		/* --trace: a recorded workload instead of seq */
	bool keep, json, quick;
	uint64_t seed;
	unsigned timeout_s;
};

enum content { CONTENT_NONE, CONTENT_EXACT, CONTENT_MISMATCH };

struct run {
	const struct mdef *d;
	bool cold, track;
	uint32_t lat;
	bool ok;
	char err[160];
	double run_s, first_s;		/* first_s < 0: not seen */
	struct method_result mr;
	uint64_t xlate_faults;
	enum content content;
	uint64_t pages_checked, pages_wrong;
};

struct bench {
	struct params p;
	char *work, *fuse_dir, *src;
	uint64_t mem_bytes, ws_units, max_accesses, nframes;
	/* --trace: the file's counts; per (vCPU, unit) visited after the snapshot,
	 * per (vCPU, unit, word) writes after it */
	struct trace_info ti;
	uint8_t *tvisit;
	uint32_t *twrites;
	/* the snapshot: when each vCPU is past half[v], where each was */
	uint64_t half[SYNTH_MAX_VCPUS];
	uint64_t pos[SYNTH_MAX_VCPUS];
	uint8_t *snap;
	uint8_t *fcls;			/* per frame: FC_* */
	uint8_t *fvcpu;			/* working-set frames: vCPU */
	uint32_t *funit;		/* working-set frames: unit */
	uint8_t *ftouched;		/* the restored guest reads or writes this frame */
	struct halite_save_stats save;
	double save_arm_s;		/* halite_save_arm() */
	enum content save_content;
	struct relayout_out rl;
	bool relaid;
	bool printed;		/* --json: the results are out */
	double baseline[16];
	unsigned nbaseline;
	double baseline_s;
	struct run *runs, *tracks;
	size_t nruns, ntracks;
	double t_start;
	char err[256];
};

enum { FC_OTHER, FC_PT, FC_WS };

/* --- small helpers --- */

static void sleep_us(unsigned us)
{
	struct timespec ts = { us / 1000000u, (long)(us % 1000000u) * 1000l };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void progress(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, ME ": [%5.1f s] ", halite_now_s() - b->t_start);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void set_err(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	if (b->err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	fprintf(stderr, ME ": %s\n", b->err);
}

static double median(double *v, unsigned n)
{
	for (unsigned i = 1; i < n; i++)
		for (unsigned j = i; j && v[j - 1] > v[j]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : NAN;
}

/* --- the guest --- */

static void guest_opts(const struct bench *b, struct synth_opts *so, void *attach_mem)
{
	const struct params *p = &b->p;

	/* All that shapes memory and the access sequence is the same for every guest. */
	*so = (struct synth_opts){
		.sz = sizeof(*so), .mem_bytes = b->mem_bytes, .nvcpus = p->vcpus, .stride = 16,
		.map_bytes = b->ws_units * SYNTH_PAGE_SIZE,
		.ws_bytes = b->ws_units * SYNTH_PAGE_SIZE,
		.compress_pct = p->compress_pct, .zero_pct = p->zero_pct,
		.untouched_pct = p->untouched_pct, .write_pct = p->write_pct,
		.pattern = p->trace ? SYNTH_PAT_TRACE : SYNTH_PAT_SEQ, .trace_in = p->trace,
		.backing = SYNTH_MEM_ANON, .seed = p->seed,
		.max_accesses = b->max_accesses, .log_fn = halite_log_stderr,
		.flags = attach_mem ? SYNTH_F_ATTACH : 0, .mem_host = attach_mem,
	};
}

static int create_guest(struct bench *b, void *attach_mem, struct synth_guest **g)
{
	struct synth_opts so;
	int ret;

	guest_opts(b, &so, attach_mem);
	ret = synth_create(g, &so);
	if (ret)
		set_err(b, "synth_create%s: %s", attach_mem ? " (attached)" : "", strerror(-ret));
	return ret;
}

static int seek_all(struct bench *b, struct synth_guest *g)
{
	for (unsigned v = 0; v < b->p.vcpus; v++) {
		int ret = synth_vcpu_seek(g, v, b->pos[v]);

		if (ret) {
			set_err(b, "synth_vcpu_seek: %s", strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/* Every vCPU past its half-way mark (or any done): the snapshot instant. */
static bool past_half(const struct bench *b, struct synth_guest *g)
{
	bool all = true;

	for (unsigned v = 0; v < b->p.vcpus; v++) {
		struct synth_vcpu_stats st;

		if (synth_vcpu_stats(g, v, &st))
			continue;
		if (st.done)
			return true;
		all &= st.accesses >= b->half[v];
	}
	return all;
}

/* --- 1. the source guest and its lazy save --- */

/*
 * seq: laps [*l0, *l1] in which @vcpu visited @unit after the snapshot;
 * false if none. trace: whether it did (*l0, *l1 unset).
 */
static bool unit_laps(const struct bench *b, unsigned vcpu, uint64_t unit, uint64_t *l0,
		      uint64_t *l1)
{
	uint64_t s = b->pos[vcpu], m = b->max_accesses, w = b->ws_units;

	if (b->p.trace)
		return b->tvisit[(uint64_t)vcpu * w + unit];
	/* Accesses i = L * w + unit with s <= i < m. */
	if (m <= unit || m <= s)
		return false;
	*l0 = s > unit ? (s - unit + w - 1) / w : 0;
	*l1 = (m - 1 - unit) / w;
	return *l0 <= *l1;
}

static void after_one(void *ctx, unsigned vcpu, uint64_t rec, uint64_t unit, unsigned word,
		      int write)
{
	struct bench *b = ctx;
	uint64_t u = (uint64_t)vcpu * b->ws_units + unit;

	if (rec < b->pos[vcpu])
		return;
	b->tvisit[u] = 1;
	b->twrites[u * WORDS_PER_PAGE + word] += write != 0;
}

/* --trace: what the restored guest will visit and write, from the snapshot positions on. */
static int trace_after_snapshot(struct bench *b)
{
	uint64_t units = (uint64_t)b->p.vcpus * b->ws_units;
	int ret;

	b->tvisit = calloc(units, 1);
	b->twrites = calloc(units * WORDS_PER_PAGE, sizeof(*b->twrites));
	if (!b->tvisit || !b->twrites) {
		set_err(b, "out of memory for the trace's write counts");
		return -ENOMEM;
	}
	ret = trace_file_each(b->p.trace, after_one, b);
	if (ret)
		set_err(b, "reading the trace %s again: %s", b->p.trace, strerror(-ret));
	return ret;
}

#define PTE_PRESENT 0x1ull
#define PTE_PS 0x80ull
#define PTE_ADDR 0x000ffffffffff000ull

/*
 * The frames the restored guest touches: the working-set pages it visits
 * after the snapshot and the page-table pages its walks to them read (the
 * tables as they were at the snapshot, from the ground-truth copy).
 */
static int mark_touched(struct bench *b, struct synth_guest *g)
{
	uint64_t *va = calloc(b->ws_units, sizeof(*va));
	int ret = 0;

	b->ftouched = calloc(b->nframes, 1);
	if (!va || !b->ftouched) {
		free(va);
		set_err(b, "out of memory for the frame map");
		return -ENOMEM;
	}
	for (unsigned v = 0; v < b->p.vcpus && !ret; v++) {
		struct synth_vcpu_info vi;
		int n;

		ret = synth_vcpu_info(g, v, &vi);
		n = ret ? ret : synth_vcpu_pages(g, v, 0, va, NULL, b->ws_units);
		if (n != (int)b->ws_units) {
			set_err(b, "synth_vcpu_pages: %d of %" PRIu64, n, b->ws_units);
			ret = n < 0 ? n : -EIO;
			break;
		}
		for (uint64_t u = 0; u < b->ws_units; u++) {
			uint64_t l0, l1, t = vi.cr3 & PTE_ADDR;

			if (!unit_laps(b, v, u, &l0, &l1))
				continue;
			for (unsigned lvl = vi.paging_levels; lvl >= 1; lvl--) {
				uint64_t e, idx;

				if (t / SYNTH_PAGE_SIZE >= b->nframes)
					break;
				b->ftouched[t / SYNTH_PAGE_SIZE] = 1;
				if (lvl == 1)
					break;
				idx = (va[u] >> (12 + 9 * (lvl - 1))) & 511;
				memcpy(&e, b->snap + t + idx * 8, 8);
				if (!(e & PTE_PRESENT) || (e & PTE_PS))
					break;
				t = e & PTE_ADDR;
			}
		}
	}
	for (uint64_t f = 0; f < b->nframes; f++) {
		uint64_t l0, l1;

		if (b->fcls[f] == FC_WS && unit_laps(b, b->fvcpu[f], b->funit[f], &l0, &l1))
			b->ftouched[f] = 1;
	}
	free(va);
	return ret;
}

/* Which frames the restored guest touches, and how: page tables, working set, the rest. */
static int classify_frames(struct bench *b, struct synth_guest *g)
{
	uint64_t *gpa = calloc(b->ws_units, sizeof(*gpa));
	uint8_t *kinds = malloc(b->nframes);
	int ret = 0;

	b->fcls = calloc(b->nframes, 1);
	b->fvcpu = calloc(b->nframes, 1);
	b->funit = calloc(b->nframes, sizeof(*b->funit));
	if (!gpa || !kinds || !b->fcls || !b->fvcpu || !b->funit) {
		ret = -ENOMEM;
		set_err(b, "out of memory for the frame map");
		goto out;
	}
	ret = synth_frame_kinds(g, 0, kinds, b->nframes);
	if (ret != (int)b->nframes) {
		set_err(b, "synth_frame_kinds: %d", ret);
		ret = ret < 0 ? ret : -EIO;
		goto out;
	}
	ret = 0;
	for (uint64_t f = 0; f < b->nframes; f++)
		b->fcls[f] = (kinds[f] & 0x7f) == SYNTH_FRAME_PT ? FC_PT : FC_OTHER;
	for (unsigned v = 0; v < b->p.vcpus && !ret; v++) {
		int n = synth_vcpu_pages(g, v, 0, NULL, gpa, b->ws_units);

		if (n != (int)b->ws_units) {
			set_err(b, "synth_vcpu_pages: %d of %" PRIu64, n, b->ws_units);
			ret = n < 0 ? n : -EIO;
			break;
		}
		for (uint64_t u = 0; u < b->ws_units; u++) {
			uint64_t f = gpa[u] / SYNTH_PAGE_SIZE;

			if (f >= b->nframes)
				continue;
			b->fcls[f] = FC_WS;
			b->fvcpu[f] = (uint8_t)v;
			b->funit[f] = (uint32_t)u;
		}
	}
	if (!ret)
		ret = mark_touched(b, g);
out:
	free(gpa);
	free(kinds);
	return ret;
}

static int run_source(struct bench *b)
{
	struct synth_guest *g = NULL;
	struct halite_save *s = NULL;
	struct synth_info info;
	pid_t tids[SYNTH_MAX_VCPUS];
	uint8_t devstate[8 * SYNTH_MAX_VCPUS];
	uint64_t t0;
	double tw;
	int ret;

	progress(b, "source guest: %" PRIu64 " MiB, %u vCPUs, %" PRIu64 " accesses per vCPU%s",
		 b->mem_bytes / MIB, b->p.vcpus, b->max_accesses ? b->max_accesses : b->ti.records,
		 b->p.trace ? " (the trace's, over all vCPUs)" : "");
	ret = create_guest(b, NULL, &g);
	if (ret)
		return ret;
	synth_info(g, &info);
	b->snap = malloc(b->mem_bytes);
	if (!b->snap) {
		ret = -ENOMEM;
		set_err(b, "no memory for the ground-truth copy");
		goto out;
	}
	{
		HALITE_OPTS(halite_save_opts, o);
		struct halite_save_region reg = {
			.name = SYNTH_REGION_NAME, .gpa = info.gpa_base, .length = info.mem_bytes,
			.host = (uintptr_t)info.host_addr, .kind = HALITE_MEM_ANON, .fd = -1,
		};

		for (unsigned v = 0; v < b->p.vcpus; v++) {
			struct synth_vcpu_info vi;

			synth_vcpu_info(g, v, &vi);
			tids[v] = vi.tid;
		}
		o.codec = b->p.codec;
		o.vcpu_tids = tids;
		o.nvcpus = b->p.vcpus;
		o.log = halite_log_stderr;
		o.log_level = HALITE_LOG_WARN;
		ret = halite_save_create(&s, b->src, &reg, 1, &o);
		if (ret) {
			set_err(b, "halite_save_create %s: %s", b->src, halite_strerror(ret));
			goto out;
		}
	}
	for (unsigned v = 0; v < b->p.vcpus; v++) {
		struct synth_vcpu_info vi;
		struct halite_root root;

		synth_vcpu_info(g, v, &vi);
		root = (struct halite_root){ v, vi.paging_levels, vi.cr3 };
		ret = halite_save_add_root(s, &root);
		if (ret) {
			set_err(b, "halite_save_add_root: %s", halite_strerror(ret));
			goto out;
		}
	}

	/*
	 * A trace may last a millisecond: each vCPU is stopped at its exact
	 * midpoint (and let go on after the pause) rather than watched.
	 */
	for (unsigned v = 0; b->p.trace && !ret && v < b->p.vcpus; v++)
		ret = synth_vcpu_limit(g, v, b->half[v]);
	ret = ret ? ret : synth_start(g);
	if (ret) {
		set_err(b, "synth_start: %s", strerror(-ret));
		goto out;
	}
	/* The snapshot instant: the slowest vCPU half-way through its run. */
	tw = halite_now_s();
	if (b->p.trace)
		synth_wait_done(g, b->p.timeout_s * 1000u);
	while (!b->p.trace && !past_half(b, g) && halite_now_s() - tw < b->p.timeout_s)
		sleep_us(100);
	ret = synth_pause(g);
	if (ret) {
		set_err(b, "synth_pause: %s", strerror(-ret));
		goto out;
	}
	for (unsigned v = 0, ndone = 0; v < b->p.vcpus; v++) {
		struct synth_vcpu_stats st;

		synth_vcpu_stats(g, v, &st);
		if (b->p.trace) {
			/* Done at the midpoint, not at the end: the rest is after the snapshot. */
			ret = synth_vcpu_limit(g, v, 0);
			if (ret) {
				set_err(b, "synth_vcpu_limit: %s", strerror(-ret));
				goto out;
			}
			st.done = 0;
		}
		b->pos[v] = st.accesses;
		ndone += st.done != 0;
		if (ndone == b->p.vcpus) {
			/* Nothing left to restore into: every timing would be empty. */
			set_err(b, "every vCPU finished its run before the snapshot: the run is too "
				"short to snapshot in its middle; raise --passes");
			ret = -EINVAL;
			goto out;
		}
		for (int k = 0; k < 8; k++)
			devstate[8 * v + k] = (uint8_t)(st.accesses >> (8 * k));
		if (!b->p.trace && (st.done || st.accesses + b->ws_units > b->max_accesses))
			fprintf(stderr, ME ": warning: vCPU %u is at %" PRIu64 " of %" PRIu64
				" accesses at the snapshot: less than one lap left\n", v,
				st.accesses, b->max_accesses);
	}
	ret = halite_save_set_device_state(s, devstate, 8ull * b->p.vcpus);
	if (ret) {
		set_err(b, "halite_save_set_device_state: %s", halite_strerror(ret));
		goto out;
	}
	/* Ground truth; the guest stays paused for it (the pause is not measured here). */
	ret = synth_copy_memory(g, b->snap);
	if (ret) {
		set_err(b, "synth_copy_memory: %s", strerror(-ret));
		goto out;
	}
	t0 = halite_now_ns();
	ret = halite_save_arm(s);
	if (ret) {
		set_err(b, "halite_save_arm: %s (%s)", halite_strerror(ret), halite_save_errmsg(s));
		synth_resume(g);
		goto out;
	}
	b->save_arm_s = (double)(halite_now_ns() - t0) / 1e9;
	ret = synth_resume(g);
	if (ret) {
		set_err(b, "synth_resume: %s", strerror(-ret));
		goto out;
	}
	ret = halite_save_wait(s, (int)b->p.timeout_s * 1000);
	halite_save_stats(s, &b->save);
	if (ret) {
		set_err(b, "the save failed: %s (%s)", halite_strerror(ret), halite_save_errmsg(s));
		goto out;
	}
	progress(b, "saved %s in %.2f s: %" PRIu64 " of %" PRIu64 " memory blocks by vCPU faults, %"
		 PRIu64 " by the background", b->src, (double)b->save.duration_ns / 1e9,
		 b->save.faults_vcpu, b->save.mb_total, b->save.mb_background);
	synth_stop(g);
	ret = b->p.trace ? trace_after_snapshot(b) : 0;
	if (!ret)
		ret = classify_frames(b, g);
out:
	halite_save_free(s);
	synth_free(g);
	return ret;
}

/* raw.img, decoded from the saved file, against the copy taken at the snapshot instant. */
static void check_save(struct bench *b)
{
	int fd = open(b->rl.raw_path, O_RDONLY | O_CLOEXEC);
	void *m;

	b->save_content = CONTENT_MISMATCH;
	if (fd < 0)
		return;
	m = mmap(NULL, b->mem_bytes, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return;
	if (b->rl.mem_bytes == b->mem_bytes && !memcmp(m, b->snap, b->mem_bytes))
		b->save_content = CONTENT_EXACT;
	else
		fprintf(stderr, ME ": the saved file does not hold the snapshot's memory\n");
	munmap(m, b->mem_bytes);
}

/* --- 3. baseline --- */

static int run_baseline(struct bench *b, double *secs)
{
	struct synth_guest *g = NULL;
	uint64_t t0;
	int ret;

	ret = create_guest(b, NULL, &g);
	if (!ret)
		ret = seek_all(b, g);
	if (ret)
		goto out;
	t0 = halite_now_ns();
	ret = synth_start(g);
	if (!ret)
		ret = synth_wait_done(g, b->p.timeout_s * 1000u);
	*secs = (double)(halite_now_ns() - t0) / 1e9;
	if (ret)
		set_err(b, "baseline run: %s", strerror(-ret));
out:
	synth_free(g);
	return ret;
}

/* --- 4. one restore run --- */

/* Number of x in [a, b] with x % m == r (a, b >= 0; empty when b < a). */
static uint64_t count_cong(uint64_t a, uint64_t b, uint64_t r, uint64_t m)
{
	uint64_t upto_b, below_a;

	if (b < a)
		return 0;
	upto_b = b >= r ? (b - r) / m + 1 : 0;
	below_a = a > r ? (a - 1 - r) / m + 1 : 0;
	return upto_b - below_a;
}

/* The multiplicative inverse of an odd number mod 2^64 (Newton: each step doubles the bits). */
static uint64_t inverse_odd(uint64_t a)
{
	uint64_t x = a;

	for (int i = 0; i < 5; i++)
		x *= 2 - a * x;
	return x;
}

static bool ws_page_ok(const struct bench *b, uint64_t f, const uint8_t *got, const uint8_t *want)
{
	uint64_t inv = inverse_odd(SYNTH_WRITE_ADD), l0, l1;

	if (!unit_laps(b, b->fvcpu[f], b->funit[f], &l0, &l1))
		return !memcmp(got, want, SYNTH_PAGE_SIZE);
	for (unsigned w = 0; w < WORDS_PER_PAGE; w++) {
		uint64_t x, y, k;

		memcpy(&x, got + 8 * w, 8);
		memcpy(&y, want + 8 * w, 8);
		/* Each write adds SYNTH_WRITE_ADD: k writes since the snapshot. */
		k = (x - y) * inv;
		/* A trace says exactly how many; seq writes a visit at random, k <= visits. */
		if (b->p.trace ? k != b->twrites[((uint64_t)b->fvcpu[f] * b->ws_units +
						  b->funit[f]) * WORDS_PER_PAGE + w] :
				 k > count_cong(l0, l1, w, WORDS_PER_PAGE))
			return false;
	}
	return true;
}

/*
 * Compare restored memory with the snapshot (see the top of the file).
 * @touched_only: skip pages the restored guest never touched (methods that
 * bring in only what is touched).
 */
static enum content check_memory(struct bench *b, const uint8_t *mem, bool touched_only,
				 struct run *r)
{
	uint64_t first_wrong = 0;

	for (uint64_t f = 0; f < b->nframes; f++) {
		const uint8_t *got = mem + f * SYNTH_PAGE_SIZE;
		const uint8_t *want = b->snap + f * SYNTH_PAGE_SIZE;
		bool ok;

		if (touched_only && !b->ftouched[f])
			continue;
		if (b->fcls[f] == FC_WS)
			ok = ws_page_ok(b, f, got, want);
		else
			ok = !memcmp(got, want, SYNTH_PAGE_SIZE);
		r->pages_checked++;
		if (!ok && !r->pages_wrong++)
			first_wrong = f;
	}
	if (r->pages_wrong)
		fprintf(stderr, ME ": %s: %" PRIu64 " of %" PRIu64 " pages differ from the "
			"snapshot, the first at GPA %#" PRIx64 "\n", r->d->name, r->pages_wrong,
			r->pages_checked, first_wrong * SYNTH_PAGE_SIZE);
	return r->pages_wrong ? CONTENT_MISMATCH : CONTENT_EXACT;
}

static void __attribute__((noreturn)) die_stuck(struct bench *b, struct run *r, const char *what);

/*
 * One restore, timed. @check: compare memory with the snapshot afterwards.
 * Returns 0 when the run completed (its checks may still have failed).
 */
static int run_method(struct bench *b, struct run *r, bool check)
{
	const struct mdef *d = r->d;
	pid_t tids[SYNTH_MAX_VCPUS] = { 0 }; /* filled once the guest exists; read at start */
	struct method_cfg cfg = {
		.kind = d->method, .raw_path = b->rl.raw_path, .ws_path = b->rl.ws_path,
		.region = b->rl.region, .mem_bytes = b->mem_bytes, .read_latency_us = r->lat,
		.cold = r->cold, .fuse_dir = b->fuse_dir,
		.hlt_path = d->org ? b->rl.hlt_path[d->layout] : NULL,
		/* VM access runs: the paper's measure costs a minor fault per staged block touched. */
		.halite_flags = (r->track ? HALITE_RESTORE_TRACK_ACCESS : 0) |
				(b->p.no_readahead ? HALITE_RESTORE_NO_READAHEAD : 0),
		.vcpu_tids = tids, .nvcpus = b->p.vcpus,
	};
	struct method *m = NULL;
	struct synth_guest *g = NULL;
	void *mem = NULL;
	uint64_t t0, t_first = 0, t_done;
	struct timespec poll_ts = { 0, 20000 };
	int ret;

	r->first_s = -1;
	if (!r->cold) {
		if (d->org)
			bench_warm_file(cfg.hlt_path);
		else
			bench_warm_file(cfg.raw_path);
		if (d->method == METHOD_WS)
			bench_warm_file(cfg.ws_path);
	}
	ret = method_prepare(&m, &cfg, &mem);
	if (ret) {
		snprintf(r->err, sizeof(r->err), "preparing: %s", halite_strerror(ret));
		return ret;
	}
	ret = create_guest(b, mem, &g);
	if (!ret)
		ret = seek_all(b, g);
	for (unsigned v = 0; !ret && v < b->p.vcpus; v++) {
		struct synth_vcpu_info vi;

		ret = synth_vcpu_info(g, v, &vi);
		tids[v] = vi.tid;
	}
	if (ret) {
		snprintf(r->err, sizeof(r->err), "creating the attached guest: %s", strerror(-ret));
		goto out;
	}

	t0 = halite_now_ns();
	ret = method_start(m);
	if (ret) {
		snprintf(r->err, sizeof(r->err), "starting the restore: %s", halite_strerror(ret));
		goto out;
	}
	r->mr.start_s = (double)(halite_now_ns() - t0) / 1e9;
	ret = synth_start(g);
	if (ret)
		die_stuck(b, r, "synth_start");
	/* The first completed access: any vCPU's counter past where it was seeked to. */
	for (;;) {
		bool all_done = true;

		for (unsigned v = 0; v < b->p.vcpus; v++) {
			struct synth_vcpu_stats st;

			if (synth_vcpu_stats(g, v, &st))
				continue;
			if (st.accesses > b->pos[v] && !t_first)
				t_first = halite_now_ns();
			all_done &= st.done != 0;
		}
		if (t_first || all_done || halite_now_ns() - t0 > b->p.timeout_s * 1000000000ull)
			break;
		nanosleep(&poll_ts, NULL);
	}
	ret = synth_wait_done(g, b->p.timeout_s * 1000u);
	t_done = halite_now_ns();
	if (ret)
		die_stuck(b, r, "waiting for the restored guest to finish");
	r->run_s = (double)(t_done - t0) / 1e9;
	if (t_first)
		r->first_s = (double)(t_first - t0) / 1e9;
	synth_stop(g);
	for (unsigned v = 0; v < b->p.vcpus; v++) {
		struct synth_vcpu_stats st;

		if (!synth_vcpu_stats(g, v, &st))
			r->xlate_faults += st.faults;
	}

	ret = method_finish(m, (int)b->p.timeout_s * 1000, &r->mr);
	if (ret) {
		snprintf(r->err, sizeof(r->err), "finishing the restore: %s", halite_strerror(ret));
		goto out;
	}
	/* 4k-on-demand and working-set never bring in what the guest did not touch. */
	if (check)
		r->content = check_memory(b, mem, d->method == METHOD_4K || d->method == METHOD_WS,
					  r);
	r->ok = !r->xlate_faults && r->content != CONTENT_MISMATCH;
	if (r->xlate_faults)
		snprintf(r->err, sizeof(r->err), "%" PRIu64 " failed translations in the "
			 "restored guest", r->xlate_faults);
out:
	synth_free(g);
	method_free(m);
	return ret;
}

/* --- output --- */

static double overhead(const struct bench *b, const struct run *r)
{
	return r->ok || r->run_s > 0 ? r->run_s - b->baseline_s : NAN;
}

/*
 * The VM access % of an organisation, from its TRACK_ACCESS run, and the
 * LBs that run read on demand (what the % is of): with none (the
 * prefetcher had every LB in before the guest asked, as on a loaded
 * machine it may), there is no % to give.
 */
static double vm_access(const struct bench *b, const struct mdef *d, uint64_t *lbs)
{
	for (size_t i = 0; i < b->ntracks; i++)
		if (b->tracks[i].d == d && b->tracks[i].ok) {
			*lbs = b->tracks[i].mr.demand_reads;
			return b->tracks[i].mr.vm_access_pct >= 0 ? b->tracks[i].mr.vm_access_pct :
				NAN;
		}
	*lbs = UINT64_MAX;
	return NAN;
}

static const char *content_name(enum content c)
{
	return c == CONTENT_EXACT ? "exact" : c == CONTENT_MISMATCH ? "mismatch" : NULL;
}

static void print_run_json(const struct bench *b, const struct run *r, bool with_vm)
{
	uint64_t vm_lbs = UINT64_MAX;
	double vm = with_vm ? (r->d->org ? vm_access(b, r->d, &vm_lbs) : NAN) :
		r->mr.vm_access_pct;

	if (!with_vm && vm < 0)
		vm = NAN;
	printf("{\"name\": \"%s\", \"kind\": \"%s\", \"ok\": %s, \"restore_overhead_s\": ",
	       r->d->name, r->d->org ? "organisation" : "peer", r->ok ? "true" : "false");
	bench_json_num(overhead(b, r), 4);
	printf(", \"first_access_s\": ");
	bench_json_num(r->first_s >= 0 ? r->first_s : NAN, 6);
	printf(", \"storage_reads\": %" PRIu64 ", \"demand_reads\": %" PRIu64
	       ", \"bytes_read\": %" PRIu64 ", \"demand_faults\": %" PRIu64
	       ", \"vm_access_pct\": ", r->mr.storage_reads, r->mr.demand_reads,
	       r->mr.bytes_read, r->mr.demand_faults);
	bench_json_num(vm, 1);
	printf(", \"vm_access_lbs\": ");
	if (vm_lbs == UINT64_MAX)
		printf("null");
	else
		printf("%" PRIu64, vm_lbs);
	printf(", \"read_latency_us\": %u, \"cache\": \"%s\", \"run_s\": ", r->lat,
	       r->cold ? "cold" : "warm");
	bench_json_num(r->run_s, 4);
	printf(", \"start_s\": ");
	bench_json_num(r->mr.start_s, 4);
	printf(", \"done_s\": ");
	bench_json_num(r->mr.done_s >= 0 ? r->mr.done_s : NAN, 4);
	printf(", \"failed_translations\": %" PRIu64 ", \"content\": ", r->xlate_faults);
	if (content_name(r->content)) {
		bench_json_str(content_name(r->content));
		printf(", \"pages_checked\": %" PRIu64 ", \"pages_wrong\": %" PRIu64,
		       r->pages_checked, r->pages_wrong);
	} else {
		printf("null");
	}
	if (r->mr.have_engine) {
		const struct halite_restore_stats *h = &r->mr.engine;

		printf(", \"engine\": {\"demand_reads\": %" PRIu64 ", \"prefetch_reads\": %" PRIu64
		       ", \"retries\": %" PRIu64 ", \"lbs\": %" PRIu64 ", \"faults\": %" PRIu64
		       ", \"faults_cached\": %" PRIu64 ", \"faults_zero\": %" PRIu64
		       ", \"mb_fault\": %" PRIu64 ", \"mb_pool\": %" PRIu64 ", \"mb_prefetch\": %"
		       PRIu64 ", \"mb_zero\": %" PRIu64 ", \"mb_staged\": %" PRIu64
		       ", \"mb_staged_accessed\": %" PRIu64 ", \"fault_p50_us\": %.1f"
		       ", \"fault_p99_us\": %.1f, \"ready_s\": %.6f}",
		       h->lb_demand, h->lb_prefetch, h->lb_retries, h->lb_total, h->faults,
		       h->faults_cached, h->faults_zero, h->mb_fault, h->mb_pool, h->mb_prefetch,
		       h->mb_zero, h->mb_staged, h->mb_staged_accessed,
		       (double)h->fault_p50_ns / 1e3, (double)h->fault_p99_ns / 1e3,
		       (double)h->ready_ns / 1e9);
	}
	printf(", \"error\": ");
	if (r->err[0])
		bench_json_str(r->err);
	else
		printf("null");
	printf("}");
}

/* The results; @code the exit code they end with ("ok", "exit"). */
static void print_json(const struct bench *b, int code)
{
	const struct params *p = &b->p;

	printf("{\"ok\": %s, \"exit\": %d, \"machine\": ", code ? "false" : "true", code);
	bench_machine_json(p->dir);
	printf(",\n");

	printf(" \"params\": {\"quick\": %s, \"mem_bytes\": %" PRIu64 ", \"vcpus\": %u, "
	       "\"stride\": 16, \"ws_bytes_per_vcpu\": %" PRIu64 ", \"map_bytes_per_vcpu\": %" PRIu64
	       ", \"compress_pct\": %u, \"write_pct\": %u, \"zero_pct\": %u, \"untouched_pct\": %u, "
	       "\"pattern\": \"%s\", \"backing\": \"anon\", \"passes\": %" PRIu64
	       ", \"max_accesses_per_vcpu\": %" PRIu64 ", \"snapshot_positions\": [",
	       p->quick ? "true" : "false", b->mem_bytes, p->vcpus,
	       b->ws_units * SYNTH_PAGE_SIZE, b->ws_units * SYNTH_PAGE_SIZE, p->compress_pct,
	       p->write_pct, p->zero_pct, p->untouched_pct, p->trace ? "trace" : "seq", p->passes,
	       b->max_accesses);
	for (unsigned v = 0; v < p->vcpus; v++)
		printf("%s%" PRIu64, v ? ", " : "", b->pos[v]);
	printf("], \"trace\": ");
	if (p->trace) {
		printf("{\"path\": ");
		bench_json_str(p->trace);
		printf(", \"records\": %" PRIu64 ", \"records_per_vcpu\": [", b->ti.records);
		for (unsigned v = 0; v < p->vcpus; v++)
			printf("%s%" PRIu64, v ? ", " : "", b->ti.nrec[v]);
		printf("], \"writes_per_vcpu\": [");
		for (unsigned v = 0; v < p->vcpus; v++)
			printf("%s%" PRIu64, v ? ", " : "", b->ti.writes[v]);
		printf("]}");
	} else {
		printf("null");
	}
	printf(", \"codec\": \"%s\", \"mb_bytes\": %u, \"lb_bytes\": %u, \"seed\": %" PRIu64
	       ", \"caches\": [", halite_codec_name(p->codec), b->rl.mb_size, b->rl.lb_size, p->seed);
	{
		bool first = true;

		for (int c = 0; c < 2; c++) {
			int k = p->cache_cold_first ? 1 - c : c;

			if (p->cache[k]) {
				printf("%s\"%s\"", first ? "" : ", ", k ? "cold" : "warm");
				first = false;
			}
		}
	}
	printf("], \"read_latencies_us\": [");
	for (unsigned i = 0; i < p->nlat; i++)
		printf("%s%u", i ? ", " : "", p->lat[i]);
	printf("], \"vm_access_run\": ");
	if (p->track)
		printf("{\"cache\": \"warm\", \"read_latency_us\": %u}", p->track_lat);
	else
		printf("null");
	printf(", \"engine_readahead\": %s", p->no_readahead ? "false" : "true");
	printf(", \"baseline_runs\": %u, \"dir\": ", p->baseline_runs);
	bench_json_str(b->work);
	printf(",\n  \"notes\": [\"random, physical and locality: codec none, zero blocks stored "
	       "as data (no zero elision), never-touched blocks have no bytes in any file\", "
	       "\"locality: the saved streams in saved order; zero blocks, which the save placed "
	       "in no stream, appended in physical order at the end\", "
	       "\"halite: the saved file itself (vCPU streams, guest-virtual, physical sweep; "
	       "compressed; zero elision)\", "
	       "\"raw.img (eager, 4k-on-demand, mmap-private, working-set): holes for zero and "
	       "never-touched pages\", "
	       "\"read latency: added to every read request by every method; warm and cold "
	       "apply with every latency\", "
	       "\"restore_overhead_s = run_s - baseline_s; run_s from just before method_start to "
	       "all vCPUs done; first_access_s from the same instant\", "
	       "\"vm_access_pct: organisations only, from a separate run of the same method "
	       "with HALITE_RESTORE_TRACK_ACCESS (vm_access_runs), which costs a minor fault per "
	       "staged block the guest touches\", "
	       "\"storage_reads counts every read request (an organisation's: every LB, demand "
	       "and prefetch; a completed restore reads each once); demand_reads those a fault "
	       "waited for (mmap-private: all, the kernel's reads cannot be told apart)\", "
	       "\"snapshot instant: when the slowest vCPU is half-way through max_accesses; "
	       "write_pct is this bench's choice (the paper does not give one)\", "
	       "\"content: the first run of each name compares memory with the snapshot; "
	       "4k-on-demand and working-set only the pages the guest touched\"]},\n");

	printf(" \"save\": {\"file_bytes\": %" PRIu64 ", \"duration_s\": %.4f, "
	       "\"arm_s\": %.6f, \"mb_total\": %" PRIu64 ", \"mb_stored\": %" PRIu64
	       ", \"mb_zero\": %" PRIu64 ", \"mb_untouched\": %" PRIu64 ", \"faults_vcpu\": %" PRIu64
	       ", \"mb_vcpu_streams\": %" PRIu64 ", \"mb_virtual\": %" PRIu64
	       ", \"mb_physical\": %" PRIu64 ", \"raw_bytes\": %" PRIu64 ", \"stored_bytes\": %" PRIu64
	       ", \"content\": ",
	       b->rl.file_bytes[ORG_HALITE], (double)b->save.duration_ns / 1e9, b->save_arm_s,
	       b->save.mb_total, b->save.mb_stored, b->save.mb_zero, b->save.mb_untouched,
	       b->save.faults_vcpu, b->rl.mb_vcpu, b->rl.mb_virtual, b->rl.mb_physical,
	       b->save.raw_bytes, b->save.stored_bytes);
	if (content_name(b->save_content))
		bench_json_str(content_name(b->save_content));
	else
		printf("null");
	printf("},\n \"files\": {");
	for (int o = 0; o < ORG_COUNT; o++)
		printf("%s\"%s\": {\"bytes\": %" PRIu64 ", \"lbs\": %" PRIu64 "}", o ? ", " : "",
		       relayout_org_name(o), b->rl.file_bytes[o], b->rl.lb_count[o]);
	printf(", \"raw\": {\"bytes\": %" PRIu64 ", \"allocated\": %" PRIu64 "}, \"ws\": {\"pages\": %"
	       PRIu64 "}, \"relayout_s\": %.3f},\n", b->rl.mem_bytes, b->rl.raw_alloc_bytes,
	       b->rl.ws_pages, b->rl.seconds);

	printf(" \"baseline_s\": ");
	bench_json_num(b->baseline_s, 4);
	printf(", \"baseline_runs_s\": [");
	for (unsigned i = 0; i < b->nbaseline; i++)
		printf("%s%.4f", i ? ", " : "", b->baseline[i]);
	printf("],\n \"results\": [");
	for (size_t i = 0; i < b->nruns; i++) {
		printf("%s\n  ", i ? "," : "");
		print_run_json(b, &b->runs[i], true);
	}
	printf("\n ],\n \"vm_access_runs\": [");
	for (size_t i = 0; i < b->ntracks; i++) {
		printf("%s\n  ", i ? "," : "");
		print_run_json(b, &b->tracks[i], false);
	}
	printf("\n ],\n \"error\": ");
	if (b->err[0])
		bench_json_str(b->err);
	else if (code)
		bench_json_str("a check failed: the saved file or a restored guest is not the "
			       "snapshot (results: ok, content)");
	else
		printf("null");
	printf("}\n");
	fflush(stdout);
}

static void fmt_s(char *buf, size_t len, double v)
{
	if (!isfinite(v))
		snprintf(buf, len, "-");
	else if (fabs(v) < 1.0)
		snprintf(buf, len, "%.1fms", v * 1e3);
	else
		snprintf(buf, len, "%.2fs", v);
}

static void print_table(const struct bench *b)
{
	char o[32], f[32], rs[32], st[32];

	printf("guest %" PRIu64 " MiB, %u vCPUs, working set %" PRIu64 " MiB, compress %u%%, "
	       "writes %u%%; baseline %.4f s (median of %u)\n", b->mem_bytes / MIB, b->p.vcpus,
	       b->ws_units * SYNTH_PAGE_SIZE * b->p.vcpus / MIB, b->p.compress_pct, b->p.write_pct,
	       b->baseline_s, b->nbaseline);
	printf("save: %.2f s, file %.1f MiB; files: random %.1f, physical %.1f, locality %.1f, "
	       "halite %.1f MiB; content %s\n\n", (double)b->save.duration_ns / 1e9,
	       (double)b->rl.file_bytes[ORG_HALITE] / (double)MIB,
	       (double)b->rl.file_bytes[0] / (double)MIB,
	       (double)b->rl.file_bytes[1] / (double)MIB, (double)b->rl.file_bytes[2] / (double)MIB,
	       (double)b->rl.file_bytes[3] / (double)MIB,
	       content_name(b->save_content) ? content_name(b->save_content) : "unchecked");
	printf("%-5s %7s  %-13s %10s %10s %10s %9s %9s %8s %10s %9s %7s  %s\n", "cache",
	       "lat us", "name", "overhead", "1st acc", "run", "start", "reads", "demand",
	       "MiB read", "faults", "VM acc", "check");
	for (size_t i = 0; i < b->nruns; i++) {
		const struct run *r = &b->runs[i];
		uint64_t vm_lbs;
		double vm = r->d->org ? vm_access(b, r->d, &vm_lbs) : NAN;

		fmt_s(o, sizeof(o), overhead(b, r));
		fmt_s(f, sizeof(f), r->first_s >= 0 ? r->first_s : NAN);
		fmt_s(rs, sizeof(rs), r->run_s);
		fmt_s(st, sizeof(st), r->mr.start_s);
		printf("%-5s %7u  %-13s %10s %10s %10s %9s %9" PRIu64 " %8" PRIu64 " %10.1f %9"
		       PRIu64 " ", r->cold ? "cold" : "warm", r->lat, r->d->name, o, f, rs, st,
		       r->mr.storage_reads, r->mr.demand_reads,
		       (double)r->mr.bytes_read / (double)MIB, r->mr.demand_faults);
		if (isfinite(vm))
			printf("%6.1f%%", vm);
		else
			printf("%7s", "-");
		printf("  %s%s%s\n", !r->ok ? "FAILED" : content_name(r->content) ?
		       content_name(r->content) : "ok", r->err[0] ? ": " : "", r->err);
	}
	if (b->ntracks) {
		printf("\nVM access %% runs (HALITE_RESTORE_TRACK_ACCESS, warm, %u us):\n",
		       b->p.track_lat);
		for (size_t i = 0; i < b->ntracks; i++) {
			const struct run *r = &b->tracks[i];

			printf("  %-9s demand reads %7" PRIu64 "  prefetched %7" PRIu64 "  faults %7"
			       PRIu64 "  VM access %5.1f%%  fault p50 %.1f us%s%s\n", r->d->name,
			       r->mr.engine.lb_demand, r->mr.engine.lb_prefetch, r->mr.demand_faults,
			       r->mr.vm_access_pct, (double)r->mr.engine.fault_p50_ns / 1e3,
			       r->err[0] ? "  " : "", r->err);
		}
	}
	if (b->err[0])
		printf("\nerror: %s\n", b->err);
	fflush(stdout);
}

static void cleanup_files(struct bench *b)
{
	if (b->p.keep) {
		fprintf(stderr, ME ": files kept in %s\n", b->work);
		return;
	}
	for (int o = 0; o < ORG_HALITE; o++)
		if (b->rl.hlt_path[o])
			unlink(b->rl.hlt_path[o]);
	if (b->rl.raw_path)
		unlink(b->rl.raw_path);
	if (b->rl.ws_path)
		unlink(b->rl.ws_path);
	unlink(b->src);
	rmdir(b->fuse_dir);
	rmdir(b->work);
}

/* A guest that cannot finish: report what there is and end the process (see the top). */
static void __attribute__((noreturn)) die_stuck(struct bench *b, struct run *r, const char *what)
{
	snprintf(r->err, sizeof(r->err), "%s: the guest did not finish in %u s", what,
		 b->p.timeout_s);
	set_err(b, "%s (%s, %s cache, %u us): %s", r->d->name, r->track ? "VM access run" : "run",
		r->cold ? "cold" : "warm", r->lat, r->err);
	if (b->p.json)
		print_json(b, 1);
	else
		print_table(b);
	if (!b->p.keep)
		cleanup_files(b);
	_exit(1);
}

/* --- options --- */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " PROG " micro [options]\n"
"\n"
"The paper's microbenchmark (section 8.1) on the synthetic guest: a lazy save in\n"
"the middle of a run, then the rest of the run restored from four organisations\n"
"of that one file (random, physical, locality, halite) and by four peers (eager,\n"
"4k-on-demand, mmap-private, working-set), under each storage condition, against\n"
"the same rest of the run with no restore (the baseline).\n"
"\n"
"  --quick            128 MiB guest, read latency 0 and 1000 us (warm and cold):\n"
"                     about a minute on a 2-core machine\n"
"  --mem-mib N        guest memory, even, >= 16 (1024; the paper's allocation)\n"
"  --vcpus N          1..16 (4); each accesses mem/4/vcpus sequentially\n"
"  --compress PCT     data compressing to about PCT%% (50), 10..90\n"
"  --write-pct PCT    accesses that write (20), 0..100\n"
"  --zero-pct PCT     data pages left all-zero (0)\n"
"  --untouched-pct PCT  frames never touched (0)\n"
"  --passes N         laps over each vCPU's working set, snapshot at half (1000)\n"
"  --cache LIST       warm,cold (both); cold drops the files' page cache, O_DIRECT\n"
"  --latency LIST     microseconds added to every read (0,100,1000,5000);\n"
"                     conditions are every cache x every latency\n"
"  --track-latency US the VM access %% runs' latency, warm cache (1000)\n"
"  --no-track         no VM access %% runs\n"
"  --no-readahead     the engine without stream readahead (an ablation)\n"
"  --only LIST        only these rows: random,physical,locality,halite,eager,\n"
"                     4k-on-demand,mmap-private,working-set (all)\n"
"  --baseline-runs N  unrestored runs, median taken (3)\n"
"  --codec NAME       the saved file's codec: lz4 (default), zlib (the paper), zstd\n"
"  --dir DIR          a work directory is made in DIR (/var/tmp) and removed\n"
"  --keep             keep it (src.hlt = halite.hlt, random/physical/locality.hlt,\n"
"                     raw.img, ws.bin)\n"
"  --seed N           guest data and writes, random order (1)\n"
"  --timeout S        per wait (600)\n"
"  --json             one JSON object on stdout instead of the table\n"
"  --trace FILE       the workload is this access trace (docs/trace-format.md)\n"
"                     instead of seq: its vCPUs, each replaying its records once,\n"
"                     the snapshot when each is half-way; memory 4 x what the\n"
"                     vCPUs map unless --mem-mib; --vcpus, --passes, --write-pct\n"
"                     refused. A trace that does not fit: exit 2\n"
"  --version          the version\n"
"\n"
"Expected duration on the 2-core development machine: --quick 45 s. The full\n"
"run (1 GiB, 8 conditions) about 30-35 minutes: 30 s to save and re-lay out,\n"
"15 s per condition at no latency, and the methods that read 4 KiB per fault\n"
"from one thread under latency: 4k-on-demand reads ~65700 pages one after the\n"
"other, 5.5 min at 5 ms and 70 s at 1 ms (times two: warm and cold),\n"
"working-set about half of that. --cache warm halves the total; --latency\n"
"0,1000 brings it under 10 minutes.\n"
"\n"
"Exit: 0 all runs completed and every check passed, 1 otherwise, 2 usage,\n"
"77 userfaultfd unavailable.\n");
}

static int parse_only(struct params *p, const char *s)
{
	char *copy = strdup(s), *save = NULL;
	int ret = 0;

	if (!copy)
		return -1;
	p->selected = 0;
	for (char *t = strtok_r(copy, ",", &save); t && !ret; t = strtok_r(NULL, ",", &save)) {
		int k = -1;

		for (int i = 0; i < NAMES; i++)
			if (!strcmp(t, defs[i].name))
				k = i;
		if (k < 0)
			ret = -1;
		else
			p->selected |= 1u << k;
	}
	free(copy);
	return ret || !p->selected ? -1 : 0;
}

static int parse_args(struct params *p, int argc, char **argv)
{
	enum { O_MEM = 256, O_VCPUS, O_COMPRESS, O_WRITE, O_ZERO, O_UNTOUCHED, O_PASSES, O_CACHE,
	       O_LAT, O_TRACK_LAT, O_NO_TRACK, O_NO_RA, O_ONLY, O_BASE, O_CODEC, O_DIR, O_KEEP, O_SEED,
	       O_TIMEOUT, O_JSON, O_QUICK, O_TRACE };
	static const struct option lo[] = {
		{ "mem-mib", required_argument, NULL, O_MEM },
		{ "vcpus", required_argument, NULL, O_VCPUS },
		{ "compress", required_argument, NULL, O_COMPRESS },
		{ "write-pct", required_argument, NULL, O_WRITE },
		{ "zero-pct", required_argument, NULL, O_ZERO },
		{ "untouched-pct", required_argument, NULL, O_UNTOUCHED },
		{ "passes", required_argument, NULL, O_PASSES },
		{ "cache", required_argument, NULL, O_CACHE },
		{ "latency", required_argument, NULL, O_LAT },
		{ "track-latency", required_argument, NULL, O_TRACK_LAT },
		{ "no-track", no_argument, NULL, O_NO_TRACK },
		{ "no-readahead", no_argument, NULL, O_NO_RA },
		{ "only", required_argument, NULL, O_ONLY },
		{ "baseline-runs", required_argument, NULL, O_BASE },
		{ "codec", required_argument, NULL, O_CODEC },
		{ "dir", required_argument, NULL, O_DIR },
		{ "keep", no_argument, NULL, O_KEEP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "json", no_argument, NULL, O_JSON },
		{ "quick", no_argument, NULL, O_QUICK },
		{ "trace", required_argument, NULL, O_TRACE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	bool mem_set = false, cache_set = false, lat_set = false, shape_set = false;
	bool json = halite_cli_has_json(argc, argv);
	uint64_t v;
	int opt;

	optind = 1;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (opt) {
		case O_MEM:
			if (!bench_parse_u64(optarg, 16, 65536, &v) || v % 2)
				return bench_bad_arg(ME, json, "--mem-mib", optarg,
						     "MiB, even, 16 .. 65536");
			p->mem_mib = v;
			mem_set = true;
			break;
		case O_VCPUS:
			if (!bench_parse_u64(optarg, 1, SYNTH_MAX_VCPUS, &v))
				return bench_bad_arg(ME, json, "--vcpus", optarg, "1 .. 16");
			p->vcpus = (unsigned)v;
			shape_set = true;
			break;
		case O_COMPRESS:
			if (!bench_parse_u64(optarg, 10, 90, &v))
				return bench_bad_arg(ME, json, "--compress", optarg,
						     "percent, 10 .. 90");
			p->compress_pct = (unsigned)v;
			break;
		case O_WRITE:
			if (!bench_parse_u64(optarg, 0, 100, &v))
				return bench_bad_arg(ME, json, "--write-pct", optarg,
						     "percent, 0 .. 100");
			p->write_pct = (unsigned)v;
			shape_set = true;
			break;
		case O_ZERO:
			if (!bench_parse_u64(optarg, 0, 90, &v))
				return bench_bad_arg(ME, json, "--zero-pct", optarg,
						     "percent, 0 .. 90");
			p->zero_pct = (unsigned)v;
			break;
		case O_UNTOUCHED:
			if (!bench_parse_u64(optarg, 0, 50, &v))
				return bench_bad_arg(ME, json, "--untouched-pct", optarg,
						     "percent, 0 .. 50");
			p->untouched_pct = (unsigned)v;
			break;
		case O_PASSES:
			if (!bench_parse_u64(optarg, 2, 1000000, &v))
				return bench_bad_arg(ME, json, "--passes", optarg, "2 .. 1000000");
			p->passes = v;
			shape_set = true;
			break;
		case O_CACHE:
			if (bench_parse_caches(optarg, p->cache, &p->cache_cold_first))
				return bench_bad_arg(ME, json, "--cache", optarg,
						     "warm, cold or warm,cold");
			cache_set = true;
			break;
		case O_LAT:
			if (bench_parse_latencies(optarg, p->lat, MAX_LAT, &p->nlat))
				return bench_bad_arg(ME, json, "--latency", optarg,
					       "up to 8 microsecond values, 0 .. 1000000");
			lat_set = true;
			break;
		case O_TRACK_LAT:
			if (!bench_parse_u64(optarg, 0, 1000000, &v))
				return bench_bad_arg(ME, json, "--track-latency", optarg,
						     "microseconds");
			p->track_lat = (uint32_t)v;
			break;
		case O_NO_TRACK: p->track = false; break;
		case O_NO_RA: p->no_readahead = true; break;
		case O_ONLY:
			if (parse_only(p, optarg))
				return bench_bad_arg(ME, json, "--only", optarg,
					       "names from --help, comma-separated");
			break;
		case O_BASE:
			if (!bench_parse_u64(optarg, 1, 16, &v))
				return bench_bad_arg(ME, json, "--baseline-runs", optarg,
						     "1 .. 16");
			p->baseline_runs = (unsigned)v;
			break;
		case O_CODEC:
			p->codec = halite_codec_parse(optarg);
			if (p->codec < 0)
				return bench_bad_arg(ME, json, "--codec", optarg,
						     "lz4, zlib, zstd or none");
			break;
		case O_DIR: p->dir = optarg; break;
		case O_KEEP: p->keep = true; break;
		case O_SEED:
			if (!bench_parse_u64(optarg, 1, UINT64_MAX, &v))
				return bench_bad_arg(ME, json, "--seed", optarg,
						     "a positive integer");
			p->seed = v;
			break;
		case O_TIMEOUT:
			if (!bench_parse_u64(optarg, 1, 86400, &v))
				return bench_bad_arg(ME, json, "--timeout", optarg,
						     "seconds, 1 .. 86400");
			p->timeout_s = (unsigned)v;
			break;
		case O_JSON: p->json = true; break;
		case O_QUICK: p->quick = true; break;
		case O_TRACE: p->trace = optarg; break;
		case 'h': usage(stdout); return 1;
		case 'V': halite_cli_version(PROG); return 1;
		default: return bench_opt_error(ME, json, opt, argc, argv, PROG " micro");
		}
	}
	if (optind != argc)
		return bench_fail(ME, json, 2, "unexpected argument '%s' (" PROG " micro --help)",
				  argv[optind]);
	if (p->trace && shape_set)
		return bench_fail(ME, json, 2, "--vcpus, --passes and --write-pct describe the seq "
				  "workload; with --trace the trace decides them");
	if (p->trace && !mem_set)
		p->mem_mib = 0; /* sized from the trace */
	if (p->quick) {
		if (!mem_set && !p->trace)
			p->mem_mib = 128;
		if (!cache_set)
			p->cache[0] = p->cache[1] = true;
		if (!lat_set) {
			p->lat[0] = 0;
			p->lat[1] = 1000;
			p->nlat = 2;
		}
	}
	return 0;
}

/* --- main --- */

/*
 * --trace: the guest from the trace (trace_guest_mem). Each vCPU runs its
 * records once; the snapshot is when every vCPU is at half of its own.
 */
static int size_from_trace(struct bench *b)
{
	struct params *p = &b->p;
	char err[400];
	int ret = trace_file_scan(p->trace, &b->ti, err, sizeof(err));

	if (!ret)
		ret = trace_guest_mem(&b->ti, p->trace, p->mem_mib, &b->mem_bytes, err, sizeof(err));
	if (ret) {
		set_err(b, "%s", err);
		return ret;
	}
	p->vcpus = b->ti.nvcpus;
	b->ws_units = b->ti.map_bytes / SYNTH_PAGE_SIZE;
	b->max_accesses = 0;
	for (unsigned v = 0; v < p->vcpus; v++)
		b->half[v] = b->ti.nrec[v] / 2;
	progress(b, "trace %s: %u vCPUs, %" PRIu64 " records, %" PRIu64 " KiB mapped per vCPU",
		 p->trace, p->vcpus, b->ti.records, b->ti.map_bytes >> 10);
	return 0;
}

/* Every condition x every selected row, then the VM access runs. True if any failed. */
static bool run_all(struct bench *b, size_t nconds)
{
	const struct params *p = &b->p;
	unsigned checked = 0; /* bit per defs[] entry: memory compared once */
	size_t total = 0, done = 0;
	bool lat0 = false, failed = false;

	/* Compare memory at no latency if there is one: mmap-private reads all of it. */
	for (unsigned l = 0; l < p->nlat; l++)
		lat0 |= !p->lat[l];
	for (int n = 0; n < NAMES; n++)
		if (p->selected >> n & 1)
			total += nconds + (p->track && defs[n].org);
	for (int c = 0; c < 2; c++) {
		bool cold = p->cache_cold_first ? c == 0 : c == 1;

		if (!p->cache[cold])
			continue;
		for (unsigned l = 0; l < p->nlat; l++) {
			for (int n = 0; n < NAMES; n++) {
				struct run *r = &b->runs[b->nruns];
				bool check = !(checked >> n & 1) && (!p->lat[l] || !lat0);
				int ret;

				if (!(p->selected >> n & 1))
					continue;
				*r = (struct run){ .d = &defs[n], .cold = cold, .lat = p->lat[l] };
				b->nruns++;
				ret = run_method(b, r, check);
				checked |= (unsigned)check << n;
				failed |= ret || !r->ok;
				progress(b, "[%zu/%zu] %s, %u us: %-13s run %.4f s, overhead %+.4f s, "
					 "first access %.6f s, %" PRIu64 " reads%s%s%s", ++done, total,
					 cold ? "cold" : "warm", r->lat, defs[n].name, r->run_s,
					 r->run_s - b->baseline_s, r->first_s, r->mr.storage_reads,
					 r->content == CONTENT_EXACT ? ", memory exact" :
					 r->content == CONTENT_MISMATCH ? ", MEMORY DIFFERS" : "",
					 r->err[0] ? ": " : "", r->err);
			}
		}
	}
	for (int n = 0; p->track && n < NAMES; n++) {
		struct run *r = &b->tracks[b->ntracks];
		int ret;

		if (!defs[n].org || !(p->selected >> n & 1))
			continue;
		*r = (struct run){ .d = &defs[n], .lat = p->track_lat, .track = true };
		b->ntracks++;
		ret = run_method(b, r, false);
		failed |= ret || !r->ok;
		progress(b, "[%zu/%zu] VM access run, warm, %u us: %-9s VM access %.1f%%, %" PRIu64
			 " demand reads, %" PRIu64 " faults%s%s", ++done, total, r->lat, defs[n].name,
			 r->mr.vm_access_pct, r->mr.engine.lb_demand, r->mr.demand_faults,
			 r->err[0] ? ": " : "", r->err);
	}
	return failed;
}

/* Remove the files (unless --keep), free everything, return @code. */
static int bench_end(struct bench *b, int code)
{
	/* --json: one object on every path; a failure before the results is only that. */
	if (b->p.json && !b->printed && code)
		halite_cli_json_fail(stdout, b->err[0] ? b->err : "the benchmark failed", code);
	if (b->work && b->fuse_dir && b->src)
		cleanup_files(b);
	relayout_out_free(&b->rl);
	free(b->runs);
	free(b->tracks);
	free(b->snap);
	free(b->fcls);
	free(b->fvcpu);
	free(b->funit);
	free(b->ftouched);
	free(b->tvisit);
	free(b->twrites);
	free(b->work);
	free(b->fuse_dir);
	free(b->src);
	return code;
}

static int micro(int argc, char **argv)
{
	struct bench b = {
		.p = { .mem_mib = 1024, .vcpus = 4, .compress_pct = 50, .write_pct = 20,
		       .passes = 1000, .baseline_runs = 3, .codec = HALITE_CODEC_LZ4,
		       .cache = { true, true }, .lat = { 0, 100, 1000, 5000 }, .nlat = 4,
		       .track_lat = 1000, .track = true, .selected = (1u << NAMES) - 1,
		       .dir = "/var/tmp", .seed = 1, .timeout_s = 600 },
	};
	struct params *p = &b.p;
	size_t nconds;
	char err[512];
	bool failed = false;
	int ret;

	ret = parse_args(p, argc, argv);
	if (ret)
		return ret == 1 ? 0 : ret;
	ret = bench_preflight(ME, p->json, p->dir);
	if (ret)
		return ret;
	/* Precise short sleeps for the first-access watch. */
	prctl(PR_SET_TIMERSLACK, 1ul);
	b.t_start = halite_now_s();
	if (p->trace) {
		ret = size_from_trace(&b);
		if (ret)
			return bench_end(&b, ret == -EINVAL ? 2 : 1);
	} else {
		b.mem_bytes = p->mem_mib * MIB;
		/* The paper's microbenchmark: a quarter of memory mapped over the vCPUs, all accessed. */
		b.ws_units = b.mem_bytes / 4 / p->vcpus / SYNTH_PAGE_SIZE;
		b.max_accesses = p->passes * b.ws_units;
		for (unsigned v = 0; v < p->vcpus; v++)
			b.half[v] = b.max_accesses / 2;
	}
	b.nframes = b.mem_bytes / SYNTH_PAGE_SIZE;
	if (asprintf(&b.work, "%s/halite-bench.%d", p->dir, (int)getpid()) < 0 ||
	    asprintf(&b.fuse_dir, "%s/fuse", b.work) < 0 ||
	    asprintf(&b.src, "%s/halite.hlt", b.work) < 0) {
		set_err(&b, "out of memory");
		return bench_end(&b, 1);
	}
	if (mkdir(b.work, 0700) || mkdir(b.fuse_dir, 0700)) {
		set_err(&b, "mkdir %s: %s", b.work, strerror(errno));
		return bench_end(&b, 1);
	}

	ret = run_source(&b);
	if (ret) {
		return bench_end(&b, ret == -HALITE_E_UNSUPPORTED ? 77 : 1);
	}

	progress(&b, "relayout");
	ret = relayout(b.src, b.work, p->seed, &b.rl, err, sizeof(err));
	if (ret) {
		set_err(&b, "relayout: %s", err);
		return bench_end(&b, 1);
	}
	b.relaid = true;
	check_save(&b);
	progress(&b, "relayout done in %.2f s: %" PRIu64 " memory blocks (%" PRIu64 " stored, %"
		 PRIu64 " zero, %" PRIu64 " never touched), %" PRIu64 " in vCPU streams; saved "
		 "file %s the snapshot", b.rl.seconds, b.rl.mb_total, b.rl.mb_stored, b.rl.mb_zero,
		 b.rl.mb_untouched, b.rl.mb_vcpu,
		 b.save_content == CONTENT_EXACT ? "holds exactly" : "DIFFERS FROM");
	failed |= b.save_content != CONTENT_EXACT;

	for (unsigned i = 0; i < p->baseline_runs; i++) {
		double s;

		if (run_baseline(&b, &s))
			return bench_end(&b, 1);
		b.baseline[b.nbaseline++] = s;
		progress(&b, "baseline %u/%u: %.4f s", i + 1, p->baseline_runs, s);
	}
	{
		double tmp[16];

		memcpy(tmp, b.baseline, sizeof(tmp));
		b.baseline_s = median(tmp, b.nbaseline);
	}

	nconds = (size_t)(p->cache[0] + p->cache[1]) * p->nlat;
	b.runs = calloc(nconds * NAMES, sizeof(*b.runs));
	b.tracks = calloc(ORG_COUNT, sizeof(*b.tracks));
	if (!b.runs || !b.tracks) {
		set_err(&b, "out of memory");
		return bench_end(&b, 1);
	}
	failed |= run_all(&b, nconds);

	if (p->json) {
		print_json(&b, failed ? 1 : 0);
		b.printed = true;
	} else
		print_table(&b);
	progress(&b, "done");
	return bench_end(&b, failed ? 1 : 0);
}

#define USAGE                                                                              \
	"Usage: " PROG " COMMAND [options]   (" PROG " COMMAND --help)\n"                       \
	"  micro   the paper's microbenchmark: organisations and peers, restore overhead\n"     \
	"  fault   the cost of one fault answered from storage against this machine's limit\n"   \
	"  clones  N clones of one snapshot: the clone service against N independent restores\n" \
	"  --version  the version\n"

int main(int argc, char **argv)
{
	const char *cmd = argc >= 2 ? argv[1] : NULL;
	char msg[300];

	if (cmd && !strcmp(cmd, "micro"))
		return micro(argc - 1, argv + 1);
	if (cmd && !strcmp(cmd, "fault"))
		return cmd_fault(argc - 1, argv + 1);
	if (cmd && !strcmp(cmd, "clones"))
		return cmd_clones(argc - 1, argv + 1);
	if (cmd && (!strcmp(cmd, "--help") || !strcmp(cmd, "-h"))) {
		printf(USAGE);
		return 0;
	}
	if (cmd && !strcmp(cmd, "--version"))
		return halite_cli_version(PROG);
	if (!cmd)
		snprintf(msg, sizeof(msg), "missing COMMAND: micro, fault or clones (" PROG
			 " --help)");
	else if (cmd[0] == '-')
		snprintf(msg, sizeof(msg), "unknown option '%.*s' (" PROG " --help)",
			 (int)strcspn(cmd, "="), cmd);
	else
		snprintf(msg, sizeof(msg), "unknown command '%s': micro, fault or clones (" PROG
			 " --help)", cmd);
	fprintf(stderr, PROG ": %s\n", msg);
	if (halite_cli_has_json(argc, argv))
		halite_cli_json_fail(stdout, msg, 2);
	return 2;
}
