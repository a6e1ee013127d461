// SPDX-License-Identifier: MIT
/*
 * halite-inspect extract: write one region's memory, as saved, to a raw image.
 *
 * Each needed locality block is read (and its checksum verified) once, in
 * file order, and every memory block of the region it holds is decoded from
 * that one read, as a restore would. Zero and never-touched blocks are left as
 * holes of a file ftruncate()d to the region's length, so they read as zeros
 * and take no space.
 *
 * The image is built under a temporary name in the target's directory and
 * renamed into place only when every block has decoded: a damaged snapshot
 * never leaves a plausible-looking partial image behind, nor destroys an
 * older image at the same path. Mode 0600, as snapshot files: guest RAM.
 */
#define _GNU_SOURCE /* mkostemp, SEEK_DATA/SEEK_HOLE */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inspect.h"
#include "io.h"
#include "reader_io.h"

void help_extract(FILE *f)
{
	fprintf(f, "Usage: " PROG " extract [--json] [--region NAME] -o IMAGE FILE\n\n"
		   "Write region NAME's memory as saved in FILE to the raw image IMAGE:\n"
		   "zero and never-touched memory blocks read as zeros and are left as\n"
		   "holes. Every locality block is checked before use; on any checksum or\n"
		   "decode failure nothing is written (exit 1).\n\n"
		   "  -r, --region NAME   the region (may be omitted if FILE has only one)\n"
		   "  -o, --output IMAGE  the image to write (a regular file, never FILE;\n"
		   "                      replaced only once complete; mode 0600: it holds\n"
		   "                      guest memory)\n");
	help_image_options(f, 20);
	fputs("\nExit status: 0 ok, 1 FILE is bad or the extract failed, 2 usage.\n", f);
	help_store(f);
}

struct extract {
	struct halite_reader *r;
	const char *path, *out;
	const struct halite_region_info *ri;
	int fd;
	uint64_t lbs_read, stored, zero, untouched;
	struct progress progress;
};

/*
 * LBs an object's extract reads in one request: a store's round trip costs
 * what a megabyte of transfer does (docs/object-store.md).
 */
#define EXTRACT_S3_RUN 16u

#define NEEDED(need, lb) ((need)[(lb) / 8] & (1u << ((lb) % 8)))

/* @lb's blocks of the region, from its verified bytes in @lb_buf, into the image. */
static int copy_lb(struct extract *x, uint64_t lb, const void *lb_buf, void *mb_buf)
{
	const struct halite_file_info *fi = halite_reader_info(x->r);
	uint64_t first = x->ri->first_mb, end = first + x->ri->mb_count;
	const uint64_t *mbs;
	char desc[160];
	uint32_t n;
	int ret;

	ret = halite_reader_lb_members(x->r, lb, &mbs, &n);
	if (ret < 0) {
		snprintf(desc, sizeof(desc), "LB %" PRIu64, lb);
		report_error(x->path, desc, ret, halite_reader_errmsg(x->r));
		return exit_code_for(ret);
	}
	x->lbs_read++;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t m = mbs[i];

		/* LBs are shared between regions: take only this region's blocks. */
		if (m < first || m >= end)
			continue;
		ret = halite_reader_decode_mb(x->r, m, lb_buf, mb_buf);
		if (ret < 0) {
			report_error(x->path, describe_mb(x->r, m, desc, sizeof(desc)), ret,
				     halite_reader_errmsg(x->r));
			return exit_code_for(ret);
		}
		ret = halite_pwrite_all(x->fd, mb_buf, halite_reader_mb_bytes(x->r, m),
					(m - first) * fi->mb_size);
		if (ret < 0) {
			errorf("%s: writing: %s", x->out, strerror(-ret));
			return EXIT_FAIL;
		}
		x->stored++;
	}
	return 0;
}

/*
 * The needed LBs @lb .. @lb + @n - 1 into @bufs, each verified: an object's
 * in one request (halite_reader_read_lb_run()), any that does not verify then
 * read again alone, as a file's are (halite_reader_read_lb()). 0 or an
 * exit code, said.
 */
