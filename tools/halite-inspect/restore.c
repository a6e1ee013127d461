// SPDX-License-Identifier: MIT
/*
 * halite-inspect restore: what a lazy restore of a file read, when and why,
 * from the trace the restore engine writes (docs/restore-trace.md): the
 * restore's statistics, and per stream and per locality block which LBs
 * the guest demanded, which the prefetcher brought in, and which were never
 * needed.
 *
 * The trace is parsed strictly: every rule of the format page is checked and
 * the first violation is named by line ("trace.txt:7: expected 'stat mb_fault
 * <integer>', got '...'"), exit 1. Only what the page allows is let through:
 * stat lines after the known ones, whose names this version does not know,
 * are skipped.
 *
 * Memory stays flat for any file size: one pass validates the trace and
 * counts per stream; --blocks reads the trace a second time and prints one
 * row per LB as it goes (a trace of a 1 TiB guest has millions of lines).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

void help_restore(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " restore [--json] [--blocks] [--stream STREAM] FILE TRACE\n\n"
		"Show what a lazy restore of snapshot FILE did, from the TRACE the restore\n"
		"engine wrote (option trace_path; format: docs/restore-trace.md): the\n"
		"restore's statistics; per stream, how many of its locality blocks (LBs)\n"
		"the guest demanded (a fault needed one of their blocks), how many the\n"
		"prefetcher read, and how many were never read; with --blocks, the fate\n"
		"of every LB. Streams are the order the save wrote the blocks in: vcpuN\n"
		"(touched first by vCPU N), virtual (page-table walk), physical, other.\n"
		"A good restore demands what the vCPUs touch and prefetches the rest.\n\n"
		"TRACE is checked strictly against the format and against FILE (same\n"
		"uuid, LB and memory-block numbers that exist in FILE); the first problem\n"
		"is named with its line number, exit status 1.\n\n"
		"  --blocks         also one row per LB: index, stream, sequence in the\n"
		"                   stream, fate (demand, prefetch, never), T_MS (when its\n"
		"                   bytes were in, ms after the restore was ready), the\n"
		"                   memory block whose fault read it, and of its other\n"
		"                   blocks how many were staged and how many of those the\n"
		"                   guest touched (HALITE_RESTORE_TRACK_ACCESS, else 0)\n"
		"  --stream STREAM  with --blocks (implied): only the LBs of STREAM, named\n"
		"                   as printed (vcpu0, virtual, physical, other, other.2)\n"
		"  --json           one JSON object on stdout\n"
		"  -h, --help       this text\n\n"
		"JSON keys: file, trace, uuid, lb_count and mb_count (of FILE);\n"
		"  stats: every statistic of the trace by its name (ready_ns, duration_ns,\n"
		"    mb_total, mb_fault, mb_pool, mb_prefetch, mb_zero, faults,\n"
		"    faults_cached, faults_zero, faults_vcpu, lb_total, lb_demand,\n"
		"    lb_prefetch, lb_retries, bytes_read, mb_staged, mb_staged_accessed,\n"
		"    vm_access_pct (null when not measured), fault_p50_ns, fault_p99_ns,\n"
		"    done (boolean), error (0 or a negative error code));\n"
		"  error_text: the error's message, null when error is 0;\n"
		"  totals and each of streams[]: lbs, demand, prefetch, never (counted\n"
		"    from the trace's lb lines), streams[] also stream and stream_id;\n"
		"  with --blocks, stream (with --stream) and lbs[]: lb, stream, stream_id,\n"
		"    seq, fate, t_ns, fault_mb, staged, accessed (null where they do not\n"
		"    apply: fault_mb unless demand, all four when never).\n\n"
		"Exit status: 0 ok, 1 FILE or TRACE is bad or they do not match, 2 usage\n"
		"or I/O error.\n");
}

/* ---- the trace ---- */

/* Longest line accepted: an lb line is at most ~110 bytes; room for later stats. */
#define LINE_MAX_LEN 4096

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

static const struct {
	const char *name;
	enum stat_kind kind;
} stat_defs[NSTATS] = {
	[S_READY_NS] = { "ready_ns", SK_U64 },
	[S_DURATION_NS] = { "duration_ns", SK_U64 },
	[S_MB_TOTAL] = { "mb_total", SK_U64 },
	[S_MB_FAULT] = { "mb_fault", SK_U64 },
	[S_MB_POOL] = { "mb_pool", SK_U64 },
	[S_MB_PREFETCH] = { "mb_prefetch", SK_U64 },
	[S_MB_ZERO] = { "mb_zero", SK_U64 },
	[S_FAULTS] = { "faults", SK_U64 },
	[S_FAULTS_CACHED] = { "faults_cached", SK_U64 },
	[S_FAULTS_ZERO] = { "faults_zero", SK_U64 },
	[S_FAULTS_VCPU] = { "faults_vcpu", SK_U64 },
	[S_LB_TOTAL] = { "lb_total", SK_U64 },
	[S_LB_DEMAND] = { "lb_demand", SK_U64 },
	[S_LB_PREFETCH] = { "lb_prefetch", SK_U64 },
	[S_LB_RETRIES] = { "lb_retries", SK_U64 },
	[S_BYTES_READ] = { "bytes_read", SK_U64 },
	[S_MB_STAGED] = { "mb_staged", SK_U64 },
	[S_MB_STAGED_ACCESSED] = { "mb_staged_accessed", SK_U64 },
	[S_VM_ACCESS_PCT] = { "vm_access_pct", SK_PCT },
	[S_FAULT_P50_NS] = { "fault_p50_ns", SK_U64 },
	[S_FAULT_P99_NS] = { "fault_p99_ns", SK_U64 },
	[S_DONE] = { "done", SK_BOOL },
	[S_ERROR] = { "error", SK_ERR },
};

