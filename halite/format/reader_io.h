/* SPDX-License-Identifier: MIT */
/* Private: the reader's I/O handle, for the engines that read the same file beside it. */
#ifndef HALITE_READER_IO_H
#define HALITE_READER_IO_H

#include <stdint.h>

struct halite_io;
struct halite_reader;

/*
 * The handle the reader reads its metadata with: halite_io_reopen() on it
 * opens the same file, or for an object of an S3 store the same version
 * (io.h), so an engine's own reads never mix two snapshots. Owned by the
 * reader.
 */
struct halite_io *halite_reader_io(const struct halite_reader *r);

/*
 * LBs @lb .. @lb + @n - 1 (@n 1 to 64) into @bufs in one request
 * (halite_io_read_run(): one GET for an object), each verified as
 * halite_reader_read_lb() verifies one. 0, with a bit set in *@bad for each
 * that did not verify; or the request's failure, every bit set. The caller
 * reads those alone (halite_reader_read_lb(), its retries).
 */
int halite_reader_read_lb_run(struct halite_reader *r, uint64_t lb, unsigned n,
			      uint8_t *const *bufs, uint64_t *bad);

#endif
