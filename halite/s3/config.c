// SPDX-License-Identifier: MIT
/*
 * Where the client's configuration comes from: the environment first, then
 * the shared credentials and config files, in the order the AWS tools use,
 * so that a machine set up for them works for Halite unchanged.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "s3_internal.h"

/* Retries: 5 attempts, 100 ms doubling to at most 5 s, a few seconds in all. */
#define DEFAULT_ATTEMPTS 5
#define DEFAULT_BACKOFF_MS 100
#define DEFAULT_BACKOFF_CAP_MS 5000

static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/*
 * @key of section @section in the INI file @path, malloc'd in *@out, or
 * NULL when the file, the section or the key is not there. 0, -ENOMEM, or
 * -HALITE_S3_E_CONFIG for a line that is neither a section, a key nor a
 * comment.
 */
static int ini_get(const char *path, const char *section, const char *key, char **out,
		   char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	char line[4096];
	bool in = false;
	unsigned lineno = 0;
	int ret = 0;

	*out = NULL;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char *l = trim(line), *eq;

		lineno++;
		if (!*l || *l == '#' || *l == ';')
			continue;
		if (*l == '[') {
			char *end = strchr(l, ']');

			if (!end) {
				snprintf(err, errlen, "%s:%u: a section line without ']'", path,
					 lineno);
				ret = -HALITE_S3_E_CONFIG;
				break;
			}
			*end = 0;
			in = !strcmp(trim(l + 1), section);
			continue;
		}
		eq = strchr(l, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%u: expected KEY = VALUE or [SECTION]", path,
				 lineno);
			ret = -HALITE_S3_E_CONFIG;
			break;
		}
		*eq = 0;
		if (in && !strcmp(trim(l), key)) {
			free(*out);
			*out = strdup(trim(eq + 1));
			if (!*out) {
				ret = -ENOMEM;
				break;
			}
		}
	}
	fclose(f);
	if (ret) {
		free(*out);
		*out = NULL;
	}
	return ret;
}

/* @var's value, else ~/.aws/@name. */
static char *shared_file(const char *var, const char *name)
{
	const char *home = env("HOME");
	char *p = NULL;

	if (env(var))
		return strdup(env(var));
	if (!home)
		return NULL;
	if (asprintf(&p, "%s/.aws/%s", home, name) < 0)
		return NULL;
	return p;
}

static int dup_env(char **dst, const char *name)
{
	*dst = NULL;
	if (env(name) && !(*dst = strdup(env(name))))
		return -ENOMEM;
	return 0;
}

