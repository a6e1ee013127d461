// SPDX-License-Identifier: MIT
/* Parsers of QEMU's HMP output (see qemu_info.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu_info.h"

#define MAX_ITEMS 4096

/* A growing array of @size-byte items; *n counts them. */
static void *grow(void *v, size_t *cap, size_t n, size_t size)
{
	void *p;

	if (n < *cap)
		return v;
	*cap = *cap ? 2 * *cap : 16;
	p = realloc(v, *cap * size);
	if (!p)
		free(v);
	return p;
}

static uint64_t psize(const char *num, const char *unit)
{
	uint64_t v = strtoull(num, NULL, 10);

	if (!strcmp(unit, "KiB"))
		return v << 10;
	if (!strcmp(unit, "MiB"))
		return v << 20;
	if (!strcmp(unit, "GiB"))
		return v << 30;
	return strcmp(unit, "B") ? 0 : v;
}

int hq_parse_ramblocks(const char *text, struct hq_ramblock **out, char *err, size_t errlen)
{
	struct hq_ramblock *v = NULL;
	const char *line = text;
	size_t n = 0, cap = 0;
	int header = 0;

	while (line && *line) {
		const char *end = strchr(line, '\n');
		size_t l = end ? (size_t)(end - line) : strlen(line);
		char buf[512], name[64], num[32], unit[8];
		unsigned long long off, used, total;

		if (l < sizeof(buf)) {
			memcpy(buf, line, l);
			buf[l] = '\0';
			if (strstr(buf, "Block Name") && strstr(buf, "PSize")) {
				header = 1;
			} else if (header && sscanf(buf, " %63s %31[0-9] %7s %llx %llx %llx", name, num,
						    unit, &off, &used, &total) == 6) {
				if (n == MAX_ITEMS || !(v = grow(v, &cap, n, sizeof(*v)))) {
					snprintf(err, errlen, "info ramblock: too many blocks");
					return -EINVAL;
				}
				snprintf(v[n].name, sizeof(v[n].name), "%s", name);
				v[n].page_size = psize(num, unit);
				v[n].offset = off;
				v[n].used = used;
				v[n].total = total;
				if (!v[n].page_size || used > total) {
					snprintf(err, errlen, "info ramblock: bad line '%s'", buf);
					free(v);
					return -EINVAL;
				}
				n++;
			} else if (header && buf[strspn(buf, " \t\r")]) {
				snprintf(err, errlen, "info ramblock: line not understood: '%s'", buf);
				free(v);
				return -EINVAL;
			}
		}
		line = end ? end + 1 : NULL;
	}
	if (!header) {
		snprintf(err, errlen, "info ramblock: no table header");
		free(v);
		return -EINVAL;
	}
	*out = v;
	return (int)n;
}

static int reg(const char *s, const char *name, uint64_t *val)
{
	const char *p = strstr(s, name);
	char *end;

	if (!p)
		return -1;
	*val = strtoull(p + strlen(name), &end, 16);
	return end == p + strlen(name) ? -1 : 0;
}

int hq_parse_registers(const char *text, struct hq_cpu_regs **out, char *err, size_t errlen)
{
	struct hq_cpu_regs *v = NULL;
	const char *p = text;
	size_t n = 0, cap = 0;

	while ((p = strstr(p, "CPU#"))) {
		const char *next = strstr(p + 4, "CPU#");
		size_t l = next ? (size_t)(next - p) : strlen(p);
		char *sec = strndup(p, l);
		struct hq_cpu_regs r = { .cpu = atoi(p + 4) };
		int bad;

		if (!sec) {
			free(v);
			return -ENOMEM;
		}
		/* " CR3=" not "CR3=" alone: no other register name ends in CR3. */
		bad = reg(sec, "CR0=", &r.cr0) || reg(sec, "CR3=", &r.cr3) ||
		      reg(sec, "CR4=", &r.cr4) || reg(sec, "EFER=", &r.efer);
		free(sec);
		if (bad) {
			snprintf(err, errlen, "info registers: CPU#%d without CR0, CR3, CR4 or EFER",
				 r.cpu);
			free(v);
			return -EINVAL;
		}
		if (n == MAX_ITEMS || !(v = grow(v, &cap, n, sizeof(*v)))) {
			snprintf(err, errlen, "info registers: too many CPUs");
			return -EINVAL;
		}
		v[n++] = r;
		p += 4;
	}
	if (!n) {
		snprintf(err, errlen, "info registers: no CPU#N section");
		return -EINVAL;
	}
	*out = v;
	return (int)n;
}

