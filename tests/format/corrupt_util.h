/* SPDX-License-Identifier: MIT */
/*
 * Test helpers for hostile-input tests: look inside a v1 file, rebuild it
 * with changed sections, and re-seal it (recompute every checksum exactly as
 * docs/format.md says, independently of format/) so that a semantic
 * corruption reaches the check meant to catch it instead of a checksum.
 *
 * Used by test_corrupt, the fuzz target and the fuzz seed generator. The
 * view and re-seal functions take hostile bytes and never read outside the
 * buffer; the model functions expect a well-formed file (writer output).
 */
#ifndef HALITE_TESTS_CORRUPT_UTIL_H
#define HALITE_TESTS_CORRUPT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"

/* ---- views: where things are, as the footer and directory say ---- */

struct cu_sec {
	uint32_t type;
	uint64_t off, len;
	uint64_t dir_pos; /* file offset of this directory entry */
};

struct cu_view {
	uint64_t size;
	uint64_t data_offset;
	uint32_t lb_size;
	uint64_t lb_count, lb_end;
	uint64_t dir_off;
	uint32_t nsec;
	struct cu_sec sec[HLT_MAX_SECTIONS];
};

/*
 * Fill @v from the header, footer and directory of @b without judging
 * checksums. 0, or -1 when the layout cannot be followed (sizes out of
 * range, a directory that does not lie after the LBs).
 */
int cu_view(const uint8_t *b, size_t len, struct cu_view *v);

/* The directory entry of @type, or NULL. */
const struct cu_sec *cu_find(const struct cu_view *v, uint32_t type);

/* Re-seal flags. */
#define CU_RESEAL_LBS 0x1u /* also recompute each LB's checksum in the lb-table */

/*
 * Recompute, in this order: LB checksums (with CU_RESEAL_LBS), every section
 * checksum in the directory, the directory checksum, the header checksum and
 * the footer checksum. Entries whose ranges fall outside the file are left
 * alone. Safe on any bytes.
 */
void cu_reseal(uint8_t *b, size_t len, unsigned flags);

/* XXH3(uuid, 0) of the header's uuid. */
uint64_t cu_file_seed(const uint8_t *b);

/* ---- model: a file as head bytes + a list of sections ---- */

struct cu_msec {
	uint32_t type;
	uint32_t reserved;  /* written into the directory entry's reserved field */
	uint8_t *data;
	size_t len;
	size_t gap;	    /* extra zero bytes before this section (after 8-alignment) */
};

struct cu_model {
	uint8_t *head;	    /* bytes 0 .. lb_end-1: header, padding, LBs */
	size_t head_len;
	uint64_t lb_count;
	uint32_t nsec;
	struct cu_msec sec[HLT_MAX_SECTIONS + 1];
};

/* Split a well-formed file into a model. 0 or -1. */
int cu_parse(const uint8_t *b, size_t len, struct cu_model *m);
void cu_model_free(struct cu_model *m);
/* Deep copy. */
void cu_model_copy(struct cu_model *dst, const struct cu_model *src);
/* The model section of @type, or NULL. */
struct cu_msec *cu_msec(struct cu_model *m, uint32_t type);
/* Replace the bytes of section @type (added at the end if absent). Copies. */
void cu_set_section(struct cu_model *m, uint32_t type, const void *data, size_t len);
/* Remove section @type if present. */
void cu_del_section(struct cu_model *m, uint32_t type);
/*
 * Lay the model out as the writer does (sections in model order, each at an
 * 8-aligned offset plus its gap, then directory and footer) and re-seal it.
 * Returns a malloc'd buffer and its length.
 */
uint8_t *cu_build(const struct cu_model *m, size_t *len);

/* ---- files ---- */

/* Read a whole file (malloc'd) or NULL. */
uint8_t *cu_read_file(const char *path, size_t *len);
/* Write a whole file; 0 or -errno. */
int cu_write_file(const char *path, const void *b, size_t len);

#endif
