// SPDX-License-Identifier: MIT
/* What the command-line tools share (cli.h). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
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
