/* SPDX-License-Identifier: MIT */
/*
 * Private to halite-bench: one snapshot, re-laid out (the paper's method,
 * section 8.1.1: "we use the same snapshot for all test configurations by
 * reformatting the same memory file").
 *
 * From the file a lazy save wrote, relayout() decodes every memory block
 * and writes, into a directory:
 *
 *   random.hlt    memory blocks in a random order (seeded), codec none;
 *   physical.hlt  memory blocks in guest-physical order, codec none (or,
 *                 with struct relayout_opts, in LBs of another size
 *                 compressed as the source: the remote benchmark's
 *                 physical-chunk peer);
 *   locality.hlt  the saved file's streams and order (vCPU streams,
 *                 guest-virtual walk, physical sweep, as the save wrote them),
 *                 codec none;
 *   halite.hlt    not written: the saved file itself (access locality +
 *                 guest-virtual order + compression + zero elision);
 *   raw.img       guest memory at its guest-physical offsets, sparse: a hole
 *                 for every zero or never-touched page;
 *   ws.bin        the working-set file of bench/peers.h (WS_REC records).
 *
 * All .hlt files have the source's page size, memory-block pages, locality
 * block size, regions, page-table roots, device state and metadata (a QEMU
 * save's machine), so one restore target fits them all; only the placement
 * of the blocks differs.
 *
 * Zero blocks. The paper's three organisation runs have no memory-file
 * optimisations, "such as compression and the zero page optimization"; the
 * format can store an all-zero block as data (halite_writer_put_encoded()
 * of a raw block does not look at the bytes), so random, physical and
 * locality store each zero block as 8 KiB of zeros that a restore must read,
 * like any other block. The saved file recorded zero blocks without a
 * position in any stream, so locality.hlt appends them, in physical order,
 * to the physical stream after every block the save placed. Never-touched
 * blocks have no bytes anywhere (the guest never wrote them; a hypervisor
 * knows them as unallocated) and stay never-touched in every file.
 *
 * Files are written in full and synced, so dropping their page cache
 * (POSIX_FADV_DONTNEED) really drops it.
 */
#ifndef HALITE_BENCH_RELAYOUT_H
#define HALITE_BENCH_RELAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum relayout_org {
	ORG_RANDOM,
	ORG_PHYSICAL,
	ORG_LOCALITY,
	ORG_HALITE,
	ORG_COUNT,
};

struct relayout_out {
	char *hlt_path[ORG_COUNT];	/* [ORG_HALITE] is a copy of the source path */
	char *raw_path;
	char *ws_path;
	char region[256];		/* the first region's name */
	uint64_t mem_bytes;		/* end of the highest region: raw.img's size */
	uint32_t page_size, mb_size, lb_size;
	/* Memory blocks of the source by state, and by stream for the stored ones. */
	uint64_t mb_total, mb_stored, mb_zero, mb_untouched;
	uint64_t mb_vcpu, mb_virtual, mb_physical, mb_other;
	uint64_t file_bytes[ORG_COUNT];
	uint64_t lb_count[ORG_COUNT];
	uint64_t raw_alloc_bytes;	/* raw.img's allocated bytes (st_blocks) */
	uint64_t ws_pages;		/* records in ws.bin */
	double seconds;			/* the whole relayout */
};

/*
 * Write the files above into @dir (existing, writable) from @src. @seed
 * picks the random order. On success fills @out (free its strings with
 * relayout_out_free()) and returns 0; on failure returns -errno or
 * -HALITE_E_*, with a message in @err, and removes what it wrote.
 */
int relayout(const char *src, const char *dir, uint64_t seed, struct relayout_out *out,
	     char *err, size_t errlen);

/*
 * How physical.hlt is written, for a peer other than the paper's: the
 * remote benchmark's physical-chunk peer (E2B's layout) is guest-physical
 * 4 MiB locality blocks compressed as the source, where the paper's
 * organisation is the source's LB size, uncompressed. Zero means the
 * paper's choice in each field.
 */
struct relayout_opts {
	uint32_t physical_lb_size;	/* 0: the source's; else 4 KiB .. HALITE_MAX_LB_SIZE */
	bool physical_compressed;	/* the source's codec, all-zero blocks recorded as zero */
	bool physical_only;		/* raw.img and physical.hlt only */
};

/* relayout() with @opts (NULL: relayout() itself). */
int relayout_ext(const char *src, const char *dir, uint64_t seed, const struct relayout_opts *opts,
		 struct relayout_out *out, char *err, size_t errlen);

/* Free the paths in @out (not @out itself). */
void relayout_out_free(struct relayout_out *out);

/* "random", "physical", "locality", "halite". */
const char *relayout_org_name(int org);

#endif
