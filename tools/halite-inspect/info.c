// SPDX-License-Identifier: MIT
/* halite-inspect info: everything about a file except its block contents. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "inspect.h"

void help_info(FILE *f)
{
	fprintf(f, "Usage: " PROG " info [--json] FILE\n\n"
		   "Show the header, the regions, memory-block states (stored, zero, never\n"
		   "touched) and compression, locality-block fill, streams, sections,\n"
		   "metadata, save statistics and vCPU page-table roots of a Halite\n"
		   "snapshot FILE.\n\n"
		   "  --json        one JSON object on stdout instead of tables (the\n"
		   "                never-touched count is mbs.untouched)\n"
		   "  -h, --help    this text\n"
		   "  --version     the program's and the file format's version\n\n"
		   "Exit status: 0 ok, 1 FILE is not a valid snapshot or does not open,\n"
		   "2 usage.\n");
	help_store(f);
}

struct stream_stat {
	uint32_t id;
	uint64_t lbs, mbs, bytes;
};

/* Sorted by id: files have a few streams (one per vCPU) but millions of LBs. */
struct streams {
	struct stream_stat *v;
	size_t n, cap;
};

static struct stream_stat *stream_get(struct streams *s, uint32_t id)
{
	return id_row(&s->v, &s->n, &s->cap, sizeof(*s->v), id, true);
}

struct totals {
	uint64_t raw_stored;	/* decoded size of the stored MBs */
	uint64_t used_sum;
	uint32_t used_min, used_max;
	struct streams streams;
};

static int gather(struct halite_reader *r, const struct halite_file_info *fi, struct totals *t)
{
	struct halite_mb_loc loc;
	struct halite_lb_info lb;
	int ret;

	memset(t, 0, sizeof(*t));
	t->used_min = fi->lb_count ? UINT32_MAX : 0;
	for (uint64_t m = 0; m < fi->mb_count; m++) {
		ret = halite_reader_mb_lookup(r, m, &loc);
		if (ret < 0)
			return ret;
		if (loc.state == HALITE_MB_STORED)
			t->raw_stored += halite_reader_mb_bytes(r, m);
	}
	for (uint64_t i = 0; i < fi->lb_count; i++) {
		struct stream_stat *s;

		ret = halite_reader_lb_info(r, i, &lb);
		if (ret < 0)
			return ret;
		t->used_sum += lb.used;
		if (lb.used < t->used_min)
			t->used_min = lb.used;
		if (lb.used > t->used_max)
			t->used_max = lb.used;
		s = stream_get(&t->streams, lb.stream);
		if (!s)
			return -ENOMEM;
		s->lbs++;
		s->mbs += lb.mb_count;
		s->bytes += lb.used;
	}
	return 0;
}

static void fmt_uuid(const uint8_t *u, char *buf)
{
	for (int i = 0; i < 16; i++)
		sprintf(buf + 2 * i, "%02x", u[i]);
}

static void fmt_time(uint64_t ns, char *buf, size_t len)
{
	time_t sec = (time_t)(ns / 1000000000u);
	struct tm tm;

	if (!gmtime_r(&sec, &tm)) {
		snprintf(buf, len, "@%" PRIu64, ns);
		return;
	}
	snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%09uZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (unsigned)(ns % 1000000000u));
}

/* Valid UTF-8 without control characters: safe to print and to put in JSON as is. */
static bool printable(const uint8_t *p, uint32_t len)
{
	for (uint32_t i = 0; i < len;) {
		uint8_t c = p[i];
		uint32_t n;

		if (c < 0x20 || c == 0x7f)
			return false;
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 1;
		else if (c >= 0xe0 && c <= 0xef)
			n = 2;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 3;
		else
			return false;
		if (len - i <= n)
			return false;
		for (uint32_t k = 1; k <= n; k++)
			if ((p[i + k] & 0xc0) != 0x80)
				return false;
		i += n + 1;
	}
	return true;
}

/*
 * A list: strings each ended by a NUL (halite-qemu's qemu.cmdline, an argv
 * as in /proc/PID/cmdline, and qemu.devices), every one printable. How
 * many, or 0 if @p is no such list.
 */
