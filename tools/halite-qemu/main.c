// SPDX-License-Identifier: MIT
/*
 * halite-qemu: save a running stock QEMU guest lazily and restore it lazily.
 * This file only dispatches: save.c, restore.c and clone.c hold the commands, vm.c
 * what they do to QEMU.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tool.h"
#include "fault.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [--version] COMMAND [ARGS...]\n\n"
		"Commands:\n"
		"  save     save a running QEMU guest lazily (copy-on-access) to a file\n"
		"  restore  start QEMU from a file; the guest runs at once, memory comes lazily\n"
		"  clone    one clone of a saved guest for a clone service (halite-cloned)\n"
		"  help     describe a command\n\n"
		"Options:\n"
		"  -h, --help     this help\n"
		"  -V, --version  the version\n\n"
		"'" PROG " COMMAND --help' for each. Exit status: 0 ok, 1 failed, 2 usage,\n"
		"77 the kernel or QEMU lacks a needed feature.\n");
}

/* A usage error of the command line as a whole: one sentence, and the JSON object if asked. */
static int usage_error(int argc, char **argv, const char *fmt, const char *word)
{
	struct hq_out o;

	hq_out_init(&o, NULL, argc, argv);
	snprintf(o.usage, sizeof(o.usage), fmt, word);
	hq_errorf("%s", o.usage);
	hq_json_usage(&o);
	return EXIT_USAGE;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)
		return halite_cli_version(PROG);
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(stdout);
		return EXIT_OK;
	}
	if (strcmp(argv[1], "save") == 0 || strcmp(argv[1], "restore") == 0) {
		char err[256];
		int code;

		if (hq_fault_init(err, sizeof(err))) {
			hq_errorf("%s: %s", argv[1], err);
			return EXIT_USAGE;
		}
		code = strcmp(argv[1], "save") ? hq_cmd_restore(argc - 1, argv + 1) :
		       hq_cmd_save(argc - 1, argv + 1);
		hq_fault_end();
		return code;
	}
	if (strcmp(argv[1], "clone") == 0)
		return hq_cmd_clone(argc - 1, argv + 1);
	if (strcmp(argv[1], "help") == 0) {
		if (argc > 2 && strcmp(argv[2], "save") == 0)
			hq_help_save(stdout);
		else if (argc > 2 && strcmp(argv[2], "restore") == 0)
			hq_help_restore(stdout);
		else if (argc > 2 && strcmp(argv[2], "clone") == 0)
			hq_help_clone(stdout);
		else if (argc > 2)
			return usage_error(argc, argv, "help: no command '%s' (save, restore, "
					   "clone)", argv[2]);
		else
			usage(stdout);
		return EXIT_OK;
	}
	if (argv[1][0] == '-')
		return usage_error(argc, argv, "unknown option '%s' (" PROG " --help)", argv[1]);
	return usage_error(argc, argv, "unknown command '%s' (" PROG " --help)", argv[1]);
}
