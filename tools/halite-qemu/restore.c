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
#include "bring.h"
#include "tool.h"
#include "fault.h"
#include "handoff.h"
#include "inside.h"
#include "records.h"
#include "runstate.h"

#define QEMU_DEFAULT "qemu-system-x86_64"
#define QMP_START_TIMEOUT_MS 60000
#define INCOMING_TIMEOUT_MS 120000
/* --learn: long enough for a guest put to work after resume (bench/qemu.py's requests). */
#define LEARN_WINDOW_DEFAULT_MS 10000u

struct restore_params {
	const char *path;
	char **qemu_argv; /* the user's, from after "--"; none: the file's */
	int qemu_argc;
	bool detach, track, no_prefetch;
	bool bypass_cache;     /* --bypass-cache: the file read with O_DIRECT */
	bool parsed;	       /* the options were taken */
	bool no_cmdline_check; /* --no-cmdline-check */
	bool no_disks;	       /* --no-disks: the command line's disks as they are now */
	const char *disk_dir;  /* --disk-dir: where the disks' overlays go */
	/* --running, --paused (or QEMU's -S); neither: the run state the file records */
	enum { RUN_AS_SAVED, RUN_RUNNING, RUN_PAUSED } run;
	struct hq_out out;
	uint32_t read_latency_us;
	/* --prefetch-idle, --prefetch-rate (MiB/s): the engine's prefetch throttle; 0 = its default */
	uint32_t prefetch_idle_us;
	uint32_t prefetch_rate_mib;
	const char *trace;
	const char *learn;	  /* --learn: the trace of a learning restore */
	uint32_t learn_window_ms; /* --learn-window */
	bool learn_window_set;
	uint64_t hot_prefix;	  /* --hot-prefix: bytes of a relayouted file's hot prefix */
	bool hot_prefix_set;
	const char *qemu_log;
	pid_t attach;	  /* --attach PID: take over that QEMU's restore */
};

struct restore_run {
	struct restore_params p;
	struct hq_bring b; /* the file, QEMU's command line, disks and RAM */
	/* --attach: QEMU's RAM as the restore's record has it, served before QMP is asked */
	struct hq_vm *handed;
	bool handoff;	/* our record for a take-over is written (hq_handoff_write()) */
	struct halite_restore *rs;
	int uffd, remote_uffd;
	int lock_fd; /* the file, LOCK_SH held from the check to the end */
	char dir[64];
	bool file_paused;	/* its qemu.run-state: "paused" (none: running) */
	bool paused;		/* the run state to leave the guest in */
	uint64_t devram_written, devram_ns;
	/* Times from the command's start. */
	uint64_t t0, t_qmp, t_ready, t_loaded, t_forwarded, t_resume, t_done;
	int nforwards; /* host forwards added here, once the state was loaded */
	bool engine_running; /* started: halite_restore_wait() says how it goes */
	struct halite_restore_stats st;
	bool file_known;	/* check_file() read the file */
	bool spawned;		/* QEMU was started (it may have exited since: qemu 0) */
	off_t log_start;	/* --qemu-log's size before QEMU: what it says comes after */
	bool devram_done;	/* the file's device RAM written into QEMU */
	char err[1280];
	char qemu_err[1024];	/* QEMU's own words, when they are the cause */
};

