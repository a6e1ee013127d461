/* SPDX-License-Identifier: MIT */
/*
 * Halite error codes.
 *
 * Every fallible Halite call returns int: >= 0 on success, a negative errno
 * (-ENOMEM, -EIO, ...) or a negative HALITE_E_* code on failure. Halite's own
 * codes live above the errno range so one halite_strerror() serves both.
 */
#ifndef HALITE_ERRORS_H
#define HALITE_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

enum halite_error {
	HALITE_E_BASE = 4000,
	HALITE_E_BAD_MAGIC = HALITE_E_BASE, /* not a Halite file */
	HALITE_E_VERSION,		/* major version this build cannot read */
	HALITE_E_INCOMPAT,		/* unknown incompatible feature flag */
	HALITE_E_RESERVED,		/* a reserved field or bit is not zero */
	HALITE_E_CHECKSUM,		/* header, footer or section checksum mismatch */
	HALITE_E_LB_CHECKSUM,		/* locality block checksum mismatch */
	HALITE_E_INCOMPLETE,		/* no valid footer: the save did not finish */
	HALITE_E_TRUNCATED,		/* file shorter than its structures say */
	HALITE_E_CORRUPT,		/* inconsistent metadata (range, overlap, count) */
	HALITE_E_CODEC,			/* stored data does not decode to a memory block */
	HALITE_E_NO_CODEC,		/* codec unknown or not built in */
	HALITE_E_UNKNOWN_SECTION,	/* required section type this build cannot read */
	HALITE_E_LIMIT,			/* beyond a limit of the format or of this build */
	HALITE_E_NOT_FOUND,		/* no such region, section or key */
	HALITE_E_STATE,			/* call not valid in the handle's current state */
	HALITE_E_UNSUPPORTED,		/* the kernel or build lacks a needed feature */
	HALITE_E_INTERNAL,		/* an internal consistency check failed (a bug) */
	HALITE_E_MAX,
};

/*
 * A static, human-readable description of @err, which may be given either
 * negated (as returned) or positive. Never returns NULL; thread-safe.
 */
const char *halite_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_ERRORS_H */
