/* SPDX-License-Identifier: MIT */
/*
 * halite-inspect: the restore trace parser (docs/restore-trace.md), private
 * to the tool. Apart from the `restore` command (restore.c) so that the fuzz
 * target tests/fuzz/fuzz_trace.c links it without the tool's main.
 *
 * Use: open the trace as t->f, set path, file and r, then trace_parse(). It
 * reads the whole trace once, checks every rule of the format page against
 * the snapshot r, hands each validated lb line to a callback (and, version
 * 2, each touch line to t->touch_fn), and fills the results. The first
 * violation is reported as "TRACE:LINE: what" and parsing stops there.
 * Memory stays flat: nothing is kept per line (version 2 keeps one bit per
 * memory block of the file, to refuse a block touched twice, and a count per
 * vCPU).
 */
#ifndef HALITE_INSPECT_TRACE_H
#define HALITE_INSPECT_TRACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "inspect.h"

/* Longest line accepted: an lb line is at most ~110 bytes; room for later stats. */
#define TRACE_LINE_MAX 4096

enum stat_kind {
	SK_U64,	 /* unsigned decimal */
	SK_PCT,	 /* %.2f, maybe negative */
	SK_BOOL, /* 0 or 1 */
	SK_ERR,	 /* 0 or a negative int */
};

/* The stat lines of version 1, in the order the format requires. */
enum {
	S_READY_NS,
	S_DURATION_NS,
	S_MB_TOTAL,
	S_MB_FAULT,
	S_MB_POOL,
	S_MB_PREFETCH,
	S_MB_ZERO,
	S_FAULTS,
	S_FAULTS_CACHED,
	S_FAULTS_ZERO,
	S_FAULTS_VCPU,
	S_LB_TOTAL,
	S_LB_DEMAND,
	S_LB_PREFETCH,
	S_LB_RETRIES,
	S_BYTES_READ,
	S_MB_STAGED,
	S_MB_STAGED_ACCESSED,
	S_VM_ACCESS_PCT,
	S_FAULT_P50_NS,
	S_FAULT_P99_NS,
	S_DONE,
	S_ERROR,
	NSTATS
};

struct trace_stat_def {
	const char *name;
	enum stat_kind kind;
};

/* Indexed by S_*: each stat's name in the trace and its syntax. */
extern const struct trace_stat_def trace_stats[NSTATS];

enum fate { FATE_NEVER, FATE_DEMAND, FATE_PREFETCH };

/* Indexed by enum fate, as the trace and the tool's output name them. */
extern const char *const trace_fate_names[];

struct lb_line {
	uint64_t index;
	enum fate how;		/* FATE_DEMAND or FATE_PREFETCH: a line is an LB read */
	uint64_t t_ns;
	uint64_t fault_mb;	/* demand only */
	uint64_t staged, accessed;
};

/* A version 2 touch line's vcpu when the thread was not a vCPU ('-'). */
#define TOUCH_NOT_VCPU UINT32_MAX

/* Version 2: a memory block first touched after resume (docs/restore-trace.md). */
struct touch_line {
	uint64_t t_ns;
	uint32_t vcpu;		/* vCPU index, or TOUCH_NOT_VCPU */
	uint64_t mb;
	uint32_t kind;		/* enum halite_mb_state, as the file's map has it */
	uint64_t rank;		/* 0 for the trace's first touch line, 1 for the next, ... */
};

typedef int (*touch_fn)(void *ctx, const struct touch_line *l);

/* Touches per vCPU of a version 2 trace, sorted by vcpu. */
struct touch_vcpu {
	uint32_t vcpu;
	uint64_t touches;
};

