/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library and by tools
 * halite-inspect, halite-qemu, halite-cloned, halite-clone, halite-cycle,
 * halite-synth and the benchmarks (halite_common), for what every command
 * line shares. The conventions they follow are in docs/cli.md.
 */
#ifndef HALITE_CLI_H
#define HALITE_CLI_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*
 * A size: a number (decimal, 0x hex) with an optional K, M or G suffix
 * (powers of 1024; "KiB", "KB" accepted too). 0, -EINVAL when it is not
 * one, -ERANGE when it does not fit 64 bits.
 */
int halite_parse_size(const char *s, uint64_t *out);

/*
 * A whole number (decimal, or hex after 0x) and nothing after it; it must
 * start with a digit (no sign, no space). 0 or -EINVAL.
 */
int halite_parse_u64(const char *s, uint64_t *out);

/* As halite_parse_u64, and in [@min, @max]: 0, -EINVAL, or -ERANGE outside. */
int halite_parse_u64_range(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Seconds on the monotonic clock, for elapsed times and progress reports. */
double halite_now_s(void);

/* "@prog: " and the message on stderr, then a newline: a tool's error line. */
void halite_cli_verrorf(const char *prog, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

/*
 * Run @argv (a program in PATH, argv[0]) and wait: 0 if it exited 0, else
 * a negative code with "PROGRAM failed: " and its first line of output (or
 * why it could not start, with the Debian package that has it) in @err.
 * With @out, its output (stdout and stderr) is there too, NUL-terminated.
 */
int halite_run(char *const *argv, char *out, size_t outlen, char *err, size_t errlen);

/* A duration for people, into @buf: "412 ns", "8.1 us", "3.46 ms", "1.27 s". */
const char *halite_human_ns(uint64_t ns, char *buf, size_t len);

/*
 * All of @len bytes to @fd at @off, through short writes and EINTR: 0, or
 * -errno (-EIO when the file takes no more).
 */
int halite_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

/* @s as a JSON string, quotes included, to @f; NULL prints "". */
void halite_json_str(FILE *f, const char *s);

/* @s as one word for a POSIX shell: as it is when safe, else in single quotes. */
void halite_shell_quote(FILE *f, const char *s);

/*
 * --version: "PROG 0.1.0 (file format 1.1)" and a newline on stdout.
 * Returns 0, the exit code.
 */
int halite_cli_version(const char *prog);

/* --progress[=MODE]: how long operations report on stderr. */
enum halite_progress_mode {
	HALITE_PROGRESS_TEXT = 0, /* a line a person reads (the default) */
	HALITE_PROGRESS_JSON,	  /* one JSON object per line (halite_cli_progress_json) */
	HALITE_PROGRESS_NONE,
};
/* "text", "json" or "none"; NULL (a bare --progress) is text. 0 or -EINVAL. */
int halite_cli_progress_parse(const char *arg, int *mode);

/*
 * One progress report of a long operation. Unknown values are negative and
 * print as null.
 */
struct halite_cli_progress {
	const char *op;	   /* "save", "restore", "verify", "import", "extract", ... */
	const char *phase; /* what it is doing now ("arming", "memory", ...), or NULL */
	double elapsed_s;  /* since the operation started */
	int64_t bytes;	   /* done so far */
	int64_t total;	   /* bytes in all, when known */
	int64_t faults;	   /* faults served so far, for the engines */
	bool done;	   /* the last report: the operation ended (ok or not) */
};
/*
 * One line on @f, flushed:
 * {"type": "progress", "op": "save", "phase": "memory", "elapsed_s": 1.25,
 *  "percent": 42.1, "bytes": N, "total_bytes": N, "faults": N,
 *  "rate_bytes_per_s": N, "done": false}
 * percent and rate are derived (null when their inputs are unknown).
 */
void halite_cli_progress_json(FILE *f, const struct halite_cli_progress *p);

/*
 * getopt_long() returned '?' or ':' (run with opterr = 0 and an optstring
 * starting with ':', so that a missing value is told from an unknown
 * option): the sentence that names the option, for @cmd ("halite-cycle",
 * "halite-synth save"), into @buf: "unknown option '--foo' (halite-synth
 * save --help)", "option '--size' needs a value (...)", "option '--keep'
 * takes no value (...)". The prefix is the caller's (a JSON "error" has
 * none). Returns 2, the usage exit code.
 */
int halite_cli_opt_error(char *buf, size_t len, int c, int argc, char *const argv[],
			 const char *cmd);

/*
 * --json among argv[1..argc-1] (before a "--"): a usage error found before
 * or instead of parsing it still prints its JSON object.
 */
bool halite_cli_has_json(int argc, char *const argv[]);

/*
 * A failure as the one JSON object on @f: {"ok": false, "error": @error,
 * "exit": @code}, and a newline. Returns @code.
 */
int halite_cli_json_fail(FILE *f, const char *error, int code);

#endif
