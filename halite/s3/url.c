// SPDX-License-Identifier: MIT
/*
 * s3://BUCKET/KEY: parsing and the rules a bucket name follows, and the
 * percent-encoding of keys and query values in request URLs.
 *
 * The encoding is SigV4's: every byte outside RFC 3986's unreserved set,
 * upper-case hex. libcurl signs the path and query as they are written, so
 * they must already be in the canonical form the store computes.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_internal.h"

static int url_error(char *err, size_t errlen, const char *fmt, const char *url)
{
	snprintf(err, errlen, fmt, url);
	return -HALITE_S3_E_URL;
}

static bool looks_like_ipv4(const char *b, size_t n)
{
	int dots = 0;

	for (size_t i = 0; i < n; i++) {
		if (b[i] == '.')
			dots++;
		else if (!isdigit((unsigned char)b[i]))
			return false;
	}
	return dots == 3;
}

/* The general-purpose bucket rules; the reason in @why, or NULL when the name is good. */
static const char *bucket_problem(const char *b, size_t n)
{
	if (n < 3 || n > 63)
		return "a bucket name is 3 to 63 characters";
	for (size_t i = 0; i < n; i++)
		if (!islower((unsigned char)b[i]) && !isdigit((unsigned char)b[i]) &&
		    b[i] != '.' && b[i] != '-')
			return "a bucket name holds only a-z, 0-9, '.' and '-'";
	if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
		return "a bucket name starts and ends with a letter or digit";
	if (memmem(b, n, "..", 2))
		return "a bucket name has no two adjacent dots";
	if (looks_like_ipv4(b, n))
		return "a bucket name is not an IP address";
	return NULL;
}

int halite_s3_parse_url(const char *url, char **bucket, char **key, char *err, size_t errlen)
{
	const char *b, *slash, *why;
	char *bk, *ky;

	if (strncmp(url, "s3://", 5))
		return url_error(err, errlen, "'%s' is not an s3://BUCKET/KEY URL", url);
	b = url + 5;
	slash = strchr(b, '/');
	if (!slash)
		return url_error(err, errlen, "'%s' names no key: expected s3://BUCKET/KEY", url);
	if (!slash[1])
		return url_error(err, errlen, "'%s' has an empty key: expected s3://BUCKET/KEY",
				 url);
	why = bucket_problem(b, (size_t)(slash - b));
	if (why) {
		snprintf(err, errlen, "'%s': bad bucket name '%.*s': %s", url,
			 (int)(slash - b), b, why);
		return -HALITE_S3_E_URL;
	}
	/* S3 keys are at most 1024 bytes of UTF-8; control characters would not survive HTTP. */
	if (strlen(slash + 1) > 1024)
		return url_error(err, errlen, "'%s': the key is longer than 1024 bytes", url);
	for (const char *p = slash + 1; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return url_error(err, errlen, "'%s': the key holds a control character",
					 url);
	/*
	 * A "." or ".." segment: an HTTP client or a store may resolve it
	 * ("a/../b" read as "b"), so the key read would not be the key checked
	 * (a daemon's allowed prefix, a log line). S3 keeps such keys literally;
	 * this client names none.
	 */
	for (const char *seg = slash + 1; seg; seg = strchr(seg, '/') ? strchr(seg, '/') + 1 : NULL) {
		size_t n = strcspn(seg, "/");

		if ((n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.')) {
			snprintf(err, errlen, "'%s': the key has a '%.*s' segment, which the "
				 "request's path would not keep", url, (int)n, seg);
			return -HALITE_S3_E_URL;
		}
	}
	bk = strndup(b, (size_t)(slash - b));
	ky = strdup(slash + 1);
	if (!bk || !ky) {
		free(bk);
		free(ky);
		return -ENOMEM;
	}
	*bucket = bk;
	*key = ky;
	return 0;
}

static bool unreserved(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static char *escape(const char *s, bool keep_slash, const char *prefix)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t pl = strlen(prefix);
	char *out = malloc(pl + strlen(s) * 3 + 1), *o;

	if (!out)
		return NULL;
	memcpy(out, prefix, pl);
	o = out + pl;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (unreserved(*p) || (keep_slash && *p == '/')) {
			*o++ = (char)*p;
		} else {
			*o++ = '%';
			*o++ = hex[*p >> 4];
			*o++ = hex[*p & 15];
		}
	}
	*o = 0;
	return out;
}

char *s3_escape_key(const char *key)
{
	return escape(key, true, "/");
}

char *s3_escape_query(const char *s)
{
	return escape(s, false, "");
}
