/* SPDX-License-Identifier: MIT */
/* Private: hooks of the reader, for tests. */
#ifndef HALITE_READER_TEST_H
#define HALITE_READER_TEST_H

#include <stdint.h>

/*
 * "older reader": the incompatible-feature bits this build reads
 * (HLT_INCOMPAT_KNOWN by default). 0 makes it read as a 1.0 reader does:
 * a 1.1 file is refused with -HALITE_E_INCOMPAT.
 */
void halite_reader_test_known_incompat(uint64_t mask);

#endif
