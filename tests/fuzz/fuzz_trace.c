/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: halite-inspect's restore trace parser
 * (tools/halite-inspect/trace.c, docs/restore-trace.md) on arbitrary bytes,
 * against one fixed snapshot, tests/fuzz/trace.hlt.
 *
 * The parser checks a trace against its snapshot (the uuid on line 2, the
 * LB and memory-block numbers of every lb line), so inputs reach past line
 * 2 only if they name that snapshot, and the lb line checks only with LBs
 * and blocks that exist in it. The seeds of corpus/trace/ (seed-*) are
 * therefore real traces of restores of trace.hlt, written by the restore
 * engine, and a few edited copies. Snapshot and seeds are made together by
 * trace_seed_gen.c (its header says what each seed is; it needs
 * userfaultfd), from the top of the tree (any build directory will do):
 *
 *   scripts/build.sh build &&
 *   build/tests/fuzz/fuzz_trace_seed_gen tests/fuzz/trace.hlt tests/fuzz/corpus/trace
 *
 * The snapshot's uuid (hlt-fuzz-trace-1) and creation time are fixed, so the
 * command remakes the same trace.hlt, byte for byte, and every trace in the
 * corpus keeps matching it; the seeds differ from run to run in their
 * timings only. The other files of corpus/trace/ (named by their SHA-1) are
 * what libFuzzer found from those seeds, folded in with
 *
 *   build-fuzz/tests/fuzz/fuzz_trace -merge=1 tests/fuzz/corpus/trace FINDS
 *
 * and any fixed crasher is kept there too (crash-*).
 *
 * Each input is parsed as `halite-inspect restore` does: once with a
 * callback per lb line, and again after a rewind (the --blocks pass). Besides
 * crashes and sanitizer reports, the target aborts when the parser breaks a
 * promise of trace.h: on success, that the trace is well formed at the byte
 * level, that its lb lines are what the parser validated (in range, in
 * order, fault_mb stored in its LB, counts adding up, every line once), and
 * that the second pass gives the same; on failure, that it says so in one
 * "TRACE:LINE: what" message naming a line of the input, and nothing else.
 *
 * Built as a libFuzzer binary (fuzz_trace, clang, HALITE_FUZZ=ON) and as a
 * plain regression program over the committed corpus (fuzz_trace_regress).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/halite.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef FUZZ_TRACE_SNAPSHOT
#error "FUZZ_TRACE_SNAPSHOT: the path of tests/fuzz/trace.hlt (tests/fuzz/CMakeLists.txt)"
#endif

/* Longer inputs add nothing: a line is at most 4096 bytes, this snapshot has 6 LBs. */
#define MAX_INPUT (1u << 20)
#define STOP 42 /* what the early-stop callback returns */

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "fuzz_trace: %s:%d: broken promise: %s\n",   \
				__FILE__, __LINE__, #cond);                           \
			abort();                                                      \
		}                                                                     \
	} while (0)

static struct halite_reader *snap;
static const struct halite_file_info *fi;

/* Opened once and kept: every input is parsed against the same file. */
static void open_snapshot(void)
{
	char err[256] = "";
	HALITE_OPTS(halite_reader_opts, o);
	int ret;

	if (snap)
		return;
	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	ret = halite_reader_open(&snap, FUZZ_TRACE_SNAPSHOT, &o);
	if (ret) {
		fprintf(stderr, "fuzz_trace: %s: %s: %s\n", FUZZ_TRACE_SNAPSHOT,
			halite_strerror(ret), err);
		abort();
	}
	fi = halite_reader_info(snap);
}

/* What the callback saw, to hold against what trace_parse() returns. */
struct seen {
	uint64_t n, demand, prefetch;
	uint64_t prev;
	uint64_t sum;		/* of every field of every line, order-sensitive */
	uint64_t stop_at;	/* stop with STOP at this line (1-based), 0 never */
};

