/* SPDX-License-Identifier: MIT */
/*
 * What halite-bench's commands share: argument parsing, JSON on stdout, and
 * the "machine" object every result carries.
 */
#ifndef HALITE_BENCH_UTIL_H
#define HALITE_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Before a bench starts: @dir must be a writable directory (else a message,
 * 2, a usage error) and userfaultfd usable (else a message, 77, skipped).
 * With @json the failure is also the one JSON object on stdout
 * (bench_fail()). 0 to go on.
 */
int bench_preflight(const char *prog, bool json, const char *dir);

/*
 * A failure: "PROG: message" on stderr (@prog "halite-cycle", "halite-bench:
 * fault"), and with @json the one JSON object on stdout, {"ok": false,
 * "error": message, "exit": @code}. Returns @code.
 */
int bench_fail(const char *prog, bool json, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * getopt_long() refused an option (it returned @c, '?' or ':'; optstring
 * starting with ':', opterr 0): bench_fail() naming it, exit 2. @cmd is
 * what --help is given to ("halite-bench fault").
 */
int bench_opt_error(const char *prog, bool json, int c, int argc, char **argv, const char *cmd);

/* pread until @len or end of file: bytes read (short only at the end), or -errno. */
ssize_t bench_pread_full(int fd, void *buf, size_t len, uint64_t off);

/*
 * Cold: @path's pages out of the page cache. Written back first (fdatasync),
 * since POSIX_FADV_DONTNEED leaves dirty pages; a file just made may be
 * dirty. 0 or -errno.
 */
int bench_drop_cache(const char *path);

/* Warm: every page of @path read into the page cache. 0 or -errno. */
int bench_warm_file(const char *path);

/* halite_parse_u64_range() as a yes or no: a number in [min, max], no sign, no suffix. */
bool bench_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/*
 * "PROG: OPT 'VAL': want WANT" (bench_fail(), so with @json the JSON object
 * too); returns 2, the usage-error exit code.
 */
int bench_bad_arg(const char *prog, bool json, const char *opt, const char *val,
		  const char *want);

/*
 * --cache LIST: "warm", "cold" or both, comma-separated; cache[0] warm,
 * cache[1] cold, *cold_first when cold came first. 0, or -1 when malformed.
 */
int bench_parse_caches(const char *s, bool cache[2], bool *cold_first);

/* --latency LIST: up to @max comma-separated microseconds (0..1000000). 0 or -1. */
int bench_parse_latencies(const char *s, uint32_t *lat, unsigned max, unsigned *n);

/* A JSON string; NULL prints "". */
void bench_json_str(const char *s);
/* A number with @prec decimals, or null when not finite. */
void bench_json_num(double v, int prec);

/*
 * The value of "machine": {"cpu", "cores", "memory_bytes", "kernel",
 * "storage": {"dir", "device", "model", "rotational"}} for files in @dir
 * (device etc. null when @dir is not on a block device).
 */
void bench_machine_json(const char *dir);

#endif
