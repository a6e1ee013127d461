// SPDX-License-Identifier: MIT
/* A growing string (strbuf.h). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"

void hq_buf_put(struct hq_buf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->s, cap);

		if (!p) {
			b->oom = true;
			return;
		}
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

void hq_buf_puts(struct hq_buf *b, const char *s)
{
	hq_buf_put(b, s, strlen(s));
}

void hq_buf_printf(struct hq_buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		hq_buf_put(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* @b's string, or NULL if it ran out of memory; @b is left empty. */
char *hq_buf_done(struct hq_buf *b)
{
	char *s = b->oom ? NULL : b->s ? b->s : strdup("");

	if (b->oom)
		free(b->s);
	*b = (struct hq_buf){ 0 };
	return s;
}

char *hq_xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}