static uint32_t nul_list(const uint8_t *p, uint32_t len)
{
	uint32_t n = 0;

	if (!len || p[len - 1] != '\0')
		return 0;
	for (uint32_t i = 0; i < len; n++) {
		uint32_t l = (uint32_t)strlen((const char *)p + i);

		if (!printable(p + i, l))
			return 0;
		i += l + 1;
	}
	return n;
}

/* A metadata entry, and how it reads. */
struct meta {
	const char *key;
	const void *val;
	uint32_t len;
};
enum meta_kind { META_NONE, META_LIST, META_TEXT, META_HEX };

/* Entry @i into @m: a list (nul_list), printable text, or bytes; META_NONE if unreadable. */
static enum meta_kind meta_at(struct halite_reader *r, uint32_t i, struct meta *m)
{
	if (halite_reader_meta(r, i, &m->key, &m->val, &m->len) < 0)
		return META_NONE;
	if (nul_list(m->val, m->len))
		return META_LIST;
	return printable(m->val, m->len) ? META_TEXT : META_HEX;
}

/*
 * A list as a shell would take it: each item quoted where needed, a new
 * line (after " \\") before an option (an item starting with '-') and
 * before an item that would pass 100 columns, so a command line shows one
 * option and its argument a line, and can be pasted into a shell.
 */
static void print_list(const char *p, uint32_t len, size_t col)
{
	for (uint32_t i = 0; i < len; i += (uint32_t)strlen(p + i) + 1) {
		size_t w = strlen(p + i) + 1;

		if (i && (p[i] == '-' || col + w > 100)) {
			printf(" \\\n      ");
			col = 6;
		} else if (i) {
			putchar(' ');
			col++;
		}
		halite_shell_quote(stdout, p + i);
		col += w;
	}
	putchar('\n');
}

/*
 * A printable value: as it is, or, if it is a JSON array or object
 * (halite-qemu's qemu.disks), laid out one member a line.
 */
static void print_text(const char *key, const char *val, uint32_t len)
{
	cJSON *j = len && (val[0] == '[' || val[0] == '{') ?
		   cJSON_ParseWithLength(val, len) : NULL;
	char *s = j ? cJSON_Print(j) : NULL;

	if (!s) {
		printf("  %s = %.*s\n", key, (int)len, val);
	} else {
		printf("  %s =\n    ", key);
		for (const char *c = s; *c; c++) {
			if (*c == '\t')
				fputs(c > s && c[-1] == ':' ? " " : "  ", stdout);
			else
				putchar(*c);
			if (*c == '\n')
				fputs("    ", stdout);
		}
		putchar('\n');
	}
	free(s);
	cJSON_Delete(j);
}

static char *hex_string(const uint8_t *p, uint32_t len)
{
	char *s = malloc(2 * (size_t)len + 1);

	if (!s)
		return NULL;
	for (uint32_t i = 0; i < len; i++)
		sprintf(s + 2 * i, "%02x", p[i]);
	s[2 * (size_t)len] = '\0';
	return s;
}

static const char *section_name(uint32_t type, char *buf, size_t len)
{
	const char *n = halite_section_name(type);

	if (n)
		return n;
	snprintf(buf, len, "unknown%s", type & HALITE_SECTION_OPTIONAL ? "-optional" : "");
	return buf;
}

static const char *codec_name(int codec)
{
	const char *n = halite_codec_name(codec);

	return n ? n : "unknown";
}

static double file_ratio(const struct halite_file_info *fi)
{
	return fi->memory_bytes ? (double)fi->file_size / (double)fi->memory_bytes : 0;
}

