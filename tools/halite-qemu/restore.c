// SPDX-License-Identifier: MIT
/*
 * halite-qemu restore: start QEMU from a halite-qemu snapshot; the guest
 * runs at once and its memory comes in lazily.
 *
 * 1. The file is opened and checked (regions, device state, vCPUs) before
 *    anything starts.
 * 2. QEMU starts with the user's command line plus -S, -incoming defer and
 *    a QMP socket of ours. Its guest RAM is emptied (nothing QEMU wrote
 *    while starting may survive: fallocate PUNCH_HOLE on a shared backend,
 *    an injected madvise(MADV_DONTNEED) on private RAM) and registered for missing-page faults through a userfaultfd
 *    created inside QEMU, whose copy QEMU keeps: if this process dies,
 *    QEMU's faults block rather than reading zeros.
 * 3. The restore engine starts (fault thread, demand readers, install
 *    pool, prefetcher; the file's device RAM, video memory, is read into
 *    memory of ours before it returns: HALITE_MEM_COPY), then the file's
 *    device state is fed to QEMU as a device-only incoming migration
 *    (header, CONFIGURATION, device sections, EOF: no RAM section). Loading
 *    it already touches RAM; those faults are served like any other. Once
 *    it is loaded the device RAM is where the guest sees it (its BAR is
 *    programmed), which tells its address in QEMU: it is written there.
 * 4. cont (hq_vm_settle: confirmed by query-status): the guest runs,
 *    milliseconds after QEMU was ready; the time is reported. A guest saved
 *    paused (the file's qemu.run-state) stays paused unless --running, as
 *    virsh restore does; --paused or -S leaves any guest paused. Faults
 *    and the throttled prefetcher bring in the rest.
 * 5. All memory in: the engine unregisters, QEMU's copy of the descriptor
 *    is closed, the report is printed; then either wait for QEMU to exit
 *    (default, like running QEMU itself) or leave it running (--detach).
 *
 * If the restore fails (a locality block that fails its checksum), the
 * guest is blocked on memory that will never come: QEMU is killed. So may
 * QEMU's main loop be, in the middle of loading the device state: every
 * wait on QEMU gives up as soon as the engine has failed (give_up()), and
 * the engine's error is the one reported (explain_failure()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fault.h"
#include "handoff.h"
#include "inside.h"
#include "io.h"
#include "records.h"
#include "restore_run.h"
#include "runstate.h"

static int fail(struct restore_run *r, int ret, const char *what, const char *detail)
{
	/* QEMU's own words when its error reply is the cause (the last QMP call's). */
	if (!r->err[0] && r->b.vm.qmp && hq_qmp_qemu_error(r->b.vm.qmp)[0])
		snprintf(r->qemu_err, sizeof(r->qemu_err), "%s", hq_qmp_qemu_error(r->b.vm.qmp));
	return hq_fail(r->err, sizeof(r->err), ret, what, detail);
}

/*
 * Whether to stop waiting on QEMU: the engine failed (QEMU then waits for
 * memory that will never come, its main loop too while it loads the device
 * state, so QMP answers nothing) or SIGINT/SIGTERM came. Every wait on QEMU
 * once the engine runs polls it: the QMP client every HQ_QMP_POLL_MS (set
 * as its abort function), the device state's write, the load's polling
 * loop, the final wait for the engine. Returns the reason (< 0), or 0.
 */
static int give_up(void *ctx)
{
	struct restore_run *r = ctx;
	int ret;

	if (hq_stop_signal)
		return -ECANCELED;
	if (!r->engine_running)
		return 0;
	ret = halite_restore_wait(r->rs, 0);
	return ret == -ETIMEDOUT ? 0 : ret < 0 ? ret : 0;
}

/*
 * The run state the file records (qemu.run-state; files from before it was
 * recorded: running), and the one to leave the guest in: the recorded one
 * unless --running or --paused (or -S) says otherwise, as virsh restore.
 */
static int file_run_state(struct restore_run *r, const struct halite_reader *rd)
{
	static const char key[] = "qemu.run-state";
	char v[32] = "running";
	const void *val;
	uint32_t len;

	if (!halite_reader_meta_find(rd, key, &val, &len))
		snprintf(v, sizeof(v), "%.*s", (int)(len < sizeof(v) ? len : sizeof(v) - 1),
			 (const char *)val);
	if (strcmp(v, "running") && strcmp(v, "paused") && r->p.run == RUN_AS_SAVED) {
		snprintf(r->err, sizeof(r->err), "%s: %s '%s' is neither running nor paused: "
			 "choose with --running or --paused", r->p.path, key, v);
		return -HALITE_E_CORRUPT;
	}
	r->file_paused = !strcmp(v, "paused");
	r->paused = r->p.run == RUN_AS_SAVED ? r->file_paused : r->p.run == RUN_PAUSED;
	return 0;
}

