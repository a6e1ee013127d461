// SPDX-License-Identifier: MIT
/* halite-qemu: small helpers of the command line (messages, sizes, JSON). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "tool.h"

void hq_errorf(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/*
 * One progress line: on a terminal rewritten in place, otherwise a line
 * each time (callers call at most once a second).
 */
void hq_progressf(bool quiet, const char *fmt, ...)
{
	static bool tty = false, known = false;
	va_list ap;
	size_t n;
	char line[256];

	if (quiet)
		return;
	if (!known) {
		tty = isatty(STDERR_FILENO);
		known = true;
	}
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	n = strlen(line);
	if (n && line[n - 1] == '\n') {
		/* The final line: on a terminal it replaces the running one. */
		fprintf(stderr, tty ? "\r%s\033[K" : "%s", line);
		return;
	}
	fprintf(stderr, tty ? "\r%s\033[K" : "%s\n", line);
}

/* The engines' log: warnings always, the rest with --verbose (tool.h). */
void hq_log(void *ctx, int level, const char *msg)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	const struct hq_out *o = ctx;

	if (level == HALITE_LOG_ERROR && !(o && o->verbose))
		return;
	fprintf(stderr, PROG ": %s: %s: %s\n", o && o->cmd ? o->cmd : "engine",
		level >= 0 && level <= 3 ? names[level] : "?", msg);
}

void hq_out_init(struct hq_out *o, const char *cmd, int argc, char **argv)
{
	*o = (struct hq_out){ .cmd = cmd, .json = halite_cli_has_json(argc, argv) };
	/* Messages are ours, in one sentence each (hq_out_opt()). */
	opterr = 0;
}

int hq_usage(struct hq_out *o, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(o->usage, sizeof(o->usage), fmt, ap);
	va_end(ap);
	return -1;
}

bool hq_usage_report(const struct hq_out *o, char *err, size_t len)
{
	hq_errorf("%s: %s", o->cmd, o->usage);
	if (o->json)
		snprintf(err, len, "%s", o->usage);
	return o->json;
}

/*
 * The option getopt stopped at: "--name" without its "=value", or the
 * short one ("-m") as the user wrote it ("-machine" when that was the word).
 */
void hq_bad_option(int argc, char **argv, char *buf, size_t len)
{
	const char *w = optind - 1 < argc && optind > 1 ? argv[optind - 1] : "";

	/* optopt: the short option refused, or a long one's code when its value is missing. */
	if (optopt > 0 && optopt < 256) {
		/* A cluster in progress has not advanced optind yet. */
		for (int i = optind - 1; i <= optind && i < argc; i++)
			if (i > 0 && argv[i][0] == '-' && argv[i][1] != '-' &&
			    strchr(argv[i] + 1, optopt)) {
				snprintf(buf, len, "%s", argv[i]);
				return;
			}
		if (strncmp(w, "--", 2)) {
			snprintf(buf, len, "-%c", optopt);
			return;
		}
	}
	snprintf(buf, len, "%.*s", (int)strcspn(w, "="), w);
}

int hq_out_opt(int c, struct hq_out *o, int argc, char **argv)
{
	char name[128];

	switch (c) {
	case 'j':
		o->json = true;
		return 1;
	case 'q':
		o->quiet = true;
		return 1;
	case 'v':
		o->verbose = true;
		return 1;
	case HQ_OPT_PROGRESS:
		if (halite_cli_progress_parse(optarg, &o->progress))
			return hq_usage(o, "--progress '%s': text, json or none", optarg);
		o->progress_set = true;
		return 1;
	case HQ_OPT_VERSION:
		exit(halite_cli_version(PROG));
	case ':':
		hq_bad_option(argc, argv, name, sizeof(name));
		return hq_usage(o, "option '%s' needs a value (" PROG " %s --help)", name, o->cmd);
	case '?':
		hq_bad_option(argc, argv, name, sizeof(name));
		return hq_usage(o, "unknown option '%s' (" PROG " %s --help)", name, o->cmd);
	default:
		return 0;
	}
}

