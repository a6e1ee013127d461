// SPDX-License-Identifier: MIT
/*
 * halite-inspect: the restore trace parser (docs/restore-trace.md; the
 * interface is in trace.h).
 *
 * The trace is parsed strictly: every rule of the format page is checked and
 * the first violation is named by line ("trace.txt:7: expected 'stat mb_fault
 * <integer>', got '...'"), exit 1. Only what the page allows is let through:
 * stat lines after the known ones, whose names this version does not know,
 * are skipped.
 *
 * One pass, one line in memory at a time: a trace of a 1 TiB guest has
 * millions of lines, and `restore --blocks` reads it twice.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

const struct trace_stat_def trace_stats[NSTATS] = {
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

const char *const trace_fate_names[] = { "never", "demand", "prefetch" };

int trace_bad(const struct trace *t, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (t->errbuf)
		snprintf(t->errbuf, t->errbuf_len, "%s:%" PRIu64 ": %s", t->path, t->line, msg);
	else
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
	/* The line read ahead after file-uuid (trace_parse()): given again. */
	if (t->again) {
		t->again = false;
		return 0;
	}
	t->len = 0;
	t->line++;
	for (;;) {
		c = getc_unlocked(t->f);
		if (c == '\n')
			break;
		if (c == EOF) {
			if (ferror(t->f)) {
				if (t->errbuf)
					snprintf(t->errbuf, t->errbuf_len, "%s: reading: %s",
						 t->path, strerror(errno));
				else
					errorf("%s: reading: %s", t->path, strerror(errno));
				return EXIT_FAIL;
			}
			if (t->len == 0) {
				*eof = true;
				return 0;
			}
			t->buf[t->len] = '\0';
			return trace_bad(t, "the last line does not end with a newline");
		}
		if (c == '\r')
			return trace_bad(t, "carriage return in line (CRLF line ends?); lines end "
					    "with a single newline");
		if (c < 0x20 || c > 0x7e)
			return trace_bad(t, "byte 0x%02x at column %zu: only printable ASCII is "
					    "allowed", (unsigned)c, t->len + 1);
		if (t->len == TRACE_LINE_MAX)
			return trace_bad(t, "line longer than %d bytes", TRACE_LINE_MAX);
		t->buf[t->len++] = (char)c;
	}
	t->buf[t->len] = '\0';
	if (t->len == 0)
		return trace_bad(t, "empty line");
	if (t->buf[0] == ' ')
		return trace_bad(t, "leading space");
	if (t->buf[t->len - 1] == ' ')
		return trace_bad(t, "trailing space");
	if (strstr(t->buf, "  "))
		return trace_bad(t, "two spaces in a row; fields are separated by exactly one "
				    "space");
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

bool trace_parse_dec(const char *s, uint64_t *out)
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
	if (!trace_parse_dec(ip, &v) || dot[1] < '0' || dot[1] > '9' || dot[2] < '0' ||
	    dot[2] > '9')
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
	if (s[0] != '-' || !trace_parse_dec(s + 1, &v) || v == 0 || v > 2147483648u)
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

