// SPDX-License-Identifier: MIT
/*
 * halite_s3 against a real S3 store (run_with_store.sh starts it and
 * exports its endpoint, key, region and HALITE_TEST_BUCKET): bytes put are
 * the bytes got, whole and by ranges, one and many at once; a replaced
 * object fails a GET by its old ETag with HALITE_S3_E_CHANGED; a missing
 * key, bad credentials and a wrong Content-MD5 fail with their own codes and
 * the store's words; a multipart upload lists, completes and aborts; and
 * requests reuse their connections.
 *
 * Exit 0 pass, 1 fail. Random bytes from HALITE_TEST_SEED, printed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "s3_internal.h"

static int fails;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                      \
			fputc('\n', stderr);                               \
			fails++;                                           \
		}                                                          \
	} while (0)

static uint64_t rng;

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (uint8_t)(rng >> 56);
	}
}

static struct halite_s3 *open_client(const char *secret)
{
	struct halite_s3_config c;
	struct halite_s3 *s;
	char err[512];
	int ret = halite_s3_config_load(&c, err, sizeof(err));

	if (ret) {
		fprintf(stderr, "FAIL: config: %s\n", err);
		exit(1);
	}
	if (secret) {
		free(c.secret_key);
		c.secret_key = strdup(secret);
	}
	c.backoff_base_ms = 20;
	ret = halite_s3_open(&s, &c, getenv("HALITE_TEST_BUCKET"));
	halite_s3_config_clear(&c);
	if (ret) {
		fprintf(stderr, "FAIL: open: %s\n", halite_strerror(ret));
		exit(1);
	}
	return s;
}

static void test_objects(struct halite_s3 *s)
{
	enum { SIZE = 300 * 1024 + 17, NR = 24, RLEN = 5000 };
	uint8_t *data = malloc(SIZE), *data2 = malloc(SIZE), *buf = malloc(SIZE);
	struct halite_s3_range r[NR];
	struct halite_s3_object o, o2;
	char hex[40], quoted[44], path[] = "/tmp/halite-s3-get.XXXXXX";
	int64_t got;
	int ret, fd;

	fill_random(data, SIZE);
	fill_random(data2, SIZE);
	ret = halite_s3_put(s, "obj/a b+c", data, SIZE);
	CHECK(ret == 0, "put: %s", halite_s3_errmsg(s));
	ret = halite_s3_head(s, "obj/a b+c", &o);
	CHECK(ret == 0, "head: %s", halite_s3_errmsg(s));
	s3_md5(data, SIZE, NULL, hex);
	snprintf(quoted, sizeof(quoted), "\"%s\"", hex);
	CHECK(o.size == SIZE, "head size %" PRIu64, o.size);
	CHECK(!strcmp(o.etag, quoted), "head etag %s, want %s", o.etag, quoted);

	got = halite_s3_get_range(s, "obj/a b+c", 1000, RLEN, buf, o.etag);
	CHECK(got == RLEN && !memcmp(buf, data + 1000, RLEN), "range: %" PRId64 " %s", got,
	      halite_s3_errmsg(s));
	/* At the end: fewer bytes than asked. */
	got = halite_s3_get_range(s, "obj/a b+c", SIZE - 10, 100, buf, NULL);
	CHECK(got == 10 && !memcmp(buf, data + SIZE - 10, 10), "tail: %" PRId64, got);

	/* Many at once, in a scattered order, each into its own buffer. */
	halite_s3_set_jobs(s, 4);
	for (int i = 0; i < NR; i++) {
		r[i].off = (uint64_t)((i * 7919) % (SIZE - RLEN));
		r[i].len = RLEN;
		r[i].buf = malloc(RLEN);
	}
	ret = halite_s3_get_ranges(s, "obj/a b+c", r, NR, o.etag);
	CHECK(ret == 0, "ranges: %s", halite_s3_errmsg(s));
	for (int i = 0; i < NR; i++) {
		CHECK(r[i].got == RLEN && !memcmp(r[i].buf, data + r[i].off, RLEN), "range %d", i);
		free(r[i].buf);
	}

	fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	ret = halite_s3_get_to_fd(s, "obj/a b+c", fd, &o2);
	CHECK(ret == 0 && o2.size == SIZE && !strcmp(o2.etag, o.etag), "get_to_fd: %s",
	      halite_s3_errmsg(s));
	CHECK(pread(fd, buf, SIZE, 0) == SIZE && !memcmp(buf, data, SIZE), "get_to_fd bytes");
	close(fd);
	unlink(path);

	/* Replaced: the old ETag names an object that is gone. */
	ret = halite_s3_put(s, "obj/a b+c", data2, SIZE);
	CHECK(ret == 0, "put again: %s", halite_s3_errmsg(s));
	got = halite_s3_get_range(s, "obj/a b+c", 0, RLEN, buf, o.etag);
	CHECK(got == -HALITE_S3_E_CHANGED, "stale etag: %" PRId64 " %s", got, halite_s3_errmsg(s));
	CHECK(strstr(halite_s3_errmsg(s), "HTTP 412"), "412 message: %s", halite_s3_errmsg(s));
	got = halite_s3_get_range(s, "obj/a b+c", 0, RLEN, buf, NULL);
	CHECK(got == RLEN && !memcmp(buf, data2, RLEN), "new bytes");

	/* Missing key: HEAD (no body) and GET (the store's XML) both say so. */
	ret = halite_s3_head(s, "no/such/key", &o);
	CHECK(ret == -HALITE_S3_E_NO_SUCH_KEY, "head missing: %d %s", ret, halite_s3_errmsg(s));
	got = halite_s3_get_range(s, "no/such/key", 0, 10, buf, NULL);
	CHECK(got == -HALITE_S3_E_NO_SUCH_KEY, "get missing: %" PRId64, got);
	CHECK(strstr(halite_s3_errmsg(s), "404 NoSuchKey"), "message: %s", halite_s3_errmsg(s));

	/* A body that does not match its Content-MD5 is refused by the store, not stored. */
	{
		struct s3_xfer x;

		s3_xfer_init(&x);
		x.method = "PUT";
		x.key = "obj/digest";
		x.body = data;
		x.body_len = 4096;
		x.content_md5 = "AAAAAAAAAAAAAAAAAAAAAA==";
		ret = s3_run1(s, &x);
		s3_xfer_clear(&x);
		CHECK(ret == -HALITE_S3_E_BAD_DIGEST, "bad digest: %d %s", ret, halite_s3_errmsg(s));
		ret = halite_s3_head(s, "obj/digest", &o);
		CHECK(ret == -HALITE_S3_E_NO_SUCH_KEY, "a refused body was stored: %d", ret);
	}
	free(data);
	free(data2);
	free(buf);
}