/* What the file holds, checked before QEMU starts. */
static int check_file(struct restore_run *r)
{
	struct halite_reader *rd = NULL;
	int ret;

	/*
	 * HALITE_LOCK_PROTOCOL (format.h): no save may replace the file from
	 * now on. The engine takes the same lock, but only once QEMU has
	 * started and its RAM is ready, a window in which a save could replace
	 * the file checked here. Advisory: a failure only loses that check.
	 */
	/* An object of an S3 store is pinned by its ETag instead (io_s3.c). */
	r->lock_fd = halite_io_is_s3_path(r->p.path) ? -1 : open(r->p.path, O_RDONLY | O_CLOEXEC);
	if (r->lock_fd >= 0 && flock(r->lock_fd, LOCK_SH | LOCK_NB) && r->p.out.verbose)
		hq_errorf("restore: %s: flock: %s", r->p.path, strerror(errno));
	ret = hq_bring_read(&r->b, false, &rd);
	if (ret)
		return ret;
	ret = file_run_state(r, rd);
	/*
	 * Kept for the engine (halite_restore_opts.same_as): it restores the
	 * version checked here, and an object costs no second open.
	 */
	r->check_rd = rd;
	r->file_known = !ret;
	return ret;
}

/*
 * The command line QEMU runs, given or the file's, checked before anything
 * starts (hq_config_prepare()), its host forwards taken out.
 */
static int prepare_cmdline(struct restore_run *r)
{
	const char *bin = getenv("HALITE_QEMU");
	int ret;

	ret = hq_config_prepare(&r->b.cfg, r->p.qemu_argv, r->p.qemu_argc,
				bin && *bin ? bin : QEMU_DEFAULT, !r->p.no_cmdline_check, r->p.path,
				r->err, sizeof(r->err));
	if (ret && !r->err[0])
		fail(r, ret, "QEMU's command line", strerror(-ret));
	/* -daemonize at save: QEMU was to run on by itself, as --detach leaves it. */
	if (!ret && (r->b.cfg.replay_flags & HQ_REPLAY_DAEMONIZE))
		r->p.detach = true;
	return ret;
}

/*
 * A snapshot read from a store: its frozen disks, when the store holds them
 * beside it, brought into the host's cache (diskfetch.h), each guest then on
 * its own overlay of the copy. Their overlays go to --disk-dir, else to the
 * current directory: they are the guest's disk from now on, not the cache's.
 */
static int fetch_disks(struct restore_run *r, const char **dir)
{
	static char cwd[PATH_MAX];
	int ret;

	if (!halite_io_is_s3_path(r->p.path))
		return 0;
	/* check_file()'s reader, open until the engine's: the uuid keys the cache. */
	ret = hq_diskfetch_bring(&r->fetch, r->p.path, halite_reader_info(r->check_rd)->uuid,
				 r->b.disks, r->err, sizeof(r->err));
	if (ret)
		return ret;
	for (int i = 0; i < r->b.disks->n; i++)
		if (r->fetch.d[i].damaged)
			hq_errorf("restore: warning: disk %s: the cached copy failed its check "
				  "(size or SHA-256): fetched again", r->b.disks->d[i].name);
	if (r->fetch.used && !*dir) {
		if (!getcwd(cwd, sizeof(cwd)))
			return fail(r, -errno, "the current directory (for the disks' overlays; "
				    "--disk-dir DIR puts them elsewhere)", strerror(errno));
		*dir = cwd;
	}
	return 0;
}

/*
 * The disks the file froze, each checked unchanged, given a new overlay,
 * and the command line pointed at it, before QEMU starts.
 */
