/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: Halite's S3 client, used by halite-inspect
 * (push, pull) and, later, by a restore that reads a snapshot lazily from
 * an object store with ranged GETs.
 *
 * libcurl does the HTTP and signs every request with SigV4
 * (CURLOPT_AWS_SIGV4); this library builds the requests, runs them through
 * one curl multi handle (so connections stay alive between requests and
 * several run at once, bounded), retries what is worth retrying, and turns
 * the store's answers into error codes and one-sentence messages.
 *
 * Calls return >= 0 on success, or -errno or a negative HALITE_S3_E_* /
 * HALITE_E_* code; halite_strerror() describes all of them, and
 * halite_s3_errmsg() says what the last failed call of a handle was doing.
 * A handle is used by one thread at a time; its calls block until done.
 * docs/object-store.md says where the configuration comes from and what
 * is retried.
 */
#ifndef HALITE_S3_H
#define HALITE_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <halite/errors.h>

/* Codes above the library's HALITE_E_* range: halite_strerror() describes them too. */
enum halite_s3_error {
	HALITE_S3_E_BASE = 4100,
	HALITE_S3_E_URL = HALITE_S3_E_BASE, /* not an s3://BUCKET/KEY URL */
	HALITE_S3_E_CONFIG,		/* no credentials, region or endpoint */
	HALITE_S3_E_CHANGED,		/* 412: the object is not the one its ETag named */
	HALITE_S3_E_NO_SUCH_KEY,	/* 404 NoSuchKey, or a HEAD's 404 */
	HALITE_S3_E_NO_SUCH_BUCKET,	/* 404 NoSuchBucket */
	HALITE_S3_E_NO_SUCH_UPLOAD,	/* 404 NoSuchUpload: the upload id is gone */
	HALITE_S3_E_DENIED,		/* 403: bad credentials or no permission */
	HALITE_S3_E_BAD_DIGEST,		/* the store's checksum of a body differs from ours */
	HALITE_S3_E_STORE,		/* any other error answer of the store */
	HALITE_S3_E_NETWORK,		/* no answer: connection, DNS, TLS, timeout */
	HALITE_S3_E_PROTOCOL,		/* an answer this client cannot use */
	HALITE_S3_E_MAX,
};

/* A static description of any code this library returns (its own, -errno); never NULL. */
const char *halite_s3_strerror(int err);

/* ---- s3://BUCKET/KEY (url.c) ---- */

/*
 * Splits @url into a bucket (S3's naming rules: 3-63 characters of a-z 0-9
 * . -, starting and ending with a letter or digit, no "..", not an IP
 * address) and a non-empty key, both malloc'd for the caller. 0, or
 * -HALITE_S3_E_URL with the reason in @err, or -ENOMEM.
 */
int halite_s3_parse_url(const char *url, char **bucket, char **key, char *err, size_t errlen);

/* ---- configuration (config.c) ---- */

enum halite_s3_addressing {
	HALITE_S3_ADDR_AUTO = 0, /* path-style with an endpoint, virtual-host for AWS */
	HALITE_S3_ADDR_PATH,	 /* https://ENDPOINT/BUCKET/KEY */
	HALITE_S3_ADDR_VIRTUAL,	 /* https://BUCKET.ENDPOINT/KEY */
};

struct halite_s3_config {
	char *endpoint;		/* "http://127.0.0.1:8333", or NULL: AWS */
	char *region;
	char *access_key;
	char *secret_key;
	char *session_token;	/* or NULL */
	int addressing;		/* enum halite_s3_addressing */
	/* Retries: attempts in all (1 = none), backoff base and cap, ms. */
	unsigned max_attempts;
	/*
	 * And for this long from a request's first attempt, whatever its
	 * attempts (0: attempts alone): a store gone for a while is waited
	 * for, not given up on. HALITE_S3_RETRY_FOR (seconds) sets it, and
	 * retry_for_set says it did; unset, 0 (the reads of a restore that
	 * has opened its snapshot wait longer: io_s3.c).
	 */
	unsigned retry_for_ms;
	bool retry_for_set;
	unsigned backoff_base_ms, backoff_cap_ms;
};