void hq_help_restore(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " restore [OPTIONS] FILE [-- [QEMU-BINARY] QEMU-ARGS...]\n"
		"       " PROG " restore --attach PID [OPTIONS] FILE\n\n"
		"Start QEMU from FILE (saved by '" PROG " save'); the guest runs at once (or\n"
		"stays paused if it was saved paused) and its memory comes in lazily: each first\n"
		"access reads the locality block holding it, and a throttled prefetcher brings\n"
		"in the rest while the guest is quiet.\n"
		"Without QEMU-ARGS, QEMU runs the command line FILE records (the one it ran at\n"
		"save, in its working directory, without -S, -incoming, -loadvm and -daemonize;\n"
		"-daemonize means --detach). QEMU-ARGS, if given, must describe the same machine\n"
		"(-machine, -cpu, -smp, -m, memory backends, devices, NIC models): they are\n"
		"compared with the recorded ones and refused, before QEMU starts, naming what\n"
		"differs; displays, monitors, sockets, file paths and host ports may differ.\n"
		"The RAM's backend may differ: -m alone, memory-backend-ram, or memory-backend-\n"
		"memfd or -file share=on on tmpfs or hugetlbfs (there memory comes in by huge\n"
		"page: a first access waits for all of its page). " PROG " adds -S, -incoming\n"
		"defer and a QMP socket, and adds user networking's hostfwd rules (HMP\n"
		"hostfwd_add) once the guest's state is loaded, just before it runs: a\n"
		"connection then waits for the guest; before, it is refused. QEMU-BINARY\n"
		"defaults to " QEMU_DEFAULT " ($HALITE_QEMU).\n"
		"Disks the save froze run on a new qcow2 overlay of the frozen image, made with\n"
		"qemu-img beside it (--disk-dir): the command line's -drive, -blockdev or -hda\n"
		"naming the image is pointed at the overlay, so each restore of a snapshot gets\n"
		"the disk as it was at the snapshot, and the frozen image is never written. A\n"
		"frozen image written after the snapshot is refused.\n\n"
		"With --attach, take over the restore of QEMU PID from FILE after its\n"
		PROG " restore was killed: the guest waits for memory it lacks (it\n"
		"never reads zeros); the new handler keeps what is in, brings in the rest,\n"
		"loads the device state if it was not yet, puts the guest in its run state,\n"
		"and exits once all memory is in, QEMU running on.\n\n"
		"Options:\n"
		"  --attach PID       take over QEMU PID's restore from FILE (see above)\n"
		"  --detach           exit once all memory is in; QEMU keeps running in its own\n"
		"                     session, its output to --qemu-log (default: wait for QEMU\n"
		"                     to exit, and exit with it)\n"
		"  --qemu-log FILE    QEMU's stdout and stderr go to FILE (appended); with\n"
		"                     --detach the default is a file of ours, shown on failure\n"
		"                     and gone after\n"
		"  --paused           leave the guest paused (QMP cont starts it); memory still\n"
		"                     comes in (also QEMU's -S)\n"
		"  --running          run the guest even if it was saved paused\n"
		"                     (default: the run state it was saved in, as recorded in\n"
		"                     the file; running for files that do not record it)\n"
		"  --no-cmdline-check run QEMU-ARGS even where they differ from the recorded\n"
		"                     command line (QEMU's devices and RAM are still checked)\n"
		"  --disk-dir DIR     put the disks' overlays in DIR (default: beside each image)\n"
		"  --no-disks         run on the command line's disks as they are now, not on\n"
		"                     overlays of the frozen images (unsafe: the guest's memory\n"
		"                     then meets a disk that moved on)\n"
		"  --track-access     measure the VM access %% of demand-read locality blocks\n"
		"                     (blocks are staged; costs a minor fault per staged block used;\n"
		"                     not on hugetlbfs)\n"
		"  --no-prefetch      no background prefetch (memory comes only by faults)\n"
		"  --read-latency US  add US microseconds to every read, 0..1000000 (slow-storage\n"
		"                     experiments)\n"
		"  --prefetch-idle US the prefetcher holds back until no fault came for US\n"
		"                     microseconds, 1..10000000 (default 2000), except to keep up\n"
		"  --prefetch-rate N  N MiB/s at least, 1..1000000 (default 64): a guest that\n"
		"                     keeps faulting gets the CPU and disk first, for longer\n"
		"  --trace FILE       write a restore trace (see 'halite-inspect restore')\n"
		"  --learn FILE       learn the guest: write to FILE a restore trace (version 2)\n"
		"                     with the order in which it first touches each memory block\n"
		"                     after resume, per vCPU, for 'halite-inspect relayout'; while\n"
		"                     learning, memory comes in only as the guest touches it (no\n"
		"                     prefetch). Not with --trace (FILE is the trace) or --attach\n"
		"  --learn-window MS  learn for MS ms from the engine's start (just before the\n"
		"                     guest resumes), 0..3600000 (default 10000); then prefetch\n"
		"                     brings in the rest. 0: until all memory is in, which then\n"
		"                     comes only as the guest touches it\n"
		"  --hot-prefix SIZE  a file made by 'halite-inspect relayout' holds what earlier\n"
		"                     guests touched first in its first locality blocks (its hot\n"
		"                     prefix): read at most SIZE bytes of them first, as the guest\n"
		"                     resumes, not held back by faults (K, M, G suffixes; default\n"
		"                     256M; 0: off, the file is prefetched in order like any other)\n"
		"  --bypass-cache     read FILE with O_DIRECT, around the host's page cache\n"
		"                     (as virsh restore --bypass-cache)\n"
		HQ_HELP_OUT_OPTS("restore")
		"SIGINT or SIGTERM during the restore stops QEMU: the guest cannot run without\n"
		"its memory. If " PROG " is killed outright, the guest blocks (it never\n"
		"reads memory that was not restored) until '" PROG " restore --attach' takes\n"
		"over.\n"
		"Exit status: QEMU's (0 with --detach) once restored; 1 failed, 2 usage,\n"
		"77 the kernel or QEMU lacks a needed feature.\n");
}