void trace_fmt_uuid(const uint8_t *u, char *buf)
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
		return trace_bad(t, "empty file; expected 'halite-restore-trace 1' or 2");
	if (strncmp(t->buf, "halite-restore-trace ", 21) == 0 &&
	    trace_parse_dec(t->buf + 21, &v) && v != 1 && v != 2)
		return trace_bad(t, "trace version %" PRIu64 ": this reader knows versions 1 "
				    "and 2 only", v);
	if (strcmp(t->buf, "halite-restore-trace 1") && strcmp(t->buf, "halite-restore-trace 2"))
		return trace_bad(t, "expected 'halite-restore-trace 1' or 2, got %s",
				 quoted(t, q, sizeof(q)));
	t->version = t->buf[21] == '2' ? 2 : 1;

	ret = next_line(t, &eof);
	if (ret)
		return ret;
	if (eof)
		return trace_bad(t, "unexpected end of file; expected 'file-uuid <uuid>'");
	if (strncmp(t->buf, "file-uuid ", 10) != 0 || !parse_uuid(t->buf + 10, uuid))
		return trace_bad(t, "expected 'file-uuid <32 lowercase hex digits>', got %s",
				 quoted(t, q, sizeof(q)));
	if (memcmp(uuid, fi->uuid, 16) != 0) {
		trace_fmt_uuid(uuid, have);
		trace_fmt_uuid(fi->uuid, want);
		t->wrong_file = true;
		return trace_bad(t, "file-uuid %s is not the uuid of %s (%s): a trace of another "
				    "file", have, t->file, want);
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
		const char *name = trace_stats[i].name;
		enum stat_kind kind = trace_stats[i].kind;
		bool ok;

		ret = next_line(t, &eof);
		if (ret)
			return ret;
		if (eof)
			return trace_bad(t, "unexpected end of file; expected 'stat %s %s'", name,
					 kind_syntax[kind]);
		n = split(t, f, 3);
		ok = n == 3 && strcmp(f[0], "stat") == 0 && strcmp(f[1], name) == 0;
		if (ok) {
			switch (kind) {
			case SK_U64:
				ok = trace_parse_dec(f[2], &t->u[i]);
				break;
			case SK_PCT:
				ok = strlen(f[2]) < sizeof(t->pct_text) && parse_pct(f[2], &t->pct);
				if (ok)
					strcpy(t->pct_text, f[2]);
				break;
			case SK_BOOL:
				ok = trace_parse_dec(f[2], &t->u[i]) && t->u[i] <= 1;
				break;
			case SK_ERR:
				ok = parse_err(f[2], &t->error);
				break;
			}
		}
		unsplit(t);
		if (!ok)
			return trace_bad(t, "expected 'stat %s %s', got %s", name,
					 kind_syntax[kind], quoted(t, q, sizeof(q)));
		/* The trace must be of this file: the uuid says so, the shape must agree. */
		if (i == S_MB_TOTAL && t->u[i] != fi->mb_count)
			return trace_bad(t, "mb_total %" PRIu64 ", but %s has %" PRIu64
					    " memory blocks", t->u[i], t->file, fi->mb_count);
		if (i == S_LB_TOTAL && t->u[i] != fi->lb_count)
			return trace_bad(t, "lb_total %" PRIu64 ", but %s has %" PRIu64
					    " locality blocks", t->u[i], t->file, fi->lb_count);
		/* A trace is written when the restore ends: it completed, or failed. */
		if (i == S_ERROR && t->u[S_DONE] && t->error)
			return trace_bad(t, "error %d in a restore that completed (done 1)",
					 t->error);
		if (i == S_ERROR && !t->u[S_DONE] && !t->error)
			return trace_bad(t, "error 0 in a restore that did not complete (done 0)");
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

	ok = split(t, f, 7) == 7 && strcmp(f[0], "lb") == 0 &&
	     trace_parse_dec(f[1], &l->index) && trace_parse_dec(f[3], &l->t_ns) &&
	     trace_parse_dec(f[5], &l->staged) && trace_parse_dec(f[6], &l->accessed);
	if (ok && strcmp(f[2], "demand") == 0) {
		l->how = FATE_DEMAND;
		ok = trace_parse_dec(f[4], &fmb);
	} else if (ok && strcmp(f[2], "prefetch") == 0) {
		l->how = FATE_PREFETCH;
		ok = strcmp(f[4], "-") == 0;
	} else {
		ok = false;
	}
	unsplit(t);
	if (!ok) {
		if (strncmp(t->buf, "stat ", 5) == 0)
			return trace_bad(t, "stat line after the lb lines, or a stat with a name "
					    "of version 1 given twice: %s", quoted(t, q, sizeof(q)));
		return trace_bad(t, "expected '" LB_SYNTAX "', got %s",
				 quoted(t, q, sizeof(q)));
	}
	l->fault_mb = fmb;

	if (l->index >= fi->lb_count)
		return trace_bad(t, "LB index %" PRIu64 " out of range: %s has %" PRIu64
				    " locality blocks",
				 l->index, t->file, fi->lb_count);
	if (!first && l->index == prev)
		return trace_bad(t, "LB %" PRIu64 " listed twice", l->index);
	if (!first && l->index < prev)
		return trace_bad(t, "LB %" PRIu64 " after LB %" PRIu64
				    ": lb lines must be in ascending order of index",
				 l->index, prev);
	ret = halite_reader_lb_info(t->r, l->index, &li);
	if (ret < 0)
		return trace_bad(t, "LB %" PRIu64 ": %s", l->index, halite_strerror(ret));
	if (l->how == FATE_PREFETCH) {
		if (l->staged || l->accessed)
			return trace_bad(t, "LB %" PRIu64 ": a prefetched LB has staged 0 and "
					    "accessed 0", l->index);
		return 0;
	}
	ret = halite_reader_mb_lookup(t->r, fmb, &loc);
	if (ret < 0)
		return trace_bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is not a memory block "
				    "of %s (it has %" PRIu64 ")",
				 l->index, fmb, t->file, fi->mb_count);
	if (loc.state != HALITE_MB_STORED)
		return trace_bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is a%s block, stored "
				    "nowhere",
				 l->index, fmb,
				 loc.state == HALITE_MB_ZERO ? " zero" : "n untouched");
	if (loc.lb != l->index)
		return trace_bad(t, "LB %" PRIu64 ": fault_mb %" PRIu64 " is stored in LB %" PRIu64
				    ", not in this one",
				 l->index, fmb, loc.lb);
	if (l->staged > li.mb_count - 1u)
		return trace_bad(t, "LB %" PRIu64 ": staged %" PRIu64 ", but the LB holds only %u "
				    "other blocks",
				 l->index, l->staged, li.mb_count - 1u);
	if (l->accessed > l->staged)
		return trace_bad(t, "LB %" PRIu64 ": accessed %" PRIu64 " exceeds staged %" PRIu64,
				 l->index, l->accessed, l->staged);
	return 0;
}

