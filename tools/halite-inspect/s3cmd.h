/* SPDX-License-Identifier: MIT */
/* halite-inspect push and pull: their shared options and client setup (s3cmd.c). */
#ifndef HALITE_INSPECT_S3CMD_H
#define HALITE_INSPECT_S3CMD_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "s3.h"

/* The options push and pull share, beside LONGOPTS_COMMON (--json, --help, ...). */
enum { S3CMD_OPT_PART_SIZE = 0x200, S3CMD_OPT_ANY, S3CMD_OPT_NEXT };
#define S3CMD_LONGOPTS                                                        \
	{ "part-size", required_argument, NULL, S3CMD_OPT_PART_SIZE },      \
	{ "jobs", required_argument, NULL, 'j' },                           \
	{ "any", no_argument, NULL, S3CMD_OPT_ANY },                        \
	{ "progress", optional_argument, NULL, OPT_PROGRESS }

struct s3cmd_opts {
	uint64_t min_part, max_part; /* the command's limits for --part-size */
	const char *part_range;	     /* the same in words: "5M to 5G" */
	uint64_t part_size;	     /* 0: the library's default */
	long jobs;		     /* 0: the library's default */
	bool any;
	int progress;		     /* HALITE_PROGRESS_*, or -1: the command decides */
};

/*
 * Option @ch (its argument in optarg) when it is one of the shared ones:
 * 0 taken, -1 not one of them, else the exit code (the problem said).
 */
int s3cmd_option(int ch, struct s3cmd_opts *o);

struct s3cmd {
	const char *url;
	char *bucket, *key;
	struct halite_s3 *s;
	double start;
};

/* Parses @url and opens a client for it: 0, or an exit code, the problem said. */
int s3cmd_open(struct s3cmd *c, const char *url, unsigned jobs);
/* Says what the failed call @err of the client was doing; returns EXIT_FAIL. */
int s3cmd_fail(struct s3cmd *c, int err);
/* "requests", "retries" and "seconds" into @root. */
void s3cmd_json_stats(struct s3cmd *c, cJSON *root);
/*
 * @path opens as a snapshot (header, footer, index); else says so for
 * @name, with @hint, and returns the exit code.
 */
int s3cmd_check_snapshot(const char *path, const char *name, const char *hint);
void s3cmd_close(struct s3cmd *c);

/*
 * The frozen disks of the snapshot @path (its qemu.disks) flattened and
 * uploaded beside c->key, then their manifest (s3disks.c); nothing for a
 * snapshot without frozen disks. Each disk's line on stderr, or an object
 * in @out (a JSON array) when given. 0 or an exit code, the problem said.
 */
int push_disks(struct s3cmd *c, const char *path, uint64_t part_size, int progress, cJSON *out);
/* The disks listed beside c->key, of the pulled snapshot @file, into FILE.disks/. */
int pull_disks(struct s3cmd *c, const char *file, int progress, cJSON *out);

#endif
