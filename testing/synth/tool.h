/* SPDX-License-Identifier: MIT */
/*
 * Private to halite-synth (main.c, cmd_save.c, cmd_clone.c) and its tests:
 * the command line shared by its commands, the synth.args record of a
 * guest's layout, the save of a synthetic guest and the clone server.
 */
#ifndef HALITE_SYNTH_TOOL_H
#define HALITE_SYNTH_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <halite/save.h>

#include "synth.h"

#define HS_PROG "halite-synth"
/* The metadata key of a saved guest's layout options (hs_synth_args()). */
#define HS_META_ARGS "synth.args"

enum hs_cmd {
	HS_CMD_RUN = 0,
	HS_CMD_SAVE = 1,
	HS_CMD_CLONE = 2,
};

/* A command line, parsed (hs_parse()). */
struct hs_args {
	struct synth_opts o;
	uint64_t seconds;	/* run, save: without --accesses */
	bool seconds_set;
	const char *out;	/* save --out */
	int codec;		/* save --codec; 0 = the default (lz4) */
	const char *mem_file;	/* clone --mem-file */
	uint64_t mem_offset;	/* clone --mem-offset */
	const char *control;	/* clone --control */
	bool anon;		/* clone --anon: anonymous memory, no --mem-file */
};

/*
 * Parse argv[1..argc-1] (argv[0] is the command's name) for command @cmd
 * into *a, defaults first. Returns 0, 1 when --help or --version printed to
 * stdout, or -1 after printing to stderr what is wrong (an unknown option,
 * one that is not for @cmd, a value out of its range, options that do not
 * fit together, a stray argument): "halite-synth: CMD: ...". getopt state
 * is reset first, so it may be called more than once.
 */
int hs_parse(int argc, char **argv, enum hs_cmd cmd, struct hs_args *a);

/* The usage text, every command. */
void hs_usage(FILE *f);

/*
 * The layout options of a guest created with @o, defaults resolved, as
 * halite-synth options: "--mem 256 --vcpus 4 --levels 4 ...": every option
 * that decides the layout or the memory's contents (not the workload's).
 * Options parsed from it (hs_parse) create the same layout and contents.
 * Writes a NUL-terminated string into buf: 0, -EINVAL for options a guest
 * cannot be created with, -ENOSPC when @len is too small.
 */
int hs_synth_args(const struct synth_opts *o, char *buf, size_t len);

/* Split @s at spaces into a NULL-terminated argv (argv[0] = @name); free with free(). */
char **hs_split_args(const char *name, const char *s, int *argc);

/* --- save (cmd_save.c) --- */

struct hs_save_req {
	const char *path;
	int codec;		/* enum halite_codec; 0 = default */
	const char *synth_args;	/* recorded under HS_META_ARGS; NULL: none */
	bool resume;		/* started: resume it after arm, it runs on while saved */
	/*
	 * Called at the snapshot instant (the guest paused, nothing armed):
	 * e.g. a copy of the memory to check the file against. 0 or -errno.
	 */
	int (*at_pause)(void *ctx, struct synth_guest *g);
	void *ctx;
	unsigned timeout_s;	/* for the save to complete; 0 = 120 */
};

struct hs_save_res {
	uint64_t pause_ns;	/* pause to resume (or to arm done without resume) */
	uint64_t save_ns;	/* pause to file complete */
	struct halite_save_stats st;
	char err[512];		/* what failed */
};

/*
 * Save guest @g (running or paused; created by this process, not in child
 * mode) to req->path with the lazy save engine: pause, at_pause, arm, resume
 * if asked (it must have been started), wait until the file is complete. Records
 * the vCPUs' page-table roots, their positions in the workload (device
 * state: u64 LE accesses per vCPU), the metadata "creator" and
 * HS_META_ARGS. 0 or -errno / -HALITE_E_*, res->err saying what failed.
 */
int hs_save_guest(struct synth_guest *g, const struct hs_save_req *req, struct hs_save_res *res);

int hs_cmd_save(int argc, char **argv);
int hs_cmd_clone(int argc, char **argv);

#endif
