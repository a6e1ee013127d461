// SPDX-License-Identifier: MIT
/* halite-qemu restore: its --help and its options (restore_run.h). */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "restore_run.h"

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
		"  --disk-dir DIR     put the disks' overlays in DIR (default: beside each image;\n"
		"                     for disks fetched from a store, the current directory)\n"
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
		"  --cache-dir DIR    FILE s3://BUCKET/KEY: keep the locality blocks read from the\n"
		"                     store in DIR, the host's LB cache, shared by every restore\n"
		"                     and clone naming it; blocks found there are not fetched\n"
		"                     again (default: $HALITE_CACHE_DIR; none). The snapshot's\n"
		"                     frozen disks, pushed with it, are kept in DIR/disks\n"
		"  --cache-size SIZE  the cache's bound (K, M, G suffixes; default\n"
		"                     $HALITE_CACHE_SIZE, else 8G); the least recently used\n"
		"                     blocks go first\n"
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

int restore_parse_args(int argc, char **argv, struct restore_params *p)
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
		{ "cache-dir", required_argument, NULL, 'c' },
		{ "cache-size", required_argument, NULL, 'z' },
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
		case 'c':
			/* The engine opens the cache where it opens the object (io_s3.c). */
			if (!*optarg || setenv("HALITE_CACHE_DIR", optarg, 1))
				return hq_usage(o, "--cache-dir '%s': a directory", optarg);
			break;
		case 'z':
			if (halite_parse_size(optarg, &v) || !v || setenv("HALITE_CACHE_SIZE", optarg, 1))
				return hq_usage(o, "--cache-size '%s': a size in bytes (K, M, G "
						"suffixes), above 0", optarg);
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
