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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/format.h>

/*
 * A locality block's state in either source, each LB read once: IDLE (not
 * read), READING (one read in flight; faults on its blocks wait for it),
 * DONE (every block in), FAILED (every read failed). The template also
 * has QUEUED (on its demand queue); the single restore has CACHED (its
 * verified bytes held while its blocks are installed). Zero is IDLE: the
 * state arrays start zeroed.
 */
enum { LB_IDLE, LB_QUEUED, LB_READING, LB_CACHED, LB_DONE, LB_FAILED };

/*
 * The prefetch throttle both sources use: a background read may go at
 * @now when no fault came for @idle_us (the last at @last_fault), or when
 * the reads @issued (bytes) since @since are behind @min_rate (bytes/s).
 * Faults take the device first; the rate keeps the guest's whole memory
 * coming in even while it faults without pause.
 */
static inline bool src_prefetch_may(uint64_t now, uint64_t last_fault, uint32_t idle_us,
				    uint64_t since, uint64_t min_rate, uint64_t issued)
{
	/* @last_fault may be a little after @now, read by another thread. */
	if (now > last_fault && now - last_fault >= (uint64_t)idle_us * 1000)
		return true;
	return (double)issued < (double)(now - since) * (double)min_rate / 1e9;
}

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
