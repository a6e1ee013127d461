/* SPDX-License-Identifier: MIT */
/*
 * halite-cycle: the main job. Snapshot a running guest lazily, restore it
 * lazily, check the result byte for byte, and report.
 *
 * One run, on the synthetic guest (testing/synth/synth.h):
 * 1. A guest runs the paper's microbenchmark (sequential over each vCPU's
 *    working set, 16-page physical stride, data compressing to about 50%,
 *    30% of accesses writing) for a short warm-up.
 * 2. Snapshot instant: the guest is paused (timed), a ground-truth copy of
 *    its memory is taken (not timed: it is not part of a save), each
 *    vCPU's step in its workload is stored as the file's device state (what
 *    a VMM saves of its vCPUs), the save engine is armed (timed) and the
 *    guest resumed; the save runs to
 *    completion while the vCPUs keep running. That guest is then stopped
 *    and freed.
 * 3. A new guest with the same options plus SYNTH_F_ATTACH (empty memory,
 *    the same layout and CR3s) is the restore's target. Its vCPUs only read
 *    (write_pct 0) and page-table A/D bits are pre-set (no SYNTH_F_AD_BITS),
 *    so nothing but the restore writes its memory and the final memory must
 *    equal the snapshot exactly. The restore is opened with
 *    HALITE_RESTORE_TRACK_ACCESS (the paper's "VM access %") and started,
 *    and the vCPUs, moved to the steps the device state holds, are started
 *    at once: their first walk faults on the root table, which the restore
 *    brings in.
 * 4. Once the restore is done the vCPUs are stopped and the memory compared
 *    with the ground truth, page by page.
 *
 * With --trace FILE the workload is that access trace (docs/trace-format.md)
 * instead: the guest sized from it, the snapshot at each vCPU's exact
 * midpoint instead of after a warm-up, and the restored vCPUs replaying the
 * rest of it with its writes turned into reads (a copy of the trace, made
 * next to the snapshot file), so the memory must still equal the snapshot.
 *
 * Output: a short report on stdout, or with --json one JSON object. Progress
 * on stderr for phases that last more than a second. Exit 0 when the cycle
 * completed and the memory is exact, 1 when anything failed or differs, 2 on
 * usage errors, 77 when the kernel lacks a userfaultfd feature the engines
 * need.
 *
 * A failed restore leaves vCPU threads of this process blocked on memory
 * that will never be filled, and halite_restore_free() would then turn
 * their faults into SIGSEGV (restore.h): on that path the program reports
 * and exits without freeing the restore, which ends the threads with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "bench_util.h"
#include "cli.h"
#include "endian_util.h"
#include "stats.h"
#include "synth.h"
#include "trace_file.h"

#define PROG "halite-cycle"
#define MIB ((uint64_t)1 << 20)
#define SAVE_WRITE_PCT 30u
#define WARMUP_MS 500u
/* How often the first-access watch looks at the vCPUs' counters. */
#define POLL_NS 20000l
#define CHECK_CHUNK ((uint64_t)4 << 20)

struct params {
	uint64_t size_mib;
	unsigned vcpus;
	int codec;
	const char *dir;
	const char *trace;	/* --trace: the workload */
	const char *restore_trace; /* --restore-trace: the engine's trace_path */
	bool json;
	bool keep;
	uint64_t seed;
	unsigned timeout_s; /* per wait: save, restore */
};

struct save_res {
	uint64_t pause_ns, arm_ns;
	struct halite_save_stats st;
	uint64_t file_bytes;
	uint64_t faults_vcpu[SYNTH_MAX_VCPUS]; /* from the file's save-stats section */
	bool have_vcpu_faults;
	/* Memory blocks stored per stream, from the LB table. */
	uint64_t mb_stream_vcpu[SYNTH_MAX_VCPUS], mb_stream_virtual, mb_stream_physical,
		mb_stream_other;
};

struct restore_res {
	uint64_t open_ns, start_ns, resume_ns; /* resume: open + start + vCPUs started */
	uint64_t first_access_ns, all_first_access_ns; /* after the vCPUs started; 0: not seen */
	uint64_t done_ns;			     /* open to halite_restore_wait() returning */
	struct halite_restore_stats st;
	bool sums_ok, lbs_ok;
	uint64_t vcpu_accesses, vcpu_xlate_faults;
};

struct cycle {
	struct params p;
	char *path;
	char *ro_trace;		/* --trace without its writes: the restored guest's */
	struct trace_info ti;
	uint8_t *snap;
	uint64_t mem_bytes;
	uint64_t ws_bytes;   /* per vCPU */
	struct save_res save;
	struct restore_res rst;
	bool saved, restored, checked;
	uint64_t pages, pages_wrong, first_wrong;
	/* Each vCPU's step at the snapshot instant: the device state saved and restored. */
	uint64_t pos[SYNTH_MAX_VCPUS];
	char err[512];
};

/* --- small helpers --- */

static void set_err(struct cycle *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct cycle *c, const char *fmt, ...)
{
	va_list ap;

	if (c->err[0])
		return; /* the first failure is the one to report */
	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000l };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static double sec(uint64_t ns)
{
	return (double)ns / 1e9;
}

/*
 * Progress: phase_begin() notes the time, phase_tick() (from wait loops,
 * about once a second) and phase_end() print only once the phase has taken
 * more than a second, so short runs stay quiet.
 */
struct phase {
	const char *name;
	uint64_t t0;
	bool shown;
};

static void phase_begin(struct phase *ph, const char *name)
{
	ph->name = name;
	ph->t0 = halite_now_ns();
	ph->shown = false;
}