static int prepare_disks(struct restore_run *r)
{
	const char *base = strrchr(r->p.path, '/') ? strrchr(r->p.path, '/') + 1 : r->p.path;
	const char *dir = r->p.disk_dir;
	char tag[128], when[32];
	time_t now = time(NULL);
	int ret, frozen;

	if (!r->b.cfg.rec_disks)
		return 0;
	r->b.disks = calloc(1, sizeof(*r->b.disks));
	if (!r->b.disks)
		return fail(r, -ENOMEM, "out of memory", NULL);
	ret = hq_disks_parse(r->b.cfg.rec_disks, r->b.disks, r->err, sizeof(r->err));
	if (ret)
		return ret;
	frozen = hq_bring_frozen(&r->b);
	if (!frozen || r->p.no_disks) {
		if (hq_disks_writable(r->b.disks))
			hq_errorf("restore: warning: %s: the guest runs on its disks as they are "
				  "now, not as they were at the snapshot", frozen ?
				  "--no-disks" : "the snapshot was saved with --no-disks");
		if (frozen)
			for (int i = 0; i < r->b.disks->n; i++)
				r->b.disks->d[i].frozen = false;
		return 0;
	}
	strftime(when, sizeof(when), "%Y%m%d-%H%M%S", localtime(&now));
	snprintf(tag, sizeof(tag), "%.*s-restore-%s", (int)strcspn(base, "."), base, when);
	ret = fetch_disks(r, &dir);
	if (!ret)
		ret = hq_bring_disks(&r->b, dir, tag);
	if (ret == -ENOENT && halite_io_is_s3_path(r->p.path) && !r->fetch.used) {
		size_t n = strlen(r->err);

		snprintf(r->err + n, sizeof(r->err) - n, " (the store holds no disks beside %s: "
			 "pushed with --no-disks?)", r->p.path);
	}
	return ret;
}

static int spawn_qemu(struct restore_run *r)
{
	struct hq_spawn s = { .cfg = &r->b.cfg, .log = r->p.qemu_log, .detach = r->p.detach,
			      .stdout_to_stderr = r->p.out.json };
	char qmp[128], own[96];

	snprintf(qmp, sizeof(qmp), "%s/qmp.sock", r->dir);
	s.qmp = qmp;
	/* Ours until we detach: its last lines explain a failure. */
	if (!s.log && r->p.detach) {
		snprintf(own, sizeof(own), "%s/qemu.log", r->dir);
		s.log = own;
	}
	r->spawned = true;
	if (r->p.qemu_log) {
		struct stat sb;

		r->log_start = stat(r->p.qemu_log, &sb) ? 0 : sb.st_size;
	}
	return hq_bring_spawn(&r->b, &s);
}

/* Connect to our QMP socket while watching that QEMU has not died starting. */
static int attach_qemu(struct restore_run *r)
{
	char sock[128], see[PATH_MAX + 32];

	snprintf(sock, sizeof(sock), "%s/qmp.sock", r->dir);
	snprintf(see, sizeof(see), "its messages %s%s",
		 r->p.qemu_log ? "in " : r->p.detach ? "below" : "above",
		 r->p.qemu_log ? r->p.qemu_log : "");
	return hq_bring_attach(&r->b, sock, QMP_START_TIMEOUT_MS, 0, see, give_up, r);
}

/* The engine's regions: @vm's RAM pieces. */
static void engine_regions(const struct hq_vm *vm, struct halite_restore_region *reg)
{
	for (uint32_t i = 0; i < vm->nregions; i++) {
		const struct hq_region *g = &vm->regions[i];

		reg[i] = (struct halite_restore_region){
			.name = g->name, .host = g->host, .length = g->length,
			.kind = g->anon ? HALITE_MEM_ANON : HALITE_MEM_SHARED, .fd = g->fd,
			.fd_offset = g->fd_offset,
		};
	}
}

/*
 * Each device RAM region of the file has a RAM block of its name and length
 * in this QEMU (where the guest sees it is known only once the device state
 * is loaded: write_device_ram()); @reg gets the engine's copies of them,
 * memory of ours, after the guest RAM's @nram regions.
 */
/*
 * The engine's regions for the file's device RAM, from @reg[@nram] on:
 * memory of ours the engine fills at start (no QEMU needed: a take-over
 * starts serving faults before it asks QEMU anything).
 */
static int devram_regions(struct restore_run *r, struct halite_restore_region *reg,
			  uint32_t nram)
{
	for (uint32_t i = 0; i < r->b.f.ndevram; i++) {
		/* Fresh: the engine writes only what the file stores, the rest reads zeros. */
		int ret = hq_snapfile_devram_map(&r->b.f, i, r->err, sizeof(r->err));

		if (ret)
			return ret;
		reg[nram + i] = (struct halite_restore_region){
			.name = r->b.f.devram[i].name, .host = (uintptr_t)r->b.f.devram[i].copy,
			.length = r->b.f.devram[i].length, .kind = HALITE_MEM_COPY, .fd = -1,
		};
	}
	return 0;
}

