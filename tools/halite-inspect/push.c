// SPDX-License-Identifier: MIT
/*
 * halite-inspect push: upload a snapshot file to s3://BUCKET/KEY, as a
 * multipart upload whose parts go several at once, each checked by the
 * store against its MD5. The upload id is kept in FILE.s3-upload (0600)
 * until the object is complete, so a push run again after an interruption
 * sends only the parts the store lacks.
 *
 * The snapshot's frozen disks go first, each flattened into one qcow2,
 * then their manifest, and the snapshot last (s3disks.c): whoever finds
 * the snapshot finds its disks.
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

/* S3 and the stores that follow it refuse parts under 5 MiB but the last. */
#define MIN_PART_SIZE (5u << 20)
#define MAX_PART_SIZE (5ull << 30)
/* Without --progress, a person at a terminal sees progress for transfers this large. */
#define PROGRESS_AUTO_BYTES (64ull << 20)

void help_push(FILE *f)
{
	fprintf(f, "Usage: " PROG " push [--json] [--part-size SIZE] [--jobs N] [--any]\n"
		   "                      [--progress[=MODE]] [--no-disks] FILE s3://BUCKET/KEY\n\n"
		   "Upload the snapshot FILE to an object store (docs/object-store.md says\n"
		   "how it is configured). Parts go several at once, each checked by the\n"
		   "store against its MD5. An interrupted push, run again, sends only the\n"
		   "parts the store lacks: the upload is recorded in FILE.s3-upload until\n"
		   "the object is complete.\n\n"
		   "The frozen disk images the snapshot records (halite-qemu save) go\n"
		   "first, each flattened with its backing chain into one qcow2 at\n"
		   "KEY.disks/N.qcow2, then KEY.disks/manifest.json, then the snapshot.\n\n"
		   "  --part-size SIZE  bytes a part, 5M to 5G (default 8M)\n"
		   "  -j, --jobs N      parts in flight at once (default 8)\n"
		   "  --any             push FILE even when it is not a Halite snapshot\n"
		   "  --no-resume       start a new upload, ignoring FILE.s3-upload\n"
		   "  --no-disks        the snapshot alone, without its frozen disks\n"
		   "  --progress[=MODE] text, json or none on stderr (default: text on a\n"
		   "                    terminal for files of 64 MiB or more)\n"
		   "  --json            one JSON object on stdout: bytes, parts, requests, seconds\n"
		   "  -h, --help        this help\n"
		   "  --version         the version\n\n"
		   "Exit status: 0 ok, 1 FILE is not a snapshot or the upload failed, 2 usage.\n");
}

static void push_progress(void *ctx, uint64_t done, uint64_t total)
{
	progress_update(ctx, (int64_t)done, false);
}

static const char *const push_keys[] = {
	"file", "url", "bytes", "parts", "parts_sent", "part_size", "resumed", "etag",
	"requests", "retries", "seconds", "disks", NULL,
};

/* HALITE_S3_TEST_STOP_AFTER_PARTS: the tests' way to interrupt a push (0: never). */
static uint64_t test_stop_after(void)
{
	const char *v = getenv("HALITE_S3_TEST_STOP_AFTER_PARTS");
	uint64_t n = 0;

	return v && !halite_parse_u64(v, &n) ? n : 0;
}

