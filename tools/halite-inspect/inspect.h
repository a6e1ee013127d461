/* SPDX-License-Identifier: MIT */
/*
 * halite-inspect: shared declarations of the subcommands and their helpers.
 *
 * Exit codes are part of the interface (scripts test them): 0 all good,
 * 1 the file is bad (corrupt, incomplete, a checksum or decode failure) or
 * the operation failed (a file that does not open, I/O), 2 usage: a bad
 * option or argument, refused before anything is written. The conventions
 * are docs/cli.md's: one sentence per error on stderr, "halite-inspect:
 * COMMAND: ..."; stdout carries only the result (a table, or with --json one
 * JSON object, on failure too).
 */
#ifndef HALITE_INSPECT_H
#define HALITE_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>
#include <halite/halite.h>

#include "cli.h"

#define PROG "halite-inspect"

/* HLT_RELAYOUT_META, the record of a relayouted file (relayout.c writes it, restore.c reads it). */
#include "relayout_meta.h"

enum {
	EXIT_OK = 0,
	EXIT_BAD = 1,		/* the file is bad */
	EXIT_FAIL = 1,		/* the operation failed: I/O, memory, a missing file */
	EXIT_USAGE = 2,		/* a bad option or argument, nothing done */
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
int cmd_relayout(int argc, char **argv);
int cmd_push(int argc, char **argv);
int cmd_pull(int argc, char **argv);
/*
 * The options extract and import share (--progress, --json, --help,
 * --version) in their help, the descriptions at column @col + 2.
 */
void help_image_options(FILE *f, int col);
void help_info(FILE *f);
void help_verify(FILE *f);
void help_blocks(FILE *f);
void help_map(FILE *f);
void help_extract(FILE *f);
void help_import(FILE *f);
void help_restore(FILE *f);
void help_relayout(FILE *f);
void help_push(FILE *f);
void help_pull(FILE *f);

/* ---- the run: diagnostics, the one JSON object, common parsing (util.c) ---- */

/*
 * One command runs per process, so what every error path needs (the
 * command's name for the prefix, whether --json was given, the first error's
 * sentence for the JSON object) is kept for the run in util.c rather than
 * passed through every helper.
 */
void run_begin(const char *cmd);
/* --json was given: failures print the one JSON object too (run_end). */
void run_set_json(void);
bool run_json(void);
/*
 * The keys a success of this command prints at the top level (NULL-ended,
 * static): a failure prints them too, null where nothing was learnt.
 */
void run_keys(const char *const *keys);
/* The failure object's values learnt so far (owned by the run). */
cJSON *run_result(void);
/* Something else has stdout (--help, --version): no JSON object at the end. */
void run_stdout_taken(void);
/*
 * main()'s last word: with --json and no object printed yet, the failure
 * object ({..., "ok": false, "error": ..., "exit": N}). Returns @ret.
 */
int run_end(int ret);
/* "ok", and on failure the run's "error" and "exit", into @obj. */
void json_add_status(cJSON *obj, int exit);
/* The error sentence for --json, replacing the first one errorf() kept. */
void run_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * "halite-inspect: COMMAND: MESSAGE" on stderr; the first one of a run is
 * the error its JSON object reports.
 */
void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same prefix for what is not an error (a summary, the seed chosen). */
void notef(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A usage error: says so and returns EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* As usage_error(), pointing at "halite-inspect COMMAND --help". */
int usage_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * An output that is an input, by name or as a file (same device and inode,
 * so "./x" for "x", hard links and symlinks count), is refused before
 * anything is written: one sentence naming both ("the output OUT is the same
 * file as IN (WHAT)"), and EXIT_USAGE. 0 when they differ.
 */
int refuse_input_as_output(const char *out, const char *in, const char *what);

/* For getopt's ':' and '?': names the option, returns EXIT_USAGE. */
int bad_option(int c, char **argv);

/* --version in a subcommand: prints it, returns EXIT_OK. */
int print_version(void);

/*
 * The getopt result no subcommand handles itself: --help (@help on stdout),
 * --version, or a bad option. Returns the exit code: EXIT_OK after help
 * and version.
 */
int common_option(int c, char **argv, void (*help)(FILE *));

/*
 * Exit code for a failed Halite call: EXIT_USAGE where the caller asked for
 * what is not there (a region) or named what cannot be a snapshot (-EINVAL:
 * not a regular file); else EXIT_BAD or EXIT_FAIL, both 1.
 */
int exit_code_for(int err);

/*
 * "PATH[: WHAT]: DETAIL" as one sentence through errorf(): @detail is a
 * library message (errmsg, errbuf) or NULL. The path is named once, and the
 * error code's text is added only where the detail does not say it already.
 */
void report_error(const char *path, const char *what, int err, const char *detail);
/* report_error()'s sentence without "PATH: ", into @buf. */
const char *error_text(const char *path, int err, const char *detail, char *buf, size_t len);
/* @detail without a leading "PATH: ". */
const char *strip_path(const char *path, const char *detail);

/*
 * Open @path for reading. On failure says why (report_error) and returns the
 * exit code to use; 0 on success.
 */
int open_reader(struct halite_reader **r, const char *path);

/*
 * Region @name of @r's file, or, when there is none, a usage error naming
 * the regions the file has; returns the index or -EXIT_USAGE.
 */
int find_region(struct halite_reader *r, const char *path, const char *name);
/* "mem0, 0000:00:01.0/vga.vram": the names of the file's regions, into @buf. */
const char *region_list(const struct halite_reader *r, char *buf, size_t len);

/* Index of the region holding global memory block @mb. */
uint32_t region_of_mb(const struct halite_reader *r, uint64_t mb);
/* "MB 7 (region pc.ram + 0xe000, gpa 0xe000)" */
const char *describe_mb(const struct halite_reader *r, uint64_t mb, char *buf, size_t len);
/* "LB 3 (offset 200704, stream vcpu0, seq 2)" */
const char *describe_lb(const struct halite_reader *r, uint64_t lb, char *buf, size_t len);

int parse_int(const char *s, long min, long max, long *out);
/* 0 = online CPUs. */
unsigned default_jobs(void);
/* Decimal digits of @v, for a table column's width. */
int digits(uint64_t v);

/*
 * Rows of @size bytes that each start with a uint32_t id, sorted by it (a
 * file's streams: a few, looked up once per LB). @rows is the address of the
 * array pointer. The row of @id; with @add, a zeroed one put in its place
 * when there is none. NULL: none, or out of memory.
 */
void *id_row(void *rows, size_t *n, size_t *cap, size_t size, uint32_t id, bool add);

/* "1.5 MiB" style, into buf. */
const char *human_bytes(uint64_t v, char *buf, size_t len);
/* A block state as JSON names it: "stored", "zero", "untouched" (the API's word). */
const char *mb_state_name(uint32_t state);
/* As people read it, the README's words: "stored", "zero", "never-touched". */
const char *mb_state_word(uint32_t state);

/* Common getopt_long entries that every subcommand shares. */
#define OPT_HELP 'h'
#define OPT_JSON 0x100
#define OPT_VERSION 0x101
#define OPT_PROGRESS 0x102
#define LONGOPTS_COMMON                                                   \
	{ "json", no_argument, NULL, OPT_JSON },                         \
	{ "help", no_argument, NULL, OPT_HELP },                         \
	{ "version", no_argument, NULL, OPT_VERSION }

/*
 * The commands that read a snapshot, which may be s3://BUCKET/KEY, take
 * the host's LB cache as halite-qemu restore does: --cache-dir DIR and
 * --cache-size SIZE, anywhere before "--" (main.c takes them out before
 * the command parses its own, and hands them to the engine through its
 * environment, where it opens the object). Their help's last paragraph:
 */
void help_store(FILE *f);

/*
 * --progress[=text|json|none] of the long commands: a report on stderr about
 * every half second and a last one when done (docs/cli.md).
 */
struct progress {
	int mode;		/* enum halite_progress_mode, or -1: off */
	const char *op;		/* "verify", "import", "extract" */
	const char *path;	/* what it works on, for the text line */
	int64_t total;		/* bytes in all, -1 unknown */
	double start, last;	/* CLOCK_MONOTONIC seconds */
	bool tty;		/* text on a terminal: one line rewritten */
};
/* --progress's argument: 0, or a usage error said and EXIT_USAGE. */
int progress_parse(const char *arg, int *mode);
void progress_begin(struct progress *p, int mode, const char *op, const char *path,
		    int64_t total);
/* @bytes done so far; prints when half a second has passed, or @done. */
void progress_update(struct progress *p, int64_t bytes, bool done);

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
/*
 * "store": what reading @r (opened from @path) asked of the object store and
 * of the host's LB cache (halite_reader_store_stats()); null for a local file.
 */
void json_add_store(cJSON *obj, const struct halite_reader *r, const char *path);
cJSON *json_u64(uint64_t v);
void json_add_hex(cJSON *obj, const char *key, uint64_t v);
/*
 * Prints @root as the one JSON object on stdout, then deletes it: with "ok"
 * true when @exit is 0, else "ok" false, the run's "error" and "exit".
 * Returns @exit, or EXIT_USAGE if stdout failed.
 */
int json_emit(cJSON *root, int exit);

/*
 * Streaming JSON for per-block listings: "{...head members..., "KEY": [" then
 * one element at a time, then "]}". Keeps memory flat for any file size.
 */
struct json_stream {
	bool first;
};
void json_stream_begin(struct json_stream *js, cJSON *head, const char *array_key);
void json_stream_item(struct json_stream *js, cJSON *item);	/* deletes @item */
/* Closes the array, then "ok" (and on failure "error" and "exit") as json_emit(). */
int json_stream_end(struct json_stream *js, int exit);

/* Percent, with 0 of 0 as 0. */
static inline double pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

/* A percentage in JSON: null when there is no whole to be a part of. */
void json_add_pct(cJSON *obj, const char *key, uint64_t part, uint64_t whole);

#endif
