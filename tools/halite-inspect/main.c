// SPDX-License-Identifier: MIT
/*
 * halite-inspect: look inside Halite snapshot files, check them, and move
 * memory images in and out of them. This file only dispatches; each
 * subcommand lives in its own file.
 */
#include <stdio.h>
#include <string.h>

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
	{ "help", "describe a command", cmd_help, help_help },
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: " PROG " [--version] [--help] COMMAND [ARGS...]\n\nCommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nEvery command takes --help, and all but help take --json.\n"
		   "Exit status: 0 ok, 1 the file is bad, 2 usage or I/O error.\n");
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
	if (argc > 2)
		return usage_error("help", "too many arguments");
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		help_help(stdout);
		return EXIT_OK;
	}
	c = find_command(argv[1]);
	if (!c) {
		errorf("unknown command '%s'; see '" PROG " help'", argv[1]);
		return EXIT_USAGE;
	}
	c->help(stdout);
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	const struct command *c;
	int i;

	/* Global options are few and come before the command; getopt would permute. */
	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
			printf(PROG " %d.%d.%d (file format %d.%d)\n", HALITE_VERSION_MAJOR,
			       HALITE_VERSION_MINOR, HALITE_VERSION_PATCH, HALITE_FORMAT_MAJOR,
			       HALITE_FORMAT_MINOR);
			return EXIT_OK;
		}
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return EXIT_OK;
		}
		errorf("unknown option '%s'", argv[i]);
		usage(stderr);
		return EXIT_USAGE;
	}
	if (i == argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	c = find_command(argv[i]);
	if (!c) {
		errorf("unknown command '%s'; see '" PROG " help'", argv[i]);
		return EXIT_USAGE;
	}
	return c->run(argc - i, argv + i);
}