static const char *const kind_syntax[] = {
	[SK_U64] = "<integer>",
	[SK_PCT] = "<percent with two decimals>",
	[SK_BOOL] = "<0 or 1>",
	[SK_ERR] = "<0 or a negative integer>",
};

#define LB_SYNTAX "lb <index> <how> <t_ns> <fault_mb> <staged> <accessed>"

enum fate { FATE_NEVER, FATE_DEMAND, FATE_PREFETCH };

static const char *const fate_names[] = { "never", "demand", "prefetch" };

struct lb_line {
	uint64_t index;
	enum fate how;
	uint64_t t_ns;
	uint64_t fault_mb;	/* demand only */
	uint64_t staged, accessed;
};

struct trace {
	/* input */
	const char *path;	/* the trace, for messages */
	const char *file;	/* the snapshot, for messages */
	struct halite_reader *r;
	FILE *f;
	/* parse state */
	uint64_t line;
	char buf[LINE_MAX_LEN + 2];
	size_t len;
	/* results */
	uint64_t u[NSTATS];	/* SK_U64 and SK_BOOL values */
	double pct;		/* vm_access_pct */
	char pct_text[32];	/* ... as written: JSON gets it exactly, always with decimals */
	int error;
	uint64_t n_lb, n_demand, n_prefetch;
	uint64_t unknown_stats;
};

/* "TRACE:LINE: what" on stderr; returns EXIT_BAD. */
static int bad(const struct trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const struct trace *t, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	errorf("%s:%" PRIu64 ": %s", t->path, t->line, msg);
	return EXIT_BAD;
}

/* The current line for a message: quoted, cut short if long (it is printable ASCII). */
static const char *quoted(const struct trace *t, char *buf, size_t len)
{
	if (t->len > 60)
		snprintf(buf, len, "'%.57s...'", t->buf);
	else
		snprintf(buf, len, "'%.60s'", t->buf);
	return buf;
}

/*
 * Read the next line into t->buf without its '\n': 0, with *eof set at the
 * end of the file (at a line's start); else the exit code, reported. Rejects what the syntax
 * forbids at the byte level: a missing final newline, anything but printable
 * ASCII (CR and tabs included), empty lines, blanks at either end or doubled.
 */
static int next_line(struct trace *t, bool *eof)
{
	int c;

	*eof = false;
	t->len = 0;
	t->line++;
	for (;;) {
		c = getc_unlocked(t->f);
		if (c == '\n')
			break;
		if (c == EOF) {
			if (ferror(t->f)) {
				errorf("%s: reading: %s", t->path, strerror(errno));
				return EXIT_USAGE;
			}
			if (t->len == 0) {
				*eof = true;
				return 0;
			}
			t->buf[t->len] = '\0';
			return bad(t, "the last line does not end with a newline");
		}
		if (c == '\r')
			return bad(t, "carriage return in line (CRLF line ends?); lines end with "
				      "a single newline");
		if (c < 0x20 || c > 0x7e)
			return bad(t, "byte 0x%02x at column %zu: only printable ASCII is allowed",
				   (unsigned)c, t->len + 1);
		if (t->len == LINE_MAX_LEN)
			return bad(t, "line longer than %d bytes", LINE_MAX_LEN);
		t->buf[t->len++] = (char)c;
	}
	t->buf[t->len] = '\0';
	if (t->len == 0)
		return bad(t, "empty line");
	if (t->buf[0] == ' ')
		return bad(t, "leading space");
	if (t->buf[t->len - 1] == ' ')
		return bad(t, "trailing space");
	if (strstr(t->buf, "  "))
		return bad(t, "two spaces in a row; fields are separated by exactly one space");
	return 0;
}

/* Split t->buf at its (single) spaces. Returns the number of fields, at most @max + 1. */
static unsigned split(struct trace *t, char **f, unsigned max)
{
	unsigned n = 0;
	char *p = t->buf, *sp;

	for (;;) {
		if (n == max)
			return n + 1; /* too many */
		f[n++] = p;
		sp = strchr(p, ' ');
		if (!sp)
			return n;
		*sp = '\0';
		p = sp + 1;
	}
}

/* Rejoin what split() cut, so that t->buf is the whole line again for messages. */
static void unsplit(struct trace *t)
{
	for (size_t i = 0; i < t->len; i++)
		if (t->buf[i] == '\0')
			t->buf[i] = ' ';
}

