// SPDX-License-Identifier: MIT
/*
 * halite-inspect blocks and map: one row per locality block, or per memory
 * block. Both stream their rows (text and JSON) instead of building the whole
 * listing first: a 1 TiB guest has 2^27 memory blocks.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "inspect.h"

void help_blocks(FILE *f)
{
	fprintf(f, "Usage: " PROG " blocks [--json] FILE\n\n"
		   "List the locality blocks in file order: index, file offset, stream,\n"
		   "sequence number in the stream, used bytes, fill, memory blocks, and\n"
		   "the recorded checksum. Contents are not read (see verify).\n\n"
		   "  --json        one JSON object on stdout\n"
		   "  -h, --help    this text\n"
		   "  --version     the program's and the file format's version\n");
	help_store(f);
}

void help_map(FILE *f)
{
	fprintf(f, "Usage: " PROG " map [--json] [--region NAME] FILE\n\n"
		   "List the memory blocks: number, region, offset in the region, guest-\n"
		   "physical address, state (stored, zero, never-touched) and, when stored,\n"
		   "the locality block, offset and length of its bytes and whether they are\n"
		   "compressed.\n\n"
		   "  -r, --region NAME  only the memory blocks of region NAME\n"
		   "  --json             one JSON object on stdout (state: stored, zero or\n"
		   "                     untouched, the API's word for never touched)\n"
		   "  -h, --help         this text\n"
		   "  --version          the program's and the file format's version\n");
	help_store(f);
}

static int hex_digits(uint64_t v)
{
	int n = 1;

	while (v >= 16) {
		v >>= 4;
		n++;
	}
	return n + 2;
}

/*
 * Parses [--json] [--region NAME] FILE (region only when @region is not
 * NULL) and opens FILE. -1: done, exit 0 (help, version); else the exit code.
 */
static int parse(int argc, char **argv, bool *json, const char **region,
		 void (*help)(FILE *), const char **path, struct halite_reader **r)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "region", required_argument, NULL, 'r' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, region ? ":hr:" : ":h", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			run_set_json();
			break;
		case 'r':
			if (!region)
				return bad_option('?', argv);
			*region = optarg;
			break;
		default:
			/* -1: done, exit 0 (help, version); else the exit code. */
			c = common_option(c, argv, help);
			return c == EXIT_OK ? -1 : c;
		}
	}
	*json = run_json();
	if (argc - optind != 1)
		return usage_hint("expected exactly one FILE");
	*path = argv[optind];
	cJSON_AddStringToObject(run_result(), "file", *path);
	if (region && *region)
		cJSON_AddStringToObject(run_result(), "region", *region);
	return open_reader(r, *path);
}

/*
 * Close a listing (the JSON stream, or the table: printed even when empty, for
 * its heading), report a failure met on the way, free the reader. Returns the
 * exit code.
 */
static int listing_end(struct halite_reader *r, const char *path, bool json,
		       struct json_stream *js, struct table *t, int ret)
{
	/* Said before the JSON closes: the object carries the error. */
	if (ret < 0) {
		report_error(path, NULL, ret, halite_reader_errmsg(r));
		ret = exit_code_for(ret);
	}
	if (json) {
		ret = json_stream_end(js, ret);
	} else {
		table_print(t);
		table_free(t);
		if (!ret && fflush(stdout))
			ret = EXIT_FAIL;
	}
	halite_reader_free(r);
	return ret;
}

static const char *const blocks_keys[] = { "file", "lb_size", "lb_count", "lbs", NULL };
static const char *const map_keys[] = { "file", "mb_size", "mb_count", "mbs", NULL };

int cmd_blocks(int argc, char **argv)
{
	static const char *const heads[] = { "LB",   "OFFSET", "STREAM", "SEQ",
					     "USED", "FILL",   "MBS",    "CHECKSUM" };
	const struct halite_file_info *fi;
	struct halite_reader *r;
	struct table *t = NULL;
	struct json_stream js = { 0 };
	const char *path;
	bool json = false;
	int ret;

	run_keys(blocks_keys);
	ret = parse(argc, argv, &json, NULL, help_blocks, &path, &r);
	if (ret)
		return ret < 0 ? EXIT_OK : ret;
	fi = halite_reader_info(r);

	if (json) {
		cJSON *head = cJSON_CreateObject();

		cJSON_AddStringToObject(head, "file", path);
		json_add_u64(head, "lb_size", fi->lb_size);
		json_add_u64(head, "lb_count", fi->lb_count);
		json_stream_begin(&js, head, "lbs");
	} else {
		const int w[] = { digits(fi->lb_count), digits(fi->file_size), 10,
				  digits(fi->lb_count), digits(fi->lb_size), 6,
				  digits(fi->lb_size), 18 };

		t = table_new(8, heads, "rrlrrrrl");
		table_stream(t, w);
	}
	for (uint64_t i = 0; i < fi->lb_count; i++) {
		struct halite_lb_info li;
		char sn[32];

		ret = halite_reader_lb_info(r, i, &li);
		if (ret < 0)
			break;
		halite_stream_name(li.stream, sn, sizeof(sn));
		if (json) {
			cJSON *o = cJSON_CreateObject();

			json_add_u64(o, "lb", i);
			json_add_u64(o, "offset", li.offset);
			cJSON_AddStringToObject(o, "stream", sn);
			json_add_u64(o, "stream_id", li.stream);
			json_add_u64(o, "seq", li.seq);
			json_add_u64(o, "used", li.used);
			cJSON_AddNumberToObject(o, "fill_pct", pct(li.used, fi->lb_size));
			json_add_u64(o, "mbs", li.mb_count);
			json_add_hex(o, "checksum", li.checksum);
			json_stream_item(&js, o);
		} else {
			char a[24], b[24], s[16], u[16], f[16], m[16], ck[24];

			snprintf(a, sizeof(a), "%" PRIu64, i);
			snprintf(b, sizeof(b), "%" PRIu64, li.offset);
			snprintf(s, sizeof(s), "%u", li.seq);
			snprintf(u, sizeof(u), "%u", li.used);
			snprintf(f, sizeof(f), "%.1f%%", pct(li.used, fi->lb_size));
			snprintf(m, sizeof(m), "%u", li.mb_count);
			snprintf(ck, sizeof(ck), "0x%016" PRIx64, li.checksum);
			table_row(t, a, b, sn, s, u, f, m, ck);
		}
	}
	return listing_end(r, path, json, &js, t, ret);
}

