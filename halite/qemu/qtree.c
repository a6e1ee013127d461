// SPDX-License-Identifier: MIT
/*
 * QEMU's devices as "info qtree" lists them, parsed, and two such lists
 * compared (vmconfig.h): a restore's QEMU must build the devices the file's
 * state belongs to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "strbuf.h"
#include "vmconfig.h"

/* --- devices: info qtree --- */

int hq_parse_qtree(const char *text, struct hq_argv *out, char *err, size_t errlen)
{
	const char *p = text;
	char *last = NULL;
	int lastind = -1, ret = 0;

	while (*p && !ret) {
		const char *nl = strchr(p, '\n'), *q;
		size_t len = nl ? (size_t)(nl - p) : strlen(p), next = len + (nl != NULL);
		int ind = 0;

		/* HMP answers through QMP end their lines with "\r\n". */
		while (len && (p[len - 1] == '\r' || p[len - 1] == ' '))
			len--;

		for (q = p; q < p + len && *q == ' '; q++)
			ind++;
		if ((size_t)(q - p) + 5 <= len && !strncmp(q, "dev: ", 5)) {
			/* "dev: TYPE, id "ID"" */
			const char *t = q + 5, *c = memchr(t, ',', len - (size_t)(t - p));
			const char *id = c ? strstr(c, "id \"") : NULL;
			size_t idlen = 0;

			if (last)
				ret = hq_argv_push_own(out, last);
			last = NULL;
			if (!c)
				break;
			if (id && id < p + len) {
				id += 4;
				idlen = strcspn(id, "\"\n");
			}
			last = idlen ? hq_xasprintf("%.*s id=%.*s", (int)(c - t), t, (int)idlen, id) :
				       hq_xasprintf("%.*s", (int)(c - t), t);
			if (!last)
				ret = -ENOMEM;
			lastind = ind;
		} else if (last && ind == lastind + 2 && len - (size_t)(q - p) > 7 &&
			   !strncmp(q, "addr = ", 7)) {
			/* A PCI device's own property "addr = 02.0" (its children are deeper). */
			char *s = hq_xasprintf("%s addr=%.*s", last, (int)(len - (size_t)(q - p) - 7), q + 7);

			free(last);
			last = s;
			if (!s)
				ret = -ENOMEM;
		}
		p += next;
	}
	if (!ret && last)
		ret = hq_argv_push_own(out, last);
	else
		free(last);
	if (!ret && !out->argc) {
		snprintf(err, errlen, "info qtree: no device in QEMU's answer");
		ret = -EINVAL;
	}
	return ret;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int hq_devices_compare(const struct hq_argv *saved, const struct hq_argv *now, char *msg,
		       size_t len)
{
	struct hq_buf m = { 0 };
	char **a, **b;
	int shown = 0, ret = 0;
	char *s;

	if (saved->argc == now->argc) {
		int i;

		for (i = 0; i < saved->argc && !strcmp(saved->argv[i], now->argv[i]); i++)
			;
		if (i == saved->argc)
			return 0;
	}
	a = calloc((size_t)saved->argc + (size_t)now->argc + 1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	b = a + saved->argc;
	memcpy(a, saved->argv, sizeof(*a) * (size_t)saved->argc);
	memcpy(b, now->argv, sizeof(*b) * (size_t)now->argc);
	qsort(a, (size_t)saved->argc, sizeof(*a), cmp_str);
	qsort(b, (size_t)now->argc, sizeof(*b), cmp_str);
	/* What one has that the other has not: the first few, then how many more. */
	for (int i = 0, k = 0; i < saved->argc || k < now->argc;) {
		int c = i == saved->argc ? 1 : k == now->argc ? -1 : strcmp(a[i], b[k]);

		if (c && shown++ < 4)
			hq_buf_printf(&m, "%sdevice %s %s", m.len ? "; " : "", c < 0 ? a[i] : b[k],
				c < 0 ? "at save, not now" : "now, not at save");
		if (c <= 0)
			i++;
		if (c >= 0)
			k++;
	}
	if (shown > 4)
		hq_buf_printf(&m, "; %d more", shown - 4);
	if (!shown)
		hq_buf_printf(&m, "the same devices in another order");
	free(a);
	s = hq_buf_done(&m);
	if (!s)
		return -ENOMEM;
	snprintf(msg, len, "%s", s);
	free(s);
	return ret ? ret : -EINVAL;
}