/*
 * Fills @c from the environment and the shared files, as the AWS tools do:
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, else the
 * profile AWS_PROFILE ("default") of AWS_SHARED_CREDENTIALS_FILE
 * (~/.aws/credentials); AWS_REGION, AWS_DEFAULT_REGION, else the profile's
 * region in AWS_CONFIG_FILE (~/.aws/config); AWS_ENDPOINT_URL;
 * HALITE_S3_ADDRESSING=path|virtual. 0, or -HALITE_S3_E_CONFIG with @err
 * naming what is missing or wrong (a variable, a file and line), or -ENOMEM.
 * On failure @c holds nothing to free.
 */
int halite_s3_config_load(struct halite_s3_config *c, char *err, size_t errlen);
void halite_s3_config_clear(struct halite_s3_config *c);

/*
 * The delay before retry @attempt (1 = the first retry): a random point in
 * [0, min(cap, base * 2^(attempt-1))] ("full jitter", so that clients that
 * failed together do not retry together), @rnd a uniform random 32-bit value.
 */
unsigned halite_s3_backoff_ms(unsigned attempt, unsigned base_ms, unsigned cap_ms, uint32_t rnd);

/* ---- the client (client.c) ---- */

struct halite_s3;

/*
 * A client of @bucket, from @c (copied). Checks nothing on the network.
 * 0, -ENOMEM, or -HALITE_S3_E_CONFIG (an endpoint that is not a URL).
 */
int halite_s3_open(struct halite_s3 **s, const struct halite_s3_config *c, const char *bucket);
void halite_s3_close(struct halite_s3 *s); /* NULL is fine */

/* The last failure's sentence ("GET s3://b/k: 404 NoSuchKey: ..."), or "". */
const char *halite_s3_errmsg(const struct halite_s3 *s);

struct halite_s3_stats {
	uint64_t requests;	/* sent, retries included */
	uint64_t retries;
	uint64_t bytes_up, bytes_down; /* bodies only */
	uint64_t connects;	/* new connections: fewer than requests when they are kept alive */
};
void halite_s3_get_stats(const struct halite_s3 *s, struct halite_s3_stats *st);

/* The configuration's retry_for_ms and backoff_cap_ms, for this handle's requests from now on. */
void halite_s3_set_retry(struct halite_s3 *s, unsigned retry_for_ms, unsigned backoff_cap_ms);

/* Most requests in flight at once in the calls that take several (default 8). */
void halite_s3_set_jobs(struct halite_s3 *s, unsigned jobs);

/*
 * @fn is told the bytes received so far as halite_s3_get_to_fd() (a retry
 * starts again from 0) and halite_s3_download_fd() write them; NULL: nothing.
 */
void halite_s3_set_progress(struct halite_s3 *s, void (*fn)(void *ctx, uint64_t bytes),
			    void *ctx);

/* ---- objects (object.c) ---- */

#define HALITE_S3_ETAG_MAX 128

struct halite_s3_object {
	uint64_t size;
	char etag[HALITE_S3_ETAG_MAX];	/* as the store sent it, quotes included */
};

/* HEAD: size and ETag of @key. 0 or a negative code. */
int halite_s3_head(struct halite_s3 *s, const char *key, struct halite_s3_object *o);

/*
 * @len bytes of @key from @off into @buf. With @etag (from halite_s3_head),
 * the store checks that the object is still that one (If-Match): a replaced
 * object fails with -HALITE_S3_E_CHANGED. Returns the bytes read, fewer
 * than @len only at the object's end.
 */
int64_t halite_s3_get_range(struct halite_s3 *s, const char *key, uint64_t off, size_t len,
			    void *buf, const char *etag);

struct halite_s3_range {
	uint64_t off;
	size_t len;
	void *buf;
	size_t got;		/* out: bytes read */
};
/*
 * halite_s3_get_range() for @n ranges of @key, up to the handle's jobs at
 * once. Stops at the first failure (0 or its code); ranges that completed
 * have their @got set.
 */
int halite_s3_get_ranges(struct halite_s3 *s, const char *key, struct halite_s3_range *r,
			 size_t n, const char *etag);

/*
 * The whole of @key written to @fd from offset 0 (positioned writes;
 * the file is not truncated). On success *@o says its size and ETag.
 */
int halite_s3_get_to_fd(struct halite_s3 *s, const char *key, int fd,
			struct halite_s3_object *o);

