// SPDX-License-Identifier: MIT
/*
 * halite_s3 without a store: s3:// URLs, the configuration from the
 * environment and real shared files, the XML the store answers with, the
 * key encoding SigV4 signs, the backoff schedule, retries against a port
 * nobody listens on (real libcurl, real connection refusals), and the
 * disks' manifest (s3_disks.h): written, read back, every bad field refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "s3_internal.h"
#include "s3_disks.h"

static void url_ok(const char *url, const char *bucket, const char *key)
{
	char *b = NULL, *k = NULL, err[2048] = "";

	assert_int_equal(halite_s3_parse_url(url, &b, &k, err, sizeof(err)), 0);
	assert_string_equal(b, bucket);
	assert_string_equal(k, key);
	free(b);
	free(k);
}

static void url_bad(const char *url, const char *why)
{
	char *b = NULL, *k = NULL, err[2048] = "";

	assert_int_equal(halite_s3_parse_url(url, &b, &k, err, sizeof(err)), -HALITE_S3_E_URL);
	assert_null(b);
	assert_null(k);
	if (!strstr(err, why))
		fail_msg("'%s': message '%s' lacks '%s'", url, err, why);
}

static void test_url(void **state)
{
	url_ok("s3://bkt/key", "bkt", "key");
	url_ok("s3://my.bucket-1/a/b/c.hlt", "my.bucket-1", "a/b/c.hlt");
	url_ok("s3://abc/dir/", "abc", "dir/");
	url_ok("s3://abc/a..b/.x/..y", "abc", "a..b/.x/..y"); /* dots inside a name are fine */
	url_bad("http://bkt/key", "not an s3://BUCKET/KEY URL");
	url_bad("s3://bkt", "names no key");
	url_bad("s3://bkt/", "empty key");
	url_bad("s3://ab/k", "3 to 63 characters");
	url_bad("s3://Bucket/k", "only a-z, 0-9");
	url_bad("s3://b_b_b/k", "only a-z, 0-9");
	url_bad("s3://-bkt/k", "starts and ends");
	url_bad("s3://bkt-/k", "starts and ends");
	url_bad("s3://a..b/k", "adjacent dots");
	url_bad("s3://192.168.1.1/k", "not an IP address");
	url_bad("s3://bkt/a\nb", "control character");
	url_bad("s3://bkt/snap/../other.hlt", "a '..' segment");
	url_bad("s3://bkt/../other.hlt", "a '..' segment");
	url_bad("s3://bkt/snap/./x.hlt", "a '.' segment");
	url_bad("s3://bkt/snap/..", "a '..' segment");
	{
		char big[1200] = "s3://bkt/";

		memset(big + 9, 'k', 1025);
		url_bad(big, "longer than 1024");
	}
	{
		char b64[80] = "s3://";

		memset(b64 + 5, 'a', 64);
		strcat(b64, "/k");
		url_bad(b64, "3 to 63 characters");
	}
}

static void test_escape(void **state)
{
	char *k = s3_escape_key("a b/c+d~e_f.g-h/\xc3\xa9%"), *q = s3_escape_query("x/y=z~");

	assert_string_equal(k, "/a%20b/c%2Bd~e_f.g-h/%C3%A9%25");
	assert_string_equal(q, "x%2Fy%3Dz~");
	free(k);
	free(q);
}

