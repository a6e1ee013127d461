// SPDX-License-Identifier: MIT
/*
 * halite-inspect verify: check everything a reader could trust in a file.
 *
 * Open already checks the header, footer, directory and the sections the
 * reader understands. On top of that we check every directory entry's
 * checksum (unknown optional sections too), read every locality block and
 * check its checksum, that its slack is zero as the writer must leave it, and
 * decode every stored memory block. A failure never stops the walk: the point
 * is to name every bad block, so that a damaged file can be judged (and the
 * damage compared with what a restore would hit).
 *
 * LBs are checked in parallel in batches; results are reported in LB order
 * after each batch, so the output does not depend on thread timing.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "endian_util.h"
#include "inspect.h"
#include "io.h"
#include "pool.h"

void help_verify(FILE *f)
{
	fprintf(f, "Usage: " PROG " verify [--json] [-j N] [--progress[=MODE]] FILE\n\n"
		   "Check the header, footer, directory and every section's checksum, read\n"
		   "every locality block and check its checksum and zero slack, and decode\n"
		   "every stored memory block. Each problem is named on stderr; the walk\n"
		   "continues past failures. The verdict (OK: ... or BAD: ...) is on stdout.\n\n"
		   "  -j, --jobs N        threads, 1 to 256 (default: online CPUs; 16 for an\n"
		   "                      s3:// FILE, whose reads wait on round trips)\n"
		   "  --progress[=MODE]   progress on stderr about every 0.5 s: text (a line,\n"
		   "                      the default on a terminal without --json), json\n"
		   "                      (one object a line), none\n"
		   "  --json              one JSON object on stdout\n"
		   "  -h, --help          this text\n"
		   "  --version           the program's and the file format's version\n\n"
		   "Exit status: 0 intact, 1 problems found or the file could not be read\n"
		   "(the JSON's problems and error say which), 2 usage.\n");
	help_store(f);
}

struct mb_fail {
	uint64_t mb;
	int err;
};

struct lb_job {
	struct halite_reader *r;
	uint64_t lb;
	void *buf;		/* lb_size, from halite_reader_alloc_lb() */
	void *mbuf;		/* mb_size */
	/* results */
	int err;		/* read or checksum */
	int64_t slack_at;	/* first non-zero slack byte, or -1 */
	uint32_t mbs_ok;
	struct mb_fail *fails;	/* kept across the LBs this slot checks */
	uint32_t nfails, fails_cap;
};

static void check_lb(void *arg)
{
	struct lb_job *j = arg;
	const struct halite_file_info *fi = halite_reader_info(j->r);
	struct halite_lb_info li;
	const uint64_t *mbs;
	const uint8_t *b = j->buf;
	uint32_t n;
	int ret;

	j->err = 0;
	j->slack_at = -1;
	j->mbs_ok = 0;
	j->nfails = 0;
	ret = halite_reader_lb_info(j->r, j->lb, &li);
	if (ret == 0)
		ret = halite_reader_read_lb(j->r, j->lb, j->buf);
	if (ret == 0)
		ret = halite_reader_lb_members(j->r, j->lb, &mbs, &n);
	if (ret < 0) {
		/* An LB that fails its checksum is never decoded: its bytes mean nothing. */
		j->err = ret;
		return;
	}
	if (!halite_all_zero(b + li.used, fi->lb_size - li.used)) {
		for (uint32_t i = li.used; i < fi->lb_size && j->slack_at < 0; i++)
			if (b[i])
				j->slack_at = i;
	}
	for (uint32_t i = 0; i < n; i++) {
		ret = halite_reader_decode_mb(j->r, mbs[i], j->buf, j->mbuf);
		if (ret == 0) {
			j->mbs_ok++;
			continue;
		}
		if (j->fails_cap < n) {
			struct mb_fail *f = realloc(j->fails, n * sizeof(*f));

			if (!f) {
				j->err = -ENOMEM;
				return;
			}
			j->fails = f;
			j->fails_cap = n;
		}
		j->fails[j->nfails].mb = mbs[i];
		j->fails[j->nfails].err = ret;
		j->nfails++;
	}
}

struct verify {
	struct halite_reader *r;
	const char *path;
	bool json;
	struct progress progress;
	cJSON *problems;
	uint64_t sec_bad, lb_bad, mb_bad, mb_ok;
	bool io_error;
};