/*
 * Once the device state is loaded, before the guest runs: each device RAM
 * region of the file (the engine filled its copy at start) written over
 * its block in QEMU, found where the guest now sees it.
 */
static int write_device_ram(struct restore_run *r)
{
	uint64_t t0 = hq_now_ns();
	int ret;

	if (!r->b.f.ndevram) {
		r->devram_done = true;
		return 0;
	}
	ret = hq_bring_write_devram(&r->b, &r->devram_written);
	if (ret)
		return ret;
	r->devram_ns = hq_now_ns() - t0;
	r->devram_done = true;
	return 0;
}

/*
 * This QEMU is the file's machine (hq_bring_check_machine()), its RAM the
 * file's (hq_bring_find_ram()); @reg gets the engine's regions. RAM on
 * hugetlbfs is restored by huge page (halite/restore/huge.c), but not beside a
 * device that punches holes in it: hugetlbfs cannot refuse them.
 */
static int check_vm(struct restore_run *r, struct halite_restore_region *reg)
{
	bool dev_checked = false;
	int ret;

	ret = hq_bring_check_machine(&r->b);
	if (!ret)
		ret = hq_bring_find_ram(&r->b);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < r->b.vm.nregions; i++) {
		struct hq_region *g = &r->b.vm.regions[i];

		if (g->hugetlb && !dev_checked) {
			const char *dev = hq_vm_discard_device(&r->b.vm);

			dev_checked = true;
			if (dev) {
				snprintf(r->err, sizeof(r->err), "guest RAM %s is on hugetlbfs, and "
					 "the %s device's hole punches in it cannot be refused there "
					 "during the restore (a page discarded before it is in would "
					 "be filled again): remove the device, or give the guest a "
					 "memfd or tmpfs backend", g->block, dev);
				return -HALITE_E_UNSUPPORTED;
			}
		}
	}
	engine_regions(&r->b.vm, reg);
	return devram_regions(r, reg, r->b.vm.nregions);
}

/* A new QEMU waiting for the file's state, its RAM matched with the file's and emptied. */
static int prepare_ram(struct restore_run *r, struct halite_restore_region *reg)
{
	int ret = hq_bring_check_incoming(&r->b);

	if (!ret)
		ret = check_vm(r, reg);
	return ret ? ret : hq_bring_empty_ram(&r->b);
}

/* The engine on QEMU @vm's RAM pieces @reg. */
static int start_restore(struct restore_run *r, struct hq_vm *vm,
			 const struct halite_restore_region *reg)
{
	HALITE_OPTS(halite_restore_opts, o);
	int ret;

	/*
	 * Taking over: the userfaultfd the dead handler had QEMU make, still
	 * QEMU's, with the registration on it. Else a new one, made inside QEMU.
	 */
	r->uffd = r->p.attach ? hq_vm_find_uffd(vm, &r->remote_uffd) :
		  hq_vm_uffd(vm, &r->remote_uffd);
	if (r->uffd < 0)
		return fail(r, r->uffd, vm->err, NULL);
	o.flags = (r->p.track ? HALITE_RESTORE_TRACK_ACCESS : 0) |
		  (r->p.no_prefetch ? HALITE_RESTORE_NO_PREFETCH : 0) |
		  (r->p.attach ? HALITE_RESTORE_ATTACH : 0) |
		  (r->p.bypass_cache ? HALITE_RESTORE_DIRECT : 0) |
		  (r->p.learn ? HALITE_RESTORE_LEARN : 0) |
		  (r->p.hot_prefix_set && !r->p.hot_prefix ? HALITE_RESTORE_NO_HOT : 0);
	o.hot_prefix_max = r->p.hot_prefix;
	o.learn_window_ms = r->p.learn ? r->p.learn_window_ms : 0;
	o.read_latency_us = r->p.read_latency_us;
	o.prefetch_idle_us = r->p.prefetch_idle_us;
	o.prefetch_min_rate = (uint64_t)r->p.prefetch_rate_mib << 20;
	o.vcpu_tids = vm->vcpu_tids;
	o.nvcpus = vm->nvcpus;
	o.owner_pid = vm->pid;
	o.owner_uffd = r->uffd;
	o.trace_path = r->p.learn ? r->p.learn : r->p.trace;
	o.log = hq_log;
	o.log_ctx = &r->p.out;
	o.log_level = r->p.out.verbose ? HALITE_LOG_DEBUG : HALITE_LOG_WARN;
	o.same_as = r->check_rd;
	ret = halite_restore_open(&r->rs, r->p.path, reg, vm->nregions + r->b.f.ndevram, &o);
	halite_reader_free(r->check_rd);
	r->check_rd = NULL;
	if (ret == -EINVAL)
		return fail(r, ret, "the file's memory regions do not match this QEMU's "
			    "(same -m and memory backend ids as at save?)", NULL);
	if (ret)
		return fail(r, ret, r->p.path, halite_strerror(ret));
	ret = halite_restore_start(r->rs);
	if (ret)
		return fail(r, ret, "starting the restore", halite_restore_errmsg(r->rs)[0] ?
			    halite_restore_errmsg(r->rs) : halite_strerror(ret));
	r->engine_running = true;
	r->t_ready = hq_now_ns();
	/* For a take-over, should this handler die: what it serves (handoff.c). */
	if (!r->p.attach) {
		char err[256];

		r->handoff = !hq_handoff_write(vm, r->p.path, err, sizeof(err));
		if (!r->handoff)
			hq_errorf("restore: warning: no record for a take-over (%s): should this "
				  "handler die, 'restore --attach' needs QEMU's QMP to answer", err);
	}
	return 0;
}

