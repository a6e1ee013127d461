/* SPDX-License-Identifier: MIT */
/* The record of a relayouted file (relayout_meta.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "relayout_meta.h"

/* A decimal number, all of @s: true with *@v. */
static bool number(const char *s, uint64_t *v)
{
	unsigned long long n;
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	n = strtoull(s, &end, 10);
	if (*end || errno)
		return false;
	*v = n;
	return true;
}

int hlt_relayout_read(struct halite_reader *rd, struct hlt_relayout *m)
{
	const void *val;
	uint32_t len;
	char buf[256], *tok, *save = NULL;
	bool hot = false, bad = false, traces = false, bad_traces = false;

	*m = (struct hlt_relayout){ 0 };
	if (halite_reader_meta_find(rd, HLT_RELAYOUT_META, &val, &len))
		return 0;
	m->present = true;
	if (len >= sizeof(buf) || memchr(val, 0, len))
		return -EINVAL;
	memcpy(buf, val, len);
	buf[len] = 0;
	for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		if (!strncmp(tok, "hot-lbs=", 8)) {
			bad |= hot || !number(tok + 8, &m->hot_lbs) ||
			       m->hot_lbs > halite_reader_info(rd)->lb_count;
			hot = true;
		} else if (!strncmp(tok, "traces=", 7)) {
			bad_traces |= traces || !number(tok + 7, &m->traces);
			traces = true;
		}
	}
	if (bad || !hot)
		return -EINVAL;
	m->has_traces = traces && !bad_traces;
	return 0;
}
