/* SPDX-License-Identifier: MIT */
/* halite-inspect push and pull: their shared client setup (s3cmd.c). */
#ifndef HALITE_INSPECT_S3CMD_H
#define HALITE_INSPECT_S3CMD_H

#include <cjson/cJSON.h>

#include "s3.h"

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

#endif
