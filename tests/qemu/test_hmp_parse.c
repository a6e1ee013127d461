// SPDX-License-Identifier: MIT
/*
 * halite-qemu's HMP parsers (halite/qemu/qemu_info.c) on outputs
 * captured from Debian's QEMU 7.2 (tests/qemu/hmp-samples/): q35 with 4 GiB
 * at reset (RAM split below and above 4 GiB), q35 with 512 MiB running the
 * test guest's Linux (PAM areas mapped as ROM, video memory at the VGA's BAR),
 * pc without a memory backend; two VGAs and a chain4 window (made up); and
 * text they must refuse. Exact values throughout.
 *
 *   test_hmp_parse SAMPLE-DIR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"
#include "qemu_info.h"
#include "qemu_test.h"

static const char *dir;

static char *sample(const char *name)
{
	return q_sample(dir, name);
}

static void ramblocks(void)
{
	struct hq_ramblock *b = NULL;
	char err[256] = "", *t = sample("q35-4g-ramblock.txt");
	int n = hq_parse_ramblocks(t, &b, err, sizeof(err));

	CHECK(n == 9, "%d blocks (%s)", n, err);
	if (n == 9) {
		CHECK(!strcmp(b[0].name, "mem0") && b[0].page_size == 4096 && b[0].offset == 0 &&
		      b[0].used == 0x100000000ull && b[0].total == 0x100000000ull, "mem0");
		CHECK(!strcmp(b[2].name, "/rom@etc/acpi/tables") && b[2].used == 0x20000 &&
		      b[2].total == 0x200000 && b[2].offset == 0x101100000ull, "acpi tables");
		CHECK(!strcmp(b[8].name, "/rom@etc/acpi/rsdp") && b[8].used == 0x1000, "rsdp");
	}
	free(b);
	free(t);
	t = sample("pc-512m-ramblock.txt");
	n = hq_parse_ramblocks(t, &b, err, sizeof(err));
	CHECK(n == 9 && !strcmp(b[0].name, "pc.ram") && b[0].used == 0x20000000, "pc: %d", n);
	free(b);
	free(t);
	/* Refused: no header; a line that is not a block. */
	CHECK(hq_parse_ramblocks("", &b, err, sizeof(err)) == -EINVAL && strstr(err, "header"),
	      "empty: %s", err);
	CHECK(hq_parse_ramblocks("   Block Name    PSize   Offset   Used   Total\n"
				 "  mem0  4 KiB  0x0  zz  0x10\n", &b, err, sizeof(err)) == -EINVAL,
	      "bad line: %s", err);
	CHECK(hq_parse_ramblocks("   Block Name    PSize   Offset   Used   Total\n"
				 "  mem0  4 KiB  0x0  0x20  0x10\n", &b, err, sizeof(err)) == -EINVAL,
	      "used > total: %s", err);
}

static void registers(void)
{
	struct hq_cpu_regs *r = NULL;
	char err[256] = "", *t = sample("q35-512m-linux-registers.txt");
	int n = hq_parse_registers(t, &r, err, sizeof(err));

	CHECK(n == 2, "%d CPUs (%s)", n, err);
	if (n == 2) {
		CHECK(r[0].cpu == 0 && r[0].cr0 == 0x80050033 && r[0].cr3 == 0x2a10000 &&
		      r[0].cr4 == 0x6f0 && r[0].efer == 0xd01, "CPU#0 long mode");
		CHECK(r[1].cpu == 1 && r[1].cr3 == 0x514a000 && r[1].cr4 == 0x6e0, "CPU#1");
	}
	free(r);
	free(t);
	t = sample("q35-reset-registers.txt");
	n = hq_parse_registers(t, &r, err, sizeof(err));
	CHECK(n == 2 && r[0].cr0 == 0x60000010 && r[0].cr3 == 0 && r[0].efer == 0, "reset");
	free(r);
	free(t);
	CHECK(hq_parse_registers("", &r, err, sizeof(err)) == -EINVAL, "empty");
	CHECK(hq_parse_registers("CPU#0\nCR0=1 CR2=0 CR4=0\nEFER=0\n", &r, err, sizeof(err)) ==
	      -EINVAL && strstr(err, "CPU#0"), "no CR3: %s", err);
}

