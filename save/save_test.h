/* SPDX-License-Identifier: MIT */
/* Private: fault injection points of the save engine, for tests. */
#ifndef HALITE_SAVE_TEST_H
#define HALITE_SAVE_TEST_H

#include <stdint.h>

#include <halite/save.h>

/* "write failure": see halite_writer_test_fail_writes(). Before arm. */
void halite_save_test_fail_writes(struct halite_save *s, uint64_t after, int err);

/*
 * "a bug caught": internal check number @after + 1 (counting from the
 * first, as the engine makes them) fails, as if an invariant were broken.
 * Before arm.
 */
void halite_save_test_fail_check(struct halite_save *s, uint64_t after);

/*
 * "a file that cannot refuse hole punches": shared regions' files are left
 * as they are at arm, so the save must detect a punched hole instead of
 * preventing it (save.c, guard_discards()). Before arm.
 */
void halite_save_test_no_discard_refusal(struct halite_save *s);

#endif