/* Feed the device state to QEMU, wait for the load. */
static int load_devices(struct restore_run *r)
{
	int ret = hq_bring_load_devices(&r->b, r->dir, INCOMING_TIMEOUT_MS, give_up, r,
					"(no reason given; see QEMU's messages)");

	if (!ret)
		r->t_loaded = hq_now_ns();
	return ret;
}

/* Progress on stderr (--progress): the memory brought in so far. */
static void progress(struct restore_run *r, bool final)
{
	struct halite_restore_stats st;
	int mode = hq_progress_mode(&r->p.out);
	double elapsed = (double)(hq_now_ns() - r->t_ready) / 1e9;
	uint64_t in, bytes;
	char a[32], b[32];

	if (mode == HALITE_PROGRESS_NONE || !r->rs)
		return;
	halite_restore_stats(r->rs, &st);
	in = st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero;
	bytes = st.mb_total ? r->b.f.mem_bytes / st.mb_total * in : 0;
	if (mode == HALITE_PROGRESS_JSON) {
		struct halite_cli_progress pr = {
			.op = "restore", .phase = "memory", .elapsed_s = elapsed,
			.bytes = (int64_t)bytes, .total = (int64_t)r->b.f.mem_bytes,
			.faults = (int64_t)st.faults, .done = final,
		};

		halite_cli_progress_json(stderr, &pr);
		return;
	}
	hq_progressf(false, "restore: %3" PRIu64 "%%  %s of %s  %" PRIu64 " faults  %" PRIu64
		     "/%" PRIu64 " LBs  %.1f s%s", st.mb_total ? 100 * in / st.mb_total : 0,
		     hq_bytes(bytes, a, sizeof(a)), hq_bytes(r->b.f.mem_bytes, b, sizeof(b)),
		     st.faults, st.lb_demand + st.lb_prefetch, st.lb_total, elapsed,
		     final ? "\n" : "");
}

/*
 * The error to report for a failed step: the engine's when it failed (the
 * step only noticed: QEMU blocked on memory that will never come answers no
 * QMP, and a timeout or "given up" would hide why), unless it failed
 * because QEMU is gone (-ESRCH: its memory's owner has exited), which is
 * the step's own story; "restore stopped" for SIGINT/SIGTERM.
 */
static int explain_failure(struct restore_run *r, int ret)
{
	int eng = r->engine_running ? halite_restore_wait(r->rs, 0) : 0;

	if (eng < 0 && eng != -ETIMEDOUT && eng != -ESRCH) {
		snprintf(r->err, sizeof(r->err), "%s", halite_restore_errmsg(r->rs)[0] ?
			 halite_restore_errmsg(r->rs) : halite_strerror(eng));
		return eng;
	}
	if (ret == -ECANCELED && hq_stop_signal) {
		snprintf(r->err, sizeof(r->err), "restore stopped: %s", strsignal(hq_stop_signal));
		return ret;
	}
	if (!r->err[0])
		snprintf(r->err, sizeof(r->err), "%s", halite_strerror(ret));
	return ret;
}