static void mtree(void)
{
	struct hq_gpa_range *g = NULL;
	struct hq_piece p[8];
	char err[256] = "", *t = sample("q35-4g-mtree.txt");
	int n = hq_parse_mtree(t, "mem0", &g, err, sizeof(err)), k;

	CHECK(n == 3, "4G: %d ranges (%s)", n, err);
	if (n == 3) {
		CHECK(g[0].gpa == 0 && g[0].len == 0xa0000 && g[0].offset == 0, "low 640K");
		CHECK(g[1].gpa == 0x100000 && g[1].len == 0x7ff00000 && g[1].offset == 0x100000,
		      "below 4G");
		CHECK(g[2].gpa == 0x100000000ull && g[2].len == 0x80000000 &&
		      g[2].offset == 0x80000000, "above 4G");
		k = hq_split_block(g, n, 0x100000000ull, p, 8);
		CHECK(k == 2 && p[0].gpa == 0 && p[0].offset == 0 && p[0].length == 0x80000000 &&
		      p[1].gpa == 0x100000000ull && p[1].offset == 0x80000000 &&
		      p[1].length == 0x80000000, "4G split: %d pieces", k);
		CHECK(hq_split_block(g, n, 0x100000000ull, p, 1) == -E2BIG, "max");
		CHECK(hq_split_block(g, n, 0x90000000ull, p, 8) == -EPROTO, "past the block");
	}
	free(g);
	free(t);
	/* Linux running: PAM areas as ROM of mem0, contiguous with the RAM after them. */
	t = sample("q35-512m-linux-mtree.txt");
	n = hq_parse_mtree(t, "mem0", &g, err, sizeof(err));
	CHECK(n == 2 && g[0].gpa == 0 && g[0].len == 0xa0000 && g[1].gpa == 0xc0000 &&
	      g[1].offset == 0xc0000 && g[1].len == 0x20000000 - 0xc0000, "512M: %d", n);
	k = hq_split_block(g, n, 0x20000000, p, 8);
	CHECK(k == 1 && p[0].gpa == 0 && p[0].length == 0x20000000, "512M: one piece (%d)", k);
	free(g);
	free(t);
	/* pc: the "memory" address space is not the first flat view. */
	t = sample("pc-512m-mtree.txt");
	n = hq_parse_mtree(t, "pc.ram", &g, err, sizeof(err));
	CHECK(n == 2 && g[1].gpa == 0x100000 && g[1].len == 0x1ff00000, "pc: %d", n);
	free(g);
	n = hq_parse_mtree(t, "mem0", &g, err, sizeof(err));
	CHECK(n == 0, "no such block: %d", n);
	free(g);
	free(t);
	CHECK(hq_parse_mtree("FlatView #0\n AS \"I/O\", root: io\n", "mem0", &g, err,
			     sizeof(err)) == -EINVAL && strstr(err, "memory"), "no memory AS");
	CHECK(hq_parse_mtree("FlatView #0\n AS \"memory\", root: system\n"
			     "  0000000000001000-0000000000000fff (prio 0, ram): mem0\n", "mem0",
			     &g, err, sizeof(err)) == -EINVAL, "end before start: %s", err);
}

