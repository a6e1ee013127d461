// SPDX-License-Identifier: MIT
/*
 * Just enough XML for S3's answers: the text of a named element, with the
 * five predefined entities decoded. S3's documents are flat and their
 * elements carry no attributes we need, so a search for "<Tag>" suffices;
 * a full parser would add a dependency for nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "s3_internal.h"

static size_t decode_entity(const char *p, size_t n, char *c)
{
	static const struct {
		const char *name;
		char c;
	} ents[] = {
		{ "&quot;", '"' }, { "&amp;", '&' }, { "&lt;", '<' },
		{ "&gt;", '>' },   { "&apos;", '\'' },
	};

	for (size_t i = 0; i < sizeof(ents) / sizeof(ents[0]); i++) {
		size_t l = strlen(ents[i].name);

		if (n >= l && !memcmp(p, ents[i].name, l)) {
			*c = ents[i].c;
			return l;
		}
	}
	*c = '&';
	return 1;
}

int s3_xml_tag(const char *xml, size_t len, size_t *pos, const char *tag, char *out,
	       size_t outlen)
{
	char open[64], close[64];
	const char *start, *end;
	size_t o = 0;
	int lo, lc;

	lo = snprintf(open, sizeof(open), "<%s>", tag);
	lc = snprintf(close, sizeof(close), "</%s>", tag);
	if (*pos > len)
		return -ENOENT;
	start = memmem(xml + *pos, len - *pos, open, (size_t)lo);
	if (!start)
		return -ENOENT;
	start += lo;
	end = memmem(start, len - (size_t)(start - xml), close, (size_t)lc);
	if (!end)
		return -ENOENT;
	for (const char *p = start; p < end && outlen;) {
		char c = *p;

		p += c == '&' ? decode_entity(p, (size_t)(end - p), &c) : 1;
		if (o + 1 < outlen)
			out[o++] = c;
	}
	if (outlen)
		out[o] = 0;
	*pos = (size_t)(end - xml) + (size_t)lc;
	return 0;
}