/* Unsigned decimal, no leading zeros, no sign, within uint64. */
static bool parse_dec(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s || (s[0] == '0' && s[1]))
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

/* printf "%.2f": optional '-', an integer part without leading zeros, '.', two digits. */
static bool parse_pct(const char *s, double *out)
{
	const char *p = s + (s[0] == '-'), *dot = strchr(p, '.');
	char ip[32];
	uint64_t v;

	if (!dot || (size_t)(dot - p) >= sizeof(ip) || strlen(dot) != 3)
		return false;
	memcpy(ip, p, (size_t)(dot - p));
	ip[dot - p] = '\0';
	if (!parse_dec(ip, &v) || dot[1] < '0' || dot[1] > '9' || dot[2] < '0' || dot[2] > '9')
		return false;
	*out = strtod(s, NULL);
	return true;
}

/* "0" or a negative int: '-' and a non-zero decimal up to -INT_MIN. */
static bool parse_err(const char *s, int *out)
{
	uint64_t v;

	if (strcmp(s, "0") == 0) {
		*out = 0;
		return true;
	}
	if (s[0] != '-' || !parse_dec(s + 1, &v) || v == 0 || v > 2147483648u)
		return false;
	*out = (int)-(int64_t)v;
	return true;
}

static bool stat_name_ok(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
			return false;
	return true;
}

static void fmt_uuid(const uint8_t *u, char *buf)
{
	for (int i = 0; i < 16; i++)
		sprintf(buf + 2 * i, "%02x", u[i]);
}

static bool parse_uuid(const char *s, uint8_t *u)
{
	if (strlen(s) != 32)
		return false;
	for (int i = 0; i < 32; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

		if (d < 0)
			return false;
		if (i % 2)
			u[i / 2] |= (uint8_t)d;
		else
			u[i / 2] = (uint8_t)(d << 4);
	}
	return true;
}

static int parse_header(struct trace *t)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	char q[80], have[33], want[33];
	uint8_t uuid[16];
	uint64_t v;
	bool eof;
	int ret;

	ret = next_line(t, &eof);
	if (ret)
		return ret;
	if (eof)
		return bad(t, "empty file; expected 'halite-restore-trace 1'");
	if (strncmp(t->buf, "halite-restore-trace ", 21) == 0 && parse_dec(t->buf + 21, &v) &&
	    v != 1)
		return bad(t, "trace version %" PRIu64 ": this reader knows version 1 only", v);
	if (strcmp(t->buf, "halite-restore-trace 1") != 0)
		return bad(t, "expected 'halite-restore-trace 1', got %s", quoted(t, q, sizeof(q)));

	ret = next_line(t, &eof);
	if (ret)
		return ret;
	if (eof)
		return bad(t, "unexpected end of file; expected 'file-uuid <uuid>'");
	if (strncmp(t->buf, "file-uuid ", 10) != 0 || !parse_uuid(t->buf + 10, uuid))
		return bad(t, "expected 'file-uuid <32 lowercase hex digits>', got %s",
			   quoted(t, q, sizeof(q)));
	if (memcmp(uuid, fi->uuid, 16) != 0) {
		fmt_uuid(uuid, have);
		fmt_uuid(fi->uuid, want);
		return bad(t, "file-uuid %s is not the uuid of %s (%s): a trace of another file",
			   have, t->file, want);
	}
	return 0;
}

static int parse_stats(struct trace *t)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	char q[80], *f[4];
	unsigned n;
	bool eof;
	int ret;

	for (int i = 0; i < NSTATS; i++) {
		const char *name = stat_defs[i].name;
		enum stat_kind kind = stat_defs[i].kind;
		bool ok;

		ret = next_line(t, &eof);
		if (ret)
			return ret;
		if (eof)
			return bad(t, "unexpected end of file; expected 'stat %s %s'", name,
				   kind_syntax[kind]);
		n = split(t, f, 3);
		ok = n == 3 && strcmp(f[0], "stat") == 0 && strcmp(f[1], name) == 0;
		if (ok) {
			switch (kind) {
			case SK_U64:
				ok = parse_dec(f[2], &t->u[i]);
				break;
			case SK_PCT:
				ok = strlen(f[2]) < sizeof(t->pct_text) && parse_pct(f[2], &t->pct);
				if (ok)
					strcpy(t->pct_text, f[2]);
				break;
			case SK_BOOL:
				ok = parse_dec(f[2], &t->u[i]) && t->u[i] <= 1;
				break;
			case SK_ERR:
				ok = parse_err(f[2], &t->error);
				break;
			}
		}
		unsplit(t);
		if (!ok)
			return bad(t, "expected 'stat %s %s', got %s", name, kind_syntax[kind],
				   quoted(t, q, sizeof(q)));
		/* The trace must be of this file: the uuid says so, the shape must agree. */
		if (i == S_MB_TOTAL && t->u[i] != fi->mb_count)
			return bad(t, "mb_total %" PRIu64 ", but %s has %" PRIu64 " memory blocks",
				   t->u[i], t->file, fi->mb_count);
		if (i == S_LB_TOTAL && t->u[i] != fi->lb_count)
			return bad(t,
				   "lb_total %" PRIu64 ", but %s has %" PRIu64 " locality blocks",
				   t->u[i], t->file, fi->lb_count);
		/* A trace is written when the restore ends: it completed, or failed. */
		if (i == S_ERROR && t->u[S_DONE] && t->error)
			return bad(t, "error %d in a restore that completed (done 1)", t->error);
		if (i == S_ERROR && !t->u[S_DONE] && !t->error)
			return bad(t, "error 0 in a restore that did not complete (done 0)");
	}
	return 0;
}

