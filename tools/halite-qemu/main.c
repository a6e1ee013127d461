// SPDX-License-Identifier: MIT
/*
 * halite-qemu: save a running stock QEMU guest lazily and restore it lazily.
 * This file only dispatches: save.c, restore.c and clone.c hold the commands, vm.c
 * what they do to QEMU.
 */
#include <stdio.h>
#include <string.h>

#include "hq.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [--version] COMMAND [ARGS...]\n\n"
		"Commands:\n"
		"  save     save a running QEMU guest lazily (copy-on-access) to a file\n"
		"  restore  start QEMU from a file; the guest runs at once, memory comes lazily\n"
		"  clone    one clone of a saved guest for a clone service (halite-cloned)\n"
		"  help     describe a command\n\n"
		"'" PROG " COMMAND --help' for each.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
		printf(PROG " %d.%d.%d (file format %d.%d)\n", HALITE_VERSION_MAJOR,
		       HALITE_VERSION_MINOR, HALITE_VERSION_PATCH, HALITE_FORMAT_MAJOR,
		       HALITE_FORMAT_MINOR);
		return EXIT_OK;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(stdout);
		return EXIT_OK;
	}
	if (strcmp(argv[1], "save") == 0 || strcmp(argv[1], "restore") == 0) {
		char err[256];
		int code;

		if (hq_fault_init(err, sizeof(err))) {
			hq_errorf("%s", err);
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
		else
			usage(stdout);
		return EXIT_OK;
	}
	hq_errorf("unknown command '%s'; see '" PROG " --help'", argv[1]);
	return EXIT_USAGE;
}