static int on_lb(void *ctx, const struct lb_line *l)
{
	struct seen *s = ctx;
	struct halite_lb_info li;
	struct halite_mb_loc loc;

	CHECK(l->index < fi->lb_count);
	CHECK(s->n == 0 || l->index > s->prev);
	CHECK(halite_reader_lb_info(snap, l->index, &li) == 0);
	if (l->how == FATE_DEMAND) {
		CHECK(halite_reader_mb_lookup(snap, l->fault_mb, &loc) == 0);
		CHECK(loc.state == HALITE_MB_STORED && loc.lb == l->index);
		CHECK(l->staged < li.mb_count);
		CHECK(l->accessed <= l->staged);
		s->demand++;
	} else {
		CHECK(l->how == FATE_PREFETCH);
		CHECK(l->staged == 0 && l->accessed == 0);
		s->prefetch++;
	}
	s->prev = l->index;
	s->n++;
	s->sum = s->sum * 31 + l->index;
	s->sum = s->sum * 31 + (uint64_t)l->how;
	s->sum = s->sum * 31 + l->t_ns;
	s->sum = s->sum * 31 + (l->how == FATE_DEMAND ? l->fault_mb : 0);
	s->sum = s->sum * 31 + l->staged;
	s->sum = s->sum * 31 + l->accessed;
	if (s->n == s->stop_at)
		return STOP;
	return 0;
}

/*
 * "PATH:LINE: what", LINE naming a line of the input, or the one after its
 * last newline (an unexpected end, a last line without a newline).
 */
static void check_message(const char *err, const char *path, uint64_t nl)
{
	size_t plen = strlen(path);
	uint64_t line;
	char *end;

	CHECK(strncmp(err, path, plen) == 0 && err[plen] == ':');
	CHECK(err[plen + 1] >= '1' && err[plen + 1] <= '9');
	line = strtoull(err + plen + 1, &end, 10);
	CHECK(line >= 1 && line <= nl + 1);
	CHECK(end[0] == ':' && end[1] == ' ' && end[2] != '\0');
}