/*
 * --attach: the QEMU whose restore lost its handler (halite-qemu restore
 * killed). Its QMP sockets are on its command line; the userfaultfd, with
 * the registration, is still QEMU's (start_restore() takes it and the
 * engine takes the restore over: what is in stays, the rest comes, the
 * faults the dead handler had read are raised again). Device state: loaded
 * already, or, if the handler died before it asked for the load, loaded
 * now; one cut short cannot be loaded again (QEMU ends such a load).
 */
/* QEMU's RAM as QMP finds it is what the record said and the engine serves. */
static int same_ram(struct restore_run *r)
{
	const struct hq_vm *h = r->handed;

	for (uint32_t i = 0; i < r->b.vm.nregions; i++) {
		const struct hq_region *g = &r->b.vm.regions[i], *k = NULL;

		for (uint32_t j = 0; j < h->nregions && !k; j++)
			if (!strcmp(h->regions[j].name, g->name))
				k = &h->regions[j];
		if (!k || k->host != g->host || k->length != g->length || k->anon != g->anon)
			return fail(r, -EPROTO, "QEMU's RAM is not what the restore's record says",
				    g->name);
	}
	return r->b.vm.nregions == h->nregions ? 0 :
	       fail(r, -EPROTO, "QEMU's RAM is not what the restore's record says", NULL);
}

static int take_over(struct restore_run *r, struct halite_restore_region *reg)
{
	static const char *const need[] = { "query-cpus-fast", "human-monitor-command",
					    "migrate-incoming", "query-migrate", "cont", NULL };
	char socks[8][108], st[32], err[512] = "";
	const char *mst;
	cJSON *mig = NULL;
	int n, ret = -ENOENT;

	/*
	 * Faults first, from the dead restore's record: until they are served,
	 * a thread of QEMU's waiting for memory may keep QMP from answering.
	 */
	r->handed = calloc(1, sizeof(*r->handed));
	if (!r->handed)
		return fail(r, -ENOMEM, "out of memory", NULL);
	ret = hq_handoff_read(r->p.attach, r->p.path, r->handed, err, sizeof(err));
	if (ret && ret != -ENOENT)
		return fail(r, ret, err, NULL);
	if (!ret) {
		struct halite_restore_region hreg[HQ_MAX_REGIONS];

		engine_regions(r->handed, hreg);
		ret = devram_regions(r, hreg, r->handed->nregions);
		if (!ret)
			ret = start_restore(r, r->handed, hreg);
		if (ret)
			return ret;
	}
	n = hq_qmp_sockets(r->p.attach, socks, 8);
	for (int i = 0; i < n; i++) {
		/*
		 * One that another client holds answers nothing: the next one.
		 * Once faults are served, QEMU may take a moment to catch up.
		 */
		ret = hq_vm_attach(&r->b.vm, socks[i], r->engine_running ? 10000 : 1000, need);
		if (!ret && r->b.vm.pid == r->p.attach)
			break;
		if (!ret)
			ret = -EPROTO;
		hq_vm_release(&r->b.vm);
	}
	if (ret) {
		snprintf(r->err, sizeof(r->err), "QEMU (pid %d): %s", (int)r->p.attach, n ?
			 "none of its QMP unix sockets answered (another client on each?)" :
			 "no QMP unix socket on its command line (is it a QEMU?)");
		return ret;
	}
	hq_qmp_set_abort(r->b.vm.qmp, give_up, r);
	r->t_qmp = hq_now_ns();
	/* The engine serves the record's RAM, its files open (and append-only: ours). */
	r->b.vm.ram_find_only = r->engine_running;
	ret = hq_vm_status(&r->b.vm, st, sizeof(st));
	if (ret)
		return fail(r, ret, r->b.vm.err, NULL);
	ret = check_vm(r, reg);
	if (!ret && r->engine_running)
		ret = same_ram(r);
	else if (!ret)
		ret = start_restore(r, &r->b.vm, reg);
	/*
	 * Loaded, and the guest never ran since (the dead handler writes device
	 * RAM before cont): it may have died before it wrote it. Written again,
	 * it is the same; once the guest runs it is the guest's.
	 */
	if (!ret && strcmp(st, "inmigrate") && strcmp(st, "running"))
		return write_device_ram(r);
	if (ret || strcmp(st, "inmigrate"))
		return ret;
	ret = hq_qmp_call(r->b.vm.qmp, "query-migrate", NULL, &mig, HQ_QMP_TIMEOUT_MS);
	if (ret)
		return fail(r, ret, "query-migrate", hq_qmp_errmsg(r->b.vm.qmp));
	mst = cJSON_GetStringValue(cJSON_GetObjectItem(mig, "status"));
	ret = !mst || !strcmp(mst, "none") ? 0 : -HALITE_E_STATE;
	if (ret)
		fail(r, ret, "QEMU was loading the device state when the handler died, and cannot "
		     "load it again: stop it, and restore anew", mst);
	cJSON_Delete(mig);
	if (!ret)
		ret = load_devices(r);
	return ret ? ret : write_device_ram(r);
}

