// SPDX-License-Identifier: MIT
#define _GNU_SOURCE
#include <string.h>

#include <halite/errors.h>

#include "export.h"
#include "s3.h"

static const char *const halite_errstr[HALITE_E_MAX - HALITE_E_BASE] = {
	[HALITE_E_BAD_MAGIC - HALITE_E_BASE] = "not a Halite file: bad magic",
	[HALITE_E_VERSION - HALITE_E_BASE] = "unsupported format major version",
	[HALITE_E_INCOMPAT - HALITE_E_BASE] = "unknown incompatible feature flag",
	[HALITE_E_RESERVED - HALITE_E_BASE] = "reserved field or bit is not zero",
	[HALITE_E_CHECKSUM - HALITE_E_BASE] = "checksum mismatch in header, footer or section",
	[HALITE_E_LB_CHECKSUM - HALITE_E_BASE] = "locality block checksum mismatch",
	[HALITE_E_INCOMPLETE - HALITE_E_BASE] =
		"incomplete file: no valid footer (the save did not finish)",
	[HALITE_E_TRUNCATED - HALITE_E_BASE] = "file is shorter than its structures say",
	[HALITE_E_CORRUPT - HALITE_E_BASE] =
		"inconsistent metadata (range, overlap or count)",
	[HALITE_E_CODEC - HALITE_E_BASE] =
		"compressed data does not decode to a memory block",
	[HALITE_E_NO_CODEC - HALITE_E_BASE] = "codec unknown or not built in",
	[HALITE_E_UNKNOWN_SECTION - HALITE_E_BASE] = "unknown required section type",
	[HALITE_E_LIMIT - HALITE_E_BASE] = "beyond a limit of the format or of this build",
	[HALITE_E_NOT_FOUND - HALITE_E_BASE] = "no such region, section or key",
	[HALITE_E_STATE - HALITE_E_BASE] = "call not valid in the current state",
	[HALITE_E_UNSUPPORTED - HALITE_E_BASE] =
		"not supported by the kernel, file system or this build",
	[HALITE_E_INTERNAL - HALITE_E_BASE] =
		"internal consistency check failed (a bug in Halite)",
};

/*
 * strerror() may return a buffer that the next call overwrites and
 * strerror_r() needs a caller's buffer; strerrordesc_np() (glibc >= 2.32)
 * returns the static, untranslated description, which is exactly what a
 * thread-safe "never NULL, static" contract needs.
 */
HALITE_EXPORT const char *halite_strerror(int err)
{
	unsigned int e = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;
	const char *s;

	if (e >= HALITE_E_BASE && e < HALITE_E_MAX) {
		s = halite_errstr[e - HALITE_E_BASE];
		return s ? s : "unknown Halite error";
	}
	/* A snapshot read from an S3 store fails with the S3 client's codes too. */
	if (e >= HALITE_S3_E_BASE && e < HALITE_S3_E_MAX)
		return halite_s3_strerror(err);
	if (e > 0x7fffffffu)
		return "unknown error";
	s = strerrordesc_np((int)e);
	return s ? s : "unknown error";
}
