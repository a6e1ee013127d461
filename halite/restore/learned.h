/* SPDX-License-Identifier: MIT */
/*
 * Private: what earlier runs learned about a guest's memory order, in the
 * two forms the engines share (issue 17):
 *
 * the restore trace (docs/restore-trace.md), written by the restore
 * engine (restore.c, learn.c) and, version 2 without stat and lb lines,
 * by the template's hot set (hotset.c), which also reads the touch
 * lines of any version 2 trace back. (The other form, a relayouted file's
 * hot prefix, is the format library's: relayout_meta.h.)
 */
#ifndef HALITE_LEARNED_H
#define HALITE_LEARNED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <halite/format.h>

/* A memory block first touched: one touch line. */
struct learn_touch {
	uint64_t t_ns;	 /* the fault's message read, since ready */
	uint64_t mb;
	uint32_t vcpu;	 /* index in the vCPU list + 1; 0: another thread */
	uint8_t kind;	 /* enum halite_mb_state */
};

/* A trace being written: a temporary file beside @path, renamed over it at the end. */
struct trace_out {
	FILE *f;
	char *tmp;
	const char *path;
};

/*
 * Create the temporary file (mode 0644) and write the header of @version
 * and the file-uuid line. 0 or -errno; on failure nothing is left behind.
 */
int trace_out_begin(struct trace_out *o, const char *path, unsigned version,
		    const uint8_t uuid[16]);

/*
 * Flush, fsync and rename over the path (@err 0), or remove the temporary
 * file (@err < 0, or a write that failed). Returns 0 or the failure.
 */
int trace_out_end(struct trace_out *o, int err);

/* The learn line and one touch line per record (version 2's part after the lb lines). */
void trace_write_learn(FILE *f, uint32_t window_ms, bool complete,
		       const struct learn_touch *t, size_t n);

/*
 * Read the touch lines of the version 2 trace @f (from its start) of the
 * file @rd: its uuid checked, stat and lb lines skipped, every touch line
 * checked (syntax, block in range and of the kind the file's map says,
 * each block once, t_ns not decreasing) before @fn sees it, in order. A
 * non-zero @fn stops the reading and is returned. Returns 0; -EINVAL for a
 * trace that is not one of @rd, with @why (a sentence part, "line 3: ...")
 * set; -errno when reading fails.
 */
int trace_read_touches(FILE *f, struct halite_reader *rd,
		       int (*fn)(void *ctx, const struct learn_touch *t), void *ctx,
		       char *why, size_t whylen);

#endif