/* A number option in [@min, @max] (@max < 2^32); 0, or -1 with a message naming the range. */
static int opt_u32(struct hq_out *o, const char *arg, const char *name, uint64_t min,
		   uint64_t max, const char *unit, uint32_t *out)
{
	uint64_t v;

	if (halite_parse_size(arg, &v) || v < min || v > max)
		return hq_usage(o, "--%s '%s': %llu..%llu %s", name, arg, (unsigned long long)min,
				(unsigned long long)max, unit);
	*out = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct restore_params *p)
{
	static const struct option lo[] = {
		{ "detach", no_argument, NULL, 'd' },
		{ "paused", no_argument, NULL, 'P' },
		{ "running", no_argument, NULL, 'R' },
		{ "track-access", no_argument, NULL, 't' },
		{ "no-prefetch", no_argument, NULL, 'n' },
		{ "read-latency", required_argument, NULL, 'L' },
		{ "prefetch-idle", required_argument, NULL, 'I' },
		{ "prefetch-rate", required_argument, NULL, 'M' },
		{ "trace", required_argument, NULL, 'T' },
		{ "learn", required_argument, NULL, 'E' },
		{ "learn-window", required_argument, NULL, 'W' },
		{ "hot-prefix", required_argument, NULL, 'H' },
		{ "qemu-log", required_argument, NULL, 'O' },
		{ "attach", required_argument, NULL, 'A' },
		{ "no-cmdline-check", no_argument, NULL, 'C' },
		{ "no-disks", no_argument, NULL, 'D' },
		{ "disk-dir", required_argument, NULL, 'K' },
		HQ_OUT_LONGOPTS,
		{ 0 }
	};
	struct hq_out *o = &p->out;
	int c, dd, r;
	uint64_t v;

	/* Our options end at "--"; QEMU's follow. */
	for (dd = 1; dd < argc && strcmp(argv[dd], "--"); dd++)
		;
	optind = 1;
	while ((c = getopt_long(dd, argv, ":qvh", lo, NULL)) != -1) {
		switch (c) {
		case 'd':
			p->detach = true;
			break;
		case 'P':
		case 'R':
			if (p->run != RUN_AS_SAVED)
				return hq_usage(o, "--running or --paused, not both");
			p->run = c == 'R' ? RUN_RUNNING : RUN_PAUSED;
			break;
		case 't':
			p->track = true;
			break;
		case 'n':
			p->no_prefetch = true;
			break;
		case 'L':
			if (opt_u32(o, optarg, "read-latency", 0, 1000000, "us", &p->read_latency_us))
				return -1;
			break;
		case 'I':
			if (opt_u32(o, optarg, "prefetch-idle", 1, 10000000, "us", &p->prefetch_idle_us))
				return -1;
			break;
		case 'M':
			if (opt_u32(o, optarg, "prefetch-rate", 1, 1000000, "MiB/s", &p->prefetch_rate_mib))
				return -1;
			break;
		case 'T':
			p->trace = optarg;
			break;
		case 'E':
			p->learn = optarg;
			break;
		case 'W':
			if (opt_u32(o, optarg, "learn-window", 0, 3600000, "ms", &p->learn_window_ms))
				return -1;
			p->learn_window_set = true;
			break;
		case 'H':
			if (halite_parse_size(optarg, &p->hot_prefix))
				return hq_usage(o, "--hot-prefix '%s': a size in bytes (K, M, G "
						"suffixes), 0 for off", optarg);
			p->hot_prefix_set = true;
			break;
		case 'O':
			p->qemu_log = optarg;
			break;
		case 'C':
			p->no_cmdline_check = true;
			break;
		case 'D':
			p->no_disks = true;
			break;
		case 'K':
			p->disk_dir = optarg;
			break;
		case 'A':
			if (halite_parse_size(optarg, &v) || !v || v > INT32_MAX)
				return hq_usage(o, "--attach '%s': the pid of a QEMU", optarg);
			p->attach = (pid_t)v;
			break;
		case HQ_OPT_BYPASS_CACHE:
			p->bypass_cache = true;
			break;
		case 'h':
			hq_help_restore(stdout);
			exit(EXIT_OK);
		case '?':
			/* QEMU's options given without "--" before them: say how. */
			if (dd == argc) {
				char name[128];

				hq_bad_option(dd, argv, name, sizeof(name));
				if (name[1] != '-')
					return hq_usage(o, "unknown option '%s': QEMU's arguments go "
							"after '--' (" PROG " restore FILE -- "
							"qemu-system-x86_64 ...)", name);
			}
			return hq_out_opt(c, o, dd, argv);
		default:
			r = hq_out_opt(c, o, dd, argv);
			if (r <= 0)
				return r ? r : hq_usage(o, "option '%s' is not handled", argv[optind - 1]);
		}
	}
	if (optind != dd - 1) {
		/* Words after FILE without "--" are QEMU's: say where they go. */
		if (optind < dd - 1 && dd == argc && !p->attach)
			return hq_usage(o, "one FILE only: QEMU's arguments go after '--' (" PROG
					" restore FILE -- qemu-system-x86_64 ...)");
		return hq_usage(o, "%s (" PROG " restore --help)", optind >= dd ? "FILE missing" :
				"one FILE only, then, if any, -- and QEMU's arguments");
	}
	p->path = argv[optind];
	if (p->learn && p->trace)
		return hq_usage(o, "--learn FILE writes the restore trace itself: --learn or --trace, "
				"not both");
	if (p->learn_window_set && !p->learn)
		return hq_usage(o, "--learn-window is for a learning restore: give --learn FILE too");
	if (p->learn && !p->learn_window_set)
		p->learn_window_ms = LEARN_WINDOW_DEFAULT_MS;
	if (p->attach) {
		if (p->learn)
			return hq_usage(o, "--attach takes over a restore whose guest ran already: no "
					"--learn (its first touches are past)");
		/* The QEMU runs already: its command line is its own. */
		if (dd < argc)
			return hq_usage(o, "--attach takes the QEMU that runs already: no '--' and "
					"QEMU arguments");
		if (p->detach || p->qemu_log)
			return hq_usage(o, "--attach leaves QEMU running once memory is in: no "
					"--detach or --qemu-log");
		if (p->no_disks || p->disk_dir)
			return hq_usage(o, "--attach takes the QEMU that runs already on its disks: "
					"no --no-disks or --disk-dir");
		p->parsed = true;
		return 0;
	}
	if (dd == argc) {
		p->parsed = true;
		return 0; /* the command line the file records */
	}
	if (dd == argc - 1)
		return hq_usage(o, "QEMU's command line missing after '--' (none at all: the one "
				"FILE records)");
	p->qemu_argv = argv + dd + 1;
	p->qemu_argc = argc - dd - 1;
	for (int i = 0; i < p->qemu_argc; i++) {
		const char *a = p->qemu_argv[i];

		if (a[0] == '-' && a[1] == '-')
			a++;
		if (!strcmp(a, "-incoming") || !strcmp(a, "-loadvm"))
			return hq_usage(o, "QEMU's %s is " PROG "'s to give", p->qemu_argv[i]);
		if (!strcmp(a, "-daemonize"))
			return hq_usage(o, "not with QEMU's -daemonize: use " PROG " restore "
					"--detach, which leaves QEMU running once memory is in");
		if (!strcmp(a, "-S")) {
			if (p->run == RUN_RUNNING)
				return hq_usage(o, "--running and QEMU's -S (start paused) contradict "
						"each other");
			p->run = RUN_PAUSED;
		}
	}
	p->parsed = true;
	return 0;
}

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

	for (uint32_t i = 0; i < halite_reader_meta_count(rd); i++) {
		const char *k;
		const void *val;
		uint32_t len;

		if (!halite_reader_meta(rd, i, &k, &val, &len) && !strcmp(k, key)) {
			snprintf(v, sizeof(v), "%.*s", (int)(len < sizeof(v) ? len : sizeof(v) - 1),
				 (const char *)val);
			break;
		}
	}
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
	r->lock_fd = open(r->p.path, O_RDONLY | O_CLOEXEC);
	if (r->lock_fd >= 0 && flock(r->lock_fd, LOCK_SH | LOCK_NB) && r->p.out.verbose)
		hq_errorf("restore: %s: flock: %s", r->p.path, strerror(errno));
	ret = hq_bring_read(&r->b, false, &rd);
	if (ret)
		return ret;
	ret = file_run_state(r, rd);
	halite_reader_free(rd);
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
 * The disks the file froze, each checked unchanged, given a new overlay,
 * and the command line pointed at it, before QEMU starts.
 */