/* Validates an lb line against the file and the line before it. */
static int parse_lb(struct trace *t, uint64_t prev, bool first, struct lb_line *l)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	struct halite_lb_info li;
	struct halite_mb_loc loc;
	char q[80], *f[8];
	uint64_t fmb = 0;
	bool ok;
	int ret;

	ok = split(t, f, 7) == 7 && strcmp(f[0], "lb") == 0 && parse_dec(f[1], &l->index) &&
	     parse_dec(f[3], &l->t_ns) && parse_dec(f[5], &l->staged) &&
	     parse_dec(f[6], &l->accessed);
	if (ok && strcmp(f[2], "demand") == 0) {
		l->how = FATE_DEMAND;
		ok = parse_dec(f[4], &fmb);
	} else if (ok && strcmp(f[2], "prefetch") == 0) {
		l->how = FATE_PREFETCH;
		ok = strcmp(f[4], "-") == 0;
	} else {
		ok = false;
	}
	unsplit(t);
	if (!ok) {
		if (strncmp(t->buf, "stat ", 5) == 0)
			return bad(t, "stat line after the lb lines, or a stat with a name of "
				      "version 1 given twice: %s", quoted(t, q, sizeof(q)));
		return bad(t, "expected '" LB_SYNTAX "', got %s", quoted(t, q, sizeof(q)));
	}
	l->fault_mb = fmb;

	if (l->index >= fi->lb_count)
		return bad(t, "LB index %" PRIu64 " out of range: %s has %" PRIu64
			      " locality blocks",
			   l->index, t->file, fi->lb_count);
	if (!first && l->index == prev)
		return bad(t, "LB %" PRIu64 " listed twice", l->index);
	if (!first && l->index < prev)
		return bad(t, "LB %" PRIu64 " after LB %" PRIu64
			      ": lb lines must be in ascending order of index",
			   l->index, prev);
	ret = halite_reader_lb_info(t->r, l->index, &li);
	if (ret < 0)
		return bad(t, "LB %" PRIu64 ": %s", l->index, halite_strerror(ret));
	if (l->how == FATE_PREFETCH) {
		if (l->staged || l->accessed)
			return bad(t, "LB %" PRIu64 ": a prefetched LB has staged 0 and accessed 0",
				   l->index);
		return 0;
	}
	ret = halite_reader_mb_lookup(t->r, fmb, &loc);
	if (ret < 0)
		return bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is not a memory block of %s "
			      "(it has %" PRIu64 ")",
			   l->index, fmb, t->file, fi->mb_count);
	if (loc.state != HALITE_MB_STORED)
		return bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is a%s block, stored nowhere",
			   l->index, fmb, loc.state == HALITE_MB_ZERO ? " zero" : "n untouched");
	if (loc.lb != l->index)
		return bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is stored in LB %" PRIu64
			      ", not in this one",
			   l->index, fmb, loc.lb);
	if (l->staged > li.mb_count - 1u)
		return bad(t, "LB %" PRIu64 ": staged %" PRIu64 ", but the LB holds only %u other "
			      "blocks",
			   l->index, l->staged, li.mb_count - 1u);
	if (l->accessed > l->staged)
		return bad(t, "LB %" PRIu64 ": accessed %" PRIu64 " exceeds staged %" PRIu64,
			   l->index, l->accessed, l->staged);
	return 0;
}

typedef int (*lb_fn)(void *ctx, const struct lb_line *l);

/*
 * Parse the whole trace from the start of t->f; @fn (if set) sees each lb
 * line once it is validated. 0, or the exit code after a message.
 */