/* The next line of *p into buf (cut at len-1); 0 at the end. */
static int next_line(const char **p, char *buf, size_t len)
{
	const char *end;
	size_t l;

	if (!*p || !**p)
		return 0;
	end = strchr(*p, '\n');
	l = end ? (size_t)(end - *p) : strlen(*p);
	if (l >= len)
		l = len - 1;
	memcpy(buf, *p, l);
	buf[l] = '\0';
	*p = end ? end + 1 : NULL;
	return 1;
}

/* A RAM range of the flat view of "memory", with the region's name. */
struct named_range {
	char name[128];
	uint64_t gpa, len, offset;
	bool rom; /* "rom": RAM mapped read-only (PAM and the like) */
};

/*
 * Every "ram" and "rom" range of the flat view of address space "memory"
 * in "info mtree -f", e.g.
 *   0000000000000000-000000000009ffff (prio 0, ram): pc.ram KVM
 *   00000000000c0000-00000000000dffff (prio 1, rom): pc.ram @00000000000c0000 KVM
 */
static int parse_flat_ram(const char *text, struct named_range **out, char *err, size_t errlen)
{
	struct named_range *v = NULL;
	const char *p = text;
	size_t n = 0, cap = 0;
	int in_view = 0;
	char buf[512];

	while (next_line(&p, buf, sizeof(buf))) {
		unsigned long long s, e, off = 0;
		char kind[16], name[128];
		const char *at;
		int prio;

		if (!strncmp(buf, "FlatView #", 10)) {
			if (in_view)
				break; /* the "memory" view is done */
			continue;
		}
		if (strstr(buf, " AS \"memory\"") == buf) {
			in_view = 1;
			continue;
		}
		if (!in_view ||
		    sscanf(buf, " %llx-%llx (prio %d, %15[^)]): %127s", &s, &e, &prio, kind,
			   name) != 5 || (strcmp(kind, "ram") && strcmp(kind, "rom")))
			continue;
		at = strstr(buf, "): ");
		at = at ? strstr(at, " @") : NULL;
		if ((at && sscanf(at, " @%llx", &off) != 1) || e < s) {
			snprintf(err, errlen, "info mtree: range not understood: '%s'", buf);
			free(v);
			return -EINVAL;
		}
		if (n == MAX_ITEMS || !(v = grow(v, &cap, n, sizeof(*v)))) {
			snprintf(err, errlen, "info mtree: too many ranges");
			return -EINVAL;
		}
		snprintf(v[n].name, sizeof(v[n].name), "%s", name);
		v[n].gpa = s;
		v[n].len = e - s + 1;
		v[n].offset = off;
		v[n].rom = !strcmp(kind, "rom");
		n++;
	}
	if (!in_view) {
		snprintf(err, errlen, "info mtree -f: no flat view of address space \"memory\"");
		free(v);
		return -EINVAL;
	}
	*out = v;
	return (int)n;
}

/*
 * A flat view starts with "FlatView #N", lists the address spaces using it
 * (' AS "memory", root: system'), then its ranges:
 * "  0000000000100000-000000007fffffff (prio 0, ram): mem0 @0000000000100000"
 * (no "@" means offset 0; a trailing " KVM" or the like may follow).
 */
int hq_parse_mtree(const char *text, const char *ramname, struct hq_gpa_range **out, char *err,
		   size_t errlen)
{
	struct named_range *rg = NULL;
	struct hq_gpa_range *v = NULL;
	size_t n = 0, cap = 0;
	int nr = parse_flat_ram(text, &rg, err, errlen);

	if (nr < 0)
		return nr;
	/* PAM and the like map parts of RAM read-only: "rom", same block. */
	for (int i = 0; i < nr; i++) {
		const struct named_range *r = &rg[i];

		if (strcmp(r->name, ramname))
			continue;
		if (n && v[n - 1].gpa + v[n - 1].len == r->gpa &&
		    v[n - 1].offset + v[n - 1].len == r->offset) {
			v[n - 1].len += r->len;
			continue;
		}
		if (n == MAX_ITEMS || !(v = grow(v, &cap, n, sizeof(*v)))) {
			snprintf(err, errlen, "info mtree: too many ranges");
			free(rg);
			return -EINVAL;
		}
		v[n++] = (struct hq_gpa_range){ .gpa = r->gpa, .len = r->len, .offset = r->offset };
	}
	free(rg);
	*out = v;
	return (int)n;
}

