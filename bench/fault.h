/* SPDX-License-Identifier: MIT */
/* halite-bench fault (fault.c): one fault answered from storage, against this machine's limit. */
#ifndef HALITE_BENCH_FAULT_H
#define HALITE_BENCH_FAULT_H

/*
 * argv[0] is "fault". Returns the exit code: 0 measured, 1 error, 2 usage,
 * 77 userfaultfd unavailable.
 */
int cmd_fault(int argc, char **argv);

#endif