#define LEARN_SYNTAX "learn <window_ms> <complete>"
#define TOUCH_SYNTAX "touch <t_ns> <vcpu> <mb> <stored|zero|untouched>"

static const char *const kind_names[] = {
	[HALITE_MB_UNTOUCHED] = "untouched",
	[HALITE_MB_ZERO] = "zero",
	[HALITE_MB_STORED] = "stored",
};

static int parse_learn(struct trace *t)
{
	uint64_t c;
	char q[80], *f[4];
	bool ok;

	ok = split(t, f, 3) == 3 && strcmp(f[0], "learn") == 0 &&
	     trace_parse_dec(f[1], &t->learn_window_ms) && trace_parse_dec(f[2], &c) && c <= 1;
	unsplit(t);
	if (!ok)
		return trace_bad(t, "expected '" LEARN_SYNTAX "', got %s", quoted(t, q, sizeof(q)));
	t->learn_complete = c;
	return 0;
}

/* Counts a touch of @vcpu in the sorted t->vcpus; -ENOMEM if it cannot grow. */
static int count_vcpu(struct trace *t, uint32_t vcpu)
{
	size_t lo = 0, hi = t->n_vcpus;
	struct touch_vcpu *v;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (t->vcpus[mid].vcpu == vcpu) {
			t->vcpus[mid].touches++;
			return 0;
		}
		if (t->vcpus[mid].vcpu < vcpu)
			lo = mid + 1;
		else
			hi = mid;
	}
	v = realloc(t->vcpus, (t->n_vcpus + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	t->vcpus = v;
	memmove(v + lo + 1, v + lo, (t->n_vcpus - lo) * sizeof(*v));
	v[lo] = (struct touch_vcpu){ vcpu, 1 };
	t->n_vcpus++;
	return 0;
}

/*
 * A touch line, against the file and the touches before it. The vCPU is
 * checked against the file's vCPU count when the file records one; else only
 * that it can name a stream (24 bits), as relayout makes one per vCPU.
 */
static int parse_touch(struct trace *t, uint64_t prev_t, struct touch_line *l)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	const struct halite_root *roots;
	uint32_t vcount = 0, nroots;
	struct halite_mb_loc loc;
	uint64_t vcpu = 0;
	char q[80], *f[6];
	bool ok;
	int ret;

	ok = split(t, f, 5) == 5 && strcmp(f[0], "touch") == 0 &&
	     trace_parse_dec(f[1], &l->t_ns) && trace_parse_dec(f[3], &l->mb) &&
	     (strcmp(f[2], "-") == 0 || trace_parse_dec(f[2], &vcpu));
	l->kind = 3;
	for (uint32_t k = 0; ok && k < 3; k++)
		if (strcmp(f[4], kind_names[k]) == 0)
			l->kind = k;
	ok = ok && l->kind < 3;
	l->vcpu = ok && strcmp(f[2], "-") == 0 ? TOUCH_NOT_VCPU : (uint32_t)vcpu;
	unsplit(t);
	if (!ok) {
		if (strncmp(t->buf, "learn ", 6) == 0)
			return trace_bad(t, "a second learn line: %s", quoted(t, q, sizeof(q)));
		return trace_bad(t, "expected '" TOUCH_SYNTAX "', got %s", quoted(t, q, sizeof(q)));
	}
	if (l->vcpu != TOUCH_NOT_VCPU) {
		if (halite_reader_vcpus(t->r, &vcount, &roots, &nroots) < 0)
			vcount = 0;
		if (vcount && vcpu >= vcount)
			return trace_bad(t, "vCPU %" PRIu64 " out of range: %s has %u vCPUs", vcpu,
					 t->file, vcount);
		if (vcpu > 0xffffffu)
			return trace_bad(t, "vCPU %" PRIu64 " out of range: at most 16777215", vcpu);
	}
	if (l->mb >= fi->mb_count)
		return trace_bad(t, "memory block %" PRIu64 " out of range: %s has %" PRIu64
				    " memory blocks", l->mb, t->file, fi->mb_count);
	if (l->t_ns < prev_t)
		return trace_bad(t, "t_ns %" PRIu64 " before the previous touch's %" PRIu64
				    ": touch lines are in touch order", l->t_ns, prev_t);
	if (t->seen[l->mb / 8] & (1u << (l->mb % 8)))
		return trace_bad(t, "memory block %" PRIu64 " touched twice", l->mb);
	t->seen[l->mb / 8] |= (uint8_t)(1u << (l->mb % 8));
	ret = halite_reader_mb_lookup(t->r, l->mb, &loc);
	if (ret < 0)
		return trace_bad(t, "memory block %" PRIu64 ": %s", l->mb, halite_strerror(ret));
	if (loc.state != l->kind)
		return trace_bad(t, "memory block %" PRIu64 " is %s in %s, not %s", l->mb,
				 loc.state < 3 ? kind_names[loc.state] : "?", t->file,
				 kind_names[l->kind]);
	return 0;
}

