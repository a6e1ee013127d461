// SPDX-License-Identifier: MIT
/* halite-qemu: small helpers of the command line (messages, sizes, JSON). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "hq.h"

uint64_t hq_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

char *hq_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const unit[] = { "bytes", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	unsigned u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu bytes", (unsigned long long)b);
	else
		snprintf(buf, len, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v,
			 unit[u]);
	return buf;
}

int hq_parse_size(const char *s, uint64_t *out)
{
	return halite_parse_size(s, out) ? -EINVAL : 0;
}

/* The engines' log: warnings and errors always, the rest with --verbose. */
void hq_log(void *ctx, int level, const char *msg)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };

	(void)ctx;
	fprintf(stderr, PROG ": engine %s: %s\n", level >= 0 && level <= 3 ? names[level] : "?",
		msg);
}

bool hq_out_opt(int c, struct hq_out *o)
{
	switch (c) {
	case 'j':
		o->json = true;
		return true;
	case 'q':
		o->quiet = true;
		return true;
	case 'v':
		o->verbose = true;
		return true;
	default:
		return false;
	}
}

int hq_fail(char *err, size_t len, int ret, const char *what, const char *detail)
{
	if (!err[0])
		snprintf(err, len, "%s%s%s", what, detail && *detail ? ": " : "",
			 detail ? detail : "");
	return ret;
}

void hq_json_head(bool ok, const char *file, const char *err, const struct hq_vm *vm)
{
	printf("{\"ok\": %s, \"file\": ", ok ? "true" : "false");
	halite_json_str(stdout, file);
	printf(", \"error\": ");
	halite_json_str(stdout, ok ? "" : err);
	printf(", \"qemu\": {\"pid\": %d, \"version\": \"%d.%d.%d\", \"machine\": ",
	       (int)vm->pid, vm->major, vm->minor, vm->micro);
	halite_json_str(stdout, vm->machine);
	printf(", \"vcpus\": %u}", vm->nvcpus);
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