static int prepare_disks(struct restore_run *r)
{
	const char *base = strrchr(r->p.path, '/') ? strrchr(r->p.path, '/') + 1 : r->p.path;
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
	return hq_bring_disks(&r->b, r->p.disk_dir, tag);
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
 * hugetlbfs is restored by huge page (restore/huge.c), but not beside a
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
	ret = halite_restore_open(&r->rs, r->p.path, reg, vm->nregions + r->b.f.ndevram, &o);
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

static double ms(uint64_t a, uint64_t b)
{
	return a && b >= a ? (double)(b - a) / 1e6 : -1;
}

/* "disks": [{"qdev", "frozen_image", "overlay"}]: the overlays the guest runs on. */
static void report_disks_json(cJSON *o, const struct restore_run *r)
{
	cJSON *a;

	if (!r->file_known) {
		cJSON_AddNullToObject(o, "disks");
		return;
	}
	a = cJSON_AddArrayToObject(o, "disks");
	for (int i = 0; a && r->b.disks && r->b.ndisks && i < r->b.disks->n; i++) {
		const struct hq_disk *d = &r->b.disks->d[i];
		cJSON *j;

		if (!d->frozen)
			continue;
		j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "qdev", d->qdev);
		cJSON_AddStringToObject(j, "frozen_image", d->image);
		cJSON_AddStringToObject(j, "overlay", d->overlay);
		cJSON_AddItemToArray(a, j);
	}
}