static void test_xml(void **state)
{
	const char *doc = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>"
			  "<Message>The key &quot;a&amp;b&quot; &lt;is&gt; gone</Message>"
			  "<Part><ETag>&quot;1&quot;</ETag></Part><Part><ETag>&#34;2&#x22;</ETag></Part>"
			  "</Error>";
	char out[64];
	size_t pos = 0;

	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "Code", out, sizeof(out)), 0);
	assert_string_equal(out, "NoSuchKey");
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "Message", out, sizeof(out)), 0);
	assert_string_equal(out, "The key \"a&b\" <is> gone");
	/* Successive elements of one name, from where the last ended. */
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "ETag", out, sizeof(out)), 0);
	assert_string_equal(out, "\"1\"");
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "ETag", out, sizeof(out)), 0);
	assert_string_equal(out, "\"2\"");
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "ETag", out, sizeof(out)), -ENOENT);
	pos = 0;
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "UploadId", out, sizeof(out)), -ENOENT);
	/* Cut to the buffer, never past it; an unclosed element is not there. */
	pos = 0;
	assert_int_equal(s3_xml_tag(doc, strlen(doc), &pos, "Message", out, 8), 0);
	assert_string_equal(out, "The key");
	pos = 0;
	assert_int_equal(s3_xml_tag("<Code>abc", 9, &pos, "Code", out, sizeof(out)), -ENOENT);
}

static void test_backoff(void **state)
{
	/* The ceiling doubles from the base to the cap; the delay is within [0, ceiling]. */
	assert_int_equal(halite_s3_backoff_ms(1, 100, 5000, 0), 0);
	assert_int_equal(halite_s3_backoff_ms(1, 100, 5000, UINT32_MAX), 100);
	assert_int_equal(halite_s3_backoff_ms(2, 100, 5000, UINT32_MAX), 200);
	assert_int_equal(halite_s3_backoff_ms(3, 100, 5000, UINT32_MAX), 400);
	assert_int_equal(halite_s3_backoff_ms(6, 100, 5000, UINT32_MAX), 3200);
	assert_int_equal(halite_s3_backoff_ms(7, 100, 5000, UINT32_MAX), 5000);
	assert_int_equal(halite_s3_backoff_ms(40, 100, 5000, UINT32_MAX), 5000);
	assert_int_equal(halite_s3_backoff_ms(3, 100, 5000, 1u << 31), 200);
	for (uint32_t r = 1; r < 1000000; r += 7919)
		assert_true(halite_s3_backoff_ms(4, 100, 5000, r * 4093u) <= 800);
}

/* ---- configuration ---- */

static char tmpdir[] = "/tmp/halite-s3-unit.XXXXXX";

static void clear_env(void)
{
	static const char *const vars[] = {
		"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
		"AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_PROFILE",
		"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HALITE_S3_ADDRESSING",
		"HALITE_S3_RETRY_FOR",
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	setenv("HOME", tmpdir, 1);
}

static void write_file(const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int mkdir_p_aws(void)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/.aws", tmpdir);
	return mkdir(path, 0700);
}

static void config_bad(const char *why)
{
	struct halite_s3_config c;
	char err[512] = "";

	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), -HALITE_S3_E_CONFIG);
	if (!strstr(err, why))
		fail_msg("message '%s' lacks '%s'", err, why);
	assert_null(c.access_key);
}

