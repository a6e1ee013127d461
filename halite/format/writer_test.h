/* SPDX-License-Identifier: MIT */
/* Private: fault injection points of the writer, for tests. */
#ifndef HALITE_WRITER_TEST_H
#define HALITE_WRITER_TEST_H

#include <stdint.h>

#include <halite/format.h>

/*
 * "write failure": once @after more bytes have been written or submitted, a
 * write that does not fit in what is left writes nothing and fails with
 * -@err (ENOSPC, EIO, ...), as a full or failing disk would; a locality-block
 * write completes with the error, which the writer reports from the call that
 * collects it (halite_io_test_fail_writes()).
 */
void halite_writer_test_fail_writes(struct halite_writer *w, uint64_t after, int err);

/* The I/O backend the writer ended up with (HALITE_IO_BACKEND_*, never DEFAULT). */
int halite_writer_test_io_backend(const struct halite_writer *w);

/*
 * "temporary name": create the temporary file halite_writer_create() would
 * for @target, its names drawn from @seed instead of getrandom(), so a test
 * can put a file under the first name tried beforehand. Returns the
 * descriptor, with the name in *tmp (free it), or -errno.
 */
int halite_writer_test_open_temp(const char *target, uint64_t seed, char **tmp);

#endif