static cJSON *info_json(struct halite_reader *r, const char *path,
			const struct halite_file_info *fi, const struct totals *t)
{
	cJSON *root = cJSON_CreateObject(), *a, *o;
	char buf[64];
	uint32_t vcpus, nroots;
	const struct halite_root *roots;
	const void *dev;
	uint64_t devlen;

	cJSON_AddStringToObject(root, "file", path);
	snprintf(buf, sizeof(buf), "%u.%u", fi->version_major, fi->version_minor);
	cJSON_AddStringToObject(root, "version", buf);
	fmt_uuid(fi->uuid, buf);
	cJSON_AddStringToObject(root, "uuid", buf);
	fmt_time(fi->created_ns, buf, sizeof(buf));
	cJSON_AddStringToObject(root, "created", buf);
	json_add_u64(root, "created_ns", fi->created_ns);
	json_add_hex(root, "incompat_flags", fi->incompat_flags);
	json_add_hex(root, "compat_flags", fi->compat_flags);
	cJSON_AddStringToObject(root, "codec", codec_name(fi->codec));
	cJSON_AddNumberToObject(root, "codec_level", fi->codec_level);
	json_add_u64(root, "page_size", fi->page_size);
	json_add_u64(root, "mb_pages", fi->mb_pages);
	json_add_u64(root, "mb_size", fi->mb_size);
	json_add_u64(root, "lb_size", fi->lb_size);
	json_add_u64(root, "data_offset", fi->data_offset);
	json_add_u64(root, "file_size", fi->file_size);
	json_add_u64(root, "memory_bytes", fi->memory_bytes);

	a = cJSON_AddArrayToObject(root, "regions");
	for (uint32_t i = 0; i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(r, i);

		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", ri->name);
		json_add_u64(o, "gpa", ri->gpa);
		json_add_u64(o, "length", ri->length);
		json_add_u64(o, "first_mb", ri->first_mb);
		json_add_u64(o, "mb_count", ri->mb_count);
		cJSON_AddItemToArray(a, o);
	}

	o = cJSON_AddObjectToObject(root, "mbs");
	json_add_u64(o, "count", fi->mb_count);
	json_add_u64(o, "stored", fi->mb_stored);
	json_add_u64(o, "zero", fi->mb_zero);
	json_add_u64(o, "untouched", fi->mb_untouched);
	json_add_u64(o, "compressed", fi->mb_compressed);
	json_add_pct(o, "stored_pct", fi->mb_stored, fi->mb_count);
	json_add_pct(o, "zero_pct", fi->mb_zero, fi->mb_count);
	json_add_pct(o, "untouched_pct", fi->mb_untouched, fi->mb_count);
	json_add_u64(o, "raw_bytes", t->raw_stored);
	json_add_u64(o, "stored_bytes", fi->stored_bytes);
	if (fi->stored_bytes)
		cJSON_AddNumberToObject(o, "compression_ratio",
					(double)t->raw_stored / (double)fi->stored_bytes);
	else
		cJSON_AddNullToObject(o, "compression_ratio");
	if (fi->memory_bytes)
		cJSON_AddNumberToObject(root, "file_memory_ratio", file_ratio(fi));
	else
		cJSON_AddNullToObject(root, "file_memory_ratio");

	o = cJSON_AddObjectToObject(root, "lbs");
	json_add_u64(o, "count", fi->lb_count);
	/* No locality block: no fill to speak of (null, not 0). */
	json_add_pct(o, "fill_mean_pct", t->used_sum, fi->lb_count * fi->lb_size);
	json_add_pct(o, "fill_min_pct", t->used_min, fi->lb_count ? fi->lb_size : 0);
	json_add_pct(o, "fill_max_pct", t->used_max, fi->lb_count ? fi->lb_size : 0);

	a = cJSON_AddArrayToObject(root, "streams");
	for (size_t i = 0; i < t->streams.n; i++) {
		const struct stream_stat *s = &t->streams.v[i];

		o = cJSON_CreateObject();
		json_add_u64(o, "id", s->id);
		cJSON_AddStringToObject(o, "name", halite_stream_name(s->id, buf, sizeof(buf)));
		json_add_u64(o, "lbs", s->lbs);
		json_add_u64(o, "mbs", s->mbs);
		json_add_u64(o, "bytes", s->bytes);
		cJSON_AddItemToArray(a, o);
	}

	a = cJSON_AddArrayToObject(root, "sections");
	for (uint32_t i = 0; i < halite_reader_section_count(r); i++) {
		uint32_t type;
		uint64_t off, len;

		if (halite_reader_section(r, i, &type, &off, &len) < 0)
			continue;
		o = cJSON_CreateObject();
		json_add_hex(o, "type", type);
		cJSON_AddStringToObject(o, "name", section_name(type, buf, sizeof(buf)));
		json_add_u64(o, "offset", off);
		json_add_u64(o, "length", len);
		cJSON_AddItemToArray(a, o);
	}

	o = cJSON_AddObjectToObject(root, "metadata");
	for (uint32_t i = 0; i < halite_reader_meta_count(r); i++) {
		struct meta m;
		const char *val;
		enum meta_kind kind = meta_at(r, i, &m);

		val = m.val;
		if (kind == META_LIST) {
			cJSON *l = cJSON_AddArrayToObject(o, m.key);

			for (uint32_t k = 0; k < m.len; k += (uint32_t)strlen(val + k) + 1)
				cJSON_AddItemToArray(l, cJSON_CreateString(val + k));
		} else if (kind == META_TEXT) {
			char *s = strndup(val, m.len);

			cJSON_AddStringToObject(o, m.key, s ? s : "");
			free(s);
		} else if (kind == META_HEX) {
			char *h = hex_string(m.val, m.len);
			cJSON *hx = cJSON_AddObjectToObject(o, m.key);

			cJSON_AddStringToObject(hx, "hex", h ? h : "");
			free(h);
		}
	}

	o = cJSON_AddObjectToObject(root, "save_stats");
	for (uint32_t i = 0; i < halite_reader_stat_count(r); i++) {
		const char *key;
		uint64_t v;

		if (halite_reader_stat(r, i, &key, &v) == 0)
			json_add_u64(o, key, v);
	}

	if (halite_reader_vcpus(r, &vcpus, &roots, &nroots) == 0) {
		o = cJSON_AddObjectToObject(root, "vcpus");
		json_add_u64(o, "count", vcpus);
		a = cJSON_AddArrayToObject(o, "roots");
		for (uint32_t i = 0; i < nroots; i++) {
			cJSON *e = cJSON_CreateObject();

			if (roots[i].vcpu == HALITE_VCPU_UNKNOWN)
				cJSON_AddNullToObject(e, "vcpu");
			else
				json_add_u64(e, "vcpu", roots[i].vcpu);
			json_add_u64(e, "mode", roots[i].mode);
			json_add_hex(e, "cr3", roots[i].cr3);
			cJSON_AddItemToArray(a, e);
		}
	}
	if (halite_reader_device_state(r, &dev, &devlen) == 0)
		json_add_u64(root, "device_state_bytes", devlen);
	return root;
}