static void problem(struct verify *v, cJSON *obj, const char *what, const char *msg)
{
	/* Do not leave the message glued to the end of a progress line. */
	if (v->progress.mode == HALITE_PROGRESS_TEXT && v->progress.tty)
		fputs("\r\033[K", stderr);
	errorf("%s: %s", v->path, msg);
	if (obj) {
		cJSON_AddStringToObject(obj, "what", what);
		cJSON_AddStringToObject(obj, "message", msg);
		cJSON_AddItemToArray(v->problems, obj);
	}
}

/*
 * A 1.1 file's index chunks: a restore checks each when it first uses it;
 * verify checks them all, and everything a 1.0 open checks of the map.
 */
static void check_index(struct verify *v)
{
	int ret = halite_reader_verify_index(v->r);
	char msg[300], d[256];
	cJSON *o;

	if (!ret)
		return;
	snprintf(msg, sizeof(msg), "index: %s",
		 error_text(v->path, ret, halite_reader_errmsg(v->r), d, sizeof(d)));
	if (exit_code_for(ret) == EXIT_BAD)
		v->sec_bad++;
	else
		v->io_error = true;
	o = v->json ? cJSON_CreateObject() : NULL;
	if (o)
		cJSON_AddStringToObject(o, "error", halite_strerror(ret));
	problem(v, o, "index", msg);
}

static void check_sections(struct verify *v)
{
	uint32_t n = halite_reader_section_count(v->r);

	for (uint32_t i = 0; i < n; i++) {
		uint32_t type;
		uint64_t off, len;
		const char *name;
		char msg[256];
		cJSON *o;
		int ret;

		ret = halite_reader_section(v->r, i, &type, &off, &len);
		if (ret == 0)
			ret = halite_reader_verify_section(v->r, i);
		if (ret == 0)
			continue;
		name = halite_section_name(type);
		snprintf(msg, sizeof(msg),
			 "section %u (type 0x%08x %s, offset %" PRIu64 ", length %" PRIu64 "): %s",
			 i, type, name ? name : "unknown", off, len, halite_strerror(ret));
		if (exit_code_for(ret) == EXIT_BAD)
			v->sec_bad++;
		else
			v->io_error = true;
		o = v->json ? cJSON_CreateObject() : NULL;
		if (o) {
			json_add_u64(o, "section", i);
			json_add_hex(o, "type", type);
			json_add_u64(o, "offset", off);
			json_add_u64(o, "length", len);
			cJSON_AddStringToObject(o, "error", halite_strerror(ret));
		}
		problem(v, o, "section", msg);
	}
	check_index(v);
}

static cJSON *lb_json(struct verify *v, uint64_t lb)
{
	struct halite_lb_info li;
	char sn[32];
	cJSON *o;

	if (!v->json)
		return NULL;
	o = cJSON_CreateObject();
	json_add_u64(o, "lb", lb);
	if (halite_reader_lb_info(v->r, lb, &li) == 0) {
		json_add_u64(o, "offset", li.offset);
		cJSON_AddStringToObject(o, "stream", halite_stream_name(li.stream, sn, sizeof(sn)));
		json_add_u64(o, "seq", li.seq);
	}
	return o;
}

static void report_lb(struct verify *v, struct lb_job *j)
{
	char lbd[128], mbd[160], msg[512];
	cJSON *o;

	if (j->err) {
		describe_lb(v->r, j->lb, lbd, sizeof(lbd));
		snprintf(msg, sizeof(msg), "%s: %s", lbd, halite_strerror(j->err));
		if (exit_code_for(j->err) == EXIT_BAD)
			v->lb_bad++;
		else
			v->io_error = true;
		o = lb_json(v, j->lb);
		if (o)
			cJSON_AddStringToObject(o, "error", halite_strerror(j->err));
		problem(v, o, "lb", msg);
		return;
	}
	if (j->slack_at >= 0) {
		describe_lb(v->r, j->lb, lbd, sizeof(lbd));
		snprintf(msg, sizeof(msg), "%s: non-zero byte in slack at LB offset %" PRId64, lbd,
			 j->slack_at);
		v->lb_bad++;
		o = lb_json(v, j->lb);
		if (o) {
			json_add_u64(o, "slack_offset", (uint64_t)j->slack_at);
			cJSON_AddStringToObject(o, "error", "non-zero slack");
		}
		problem(v, o, "slack", msg);
	}
	v->mb_ok += j->mbs_ok;
	for (uint32_t i = 0; i < j->nfails; i++) {
		describe_lb(v->r, j->lb, lbd, sizeof(lbd));
		describe_mb(v->r, j->fails[i].mb, mbd, sizeof(mbd));
		snprintf(msg, sizeof(msg), "%s in %s: %s", mbd, lbd,
			 halite_strerror(j->fails[i].err));
		v->mb_bad++;
		o = lb_json(v, j->lb);
		if (o) {
			json_add_u64(o, "mb", j->fails[i].mb);
			cJSON_AddStringToObject(o, "error", halite_strerror(j->fails[i].err));
		}
		problem(v, o, "mb", msg);
	}
	/* One count per LB, whatever is wrong with it: the slack case counted it already. */
	if (j->nfails && j->slack_at < 0)
		v->lb_bad++;
}