struct trace {
	/* input */
	const char *path;	/* the trace, for messages */
	const char *file;	/* the snapshot, for messages */
	struct halite_reader *r;
	FILE *f;
	/*
	 * NULL: messages go to stderr through errorf(), as the tool prints
	 * them. Else the message (without the "halite-inspect: " prefix) is
	 * stored here, cut to @errbuf_len, and nothing is printed: the fuzz
	 * target runs millions of bad traces and checks the message instead.
	 */
	char *errbuf;
	size_t errbuf_len;
	/* Version 2: sees each touch line once it is validated (may be NULL). */
	touch_fn touch_fn;
	void *touch_ctx;
	/* parse state */
	uint64_t line;
	char buf[TRACE_LINE_MAX + 2];
	size_t len;
	/* results */
	uint64_t u[NSTATS];	/* SK_U64 and SK_BOOL values */
	double pct;		/* vm_access_pct */
	char pct_text[32];	/* ... as written: JSON gets it exactly, always with decimals */
	int error;
	uint64_t n_lb, n_demand, n_prefetch;
	uint64_t unknown_stats;
	/*
	 * stat lb_hot (after error since 2026-11; a trace written before has
	 * none): the hot-prefix LBs the prefetcher read first, at most
	 * lb_prefetch. lb_hot_line: its line, 0 when the trace has none.
	 */
	uint64_t lb_hot, lb_hot_line;
	unsigned version;	/* 1 or 2 */
	/*
	 * Version 2 written by a template (the clone service's hot set): no
	 * stat and no lb lines, the learn line after file-uuid; u[], pct,
	 * error and the lb counts are all 0 (there was no one restore).
	 */
	bool from_template;
	bool again;		/* parse state: next_line() gives t->buf again */
	bool wrong_file;	/* the failure was a file-uuid of another file */
	/* version 2: the learn line, and the touch lines counted */
	uint64_t learn_window_ms;
	bool learn_complete;
	uint64_t n_touch, n_touch_kind[3];	/* by enum halite_mb_state */
	uint64_t n_touch_other;			/* by a thread that is not a vCPU */
	struct touch_vcpu *vcpus;		/* owned: trace_free() */
	size_t n_vcpus;
	uint8_t *seen;				/* one bit per memory block */
};

/* Called for each lb line once it is validated; non-zero (an exit code) stops the parse. */
typedef int (*lb_fn)(void *ctx, const struct lb_line *l);

/*
 * Parse the whole trace from the current position of t->f (its start: rewind
 * to parse again); @fn (if set) sees each lb line once it is validated.
 * Returns 0 with the results filled, or the exit code after a message:
 * EXIT_BAD for a trace that breaks the format or does not match t->r,
 * EXIT_USAGE when reading fails, or what @fn returned.
 *
 * On 0 these hold, for a restore's trace (not from_template):
 * u[S_MB_TOTAL] and u[S_LB_TOTAL] are t->r's counts;
 * u[S_DONE] is 0 or 1 and error is 0 exactly when done; n_lb == n_demand +
 * n_prefetch <= lb_total, the lb lines having distinct indices in ascending
 * order; when done, n_lb == lb_total and n_demand == u[S_LB_DEMAND];
 * pct_text is the vm_access_pct field as written, pct its value; lb_hot_line
 * non-zero when the trace has stat lb_hot, then lb_hot <= lb_prefetch. Version 2
 * also: n_touch touch lines, n_touch_kind[] by kind, n_touch_other of them by
 * a thread that is not a vCPU, vcpus[] the others by vCPU; each memory block
 * at most once, t_ns non-decreasing, kinds those of t->r's map.
 */
int trace_parse(struct trace *t, lb_fn fn, void *ctx);

/* Free what trace_parse() allocated (not t itself, nor t->f). */
void trace_free(struct trace *t);

/* "TRACE:LINE: what" for the current line, as trace_parse() reports; returns EXIT_BAD. */
int trace_bad(const struct trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Unsigned decimal as the trace writes it: no leading zeros, no sign, within uint64. */
bool trace_parse_dec(const char *s, uint64_t *out);

/* 16 uuid bytes as 32 lowercase hex digits and a NUL, the trace's spelling. */
void trace_fmt_uuid(const uint8_t *u, char *buf);

#endif