static void test_denied(void)
{
	struct halite_s3 *bad = open_client("not-the-secret");
	struct halite_s3_object o;
	struct halite_s3_stats st;
	uint8_t b[16];
	int ret;

	ret = halite_s3_head(bad, "obj/a b+c", &o);
	CHECK(ret == -HALITE_S3_E_DENIED, "bad secret head: %d %s", ret, halite_s3_errmsg(bad));
	ret = (int)halite_s3_get_range(bad, "obj/a b+c", 0, sizeof(b), b, NULL);
	CHECK(ret == -HALITE_S3_E_DENIED, "bad secret get: %d", ret);
	CHECK(strstr(halite_s3_errmsg(bad), "HTTP 403"), "message: %s", halite_s3_errmsg(bad));
	/* A 403 is not retried. */
	halite_s3_get_stats(bad, &st);
	CHECK(st.requests == 2 && st.retries == 0, "requests %" PRIu64 " retries %" PRIu64,
	      st.requests, st.retries);
	halite_s3_close(bad);
}

static void test_multipart(struct halite_s3 *s)
{
	/* Stores refuse parts under 5 MiB but the last one. */
	enum { PART = 5 << 20, N = 3, LAST = 100000, TOTAL = PART * (N - 1) + LAST };
	uint8_t *data = malloc(TOTAL);
	struct halite_s3_part parts[N], *listed = NULL;
	char *id = NULL, *id2 = NULL, etag[HALITE_S3_ETAG_MAX];
	struct halite_s3_object o;
	size_t n = 0;
	int ret;

	fill_random(data, TOTAL);
	ret = halite_s3_mpu_create(s, "mp/obj", &id);
	CHECK(ret == 0, "create: %s", halite_s3_errmsg(s));
	if (ret)
		return;
	for (int i = 0; i < N; i++) {
		struct s3_xfer x;
		char extra[64], *eid = s3_escape_query(id);

		s3_xfer_init(&x);
		x.method = "PUT";
		x.key = "mp/obj";
		x.body = data + (size_t)i * PART;
		x.body_len = i == N - 1 ? LAST : PART;
		x.md5 = true;
		snprintf(extra, sizeof(extra), "partNumber=%d&", i + 1);
		snprintf(x.query, sizeof(x.query), "%suploadId=%s", extra, eid);
		free(eid);
		ret = s3_run1(s, &x);
		CHECK(ret == 0, "part %d: %s", i + 1, halite_s3_errmsg(s));
		parts[i].number = (uint32_t)i + 1;
		parts[i].size = x.body_len;
		snprintf(parts[i].etag, sizeof(parts[i].etag), "%s", x.etag);
		s3_xfer_clear(&x);
	}
	ret = halite_s3_mpu_list(s, "mp/obj", id, &listed, &n);
	CHECK(ret == 0 && n == N, "list: %d n %zu %s", ret, n, halite_s3_errmsg(s));
	for (size_t i = 0; !ret && i < n && i < N; i++)
		CHECK(listed[i].number == i + 1 && listed[i].size == parts[i].size &&
		      !strcmp(listed[i].etag, parts[i].etag), "listed part %zu: %u %" PRIu64 " %s/%s",
		      i, listed[i].number, listed[i].size, listed[i].etag, parts[i].etag);
	free(listed);
	ret = halite_s3_mpu_complete(s, "mp/obj", id, parts, N, etag);
	CHECK(ret == 0, "complete: %s", halite_s3_errmsg(s));
	ret = halite_s3_head(s, "mp/obj", &o);
	CHECK(ret == 0 && o.size == TOTAL, "completed size %" PRIu64, o.size);
	{
		uint8_t *buf = malloc(TOTAL);
		int64_t got = halite_s3_get_range(s, "mp/obj", 0, TOTAL, buf, o.etag);

		CHECK(got == TOTAL && !memcmp(buf, data, TOTAL), "completed bytes");
		free(buf);
	}
	/* Aborted: the upload id is gone, with its own code. */
	ret = halite_s3_mpu_create(s, "mp/aborted", &id2);
	CHECK(ret == 0, "create 2: %s", halite_s3_errmsg(s));
	ret = halite_s3_mpu_abort(s, "mp/aborted", id2);
	CHECK(ret == 0, "abort: %s", halite_s3_errmsg(s));
	ret = halite_s3_mpu_list(s, "mp/aborted", id2, &listed, &n);
	CHECK(ret == -HALITE_S3_E_NO_SUCH_UPLOAD, "list aborted: %d %s", ret, halite_s3_errmsg(s));
	free(id);
	free(id2);
	free(data);
}

