// SPDX-License-Identifier: MIT
/*
 * The digests requests carry: Content-MD5, which every S3 store checks
 * against the body it received (AWS, MinIO, SeaweedFS, Ceph alike, where
 * the newer x-amz-checksum-* headers are not everywhere yet), and the
 * body's SHA-256 for x-amz-content-sha256, which SigV4 signs. OpenSSL's
 * libcrypto computes both.
 */
#include <openssl/evp.h>
#include <string.h>

#include "s3_internal.h"

static void to_hex(const unsigned char *d, unsigned n, char *hex)
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
		to_hex(d, n, hex);
}

void s3_sha256_hex(const void *buf, size_t len, char hex[72])
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	EVP_Digest(buf, len, d, &n, EVP_sha256(), NULL);
	to_hex(d, n, hex);
}