int cmd_push(int argc, char **argv)
{
	enum { OPT_NO_RESUME = S3CMD_OPT_NEXT, OPT_NO_DISKS };
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		S3CMD_LONGOPTS,
		{ "no-resume", no_argument, NULL, OPT_NO_RESUME },
		{ "no-disks", no_argument, NULL, OPT_NO_DISKS },
		{ NULL, 0, NULL, 0 },
	};
	struct s3cmd_opts so = { .min_part = MIN_PART_SIZE, .max_part = MAX_PART_SIZE,
				 .part_range = "5M to 5G", .progress = -1 };
	HALITE_OPTS(halite_s3_upload_opts, uo);
	struct halite_s3_upload_result res;
	struct s3cmd c = { 0 };
	struct progress prog;
	struct stat st;
	const char *path, *url;
	char *state = NULL;
	bool resume = true, disks = true;
	cJSON *djson = NULL;
	int ch, ret, fd = -1;

	run_keys(push_keys);
	optind = 1;
	while ((ch = getopt_long(argc, argv, ":hj:", lo, NULL)) != -1) {
		if (ch == OPT_NO_RESUME) {
			resume = false;
			continue;
		}
		if (ch == OPT_NO_DISKS) {
			disks = false;
			continue;
		}
		ret = s3cmd_option(ch, &so);
		if (ret < 0)
			return common_option(ch, argv, help_push);
		if (ret)
			return ret;
	}
	if (argc - optind != 2)
		return usage_hint("expected FILE and s3://BUCKET/KEY");
	path = argv[optind];
	url = argv[optind + 1];
	cJSON_AddStringToObject(run_result(), "file", path);
	cJSON_AddStringToObject(run_result(), "url", url);
	if (strncmp(url, "s3://", 5))
		return usage_hint("'%s' is not an s3://BUCKET/KEY URL (push FILE s3://BUCKET/KEY)",
				  url);

	/* The URL first: a usage error is refused before anything else is looked at. */
	ret = s3cmd_open(&c, url, (unsigned)so.jobs);
	if (ret)
		goto out;
	/* Only a file the reader opens is a snapshot worth pushing (header and footer checked). */
	if (!so.any) {
		ret = s3cmd_check_snapshot(path, path, "--any pushes it anyway");
		if (ret)
			goto out;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0) {
		errorf("%s: %s", path, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = usage_error("%s: not a regular file", path);
		goto out;
	}
	if (asprintf(&state, "%s.s3-upload", path) < 0) {
		state = NULL;
		errorf("out of memory");
		ret = EXIT_FAIL;
		goto out;
	}
	if (!resume && unlink(state) < 0 && errno != ENOENT) {
		errorf("%s: %s", state, strerror(errno));
		ret = EXIT_FAIL;
		goto out;
	}
	if (so.progress < 0)
		so.progress = isatty(STDERR_FILENO) && (uint64_t)st.st_size >= PROGRESS_AUTO_BYTES ?
				      HALITE_PROGRESS_TEXT : HALITE_PROGRESS_NONE;
	/* Before the snapshot: --any pushes bytes that need not be a snapshot at all. */
	if (disks && !so.any) {
		djson = run_json() ? cJSON_CreateArray() : NULL;
		ret = push_disks(&c, path, so.part_size, so.progress, djson);
		if (ret)
			goto out;
	}
	progress_begin(&prog, so.progress, "push", path, (int64_t)st.st_size);
	uo.part_size = so.part_size;
	uo.state_path = state;
	uo.progress = push_progress;
	uo.progress_ctx = &prog;
	uo.stop_after_parts = test_stop_after();
	ret = halite_s3_upload_fd(c.s, c.key, fd, &uo, &res);
	if (ret) {
		ret = s3cmd_fail(&c, ret);
		goto out;
	}
	progress_update(&prog, (int64_t)res.bytes, true);
	if (run_json()) {
		cJSON *root = cJSON_CreateObject();

		cJSON_AddStringToObject(root, "file", path);
		cJSON_AddStringToObject(root, "url", url);
		json_add_u64(root, "bytes", res.bytes);
		json_add_u64(root, "parts", res.parts);
		json_add_u64(root, "parts_sent", res.parts_sent);
		json_add_u64(root, "part_size", res.part_size);
		cJSON_AddBoolToObject(root, "resumed", res.resumed);
		cJSON_AddStringToObject(root, "etag", res.etag);
		if (djson)
			cJSON_AddItemToObject(root, "disks", djson);
		else
			cJSON_AddArrayToObject(root, "disks");
		djson = NULL;
		s3cmd_json_stats(&c, root);
		ret = json_emit(root, EXIT_OK);
	} else {
		notef("%s: %" PRIu64 " bytes to %s in %" PRIu64 " parts (%" PRIu64 " sent%s)",
		      path, res.bytes, url, res.parts, res.parts_sent,
		      res.resumed ? ", the others kept from an interrupted push" : "");
	}
out:
	cJSON_Delete(djson);
	if (fd >= 0)
		close(fd);
	free(state);
	s3cmd_close(&c);
	return ret;
}
