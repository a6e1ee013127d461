// SPDX-License-Identifier: MIT
/*
 * halite-inspect restore: what a lazy restore of a file read, when and why,
 * from the trace the restore engine writes (docs/restore-trace.md): the
 * restore's statistics, and per stream and per locality block which LBs
 * the guest demanded, which the prefetcher brought in, and which were never
 * needed. The trace is parsed, strictly, by trace.c.
 *
 * Memory stays flat for any file size: one pass validates the trace and
 * counts per stream; --blocks reads the trace a second time and prints one
 * row per LB as it goes (a trace of a 1 TiB guest has millions of lines).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "inspect.h"
#include "trace.h"

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
		"A good restore demands what the vCPUs touch and prefetches the rest.\n"
		"A learning restore's trace (version 2, halite-qemu restore --learn) also\n"
		"says how many memory blocks the guest first touched after resume, per\n"
		"vCPU; '" PROG " relayout' puts them first in a new file. A restore of a\n"
		"relayouted file reads its hot prefix first: how many LBs of it is shown\n"
		"with the file's hot prefix. A template's hot set (halite-cloned:\n"
		"templates/ID.hot) is such a trace without the restore's statistics and\n"
		"LB lines.\n\n"
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
		"  -h, --help       this text\n"
		"  --version        the program's and the file format's version\n\n"
		"JSON keys: ok (and on failure error and exit), file, trace, uuid,\n"
		"  lb_count and mb_count (of FILE); written_by: restore, or template for\n"
		"  a template's hot set (version 2 without stat and lb lines: stats null,\n"
		"  every LB never read);\n"
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
		"    apply: fault_mb unless demand, all four when never);\n"
		"  trace_version (1 or 2); learn: null for version 1, else window_ms,\n"
		"    complete (boolean), touches (memory blocks first touched after\n"
		"    resume), stored, zero, untouched (of those, by their state in FILE),\n"
		"    not_vcpu (touched first by a thread that is not a vCPU) and vcpus[]:\n"
		"    vcpu, touches;\n"
		"  hot_prefix: lb_hot (the LBs of FILE's hot prefix the restore read\n"
		"    first, stat lb_hot; null for a trace written before it existed),\n"
		"    file_hot_lbs and traces (FILE's hot prefix and how many traces it\n"
		"    was relayouted from, metadata " HLT_RELAYOUT_META "; null when FILE\n"
		"    has no hot prefix: not relayouted, or a record the restore engine\n"
		"    ignores too).\n\n"
		"Exit status: 0 ok, 1 FILE or TRACE is bad, does not open or they do not\n"
		"match, 2 usage.\n");
	help_store(f);
}

/* ---- streams ---- */

struct stream_row {
	uint32_t id;
	uint64_t lbs, demand, prefetch;
};

struct streams {
	struct stream_row *v;
	size_t n, cap;
};

/* Sorted by id; a file has a few streams (one per vCPU) and many LBs. */
static struct stream_row *stream_find(struct streams *s, uint32_t id)
{
	return id_row(&s->v, &s->n, &s->cap, sizeof(*s->v), id, false);
}

