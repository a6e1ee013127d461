/* SPDX-License-Identifier: MIT */
/* Halite: lazy-save, lazy-restore VM memory snapshots. The whole public API. */
#ifndef HALITE_HALITE_H
#define HALITE_HALITE_H

#include <halite/codec.h>
#include <halite/errors.h>
#include <halite/format.h>
#include <halite/log.h>
#include <halite/memory.h>
#include <halite/restore.h>
#include <halite/save.h>
#include <halite/template.h>

#define HALITE_VERSION_MAJOR 0
#define HALITE_VERSION_MINOR 1
#define HALITE_VERSION_PATCH 0

#endif