static void test_config_env(void **state)
{
	struct halite_s3_config c;
	char err[512] = "";

	clear_env();
	config_bad("no credentials");
	setenv("AWS_ACCESS_KEY_ID", "AK", 1);
	config_bad("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
	setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
	config_bad("no region: set AWS_REGION");
	setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
	setenv("AWS_SESSION_TOKEN", "TOK", 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_string_equal(c.access_key, "AK");
	assert_string_equal(c.secret_key, "SK");
	assert_string_equal(c.session_token, "TOK");
	assert_string_equal(c.region, "eu-west-3");
	assert_null(c.endpoint);
	assert_int_equal(c.addressing, HALITE_S3_ADDR_AUTO);
	assert_int_equal(c.max_attempts, 5);
	halite_s3_config_clear(&c);
	/* AWS_REGION wins over AWS_DEFAULT_REGION. */
	setenv("AWS_REGION", "us-west-2", 1);
	setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000", 1);
	setenv("HALITE_S3_ADDRESSING", "virtual", 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_string_equal(c.region, "us-west-2");
	assert_string_equal(c.endpoint, "http://127.0.0.1:9000");
	assert_int_equal(c.addressing, HALITE_S3_ADDR_VIRTUAL);
	halite_s3_config_clear(&c);
	setenv("HALITE_S3_ADDRESSING", "sideways", 1);
	config_bad("HALITE_S3_ADDRESSING is 'sideways'");
	unsetenv("HALITE_S3_ADDRESSING");
	/* Unset: attempts alone, and the restore's reads pick their own (io_s3.c). */
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_int_equal(c.retry_for_ms, 0);
	assert_false(c.retry_for_set);
	halite_s3_config_clear(&c);
	setenv("HALITE_S3_RETRY_FOR", "90", 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_int_equal(c.retry_for_ms, 90000);
	assert_true(c.retry_for_set);
	halite_s3_config_clear(&c);
	setenv("HALITE_S3_RETRY_FOR", "0", 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_int_equal(c.retry_for_ms, 0);
	assert_true(c.retry_for_set);
	halite_s3_config_clear(&c);
	setenv("HALITE_S3_RETRY_FOR", "-1", 1);
	config_bad("HALITE_S3_RETRY_FOR is '-1': expected seconds, 0 to 86400");
	setenv("HALITE_S3_RETRY_FOR", "86401", 1);
	config_bad("HALITE_S3_RETRY_FOR is '86401'");
	setenv("HALITE_S3_RETRY_FOR", "1m", 1);
	config_bad("HALITE_S3_RETRY_FOR is '1m'");
	unsetenv("HALITE_S3_RETRY_FOR");
	setenv("AWS_ENDPOINT_URL", "127.0.0.1:9000", 1);
	config_bad("AWS_ENDPOINT_URL '127.0.0.1:9000' is not an http:// or https:// URL");
}

static void test_config_files(void **state)
{
	struct halite_s3_config c;
	char err[512] = "", path[256];

	clear_env();
	config_bad(".aws/credentials");
	assert_int_equal(mkdir_p_aws(), 0);
	write_file(".aws/credentials", "# a comment\n[default]\naws_access_key_id = DEF\n"
				       "aws_secret_access_key=DEFSECRET\n\n[work]\n"
				       "  aws_access_key_id = WORK  \naws_secret_access_key = WS\n"
				       "aws_session_token = WT\n[half]\naws_access_key_id = H\n");
	config_bad("no region");
	write_file(".aws/config", "[default]\nregion = ap-south-1\n[profile work]\nregion=eu-north-1\n");
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_string_equal(c.access_key, "DEF");
	assert_string_equal(c.secret_key, "DEFSECRET");
	assert_null(c.session_token);
	assert_string_equal(c.region, "ap-south-1");
	halite_s3_config_clear(&c);

	setenv("AWS_PROFILE", "work", 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_string_equal(c.access_key, "WORK");
	assert_string_equal(c.secret_key, "WS");
	assert_string_equal(c.session_token, "WT");
	assert_string_equal(c.region, "eu-north-1");
	halite_s3_config_clear(&c);

	setenv("AWS_PROFILE", "half", 1);
	config_bad("has no aws_secret_access_key for profile [half]");

	/* The variables name other files. */
	setenv("AWS_PROFILE", "other", 1);
	write_file("creds2", "[other]\naws_access_key_id=O\naws_secret_access_key=OS\n");
	write_file("conf2", "[profile other]\nregion = sa-east-1\n");
	snprintf(path, sizeof(path), "%s/creds2", tmpdir);
	setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
	snprintf(path, sizeof(path), "%s/conf2", tmpdir);
	setenv("AWS_CONFIG_FILE", path, 1);
	assert_int_equal(halite_s3_config_load(&c, err, sizeof(err)), 0);
	assert_string_equal(c.access_key, "O");
	assert_string_equal(c.region, "sa-east-1");
	halite_s3_config_clear(&c);

	write_file("creds2", "[other]\nthis line is wrong\n");
	config_bad("creds2:2: expected KEY = VALUE or [SECTION]");
	write_file("creds2", "[other\n");
	config_bad("creds2:1: a section line without ']'");
}

/* Real refusals from a loopback port with no listener: each attempt is a request, bounded. */
static void test_retry_network(void **state)
{
	struct halite_s3_config c = {
		.endpoint = "http://127.0.0.1:1", .region = "us-east-1", .access_key = "a",
		.secret_key = "b", .max_attempts = 3, .backoff_base_ms = 5, .backoff_cap_ms = 20,
	};
	struct halite_s3_object o;
	struct halite_s3_stats st;
	struct halite_s3 *s;

	assert_int_equal(halite_s3_open(&s, &c, "bkt"), 0);
	assert_int_equal(halite_s3_head(s, "k", &o), -HALITE_S3_E_NETWORK);
	assert_non_null(strstr(halite_s3_errmsg(s), "HEAD http://127.0.0.1:1/bkt/k"));
	assert_non_null(strstr(halite_s3_errmsg(s), "(after 3 attempts in "));
	halite_s3_get_stats(s, &st);
	assert_int_equal(st.requests, 3);
	assert_int_equal(st.retries, 2);
	assert_string_equal(halite_s3_strerror(-HALITE_S3_E_CHANGED),
			    "the object changed: its ETag is not the one expected");
	assert_string_equal(halite_strerror(-HALITE_S3_E_CHANGED),
			    halite_s3_strerror(-HALITE_S3_E_CHANGED));
	assert_string_equal(halite_s3_strerror(-ENOENT), strerrordesc_np(ENOENT));
	halite_s3_close(s);
	halite_s3_close(NULL);

	/*
	 * retry_for: one attempt allowed, yet retried for 400 ms from the first:
	 * a store gone for a while is waited for. Backoff at most 20 ms, so
	 * several attempts, and the failure comes no sooner.
	 */
	c.max_attempts = 1;
	c.retry_for_ms = 400;
	assert_int_equal(halite_s3_open(&s, &c, "bkt"), 0);
	{
		struct timespec a, b;
		double secs;

		clock_gettime(CLOCK_MONOTONIC, &a);
		assert_int_equal(halite_s3_head(s, "k", &o), -HALITE_S3_E_NETWORK);
		clock_gettime(CLOCK_MONOTONIC, &b);
		secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
		halite_s3_get_stats(s, &st);
		assert_true(secs >= 0.4);
		assert_true(st.requests >= 3);
		assert_int_equal(st.retries, st.requests - 1);
	}
	/* Set on the handle: from now on, attempts alone. */
	halite_s3_set_retry(s, 0, 20);
	assert_int_equal(halite_s3_head(s, "k", &o), -HALITE_S3_E_NETWORK);
	assert_non_null(strstr(halite_s3_errmsg(s), "HEAD http://127.0.0.1:1/bkt/k: "));
	assert_null(strstr(halite_s3_errmsg(s), "attempts"));
	halite_s3_close(s);
}

#define SHA "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define UUID "00112233445566778899aabbccddeeff"

/* A manifest of one disk with @field's text replaced by @value (NULL: as is). */
static char *manifest_with(const char *field, const char *value)
{
	char *s = NULL;
	const char *idx = "1", *size = "\"393216\"", *sha = "\"" SHA "\"", *uuid = "\"" UUID "\"";

	if (field && !strcmp(field, "index"))
		idx = value;
	if (field && !strcmp(field, "size"))
		size = value;
	if (field && !strcmp(field, "sha256"))
		sha = value;
	if (field && !strcmp(field, "uuid"))
		uuid = value;
	assert_true(asprintf(&s, "{\"halite_disks\": 1, \"snapshot_uuid\": %s, \"disks\": "
			     "[{\"index\": %s, \"name\": \"disk0\", \"format\": \"qcow2\", "
			     "\"virtual_size\": \"67108864\", \"size\": %s, \"etag\": "
			     "\"\\\"abc\\\"\", \"sha256\": %s}]}", uuid, idx, size, sha) > 0);
	return s;
}

static void manifest_bad(const char *field, const char *value, const char *says)
{
	struct halite_s3_disks m;
	char err[256] = "", *s = manifest_with(field, value);

	assert_int_equal(halite_s3_disks_parse(s, strlen(s), &m, err, sizeof(err)), -EPROTO);
	if (!strstr(err, says))
		fail_msg("%s=%s: '%s' does not say '%s'", field, value, err, says);
	free(s);
}

static void test_disks_manifest(void **state)
{
	struct halite_s3_disks m, back;
	char err[256] = "", *s = manifest_with(NULL, NULL), *k;

	assert_int_equal(halite_s3_disks_parse(s, strlen(s), &m, err, sizeof(err)), 0);
	free(s);
	assert_int_equal(m.n, 1);
	assert_int_equal(m.d[0].index, 1);
	assert_true(m.d[0].size == 393216 && m.d[0].vsize == 64 << 20);
	assert_string_equal(m.d[0].etag, "\"abc\"");
	assert_string_equal(m.d[0].sha256, SHA);
	assert_int_equal(m.uuid[0], 0x00);
	assert_int_equal(m.uuid[15], 0xff);
	/* Written and read back: the same manifest. */
	s = halite_s3_disks_json(&m);
	assert_non_null(s);
	assert_int_equal(halite_s3_disks_parse(s, strlen(s), &back, err, sizeof(err)), 0);
	free(s);
	assert_memory_equal(&m, &back, sizeof(m));

	manifest_bad("index", "32", "index");
	manifest_bad("index", "-1", "index");
	manifest_bad("index", "1.5", "index");
	manifest_bad("index", "\"1\"", "index");
	manifest_bad("size", "393216", "sizes");
	manifest_bad("size", "\"0\"", "sizes");
	manifest_bad("size", "\"12x\"", "sizes");
	manifest_bad("sha256", "\"" SHA "0\"", "sha256");
	manifest_bad("sha256", "\"0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef\"",
		     "sha256");
	manifest_bad("uuid", "\"../../etc\"", "snapshot_uuid");
	s = strdup("[1, 2]");
	assert_int_equal(halite_s3_disks_parse(s, strlen(s), &m, err, sizeof(err)), -EPROTO);
	free(s);
	/* One index twice. */
	assert_true(asprintf(&s, "{\"halite_disks\": 1, \"snapshot_uuid\": \"" UUID "\", "
			     "\"disks\": [%s, %s]}",
			     "{\"index\": 0, \"name\": \"a\", \"format\": \"qcow2\", \"virtual_size\": "
			     "\"1\", \"size\": \"1\", \"etag\": \"e\", \"sha256\": \"" SHA "\"}",
			     "{\"index\": 0, \"name\": \"b\", \"format\": \"qcow2\", \"virtual_size\": "
			     "\"1\", \"size\": \"1\", \"etag\": \"e\", \"sha256\": \"" SHA "\"}") > 0);
	assert_int_equal(halite_s3_disks_parse(s, strlen(s), &m, err, sizeof(err)), -EPROTO);
	assert_non_null(strstr(err, "twice"));
	free(s);
	/* Keys from the index alone. */
	k = halite_s3_disk_key("vm/a.hlt", 3);
	assert_string_equal(k, "vm/a.hlt.disks/3.qcow2");
	free(k);
	k = halite_s3_disk_key("vm/a.hlt", -1);
	assert_string_equal(k, "vm/a.hlt.disks/manifest.json");
	free(k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url),
		cmocka_unit_test(test_disks_manifest),
		cmocka_unit_test(test_escape),
		cmocka_unit_test(test_xml),
		cmocka_unit_test(test_backoff),
		cmocka_unit_test(test_config_env),
		cmocka_unit_test(test_config_files),
		cmocka_unit_test(test_retry_network),
	};
	int ret;

	if (!mkdtemp(tmpdir))
		return 1;
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
		if (system(cmd))
			ret = ret ? ret : 1;
	}
	return ret;
}