int hq_progress_mode(const struct hq_out *o)
{
	if (o->progress_set)
		return o->progress;
	return o->quiet ? HALITE_PROGRESS_NONE : HALITE_PROGRESS_TEXT;
}

bool hq_progress_due(const struct hq_out *o, uint64_t *last, uint64_t now)
{
	/* A machine polls as often as query-migrate is polled; a person reads a line a second. */
	uint64_t every = hq_progress_mode(o) == HALITE_PROGRESS_JSON ? 500000000ull :
			 1000000000ull;

	if (now - *last < every)
		return false;
	*last = now;
	return true;
}

int hq_exit_code(int ret)
{
	return !ret ? EXIT_OK : ret == -HALITE_E_UNSUPPORTED ? EXIT_UNSUPPORTED : EXIT_FAIL;
}

void hq_json_u64(cJSON *o, const char *key, bool known, uint64_t v)
{
	char buf[24];

	if (!known) {
		cJSON_AddNullToObject(o, key);
		return;
	}
	/* Raw: a double would round counts above 2^53. */
	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	cJSON_AddRawToObject(o, key, buf);
}

void hq_json_fixed(cJSON *o, const char *key, bool known, double v, int decimals)
{
	char buf[64];

	if (!known || v != v) {
		cJSON_AddNullToObject(o, key);
		return;
	}
	snprintf(buf, sizeof(buf), "%.*f", decimals, v);
	cJSON_AddRawToObject(o, key, buf);
}

void hq_json_str(cJSON *o, const char *key, const char *s)
{
	if (s && *s)
		cJSON_AddStringToObject(o, key, s);
	else
		cJSON_AddNullToObject(o, key);
}

void hq_json_bool(cJSON *o, const char *key, bool known, bool v)
{
	if (known)
		cJSON_AddBoolToObject(o, key, v);
	else
		cJSON_AddNullToObject(o, key);
}

cJSON *hq_json_head(int code, const char *file, const char *err, const char *qemu_err,
		    const struct hq_vm *vm)
{
	cJSON *o = cJSON_CreateObject(), *q;
	char v[32];

	if (!o)
		return NULL;
	cJSON_AddBoolToObject(o, "ok", code == EXIT_OK);
	hq_json_str(o, "file", file);
	hq_json_str(o, "error", code ? (err && *err ? err : "failed") : NULL);
	if (code)
		cJSON_AddNumberToObject(o, "exit", code);
	hq_json_str(o, "qemu_error", code ? qemu_err : NULL);
	q = cJSON_AddObjectToObject(o, "qemu");
	if (!q)
		return o;
	if (vm && vm->pid > 0)
		cJSON_AddNumberToObject(q, "pid", vm->pid);
	else
		cJSON_AddNullToObject(q, "pid");
	if (vm && (vm->major || vm->minor || vm->micro))
		snprintf(v, sizeof(v), "%d.%d.%d", vm->major, vm->minor, vm->micro);
	else
		v[0] = '\0';
	hq_json_str(q, "version", v);
	hq_json_str(q, "machine", vm ? vm->machine : NULL);
	hq_json_u64(q, "vcpus", vm && vm->nvcpus, vm ? vm->nvcpus : 0);
	return o;
}

void hq_json_print(cJSON *o)
{
	char *s = o ? cJSON_PrintUnformatted(o) : NULL;

	cJSON_Delete(o);
	/* Out of memory: still one object, as the convention promises. */
	puts(s ? s : "{\"ok\": false, \"error\": \"out of memory\", \"exit\": 1}");
	cJSON_free(s);
	fflush(stdout);
}

void hq_json_usage(const struct hq_out *o)
{
	if (o->json)
		hq_json_print(hq_json_head(EXIT_USAGE, NULL, o->usage, NULL, NULL));
}

volatile sig_atomic_t hq_stop_signal;

static void on_stop_signal(int sig)
{
	hq_stop_signal = sig;
}

void hq_catch_stop_signals(void)
{
	struct sigaction sa = { .sa_handler = on_stop_signal };

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}