static int read_lbs(struct extract *x, uint64_t lb, unsigned n, uint8_t **bufs)
{
	uint64_t bad = UINT64_MAX;
	char desc[64];

	if (n > 1)
		halite_reader_read_lb_run(x->r, lb, n, bufs, &bad);
	for (unsigned k = 0; k < n; k++) {
		int ret = 0;

		if (bad & (1ull << k))
			ret = halite_reader_read_lb(x->r, lb + k, bufs[k]);
		if (ret < 0) {
			snprintf(desc, sizeof(desc), "LB %" PRIu64, lb + k);
			report_error(x->path, desc, ret, halite_reader_errmsg(x->r));
			return exit_code_for(ret);
		}
	}
	return 0;
}

/* Returns 0 or an exit code, having said what went wrong. */
static int copy_blocks(struct extract *x)
{
	const struct halite_file_info *fi = halite_reader_info(x->r);
	uint64_t first = x->ri->first_mb, end = first + x->ri->mb_count;
	unsigned run_max = halite_io_is_s3_path(x->path) ? EXTRACT_S3_RUN : 1, got = 0;
	uint8_t *need = NULL, *bufs[EXTRACT_S3_RUN];
	void *mb_buf = NULL;
	uint64_t nneed = 0;
	int ret = 0;

	/* One bit per LB (not one entry per MB): small whatever the region's size. */
	need = calloc(fi->lb_count / 8 + 1, 1);
	mb_buf = malloc(fi->mb_size);
	for (got = 0; got < run_max && (bufs[got] = halite_reader_alloc_lb(x->r)); got++)
		;
	if (!need || !mb_buf || got < run_max) {
		errorf("out of memory");
		ret = EXIT_FAIL;
		goto out;
	}
	for (uint64_t m = first; m < end; m++) {
		struct halite_mb_loc loc;

		ret = halite_reader_mb_lookup(x->r, m, &loc);
		if (ret < 0) {
			report_error(x->path, NULL, ret, halite_reader_errmsg(x->r));
			ret = exit_code_for(ret);
			goto out;
		}
		if (loc.state == HALITE_MB_STORED) {
			nneed += !NEEDED(need, loc.lb);
			need[loc.lb / 8] |= (uint8_t)(1u << (loc.lb % 8));
		} else if (loc.state == HALITE_MB_ZERO)
			x->zero++;
		else
			x->untouched++;
	}

	x->progress.total = (int64_t)(nneed * fi->lb_size);
	for (uint64_t lb = 0, n; lb < fi->lb_count && !ret; lb += n) {
		n = 1;
		if (!NEEDED(need, lb))
			continue;
		while (n < run_max && lb + n < fi->lb_count && NEEDED(need, lb + n))
			n++;
		progress_update(&x->progress, (int64_t)(x->lbs_read * fi->lb_size), false);
		ret = read_lbs(x, lb, (unsigned)n, bufs);
		for (unsigned k = 0; k < n && !ret; k++)
			ret = copy_lb(x, lb + k, bufs[k], mb_buf);
	}
	if (!ret)
		progress_update(&x->progress, (int64_t)(x->lbs_read * fi->lb_size), true);
out:
	free(need);
	free(mb_buf);
	while (got--)
		halite_reader_free_lb(bufs[got]);
	return ret;
}

/*
 * A temporary file next to @out, so that the final rename() stays in one file
 * system. mkostemp() creates it 0600, which the image keeps: it is guest RAM
 * (keys, passwords), and the umask can only take more away.
 */
static int create_temp(const char *out, char **tmp)
{
	size_t n = strlen(out);
	int fd;

	*tmp = malloc(n + sizeof(".tmp-XXXXXX"));
	if (!*tmp) {
		errorf("out of memory");
		return -1;
	}
	memcpy(*tmp, out, n);
	memcpy(*tmp + n, ".tmp-XXXXXX", sizeof(".tmp-XXXXXX"));
	fd = mkostemp(*tmp, O_CLOEXEC);
	if (fd < 0) {
		errorf("%s: %s", out, strerror(errno));
		free(*tmp);
		*tmp = NULL;
		return -1;
	}
	return fd;
}

static const char *const extract_keys[] = {
	"file", "region", "output", "bytes", "lbs_read", "mbs", "store", NULL,
};

