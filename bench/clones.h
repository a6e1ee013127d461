/* SPDX-License-Identifier: MIT */
/* halite-bench clones (clones.c): N clones of one snapshot, the service against independent restores. */
#ifndef HALITE_BENCH_CLONES_H
#define HALITE_BENCH_CLONES_H

/* argv[0] is "clones". Returns the exit code: 0 measured, 1 error, 2 usage, 77 no userfaultfd. */
int cmd_clones(int argc, char **argv);

#endif