/* @key: milliseconds from @a to @b, null unless both happened. */
static void json_ms(cJSON *o, const char *key, uint64_t a, uint64_t b)
{
	hq_json_fixed(o, key, a && b >= a, ms(a, b), 3);
}

/*
 * The report as one JSON object: on failure the keys a success has, with
 * what was learnt before it failed and null for the rest.
 */
static void report_json(const struct restore_run *r, int code)
{
	struct halite_restore_stats st = r->st;
	bool stats = r->engine_running, file = r->file_known;
	cJSON *o = hq_json_head(code, r->p.path, r->err, r->qemu_err[0] ? r->qemu_err :
				r->b.vm.qemu_err, &r->b.vm);

	if (!o) {
		hq_json_print(NULL);
		return;
	}
	if (stats)
		halite_restore_stats(r->rs, &st);
	json_ms(o, "qmp_ready_ms", r->t0, r->t_qmp);
	json_ms(o, "engine_ready_ms", r->t0, r->t_ready);
	json_ms(o, "devices_loaded_ms", r->t0, r->t_loaded);
	json_ms(o, "resumed_ms", r->t0, r->t_resume);
	json_ms(o, "ready_to_resume_ms", r->t_qmp, r->t_resume);
	hq_json_fixed(o, "done_s", r->t_resume && r->t_done >= r->t_resume,
		      ms(r->t_resume, r->t_done) / 1e3, 3);
	hq_json_u64(o, "memory_bytes", file, r->b.f.mem_bytes - hq_snapfile_devram_bytes(&r->b.f));
	hq_json_u64(o, "faults", stats, st.faults);
	hq_json_u64(o, "faults_vcpu", stats, st.faults_vcpu);
	hq_json_u64(o, "faults_zero", stats, st.faults_zero);
	hq_json_u64(o, "faults_cached", stats, st.faults_cached);
	hq_json_fixed(o, "fault_p50_us", stats, (double)st.fault_p50_ns / 1e3, 1);
	hq_json_fixed(o, "fault_p99_us", stats, (double)st.fault_p99_ns / 1e3, 1);
	hq_json_u64(o, "lb_total", stats, st.lb_total);
	hq_json_u64(o, "lb_demand", stats, st.lb_demand);
	hq_json_u64(o, "lb_prefetch", stats, st.lb_prefetch);
	hq_json_u64(o, "lb_hot", stats, st.lb_hot);
	hq_json_u64(o, "lb_retries", stats, st.lb_retries);
	hq_json_u64(o, "bytes_read", stats, st.bytes_read);
	hq_json_u64(o, "mb_total", stats, st.mb_total);
	hq_json_u64(o, "mb_fault", stats, st.mb_fault);
	hq_json_u64(o, "mb_pool", stats, st.mb_pool);
	hq_json_u64(o, "mb_prefetch", stats, st.mb_prefetch);
	hq_json_u64(o, "mb_zero", stats, st.mb_zero);
	hq_json_u64(o, "mb_present", stats, st.mb_present);
	hq_json_bool(o, "attached", r->p.parsed, r->p.attach);
	/* Measured only with --track-access. */
	hq_json_fixed(o, "vm_access_pct", stats && st.vm_access_pct >= 0, st.vm_access_pct, 2);
	hq_json_bool(o, "paused", file, r->paused);
	hq_json_str(o, "run_state", !file ? NULL : r->paused ? "paused" : "running");
	hq_json_str(o, "saved_run_state", !file ? NULL : r->file_paused ? "paused" : "running");
	hq_json_bool(o, "detached", r->p.parsed, r->p.detach);
	hq_json_str(o, "cmdline", !r->p.parsed ? NULL : r->p.attach ? "attached" :
		    r->b.cfg.replayed || !r->p.qemu_argc ? "recorded" : "given");
	hq_json_u64(o, "forwards", r->t_forwarded, (uint64_t)r->nforwards);
	json_ms(o, "forwarded_ms", r->t0, r->t_forwarded);
	hq_json_u64(o, "device_ram_bytes", file, hq_snapfile_devram_bytes(&r->b.f));
	hq_json_u64(o, "device_ram_written_bytes", r->devram_done, r->devram_written);
	hq_json_fixed(o, "device_ram_ms", r->devram_done, (double)r->devram_ns / 1e6, 3);
	hq_json_bool(o, "bypass_cache", r->p.parsed, r->p.bypass_cache);
	/* --learn: the trace, once written (the engine writes it when the restore ends). */
	hq_json_str(o, "learn_trace", r->p.learn && r->t_done && !access(r->p.learn, F_OK) ?
		    r->p.learn : NULL);
	hq_json_u64(o, "learn_window_ms", r->p.parsed && r->p.learn, r->p.learn_window_ms);
	report_disks_json(o, r);
	hq_json_print(o);
}

