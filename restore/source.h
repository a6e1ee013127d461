/* SPDX-License-Identifier: MIT */
/*
 * Private to restore/: what both engines share about a snapshot source
 * (the single restore, restore.c and its files, and the clone service's
 * template, template.c): an LB's read with the bytes it costs counted, and
 * the message that names a failed LB.
 */
#ifndef HALITE_RESTORE_SOURCE_H
#define HALITE_RESTORE_SOURCE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/format.h>

/*
 * One read of LB @lb into @buf, verified (halite_reader_read_lb()): 0 or
 * its error. A read that came back whole, its checksum good or not, adds
 * the LB's size to *@bytes_read.
 */
int src_read_lb(struct halite_reader *rd, uint64_t lb, void *buf, _Atomic uint64_t *bytes_read);

/*
 * "locality block N at offset O: @why" into @buf (without the offset when
 * the LB table cannot say it).
 */
void src_lb_errmsg(struct halite_reader *rd, uint64_t lb, const char *why, char *buf, size_t len);

#endif
