/* SPDX-License-Identifier: MIT */
/*
 * halite-inspect: shared declarations of the subcommands and their helpers.
 *
 * Exit codes are part of the interface (scripts test them): 0 all good,
 * 1 the file is bad (corrupt, incomplete, a checksum or decode failure),
 * 2 usage or I/O error. Diagnostics go to stderr prefixed "halite-inspect: ";
 * stdout carries only the result (a table, or with --json one JSON object).
 */
#ifndef HALITE_INSPECT_H
#define HALITE_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>
#include <halite/halite.h>

#define PROG "halite-inspect"

enum {
	EXIT_OK = 0,
	EXIT_BAD = 1,
	EXIT_USAGE = 2,
};

struct command {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
	void (*help)(FILE *f);
};

/* Subcommands: argv[0] is the command name, as for main(). */
int cmd_info(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_blocks(int argc, char **argv);
int cmd_map(int argc, char **argv);
int cmd_extract(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_restore(int argc, char **argv);
void help_info(FILE *f);
void help_verify(FILE *f);
void help_blocks(FILE *f);
void help_map(FILE *f);
void help_extract(FILE *f);
void help_import(FILE *f);
void help_restore(FILE *f);

/* ---- diagnostics and common parsing (util.c) ---- */

void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Reports a usage error for @cmd and returns EXIT_USAGE. */
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * An output that is an input, by name or as a file (same device and inode,
 * so "./x" for "x", hard links and symlinks count), is refused before
 * anything is written: one sentence naming both ("the output OUT is the same
 * file as IN (WHAT)"), and EXIT_USAGE. 0 when they differ.
 */
int refuse_input_as_output(const char *cmd, const char *out, const char *in, const char *what);

/* For getopt's ':' and '?': names the option, returns EXIT_USAGE. */
int bad_option(const char *cmd, int c, char **argv);

/*
 * Exit code for a failed Halite call: Halite's own codes describe the file
 * (EXIT_BAD), errno values describe the system or the caller (EXIT_USAGE).
 */
int exit_code_for(int err);

/*
 * "PATH[: WHAT]: DETAIL[: strerror]" on stderr: @detail is a library message
 * (errmsg, errbuf) or NULL; the file name and error text are not repeated.
 */
void report_error(const char *path, const char *what, int err, const char *detail);
/* @detail without a leading "PATH: ". */
const char *strip_path(const char *path, const char *detail);

/*
 * Open @path for reading. On failure prints "PATH: strerror: detail" and
 * returns the exit code to use; 0 on success.
 */
int open_reader(struct halite_reader **r, const char *path, char *errbuf, size_t errlen);

/* Index of the region holding global memory block @mb. */
uint32_t region_of_mb(const struct halite_reader *r, uint64_t mb);
/* "MB 7 (region pc.ram + 0xe000, gpa 0xe000)" */
const char *describe_mb(const struct halite_reader *r, uint64_t mb, char *buf, size_t len);
/* "LB 3 (offset 200704, stream vcpu0, seq 2)" */
const char *describe_lb(const struct halite_reader *r, uint64_t lb, char *buf, size_t len);

/* Decimal or 0x hex, full range, nothing trailing. */
int parse_u64(const char *s, uint64_t *out);
/* As parse_u64 with an optional K/M/G suffix (binary multiples; "KiB" too). */
int parse_size(const char *s, uint64_t *out);
int parse_int(const char *s, long min, long max, long *out);
/* 0 = online CPUs. */
unsigned default_jobs(void);

/* "1.5 MiB" style, into buf. */
const char *human_bytes(uint64_t v, char *buf, size_t len);
const char *mb_state_name(uint32_t state);

/* Common getopt_long entries that every subcommand shares. */
#define OPT_HELP 'h'
#define OPT_JSON 0x100

/* ---- output (output.c) ---- */

/*
 * An aligned text table. Rows are buffered and widths computed at
 * table_print(), unless table_stream() fixed the widths first, in which case
 * each row is printed as it comes: `map` over a large guest has millions of
 * rows and must not hold them all.
 */
struct table;
struct table *table_new(unsigned ncols, const char *const *heads, const char *align);
/* Widths from @widths (at least the heading's); rows print as added. */
void table_stream(struct table *t, const int *widths);
void table_row(struct table *t, ...);	/* exactly ncols const char * */
void table_print(struct table *t);	/* buffered rows, then frees nothing */
void table_free(struct table *t);

/* uint64 as a JSON integer, exact beyond 2^53 (cJSON numbers are doubles). */
void json_add_u64(cJSON *obj, const char *key, uint64_t v);
cJSON *json_u64(uint64_t v);
void json_add_hex(cJSON *obj, const char *key, uint64_t v);
/* Prints @root as the one JSON object on stdout, then deletes it. */
int json_emit(cJSON *root);

/*
 * Streaming JSON for per-block listings: "{...head members..., "KEY": [" then
 * one element at a time, then "]}". Keeps memory flat for any file size.
 */
struct json_stream {
	bool first;
};
void json_stream_begin(struct json_stream *js, cJSON *head, const char *array_key);
void json_stream_item(struct json_stream *js, cJSON *item);	/* deletes @item */
int json_stream_end(struct json_stream *js);

/* Percent, with 0 of 0 as 0. */
static inline double pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

#endif