static int trace_parse(struct trace *t, lb_fn fn, void *ctx)
{
	bool in_lbs = false, eof;
	uint64_t prev = 0;
	char q[80], *f[4];
	int ret;

	t->line = 0;
	t->n_lb = t->n_demand = t->n_prefetch = t->unknown_stats = 0;
	ret = parse_header(t);
	if (!ret)
		ret = parse_stats(t);
	if (ret)
		return ret;
	for (;;) {
		struct lb_line l;

		ret = next_line(t, &eof);
		if (ret)
			return ret;
		if (eof)
			break;

		/* Stats added to the struct later come after ours: skip their names. */
		if (!in_lbs && strncmp(t->buf, "stat ", 5) == 0) {
			unsigned n = split(t, f, 3);
			const char *dup = NULL;

			for (int i = 0; n == 3 && i < NSTATS; i++)
				if (strcmp(f[1], stat_defs[i].name) == 0)
					dup = stat_defs[i].name;
			if (n == 3 && !dup && stat_name_ok(f[1])) {
				t->unknown_stats++;
				continue;
			}
			unsplit(t);
			if (dup)
				return bad(t, "stat '%s' given twice", dup);
			return bad(t, "expected 'stat <name> <value>' or '" LB_SYNTAX "', got %s",
				   quoted(t, q, sizeof(q)));
		}
		ret = parse_lb(t, prev, !in_lbs, &l);
		if (ret)
			return ret;
		in_lbs = true;
		prev = l.index;
		t->n_lb++;
		if (l.how == FATE_DEMAND)
			t->n_demand++;
		else
			t->n_prefetch++;
		if (fn && (ret = fn(ctx, &l)))
			return ret;
	}
	t->line--; /* messages below name the last line */
	if (t->u[S_DONE] && t->n_lb != t->u[S_LB_TOTAL])
		return bad(t, "a completed restore lists every LB: %" PRIu64 " lb lines, lb_total %"
			      PRIu64, t->n_lb, t->u[S_LB_TOTAL]);
	if (t->u[S_DONE] && t->n_demand != t->u[S_LB_DEMAND])
		return bad(t, "a completed restore has lb_demand demand lines: %" PRIu64
			      ", lb_demand %" PRIu64, t->n_demand, t->u[S_LB_DEMAND]);
	return 0;
}

/* ---- streams ---- */

struct stream_row {
	uint32_t id;
	uint64_t lbs, demand, prefetch;
};

struct streams {
	struct stream_row *v;
	size_t n;
};

/* Sorted by id; a file has a few streams (one per vCPU) and many LBs. */
static struct stream_row *stream_find(const struct streams *s, uint32_t id)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid].id == id)
			return &s->v[mid];
		if (s->v[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int streams_gather(struct halite_reader *r, struct streams *s)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	size_t cap = 0;

	for (uint64_t i = 0; i < fi->lb_count; i++) {
		struct halite_lb_info li;
		struct stream_row *row;
		size_t at;
		int ret;

		ret = halite_reader_lb_info(r, i, &li);
		if (ret < 0)
			return ret;
		row = stream_find(s, li.stream);
		if (!row) {
			if (s->n == cap) {
				struct stream_row *v;

				cap = cap ? 2 * cap : 8;
				v = realloc(s->v, cap * sizeof(*v));
				if (!v)
					return -ENOMEM;
				s->v = v;
			}
			for (at = s->n; at > 0 && s->v[at - 1].id > li.stream; at--)
				s->v[at] = s->v[at - 1];
			s->v[at] = (struct stream_row){ .id = li.stream };
			s->n++;
			row = &s->v[at];
		}
		row->lbs++;
	}
	return 0;
}

struct counting {
	struct trace *t;
	struct streams *s;
};

static int count_lb(void *ctx, const struct lb_line *l)
{
	struct trace *t = ((struct counting *)ctx)->t;
	struct streams *s = ((struct counting *)ctx)->s;
	struct halite_lb_info li;
	struct stream_row *row;

	if (halite_reader_lb_info(t->r, l->index, &li) < 0 || !(row = stream_find(s, li.stream)))
		return bad(t, "LB %" PRIu64 ": not in the file's LB table", l->index);
	if (l->how == FATE_DEMAND)
		row->demand++;
	else
		row->prefetch++;
	return 0;
}

/*
 * A stream as halite_stream_name() prints it: vcpuN, virtual[.N],
 * physical[.N], other[.N], kindK.N. Anything else (vcpu01, virtual.0) is not
 * a name it prints, so is refused.
 */
static bool parse_stream(const char *s, uint32_t *id)
{
	static const char *const kinds[] = { "vcpu", "virtual", "physical", "other" };
	uint64_t kind = UINT64_MAX, index = 0;
	const char *p = NULL, *dot;
	char num[24], canon[48];

	if (strncmp(s, "kind", 4) == 0 && (dot = strchr(s, '.')) && dot - s - 4 < 20 &&
	    dot - s > 4) {
		memcpy(num, s + 4, (size_t)(dot - s - 4));
		num[dot - s - 4] = '\0';
		if (!parse_dec(num, &kind) || !parse_dec(dot + 1, &index))
			return false;
	} else {
		for (unsigned k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
			size_t n = strlen(kinds[k]);

			if (strncmp(s, kinds[k], n) == 0) {
				kind = k;
				p = s + n;
				break;
			}
		}
		if (!p)
			return false;
		if (kind == HALITE_STREAM_VCPU) {
			if (!parse_dec(p, &index))
				return false;
		} else if (*p == '.') {
			if (!parse_dec(p + 1, &index))
				return false;
		} else if (*p) {
			return false;
		}
	}
	if (kind > 255 || index > 0xffffffu)
		return false;
	*id = HALITE_STREAM(kind, index);
	return strcmp(halite_stream_name(*id, canon, sizeof(canon)), s) == 0;
}

/* ---- output ---- */

static const char *human_ns(uint64_t ns, char *buf, size_t len)
{
	if (ns < 1000)
		snprintf(buf, len, "%" PRIu64 " ns", ns);
	else if (ns < 1000000)
		snprintf(buf, len, "%.1f us", (double)ns / 1e3);
	else if (ns < 1000000000)
		snprintf(buf, len, "%.2f ms", (double)ns / 1e6);
	else
		snprintf(buf, len, "%.2f s", (double)ns / 1e9);
	return buf;
}

struct opts {
	const char *file, *trace;
	bool json, blocks;
	const char *stream_name;
	uint32_t stream;
};

static cJSON *head_json(const struct opts *o, const struct trace *t, const struct streams *s)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	cJSON *root = cJSON_CreateObject(), *st, *a, *e;
	uint64_t nev = 0;
	char buf[48];

	cJSON_AddStringToObject(root, "file", o->file);
	cJSON_AddStringToObject(root, "trace", o->trace);
	fmt_uuid(fi->uuid, buf);
	cJSON_AddStringToObject(root, "uuid", buf);
	json_add_u64(root, "lb_count", fi->lb_count);
	json_add_u64(root, "mb_count", fi->mb_count);
	st = cJSON_AddObjectToObject(root, "stats");
	for (int i = 0; i < NSTATS; i++) {
		const char *name = stat_defs[i].name;

		switch (stat_defs[i].kind) {
		case SK_U64:
			json_add_u64(st, name, t->u[i]);
			break;
		case SK_PCT:
			if (t->pct < 0)
				cJSON_AddNullToObject(st, name);
			else
				cJSON_AddRawToObject(st, name, t->pct_text);
			break;
		case SK_BOOL:
			cJSON_AddBoolToObject(st, name, t->u[i] != 0);
			break;
		case SK_ERR:
			cJSON_AddNumberToObject(st, name, t->error);
			break;
		}
	}
	if (t->error)
		cJSON_AddStringToObject(root, "error_text", halite_strerror(t->error));
	else
		cJSON_AddNullToObject(root, "error_text");
	for (size_t i = 0; i < s->n; i++)
		nev += s->v[i].lbs - s->v[i].demand - s->v[i].prefetch;
	e = cJSON_AddObjectToObject(root, "totals");
	json_add_u64(e, "lbs", fi->lb_count);
	json_add_u64(e, "demand", t->n_demand);
	json_add_u64(e, "prefetch", t->n_prefetch);
	json_add_u64(e, "never", nev);
	a = cJSON_AddArrayToObject(root, "streams");
	for (size_t i = 0; i < s->n; i++) {
		const struct stream_row *r = &s->v[i];

		e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "stream", halite_stream_name(r->id, buf, sizeof(buf)));
		json_add_u64(e, "stream_id", r->id);
		json_add_u64(e, "lbs", r->lbs);
		json_add_u64(e, "demand", r->demand);
		json_add_u64(e, "prefetch", r->prefetch);
		json_add_u64(e, "never", r->lbs - r->demand - r->prefetch);
		cJSON_AddItemToArray(a, e);
	}
	if (o->blocks && o->stream_name)
		cJSON_AddStringToObject(root, "stream", o->stream_name);
	return root;
}

