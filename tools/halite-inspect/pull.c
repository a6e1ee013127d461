// SPDX-License-Identifier: MIT
/*
 * halite-inspect pull: download s3://BUCKET/KEY to FILE. The object goes
 * to a temporary file beside FILE, which replaces FILE only once complete
 * and (but with --any) once it opens as a Halite snapshot: a failed pull
 * leaves FILE as it was. A symbolic link at FILE is refused, never followed.
 * The snapshot's disks, when pushed with it, follow into FILE.disks/
 * (s3disks.c).
 */
#define _GNU_SOURCE
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
#include "s3cmd.h"

void help_pull(FILE *f)
{
	fprintf(f, "Usage: " PROG " pull [--json] [--part-size SIZE] [--jobs N] [--any]\n"
		   "                      [--progress[=MODE]] [--no-disks] s3://BUCKET/KEY FILE\n\n"
		   "Download a snapshot from an object store (docs/object-store.md says how\n"
		   "it is configured) to FILE, in ranges fetched several at once, each\n"
		   "checked to be of the object a first HEAD saw. FILE is replaced only\n"
		   "when the download is complete and opens as a Halite snapshot; a\n"
		   "symbolic link at FILE is refused. The snapshot's frozen disks, when\n"
		   "pushed with it, follow into FILE.disks/N.qcow2 with its manifest.json,\n"
		   "each checked against the manifest (size, ETag, SHA-256).\n\n"
		   "  --part-size SIZE  bytes a range (default 8M)\n"
		   "  -j, --jobs N      ranges in flight at once (default 8)\n"
		   "  --any             keep the object even when it is not a Halite snapshot\n"
		   "  --no-disks        the snapshot alone, without its disks\n"
		   "  --progress[=MODE] text, json or none on stderr (default: text on a\n"
		   "                    terminal)\n"
		   "  --json            one JSON object on stdout: bytes, parts, requests, seconds\n"
		   "  -h, --help        this help\n"
		   "  --version         the version\n\n"
		   "Exit status: 0 ok, 1 the download failed or is not a snapshot, 2 usage.\n");
}

static void pull_progress(void *ctx, uint64_t bytes)
{
	progress_update(ctx, (int64_t)bytes, false);
}

static const char *const pull_keys[] = {
	"url", "file", "bytes", "parts", "etag", "requests", "retries", "seconds", "disks", NULL,
};

int cmd_pull(int argc, char **argv)
{
	enum { OPT_NO_DISKS = S3CMD_OPT_NEXT };
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		S3CMD_LONGOPTS,
		{ "no-disks", no_argument, NULL, OPT_NO_DISKS },
		{ NULL, 0, NULL, 0 },
	};
	struct s3cmd_opts so = { .min_part = 64u << 10, .max_part = 1ull << 30,
				 .part_range = "64K to 1G", .progress = -1 };
	struct halite_s3_object obj;
	struct s3cmd c = { 0 };
	struct progress prog;
	struct stat st;
	const char *url, *out;
	char *tmp = NULL;
	uint64_t parts = 0;
	bool disks = true;
	cJSON *djson = NULL;
	int ch, ret, fd = -1;

	run_keys(pull_keys);
	optind = 1;
	while ((ch = getopt_long(argc, argv, ":hj:", lo, NULL)) != -1) {
		if (ch == OPT_NO_DISKS) {
			disks = false;
			continue;
		}
		ret = s3cmd_option(ch, &so);
		if (ret < 0)
			return common_option(ch, argv, help_pull);
		if (ret)
			return ret;
	}
	if (argc - optind != 2)
		return usage_hint("expected s3://BUCKET/KEY and FILE");
	url = argv[optind];
	out = argv[optind + 1];
	cJSON_AddStringToObject(run_result(), "url", url);
	cJSON_AddStringToObject(run_result(), "file", out);
	if (strncmp(url, "s3://", 5))
		return usage_hint("'%s' is not an s3://BUCKET/KEY URL (pull s3://BUCKET/KEY FILE)",
				  url);
	if (lstat(out, &st) == 0) {
		if (S_ISLNK(st.st_mode))
			return usage_error("%s is a symbolic link: pull replaces files, never "
					   "writes through a link", out);
		if (!S_ISREG(st.st_mode))
			return usage_error("%s: not a regular file%s", out, S_ISDIR(st.st_mode) ?
					   " (a directory): give the file's name" : "");
	}
	ret = s3cmd_open(&c, url, (unsigned)so.jobs);
	if (ret)
		return ret;
	if (asprintf(&tmp, "%s.tmp-XXXXXX", out) < 0) {
		tmp = NULL;
		errorf("out of memory");
		ret = EXIT_FAIL;
		goto out;
	}
	/* mkostemp: O_EXCL, so nothing planted at the temporary name is followed either. */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		errorf("%s: %s", out, strerror(errno));
		free(tmp);
		tmp = NULL;
		ret = EXIT_FAIL;
		goto out;
	}
	if (so.progress < 0)
		so.progress = isatty(STDERR_FILENO) ? HALITE_PROGRESS_TEXT : HALITE_PROGRESS_NONE;
	progress_begin(&prog, so.progress, "pull", url, -1);
	halite_s3_set_progress(c.s, pull_progress, &prog);
	ret = halite_s3_download_fd(c.s, c.key, fd, so.part_size, &obj, &parts);
	if (ret) {
		ret = s3cmd_fail(&c, ret);
		goto out;
	}
	progress_update(&prog, (int64_t)obj.size, true);
	/* A retry may have followed a longer first attempt: the file is the object's size. */
	if (ftruncate(fd, (off_t)obj.size) < 0 || fsync(fd) < 0 || close(fd) < 0) {
		fd = -1;
		errorf("%s: %s", out, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	fd = -1;
	if (!so.any) {
		ret = s3cmd_check_snapshot(tmp, url, "--any keeps it anyway");
		if (ret)
			goto out;
	}
	if (rename(tmp, out) < 0) {
		errorf("%s: %s", out, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	free(tmp);
	tmp = NULL;
	if (disks && !so.any) {
		djson = run_json() ? cJSON_CreateArray() : NULL;
		ret = pull_disks(&c, out, so.progress, djson);
		if (ret)
			goto out;
	}
	if (run_json()) {
		cJSON *root = cJSON_CreateObject();

		cJSON_AddStringToObject(root, "url", url);
		cJSON_AddStringToObject(root, "file", out);
		json_add_u64(root, "bytes", obj.size);
		json_add_u64(root, "parts", parts);
		cJSON_AddStringToObject(root, "etag", obj.etag);
		if (djson)
			cJSON_AddItemToObject(root, "disks", djson);
		else
			cJSON_AddArrayToObject(root, "disks");
		djson = NULL;
		s3cmd_json_stats(&c, root);
		ret = json_emit(root, EXIT_OK);
	} else {
		notef("%s: %" PRIu64 " bytes from %s", out, obj.size, url);
	}
out:
	cJSON_Delete(djson);
	if (fd >= 0)
		close(fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	s3cmd_close(&c);
	return ret;
}
