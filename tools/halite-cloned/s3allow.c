// SPDX-License-Identifier: MIT
/*
 * halite-cloned: which s3:// snapshots a caller may name. A template's
 * snapshot may be an object, s3://BUCKET/KEY, read with the daemon's own
 * credentials (its AWS_* environment, ~/.aws): so a caller must not reach
 * every bucket those credentials can read. The operator lists what may be
 * read, --s3-allow BUCKET[/PREFIX]; a URL is parsed and checked by the S3
 * client's own rules (halite_s3_parse_url), compared as a bucket and a key,
 * and never becomes a host path. Without an --s3-allow, every URL is refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cloned.h"
#include "s3.h"

bool s3allow_is_url(const char *snapshot)
{
	return !strncmp(snapshot, "s3://", 5);
}

int s3allow_add(struct cloned *d, const char *spec, char *err, size_t errlen)
{
	const char *slash = strchr(spec, '/');
	size_t blen = slash ? (size_t)(slash - spec) : strlen(spec);
	char *url = NULL, *bucket = NULL, *key = NULL, why[512];
	struct s3allow *a;
	int ret;

	/* The bucket checked as a URL's would be: a name the client would refuse allows nothing. */
	if (asprintf(&url, "s3://%.*s/k", (int)blen, spec) < 0) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ret = halite_s3_parse_url(url, &bucket, &key, why, sizeof(why));
	free(url);
	free(key);
	if (ret) {
		free(bucket);
		snprintf(err, errlen, "--s3-allow %s: want BUCKET or BUCKET/PREFIX (%s)", spec,
			 ret == -ENOMEM ? "out of memory" : "a bad bucket name");
		return ret == -ENOMEM ? -ENOMEM : -EINVAL;
	}
	a = calloc(1, sizeof(*a));
	/*
	 * A prefix is a folder: "snap" allows snap/..., not snapshots-old/...
	 * (a text prefix would). The whole bucket when none is given.
	 */
	if (a && slash && slash[1])
		ret = asprintf(&a->prefix, "%s%s", slash + 1,
			       slash[strlen(slash) - 1] == '/' ? "" : "/") < 0 ? -ENOMEM : 0;
	else if (a)
		a->prefix = strdup("");
	if (!a || ret || !a->prefix) {
		free(a);
		free(bucket);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	a->bucket = bucket;
	a->next = d->s3allow;
	d->s3allow = a;
	return 0;
}

void s3allow_free_all(struct cloned *d)
{
	while (d->s3allow) {
		struct s3allow *a = d->s3allow;

		d->s3allow = a->next;
		free(a->bucket);
		free(a->prefix);
		free(a);
	}
}

unsigned s3allow_check(const struct cloned *d, const char *url, char *err, size_t errlen)
{
	char *bucket = NULL, *key = NULL, why[512];
	const struct s3allow *a;
	int ret;

	if (!d->s3allow) {
		snprintf(err, errlen, "snapshot %.600s: this daemon reads no object store: start "
			 PROG " with --s3-allow BUCKET[/PREFIX] to allow one", url);
		return 403;
	}
	ret = halite_s3_parse_url(url, &bucket, &key, why, sizeof(why));
	if (ret) {
		snprintf(err, errlen, "field 'snapshot': %s", ret == -ENOMEM ? "out of memory" : why);
		return ret == -ENOMEM ? 500 : 400;
	}
	for (a = d->s3allow; a; a = a->next)
		if (!strcmp(a->bucket, bucket) && !strncmp(key, a->prefix, strlen(a->prefix)))
			break;
	free(bucket);
	free(key);
	if (!a) {
		snprintf(err, errlen, "snapshot %.600s is not in an object-store location this "
			 "daemon allows (its --s3-allow options)", url);
		return 403;
	}
	return 0;
}