#define KV "%-20s"

static void mb_row(const char *what, uint64_t n, uint64_t total)
{
	printf("  %-16s %12" PRIu64 "  %5.1f%%\n", what, n, pct(n, total));
}

static void text_summary(const struct opts *o, const struct trace *t, const struct streams *s)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	const uint64_t *u = t->u;
	uint64_t mb_in = u[S_MB_FAULT] + u[S_MB_POOL] + u[S_MB_PREFETCH] + u[S_MB_ZERO];
	uint64_t lb_read = u[S_LB_DEMAND] + u[S_LB_PREFETCH];
	char b1[32], b2[48];
	struct table *tb;

	printf(KV "%s\n", "File:", o->file);
	printf(KV "%s\n", "Trace:", o->trace);
	fmt_uuid(fi->uuid, b2);
	printf(KV "%s\n", "UUID:", b2);
	if (u[S_DONE])
		printf(KV "done\n", "Result:");
	else
		printf(KV "failed: %s (%d)\n", "Result:", halite_strerror(t->error), t->error);
	printf(KV "%s (open to ready)\n", "Ready:", human_ns(u[S_READY_NS], b1, sizeof(b1)));
	printf(KV "%s (ready to the end)\n", "Duration:",
	       human_ns(u[S_DURATION_NS], b1, sizeof(b1)));
	printf(KV "%" PRIu64 " (answered from memory %" PRIu64 ", zero %" PRIu64
		  ", from vCPUs %" PRIu64 ")\n",
	       "Faults:", u[S_FAULTS], u[S_FAULTS_CACHED], u[S_FAULTS_ZERO], u[S_FAULTS_VCPU]);
	if (u[S_FAULTS]) {
		printf(KV "p50 %s, ", "Fault service:",
		       human_ns(u[S_FAULT_P50_NS], b1, sizeof(b1)));
		printf("p99 %s\n", human_ns(u[S_FAULT_P99_NS], b1, sizeof(b1)));
	} else {
		printf(KV "no faults\n", "Fault service:");
	}
	printf("Memory blocks:      %" PRIu64 ", installed by\n", u[S_MB_TOTAL]);
	mb_row("fault", u[S_MB_FAULT], u[S_MB_TOTAL]);
	mb_row("pool", u[S_MB_POOL], u[S_MB_TOTAL]);
	mb_row("prefetch", u[S_MB_PREFETCH], u[S_MB_TOTAL]);
	mb_row("zero", u[S_MB_ZERO], u[S_MB_TOTAL]);
	if (mb_in < u[S_MB_TOTAL])
		mb_row("not installed", u[S_MB_TOTAL] - mb_in, u[S_MB_TOTAL]);
	printf(KV "%" PRIu64 ": demand %" PRIu64 " (%.1f%%), prefetch %" PRIu64
		  " (%.1f%%), never read %" PRIu64 " (%.1f%%)\n",
	       "Locality blocks:", u[S_LB_TOTAL], u[S_LB_DEMAND], pct(u[S_LB_DEMAND], u[S_LB_TOTAL]),
	       u[S_LB_PREFETCH], pct(u[S_LB_PREFETCH], u[S_LB_TOTAL]),
	       lb_read < u[S_LB_TOTAL] ? u[S_LB_TOTAL] - lb_read : 0,
	       pct(lb_read < u[S_LB_TOTAL] ? u[S_LB_TOTAL] - lb_read : 0, u[S_LB_TOTAL]));
	printf(KV "%" PRIu64 " (%s)\n", "Bytes read:", u[S_BYTES_READ],
	       human_bytes(u[S_BYTES_READ], b1, sizeof(b1)));
	printf(KV "%" PRIu64 "\n", "Retries:", u[S_LB_RETRIES]);
	if (t->pct < 0)
		printf(KV "not measured\n", "VM access:");
	else
		printf(KV "%.2f%% (%" PRIu64 " of %" PRIu64 " staged blocks touched)\n",
		       "VM access:", t->pct, u[S_MB_STAGED_ACCESSED], u[S_MB_STAGED]);

	printf("\nStreams (locality blocks):\n");
	{
		static const char *const h[] = { "STREAM", "LBS",   "DEMAND",
						 "PREFETCH", "NEVER", "DEMAND%" };

		tb = table_new(6, h, "lrrrrr");
		for (size_t i = 0; i < s->n; i++) {
			const struct stream_row *r = &s->v[i];
			char l[24], d[24], p[24], n[24], dp[16];

			snprintf(l, sizeof(l), "%" PRIu64, r->lbs);
			snprintf(d, sizeof(d), "%" PRIu64, r->demand);
			snprintf(p, sizeof(p), "%" PRIu64, r->prefetch);
			snprintf(n, sizeof(n), "%" PRIu64, r->lbs - r->demand - r->prefetch);
			snprintf(dp, sizeof(dp), "%.1f%%", pct(r->demand, r->lbs));
			table_row(tb, halite_stream_name(r->id, b2, sizeof(b2)), l, d, p, n, dp);
		}
		table_print(tb);
		table_free(tb);
	}
}