int cmd_map(int argc, char **argv)
{
	static const char *const heads[] = { "MB", "REGION", "OFFSET", "GPA", "STATE",
					     "LB", "LB_OFFSET", "LENGTH", "COMPRESSED" };
	const struct halite_file_info *fi;
	struct halite_reader *r;
	struct table *t = NULL;
	struct json_stream js = { 0 };
	const char *path, *region = NULL;
	uint32_t r0 = 0, r1;
	bool json = false;
	int ret;

	run_keys(map_keys);
	ret = parse(argc, argv, &json, &region, help_map, &path, &r);
	if (ret)
		return ret < 0 ? EXIT_OK : ret;
	fi = halite_reader_info(r);
	r1 = fi->region_count;
	if (region) {
		ret = find_region(r, path, region);
		if (ret < 0) {
			halite_reader_free(r);
			return -ret;
		}
		r0 = (uint32_t)ret;
		r1 = r0 + 1;
		ret = 0;
	}

	if (json) {
		cJSON *head = cJSON_CreateObject();

		cJSON_AddStringToObject(head, "file", path);
		json_add_u64(head, "mb_size", fi->mb_size);
		json_add_u64(head, "mb_count", fi->mb_count);
		if (region)
			cJSON_AddStringToObject(head, "region", region);
		json_stream_begin(&js, head, "mbs");
	} else {
		int w[9] = { digits(fi->mb_count), 6, 0, 0, 13, digits(fi->lb_count),
			     digits(fi->lb_size), digits(fi->lb_size), 3 };

		for (uint32_t i = r0; i < r1; i++) {
			const struct halite_region_info *ri = halite_reader_region(r, i);

			int nl = (int)strlen(ri->name);

			if (nl > w[1])
				w[1] = nl;
			if (hex_digits(ri->length) > w[2])
				w[2] = hex_digits(ri->length);
			if (hex_digits(ri->gpa + ri->length) > w[3])
				w[3] = hex_digits(ri->gpa + ri->length);
		}
		t = table_new(9, heads, "rlrrlrrrl");
		table_stream(t, w);
	}
	for (uint32_t ri_idx = r0; ri_idx < r1 && ret == 0; ri_idx++) {
		const struct halite_region_info *ri = halite_reader_region(r, ri_idx);

		for (uint64_t m = ri->first_mb; m < ri->first_mb + ri->mb_count; m++) {
			uint64_t off = (m - ri->first_mb) * fi->mb_size;
			struct halite_mb_loc loc;
			bool st;

			ret = halite_reader_mb_lookup(r, m, &loc);
			if (ret < 0)
				break;
			st = loc.state == HALITE_MB_STORED;
			if (json) {
				cJSON *o = cJSON_CreateObject();

				json_add_u64(o, "mb", m);
				cJSON_AddStringToObject(o, "region", ri->name);
				json_add_u64(o, "offset", off);
				json_add_u64(o, "gpa", ri->gpa + off);
				json_add_u64(o, "bytes", halite_reader_mb_bytes(r, m));
				cJSON_AddStringToObject(o, "state", mb_state_name(loc.state));
				if (st) {
					json_add_u64(o, "lb", loc.lb);
					json_add_u64(o, "lb_offset", loc.offset);
					json_add_u64(o, "length", loc.length);
					cJSON_AddBoolToObject(o, "compressed", loc.compressed);
				}
				json_stream_item(&js, o);
			} else {
				char a[24], o[24], g[24], l[24], lo[16], len[16];

				snprintf(a, sizeof(a), "%" PRIu64, m);
				snprintf(o, sizeof(o), "0x%" PRIx64, off);
				snprintf(g, sizeof(g), "0x%" PRIx64, ri->gpa + off);
				strcpy(l, "-");
				strcpy(lo, "-");
				strcpy(len, "-");
				if (st) {
					snprintf(l, sizeof(l), "%" PRIu64, loc.lb);
					snprintf(lo, sizeof(lo), "%u", loc.offset);
					snprintf(len, sizeof(len), "%u", loc.length);
				}
				table_row(t, a, ri->name, o, g, mb_state_word(loc.state), l, lo,
					  len, !st ? "-" : loc.compressed ? "yes" : "no");
			}
		}
	}
	return listing_end(r, path, json, &js, t, ret);
}