static int load_credentials(struct halite_s3_config *c, const char *profile, char *err,
			    size_t errlen)
{
	char *path;
	int ret;

	ret = dup_env(&c->access_key, "AWS_ACCESS_KEY_ID");
	if (!ret)
		ret = dup_env(&c->secret_key, "AWS_SECRET_ACCESS_KEY");
	if (!ret)
		ret = dup_env(&c->session_token, "AWS_SESSION_TOKEN");
	if (ret)
		return ret;
	if (c->access_key && c->secret_key)
		return 0;
	if (c->access_key || c->secret_key) {
		snprintf(err, errlen, "%s is set but %s is not",
			 c->access_key ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
			 c->access_key ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
		return -HALITE_S3_E_CONFIG;
	}
	free(c->session_token);
	c->session_token = NULL;
	path = shared_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
	if (!path) {
		snprintf(err, errlen, "no credentials: set AWS_ACCESS_KEY_ID and "
			 "AWS_SECRET_ACCESS_KEY (HOME is not set, so there is no ~/.aws/credentials)");
		return -HALITE_S3_E_CONFIG;
	}
	ret = ini_get(path, profile, "aws_access_key_id", &c->access_key, err, errlen);
	if (!ret)
		ret = ini_get(path, profile, "aws_secret_access_key", &c->secret_key, err, errlen);
	if (!ret)
		ret = ini_get(path, profile, "aws_session_token", &c->session_token, err, errlen);
	if (!ret && access(path, R_OK) < 0) {
		snprintf(err, errlen, "no credentials: set AWS_ACCESS_KEY_ID and "
			 "AWS_SECRET_ACCESS_KEY, or write them to %s (%s)", path, strerror(errno));
		ret = -HALITE_S3_E_CONFIG;
	} else if (!ret && (!c->access_key || !c->secret_key)) {
		snprintf(err, errlen, "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
			 "are not set, and %s has no aws_%s for profile [%s]", path,
			 c->access_key ? "secret_access_key" : "access_key_id", profile);
		ret = -HALITE_S3_E_CONFIG;
	}
	free(path);
	return ret;
}

static int load_region(struct halite_s3_config *c, const char *profile, char *err,
		       size_t errlen)
{
	char *path, *section = NULL;
	int ret;

	ret = dup_env(&c->region, "AWS_REGION");
	if (!ret && !c->region)
		ret = dup_env(&c->region, "AWS_DEFAULT_REGION");
	if (ret || c->region)
		return ret;
	path = shared_file("AWS_CONFIG_FILE", "config");
	/* The config file names profiles "[profile NAME]", all but the default. */
	if (path && asprintf(&section, strcmp(profile, "default") ? "profile %s" : "%s",
			     profile) < 0)
		section = NULL;
	if (path && !section) {
		free(path);
		return -ENOMEM;
	}
	ret = path ? ini_get(path, section, "region", &c->region, err, errlen) : 0;
	if (!ret && !c->region) {
		snprintf(err, errlen, "no region: set AWS_REGION, or region in [%s] of %s",
			 section ? section : "default", path ? path : "~/.aws/config");
		ret = -HALITE_S3_E_CONFIG;
	}
	free(section);
	free(path);
	return ret;
}

static int load_endpoint(struct halite_s3_config *c, char *err, size_t errlen)
{
	const char *addr = env("HALITE_S3_ADDRESSING");
	int ret = dup_env(&c->endpoint, "AWS_ENDPOINT_URL");

	if (ret)
		return ret;
	if (c->endpoint && strncmp(c->endpoint, "http://", 7) &&
	    strncmp(c->endpoint, "https://", 8)) {
		snprintf(err, errlen, "AWS_ENDPOINT_URL '%s' is not an http:// or https:// URL",
			 c->endpoint);
		return -HALITE_S3_E_CONFIG;
	}
	if (!addr)
		c->addressing = HALITE_S3_ADDR_AUTO;
	else if (!strcmp(addr, "path"))
		c->addressing = HALITE_S3_ADDR_PATH;
	else if (!strcmp(addr, "virtual"))
		c->addressing = HALITE_S3_ADDR_VIRTUAL;
	else {
		snprintf(err, errlen, "HALITE_S3_ADDRESSING is '%s': expected path or virtual",
			 addr);
		return -HALITE_S3_E_CONFIG;
	}
	return 0;
}

/* HALITE_S3_RETRY_FOR: seconds a request keeps being retried (0..86400). */
static int load_retry_for(struct halite_s3_config *c, char *err, size_t errlen)
{
	const char *v = env("HALITE_S3_RETRY_FOR");
	char *end;
	unsigned long n;

	if (!v)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || end == v || *end || n > 86400 || v[0] == '-') {
		snprintf(err, errlen, "HALITE_S3_RETRY_FOR is '%s': expected seconds, 0 to 86400", v);
		return -HALITE_S3_E_CONFIG;
	}
	c->retry_for_ms = (unsigned)n * 1000;
	c->retry_for_set = true;
	return 0;
}

int halite_s3_config_load(struct halite_s3_config *c, char *err, size_t errlen)
{
	const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
	int ret;

	memset(c, 0, sizeof(*c));
	c->max_attempts = DEFAULT_ATTEMPTS;
	c->backoff_base_ms = DEFAULT_BACKOFF_MS;
	c->backoff_cap_ms = DEFAULT_BACKOFF_CAP_MS;
	ret = load_retry_for(c, err, errlen);
	if (!ret)
		ret = load_credentials(c, profile, err, errlen);
	if (!ret)
		ret = load_region(c, profile, err, errlen);
	if (!ret)
		ret = load_endpoint(c, err, errlen);
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (ret)
		halite_s3_config_clear(c);
	return ret;
}

void halite_s3_config_clear(struct halite_s3_config *c)
{
	free(c->endpoint);
	free(c->region);
	free(c->access_key);
	free(c->secret_key);
	free(c->session_token);
	memset(c, 0, sizeof(*c));
}

unsigned halite_s3_backoff_ms(unsigned attempt, unsigned base_ms, unsigned cap_ms, uint32_t rnd)
{
	uint64_t ceiling = base_ms;

	for (unsigned i = 1; i < attempt && ceiling < cap_ms; i++)
		ceiling *= 2;
	if (ceiling > cap_ms)
		ceiling = cap_ms;
	return (unsigned)((uint64_t)rnd * (ceiling + 1) >> 32);
}
