/* SPDX-License-Identifier: MIT */
/*
 * Private: marks the public API for export. Everything is built with
 * -fvisibility=hidden, and a hidden symbol stays local in libhalite.so
 * whatever the version script says, so each definition of a function declared
 * in include/halite/ carries HALITE_EXPORT.
 */
#ifndef HALITE_EXPORT_H
#define HALITE_EXPORT_H

#define HALITE_EXPORT __attribute__((visibility("default")))

#endif
