// SPDX-License-Identifier: MIT
/*
 * What push and pull share: their transfer options, a client for an s3://
 * URL, configured from the environment and the shared AWS files, and their
 * failures said as one sentence each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "s3cmd.h"

int s3cmd_option(int ch, struct s3cmd_opts *o)
{
	switch (ch) {
	case OPT_JSON:
		run_set_json();
		return 0;
	case S3CMD_OPT_PART_SIZE:
		if (halite_parse_size(optarg, &o->part_size) || o->part_size < o->min_part ||
		    o->part_size > o->max_part)
			return usage_hint("--part-size '%s': expected a size from %s", optarg,
					  o->part_range);
		return 0;
	case 'j':
		if (parse_int(optarg, 1, 64, &o->jobs))
			return usage_hint("--jobs '%s': expected 1 to 64", optarg);
		return 0;
	case S3CMD_OPT_ANY:
		o->any = true;
		return 0;
	case OPT_PROGRESS:
		return progress_parse(optarg, &o->progress) ? EXIT_USAGE : 0;
	default:
		return -1;
	}
}

int s3cmd_open(struct s3cmd *c, const char *url, unsigned jobs)
{
	struct halite_s3_config cfg;
	char err[512];
	int ret;

	memset(c, 0, sizeof(*c));
	c->url = url;
	ret = halite_s3_parse_url(url, &c->bucket, &c->key, err, sizeof(err));
	if (ret == -HALITE_S3_E_URL)
		return usage_error("%s", err);
	if (ret) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	ret = halite_s3_config_load(&cfg, err, sizeof(err));
	if (ret) {
		errorf("%s", err);
		s3cmd_close(c);
		return EXIT_FAIL;
	}
	ret = halite_s3_open(&c->s, &cfg, c->bucket);
	halite_s3_config_clear(&cfg);
	if (ret) {
		errorf("%s: %s", url, halite_strerror(ret));
		s3cmd_close(c);
		return EXIT_FAIL;
	}
	halite_s3_set_jobs(c->s, jobs);
	c->start = halite_now_s();
	return 0;
}

int s3cmd_fail(struct s3cmd *c, int err)
{
	const char *msg = halite_s3_errmsg(c->s);

	if (msg[0])
		errorf("%s", msg);
	else
		errorf("%s: %s", c->url, halite_strerror(err));
	return EXIT_FAIL;
}

void s3cmd_json_stats(struct s3cmd *c, cJSON *root)
{
	struct halite_s3_stats st;

	halite_s3_get_stats(c->s, &st);
	json_add_u64(root, "requests", st.requests);
	json_add_u64(root, "retries", st.retries);
	cJSON_AddNumberToObject(root, "seconds", halite_now_s() - c->start);
}

int s3cmd_check_snapshot(const char *path, const char *name, const char *hint)
{
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_reader *r;
	char errbuf[512] = "";
	int ret;

	ro.errbuf = errbuf;
	ro.errbuf_len = sizeof(errbuf);
	ret = halite_reader_open(&r, path, &ro);
	if (ret < 0) {
		/* The hint only where the file is there but is no snapshot. */
		errorf("%s: %s%s%s%s", name,
		       errbuf[0] ? strip_path(path, errbuf) : halite_strerror(ret),
		       ret <= -HALITE_E_BASE ? " (" : "", ret <= -HALITE_E_BASE ? hint : "",
		       ret <= -HALITE_E_BASE ? ")" : "");
		return exit_code_for(ret) == EXIT_USAGE ? EXIT_USAGE : EXIT_BAD;
	}
	halite_reader_free(r);
	return 0;
}

void s3cmd_close(struct s3cmd *c)
{
	halite_s3_close(c->s);
	free(c->bucket);
	free(c->key);
	c->s = NULL;
	c->bucket = c->key = NULL;
}
