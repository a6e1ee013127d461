// SPDX-License-Identifier: MIT
/* What the command-line tools share (cli.h). */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <halite/halite.h>

#include "cli.h"
#include "stats.h"

extern char **environ;

int halite_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case '\0':
		break;
	case 'K':
		shift = 10;
		break;
	case 'M':
		shift = 20;
		break;
	case 'G':
		shift = 30;
		break;
	default:
		return -EINVAL;
	}
	if (shift) {
		end++;
		if (strcasecmp(end, "") && strcasecmp(end, "B") && strcasecmp(end, "iB"))
			return -EINVAL;
		if (v > (UINT64_MAX >> shift))
			return -ERANGE;
	}
	*out = (uint64_t)v << shift;
	return 0;
}

int halite_parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	/* strtoull accepts "-1" and wraps, and skips spaces: a number starts with a digit. */
	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	/* Decimal or 0x hex: a leading 0 is no octal ("010" is ten, as people mean it). */
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		if (!isxdigit((unsigned char)s[2]))
			return -EINVAL;
		v = strtoull(s + 2, &end, 16);
	} else {
		v = strtoull(s, &end, 10);
	}
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int halite_parse_u64_range(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v;
	int ret = halite_parse_u64(s, &v);

	if (ret < 0)
		return ret;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

double halite_now_s(void)
{
	return (double)halite_now_ns() / 1e9;
}

void halite_cli_verrorf(const char *prog, const char *fmt, va_list ap)
{
	fprintf(stderr, "%s: ", prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

const char *halite_human_ns(uint64_t ns, char *buf, size_t len)
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

int halite_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		buf = (const char *)buf + n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

void halite_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

void halite_shell_quote(FILE *f, const char *s)
{
	const char *p;

	for (p = s; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("%+,-./:=@_^", *p))
			break;
	if (*s && !*p) {
		fputs(s, f);
		return;
	}
	/* Single quotes keep everything but themselves: ' becomes '\''. */
	fputc('\'', f);
	for (p = s; *p; p++)
		fputs(*p == '\'' ? "'\\''" : (char[2]){ *p, 0 }, f);
	fputc('\'', f);
}

int halite_cli_version(const char *prog)
{
	printf("%s %d.%d.%d (file format %d.%d)\n", prog, HALITE_VERSION_MAJOR,
	       HALITE_VERSION_MINOR, HALITE_VERSION_PATCH, HALITE_FORMAT_MAJOR,
	       HALITE_FORMAT_MINOR);
	return fflush(stdout) ? 1 : 0;
}

int halite_cli_progress_parse(const char *arg, int *mode)
{
	static const char *const names[] = {
		[HALITE_PROGRESS_TEXT] = "text",
		[HALITE_PROGRESS_JSON] = "json",
		[HALITE_PROGRESS_NONE] = "none",
	};

	if (!arg) {
		*mode = HALITE_PROGRESS_TEXT;
		return 0;
	}
	for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++)
		if (!strcmp(arg, names[i])) {
			*mode = i;
			return 0;
		}
	return -EINVAL;
}

static void json_i64_or_null(FILE *f, const char *key, int64_t v)
{
	if (v < 0)
		fprintf(f, ", \"%s\": null", key);
	else
		fprintf(f, ", \"%s\": %lld", key, (long long)v);
}

void halite_cli_progress_json(FILE *f, const struct halite_cli_progress *p)
{
	fputs("{\"type\": \"progress\", \"op\": ", f);
	halite_json_str(f, p->op);
	fputs(", \"phase\": ", f);
	if (p->phase)
		halite_json_str(f, p->phase);
	else
		fputs("null", f);
	fprintf(f, ", \"elapsed_s\": %.3f", p->elapsed_s);
	if (p->bytes >= 0 && p->total > 0)
		fprintf(f, ", \"percent\": %.1f", 100.0 * (double)p->bytes / (double)p->total);
	else if (p->bytes >= 0 && p->total == 0 && p->done)
		fputs(", \"percent\": 100.0", f);
	else
		fputs(", \"percent\": null", f);
	json_i64_or_null(f, "bytes", p->bytes);
	json_i64_or_null(f, "total_bytes", p->total);
	json_i64_or_null(f, "faults", p->faults);
	if (p->bytes >= 0 && p->elapsed_s > 0)
		fprintf(f, ", \"rate_bytes_per_s\": %.0f", (double)p->bytes / p->elapsed_s);
	else
		fputs(", \"rate_bytes_per_s\": null", f);
	fprintf(f, ", \"done\": %s}\n", p->done ? "true" : "false");
	fflush(f);
}

int halite_cli_opt_error(char *buf, size_t len, int c, int argc, char *const argv[],
			 const char *cmd)
{
	const char *arg = optind >= 1 && optind <= argc ? argv[optind - 1] : NULL;

	/*
	 * glibc leaves optind past a long option it refused; for a short one
	 * in a cluster ("-kx") it may not have moved, so the letter (optopt)
	 * names it there, never the word before.
	 */
	if (arg && !strncmp(arg, "--", 2) && (c == ':' || !optopt || strchr(arg, '='))) {
		int n = (int)strcspn(arg, "=");

		if (c == ':')
			snprintf(buf, len, "option '%.*s' needs a value (%s --help)", n, arg, cmd);
		else if (optopt)
			snprintf(buf, len, "option '%.*s' takes no value (%s --help)", n, arg, cmd);
		else
			snprintf(buf, len, "unknown option '%.*s' (%s --help)", n, arg, cmd);
	} else if (c == ':') {
		snprintf(buf, len, "option '-%c' needs a value (%s --help)", optopt, cmd);
	} else if (optopt > 32 && optopt < 127) {
		snprintf(buf, len, "unknown option '-%c' (%s --help)", optopt, cmd);
	} else {
		snprintf(buf, len, "unknown option '%s' (%s --help)", arg ? arg : "?", cmd);
	}
	return 2;
}

bool halite_cli_has_json(int argc, char *const argv[])
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--json"))
			return true;
	return false;
}

int halite_cli_json_fail(FILE *f, const char *error, int code)
{
	fputs("{\"ok\": false, \"error\": ", f);
	halite_json_str(f, error);
	fprintf(f, ", \"exit\": %d}\n", code);
	fflush(f);
	return code;
}

/* The Debian package a program the tools run comes from, for the message when it is missing. */
static const char *package_of(const char *prog)
{
	if (!strcmp(prog, "virsh"))
		return "libvirt-clients";
	if (!strncmp(prog, "qemu-img", 8))
		return "qemu-utils";
	return NULL;
}

int halite_run(char *const *argv, char *out, size_t outlen, char *err, size_t errlen)
{
	char tmp[] = "/tmp/halite-cmd.XXXXXX", msg[512] = "";
	posix_spawn_file_actions_t fa;
	int fd = mkstemp(tmp), st, ret;
	const char *pkg;
	ssize_t n;
	pid_t pid;

	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		return ret;
	}
	unlink(tmp);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
	posix_spawn_file_actions_adddup2(&fa, fd, STDOUT_FILENO);
	ret = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (ret) {
		close(fd);
		pkg = ret == ENOENT ? package_of(argv[0]) : NULL;
		snprintf(err, errlen, "%s: %s%s%s%s", argv[0], strerror(ret),
			 pkg ? " (Debian: apt-get install " : "", pkg ? pkg : "", pkg ? ")" : "");
		return -ret;
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (out) {
		n = pread(fd, out, outlen - 1, 0);
		out[n > 0 ? n : 0] = '\0';
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		close(fd);
		return 0;
	}
	n = pread(fd, msg, sizeof(msg) - 1, 0);
	msg[n > 0 ? n : 0] = '\0';
	msg[strcspn(msg, "\n")] = '\0';
	close(fd);
	snprintf(err, errlen, "%s failed: %s", argv[0], msg[0] ? msg : "no message");
	return -EIO;
}
