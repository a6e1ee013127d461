/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library and by tool
 * halite-inspect (halite_format). The record `halite-inspect relayout`
 * leaves in a file it rewrote, metadata HLT_RELAYOUT_META = "traces=N
 * hot-lbs=K hot-blocks=M source-uuid=HEX": the file's first K locality
 * blocks (its hot prefix) hold what the guests of N learning traces touched
 * first. Written by relayout.c; read here once for every reader of it: the
 * restore engine and the template source (which read their hot prefix
 * first) and halite-inspect restore (which shows it).
 */
#ifndef HALITE_FORMAT_RELAYOUT_META_H
#define HALITE_FORMAT_RELAYOUT_META_H

#include <stdbool.h>
#include <stdint.h>

#include <halite/format.h>

#define HLT_RELAYOUT_META "halite.relayout"

struct hlt_relayout {
	bool present;	  /* the file has the record */
	uint64_t hot_lbs; /* K; 0 without the record */
	bool has_traces;  /* traces=N given once, a number */
	uint64_t traces;
};

/*
 * The record of @rd into @m: 0 (present false for a file without it), or
 * -EINVAL for a record that does not give hot-lbs=K exactly once, K a
 * decimal number at most the file's LB count. Keys other than hot-lbs and
 * traces are the tool's own, not read.
 */
int hlt_relayout_read(struct halite_reader *rd, struct hlt_relayout *m);

#endif