/* The --blocks listing: rows for the lb lines and for the LBs between them. */
struct rows {
	const struct opts *o;
	struct trace *t;
	struct table *tb;
	struct json_stream js;
	uint64_t next;		/* first LB not printed yet */
};

static int row(struct rows *w, uint64_t lb, const struct lb_line *l)
{
	struct halite_lb_info li;
	char sn[48];
	int ret;

	ret = halite_reader_lb_info(w->t->r, lb, &li);
	if (ret < 0)
		return bad(w->t, "LB %" PRIu64 ": %s", lb, halite_strerror(ret));
	if (w->o->stream_name && li.stream != w->o->stream)
		return 0;
	halite_stream_name(li.stream, sn, sizeof(sn));
	if (w->o->json) {
		cJSON *e = cJSON_CreateObject();

		json_add_u64(e, "lb", lb);
		cJSON_AddStringToObject(e, "stream", sn);
		json_add_u64(e, "stream_id", li.stream);
		json_add_u64(e, "seq", li.seq);
		cJSON_AddStringToObject(e, "fate", fate_names[l ? l->how : FATE_NEVER]);
		if (l) {
			json_add_u64(e, "t_ns", l->t_ns);
			if (l->how == FATE_DEMAND)
				json_add_u64(e, "fault_mb", l->fault_mb);
			else
				cJSON_AddNullToObject(e, "fault_mb");
			json_add_u64(e, "staged", l->staged);
			json_add_u64(e, "accessed", l->accessed);
		} else {
			cJSON_AddNullToObject(e, "t_ns");
			cJSON_AddNullToObject(e, "fault_mb");
			cJSON_AddNullToObject(e, "staged");
			cJSON_AddNullToObject(e, "accessed");
		}
		json_stream_item(&w->js, e);
	} else {
		char a[24], q[16], tm[32] = "-", fm[24] = "-", st[24] = "-", ac[24] = "-";

		snprintf(a, sizeof(a), "%" PRIu64, lb);
		snprintf(q, sizeof(q), "%u", li.seq);
		if (l) {
			snprintf(tm, sizeof(tm), "%.3f", (double)l->t_ns / 1e6);
			if (l->how == FATE_DEMAND)
				snprintf(fm, sizeof(fm), "%" PRIu64, l->fault_mb);
			snprintf(st, sizeof(st), "%" PRIu64, l->staged);
			snprintf(ac, sizeof(ac), "%" PRIu64, l->accessed);
		}
		table_row(w->tb, a, sn, q, fate_names[l ? l->how : FATE_NEVER], tm, fm, st, ac);
	}
	return 0;
}

