// SPDX-License-Identifier: MIT
/* halite-inspect: diagnostics, number parsing, opening a file for reading. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "inspect.h"

/*
 * The run of one command (inspect.h). A tool's process runs one command, so
 * this is the tool's state, not a library's: nothing here is shared.
 */
static struct {
	const char *cmd;		/* NULL before a command is known */
	bool json;
	bool stdout_taken;		/* the one object, or --help/--version text */
	bool have_error;
	char error[1024];
	const char *const *keys;
	cJSON *result;
} run;

void run_begin(const char *cmd)
{
	run.cmd = cmd;
}

void run_set_json(void)
{
	run.json = true;
}

bool run_json(void)
{
	return run.json;
}

void run_keys(const char *const *keys)
{
	run.keys = keys;
}

cJSON *run_result(void)
{
	if (!run.result)
		run.result = cJSON_CreateObject();
	return run.result;
}

void run_stdout_taken(void)
{
	run.stdout_taken = true;
}

void run_set_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(run.error, sizeof(run.error), fmt, ap);
	va_end(ap);
	run.have_error = true;
}

void json_add_status(cJSON *obj, int exit)
{
	cJSON_DeleteItemFromObject(obj, "ok");
	cJSON_AddBoolToObject(obj, "ok", exit == EXIT_OK);
	if (exit == EXIT_OK)
		return;
	cJSON_DeleteItemFromObject(obj, "error");
	cJSON_DeleteItemFromObject(obj, "exit");
	if (run.have_error)
		cJSON_AddStringToObject(obj, "error", run.error);
	else
		cJSON_AddNullToObject(obj, "error");
	cJSON_AddNumberToObject(obj, "exit", exit);
}

int run_end(int ret)
{
	cJSON *o;
	char *s;

	if (!run.json || run.stdout_taken || ret == EXIT_OK) {
		cJSON_Delete(run.result);
		run.result = NULL;
		return ret;
	}
	o = run_result();
	run.result = NULL;
	for (const char *const *k = run.keys; k && *k; k++)
		if (!cJSON_HasObjectItem(o, *k))
			cJSON_AddNullToObject(o, *k);
	json_add_status(o, ret);
	s = cJSON_Print(o);
	cJSON_Delete(o);
	if (s)
		puts(s);
	cJSON_free(s);
	fflush(stdout);
	return ret;
}

static void vsay(bool error, const char *fmt, va_list ap)
{
	char msg[sizeof(run.error)];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	fflush(stdout);
	if (run.cmd)
		fprintf(stderr, PROG ": %s: %s\n", run.cmd, msg);
	else
		fprintf(stderr, PROG ": %s\n", msg);
	/* The first error is the cause; what follows is often its consequence. */
	if (error && !run.have_error) {
		memcpy(run.error, msg, sizeof(msg));
		run.have_error = true;
	}
}

void errorf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(true, fmt, ap);
	va_end(ap);
}

void notef(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(false, fmt, ap);
	va_end(ap);
}

int usage_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay(true, fmt, ap);
	va_end(ap);
	return EXIT_USAGE;
}