static int run(struct restore_run *r)
{
	struct halite_restore_region reg[HQ_MAX_REGIONS + HQ_MAX_DEVRAM];
	uint64_t last_prog;
	char tmpl[] = "/tmp/halite-qemu.XXXXXX";
	int ret;

	/* What killed runs left (a killed restore cannot clean up after itself). */
	hq_tmpdirs_prune();
	ret = check_file(r);
	if (ret)
		return ret;
	if (!mkdtemp(tmpl))
		return fail(r, -errno, "mkdtemp", strerror(errno));
	snprintf(r->dir, sizeof(r->dir), "%s", tmpl);
	if (r->p.attach) {
		ret = take_over(r, reg);
		/* Forwards the dead handler had not added yet. */
		if (!ret)
			ret = hq_config_forward_pid(r->p.attach, r->b.vm.qmp, r->err, sizeof(r->err));
		if (ret >= 0) {
			r->nforwards = ret;
			r->t_forwarded = hq_now_ns();
			ret = 0;
		}
	} else {
		ret = prepare_cmdline(r);
		if (!ret)
			ret = prepare_disks(r);
		if (!ret)
			ret = spawn_qemu(r);
		if (!ret)
			ret = attach_qemu(r);
		if (!ret)
			r->t_qmp = hq_now_ns();
		if (!ret)
			ret = prepare_ram(r, reg);
		if (!ret)
			ret = start_restore(r, &r->b.vm, reg);
		/* Test fault die-before-load: the handler killed with the device state not loaded. */
		if (!ret && hq_fault("die-before-load"))
			raise(SIGKILL);
		if (!ret)
			ret = load_devices(r);
		if (!ret)
			ret = write_device_ram(r);
		/* Loaded and not yet running: connections from now on wait for the guest (hostfwd.c). */
		if (!ret)
			ret = hq_config_forward(&r->b.cfg, r->b.vm.qmp, r->err, sizeof(r->err));
		if (ret >= 0) {
			r->t_forwarded = hq_now_ns();
			r->nforwards = ret;
			ret = 0;
		}
	}
	if (ret)
		return explain_failure(r, ret);
	/* cont, confirmed by query-status (a cont whose reply is lost may have run or not). */
	ret = hq_vm_settle(&r->b.vm, !r->paused, HQ_QMP_TIMEOUT_MS, &r->t_resume);
	if (ret)
		return explain_failure(r, fail(r, ret, r->paused ? "the guest did not stay "
					      "paused" : "resuming the guest", r->b.vm.err));
	if (!r->t_resume)
		r->t_resume = hq_now_ns();
	last_prog = r->t_resume;
	for (;;) {
		if (hq_stop_signal) {
			progress(r, true);
			return fail(r, -ECANCELED, "restore stopped", strsignal(hq_stop_signal));
		}
		ret = halite_restore_wait(r->rs, 250);
		if (ret != -ETIMEDOUT)
			break;
		if (hq_progress_due(&r->p.out, &last_prog, hq_now_ns()))
			progress(r, false);
	}
	r->t_done = hq_now_ns();
	halite_restore_stats(r->rs, &r->st);
	progress(r, true);
	if (ret)
		return fail(r, ret, halite_restore_errmsg(r->rs)[0] ? halite_restore_errmsg(r->rs) :
			    halite_strerror(ret), NULL);
	/* Every range is unregistered: QEMU's copy of the descriptor has no more use. */
	if (hq_vm_close_remote(&r->b.vm, r->remote_uffd) == 0)
		r->remote_uffd = -1;
	return 0;
}