static void device_ram(void)
{
	static const char *const mem0[] = { "mem0" };
	struct hq_ramblock *b = NULL;
	struct hq_devram_loc d[4];
	char err[256] = "", *rb = sample("q35-512m-linux-ramblock.txt");
	char *mt = sample("q35-512m-linux-mtree.txt");
	int nb = hq_parse_ramblocks(rb, &b, err, sizeof(err)), n;
	/* Two VGAs, and a chain4 window over the first's video memory at 0xa0000. */
	static const char two[] =
		"FlatView #0\n AS \"memory\", root: system\n Root memory region: system\n"
		"  0000000000000000-000000000009ffff (prio 0, ram): mem0\n"
		"  00000000000a0000-00000000000affff (prio 2, ram): vga.vram @0000000000010000\n"
		"  00000000fc000000-00000000fcffffff (prio 1, ram): vga.vram\n"
		"  00000000fd000000-00000000fdffffff (prio 1, ram): vga.vram\n"
		"  00000000fe000000-00000000fe00ffff (prio 1, ram): bochs-display.vram\n";
	struct hq_ramblock tb[] = {
		{ "mem0", 4096, 0, 0x20000000, 0x20000000 },
		{ "0000:00:01.0/vga.vram", 4096, 0, 0x1000000, 0x1000000 },
		{ "0000:00:03.0/vga.vram", 4096, 0, 0x1000000, 0x1000000 },
		{ "0000:00:04.0/bochs-display.vram", 4096, 0, 0x10000, 0x10000 },
	};

	CHECK(nb == 9, "ramblocks: %d", nb);
	/* The test guest under Linux: video memory at its BAR, the ROMs not. */
	n = hq_find_device_ram(mt, b, nb, mem0, 1, d, 4, err, sizeof(err));
	CHECK(n == 1 && !strcmp(d[0].name, "0000:00:01.0/vga.vram") && d[0].length == 0x1000000 &&
	      d[0].gpa == 0xfd000000 && d[0].probe_gpa == 0xfd000000 && !d[0].probe_offset &&
	      !d[0].skip[0], "q35 Linux: %d (%s)", n, n > 0 ? d[0].name : err);
	/* Without a backend list the guest's RAM would be device RAM too: the list matters. */
	n = hq_find_device_ram(mt, b, nb, NULL, 0, d, 4, err, sizeof(err));
	CHECK(n == 2 && !strcmp(d[0].name, "mem0"), "no backends: %d", n);
	CHECK(hq_find_device_ram(mt, b, nb, mem0, 1, d, 0, err, sizeof(err)) == 0, "max 0");
	free(mt);
	/* At reset (4 GiB sample): no BAR programmed yet, so no device RAM. */
	mt = sample("q35-4g-mtree.txt");
	n = hq_find_device_ram(mt, b, nb, mem0, 1, d, 4, err, sizeof(err));
	CHECK(n == 0, "at reset: %d", n);
	free(mt);
	n = hq_find_device_ram(two, tb, 4, mem0, 1, d, 4, err, sizeof(err));
	CHECK(n == 3, "two VGAs: %d (%s)", n, err);
	if (n == 3) {
		CHECK(!strcmp(d[0].name, "0000:00:01.0/vga.vram") && strstr(d[0].skip, "00:03.0") &&
		      !strcmp(d[1].name, "0000:00:03.0/vga.vram") && strstr(d[1].skip, "00:01.0"),
		      "two VGAs: both left out (%s)", d[0].skip);
		CHECK(!strcmp(d[2].name, "0000:00:04.0/bochs-display.vram") && !d[2].skip[0] &&
		      d[2].gpa == 0xfe000000 && d[2].length == 0x10000, "bochs-display");
		/* The chain4 window comes first in GPA order: the probe; the BAR the base. */
		CHECK(d[0].probe_gpa == 0xa0000 && d[0].probe_offset == 0x10000 &&
		      d[0].gpa == 0xfc000000, "window probe, BAR base");
	}
	CHECK(hq_find_device_ram("FlatView #0\n AS \"I/O\", root: io\n", tb, 4, mem0, 1, d, 4,
				 err, sizeof(err)) == -EINVAL && strstr(err, "memory"), "no memory AS");
	free(b);
	free(rb);
}

static void gpa2hva(void)
{
	char err[256] = "", *t = sample("q35-512m-gpa2hva.txt");
	uint64_t h = 0;

	CHECK(hq_parse_gpa2hva(t, &h, err, sizeof(err)) == 0 && h == 0x7efe840ff000ull,
	      "0x%llx %s", (unsigned long long)h, err);
	free(t);
	CHECK(hq_parse_gpa2hva("Memory at address 0xfee00000 is not RAM\n", &h, err,
			       sizeof(err)) == -EINVAL && strstr(err, "not RAM"), "not RAM: %s", err);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s SAMPLE-DIR\n", argv[0]);
		return 2;
	}
	dir = argv[1];
	ramblocks();
	registers();
	mtree();
	device_ram();
	gpa2hva();
	return check_result();
}