static void phase_tick(struct phase *ph, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void phase_tick(struct phase *ph, const char *fmt, ...)
{
	uint64_t el = halite_now_ns() - ph->t0;
	va_list ap;

	if (el < 1000000000ull)
		return;
	fprintf(stderr, PROG ": %s: %.0f s", ph->name, sec(el));
	if (fmt) {
		fputs(", ", stderr);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
	}
	fputc('\n', stderr);
	ph->shown = true;
}

static void phase_end(struct phase *ph)
{
	uint64_t el = halite_now_ns() - ph->t0;

	if (ph->shown || el >= 1000000000ull)
		fprintf(stderr, PROG ": %s: done in %.2f s\n", ph->name, sec(el));
}

/* --- the guest --- */

static void guest_opts(const struct cycle *c, struct synth_opts *so, bool attach)
{
	const struct params *p = &c->p;

	/* Everything that shapes memory is the same for both guests. */
	*so = (struct synth_opts){
		.sz = sizeof(*so), .mem_bytes = p->size_mib * MIB, .nvcpus = p->vcpus,
		.stride = 16, .compress_pct = 50, .pattern = SYNTH_PAT_SEQ,
		.backing = SYNTH_MEM_ANON, .seed = p->seed, .log_fn = halite_log_stderr,
		.write_pct = attach ? 0 : SAVE_WRITE_PCT, .flags = attach ? SYNTH_F_ATTACH : 0,
	};
	if (p->trace) {
		so->pattern = SYNTH_PAT_TRACE;
		so->trace_in = attach ? c->ro_trace : p->trace;
		so->map_bytes = so->ws_bytes = c->ti.map_bytes;
	}
}

static int make_guest(struct cycle *c, bool attach, struct synth_guest **g,
		      struct synth_info *info, pid_t *tids, uint64_t *cr3, unsigned *levels)
{
	struct synth_opts so;
	int ret;

	guest_opts(c, &so, attach);
	ret = synth_create(g, &so);
	if (ret) {
		set_err(c, "creating the %sguest (synth_create): %s", attach ? "restore's " : "",
			strerror(-ret));
		return ret;
	}
	ret = synth_info(*g, info);
	for (unsigned v = 0; !ret && v < c->p.vcpus; v++) {
		struct synth_vcpu_info vi;

		ret = synth_vcpu_info(*g, v, &vi);
		if (!ret) {
			tids[v] = vi.tid;
			cr3[v] = vi.cr3;
			*levels = vi.paging_levels;
			c->ws_bytes = vi.ws_units * SYNTH_PAGE_SIZE;
		}
	}
	if (ret)
		set_err(c, "synth_info: %s", strerror(-ret));
	return ret;
}

/* --- save --- */

/* What the file itself says: faults per vCPU stream, stored blocks per stream. */
static void read_file_stats(struct cycle *c)
{
	struct save_res *sv = &c->save;
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	char key[32];

	if (halite_reader_open(&rd, c->path, NULL))
		return; /* the restore will say what is wrong with the file */
	fi = halite_reader_info(rd);
	sv->file_bytes = fi->file_size;
	for (uint64_t lb = 0; lb < fi->lb_count; lb++) {
		struct halite_lb_info li;

		if (halite_reader_lb_info(rd, lb, &li))
			continue;
		switch (HALITE_STREAM_KIND(li.stream)) {
		case HALITE_STREAM_VCPU:
			if (HALITE_STREAM_INDEX(li.stream) < SYNTH_MAX_VCPUS)
				sv->mb_stream_vcpu[HALITE_STREAM_INDEX(li.stream)] += li.mb_count;
			break;
		case HALITE_STREAM_VIRTUAL: sv->mb_stream_virtual += li.mb_count; break;
		case HALITE_STREAM_PHYSICAL: sv->mb_stream_physical += li.mb_count; break;
		default: sv->mb_stream_other += li.mb_count; break;
		}
	}
	sv->have_vcpu_faults = true;
	for (unsigned v = 0; v < c->p.vcpus; v++) {
		bool found = false;

		snprintf(key, sizeof(key), "faults_vcpu%u", v);
		for (uint32_t i = 0; i < halite_reader_stat_count(rd); i++) {
			const char *k;
			uint64_t val;

			if (!halite_reader_stat(rd, i, &k, &val) && !strcmp(k, key)) {
				sv->faults_vcpu[v] = val;
				found = true;
			}
		}
		sv->have_vcpu_faults &= found;
	}
	halite_reader_free(rd);
}

/*
 * The synthetic guest's "device state": where each vCPU is in its workload,
 * as a VMM saves registers at the pause (little-endian u64 per vCPU).
 */
static int save_vcpu_state(struct cycle *c, struct synth_guest *g, struct halite_save *s)
{
	uint8_t buf[8 * SYNTH_MAX_VCPUS];
	int ret;

	for (unsigned v = 0; v < c->p.vcpus; v++) {
		struct synth_vcpu_stats vs;

		ret = synth_vcpu_stats(g, v, &vs);
		if (ret) {
			set_err(c, "synth_vcpu_stats: %s", strerror(-ret));
			return ret;
		}
		c->pos[v] = vs.accesses;
		halite_put_le64(buf + 8 * v, vs.accesses);
	}
	ret = halite_save_set_device_state(s, buf, 8ull * c->p.vcpus);
	if (ret)
		set_err(c, "halite_save_set_device_state: %s", halite_strerror(ret));
	return ret;
}

static int run_save(struct cycle *c)
{
	struct save_res *sv = &c->save;
	struct synth_guest *g = NULL;
	struct synth_info info;
	struct halite_save *s = NULL;
	pid_t tids[SYNTH_MAX_VCPUS];
	uint64_t cr3[SYNTH_MAX_VCPUS], t0, tmo_ns;
	unsigned levels = 4;
	struct phase ph;
	int ret;

	phase_begin(&ph, "creating the guest");
	ret = make_guest(c, false, &g, &info, tids, cr3, &levels);
	if (ret)
		goto out;
	phase_end(&ph);
	c->mem_bytes = info.mem_bytes;
	c->snap = malloc(info.mem_bytes);
	if (!c->snap) {
		ret = -ENOMEM;
		set_err(c, "no memory for the ground-truth copy (%" PRIu64 " MiB)",
			info.mem_bytes / MIB);
		goto out;
	}

	/* The engine is created before the pause: creation is not part of the snapshot instant. */
	{
		HALITE_OPTS(halite_save_opts, o);
		struct halite_save_region reg = {
			.name = SYNTH_REGION_NAME, .gpa = info.gpa_base, .length = info.mem_bytes,
			.host = (uintptr_t)info.host_addr, .kind = HALITE_MEM_ANON, .fd = -1,
		};

		o.codec = c->p.codec;
		o.vcpu_tids = tids;
		o.nvcpus = c->p.vcpus;
		o.log = halite_log_stderr;
		o.log_level = HALITE_LOG_WARN;
		ret = halite_save_create(&s, c->path, &reg, 1, &o);
		if (ret) {
			set_err(c, "halite_save_create %s: %s", c->path, halite_strerror(ret));
			goto out;
		}
	}
	for (unsigned v = 0; v < c->p.vcpus; v++) {
		struct halite_root root = { v, levels, cr3[v] };

		ret = halite_save_add_root(s, &root);
		if (ret) {
			set_err(c, "halite_save_add_root: %s (%s)", halite_strerror(ret),
				halite_save_errmsg(s));
			goto out;
		}
	}

	/* A trace: each vCPU stopped at its exact midpoint, let go on after the pause. */
	for (unsigned v = 0; c->p.trace && !ret && v < c->p.vcpus; v++)
		ret = synth_vcpu_limit(g, v, c->ti.nrec[v] / 2);
	ret = ret ? ret : synth_start(g);
	if (ret) {
		set_err(c, "synth_start: %s", strerror(-ret));
		goto out;
	}
	if (c->p.trace)
		synth_wait_done(g, c->p.timeout_s * 1000u);
	else
		sleep_ms(WARMUP_MS);

	/* The snapshot instant. */
	t0 = halite_now_ns();
	ret = synth_pause(g);
	sv->pause_ns = halite_now_ns() - t0;
	if (ret) {
		set_err(c, "synth_pause: %s", strerror(-ret));
		goto out;
	}
	ret = synth_copy_memory(g, c->snap); /* ground truth, not timed */
	if (ret) {
		set_err(c, "synth_copy_memory: %s", strerror(-ret));
		goto out;
	}
	ret = save_vcpu_state(c, g, s);
	for (unsigned v = 0; c->p.trace && !ret && v < c->p.vcpus; v++)
		ret = synth_vcpu_limit(g, v, 0);
	if (ret)
		goto out;
	t0 = halite_now_ns();
	ret = halite_save_arm(s);
	sv->arm_ns = halite_now_ns() - t0;
	if (ret) {
		set_err(c, "halite_save_arm: %s (%s)", halite_strerror(ret), halite_save_errmsg(s));
		goto out;
	}
	ret = synth_resume(g);
	if (ret) {
		set_err(c, "synth_resume: %s", strerror(-ret));
		goto out;
	}

	phase_begin(&ph, "saving while the guest runs");
	tmo_ns = (uint64_t)c->p.timeout_s * 1000000000ull;
	for (;;) {
		ret = halite_save_wait(s, 1000);
		if (ret != -ETIMEDOUT)
			break;
		halite_save_stats(s, &sv->st);
		if (halite_now_ns() - ph.t0 >= tmo_ns) {
			set_err(c, "the save did not finish in %u s (%" PRIu64 " of %" PRIu64
				" memory blocks saved); --timeout to wait longer",
				c->p.timeout_s, sv->st.mb_saved, sv->st.mb_total);
			halite_save_cancel(s);
			goto out;
		}
		if (sv->st.mb_saved < sv->st.mb_total)
			phase_tick(&ph, "%" PRIu64 " of %" PRIu64 " memory blocks saved",
				   sv->st.mb_saved, sv->st.mb_total);
		else
			phase_tick(&ph, "every memory block saved, finishing the file");
	}
	halite_save_stats(s, &sv->st);
	if (ret) {
		set_err(c, "the save failed: %s (%s)", halite_strerror(ret), halite_save_errmsg(s));
		goto out;
	}
	phase_end(&ph);
	sv->file_bytes = sv->st.file_bytes;
	read_file_stats(c);
	c->saved = true;
out:
	halite_save_free(s);
	if (g) {
		synth_stop(g);
		synth_free(g);
	}
	return ret;
}

/* --- restore --- */

/* Report a failed restore and end the process: see the note at the top. */
static void __attribute__((noreturn)) restore_died(struct cycle *c, struct halite_restore *r,
						   int ret, const char *what)
{
	fprintf(stderr, PROG ": %s: %s (%s)\n", what, halite_strerror(ret),
		r ? halite_restore_errmsg(r) : "");
	if (c->p.json) {
		char msg[512];

		snprintf(msg, sizeof(msg), "%s: %s (%s)", what, halite_strerror(ret),
			 r ? halite_restore_errmsg(r) : "");
		halite_cli_json_fail(stdout, msg, 1);
	}
	fflush(stdout);
	if (!c->p.keep)
		unlink(c->path);
	_exit(1);
}

/* Each vCPU's first access done (any kind: a failed translation counts too). */
static void watch_first_access(struct cycle *c, struct synth_guest *g, struct halite_restore *r,
			       uint64_t t_run)
{
	struct restore_res *rr = &c->rst;
	bool seen[SYNTH_MAX_VCPUS] = { false };
	unsigned left = c->p.vcpus;
	uint64_t limit = t_run + 5000000000ull; /* past that, the restore wait decides */
	struct timespec ts = { 0, POLL_NS };

	while (left) {
		uint64_t now;

		for (unsigned v = 0; v < c->p.vcpus; v++) {
			struct synth_vcpu_stats vs;

			if (seen[v] || synth_vcpu_stats(g, v, &vs) || vs.accesses <= c->pos[v])
				continue;
			now = halite_now_ns();
			seen[v] = true;
			left--;
			if (!rr->first_access_ns)
				rr->first_access_ns = now - t_run;
			if (!left)
				rr->all_first_access_ns = now - t_run;
		}
		if (!left || halite_now_ns() > limit || halite_restore_wait(r, 0) != -ETIMEDOUT)
			break;
		nanosleep(&ts, NULL);
	}
}

static int check_memory(struct cycle *c, struct synth_guest *g)
{
	uint8_t *buf = malloc(CHECK_CHUNK);
	int ret = 0;

	if (!buf) {
		set_err(c, "no memory for the check");
		return -ENOMEM;
	}
	c->pages = c->mem_bytes / SYNTH_PAGE_SIZE;
	for (uint64_t off = 0; off < c->mem_bytes; off += CHECK_CHUNK) {
		uint64_t n = c->mem_bytes - off < CHECK_CHUNK ? c->mem_bytes - off : CHECK_CHUNK;

		ret = synth_copy_range(g, off, n, buf);
		if (ret) {
			set_err(c, "synth_copy_range: %s", strerror(-ret));
			break;
		}
		for (uint64_t p = 0; p < n; p += SYNTH_PAGE_SIZE) {
			if (memcmp(buf + p, c->snap + off + p, SYNTH_PAGE_SIZE)) {
				if (!c->pages_wrong)
					c->first_wrong = (off + p) / SYNTH_PAGE_SIZE;
				c->pages_wrong++;
			}
		}
	}
	free(buf);
	c->checked = !ret;
	return ret;
}

/*
 * The restored vCPUs resume where the saved ones were. They are moved there
 * before the clock starts (fast-forwarding the synthetic guest's random
 * state is its own cost, not the restore's); once the file is open its
 * device state must say the same.
 */
static int seek_vcpus(struct cycle *c, struct synth_guest *g)
{
	for (unsigned v = 0; v < c->p.vcpus; v++) {
		int ret = synth_vcpu_seek(g, v, c->pos[v]);

		if (ret) {
			set_err(c, "synth_vcpu_seek: %s", strerror(-ret));
			return ret;
		}
	}
	return 0;
}

static int check_device_state(struct cycle *c, struct halite_restore *r)
{
	const void *data;
	uint64_t len;
	int ret;

	ret = halite_restore_device_state(r, &data, &len);
	if (ret || len != 8ull * c->p.vcpus) {
		set_err(c, "the file's device state: %s", ret ? halite_strerror(ret) :
			"not one 8-byte step per vCPU");
		return ret ? ret : -EINVAL;
	}
	for (unsigned v = 0; v < c->p.vcpus; v++) {
		uint64_t step = halite_get_le64((const uint8_t *)data + 8 * v);

		if (step != c->pos[v]) {
			set_err(c, "vCPU %u: the file's device state says step %" PRIu64
				", the save was at %" PRIu64, v, step, c->pos[v]);
			return -EINVAL;
		}
	}
	return 0;
}

static int run_restore(struct cycle *c)
{
	struct restore_res *rr = &c->rst;
	struct halite_restore_stats *st = &rr->st;
	struct synth_guest *g = NULL;
	struct synth_info info;
	struct halite_restore *r = NULL;
	pid_t tids[SYNTH_MAX_VCPUS];
	uint64_t cr3[SYNTH_MAX_VCPUS], t_open, t1, t_run, tmo_ns;
	unsigned levels = 4;
	struct phase ph;
	int ret;

	phase_begin(&ph, "creating the restore's empty guest");
	ret = make_guest(c, true, &g, &info, tids, cr3, &levels);
	if (!ret)
		ret = seek_vcpus(c, g);
	if (ret)
		goto out;
	phase_end(&ph);
	if (info.mem_bytes != c->mem_bytes) {
		ret = -EINVAL;
		set_err(c, "the restore's guest has %" PRIu64 " bytes, the saved one %" PRIu64,
			info.mem_bytes, c->mem_bytes);
		goto out;
	}

	{
		HALITE_OPTS(halite_restore_opts, o);
		struct halite_restore_region reg = { SYNTH_REGION_NAME, (uintptr_t)info.host_addr,
						     info.mem_bytes, HALITE_MEM_ANON, -1, 0 };

		o.flags = HALITE_RESTORE_TRACK_ACCESS;
		o.vcpu_tids = tids;
		o.nvcpus = c->p.vcpus;
		o.log = halite_log_stderr;
		o.log_level = HALITE_LOG_WARN;
		o.trace_path = c->p.restore_trace;
		t_open = halite_now_ns();
		ret = halite_restore_open(&r, c->path, &reg, 1, &o);
		t1 = halite_now_ns();
		rr->open_ns = t1 - t_open;
		if (ret) {
			set_err(c, "halite_restore_open %s: %s", c->path, halite_strerror(ret));
			goto out;
		}
	}
	ret = check_device_state(c, r);
	if (ret)
		goto out;
	ret = halite_restore_start(r);
	rr->start_ns = halite_now_ns() - t1;
	if (ret) {
		set_err(c, "halite_restore_start: %s (%s)", halite_strerror(ret),
			halite_restore_errmsg(r));
		goto out;
	}
	ret = synth_start(g);
	t_run = halite_now_ns();
	rr->resume_ns = t_run - t_open;
	if (ret)
		restore_died(c, r, ret, "synth_start of the restored guest");

	phase_begin(&ph, "restoring while the guest runs");
	watch_first_access(c, g, r, t_run);
	tmo_ns = (uint64_t)c->p.timeout_s * 1000000000ull;
	for (;;) {
		ret = halite_restore_wait(r, 1000);
		if (ret != -ETIMEDOUT)
			break;
		halite_restore_stats(r, st);
		if (halite_now_ns() - ph.t0 >= tmo_ns) {
			fprintf(stderr, PROG ": the restore did not finish in %u s (%" PRIu64 " of %"
				PRIu64 " LBs read); --timeout to wait longer\n", c->p.timeout_s,
				st->lb_demand + st->lb_prefetch, st->lb_total);
			restore_died(c, r, ret, "the restore");
		}
		phase_tick(&ph, "%" PRIu64 " of %" PRIu64 " locality blocks read",
			   st->lb_demand + st->lb_prefetch, st->lb_total);
	}
	rr->done_ns = halite_now_ns() - t_open;
	halite_restore_stats(r, st);
	if (ret)
		restore_died(c, r, ret, "the restore");
	phase_end(&ph);
	rr->sums_ok = st->mb_fault + st->mb_pool + st->mb_prefetch + st->mb_zero == st->mb_total;
	rr->lbs_ok = st->lb_demand + st->lb_prefetch == st->lb_total;
	c->restored = true;

	ret = synth_stop(g);
	if (ret) {
		set_err(c, "synth_stop: %s", strerror(-ret));
		goto out;
	}
	for (unsigned v = 0; v < c->p.vcpus; v++) {
		struct synth_vcpu_stats vs;

		if (!synth_vcpu_stats(g, v, &vs)) {
			rr->vcpu_accesses += vs.accesses;
			rr->vcpu_xlate_faults += vs.faults;
		}
	}
	phase_begin(&ph, "comparing memory with the snapshot");
	ret = check_memory(c, g);
	phase_end(&ph);
out:
	halite_restore_free(r);
	synth_free(g);
	return ret;
}

/* --- output --- */

static bool cycle_ok(const struct cycle *c)
{
	return c->saved && c->restored && c->checked && !c->pages_wrong && c->rst.sums_ok &&
	       c->rst.lbs_ok && !c->rst.vcpu_xlate_faults && !c->err[0];
}

static double us(uint64_t ns)
{
	return (double)ns / 1e3;
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0.0;
}

static void print_json(const struct cycle *c)
{
	const struct params *p = &c->p;
	const struct save_res *sv = &c->save;
	const struct halite_save_stats *ss = &sv->st;
	const struct restore_res *rr = &c->rst;
	const struct halite_restore_stats *rs = &rr->st;

	printf("{\"ok\": %s, \"exit\": %d, \"error\": ", cycle_ok(c) ? "true" : "false",
	       cycle_ok(c) ? 0 : 1);
	if (c->err[0])
		bench_json_str(c->err);
	else if (!cycle_ok(c))
		bench_json_str("the check failed: the restored guest is not the snapshot's");
	else
		printf("null");
	printf(",\n \"guest\": {\"mem_bytes\": %" PRIu64 ", \"vcpus\": %u, \"stride\": 16, "
	       "\"compress_pct\": 50, \"pattern\": \"%s\", \"backing\": \"anon\", "
	       "\"ws_bytes_per_vcpu\": %" PRIu64 ", \"save_write_pct\": %u, "
	       "\"restore_write_pct\": 0, \"warmup_ms\": %u, \"seed\": %" PRIu64 ", \"trace\": ",
	       p->size_mib * MIB, p->vcpus, p->trace ? "trace" : "seq", c->ws_bytes,
	       p->trace ? 0 : SAVE_WRITE_PCT, p->trace ? 0 : WARMUP_MS, p->seed);
	if (p->trace) {
		printf("{\"path\": ");
		bench_json_str(p->trace);
		printf(", \"records\": %" PRIu64 ", \"snapshot_positions\": [", c->ti.records);
		for (unsigned v = 0; v < p->vcpus; v++)
			printf("%s%" PRIu64, v ? ", " : "", c->pos[v]);
		printf("]}},\n");
	} else {
		printf("null},\n");
	}
	printf(" \"file\": {\"path\": ");
	bench_json_str(c->path);
	printf(", \"kept\": %s, \"codec\": \"%s\"},\n", p->keep && c->saved ? "true" : "false",
	       halite_codec_name(p->codec));
	if (!c->saved) {
		printf(" \"save\": null, \"restore\": null, \"content\": null}\n");
		return;
	}
	/*
	 * arm_us is halite_save_arm() as the guest sees it (the call, thread
	 * starts included); engine_arm_us what the engine records as arm_ns.
	 */
	printf(" \"save\": {\"pause_us\": %.1f, \"arm_us\": %.1f, \"engine_arm_us\": %.1f, "
	       "\"pause_to_arm_us\": %.1f, "
	       "\"duration_s\": %.4f, \"file_bytes\": %" PRIu64 ", \"file_memory_ratio\": %.4f, "
	       "\"raw_bytes\": %" PRIu64 ", \"stored_bytes\": %" PRIu64
	       ", \"compression_ratio\": %.3f, "
	       "\"mb_total\": %" PRIu64 ", \"mb_stored\": %" PRIu64 ", \"mb_zero\": %" PRIu64
	       ", \"mb_untouched\": %" PRIu64 ", \"mb_background\": %" PRIu64
	       ", \"faults\": %" PRIu64 ", \"faults_vcpu\": %" PRIu64 ", \"faults_other\": %" PRIu64
	       ", \"faults_per_vcpu\": ",
	       us(sv->pause_ns), us(sv->arm_ns), us(ss->arm_ns), us(sv->pause_ns + sv->arm_ns),
	       sec(ss->duration_ns), sv->file_bytes, ratio(sv->file_bytes, c->mem_bytes),
	       ss->raw_bytes, ss->stored_bytes, ratio(ss->raw_bytes, ss->stored_bytes),
	       ss->mb_total, ss->mb_stored, ss->mb_zero, ss->mb_untouched, ss->mb_background,
	       ss->faults, ss->faults_vcpu, ss->faults_other);
	if (sv->have_vcpu_faults) {
		putchar('[');
		for (unsigned v = 0; v < p->vcpus; v++)
			printf("%s%" PRIu64, v ? ", " : "", sv->faults_vcpu[v]);
		putchar(']');
	} else {
		printf("null");
	}
	printf(", \"stored_mbs_per_stream\": {");
	for (unsigned v = 0; v < p->vcpus; v++)
		printf("\"vcpu%u\": %" PRIu64 ", ", v, sv->mb_stream_vcpu[v]);
	printf("\"virtual\": %" PRIu64 ", \"physical\": %" PRIu64 ", \"other\": %" PRIu64 "}, "
	       "\"fault_p50_us\": %.2f, \"fault_p99_us\": %.2f},\n",
	       sv->mb_stream_virtual, sv->mb_stream_physical, sv->mb_stream_other,
	       us(ss->fault_p50_ns), us(ss->fault_p99_ns));
	if (!c->restored) {
		printf(" \"restore\": null, \"content\": null}\n");
		return;
	}
	printf(" \"restore\": {\"open_us\": %.1f, \"start_us\": %.1f, \"time_to_resume_us\": %.1f, "
	       "\"first_access_us\": ",
	       us(rr->open_ns), us(rr->start_ns), us(rr->resume_ns));
	if (rr->first_access_ns)
		printf("%.1f", us(rr->first_access_ns));
	else
		printf("null");
	printf(", \"all_vcpus_first_access_us\": ");
	if (rr->all_first_access_ns)
		printf("%.1f", us(rr->all_first_access_ns));
	else
		printf("null");
	printf(", \"time_to_done_s\": %.4f, \"ready_us\": %.1f, \"duration_s\": %.4f, "
	       "\"faults\": %" PRIu64 ", \"faults_storage\": %" PRIu64 ", \"faults_memory\": %"
	       PRIu64 ", \"faults_zero\": %" PRIu64 ", \"faults_vcpu\": %" PRIu64
	       ", \"lb_total\": %" PRIu64 ", \"lb_demand\": %" PRIu64 ", \"lb_prefetch\": %" PRIu64
	       ", \"lb_retries\": %" PRIu64 ", \"bytes_read\": %" PRIu64
	       ", \"mb_total\": %" PRIu64 ", \"mb_fault\": %" PRIu64 ", \"mb_pool\": %" PRIu64
	       ", \"mb_prefetch\": %" PRIu64 ", \"mb_zero\": %" PRIu64 ", \"mb_sums_exact\": %s"
	       ", \"mb_staged\": %" PRIu64 ", \"mb_staged_accessed\": %" PRIu64
	       ", \"vm_access_pct\": ",
	       sec(rr->done_ns), us(rs->ready_ns), sec(rs->duration_ns), rs->faults,
	       rs->faults - rs->faults_cached - rs->faults_zero, rs->faults_cached,
	       rs->faults_zero, rs->faults_vcpu, rs->lb_total, rs->lb_demand, rs->lb_prefetch,
	       rs->lb_retries, rs->bytes_read, rs->mb_total, rs->mb_fault, rs->mb_pool,
	       rs->mb_prefetch, rs->mb_zero, rr->sums_ok ? "true" : "false", rs->mb_staged,
	       rs->mb_staged_accessed);
	if (rs->vm_access_pct >= 0)
		printf("%.2f", rs->vm_access_pct);
	else
		printf("null");
	printf(", \"fault_p50_us\": %.2f, \"fault_p99_us\": %.2f, \"vcpu_accesses\": %" PRIu64
	       ", \"vcpu_translation_faults\": %" PRIu64 "},\n",
	       us(rs->fault_p50_ns), us(rs->fault_p99_ns), rr->vcpu_accesses,
	       rr->vcpu_xlate_faults);
	if (!c->checked) {
		printf(" \"content\": null}\n");
		return;
	}
	printf(" \"content\": {\"pages\": %" PRIu64 ", \"pages_wrong\": %" PRIu64
	       ", \"exact\": %s}}\n",
	       c->pages, c->pages_wrong, c->pages_wrong ? "false" : "true");
}

/*
 * The report: one line per measure, values in one column. README.md ("The
 * two commands") says how to read each line; keep the two in step.
 */
static void print_report(const struct cycle *c)
{
	const struct params *p = &c->p;
	const struct save_res *sv = &c->save;
	const struct halite_save_stats *ss = &sv->st;
	const struct restore_res *rr = &c->rst;
	const struct halite_restore_stats *rs = &rr->st;
	char a[32], b[32], d[32];

	printf("guest                %" PRIu64 " MiB, %u vCPU%s, %" PRIu64 " MiB working set each "
	       "(%s, stride 16), seed %" PRIu64 "\n",
	       p->size_mib, p->vcpus, p->vcpus == 1 ? "" : "s", c->ws_bytes / MIB,
	       p->trace ? "the trace's" : "sequential", p->seed);
	if (!c->saved)
		return;
	if (p->trace)
		printf("trace                %s: %" PRIu64 " records, snapshot at each vCPU's "
		       "midpoint\n", p->trace, c->ti.records);
	printf("save                 %s, while the guest runs (%s)\n",
	       halite_codec_name(p->codec), p->trace ? "the trace's writes" :
	       "30% of its accesses write");
	printf("  pause              %s\n", halite_human_ns(sv->pause_ns, a, sizeof(a)));
	printf("  pause->arm         %s (pause %s + arm %s: the guest stood still)\n",
	       halite_human_ns(sv->pause_ns + sv->arm_ns, a, sizeof(a)), halite_human_ns(sv->pause_ns, b, sizeof(b)),
	       halite_human_ns(sv->arm_ns, d, sizeof(d)));
	printf("  save time          %s, arm to file complete\n", halite_human_ns(ss->duration_ns, a, sizeof(a)));
	printf("  file               %.1f MiB, %.1f%% of memory; compression %.2fx\n",
	       (double)sv->file_bytes / MIB, 100.0 * ratio(sv->file_bytes, c->mem_bytes),
	       ratio(ss->raw_bytes, ss->stored_bytes));
	printf("  faults             %" PRIu64 ": %" PRIu64 " saved a block (", ss->faults,
	       ss->faults_vcpu + ss->faults_other);
	if (sv->have_vcpu_faults)
		for (unsigned v = 0; v < p->vcpus; v++)
			printf("vcpu%u %" PRIu64 ", ", v, sv->faults_vcpu[v]);
	else
		printf("vCPUs %" PRIu64 ", ", ss->faults_vcpu);
	printf("other %" PRIu64 "), %" PRIu64 " found it being saved\n", ss->faults_other,
	       ss->faults - ss->faults_vcpu - ss->faults_other);
	printf("  blocks by stream   ");
	for (unsigned v = 0; v < p->vcpus; v++)
		printf("vcpu%u %" PRIu64 ", ", v, sv->mb_stream_vcpu[v]);
	printf("virtual %" PRIu64 ", physical %" PRIu64, sv->mb_stream_virtual,
	       sv->mb_stream_physical);
	if (sv->mb_stream_other)
		printf(", other %" PRIu64, sv->mb_stream_other);
	printf("; %" PRIu64 " zero or untouched\n", ss->mb_zero + ss->mb_untouched);
	printf("  fault p50 / p99    %s / %s\n", halite_human_ns(ss->fault_p50_ns, a, sizeof(a)),
	       halite_human_ns(ss->fault_p99_ns, b, sizeof(b)));
	if (!c->restored)
		return;
	printf("restore              into an empty guest whose vCPUs start at once and only read\n");
	printf("  time to resume     %s (open %s + start %s + vCPUs started)\n",
	       halite_human_ns(rr->resume_ns, a, sizeof(a)), halite_human_ns(rr->open_ns, b, sizeof(b)),
	       halite_human_ns(rr->start_ns, d, sizeof(d)));
	if (rr->first_access_ns)
		printf("  first access       %s after resume (every vCPU: %s)\n",
		       halite_human_ns(rr->first_access_ns, a, sizeof(a)),
		       rr->all_first_access_ns ? halite_human_ns(rr->all_first_access_ns, b, sizeof(b))
					       : "not seen");
	printf("  faults             %" PRIu64 ": %" PRIu64 " from storage, %" PRIu64
	       " from memory, %" PRIu64 " zero\n",
	       rs->faults, rs->faults - rs->faults_cached - rs->faults_zero, rs->faults_cached,
	       rs->faults_zero);
	printf("  LBs                %" PRIu64 " demand + %" PRIu64 " prefetch of %" PRIu64
	       ", %.1f MiB read\n",
	       rs->lb_demand, rs->lb_prefetch, rs->lb_total, (double)rs->bytes_read / MIB);
	printf("  blocks installed   %" PRIu64 " fault + %" PRIu64 " pool + %" PRIu64
	       " prefetch + %" PRIu64 " zero %s %" PRIu64 "%s\n",
	       rs->mb_fault, rs->mb_pool, rs->mb_prefetch, rs->mb_zero, rr->sums_ok ? "=" : "!=",
	       rs->mb_total, rr->sums_ok ? "" : " (WRONG)");
	if (rs->vm_access_pct >= 0)
		printf("  VM access          %.1f%% (%" PRIu64 " of %" PRIu64
		       " blocks that came with a demand read)\n",
		       rs->vm_access_pct, rs->mb_staged_accessed, rs->mb_staged);
	else
		printf("  VM access          not measured (nothing staged)\n");
	printf("  fault p50 / p99    %s / %s\n", halite_human_ns(rs->fault_p50_ns, a, sizeof(a)),
	       halite_human_ns(rs->fault_p99_ns, b, sizeof(b)));
	printf("  time to done       %s after open\n", halite_human_ns(rr->done_ns, a, sizeof(a)));
	if (!c->checked)
		return;
	if (!c->pages_wrong)
		printf("content              exact: %" PRIu64 " pages equal the snapshot\n", c->pages);
	else
		printf("content              WRONG: %" PRIu64 " of %" PRIu64
		       " pages differ (first: frame %" PRIu64 ")\n",
		       c->pages_wrong, c->pages, c->first_wrong);
	if (rr->vcpu_xlate_faults)
		printf("vCPUs                %" PRIu64 " translations failed: they read page tables "
		       "that were not the snapshot's\n", rr->vcpu_xlate_faults);
	if (!rr->lbs_ok)
		printf("LBs                  demand + prefetch != total: an LB read twice or never\n");
	if (p->keep)
		printf("file                 %s (kept)\n", c->path);
}

/* --- main --- */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [--size MiB] [--vcpus N] [--codec CODEC] [--dir DIR] [--keep]\n"
		"                    [--seed N] [--timeout S] [--json]\n"
		"Snapshot a running synthetic guest lazily (halite_save), restore it lazily into\n"
		"an empty guest whose vCPUs run at once (halite_restore), check the memory byte\n"
		"for byte against a copy taken at the snapshot instant, and report.\n"
		"  --size MiB     guest memory, even, 4 .. 65536 (default 256)\n"
		"  --vcpus N      vCPU threads, 1 .. %d (default 2)\n"
		"  --codec CODEC  lz4 (default), zlib, zstd or none\n"
		"  --dir DIR      where the snapshot file goes (default /var/tmp)\n"
		"  --keep         keep the file (DIR/halite-cycle-PID.hlt); else it is removed\n"
		"  --seed N       guest data and access seed, >= 1 (default 1)\n"
		"  --timeout S    give up on a save or restore after S seconds (default 300)\n"
		"  --json         one JSON object on stdout instead of the report (on a\n"
		"                 failure too: \"ok\", \"error\", \"exit\")\n"
		"  --trace FILE   the workload is this access trace (docs/trace-format.md):\n"
		"                 the guest sized from it (--size and --vcpus refused), the\n"
		"                 snapshot at each vCPU's midpoint, the rest replayed read-only\n"
		"  --restore-trace PATH  the restore engine writes what it read and why there\n"
		"                 (docs/restore-trace.md; halite-inspect restore FILE PATH,\n"
		"                 with --keep for FILE)\n"
		"  --version      the version\n"
		"Exit: 0 exact, 1 failed or memory differs, 2 usage, 77 kernel lacks a\n"
		"userfaultfd feature.\n",
		SYNTH_MAX_VCPUS);
}