static int check_lbs(struct verify *v, unsigned jobs)
{
	const struct halite_file_info *fi = halite_reader_info(v->r);
	struct halite_pool *pool = NULL;
	struct lb_job *batch;
	uint64_t nbatch, done = 0;
	int ret = 0;

	/* Enough LBs per batch to keep every thread busy, bounded to ~64 MiB of buffers. */
	nbatch = (uint64_t)jobs * 8;
	if (nbatch * fi->lb_size > (64u << 20))
		nbatch = HALITE_MAX(jobs, (64u << 20) / fi->lb_size);
	if (nbatch > fi->lb_count)
		nbatch = fi->lb_count ? fi->lb_count : 1;
	batch = calloc(nbatch, sizeof(*batch));
	if (!batch)
		return -ENOMEM;
	for (uint64_t i = 0; i < nbatch; i++) {
		batch[i].r = v->r;
		batch[i].buf = halite_reader_alloc_lb(v->r);
		batch[i].mbuf = malloc(fi->mb_size);
		if (!batch[i].buf || !batch[i].mbuf) {
			ret = -ENOMEM;
			goto out;
		}
	}
	if (jobs > 1) {
		ret = halite_pool_create(&pool, jobs, "hi-verify");
		if (ret < 0)
			goto out;
	}

	while (done < fi->lb_count) {
		uint64_t n = HALITE_MIN(nbatch, fi->lb_count - done);

		for (uint64_t i = 0; i < n; i++) {
			batch[i].lb = done + i;
			if (!pool || halite_pool_submit(pool, check_lb, &batch[i]) < 0)
				check_lb(&batch[i]);
		}
		if (pool)
			halite_pool_wait(pool);
		for (uint64_t i = 0; i < n; i++)
			report_lb(v, &batch[i]);
		done += n;
		progress_update(&v->progress, (int64_t)(done * fi->lb_size), false);
	}
	progress_update(&v->progress, (int64_t)(done * fi->lb_size), true);
out:
	halite_pool_free(pool);
	for (uint64_t i = 0; i < nbatch; i++) {
		halite_reader_free_lb(batch[i].buf);
		free(batch[i].mbuf);
		free(batch[i].fails);
	}
	free(batch);
	return ret;
}

/* "OK: ..." or "BAD: 1 of 5 sections, 2 of 9 locality blocks failed". */
static void summary(const struct verify *v, char *line, size_t len)
{
	const struct halite_file_info *fi = halite_reader_info(v->r);
	const char *sep = " ";
	size_t k;

	if (!v->sec_bad && !v->lb_bad && !v->mb_bad) {
		snprintf(line, len, "OK: %" PRIu64 " locality blocks, %" PRIu64
			 " memory blocks verified", fi->lb_count, v->mb_ok);
		return;
	}
	k = (size_t)snprintf(line, len, "BAD:");
	if (v->sec_bad) {
		k += (size_t)snprintf(line + k, len - k, "%s%" PRIu64 " of %u sections", sep,
				      v->sec_bad, halite_reader_section_count(v->r));
		sep = ", ";
	}
	if (v->lb_bad) {
		k += (size_t)snprintf(line + k, len - k, "%s%" PRIu64 " of %" PRIu64
				      " locality blocks", sep, v->lb_bad, fi->lb_count);
		sep = ", ";
	}
	if (v->mb_bad)
		k += (size_t)snprintf(line + k, len - k, "%s%" PRIu64 " of %" PRIu64
				      " memory blocks", sep, v->mb_bad, fi->mb_stored);
	snprintf(line + k, len - k, " failed");
}

