// SPDX-License-Identifier: MIT
/*
 * Test helper: a snapshot as halite-qemu save writes one, without a QEMU:
 * region mem0 (64 KiB, never touched), 2 vCPUs, a device state that is a
 * device-only stream naming machine pc-q35-7.2 (nothing else in it), and
 * the metadata a save records, with the command line and working directory
 * given. For the restore's command-line checks, which all happen before
 * QEMU starts (tests/qemu/test_qemu.py case cli).
 *
 *   qemu_mkfile OUT [--cwd DIR] [--devices D1,D2,...] [-- QEMU-ARGV...]
 *
 * Without "--", the file records no command line (an older save's file).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/halite.h>

static void check(int ret, const char *what, struct halite_writer *w)
{
	if (ret < 0) {
		fprintf(stderr, "qemu_mkfile: %s: %s: %s\n", what, halite_strerror(ret),
			w ? halite_writer_errmsg(w) : "");
		exit(1);
	}
}

static void meta(struct halite_writer *w, const char *key, const char *val)
{
	check(halite_writer_set_meta(w, key, val, (uint32_t)strlen(val)), key, w);
}

/* @n strings, each followed by its NUL, into one malloc'd buffer. */
static char *nul_list(char **v, int n, uint32_t *len)
{
	size_t total = 0, k = 0;
	char *buf;

	for (int i = 0; i < n; i++)
		total += strlen(v[i]) + 1;
	buf = malloc(total + 1);
	if (!buf)
		exit(1);
	for (int i = 0; i < n; i++) {
		strcpy(buf + k, v[i]);
		k += strlen(v[i]) + 1;
	}
	*len = (uint32_t)total;
	return buf;
}

int main(int argc, char **argv)
{
	static const struct halite_region region = { "mem0", 0, 64 * 1024 };
	/* "QEVM", version 3, CONFIGURATION "pc-q35-7.2", EOF. */
	static const uint8_t dev[] = { 'Q', 'E', 'V', 'M', 0, 0, 0, 3, 0x07, 0, 0, 0, 10,
				       'p', 'c', '-', 'q', '3', '5', '-', '7', '.', '2', 0x00 };
	static const struct halite_root root = { 0, HALITE_PAGING_4LEVEL, 0x1000 };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	const char *cwd = NULL, *devices = NULL;
	int dd;

	if (argc < 2) {
		fprintf(stderr, "usage: qemu_mkfile OUT [--cwd DIR] [--devices D1,D2] [-- ARGV...]\n");
		return 2;
	}
	for (dd = 2; dd < argc && strcmp(argv[dd], "--"); dd++) {
		if (!strcmp(argv[dd], "--cwd") && dd + 1 < argc)
			cwd = argv[++dd];
		else if (!strcmp(argv[dd], "--devices") && dd + 1 < argc)
			devices = argv[++dd];
		else
			return 2;
	}
	o.vcpu_count = 2;
	o.flags = HALITE_WRITER_NO_SYNC;
	check(halite_writer_create(&w, argv[1], &region, 1, &o), "create", NULL);
	check(halite_writer_add_root(w, &root), "root", w);
	check(halite_writer_set_device_state(w, dev, sizeof(dev)), "device state", w);
	meta(w, "qemu.version", "7.2.22");
	meta(w, "qemu.machine", "pc-q35-7.2");
	meta(w, "creator", "halite-qemu");
	meta(w, "qemu.run-state", "running");
	if (dd < argc - 1) {
		uint32_t len;
		char *l = nul_list(argv + dd + 1, argc - dd - 1, &len);

		check(halite_writer_set_meta(w, "qemu.cmdline", l, len), "qemu.cmdline", w);
		free(l);
	}
	if (cwd)
		meta(w, "qemu.cwd", cwd);
	if (devices) {
		char *d = strdup(devices), *v[64], *l;
		uint32_t len;
		int n = 0;

		for (char *t = strtok(d, ","); t && n < 64; t = strtok(NULL, ","))
			v[n++] = t;
		l = nul_list(v, n, &len);
		check(halite_writer_set_meta(w, "qemu.devices", l, len), "qemu.devices", w);
		free(l);
		free(d);
	}
	check(halite_writer_finish(w), "finish", w);
	halite_writer_free(w, true);
	return 0;
}
