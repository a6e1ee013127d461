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
#include <unistd.h>

#include "cli.h"
#include "inspect.h"

void errorf(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs(PROG ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fputs(PROG ": ", stderr);
	if (cmd)
		fprintf(stderr, "%s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (cmd)
		fprintf(stderr, "Try '" PROG " %s --help'.\n", cmd);
	return EXIT_USAGE;
}

int refuse_input_as_output(const char *cmd, const char *out, const char *in, const char *what)
{
	struct stat so, si;
	bool same = strcmp(out, in) == 0;

	/* The same file under another name: "./x", a hard link, a symlink. */
	if (!same && stat(out, &so) == 0 && stat(in, &si) == 0)
		same = so.st_dev == si.st_dev && so.st_ino == si.st_ino;
	if (!same)
		return 0;
	errorf("%s: the output %s is the same file as %s (%s): writing it would destroy what "
	       "is read; give -o another file", cmd, out, in, what);
	return EXIT_USAGE;
}

int bad_option(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];

	/* Our optstrings start with ':' so getopt stays quiet and tells the two cases apart. */
	if (c == ':')
		return usage_error(cmd, "option '%s' requires an argument", arg);
	if (optopt && arg[0] == '-' && arg[1] != '-')
		return usage_error(cmd, "unknown option '-%c'", optopt);
	return usage_error(cmd, "unknown option '%s'", arg);
}

int exit_code_for(int err)
{
	int e = err < 0 ? -err : err;

	/* Not a property of the file: the caller asked for something absent or impossible. */
	if (e == HALITE_E_NOT_FOUND || e == HALITE_E_STATE || e == HALITE_E_UNSUPPORTED)
		return EXIT_USAGE;
	return e >= HALITE_E_BASE && e < HALITE_E_MAX ? EXIT_BAD : EXIT_USAGE;
}

const char *strip_path(const char *path, const char *detail)
{
	size_t pl = strlen(path);

	if (detail && strncmp(detail, path, pl) == 0 && strncmp(detail + pl, ": ", 2) == 0)
		return detail + pl + 2;
	return detail;
}

void report_error(const char *path, const char *what, int err, const char *detail)
{
	const char *es = halite_strerror(err);

	/* The library's details already name the file and end with the error's text. */
	detail = strip_path(path, detail);
	if (!detail || !*detail)
		detail = es;
	errorf("%s%s%s: %s%s%s", path, what ? ": " : "", what ? what : "", detail,
	       strstr(detail, es) ? "" : ": ", strstr(detail, es) ? "" : es);
}

int open_reader(struct halite_reader **r, const char *path, char *errbuf, size_t errlen)
{
	HALITE_OPTS(halite_reader_opts, ro);
	int ret;

	errbuf[0] = '\0';
	ro.errbuf = errbuf;
	ro.errbuf_len = errlen;
	ret = halite_reader_open(r, path, &ro);
	if (ret < 0) {
		report_error(path, NULL, ret, errbuf);
		if (!errbuf[0])
			snprintf(errbuf, errlen, "%s", halite_strerror(ret));
		return exit_code_for(ret);
	}
	return 0;
}

int parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	/* strtoull accepts "-1" and wraps; a size never starts with a sign. */
	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int parse_size(const char *s, uint64_t *out)
{
	return halite_parse_size(s, out);
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