/* Threads verifying an s3:// object when -j does not say (its GETs in flight). */
#define VERIFY_S3_JOBS 16u

static const char *const verify_keys[] = {
	"file", "summary", "sections", "lbs", "mbs", "problems", "store", NULL,
};

int cmd_verify(int argc, char **argv)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "jobs", required_argument, NULL, 'j' },
		{ "progress", optional_argument, NULL, OPT_PROGRESS },
		{ NULL, 0, NULL, 0 },
	};
	struct verify v = { 0 };
	const struct halite_file_info *fi;
	unsigned jobs = 0;
	char line[256];
	cJSON *root = NULL, *o;
	int progress = -1, exit;
	bool bad;
	long l;
	int c, ret;

	run_keys(verify_keys);
	optind = 1;
	while ((c = getopt_long(argc, argv, ":hj:", lo, NULL)) != -1) {
		switch (c) {
		case OPT_JSON:
			run_set_json();
			break;
		case 'j':
			if (parse_int(optarg, 1, 256, &l) < 0)
				return usage_error("--jobs: 1 to 256, not '%s'", optarg);
			jobs = (unsigned)l;
			break;
		case OPT_PROGRESS:
			if (progress_parse(optarg, &progress))
				return EXIT_USAGE;
			break;
		default:
			return common_option(c, argv, help_verify);
		}
	}
	v.json = run_json();
	if (argc - optind != 1)
		return usage_hint("expected exactly one FILE");
	v.path = argv[optind];
	cJSON_AddStringToObject(run_result(), "file", v.path);
	/*
	 * An object's reads wait on round trips, not on this host's CPUs: more
	 * of them in flight (io_s3.c keeps a client per concurrent reader).
	 */
	if (!jobs)
		jobs = halite_io_is_s3_path(v.path) ? VERIFY_S3_JOBS : default_jobs();
	/* As before --progress: a person at a terminal sees it, a script does not. */
	if (progress < 0 && !v.json && isatty(STDERR_FILENO))
		progress = HALITE_PROGRESS_TEXT;

	/* A file that does not open is the whole verdict: one error, exit 1. */
	ret = open_reader(&v.r, v.path);
	if (ret)
		return ret;
	fi = halite_reader_info(v.r);
	progress_begin(&v.progress, progress, "verify", v.path,
		       (int64_t)(fi->lb_count * fi->lb_size));
	if (v.json)
		v.problems = cJSON_CreateArray();

	check_sections(&v);
	ret = check_lbs(&v, jobs);
	if (ret < 0) {
		errorf("%s: %s", v.path, halite_strerror(ret));
		cJSON_Delete(v.problems);
		halite_reader_free(v.r);
		return EXIT_FAIL;
	}

	bad = v.sec_bad || v.lb_bad || v.mb_bad;
	summary(&v, line, sizeof(line));
	/* Found damage is the answer even if some reads also failed. */
	exit = bad ? EXIT_BAD : v.io_error ? EXIT_FAIL : EXIT_OK;
	/* The problems are on stderr one by one; the error is their sum (or the first read's). */
	if (bad)
		run_set_error("%s: %s", v.path, strncmp(line, "BAD: ", 5) ? line : line + 5);

	if (v.json) {
		root = cJSON_CreateObject();
		cJSON_AddStringToObject(root, "file", v.path);
		cJSON_AddStringToObject(root, "summary", line);
		o = cJSON_AddObjectToObject(root, "sections");
		json_add_u64(o, "count", halite_reader_section_count(v.r));
		json_add_u64(o, "bad", v.sec_bad);
		o = cJSON_AddObjectToObject(root, "lbs");
		json_add_u64(o, "count", fi->lb_count);
		json_add_u64(o, "bad", v.lb_bad);
		o = cJSON_AddObjectToObject(root, "mbs");
		json_add_u64(o, "stored", fi->mb_stored);
		json_add_u64(o, "verified", v.mb_ok);
		json_add_u64(o, "bad", v.mb_bad);
		cJSON_AddItemToObject(root, "problems", v.problems);
		json_add_store(root, v.r, v.path);
		ret = json_emit(root, exit);
	} else {
		puts(line);
		ret = fflush(stdout) ? EXIT_FAIL : exit;
	}
	halite_reader_free(v.r);
	return exit ? exit : ret;
}
