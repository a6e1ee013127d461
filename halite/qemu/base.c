// SPDX-License-Identifier: MIT
/* What all of halite-qemu's QEMU library shares (base.h). */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>

#include "base.h"

uint64_t hq_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

char *hq_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const unit[] = { "bytes", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	unsigned u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu bytes", (unsigned long long)b);
	else
		snprintf(buf, len, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v,
			 unit[u]);
	return buf;
}

int hq_fail(char *err, size_t len, int ret, const char *what, const char *detail)
{
	if (!err[0])
		snprintf(err, len, "%s%s%s", what, detail && *detail ? ": " : "",
			 detail ? detail : "");
	return ret;
}