int hq_cmd_restore(int argc, char **argv)
{
	struct restore_run *r = calloc(1, sizeof(*r));
	int ret, st, code;

	if (!r) {
		hq_errorf("restore: out of memory");
		return EXIT_FAIL;
	}
	hq_out_init(&r->p.out, "restore", argc, argv);
	if (restore_parse_args(argc, argv, &r->p)) {
		if (hq_usage_report(&r->p.out, r->err, sizeof(r->err)))
			restore_report_json(r, EXIT_USAGE);
		free(r);
		return EXIT_USAGE;
	}
	r->t0 = hq_now_ns();
	r->b = (struct hq_bring){ .path = r->p.path, .err = r->err, .errlen = sizeof(r->err),
				  .qemu_err = r->qemu_err, .qemu_errlen = sizeof(r->qemu_err) };
	r->uffd = r->remote_uffd = r->lock_fd = -1;
	for (unsigned i = 0; i < HQ_MAX_REGIONS; i++)
		r->b.vm.regions[i].fd = -1;
	hq_catch_stop_signals();
	ret = run(r);
	if (ret && r->b.qemu > 0 && waitpid(r->b.qemu, &st, WNOHANG) == r->b.qemu) {
		size_t n = strlen(r->err);

		r->b.qemu = 0;
		snprintf(r->err + n, sizeof(r->err) - n, " (QEMU exited, %s %d%s)",
			 WIFEXITED(st) ? "status" : "signal",
			 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
			 r->p.detach && !r->p.qemu_log ? "; its messages below" : "");
	}
	/* Gone on its own (reaped here, or by the wait for its QMP socket): why, in its words. */
	if (ret && r->spawned && !r->b.qemu)
		restore_qemu_last_words(r);
	if (ret && r->p.attach && r->uffd >= 0) {
		size_t n = strlen(r->err);

		snprintf(r->err + n, sizeof(r->err) - n, " (QEMU is left as it was: its guest "
			 "waits for the memory it lacks)");
	}
	if (ret)
		hq_errorf("restore: %s", r->err);
	if (ret && r->p.detach && !r->p.qemu_log && r->dir[0])
		restore_show_qemu_log(r);
	restore_report(r, ret);
	if (ret && r->b.qemu > 0) {
		/* Blocked on memory that will not come, or never started: it goes. */
		kill(r->b.qemu, SIGKILL);
		waitpid(r->b.qemu, NULL, 0);
		r->b.qemu = 0;
	}
	if (ret && r->b.disks && r->b.ndisks && !r->p.attach) {
		/* Overlays the guest never wrote go; one it ran on holds its writes: it stays. */
		if (!r->t_resume)
			hq_disks_remove_overlays(r->b.disks);
		else
			for (int i = 0; i < r->b.disks->n; i++)
				if (r->b.disks->d[i].overlay_made)
					hq_errorf("restore: disk %s: the guest ran on %s, kept",
						  r->b.disks->d[i].name, r->b.disks->d[i].overlay);
	}
	halite_restore_free(r->rs);
	/* The restore is over, done or failed: nothing left to take over. */
	if (r->handoff || (r->p.attach && !ret))
		hq_handoff_remove(r->p.attach ? r->p.attach : r->b.vm.pid);
	if (r->handed) {
		hq_vm_release(r->handed);
		free(r->handed);
	}
	/* The engine is gone: the copies of device RAM are ours again. */
	hq_bring_free(&r->b);
	if (r->uffd >= 0)
		close(r->uffd);
	if (r->lock_fd >= 0)
		close(r->lock_fd);
	halite_reader_free(r->check_rd);
	hq_vm_release(&r->b.vm);
	if (r->dir[0]) {
		char p[96];

		snprintf(p, sizeof(p), "%s/qmp.sock", r->dir);
		unlink(p);
		snprintf(p, sizeof(p), "%s/in.sock", r->dir);
		unlink(p);
		snprintf(p, sizeof(p), "%s/qemu.log", r->dir);
		unlink(p);
		rmdir(r->dir);
	}
	code = hq_exit_code(ret);
	if (!ret && !r->p.detach && r->b.qemu > 0) {
		/* Like running QEMU: its exit is ours. */
		while (waitpid(r->b.qemu, &st, 0) < 0 && errno == EINTR)
			if (hq_stop_signal)
				kill(r->b.qemu, SIGTERM), hq_stop_signal = 0;
		code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	}
	/* A private cache of the disks goes; a QEMU still running holds what it opened. */
	hq_diskfetch_done(&r->fetch);
	free(r);
	return code;
}