/* Sequential requests ride one connection: keep-alive works. */
static void test_keepalive(void)
{
	struct halite_s3 *s = open_client(NULL);
	struct halite_s3_object o;
	struct halite_s3_stats st;

	for (int i = 0; i < 20; i++)
		CHECK(halite_s3_head(s, "obj/a b+c", &o) == 0, "head %d: %s", i, halite_s3_errmsg(s));
	halite_s3_get_stats(s, &st);
	CHECK(st.requests == 20 && st.connects == 1, "20 requests made %" PRIu64 " connections",
	      st.connects);
	halite_s3_close(s);
}

int main(void)
{
	const char *seed = getenv("HALITE_TEST_SEED");
	struct halite_s3 *s;

	if (!getenv("HALITE_TEST_BUCKET")) {
		fprintf(stderr, "SKIP: no HALITE_TEST_BUCKET (run under run_with_store.sh)\n");
		return 77;
	}
	rng = seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
	printf("seed %" PRIu64 " (HALITE_TEST_SEED)\n", rng);
	s = open_client(NULL);
	test_objects(s);
	test_denied();
	test_multipart(s);
	test_keepalive();
	halite_s3_close(s);
	printf("%s\n", fails ? "FAIL" : "ok");
	return fails ? 1 : 0;
}
