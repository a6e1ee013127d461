/* SPDX-License-Identifier: MIT */
/* Private: fault injection points of the writer, for tests. */
#ifndef HALITE_WRITER_TEST_H
#define HALITE_WRITER_TEST_H

#include <stdint.h>

#include <halite/format.h>

/*
 * "write failure": after @after more bytes reach the file, every write fails
 * with -@err (ENOSPC, EIO, ...), as a full or failing disk would.
 */
void halite_writer_test_fail_writes(struct halite_writer *w, uint64_t after, int err);

#endif