static void report(const struct restore_run *r, int ret)
{
	const struct halite_restore_stats *st = &r->st;
	char a[32];

	if (r->p.out.json) {
		report_json(r, hq_exit_code(ret));
		return;
	}
	if (ret)
		return;
	printf("restored %s into QEMU %d.%d.%d pid %d, %s, %u vCPUs\n", r->p.path, r->b.vm.major,
	       r->b.vm.minor, r->b.vm.micro, (int)r->b.vm.pid, r->b.vm.machine, r->b.vm.nvcpus);
	printf("  QEMU ready     %.0f ms after start (QMP up)\n", ms(r->t0, r->t_qmp));
	printf("  guest %s  %.1f ms after QEMU was ready (devices loaded in %.1f ms)%s\n",
	       r->paused ? "loaded " : "resumed", ms(r->t_qmp, r->t_resume),
	       ms(r->t_ready, r->t_loaded), !r->paused ? "" : r->p.run == RUN_AS_SAVED ?
	       "; left paused, as it was saved (cont, or --running, runs it)" :
	       "; left paused (cont runs it)");
	printf("  all memory in  %.2f s after resume: %s, %" PRIu64 " LBs (%" PRIu64 " demand, %"
	       PRIu64 " prefetch), %s read\n", ms(r->t_resume, r->t_done) / 1e3,
	       hq_bytes(r->b.f.mem_bytes, a, sizeof(a)), st->lb_total, st->lb_demand, st->lb_prefetch,
	       hq_bytes(st->bytes_read, (char[32]){ 0 }, 32));
	if (st->lb_hot)
		printf("  hot prefix     %" PRIu64 " LBs (what earlier guests touched first) read "
		       "first\n", st->lb_hot);
	if (r->b.cfg.replayed)
		printf("  command line   the one the file records, run in %s\n",
		       r->b.cfg.cwd ? r->b.cfg.cwd : "this directory");
	if (r->nforwards)
		printf("  host forwards  %d added %.1f ms after QEMU was ready, once the guest's "
		       "state was loaded\n", r->nforwards, ms(r->t_qmp, r->t_forwarded));
	for (uint32_t i = 0; i < r->b.f.ndevram; i++)
		printf("  device RAM     %s, %s: in before the guest ran\n", r->b.f.devram[i].name,
		       hq_bytes(r->b.f.devram[i].length, a, sizeof(a)));
	if (r->b.f.ndevram)
		printf("  device write   %s written into QEMU in %.2f ms, once the device state was "
		       "loaded\n", hq_bytes(r->devram_written, a, sizeof(a)),
		       (double)r->devram_ns / 1e6);
	if (r->p.attach)
		printf("  taken over     %" PRIu64 " memory blocks were in already and kept\n",
		       st->mb_present);
	if (r->p.learn)
		printf("  learnt         the guest's first touches %s, in %s\n",
		       r->p.learn_window_ms ? "in its first window" : "until all memory was in",
		       r->p.learn);
	for (int i = 0; r->b.disks && r->b.ndisks && i < r->b.disks->n; i++)
		if (r->b.disks->d[i].frozen)
			printf("  disk           %s: runs on %s, a new overlay of %s (the disk as "
			       "at the snapshot)\n", r->b.disks->d[i].name, r->b.disks->d[i].overlay,
			       r->b.disks->d[i].image);
	printf("  faults         %" PRIu64 " (vCPUs %" PRIu64 ", zero %" PRIu64 ", from an LB in "
	       "memory %" PRIu64 "), service p50 %.0f us, p99 %.0f us\n", st->faults,
	       st->faults_vcpu, st->faults_zero, st->faults_cached,
	       (double)st->fault_p50_ns / 1e3, (double)st->fault_p99_ns / 1e3);
	if (st->vm_access_pct >= 0)
		printf("  VM access      %.1f%% of the other blocks of demand-read LBs were used\n",
		       st->vm_access_pct);
	fflush(stdout);
}