static int row_lb(void *ctx, const struct lb_line *l)
{
	struct rows *w = ctx;
	int ret;

	for (; w->next < l->index; w->next++)
		if ((ret = row(w, w->next, NULL)))
			return ret;
	w->next = l->index + 1;
	return row(w, l->index, l);
}

static int digits(uint64_t v)
{
	int n = 1;

	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

/* Second pass over the trace, printing as it goes. */
static int list_blocks(const struct opts *o, struct trace *t, cJSON *head)
{
	static const char *const h[] = { "LB",	 "STREAM", "SEQ",    "FATE",
					 "T_MS", "FAULT_MB", "STAGED", "ACCESSED" };
	const struct halite_file_info *fi = halite_reader_info(t->r);
	struct rows w = { .o = o, .t = t };
	int ret, e;

	if (o->json) {
		json_stream_begin(&w.js, head, "lbs");
	} else {
		const int wd[] = { digits(fi->lb_count), 8, digits(fi->lb_count), 8, 10,
				   digits(fi->mb_count), 4, 4 };

		if (o->stream_name)
			printf("\nPer locality block, stream %s:\n", o->stream_name);
		else
			printf("\nPer locality block:\n");
		w.tb = table_new(8, h, "rlrlrrrr");
		table_stream(w.tb, wd);
	}
	rewind(t->f);
	ret = trace_parse(t, row_lb, &w);
	for (; !ret && w.next < fi->lb_count; w.next++)
		ret = row(&w, w.next, NULL);
	if (o->json) {
		e = json_stream_end(&w.js);
	} else {
		table_print(w.tb);
		table_free(w.tb);
		e = fflush(stdout) ? EXIT_USAGE : EXIT_OK;
	}
	return ret ? ret : e;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, OPT_JSON },
		{ "blocks", no_argument, NULL, 'b' },
		{ "stream", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, OPT_HELP },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":hbs:", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			o->json = true;
			break;
		case 'b':
			o->blocks = true;
			break;
		case 's':
			if (!parse_stream(optarg, &o->stream))
				return usage_error("restore",
						   "bad stream '%s': a name as " PROG
						   " prints it (vcpu0, virtual, physical, other, "
						   "other.2, ...)",
						   optarg);
			o->stream_name = optarg;
			o->blocks = true;
			break;
		case OPT_HELP:
			help_restore(stdout);
			return -1;
		default:
			return bad_option("restore", c, argv);
		}
	}
	if (argc - optind != 2)
		return usage_error("restore", "expected FILE and TRACE");
	o->file = argv[optind];
	o->trace = argv[optind + 1];
	return 0;
}

int cmd_restore(int argc, char **argv)
{
	struct opts o = { 0 };
	struct trace t = { 0 };
	struct streams s = { 0 };
	struct halite_reader *r = NULL;
	char errbuf[512];
	struct counting cnt = { &t, &s };
	cJSON *head;
	int ret;

	ret = parse_args(argc, argv, &o);
	if (ret)
		return ret < 0 ? EXIT_OK : ret;
	ret = open_reader(&r, o.file, errbuf, sizeof(errbuf));
	if (ret)
		return ret;
	ret = streams_gather(r, &s);
	if (ret < 0) {
		report_error(o.file, NULL, ret, halite_reader_errmsg(r));
		ret = exit_code_for(ret);
		goto out;
	}
	if (o.stream_name && !stream_find(&s, o.stream)) {
		errorf("%s: no stream '%s'", o.file, o.stream_name);
		ret = EXIT_USAGE;
		goto out;
	}
	t.f = fopen(o.trace, "r");
	if (!t.f) {
		errorf("%s: %s", o.trace, strerror(errno));
		ret = EXIT_USAGE;
		goto out;
	}
	t.path = o.trace;
	t.file = o.file;
	t.r = r;
	ret = trace_parse(&t, count_lb, &cnt);
	if (ret)
		goto out;

	if (o.json) {
		head = head_json(&o, &t, &s);
		if (o.blocks)
			ret = list_blocks(&o, &t, head);
		else
			ret = json_emit(head);
	} else {
		text_summary(&o, &t, &s);
		if (o.blocks)
			ret = list_blocks(&o, &t, NULL);
		else
			ret = fflush(stdout) ? EXIT_USAGE : EXIT_OK;
	}
out:
	if (t.f)
		fclose(t.f);
	free(s.v);
	halite_reader_free(r);
	return ret;
}
