// SPDX-License-Identifier: MIT
/*
 * Just enough XML for S3's answers: the text of a named element, with the
 * five predefined entities and ASCII character references decoded. S3's documents are flat and their
 * elements carry no attributes we need, so a search for "<Tag>" suffices;
 * a full parser would add a dependency for nothing.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
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

	/* Character references: SeaweedFS writes ETags' quotes as &#34;. */
	if (n >= 4 && p[1] == '#') {
		const char *q = p + 2;
		bool hex = *q == 'x' || *q == 'X';
		unsigned v = 0;

		for (q += hex; q < p + n && q < p + 10 && *q != ';'; q++) {
			int d = isdigit((unsigned char)*q) ? *q - '0' :
				hex && isxdigit((unsigned char)*q) ? (tolower((unsigned char)*q) - 'a' + 10) : -1;

			if (d < 0)
				break;
			v = v * (hex ? 16 : 10) + (unsigned)d;
		}
		/* Only ASCII: S3's elements we read (codes, ids, ETags, numbers) hold nothing else. */
		if (q < p + n && *q == ';' && v > 0 && v < 0x80) {
			*c = (char)v;
			return (size_t)(q + 1 - p);
		}
	}
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