#define KV "%-20s"

static void info_text(struct halite_reader *r, const char *path,
		      const struct halite_file_info *fi, const struct totals *t)
{
	char buf[64], b1[32], b2[32];
	uint32_t vcpus, nroots;
	const struct halite_root *roots;
	const void *dev;
	uint64_t devlen;
	struct table *tb;

	printf(KV "%s\n", "File:", path);
	printf(KV "%u.%u\n", "Format version:", fi->version_major, fi->version_minor);
	fmt_uuid(fi->uuid, buf);
	printf(KV "%s\n", "UUID:", buf);
	fmt_time(fi->created_ns, buf, sizeof(buf));
	printf(KV "%s\n", "Created:", buf);
	if (fi->incompat_flags || fi->compat_flags)
		printf(KV "incompat 0x%" PRIx64 ", compat 0x%" PRIx64 "\n", "Feature flags:",
		       fi->incompat_flags, fi->compat_flags);
	printf(KV "%s, level %d\n", "Codec:", codec_name(fi->codec), fi->codec_level);
	printf(KV "%u\n", "Page size:", fi->page_size);
	printf(KV "%u pages, %u bytes\n", "Memory block:", fi->mb_pages, fi->mb_size);
	printf(KV "%u bytes\n", "Locality block:", fi->lb_size);
	printf(KV "%" PRIu64 "\n", "Data offset:", fi->data_offset);
	printf(KV "%" PRIu64 " (%s)\n", "File size:", fi->file_size,
	       human_bytes(fi->file_size, b1, sizeof(b1)));
	printf(KV "%" PRIu64 " (%s)\n", "Memory:", fi->memory_bytes,
	       human_bytes(fi->memory_bytes, b1, sizeof(b1)));

	printf("\nRegions:\n");
	{
		static const char *const h[] = { "NAME",     "GPA", "LENGTH", "SIZE",
						 "FIRST_MB", "MBS" };

		tb = table_new(6, h, "lrrrrr");
		for (uint32_t i = 0; i < fi->region_count; i++) {
			const struct halite_region_info *ri = halite_reader_region(r, i);
			char g[24], l[24], f[24], n[24];

			snprintf(g, sizeof(g), "0x%" PRIx64, ri->gpa);
			snprintf(l, sizeof(l), "%" PRIu64, ri->length);
			snprintf(f, sizeof(f), "%" PRIu64, ri->first_mb);
			snprintf(n, sizeof(n), "%" PRIu64, ri->mb_count);
			human_bytes(ri->length, b1, sizeof(b1));
			table_row(tb, ri->name, g, l, b1, f, n);
		}
		table_print(tb);
		table_free(tb);
	}

	printf("\nMemory blocks:      %" PRIu64 "\n", fi->mb_count);
	printf("  stored         %12" PRIu64 "  %5.1f%%  (compressed %" PRIu64
	       ", %.1f%% of stored)\n",
	       fi->mb_stored, pct(fi->mb_stored, fi->mb_count), fi->mb_compressed,
	       pct(fi->mb_compressed, fi->mb_stored));
	printf("  zero           %12" PRIu64 "  %5.1f%%\n", fi->mb_zero,
	       pct(fi->mb_zero, fi->mb_count));
	printf("  never touched  %12" PRIu64 "  %5.1f%%\n", fi->mb_untouched,
	       pct(fi->mb_untouched, fi->mb_count));
	if (fi->stored_bytes)
		printf(KV "%.3f (%s raw in %s stored)\n", "Compression ratio:",
		       (double)t->raw_stored / (double)fi->stored_bytes,
		       human_bytes(t->raw_stored, b1, sizeof(b1)),
		       human_bytes(fi->stored_bytes, b2, sizeof(b2)));
	else
		printf(KV "n/a (nothing stored)\n", "Compression ratio:");
	printf(KV "%.3f (file %s for %s of memory)\n", "File/memory ratio:", file_ratio(fi),
	       human_bytes(fi->file_size, b1, sizeof(b1)),
	       human_bytes(fi->memory_bytes, b2, sizeof(b2)));
	printf(KV "%" PRIu64, "Locality blocks:", fi->lb_count);
	if (fi->lb_count)
		printf(", fill mean %.1f%%, min %.1f%%, max %.1f%%",
		       pct(t->used_sum, fi->lb_count * fi->lb_size), pct(t->used_min, fi->lb_size),
		       pct(t->used_max, fi->lb_size));
	putchar('\n');

	printf("\nStreams:\n");
	{
		static const char *const h[] = { "STREAM", "ID", "LBS", "MBS", "BYTES" };

		tb = table_new(5, h, "lrrrr");
		for (size_t i = 0; i < t->streams.n; i++) {
			const struct stream_stat *s = &t->streams.v[i];
			char id[16], l[24], m[24], by[24];

			snprintf(id, sizeof(id), "0x%08x", s->id);
			snprintf(l, sizeof(l), "%" PRIu64, s->lbs);
			snprintf(m, sizeof(m), "%" PRIu64, s->mbs);
			snprintf(by, sizeof(by), "%" PRIu64, s->bytes);
			table_row(tb, halite_stream_name(s->id, buf, sizeof(buf)), id, l, m, by);
		}
		table_print(tb);
		table_free(tb);
	}

	printf("\nSections:\n");
	{
		static const char *const h[] = { "TYPE", "NAME", "OFFSET", "LENGTH" };

		tb = table_new(4, h, "llrr");
		for (uint32_t i = 0; i < halite_reader_section_count(r); i++) {
			uint32_t type;
			uint64_t off, len;
			char ty[16], o[24], l[24];

			if (halite_reader_section(r, i, &type, &off, &len) < 0)
				continue;
			snprintf(ty, sizeof(ty), "0x%08x", type);
			snprintf(o, sizeof(o), "%" PRIu64, off);
			snprintf(l, sizeof(l), "%" PRIu64, len);
			table_row(tb, ty, section_name(type, buf, sizeof(buf)), o, l);
		}
		table_print(tb);
		table_free(tb);
	}

	if (halite_reader_meta_count(r)) {
		printf("\nMetadata:\n");
		for (uint32_t i = 0; i < halite_reader_meta_count(r); i++) {
			struct meta m;
			enum meta_kind kind = meta_at(r, i, &m);

			if (kind == META_LIST) {
				printf("  %s = ", m.key);
				print_list(m.val, m.len, strlen(m.key) + 5);
			} else if (kind == META_TEXT) {
				print_text(m.key, m.val, m.len);
			} else if (kind == META_HEX) {
				char *h = hex_string(m.val, m.len);

				printf("  %s = hex:%s\n", m.key, h ? h : "?");
				free(h);
			}
		}
	}
	if (halite_reader_stat_count(r)) {
		printf("\nSave statistics:\n");
		for (uint32_t i = 0; i < halite_reader_stat_count(r); i++) {
			const char *key;
			uint64_t v;

			if (halite_reader_stat(r, i, &key, &v) == 0)
				printf("  %s = %" PRIu64 "\n", key, v);
		}
	}
	if (halite_reader_vcpus(r, &vcpus, &roots, &nroots) == 0) {
		static const char *const h[] = { "VCPU", "MODE", "CR3" };

		printf("\nvCPUs: %u, page-table roots: %u\n", vcpus, nroots);
		tb = table_new(3, h, "rrr");
		for (uint32_t i = 0; i < nroots; i++) {
			char v[16], m[24], c[24];

			if (roots[i].vcpu == HALITE_VCPU_UNKNOWN)
				snprintf(v, sizeof(v), "?");
			else
				snprintf(v, sizeof(v), "%u", roots[i].vcpu);
			snprintf(m, sizeof(m), "%u-level", roots[i].mode);
			snprintf(c, sizeof(c), "0x%016" PRIx64, roots[i].cr3);
			table_row(tb, v, m, c);
		}
		if (nroots)
			table_print(tb);
		table_free(tb);
	}
	if (halite_reader_device_state(r, &dev, &devlen) == 0)
		printf("\nDevice state:       %" PRIu64 " bytes\n", devlen);
}