/* Version 2's part after the lb lines, from its learn line (in t->buf). */
static int parse_learning(struct trace *t)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	uint64_t prev_t = 0;
	bool eof;
	int ret;

	ret = parse_learn(t);
	if (ret)
		return ret;
	t->seen = calloc(fi->mb_count / 8 + 1, 1);
	if (!t->seen) {
		errorf("out of memory for %" PRIu64 " memory blocks", fi->mb_count);
		return EXIT_FAIL;
	}
	for (;;) {
		struct touch_line l;

		ret = next_line(t, &eof);
		if (ret || eof)
			return ret;
		ret = parse_touch(t, prev_t, &l);
		if (ret)
			return ret;
		prev_t = l.t_ns;
		l.rank = t->n_touch++;
		t->n_touch_kind[l.kind]++;
		if (l.vcpu == TOUCH_NOT_VCPU) {
			t->n_touch_other++;
		} else if (count_vcpu(t, l.vcpu) < 0) {
			errorf("out of memory");
			return EXIT_FAIL;
		}
		if (t->touch_fn && (ret = t->touch_fn(t->touch_ctx, &l)))
			return ret;
	}
}

void trace_free(struct trace *t)
{
	free(t->vcpus);
	free(t->seen);
	t->vcpus = NULL;
	t->seen = NULL;
	t->n_vcpus = 0;
}