static int streams_gather(struct halite_reader *r, struct streams *s)
{
	const struct halite_file_info *fi = halite_reader_info(r);

	for (uint64_t i = 0; i < fi->lb_count; i++) {
		struct halite_lb_info li;
		struct stream_row *row;
		int ret;

		ret = halite_reader_lb_info(r, i, &li);
		if (ret < 0)
			return ret;
		row = id_row(&s->v, &s->n, &s->cap, sizeof(*s->v), li.stream, true);
		if (!row)
			return -ENOMEM;
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
		return trace_bad(t, "LB %" PRIu64 ": not in the file's LB table", l->index);
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
		if (!trace_parse_dec(num, &kind) || !trace_parse_dec(dot + 1, &index))
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
			if (!trace_parse_dec(p, &index))
				return false;
		} else if (*p == '.') {
			if (!trace_parse_dec(p + 1, &index))
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

struct opts {
	const char *file, *trace;
	bool json, blocks;
	const char *stream_name;
	uint32_t stream;
	/* FILE's hot prefix (file_hot()) */
	bool relayouted;
	uint64_t hot_lbs, traces;
};

/*
 * FILE's hot prefix (metadata HLT_RELAYOUT_META, read as the engine reads
 * it: relayout_meta.h): true with *@hot_lbs and *@traces when the file has
 * the record and both values read; the engine ignores a record it cannot
 * read, and so do we.
 */
static bool file_hot(struct halite_reader *r, uint64_t *hot_lbs, uint64_t *traces)
{
	struct hlt_relayout rel;

	if (hlt_relayout_read(r, &rel) || !rel.present || !rel.has_traces)
		return false;
	*hot_lbs = rel.hot_lbs;
	*traces = rel.traces;
	return true;
}

static cJSON *head_json(const struct opts *o, const struct trace *t, const struct streams *s)
{
	const struct halite_file_info *fi = halite_reader_info(t->r);
	cJSON *root = cJSON_CreateObject(), *st, *a, *e;
	uint64_t nev = 0;
	char buf[48];

	cJSON_AddStringToObject(root, "file", o->file);
	cJSON_AddStringToObject(root, "trace", o->trace);
	trace_fmt_uuid(fi->uuid, buf);
	cJSON_AddStringToObject(root, "uuid", buf);
	json_add_u64(root, "lb_count", fi->lb_count);
	json_add_u64(root, "mb_count", fi->mb_count);
	cJSON_AddStringToObject(root, "written_by", t->from_template ? "template" : "restore");
	st = t->from_template ? NULL : cJSON_AddObjectToObject(root, "stats");
	if (!st)
		cJSON_AddNullToObject(root, "stats");
	for (int i = 0; st && i < NSTATS; i++) {
		const char *name = trace_stats[i].name;

		switch (trace_stats[i].kind) {
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
	json_add_u64(root, "trace_version", t->version);
	if (t->version < 2) {
		cJSON_AddNullToObject(root, "learn");
	} else {
		cJSON *l = cJSON_AddObjectToObject(root, "learn");

		json_add_u64(l, "window_ms", t->learn_window_ms);
		cJSON_AddBoolToObject(l, "complete", t->learn_complete);
		json_add_u64(l, "touches", t->n_touch);
		json_add_u64(l, "stored", t->n_touch_kind[HALITE_MB_STORED]);
		json_add_u64(l, "zero", t->n_touch_kind[HALITE_MB_ZERO]);
		json_add_u64(l, "untouched", t->n_touch_kind[HALITE_MB_UNTOUCHED]);
		json_add_u64(l, "not_vcpu", t->n_touch_other);
		a = cJSON_AddArrayToObject(l, "vcpus");
		for (size_t i = 0; i < t->n_vcpus; i++) {
			e = cJSON_CreateObject();
			json_add_u64(e, "vcpu", t->vcpus[i].vcpu);
			json_add_u64(e, "touches", t->vcpus[i].touches);
			cJSON_AddItemToArray(a, e);
		}
	}
	e = cJSON_AddObjectToObject(root, "hot_prefix");
	if (t->lb_hot_line)
		json_add_u64(e, "lb_hot", t->lb_hot);
	else
		cJSON_AddNullToObject(e, "lb_hot");
	if (o->relayouted) {
		json_add_u64(e, "file_hot_lbs", o->hot_lbs);
		json_add_u64(e, "traces", o->traces);
	} else {
		cJSON_AddNullToObject(e, "file_hot_lbs");
		cJSON_AddNullToObject(e, "traces");
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
	trace_fmt_uuid(fi->uuid, b2);
	printf(KV "%s\n", "UUID:", b2);
	if (t->from_template) {
		printf(KV "a template (the clone service's hot set): no restore statistics, no "
			  "LB read\n", "Written by:");
		goto learning;
	}
	if (u[S_DONE])
		printf(KV "done\n", "Result:");
	else
		printf(KV "failed: %s (%d)\n", "Result:", halite_strerror(t->error), t->error);
	printf(KV "%s (open to ready)\n", "Ready:", halite_human_ns(u[S_READY_NS], b1, sizeof(b1)));
	printf(KV "%s (ready to the end)\n", "Duration:",
	       halite_human_ns(u[S_DURATION_NS], b1, sizeof(b1)));
	printf(KV "%" PRIu64 " (answered from memory %" PRIu64 ", zero %" PRIu64
		  ", from vCPUs %" PRIu64 ")\n",
	       "Faults:", u[S_FAULTS], u[S_FAULTS_CACHED], u[S_FAULTS_ZERO], u[S_FAULTS_VCPU]);
	if (u[S_FAULTS]) {
		printf(KV "p50 %s, ", "Fault service:",
		       halite_human_ns(u[S_FAULT_P50_NS], b1, sizeof(b1)));
		printf("p99 %s\n", halite_human_ns(u[S_FAULT_P99_NS], b1, sizeof(b1)));
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
	if (!t->lb_hot_line)
		printf(KV "not in the trace", "Hot prefix:");
	else
		printf(KV "%" PRIu64 " LB%s read first", "Hot prefix:", t->lb_hot,
		       t->lb_hot == 1 ? "" : "s");
	if (o->relayouted)
		printf(", of the file's %" PRIu64 " (relayouted from %" PRIu64 " trace%s)\n",
		       o->hot_lbs, o->traces, o->traces == 1 ? "" : "s");
	else
		printf(" (the file has no hot prefix)\n");
learning:
	if (t->version >= 2) {
		printf(KV "%" PRIu64 " memory blocks first touched in a %" PRIu64 " ms window "
			  "(%s): stored %" PRIu64 ", zero %" PRIu64 ", never-touched %" PRIu64 "\n",
		       "Learning:", t->n_touch, t->learn_window_ms,
		       t->learn_complete ? "complete" : "cut short",
		       t->n_touch_kind[HALITE_MB_STORED], t->n_touch_kind[HALITE_MB_ZERO],
		       t->n_touch_kind[HALITE_MB_UNTOUCHED]);
		printf(KV, "Touches by:");
		for (size_t i = 0; i < t->n_vcpus; i++)
			printf("%svcpu%u %" PRIu64, i ? ", " : "", t->vcpus[i].vcpu,
			       t->vcpus[i].touches);
		printf("%sother threads %" PRIu64 "\n", t->n_vcpus ? ", " : "", t->n_touch_other);
	}

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
		return trace_bad(w->t, "LB %" PRIu64 ": %s", lb, halite_strerror(ret));
	if (w->o->stream_name && li.stream != w->o->stream)
		return 0;
	halite_stream_name(li.stream, sn, sizeof(sn));
	if (w->o->json) {
		cJSON *e = cJSON_CreateObject();

		json_add_u64(e, "lb", lb);
		cJSON_AddStringToObject(e, "stream", sn);
		json_add_u64(e, "stream_id", li.stream);
		json_add_u64(e, "seq", li.seq);
		cJSON_AddStringToObject(e, "fate", trace_fate_names[l ? l->how : FATE_NEVER]);
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
		table_row(w->tb, a, sn, q, trace_fate_names[l ? l->how : FATE_NEVER], tm, fm, st,
			  ac);
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
		e = json_stream_end(&w.js, ret > 0 ? ret : EXIT_OK);
	} else {
		table_print(w.tb);
		table_free(w.tb);
		e = fflush(stdout) ? EXIT_FAIL : EXIT_OK;
	}
	return ret ? ret : e;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "blocks", no_argument, NULL, 'b' },
		{ "stream", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":hbs:", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			run_set_json();
			break;
		case 'b':
			o->blocks = true;
			break;
		case 's':
			if (!parse_stream(optarg, &o->stream))
				return usage_error("bad stream '%s': a name as " PROG
						   " prints it (vcpu0, virtual, physical, other, "
						   "other.2, ...)",
						   optarg);
			o->stream_name = optarg;
			o->blocks = true;
			break;
		default:
			/* -1: done, exit 0 (help, version); else the exit code. */
			c = common_option(c, argv, help_restore);
			return c == EXIT_OK ? -1 : c;
		}
	}
	o->json = run_json();
	if (argc - optind != 2)
		return usage_hint("expected FILE and TRACE");
	o->file = argv[optind];
	o->trace = argv[optind + 1];
	cJSON_AddStringToObject(run_result(), "file", o->file);
	cJSON_AddStringToObject(run_result(), "trace", o->trace);
	return 0;
}

static const char *const restore_keys[] = {
	"file", "trace", "uuid", "lb_count", "mb_count", "written_by", "stats", "error_text",
	"totals", "streams", "trace_version", "learn", "hot_prefix", NULL,
};

int cmd_restore(int argc, char **argv)
{
	struct opts o = { 0 };
	struct trace t = { 0 };
	struct streams s = { 0 };
	struct halite_reader *r = NULL;
	struct counting cnt = { &t, &s };
	struct stat st;
	cJSON *head;
	int ret;

	run_keys(restore_keys);
	ret = parse_args(argc, argv, &o);
	if (ret)
		return ret < 0 ? EXIT_OK : ret;
	ret = open_reader(&r, o.file);
	if (ret)
		return ret;
	ret = streams_gather(r, &s);
	if (ret < 0) {
		report_error(o.file, NULL, ret, halite_reader_errmsg(r));
		ret = exit_code_for(ret);
		goto out;
	}
	if (o.stream_name && !stream_find(&s, o.stream)) {
		char list[512], sn[48];
		size_t n = 0;

		list[0] = '\0';
		for (size_t i = 0; i < s.n && n < sizeof(list); i++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "",
					      halite_stream_name(s.v[i].id, sn, sizeof(sn)));
		ret = usage_error("%s: no stream '%s'; the file has: %s", o.file, o.stream_name,
				  s.n ? list : "none");
		goto out;
	}
	/* As FILE: a TRACE that is there but cannot be one is a wrong argument. */
	if (stat(o.trace, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
		ret = usage_error("%s: not a regular file%s", o.trace,
				  S_ISDIR(st.st_mode) ? " (a directory)" : "");
		goto out;
	}
	t.f = fopen(o.trace, "r");
	if (!t.f) {
		errorf("%s: %s", o.trace, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	t.path = o.trace;
	t.file = o.file;
	t.r = r;
	ret = trace_parse(&t, count_lb, &cnt);
	if (ret)
		goto out;
	/* The engine reads at most the file's hot prefix first, none without one. */
	o.relayouted = file_hot(r, &o.hot_lbs, &o.traces);
	if (t.lb_hot_line && t.lb_hot > (o.relayouted ? o.hot_lbs : 0)) {
		t.line = t.lb_hot_line;
		if (o.relayouted)
			ret = trace_bad(&t, "lb_hot %" PRIu64 ", but the hot prefix of %s is %"
					    PRIu64 " LBs", t.lb_hot, o.file, o.hot_lbs);
		else
			ret = trace_bad(&t, "lb_hot %" PRIu64 ", but %s has no hot prefix "
					    "(not relayouted)", t.lb_hot, o.file);
		goto out;
	}

	if (o.json) {
		head = head_json(&o, &t, &s);
		if (o.blocks)
			ret = list_blocks(&o, &t, head);
		else
			ret = json_emit(head, EXIT_OK);
	} else {
		text_summary(&o, &t, &s);
		if (o.blocks)
			ret = list_blocks(&o, &t, NULL);
		else
			ret = fflush(stdout) ? EXIT_FAIL : EXIT_OK;
	}
out:
	if (t.f)
		fclose(t.f);
	trace_free(&t);
	free(s.v);
	halite_reader_free(r);
	return ret;
}
