// SPDX-License-Identifier: MIT
/*
 * The digests requests carry: Content-MD5, which every S3 store checks
 * against the body it received (AWS, MinIO, SeaweedFS, Ceph alike, where
 * the newer x-amz-checksum-* headers are not everywhere yet), and the
 * body's SHA-256 for x-amz-content-sha256, which SigV4 signs; and a
 * file's SHA-256, which a disk's manifest records (s3_disks.h). OpenSSL's
 * libcrypto computes them.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "s3_disks.h"
#include "s3_internal.h"

void s3_hex(const unsigned char *d, unsigned n, char *hex)
{
	static const char digits[] = "0123456789abcdef";

	for (unsigned i = 0; i < n; i++) {
		hex[2 * i] = digits[d[i] >> 4];
		hex[2 * i + 1] = digits[d[i] & 15];
	}
	hex[2 * n] = 0;
}

void s3_md5(const void *buf, size_t len, char b64[32], char hex[40])
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	EVP_Digest(buf, len, d, &n, EVP_md5(), NULL);
	if (b64)
		EVP_EncodeBlock((unsigned char *)b64, d, (int)n);
	if (hex)
		s3_hex(d, n, hex);
}

void s3_sha256_hex(const void *buf, size_t len, char hex[72])
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	EVP_Digest(buf, len, d, &n, EVP_sha256(), NULL);
	s3_hex(d, n, hex);
}

/* A file's SHA-256 (a disk beside its snapshot, s3_disks.h), read in 1 MiB pieces. */
int halite_s3_sha256_fd(int fd, char out[65], uint64_t *size)
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned char d[EVP_MAX_MD_SIZE];
	size_t cap = 1u << 20;
	unsigned char *buf = malloc(cap);
	uint64_t off = 0;
	unsigned n = 0;
	int ret = 0;

	if (!c || !buf || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) {
		ret = -ENOMEM;
		goto out;
	}
	for (;;) {
		ssize_t r = pread(fd, buf, cap, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			goto out;
		}
		if (!r)
			break;
		EVP_DigestUpdate(c, buf, (size_t)r);
		off += (uint64_t)r;
	}
	EVP_DigestFinal_ex(c, d, &n);
	s3_hex(d, n, out);
	*size = off;
out:
	free(buf);
	EVP_MD_CTX_free(c);
	return ret;
}
