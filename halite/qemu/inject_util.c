// SPDX-License-Identifier: MIT
/* The ptrace injection's small helpers (inject_int.h): messages and ptrace(2) itself. */
#define _GNU_SOURCE
#include "inject_int.h"

void inj_seterr(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

/* "ESRCH (No such process)" */
const char *inj_estr(int e, char *buf, size_t len)
{
	const char *name = strerrorname_np(e);
	char text[128];

	snprintf(buf, len, "%s (%s)", name ? name : "errno", strerror_r(e, text, sizeof(text)));
	return buf;
}

long inj_ptrace(int req, pid_t tid, uintptr_t addr, uintptr_t data)
{
	return ptrace((enum __ptrace_request)req, tid, (void *)addr, (void *)data);
}