int hq_split_block(const struct hq_gpa_range *rg, int n, uint64_t used, struct hq_piece *out,
		   int max)
{
	uint64_t start = 0;
	int k = 0;

	for (int i = 0; i < n; i++) {
		uint64_t delta = rg[i].gpa - rg[i].offset, end;
		int j = i;

		while (j + 1 < n && rg[j + 1].gpa - rg[j + 1].offset == delta &&
		       rg[j + 1].offset >= rg[j].offset + rg[j].len)
			j++;
		if (rg[i].offset < start || rg[j].offset + rg[j].len > used)
			return -EPROTO;
		if (k == max)
			return -E2BIG;
		end = j + 1 < n ? rg[j].offset + rg[j].len : used;
		out[k++] = (struct hq_piece){ start + delta, start, end - start };
		start = end;
		i = j;
	}
	return k;
}

/* Block @block is memory region @region: "DEVICE-PATH/REGION", or "REGION" alone. */
static int block_is_region(const char *block, const char *region)
{
	size_t b = strlen(block), r = strlen(region);

	return b == r ? !strcmp(block, region) :
	       b > r && block[b - r - 1] == '/' && !strcmp(block + b - r, region);
}

int hq_find_device_ram(const char *mtree, const struct hq_ramblock *b, int nb,
		       const char *const *backends, int nbackends, struct hq_devram_loc *out,
		       int max, char *err, size_t errlen)
{
	struct named_range *rg = NULL;
	int n = parse_flat_ram(mtree, &rg, err, errlen), k = 0;

	if (n < 0)
		return n;
	for (int i = 0; i < nb && k < max; i++) {
		struct hq_devram_loc *d = &out[k];
		const struct named_range *first = NULL, *base = NULL;
		const char *other = NULL;
		int j, x;

		for (j = 0; j < nbackends && strcmp(b[i].name, backends[j]); j++)
			;
		if (j < nbackends)
			continue; /* guest RAM */
		for (j = 0; j < n; j++) {
			/* Writable RAM only: a ROM the guest cannot change is rebuilt by QEMU. */
			if (rg[j].rom || !block_is_region(b[i].name, rg[j].name))
				continue;
			/* Another block of this region's name: the ranges are whose? */
			for (x = 0; x < nb && !other; x++)
				if (x != i && block_is_region(b[x].name, rg[j].name))
					other = b[x].name;
			if (!first)
				first = &rg[j];
			if (!base && !rg[j].offset)
				base = &rg[j];
		}
		if (!first)
			continue; /* not writable RAM the guest sees: a ROM, or switched off */
		memset(d, 0, sizeof(*d));
		snprintf(d->name, sizeof(d->name), "%s", b[i].name);
		d->length = b[i].used;
		d->gpa = base ? base->gpa : first->gpa >= first->offset ? first->gpa - first->offset :
			 first->gpa;
		d->probe_gpa = first->gpa;
		d->probe_offset = first->offset;
		if (other)
			snprintf(d->skip, sizeof(d->skip), "its memory region has the name of "
				 "%.63s's: the guest-physical map cannot tell them apart", other);
		else if (first->offset >= b[i].used)
			snprintf(d->skip, sizeof(d->skip), "mapped at offset 0x%llx, past its end",
				 (unsigned long long)first->offset);
		k++;
	}
	free(rg);
	return k;
}

int hq_parse_gpa2hva(const char *text, uint64_t *hva, char *err, size_t errlen)
{
	const char *p = strstr(text, " is 0x");
	unsigned long long v;

	if (!strstr(text, "Host virtual address") || !p || sscanf(p, " is 0x%llx", &v) != 1) {
		snprintf(err, errlen, "gpa2hva: '%.*s'", (int)strcspn(text, "\n"), text);
		return -EINVAL;
	}
	*hva = v;
	return 0;
}
