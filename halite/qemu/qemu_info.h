/* SPDX-License-Identifier: MIT */
/*
 * Parsers of QEMU's HMP text (checked on QEMU 7.2): pure functions on text,
 * unit-tested on captured outputs (tests/qemu/samples/). Each returns a count
 * (>= 0) with a malloc'd array, or -EINVAL with a message for text it does
 * not understand.
 */
#ifndef HALITE_QEMU_INFO_H
#define HALITE_QEMU_INFO_H

#include <stddef.h>
#include <stdint.h>

/* "info ramblock": Block Name, PSize, Offset (ram_addr), Used, Total. */
struct hq_ramblock {
	char name[64];
	uint64_t page_size, offset, used, total;
};
int hq_parse_ramblocks(const char *text, struct hq_ramblock **out, char *err, size_t errlen);

/* "info registers -a": per "CPU#N", the control registers paging depends on. */
struct hq_cpu_regs {
	int cpu;
	uint64_t cr0, cr3, cr4, efer;
};
int hq_parse_registers(const char *text, struct hq_cpu_regs **out, char *err, size_t errlen);

/*
 * "info mtree -f": in the flat view of address space "memory", the ranges
 * backed by RAM region @ramname (ram, "@offset" into it), in GPA order;
 * adjacent ones with contiguous GPA and offset are merged.
 */
struct hq_gpa_range {
	uint64_t gpa, len, offset;
};
int hq_parse_mtree(const char *text, const char *ramname, struct hq_gpa_range **out, char *err,
		   size_t errlen);

/*
 * A RAM block of @used bytes as guest-physical pieces, from its flat-view
 * ranges @rg (hq_parse_mtree()): ranges with the same gpa - offset form one
 * piece, which runs from the end of the previous piece (gaps such as the VGA
 * window at 640 KiB are RAM the guest does not see there, kept with it at
 * the GPA it would have) to its last range's end; the last piece runs to the
 * block's end. So the pieces cover [0, used) in order. Returns the count
 * (at most @max), -EPROTO when offsets go back, -E2BIG past @max.
 */
struct hq_piece {
	uint64_t gpa, offset, length;
};
int hq_split_block(const struct hq_gpa_range *rg, int n, uint64_t used, struct hq_piece *out,
		   int max);

/*
 * Device RAM: the RAM blocks of @b that no memory backend holds (@backends,
 * @nbackends ids) and that the guest sees as writable RAM somewhere in the
 * flat view of "memory" (@mtree, "info mtree -f": a "ram" range named after
 * the block's memory region; block "0000:00:01.0/vga.vram" is region
 * "vga.vram"): video memory, in practice. ROMs (mapped as "rom", or not at
 * all) and memory the guest cannot reach now (a BAR switched off) are not.
 * Each found gets its base as the guest sees it (@gpa: the range that maps
 * its start, else the first range less its offset) and a probe for gpa2hva
 * (its first range's GPA and that GPA's offset in the block). Blocks whose
 * regions share a name cannot be told apart in the flat view: each is
 * returned with @skip saying so. Returns how many were written to @out (at
 * most @max), or -EINVAL with @err for text not understood.
 */
struct hq_devram_loc {
	char name[64];	     /* the block: "0000:00:01.0/vga.vram" */
	uint64_t length;     /* its used length */
	uint64_t gpa;
	uint64_t probe_gpa, probe_offset;
	char skip[160];	     /* "" or why it cannot be saved */
};
int hq_find_device_ram(const char *mtree, const struct hq_ramblock *b, int nb,
		       const char *const *backends, int nbackends, struct hq_devram_loc *out,
		       int max, char *err, size_t errlen);

/* "gpa2hva ADDR": "Host virtual address for 0x0 (mem0) is 0x7f..." -> 0 and *hva. */
int hq_parse_gpa2hva(const char *text, uint64_t *hva, char *err, size_t errlen);

#endif
