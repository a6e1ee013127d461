// SPDX-License-Identifier: MIT
/*
 * halite-inspect: look inside Halite snapshot files, check them, and move
 * memory images in and out of them. This file only dispatches; each
 * subcommand lives in its own file.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "inspect.h"

static void help_help(FILE *f)
{
	fprintf(f, "Usage: " PROG " help [COMMAND]\n\nDescribe COMMAND, or list the commands.\n");
}

static int cmd_help(int argc, char **argv);

static const struct command commands[] = {
	{ "info", "header, regions, block statistics, streams, sections, metadata",
	  cmd_info, help_info },
	{ "verify", "check every checksum and decode every stored memory block",
	  cmd_verify, help_verify },
	{ "blocks", "list the locality blocks", cmd_blocks, help_blocks },
	{ "map", "list the memory blocks and where they are stored", cmd_map, help_map },
	{ "extract", "write a region's memory as a raw image", cmd_extract, help_extract },
	{ "import", "make a snapshot file from raw memory images", cmd_import, help_import },
	{ "restore", "what a lazy restore read and why, from its trace", cmd_restore,
	  help_restore },
	{ "relayout", "rewrite a file in the order its guest touched memory, from traces",
	  cmd_relayout, help_relayout },
	{ "push", "upload a snapshot file to s3://BUCKET/KEY (resumable)", cmd_push, help_push },
	{ "pull", "download a snapshot from s3://BUCKET/KEY", cmd_pull, help_pull },
	{ "help", "describe a command", cmd_help, help_help },
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: " PROG " [--version] [--help] COMMAND [ARGS...]\n\nCommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nEvery command takes --help and --version; all but help take --json:\n"
		   "one JSON object on stdout, on failure too, with ok, error and exit.\n"
		   "verify, import, extract, relayout, push and pull take\n"
		   "--progress[=text|json|none].\n"
		   "An error is one line on stderr: " PROG ": COMMAND: MESSAGE.\n\n"
		   "Exit status: 0 ok, 1 the file is bad or the command failed, 2 usage: a bad\n"
		   "option or argument, refused before anything is written.\n");
}

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static int cmd_help(int argc, char **argv)
{
	const struct command *c;

	if (argc < 2) {
		usage(stdout);
		return EXIT_OK;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		help_help(stdout);
		return EXIT_OK;
	}
	if (strcmp(argv[1], "--version") == 0)
		return print_version();
	if (argc > 2)
		return usage_hint("too many arguments");
	c = find_command(argv[1]);
	if (!c)
		return usage_error("unknown command '%s'; '" PROG " help' lists them", argv[1]);
	c->help(stdout);
	return EXIT_OK;
}

/*
 * --json anywhere, as getopt_long would take it (an unambiguous prefix:
 * "--js"), so that a usage error found before the command parses its
 * options still prints the JSON object.
 */
static bool wants_json(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (strlen(argv[i]) >= 4 && !strncmp(argv[i], "--json", strlen(argv[i])))
			return true;
	return false;
}

/* The commands that read a snapshot, and so take the host's LB cache (help_store()). */
static bool reads_snapshot(const char *cmd)
{
	static const char *const names[] = { "info", "verify", "blocks", "map", "extract",
					     "restore", "relayout" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(cmd, names[i]))
			return true;
	return false;
}

/*
 * --cache-dir DIR and --cache-size SIZE (or --opt=VALUE) before "--", taken
 * out of @argv and set in the environment, where the engine opens the
 * object and its cache (io_s3.c). 0, or EXIT_USAGE with the problem said.
 */
static int take_store_options(int *argc, char **argv)
{
	static const struct {
		const char *opt, *env;
	} opts[] = { { "--cache-dir", "HALITE_CACHE_DIR" }, { "--cache-size", "HALITE_CACHE_SIZE" } };
	int out = 1;

	for (int i = 1; i < *argc; i++) {
		const char *val = NULL;
		size_t k = 0;

		if (!strcmp(argv[i], "--")) {
			while (i < *argc)
				argv[out++] = argv[i++];
			break;
		}
		for (; k < sizeof(opts) / sizeof(opts[0]); k++) {
			size_t n = strlen(opts[k].opt);

			if (!strncmp(argv[i], opts[k].opt, n) && (!argv[i][n] || argv[i][n] == '='))
				break;
		}
		if (k == sizeof(opts) / sizeof(opts[0])) {
			argv[out++] = argv[i];
			continue;
		}
		val = strchr(argv[i], '=') ? strchr(argv[i], '=') + 1 : i + 1 < *argc ? argv[++i] : NULL;
		if (!val)
			return usage_error("%s: expects a value", opts[k].opt);
		if (k == 0 && !*val)
			return usage_error("--cache-dir '%s': a directory", val);
		if (k == 1) {
			uint64_t v;

			if (halite_parse_size(val, &v) || !v)
				return usage_error("--cache-size '%s': a size in bytes (K, M, G "
						   "suffixes), above 0", val);
		}
		if (setenv(opts[k].env, val, 1))
			return usage_error("%s: %s", opts[k].opt, strerror(errno));
	}
	*argc = out;
	argv[out] = NULL;
	return 0;
}

static int dispatch(int argc, char **argv)
{
	const struct command *c;
	int i;

	/* Global options are few and come before the command; getopt would permute. */
	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0)
			return print_version();
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			run_stdout_taken();
			usage(stdout);
			return EXIT_OK;
		}
		if (strcmp(argv[i], "--json"))
			return usage_hint("unknown option '%s'", argv[i]);
	}
	if (i == argc) {
		if (!run_json())
			usage(stderr);
		return usage_error("no command given; '" PROG " help' lists them");
	}
	c = find_command(argv[i]);
	if (!c)
		return usage_error("unknown command '%s'; '" PROG " help' lists them", argv[i]);
	run_begin(c->name);
	argc -= i;
	argv += i;
	if (reads_snapshot(c->name) && take_store_options(&argc, argv))
		return EXIT_USAGE;
	return c->run(argc, argv);
}

int main(int argc, char **argv)
{
	if (wants_json(argc, argv))
		run_set_json();
	return run_end(dispatch(argc, argv));
}