int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "size", required_argument, NULL, 'm' },
		{ "vcpus", required_argument, NULL, 'v' },
		{ "codec", required_argument, NULL, 'c' },
		{ "dir", required_argument, NULL, 'd' },
		{ "keep", no_argument, NULL, 'k' },
		{ "seed", required_argument, NULL, 's' },
		{ "timeout", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		{ "trace", required_argument, NULL, 'T' },
		{ "restore-trace", required_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	struct cycle c = {
		.p = { .size_mib = 256, .vcpus = 2, .codec = HALITE_CODEC_LZ4, .dir = "/var/tmp",
		       .seed = 1, .timeout_s = 300 },
	};
	bool shape_set = false, json = halite_cli_has_json(argc, argv);
	uint64_t v;
	int opt, ret;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (opt) {
		case 'm':
			if (!bench_parse_u64(optarg, 4, 65536, &v) || v % 2)
				return bench_bad_arg(PROG, json, "--size", optarg,
						     "MiB of guest memory, even, 4 .. 65536");
			c.p.size_mib = v;
			shape_set = true;
			break;
		case 'v':
			if (!bench_parse_u64(optarg, 1, SYNTH_MAX_VCPUS, &v))
				return bench_bad_arg(PROG, json, "--vcpus", optarg,
						     "1 .. 16 vCPUs");
			c.p.vcpus = (unsigned)v;
			shape_set = true;
			break;
		case 'c':
			c.p.codec = halite_codec_parse(optarg);
			if (c.p.codec < 0)
				return bench_bad_arg(PROG, json, "--codec", optarg,
						     "one of lz4, zlib, zstd, none");
			break;
		case 'd': c.p.dir = optarg; break;
		case 'k': c.p.keep = true; break;
		case 's':
			if (!bench_parse_u64(optarg, 1, UINT64_MAX, &v))
				return bench_bad_arg(PROG, json, "--seed", optarg,
						     "a positive integer");
			c.p.seed = v;
			break;
		case 't':
			if (!bench_parse_u64(optarg, 1, 86400, &v))
				return bench_bad_arg(PROG, json, "--timeout", optarg,
						     "seconds, 1 .. 86400");
			c.p.timeout_s = (unsigned)v;
			break;
		case 'j': c.p.json = true; break;
		case 'T': c.p.trace = optarg; break;
		case 'R': c.p.restore_trace = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'V': return halite_cli_version(PROG);
		default: return bench_opt_error(PROG, json, opt, argc, argv, PROG);
		}
	}
	if (optind != argc)
		return bench_fail(PROG, json, 2, "unexpected argument '%s' (" PROG " --help)",
				  argv[optind]);
	if (c.p.trace && shape_set)
		return bench_fail(PROG, json, 2, "--size and --vcpus: with --trace the trace "
				  "decides them");
	if (c.p.trace) {
		char err[400];
		uint64_t mem;

		ret = trace_file_scan(c.p.trace, &c.ti, err, sizeof(err));
		if (!ret)
			ret = trace_guest_mem(&c.ti, c.p.trace, 0, &mem, err, sizeof(err));
		if (ret)
			return bench_fail(PROG, json, ret == -EINVAL ? 2 : 1, "%s", err);
		c.p.vcpus = c.ti.nvcpus;
		c.p.size_mib = mem / MIB;
	}
	ret = bench_preflight(PROG, json, c.p.dir);
	if (ret)
		return ret;
	if (asprintf(&c.path, "%s/" PROG "-%d.hlt", c.p.dir, (int)getpid()) < 0 ||
	    (c.p.trace && asprintf(&c.ro_trace, "%s/" PROG "-%d.trace", c.p.dir,
				   (int)getpid()) < 0))
		return bench_fail(PROG, json, 1, "out of memory");
	if (c.p.trace) {
		ret = trace_file_readonly(c.p.trace, c.ro_trace);
		if (ret) {
			bench_fail(PROG, json, 1, "writing %s: %s", c.ro_trace, strerror(-ret));
			free(c.path);
			free(c.ro_trace);
			return 1;
		}
	}

	ret = run_save(&c);
	if (!ret)
		ret = run_restore(&c);
	if (c.ro_trace)
		unlink(c.ro_trace);
	free(c.ro_trace);
	if (ret == -HALITE_E_UNSUPPORTED) {
		bench_fail(PROG, json, 77, "%s: skipped", c.err);
		unlink(c.path);
		free(c.path);
		free(c.snap);
		return 77;
	}
	if (c.err[0])
		fprintf(stderr, PROG ": %s\n", c.err);
	if (c.p.json)
		print_json(&c);
	else
		print_report(&c);
	if (!c.p.keep || !c.saved)
		unlink(c.path);
	free(c.path);
	free(c.snap);
	return cycle_ok(&c) ? 0 : 1;
}