/* What a success prints at the top level: a failure prints them too, null. */
static const char *const info_keys[] = {
	"file", "version", "uuid", "created", "created_ns", "incompat_flags", "compat_flags",
	"codec", "codec_level", "page_size", "mb_pages", "mb_size", "lb_size", "data_offset",
	"file_size", "memory_bytes", "regions", "mbs", "file_memory_ratio", "lbs", "streams",
	"sections", "metadata", "save_stats", NULL,
};

int cmd_info(int argc, char **argv)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ NULL, 0, NULL, 0 },
	};
	const struct halite_file_info *fi;
	struct halite_reader *r = NULL;
	struct totals t;
	bool json = false;
	int c, ret;

	run_keys(info_keys);
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			run_set_json();
			break;
		default:
			return common_option(c, argv, help_info);
		}
	}
	json = run_json();
	if (argc - optind != 1)
		return usage_hint("expected exactly one FILE");
	cJSON_AddStringToObject(run_result(), "file", argv[optind]);

	ret = open_reader(&r, argv[optind]);
	if (ret)
		return ret;
	fi = halite_reader_info(r);
	ret = gather(r, fi, &t);
	if (ret < 0) {
		report_error(argv[optind], NULL, ret, halite_reader_errmsg(r));
		ret = exit_code_for(ret);
	} else if (json) {
		ret = json_emit(info_json(r, argv[optind], fi, &t), EXIT_OK);
	} else {
		info_text(r, argv[optind], fi, &t);
		ret = fflush(stdout) ? EXIT_FAIL : EXIT_OK;
	}
	free(t.streams.v);
	halite_reader_free(r);
	return ret;
}
