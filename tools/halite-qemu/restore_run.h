/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu restore, private: its options and its run, shared by its
 * parsing (restore_args.c), the run (restore.c) and its report
 * (restore_report.c).
 */
#ifndef HALITE_QEMU_RESTORE_RUN_H
#define HALITE_QEMU_RESTORE_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "bring.h"
#include "diskfetch.h"
#include "tool.h"

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
	/* The check's reader, until the engine has opened the same version through it. */
	struct halite_reader *check_rd;
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
	/* s3://: the frozen disks the store holds beside the snapshot, in the host's cache */
	struct hq_diskfetch fetch;
	char err[1280];
	char qemu_err[1024];	/* QEMU's own words, when they are the cause */
};

/* The options into @p: 0, or -1 with p->out.usage (exit 2). */
int restore_parse_args(int argc, char **argv, struct restore_params *p);
/* The report on stdout (text, or --json's object) of a restore that ended with @ret. */
void restore_report(const struct restore_run *r, int ret);
/* --json's object, exit code @code. */
void restore_report_json(const struct restore_run *r, int code);
/* A failed restore's QEMU log on stderr when it is ours (--detach without --qemu-log). */
void restore_show_qemu_log(const struct restore_run *r);
/* QEMU's last lines in its log as r->qemu_err: why it exited. */
void restore_qemu_last_words(struct restore_run *r);

#endif