/*
 * The whole of @key into @fd, in ranges of @part_size (0: 8 MiB) fetched up
 * to the handle's jobs at once and written where they belong, each checked
 * against the ETag a first HEAD saw: an object replaced during the download
 * fails it with -HALITE_S3_E_CHANGED rather than mixing two versions. On
 * success *@o is the object (size, ETag) and *@parts the ranges fetched.
 * The file is not truncated.
 */
int halite_s3_download_fd(struct halite_s3 *s, const char *key, int fd, uint64_t part_size,
			  struct halite_s3_object *o, uint64_t *parts);

/* PUT of a small object in one request, with its Content-MD5 checked by the store. */
int halite_s3_put(struct halite_s3 *s, const char *key, const void *buf, size_t len);

/* DELETE (a missing key is not an error, as S3 says). */
int halite_s3_delete(struct halite_s3 *s, const char *key);

/* ---- multipart upload (multipart.c) ---- */

/* Parts are numbered from 1; S3 allows 10000 of them. */
#define HALITE_S3_MAX_PARTS 10000

struct halite_s3_part {
	uint32_t number;
	uint64_t size;
	char etag[HALITE_S3_ETAG_MAX];
};

/* CreateMultipartUpload: the new upload's id, malloc'd, in *@upload_id. */
int halite_s3_mpu_create(struct halite_s3 *s, const char *key, char **upload_id);
/*
 * ListParts: the parts the store holds for the upload, all pages, in
 * *@parts (malloc'd, by number) and *@n. -HALITE_S3_E_NO_SUCH_UPLOAD when
 * the upload is gone (completed, aborted or expired).
 */
int halite_s3_mpu_list(struct halite_s3 *s, const char *key, const char *upload_id,
		       struct halite_s3_part **parts, size_t *n);
/* CompleteMultipartUpload of @n parts in number order. On success the object's ETag in @etag. */
int halite_s3_mpu_complete(struct halite_s3 *s, const char *key, const char *upload_id,
			   const struct halite_s3_part *parts, size_t n,
			   char etag[HALITE_S3_ETAG_MAX]);
int halite_s3_mpu_abort(struct halite_s3 *s, const char *key, const char *upload_id);

/*
 * UploadPart for many parts, up to the handle's jobs at once: @fill is
 * called for part i (0-based in @parts) to put its @parts[i].size bytes
 * into @buf, and @done after the store took it (parts[i].etag set) so
 * the caller can record progress; either returning < 0 stops the upload
 * with that code. Each part is sent with its Content-MD5, which the store
 * checks (-HALITE_S3_E_BAD_DIGEST).
 */
struct halite_s3_part_cb {
	int (*fill)(void *ctx, size_t i, void *buf);
	int (*done)(void *ctx, size_t i);
	void *ctx;
};
int halite_s3_mpu_upload_parts(struct halite_s3 *s, const char *key, const char *upload_id,
			       struct halite_s3_part *parts, size_t n,
			       const struct halite_s3_part_cb *cb);

/* ---- a file, uploaded resumably (upload.c) ---- */

struct halite_s3_upload_opts {
	size_t sz;		/* sizeof(struct halite_s3_upload_opts) */
	uint64_t part_size;	/* 0: 8 MiB, grown so the file needs at most 10000 parts */
	/*
	 * The state file that lets an interrupted upload resume: the upload
	 * id, the source's size and mtime, the part size. NULL: no resume.
	 */
	const char *state_path;
	/* Called after each part; may be NULL. */
	void (*progress)(void *ctx, uint64_t bytes_done, uint64_t total);
	void *progress_ctx;
	/* Fault injection (tests): fail with -EINTR after this many parts were sent. */
	uint64_t stop_after_parts;
};

struct halite_s3_upload_result {
	uint64_t bytes;		  /* the file's size */
	uint64_t parts;		  /* in the object */
	uint64_t parts_sent;	  /* by this call; the rest were already stored */
	uint64_t part_size;
	bool resumed;		  /* an earlier upload's parts were kept */
	char etag[HALITE_S3_ETAG_MAX];
};

/*
 * Uploads the @size bytes of @fd to @key: one PUT when it fits a part, else
 * a multipart upload. With a state file from an earlier call for the same
 * key, source size, mtime and part size, only the parts the store lacks
 * (or holds with another MD5) are sent. The state file is removed once the
 * object is complete.
 */
int halite_s3_upload_fd(struct halite_s3 *s, const char *key, int fd,
			const struct halite_s3_upload_opts *opts,
			struct halite_s3_upload_result *res);

#endif