int trace_parse(struct trace *t, lb_fn fn, void *ctx)
{
	bool in_lbs = false, eof;
	uint64_t prev = 0;
	char q[80], *f[4];
	int ret;

	t->line = 0;
	t->n_lb = t->n_demand = t->n_prefetch = t->unknown_stats = 0;
	t->lb_hot = t->lb_hot_line = 0;
	trace_free(t);
	t->n_touch = t->n_touch_other = 0;
	memset(t->n_touch_kind, 0, sizeof(t->n_touch_kind));
	t->learn_window_ms = 0;
	t->learn_complete = false;
	t->wrong_file = false;
	t->from_template = t->again = false;
	memset(t->u, 0, sizeof(t->u));
	t->pct = 0;
	t->pct_text[0] = '\0';
	t->error = 0;
	ret = parse_header(t);
	if (ret)
		return ret;
	/* Version 2 written by a template: the learn line right after file-uuid. */
	if (t->version == 2) {
		ret = next_line(t, &eof);
		if (ret)
			return ret;
		if (eof)
			return trace_bad(t, "unexpected end of file; expected 'stat %s %s' or "
					    "(written by a template) '" LEARN_SYNTAX "'",
					 trace_stats[0].name, kind_syntax[trace_stats[0].kind]);
		if (strncmp(t->buf, "learn ", 6) == 0) {
			t->from_template = true;
			ret = parse_learning(t);
			if (!ret)
				t->line--; /* as below: the last line, not the end */
			return ret;
		}
		t->again = true;
	}
	ret = parse_stats(t);
	if (ret)
		return ret;
	for (;;) {
		struct lb_line l;

		ret = next_line(t, &eof);
		if (ret)
			return ret;
		if (eof) {
			if (t->version == 2) {
				t->line--;
				return trace_bad(t, "no '" LEARN_SYNTAX "' line after the lb lines: "
						    "version 2 has one");
			}
			break;
		}
		if (t->version == 2 && strncmp(t->buf, "learn ", 6) == 0) {
			ret = parse_learning(t);
			if (ret)
				return ret;
			break;
		}

		/* Stats added to the struct later come after ours: skip their names. */
		if (!in_lbs && strncmp(t->buf, "stat ", 5) == 0) {
			unsigned n = split(t, f, 3);
			const char *dup = NULL;

			for (int i = 0; n == 3 && i < NSTATS; i++)
				if (strcmp(f[1], trace_stats[i].name) == 0)
					dup = trace_stats[i].name;
			/* The one stat added since version 1's 23: read, not skipped. */
			if (n == 3 && strcmp(f[1], "lb_hot") == 0 && !t->lb_hot_line) {
				if (!trace_parse_dec(f[2], &t->lb_hot)) {
					unsplit(t);
					return trace_bad(t, "expected 'stat lb_hot <integer>', got %s",
							 quoted(t, q, sizeof(q)));
				}
				if (t->lb_hot > t->u[S_LB_PREFETCH])
					return trace_bad(t, "lb_hot %" PRIu64 " exceeds lb_prefetch "
							    "%" PRIu64 ": the hot LBs read first are "
							    "prefetched", t->lb_hot,
							 t->u[S_LB_PREFETCH]);
				t->lb_hot_line = t->line;
				continue;
			}
			if (n == 3 && strcmp(f[1], "lb_hot") == 0)
				dup = "lb_hot";
			if (n == 3 && !dup && stat_name_ok(f[1])) {
				t->unknown_stats++;
				continue;
			}
			unsplit(t);
			if (dup)
				return trace_bad(t, "stat '%s' given twice", dup);
			return trace_bad(t, "expected 'stat <name> <value>' or '" LB_SYNTAX
					    "', got %s", quoted(t, q, sizeof(q)));
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
		return trace_bad(t, "a completed restore lists every LB: %" PRIu64
				    " lb lines, lb_total %" PRIu64, t->n_lb, t->u[S_LB_TOTAL]);
	if (t->u[S_DONE] && t->n_demand != t->u[S_LB_DEMAND])
		return trace_bad(t, "a completed restore has lb_demand demand lines: %" PRIu64
				    ", lb_demand %" PRIu64, t->n_demand, t->u[S_LB_DEMAND]);
	return 0;
}
