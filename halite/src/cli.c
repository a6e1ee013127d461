// SPDX-License-Identifier: MIT
/* What the command-line tools share (cli.h). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"

int halite_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case '\0':
		break;
	case 'K':
		shift = 10;
		break;
	case 'M':
		shift = 20;
		break;
	case 'G':
		shift = 30;
		break;
	default:
		return -EINVAL;
	}
	if (shift) {
		end++;
		if (strcasecmp(end, "") && strcasecmp(end, "B") && strcasecmp(end, "iB"))
			return -EINVAL;
		if (v > (UINT64_MAX >> shift))
			return -ERANGE;
	}
	*out = (uint64_t)v << shift;
	return 0;
}

void halite_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

void halite_shell_quote(FILE *f, const char *s)
{
	const char *p;

	for (p = s; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("%+,-./:=@_^", *p))
			break;
	if (*s && !*p) {
		fputs(s, f);
		return;
	}
	/* Single quotes keep everything but themselves: ' becomes '\''. */
	fputc('\'', f);
	for (p = s; *p; p++)
		fputs(*p == '\'' ? "'\\''" : (char[2]){ *p, 0 }, f);
	fputc('\'', f);
}