/* The last lines QEMU wrote to our log, on stderr. */
static void show_qemu_log(const struct restore_run *r)
{
	char path[96], buf[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/qemu.log", r->dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n > 0) {
		buf[n] = '\0';
		fprintf(stderr, PROG ": QEMU said:\n%s%s", buf, buf[n - 1] == '\n' ? "" : "\n");
	}
	close(fd);
}

/*
 * QEMU's last words when it exited on us (its refusal of the command line,
 * say): the last lines of its log, when the log is a file (ours with
 * --detach, or --qemu-log); without one QEMU wrote to our stderr itself.
 */
static void qemu_last_words(struct restore_run *r)
{
	char path[PATH_MAX], buf[1024], *p, *e;
	ssize_t n;
	off_t size, from;
	int fd, lines = 0;

	if (r->p.qemu_log)
		snprintf(path, sizeof(path), "%s", r->p.qemu_log);
	else if (r->p.detach && r->dir[0])
		snprintf(path, sizeof(path), "%s/qemu.log", r->dir);
	else
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	from = size > (off_t)sizeof(buf) - 1 ? size - (off_t)sizeof(buf) + 1 : 0;
	/* An appended log: only what this QEMU wrote. */
	if (from < r->log_start)
		from = r->log_start;
	n = size < 0 ? -1 : pread(fd, buf, (size_t)(size - from), from);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	for (e = buf + n; e > buf && (e[-1] == '\n' || e[-1] == ' '); )
		*--e = '\0';
	/* The last three lines: QEMU says why in its last one or two. */
	for (p = e; p > buf; p--)
		if (p[-1] == '\n' && ++lines == 3)
			break;
	snprintf(r->qemu_err, sizeof(r->qemu_err), "%s", p);
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
	if (parse_args(argc, argv, &r->p)) {
		if (hq_usage_report(&r->p.out, r->err, sizeof(r->err)))
			report_json(r, EXIT_USAGE);
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
		qemu_last_words(r);
	if (ret && r->p.attach && r->uffd >= 0) {
		size_t n = strlen(r->err);

		snprintf(r->err + n, sizeof(r->err) - n, " (QEMU is left as it was: its guest "
			 "waits for the memory it lacks)");
	}
	if (ret)
		hq_errorf("restore: %s", r->err);
	if (ret && r->p.detach && !r->p.qemu_log && r->dir[0])
		show_qemu_log(r);
	report(r, ret);
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
	free(r);
	return code;
}