int cmd_extract(int argc, char **argv)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "region", required_argument, NULL, 'r' },
		{ "output", required_argument, NULL, 'o' },
		{ "progress", optional_argument, NULL, OPT_PROGRESS },
		{ NULL, 0, NULL, 0 },
	};
	struct extract x = { .fd = -1 };
	struct stat st;
	const char *region = NULL;
	char *tmp = NULL;
	bool json = false;
	int c, ret, idx, progress = HALITE_PROGRESS_NONE;

	run_keys(extract_keys);
	optind = 1;
	while ((c = getopt_long(argc, argv, ":hr:o:", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			run_set_json();
			break;
		case 'r':
			region = optarg;
			break;
		case 'o':
			x.out = optarg;
			break;
		case OPT_PROGRESS:
			if (progress_parse(optarg, &progress))
				return EXIT_USAGE;
			break;
		default:
			return common_option(c, argv, help_extract);
		}
	}
	json = run_json();
	if (argc - optind != 1)
		return usage_hint("expected exactly one FILE");
	x.path = argv[optind];
	cJSON_AddStringToObject(run_result(), "file", x.path);
	if (region)
		cJSON_AddStringToObject(run_result(), "region", region);
	if (!x.out)
		return usage_hint("-o IMAGE is required");
	cJSON_AddStringToObject(run_result(), "output", x.out);
	ret = refuse_input_as_output(x.out, x.path, "the input");
	if (ret)
		return ret;
	/* The image replaces what is at -o: a device or a directory cannot be replaced. */
	if (stat(x.out, &st) == 0 && !S_ISREG(st.st_mode))
		return usage_error("%s: not a regular file%s", x.out, S_ISDIR(st.st_mode) ?
				   " (a directory): give -o the image's file name" : "");

	ret = open_reader(&x.r, x.path);
	if (ret)
		return ret;
	if (region) {
		idx = find_region(x.r, x.path, region);
		if (idx < 0) {
			ret = -idx;
			goto out;
		}
	} else if (halite_reader_info(x.r)->region_count == 1) {
		idx = 0;
	} else {
		char list[1024];

		ret = usage_error("%s has %u regions: name one with --region (%s)", x.path,
				  halite_reader_info(x.r)->region_count,
				  region_list(x.r, list, sizeof(list)));
		goto out;
	}
	x.ri = halite_reader_region(x.r, (uint32_t)idx);
	progress_begin(&x.progress, progress, "extract", x.path, -1);

	x.fd = create_temp(x.out, &tmp);
	if (x.fd < 0) {
		ret = EXIT_FAIL;
		goto out;
	}
	if (ftruncate(x.fd, (off_t)x.ri->length) < 0) {
		errorf("%s: %s", x.out, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	ret = copy_blocks(&x);
	if (ret)
		goto out;
	if (close(x.fd) < 0) {
		x.fd = -1;
		errorf("%s: %s", x.out, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	x.fd = -1;
	if (rename(tmp, x.out) < 0) {
		errorf("%s: %s", x.out, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	free(tmp);
	tmp = NULL;

	if (json) {
		cJSON *root = cJSON_CreateObject(), *o;

		cJSON_AddStringToObject(root, "file", x.path);
		cJSON_AddStringToObject(root, "region", x.ri->name);
		cJSON_AddStringToObject(root, "output", x.out);
		json_add_u64(root, "bytes", x.ri->length);
		json_add_u64(root, "lbs_read", x.lbs_read);
		o = cJSON_AddObjectToObject(root, "mbs");
		json_add_u64(o, "stored", x.stored);
		json_add_u64(o, "zero", x.zero);
		json_add_u64(o, "untouched", x.untouched);
		json_add_store(root, x.r, x.path);
		ret = json_emit(root, EXIT_OK);
	} else {
		notef("%s: region %s, %" PRIu64 " bytes (%" PRIu64 " stored, %" PRIu64
		      " zero, %" PRIu64 " never-touched memory blocks; %" PRIu64
		      " locality blocks read)",
		      x.out, x.ri->name, x.ri->length, x.stored, x.zero, x.untouched, x.lbs_read);
	}
out:
	if (x.fd >= 0)
		close(x.fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	halite_reader_free(x.r);
	return ret;
}
