/* SPDX-License-Identifier: MIT */
/* Private: the reader's I/O handle, for the engines that read the same file beside it. */
#ifndef HALITE_READER_IO_H
#define HALITE_READER_IO_H

struct halite_io;
struct halite_reader;

/*
 * The handle the reader reads its metadata with: halite_io_reopen() on it
 * opens the same file, or for an object of an S3 store the same version
 * (io.h), so an engine's own reads never mix two snapshots. Owned by the
 * reader.
 */
struct halite_io *halite_reader_io(const struct halite_reader *r);

#endif