/* What a trace the parser accepted must look like, byte by byte. */
static void check_accepted(const struct trace *t, const struct seen *s, const uint8_t *data,
			   size_t size, uint64_t nl)
{
	static const char head[] = "halite-restore-trace 1\nfile-uuid ";
	char uuid[33];

	/* Version 1 or 2: the header differs in its last digit only. */
	CHECK(size >= sizeof(head) - 1 && memcmp(data, head, 21) == 0 &&
	      data[21] == '0' + t->version && memcmp(data + 22, head + 22, sizeof(head) - 23) == 0);
	trace_fmt_uuid(fi->uuid, uuid);
	CHECK(size >= sizeof(head) - 1 + 33 && memcmp(data + sizeof(head) - 1, uuid, 32) == 0 &&
	      data[sizeof(head) - 1 + 32] == '\n');
	CHECK(data[size - 1] == '\n');
	for (size_t i = 0; i < size; i++) {
		CHECK(data[i] == '\n' || (data[i] >= 0x20 && data[i] <= 0x7e));
		if (data[i] == '\n')
			CHECK(i > 0 && data[i - 1] != '\n' && data[i - 1] != ' ');
		if (data[i] == ' ')
			CHECK(i > 0 && data[i - 1] != '\n' && data[i - 1] != ' ');
	}
	/*
	 * Every line is one of: header, uuid, 23 stats, lb_hot (at most once),
	 * unknown stats, lb lines; version 2: one learn line and the touch lines.
	 * Written by a template: version 2, header, uuid, the learn line and the
	 * touch lines only.
	 */
	CHECK(t->line == nl);
	CHECK(t->version == 1 || t->version == 2);
	if (t->from_template) {
		static const char learn[] = "\nlearn ";

		CHECK(t->version == 2);
		CHECK(nl == 3 + t->n_touch);
		CHECK(t->unknown_stats == 0 && t->n_lb == 0 && s->n == 0 && !t->lb_hot_line);
		CHECK(memcmp(data + sizeof(head) - 1 + 32, learn, sizeof(learn) - 1) == 0);
	} else {
		CHECK(nl == 2 + NSTATS + (t->lb_hot_line != 0) + t->unknown_stats + t->n_lb +
			    (t->version == 2) + t->n_touch);
	}
	CHECK(t->lb_hot <= t->u[S_LB_PREFETCH] && (t->lb_hot_line || !t->lb_hot));
	if (t->version == 2) {
		uint64_t sum = t->n_touch_other;

		CHECK(t->n_touch == t->n_touch_kind[0] + t->n_touch_kind[1] + t->n_touch_kind[2]);
		CHECK(t->n_touch <= fi->mb_count);
		for (size_t i = 0; i < t->n_vcpus; i++) {
			CHECK(t->vcpus[i].touches > 0);
			CHECK(i == 0 || t->vcpus[i - 1].vcpu < t->vcpus[i].vcpu);
			sum += t->vcpus[i].touches;
		}
		CHECK(sum == t->n_touch);
	} else {
		CHECK(t->n_touch == 0 && t->n_vcpus == 0);
	}

	if (t->from_template) {
		/* No statistics: nothing below is said by the trace. */
		for (int i = 0; i < NSTATS; i++)
			CHECK(t->u[i] == 0);
		CHECK(t->error == 0 && t->pct == 0 && t->pct_text[0] == '\0');
		return;
	}
	CHECK(t->u[S_MB_TOTAL] == fi->mb_count);
	CHECK(t->u[S_LB_TOTAL] == fi->lb_count);
	CHECK(t->u[S_DONE] <= 1);
	CHECK(t->error <= 0);
	CHECK((t->error == 0) == (t->u[S_DONE] == 1));
	CHECK(t->n_lb == t->n_demand + t->n_prefetch);
	CHECK(t->n_lb <= fi->lb_count);
	if (t->u[S_DONE]) {
		CHECK(t->n_lb == t->u[S_LB_TOTAL]);
		CHECK(t->n_demand == t->u[S_LB_DEMAND]);
	}
	CHECK(s->n == t->n_lb && s->demand == t->n_demand && s->prefetch == t->n_prefetch);

	/*
	 * vm_access_pct as written, [-](0|[1-9][0-9]*).dd: a JSON number, since
	 * `restore --json` prints it raw; and pct its value.
	 */
	{
		const char *p = t->pct_text + (t->pct_text[0] == '-');
		size_t n = strlen(p);

		CHECK(n >= 4 && p[n - 3] == '.' && (p[0] != '0' || p[1] == '.'));
		for (size_t i = 0; i < n; i++)
			CHECK(i == n - 3 || (p[i] >= '0' && p[i] <= '9'));
		CHECK(strtod(t->pct_text, NULL) == t->pct);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char path[] = "fuzz.trace";
	struct trace t = { 0 };
	struct seen s1 = { 0 }, s2 = { 0 }, s3 = { 0 };
	char err[1024], err2[1024];
	uint64_t nl = 0;
	int ret, ret2;
	FILE *f;

	if (size > MAX_INPUT)
		return 0;
	open_snapshot();
	for (size_t i = 0; i < size; i++)
		nl += data[i] == '\n';
	/* "r" never writes; a stream on the bytes reads as the tool reads a file. */
	f = fmemopen((void *)data, size, "r");
	CHECK(f);
	t.path = path;
	t.file = FUZZ_TRACE_SNAPSHOT;
	t.r = snap;
	t.f = f;
	t.errbuf = err;
	t.errbuf_len = sizeof(err);

	err[0] = '\0';
	ret = trace_parse(&t, on_lb, &s1);
	if (ret) {
		CHECK(ret == EXIT_BAD); /* no read errors from memory, no STOP asked */
		check_message(err, path, nl);
	} else {
		CHECK(err[0] == '\0');
		check_accepted(&t, &s1, data, size, nl);
	}

	/* The --blocks pass: the same verdict, message and lines. */
	rewind(f);
	err2[0] = '\0';
	t.errbuf = err2;
	ret2 = trace_parse(&t, on_lb, &s2);
	CHECK(ret2 == ret && strcmp(err, err2) == 0);
	CHECK(s2.n == s1.n && s2.sum == s1.sum);
	if (!ret)
		check_accepted(&t, &s2, data, size, nl);

	/* A callback's non-zero stops the parse and is returned as is. */
	if (s1.n) {
		rewind(f);
		s3.stop_at = s1.n / 2 + 1;
		ret2 = trace_parse(&t, on_lb, &s3);
		CHECK(ret2 == STOP && s3.n == s3.stop_at);
	}
	trace_free(&t);
	fclose(f);
	return 0;
}