int usage_hint(const char *fmt, ...)
{
	char msg[sizeof(run.error) - 64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (run.cmd)
		errorf("%s (" PROG " %s --help)", msg, run.cmd);
	else
		errorf("%s (" PROG " --help)", msg);
	return EXIT_USAGE;
}

int print_version(void)
{
	run_stdout_taken();
	return halite_cli_version(PROG);
}

int refuse_input_as_output(const char *out, const char *in, const char *what)
{
	struct stat so, si;
	bool same = strcmp(out, in) == 0;

	/* The same file under another name: "./x", a hard link, a symlink. */
	if (!same && stat(out, &so) == 0 && stat(in, &si) == 0)
		same = so.st_dev == si.st_dev && so.st_ino == si.st_ino;
	if (!same)
		return 0;
	return usage_error("the output %s is the same file as %s (%s): writing it would destroy "
			   "what is read; give -o another file", out, in, what);
}

void help_image_options(FILE *f, int col)
{
	static const char *const rows[][2] = {
		{ "--progress[=MODE]", "progress on stderr about every 0.5 s: text (a" },
		{ "", "line), json (one object a line) or none (the" },
		{ "", "default)" },
		{ "--json", "a JSON summary on stdout (mbs.untouched: the" },
		{ "", "never-touched blocks)" },
		{ "-h, --help", "this text" },
		{ "--version", "the program's and the file format's version" },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		fprintf(f, "  %-*s%s\n", col, rows[i][0], rows[i][1]);
}

int common_option(int c, char **argv, void (*help)(FILE *))
{
	switch (c) {
	case OPT_HELP:
		run_stdout_taken();
		help(stdout);
		return EXIT_OK;
	case OPT_VERSION:
		return print_version();
	}
	return bad_option(c, argv);
}

void help_store(FILE *f)
{
	fputs("\nFILE may be s3://BUCKET/KEY (credentials and endpoint from AWS_*, as the\n"
	      "AWS CLI takes them). The host's cache of the locality blocks read:\n"
	      "  --cache-dir DIR    keep them in DIR, shared by every reader on the host,\n"
	      "                     and read them from there next time (default:\n"
	      "                     $HALITE_CACHE_DIR; none)\n"
	      "  --cache-size SIZE  its bound, K, M, G suffixes (default: $HALITE_CACHE_SIZE,\n"
	      "                     else 8G)\n", f);
}

int digits(uint64_t v)
{
	int n = 1;

	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

void *id_row(void *rows, size_t *n, size_t *cap, size_t size, uint32_t id, bool add)
{
	size_t lo = 0, hi = *n;
	char *v;

	/* The caller's array has its own row type: the pointer is copied, not cast. */
	memcpy(&v, rows, sizeof(v));
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint32_t at;

		memcpy(&at, v + mid * size, sizeof(at));
		if (at == id)
			return v + mid * size;
		if (at < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!add)
		return NULL;
	if (*n == *cap) {
		size_t c = *cap ? 2 * *cap : 8;
		char *nv = realloc(v, c * size);

		if (!nv)
			return NULL;
		v = nv;
		memcpy(rows, &v, sizeof(v));
		*cap = c;
	}
	memmove(v + (lo + 1) * size, v + lo * size, (*n - lo) * size);
	memset(v + lo * size, 0, size);
	memcpy(v + lo * size, &id, sizeof(id));
	(*n)++;
	return v + lo * size;
}

int bad_option(int c, char **argv)
{
	const char *arg = argv[optind - 1];

	/* Our optstrings start with ':' so getopt stays quiet and tells the two cases apart. */
	if (c == ':')
		return usage_hint("option '%s' requires an argument", arg);
	if (optopt && arg[0] == '-' && arg[1] != '-')
		return usage_hint("unknown option '-%c'", optopt);
	/* "--foo=x": name the option as the user wrote it, without its value. */
	return usage_hint("unknown option '%.*s'", (int)strcspn(arg, "="), arg);
}

int exit_code_for(int err)
{
	int e = err < 0 ? -err : err;

	/* Not a property of the file nor a failure: the argument itself is wrong. */
	if (e == HALITE_E_NOT_FOUND || e == EINVAL)
		return EXIT_USAGE;
	return e >= HALITE_E_BASE && e < HALITE_E_MAX ? EXIT_BAD : EXIT_FAIL;
}

const char *strip_path(const char *path, const char *detail)
{
	size_t pl = strlen(path);

	if (detail && strncmp(detail, path, pl) == 0 && strncmp(detail + pl, ": ", 2) == 0)
		return detail + pl + 2;
	return detail;
}

/*
 * Words that, in a library detail, already say what halite_strerror() of
 * the code would add: "header checksum mismatch" needs no "checksum
 * mismatch in header, footer or section" after it. Codes not listed
 * (CORRUPT: "inconsistent metadata ...") add their text: it says what kind
 * of wrong the detail's numbers are.
 */
static const struct {
	int err;
	const char *words;
} said[] = {
	{ HALITE_E_CHECKSUM, "checksum" },     { HALITE_E_LB_CHECKSUM, "checksum" },
	{ HALITE_E_TRUNCATED, "short" },       { HALITE_E_CODEC, "decode" },
	{ HALITE_E_RESERVED, "reserved" },     { HALITE_E_VERSION, "version" },
	{ HALITE_E_INCOMPAT, "incompatible" }, { HALITE_E_NO_CODEC, "codec" },
	{ HALITE_E_UNKNOWN_SECTION, "section" }, { HALITE_E_BAD_MAGIC, "not a Halite snapshot" },
	{ HALITE_E_INCOMPLETE, "incomplete" },   { EINVAL, "not a regular file" },
};

static bool says_already(int e, const char *detail)
{
	for (size_t i = 0; i < sizeof(said) / sizeof(said[0]); i++)
		if (said[i].err == e)
			return strstr(detail, said[i].words) != NULL;
	return false;
}

const char *error_text(const char *path, int err, const char *detail, char *d, size_t len)
{
	int e = err < 0 ? -err : err;
	const char *es = halite_strerror(err);
	size_t dl, el = strlen(es);

	/* The library's details name the file first; the sentence names it once. */
	detail = strip_path(path, detail);
	if (!detail || !*detail)
		detail = es;
	snprintf(d, len, "%s", detail);

	/*
	 * The open failures a user meets first (not a snapshot, incomplete, not
	 * a regular file) the reader says in full; anything else gets the
	 * code's text unless the detail says it already.
	 */
	dl = strlen(d);
	if (dl > el + 2 && !strcmp(d + dl - el, es) && !strncmp(d + dl - el - 2, ": ", 2) &&
	    says_already(e, d))
		d[dl - el - 2] = '\0';
	else if (!strstr(d, es) && !says_already(e, d))
		snprintf(d + dl, len - dl, ": %s", es);
	return d;
}

void report_error(const char *path, const char *what, int err, const char *detail)
{
	char d[768];

	error_text(path, err, detail, d, sizeof(d));
	errorf("%s%s%s: %s", path, what ? ": " : "", what ? what : "", d);
}

int open_reader(struct halite_reader **r, const char *path)
{
	HALITE_OPTS(halite_reader_opts, ro);
	char errbuf[512];
	int ret;

	errbuf[0] = '\0';
	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	ret = halite_reader_open(r, path, &ro);
	if (ret < 0) {
		report_error(path, NULL, ret, errbuf);
		return exit_code_for(ret);
	}
	return 0;
}

const char *region_list(const struct halite_reader *r, char *buf, size_t len)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	size_t n = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < fi->region_count && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
				      halite_reader_region(r, i)->name);
	return buf;
}

int find_region(struct halite_reader *r, const char *path, const char *name)
{
	char list[1024];
	int idx = halite_reader_find_region(r, name);

	if (idx >= 0)
		return idx;
	usage_error("%s: no region '%s'; the file has: %s", path, name,
		    region_list(r, list, sizeof(list)));
	return -EXIT_USAGE;
}

int progress_parse(const char *arg, int *mode)
{
	if (halite_cli_progress_parse(arg, mode) < 0)
		return usage_error("--progress: text, json or none, not '%s'", arg);
	return 0;
}

void progress_begin(struct progress *p, int mode, const char *op, const char *path,
		    int64_t total)
{
	*p = (struct progress){ .mode = mode, .op = op, .path = path, .total = total };
	p->start = p->last = halite_now_s();
	p->tty = isatty(STDERR_FILENO);
}

void progress_update(struct progress *p, int64_t bytes, bool done)
{
	double t = halite_now_s();
	char b1[32], b2[32];

	if (p->mode < 0 || p->mode == HALITE_PROGRESS_NONE)
		return;
	/* Twice a second is live enough for a person and cheap for a parser. */
	if (!done && t - p->last < 0.5)
		return;
	p->last = t;
	if (p->mode == HALITE_PROGRESS_JSON) {
		struct halite_cli_progress r = {
			.op = p->op, .elapsed_s = t - p->start, .bytes = bytes,
			.total = p->total, .faults = -1, .done = done,
		};

		fflush(stdout);
		halite_cli_progress_json(stderr, &r);
		return;
	}
	/* A terminal's line was only ever a live view: leave the screen as it was. */
	if (done && p->tty && p->mode == HALITE_PROGRESS_TEXT) {
		fputs("\r\033[K", stderr);
		return;
	}
	if (bytes < 0) {
		fprintf(stderr, "%s" PROG ": %s: %s: stopped\n", p->tty ? "\r" : "", p->op,
			p->path);
		return;
	}
	human_bytes((uint64_t)bytes, b1, sizeof(b1));
	human_bytes(p->total > 0 ? (uint64_t)p->total : 0, b2, sizeof(b2));
	/* On a terminal one line rewritten in place; in a log, one line each time. */
	fprintf(stderr, "%s" PROG ": %s: %s: %5.1f%% (%s of %s)%s%s", p->tty ? "\r" : "", p->op,
		p->path, p->total > 0 ? 100.0 * (double)bytes / (double)p->total : 100.0, b1, b2,
		done ? ", done" : "", p->tty && !done ? "\033[K" : "\n");
	fflush(stderr);
}

int parse_int(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	v = strtol(s, &end, 0);
	if (errno || *end || v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

unsigned default_jobs(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (n < 1)
		return 1;
	return n > 256 ? 256 : (unsigned)n;
}

const char *human_bytes(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double d = (double)v;
	unsigned u = 0;

	while (d >= 1024.0 && u < sizeof(units) / sizeof(units[0]) - 1) {
		d /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", v);
	else
		snprintf(buf, len, "%.1f %s", d, units[u]);
	return buf;
}

const char *mb_state_word(uint32_t state)
{
	return state == HALITE_MB_UNTOUCHED ? "never-touched" : mb_state_name(state);
}

const char *mb_state_name(uint32_t state)
{
	switch (state) {
	case HALITE_MB_UNTOUCHED:
		return "untouched";
	case HALITE_MB_ZERO:
		return "zero";
	case HALITE_MB_STORED:
		return "stored";
	}
	return "invalid";
}

uint32_t region_of_mb(const struct halite_reader *r, uint64_t mb)
{
	uint32_t lo = 0, hi = halite_reader_info(r)->region_count;

	/* Regions hold consecutive MB ranges in order: find the last first_mb <= mb. */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (halite_reader_region(r, mid)->first_mb <= mb)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

const char *describe_mb(const struct halite_reader *r, uint64_t mb, char *buf, size_t len)
{
	const struct halite_region_info *ri = halite_reader_region(r, region_of_mb(r, mb));
	uint64_t off = (mb - ri->first_mb) * halite_reader_info(r)->mb_size;

	snprintf(buf, len, "MB %" PRIu64 " (region %s + 0x%" PRIx64 ", gpa 0x%" PRIx64 ")", mb,
		 ri->name, off, ri->gpa + off);
	return buf;
}

const char *describe_lb(const struct halite_reader *r, uint64_t lb, char *buf, size_t len)
{
	struct halite_lb_info li;
	char sn[32];

	if (halite_reader_lb_info(r, lb, &li) < 0) {
		snprintf(buf, len, "LB %" PRIu64, lb);
		return buf;
	}
	snprintf(buf, len, "LB %" PRIu64 " (offset %" PRIu64 ", stream %s, seq %u)", lb, li.offset,
		 halite_stream_name(li.stream, sn, sizeof(sn)), li.seq);
	return buf;
}
