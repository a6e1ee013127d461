/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private to the tool (not its QEMU library, lib/): what its
 * commands share: exit codes, option parsing, messages, progress and JSON
 * reports, and the commands themselves.
 */
#ifndef HALITE_QEMU_TOOL_H
#define HALITE_QEMU_TOOL_H

#include <stdbool.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include <halite/halite.h>
#include <cjson/cJSON.h>

#include "base.h"
#include "vm.h"

/* Exit status: 0 ok, 1 the operation failed, 2 usage, 77 kernel/QEMU lacks a feature. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_UNSUPPORTED = 77 };

/* --- recover.c --- */
struct hq_out;
/* save --recover: QEMU at @qmp given back the memory a dead save moved aside. An exit code. */
int hq_cmd_recover(const char *qmp, const struct hq_out *o);


/* --- util --- */

/*
 * getopt_long codes of the options every command takes beyond -j/-q/-v
 * (above any character, so they collide with no command's own).
 */
enum { HQ_OPT_PROGRESS = 0x100, HQ_OPT_VERSION, HQ_OPT_BYPASS_CACHE };
/*
 * The long options of save and restore that hq_out_opt() takes (and
 * --bypass-cache, which both pass to their engine), for their getopt tables.
 */
#define HQ_OUT_LONGOPTS							\
	{ "bypass-cache", no_argument, NULL, HQ_OPT_BYPASS_CACHE },	\
	{ "json", no_argument, NULL, 'j' },				\
	{ "progress", optional_argument, NULL, HQ_OPT_PROGRESS },	\
	{ "quiet", no_argument, NULL, 'q' },				\
	{ "verbose", no_argument, NULL, 'v' },				\
	{ "help", no_argument, NULL, 'h' },				\
	{ "version", no_argument, NULL, HQ_OPT_VERSION }

/* What a command prints and how (--json, -q, -v, --progress), and its name. */
struct hq_out {
	bool json, quiet, verbose;
	int progress;	   /* HALITE_PROGRESS_*: --progress, else none with -q, else text */
	bool progress_set; /* --progress given */
	const char *cmd;   /* "save", "restore", "clone": the messages' prefix */
	char usage[512];   /* the usage error parsing found (exit 2) */
};
/* Start parsing for @cmd: *o cleared, --json looked for before any "--" (a usage error reports in JSON too). */
void hq_out_init(struct hq_out *o, const char *cmd, int argc, char **argv);
/*
 * getopt_long's code @c if it is one every command shares: 'j', 'q', 'v',
 * HQ_OPT_PROGRESS, HQ_OPT_VERSION (prints the version and exits 0), and
 * getopt's own ':' and '?' (a missing value, an unknown option: o->usage
 * says which). 1 when taken, 0 when @c is the command's own, -1 on a usage
 * error (o->usage). getopt's own messages are off (opterr = 0): call
 * getopt_long with an optstring starting with ':'.
 */
int hq_out_opt(int c, struct hq_out *o, int argc, char **argv);
/* The option getopt_long just refused, as the user wrote it ("--foo", "-m"), into @buf. */
void hq_bad_option(int argc, char **argv, char *buf, size_t len);
/* A usage error in o->usage; returns -1. */
int hq_usage(struct hq_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * A usage error parsing found, on stderr ("CMD: what"); with --json also
 * into @err for the command's JSON report, which it then prints: true.
 */
bool hq_usage_report(const struct hq_out *o, char *err, size_t len);
/* The progress mode in effect: --progress, else none with -q, else text. */
int hq_progress_mode(const struct hq_out *o);
/*
 * Whether a progress report is due at @now (the last at *@last, updated
 * when due): JSON lines every 0.5 s, a text line every second.
 */
bool hq_progress_due(const struct hq_out *o, uint64_t *last, uint64_t now);
/* The exit code of a command that ended with @ret: 0, 77 for -HALITE_E_UNSUPPORTED, else 1. */
int hq_exit_code(int ret);

/*
 * JSON reports (docs/cli.md): one object, "ok", "error" and "exit" on
 * failure, "qemu_error" (QEMU's own words when it caused the failure),
 * null for what is not known. The head: {"ok", "file", "error", "exit" (on
 * failure), "qemu_error", "qemu": {"pid", "version", "machine", "vcpus"}}.
 * @vm may be NULL (nothing known of QEMU); @code is the exit code.
 */
cJSON *hq_json_head(int code, const char *file, const char *err, const char *qemu_err,
		    const struct hq_vm *vm);
/* @key: @v exact (no double rounding), or null when not @known. */
void hq_json_u64(cJSON *o, const char *key, bool known, uint64_t v);
/* @key: @v with @decimals digits after the point, or null when not @known. */
void hq_json_fixed(cJSON *o, const char *key, bool known, double v, int decimals);
/* @key: @s, or null for NULL or "". */
void hq_json_str(cJSON *o, const char *key, const char *s);
/* @key: @v, or null when not @known. */
void hq_json_bool(cJSON *o, const char *key, bool known, bool v);
/* @o on stdout, one line, and deleted. */
void hq_json_print(cJSON *o);
/* A usage error's report for a command without one of its own: the head alone. */
void hq_json_usage(const struct hq_out *o);

/* SIGINT and SIGTERM set hq_stop_signal instead of killing us. */
extern volatile sig_atomic_t hq_stop_signal;
void hq_catch_stop_signals(void);
void hq_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hq_progressf(bool quiet, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * The engines' log (ctx: the command's struct hq_out): warnings always,
 * the rest with --verbose. Errors only with --verbose: the engine returns
 * them too, and the command reports them once.
 */
void hq_log(void *ctx, int level, const char *msg);

/*
 * The lines of a command's --help about the options hq_out_opt() takes:
 * @cmd ("save", "restore") names what --json reports the failure of.
 */
#define HQ_HELP_OUT_OPTS(cmd)								\
	"  --json             print the report as one JSON object on stdout, also when\n"	\
	"                     the " cmd " fails (\"ok\": false, \"error\", \"exit\",\n"	\
	"                     \"qemu_error\": QEMU's own message when it is the cause)\n"	\
	"  --progress[=MODE]  progress on stderr: text (default), json (a JSON object\n"	\
	"                     per line, twice a second) or none\n"				\
	"  -q, --quiet        no progress on stderr (--progress=none)\n"			\
	"  -v, --verbose      the engine's log on stderr\n"					\
	"  -h, --help         this help\n"							\
	"  --version          the version\n\n"

/* --- commands --- */
int hq_cmd_save(int argc, char **argv);
int hq_cmd_restore(int argc, char **argv);
int hq_cmd_clone(int argc, char **argv);
void hq_help_save(FILE *f);
void hq_help_restore(FILE *f);
void hq_help_clone(FILE *f);

#endif
