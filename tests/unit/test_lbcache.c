// SPDX-License-Identifier: MIT
/*
 * The host's LB cache (halite/src/lbcache.c) on a real directory: bytes
 * back, misses, exact LRU order, the bound, bad entries written by hand,
 * the directory's checks, and processes sharing one cache (fork).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <halite/errors.h>

#include "lbcache.h"
#include "test_util.h"

#define HDR 64 /* an entry file's header, lbcache.c */
#define LB 65536

static uint64_t g_seed;

static const uint8_t uuid_a[16] = { 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
				    0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10 };
static const uint8_t uuid_b[16] = { 0xaa, [15] = 0x55 };

/* A fresh cache directory's path (not created) for one case. */
static const char *case_dir(const char *name)
{
	static char path[512];

	snprintf(path, sizeof(path), "%s/%s", t_tmpdir(), name);
	return path;
}

/* The cache's files go, and the directory, so t_tmpdir() can go at exit. */
static void rm_cache(const char *dir)
{
	char p[1024];
	struct dirent *de;
	DIR *d;

	snprintf(p, sizeof(p), "%s/lb", dir);
	d = opendir(p);
	if (d) {
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/lb/%s", dir, de->d_name);
			unlink(p);
		}
		closedir(d);
	}
	snprintf(p, sizeof(p), "%s/lb", dir);
	rmdir(p);
	snprintf(p, sizeof(p), "%s/state", dir);
	unlink(p);
	rmdir(dir);
}

static struct halite_lbcache *open_ok(const char *dir, uint64_t max)
{
	struct halite_lbcache *c = NULL;
	char err[256];
	int ret = halite_lbcache_open(&c, dir, max, err, sizeof(err));

	if (ret)
		fprintf(stderr, "open %s: %d %s\n", dir, ret, err);
	assert_int_equal(ret, 0);
	assert_non_null(c);
	return c;
}

static void entry_path(char *p, size_t n, const char *dir, const uint8_t uuid[16], uint64_t off)
{
	int k = snprintf(p, n, "%s/lb/", dir);

	for (int i = 0; i < 16; i++)
		k += snprintf(p + k, n - (size_t)k, "%02x", uuid[i]);
	snprintf(p + k, n - (size_t)k, "-%016llx", (unsigned long long)off);
}

static bool has_entry(const char *dir, const uint8_t uuid[16], uint64_t off)
{
	char p[1024];
	struct stat st;

	entry_path(p, sizeof(p), dir, uuid, off);
	return stat(p, &st) == 0;
}

/* The entries' files: how many, and their bytes in *@bytes. */
static size_t count_entries(const char *dir, uint64_t *bytes)
{
	char p[1024];
	struct dirent *de;
	struct stat st;
	size_t n = 0;
	DIR *d;

	*bytes = 0;
	snprintf(p, sizeof(p), "%s/lb", dir);
	d = opendir(p);
	assert_non_null(d);
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/lb/%s", dir, de->d_name);
		assert_int_equal(lstat(p, &st), 0);
		assert_true(S_ISREG(st.st_mode));
		assert_int_equal(st.st_mode & 0777, 0600);
		assert_int_equal(strlen(de->d_name), 49);
		*bytes += (uint64_t)st.st_size;
		n++;
	}
	closedir(d);
	return n;
}

/* Bytes of LB (@key, @ver): the version in the first 8, the rest from both. */
static void fill_lb(uint8_t *p, size_t len, uint64_t key, uint64_t ver)
{
	uint64_t s = (key + 1) * 0x9e3779b97f4a7c15ull ^ (ver + 1) * 0xc2b2ae3d27d4eb4full;

	memcpy(p, &ver, 8);
	for (size_t i = 8; i < len; i += 8) {
		uint64_t v = t_rand(&s);

		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

static void test_put_get(void **state)
{
	const char *dir = case_dir("putget");
	static uint8_t in[LB], out[LB];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	struct stat sb;
	char p[1024];

	(void)state;
	c = open_ok(dir, 1 << 20);
	assert_int_equal(stat(dir, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0700);
	snprintf(p, sizeof(p), "%s/lb", dir);
	assert_int_equal(lstat(p, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0700);
	snprintf(p, sizeof(p), "%s/state", dir);
	assert_int_equal(lstat(p, &sb), 0);
	assert_int_equal(sb.st_mode & 07777, 0600);
	fill_lb(in, LB, 1, 0);

	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x10000, out, LB), 0);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0x10000, in, LB), 0);
	memset(out, 0, LB);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x10000, out, LB), 1);
	assert_memory_equal(in, out, LB);

	/* Another uuid, another offset: misses. */
	assert_int_equal(halite_lbcache_get(c, uuid_b, 0x10000, out, LB), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x20000, out, LB), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, LB), 0);

	halite_lbcache_stats(c, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 4);
	assert_int_equal(st.bytes_hit, LB);
	assert_int_equal(st.puts, 1);
	assert_int_equal(st.evictions, 0);
	assert_int_equal(st.bytes_stored, HDR + LB);

	/* A put replaces, and the total counts the entry once. */
	fill_lb(in, LB, 1, 7);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0x10000, in, LB), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x10000, out, LB), 1);
	assert_memory_equal(in, out, LB);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.bytes_stored, HDR + LB);

	/* Argument checks. */
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, 0), -EINVAL);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, 0), -EINVAL);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, HALITE_LBCACHE_MAX_ENTRY + 1),
			 -EINVAL);

	/* A restarted process finds what is there. */
	halite_lbcache_close(c);
	c = open_ok(dir, 1 << 20);
	memset(out, 0, LB);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x10000, out, LB), 1);
	assert_memory_equal(in, out, LB);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.puts, 0);
	assert_int_equal(st.bytes_stored, HDR + LB);

	/* drop(): the caller found it bad. */
	halite_lbcache_drop(c, uuid_a, 0x10000);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0x10000, out, LB), 0);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.bytes_stored, 0);
	halite_lbcache_drop(c, uuid_a, 0x10000); /* nothing there: fine */

	halite_lbcache_close(c);
	halite_lbcache_close(NULL);
	rm_cache(dir);
}

static void test_too_large(void **state)
{
	const char *dir = case_dir("large");
	static uint8_t in[LB];
	struct halite_lbcache *c;
	uint64_t bytes;

	(void)state;
	c = open_ok(dir, HDR + LB - 1);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, LB), -HALITE_E_LIMIT);
	assert_int_equal(count_entries(dir, &bytes), 0);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, LB - 1), 0);
	assert_int_equal(count_entries(dir, &bytes), 1);
	assert_int_equal(bytes, HDR + LB - 1);
	halite_lbcache_close(c);
	rm_cache(dir);
}

/* Oldest-accessed goes first, and a hit refreshes. */
static void test_lru_order(void **state)
{
	const char *dir = case_dir("lru");
	enum { N = 4096, E = HDR + N };
	static uint8_t in[N], out[N];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	uint64_t bytes;

	(void)state;
	c = open_ok(dir, 3 * E);
	for (uint64_t k = 0; k < 3; k++) {
		fill_lb(in, N, k, 0);
		assert_int_equal(halite_lbcache_put(c, uuid_a, k * N, in, N), 0);
	}
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 1); /* 0 is now newest */
	fill_lb(in, N, 3, 0);
	assert_int_equal(halite_lbcache_put(c, uuid_a, 3 * N, in, N), 0);
	/* 1 was the least recently used. */
	assert_true(has_entry(dir, uuid_a, 0));
	assert_false(has_entry(dir, uuid_a, 1 * N));
	assert_true(has_entry(dir, uuid_a, 2 * N));
	assert_true(has_entry(dir, uuid_a, 3 * N));

	fill_lb(in, N, 4, 0);
	assert_int_equal(halite_lbcache_put(c, uuid_b, 0, in, N), 0);
	/* Then 2 (put before 0's hit). */
	assert_false(has_entry(dir, uuid_a, 2 * N));
	assert_true(has_entry(dir, uuid_a, 0));
	assert_true(has_entry(dir, uuid_a, 3 * N));
	assert_true(has_entry(dir, uuid_b, 0));

	fill_lb(in, N, 5, 0);
	assert_int_equal(halite_lbcache_put(c, uuid_b, N, in, N), 0);
	assert_false(has_entry(dir, uuid_a, 0));

	halite_lbcache_stats(c, &st);
	assert_int_equal(st.evictions, 3);
	assert_int_equal(st.bytes_stored, 3 * E);
	assert_int_equal(count_entries(dir, &bytes), 3);
	assert_int_equal(bytes, 3 * E);
	halite_lbcache_close(c);
	rm_cache(dir);
}

/*
 * A seeded random run against a model LRU: every get's answer, every
 * entry's presence and the total equal the model's after every call. Keys
 * are more than the bound holds, so evictions run, and scans when the
 * candidates run out.
 */
static void test_lru_model(void **state)
{
	const char *dir = case_dir("model");
	enum { N = 512, E = HDR + N, KEYS = 96, CAP = 40, OPS = 6000 };
	static uint8_t in[N], out[N];
	uint64_t last[KEYS], ver[KEYS], clock = 0, s = g_seed, bytes;
	bool present[KEYS] = { false };
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	size_t npresent = 0, hits = 0;

	(void)state;
	c = open_ok(dir, CAP * E);
	for (int op = 0; op < OPS; op++) {
		uint64_t k = t_rand(&s) % KEYS;

		if (t_rand(&s) % 2) {
			int r = halite_lbcache_get(c, uuid_a, k * N, out, N);

			assert_int_equal(r, present[k] ? 1 : 0);
			if (r == 1) {
				fill_lb(in, N, k, ver[k]);
				assert_memory_equal(in, out, N);
				last[k] = ++clock;
				hits++;
			}
			continue;
		}
		ver[k] = t_rand(&s);
		fill_lb(in, N, k, ver[k]);
		assert_int_equal(halite_lbcache_put(c, uuid_a, k * N, in, N), 0);
		if (!present[k])
			npresent++;
		present[k] = true;
		last[k] = ++clock;
		while (npresent > CAP) {
			uint64_t oldest = UINT64_MAX;
			size_t victim = 0;

			for (size_t i = 0; i < KEYS; i++) {
				if (present[i] && last[i] < oldest) {
					oldest = last[i];
					victim = i;
				}
			}
			present[victim] = false;
			npresent--;
		}
		for (size_t i = 0; i < KEYS; i++)
			assert_int_equal(has_entry(dir, uuid_a, i * N), present[i]);
	}
	assert_int_equal(count_entries(dir, &bytes), npresent);
	assert_int_equal(bytes, npresent * E);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.hits, hits);
	assert_int_equal(st.bytes_stored, npresent * E);
	halite_lbcache_close(c);
	rm_cache(dir);
}

/*
 * More entries than one scan keeps as candidates (1024 in lbcache.c): the
 * order stays exact across scans, and a hit still saves an entry.
 */
static void test_lru_many(void **state)
{
	const char *dir = case_dir("many");
	enum { N = 16, E = HDR + N, CAP = 2000 };
	uint8_t in[N], out[N];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	uint64_t bytes;

	(void)state;
	c = open_ok(dir, CAP * E);
	for (uint64_t k = 0; k < 3000; k++) {
		fill_lb(in, N, k, 0);
		assert_int_equal(halite_lbcache_put(c, uuid_b, k, in, N), 0);
	}
	for (uint64_t k = 0; k < 3000; k++)
		assert_int_equal(has_entry(dir, uuid_b, k), k >= 1000);
	for (uint64_t k = 1000; k < 1100; k++) {
		assert_int_equal(halite_lbcache_get(c, uuid_b, k, out, N), 1);
		fill_lb(in, N, k, 0);
		assert_memory_equal(in, out, N);
	}
	for (uint64_t k = 3000; k < 4300; k++) {
		fill_lb(in, N, k, 0);
		assert_int_equal(halite_lbcache_put(c, uuid_b, k, in, N), 0);
	}
	/* 1000..1099 were used after 1100..2999 were put: 1100..2399 went. */
	for (uint64_t k = 1000; k < 4300; k++)
		assert_int_equal(has_entry(dir, uuid_b, k), k < 1100 || k >= 2400);
	assert_int_equal(count_entries(dir, &bytes), CAP);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.evictions, 2300);
	assert_int_equal(st.bytes_stored, CAP * E);
	assert_int_equal(bytes, CAP * E);
	halite_lbcache_close(c);
	rm_cache(dir);
}

/* Many puts of mixed sizes: the bound holds after every one, and the total is exact. */
static void test_bound(void **state)
{
	const char *dir = case_dir("bound");
	const uint64_t max = 1000000;
	static uint8_t in[LB];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	uint64_t s = g_seed + 1, bytes;

	(void)state;
	c = open_ok(dir, max);
	for (int i = 0; i < 1500; i++) {
		size_t len = 1 + t_rand(&s) % LB;

		fill_lb(in, len < 8 ? 8 : len, (uint64_t)i, 0);
		assert_int_equal(halite_lbcache_put(c, uuid_b, (uint64_t)i * LB, in, len), 0);
		count_entries(dir, &bytes);
		assert_true(bytes <= max);
		halite_lbcache_stats(c, &st);
		assert_int_equal(st.bytes_stored, bytes);
	}
	assert_int_equal(st.puts, 1500);
	assert_true(st.evictions > 1000);
	/* A smaller bound at open shrinks the cache at once. */
	halite_lbcache_close(c);
	c = open_ok(dir, max / 4);
	count_entries(dir, &bytes);
	assert_true(bytes <= max / 4);
	halite_lbcache_close(c);
	rm_cache(dir);
}

static void write_file(const char *path, const void *p, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, len), (ssize_t)len);
	close(fd);
}

/* Entries cut short, garbage, flipped or misnamed: misses, never wrong bytes. */
static void test_bad_entries(void **state)
{
	const char *dir = case_dir("bad");
	enum { N = 8192 };
	static uint8_t in[N], out[N], raw[HDR + N];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	char p[1024], q[1024];
	uint64_t s = g_seed + 2;
	int fd;

	(void)state;
	c = open_ok(dir, 1 << 20);
	fill_lb(in, N, 9, 1);
	entry_path(p, sizeof(p), dir, uuid_a, 0);

	/* Cut short, as a crash while writing would leave it if we wrote in place. */
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, N), 0);
	assert_int_equal(truncate(p, HDR + N / 2), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 0);
	assert_false(has_entry(dir, uuid_a, 0)); /* removed */

	/* Garbage of the right size. */
	t_fill(raw, sizeof(raw), 100, &s);
	write_file(p, raw, sizeof(raw));
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 0);
	assert_false(has_entry(dir, uuid_a, 0));

	/* A good header, one data byte flipped: the entry's own checksum. */
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, N), 0);
	fd = open(p, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
	raw[HDR + 1234] ^= 0x20;
	assert_int_equal(pwrite(fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
	close(fd);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 0);

	/* A good entry under another entry's name. */
	assert_int_equal(halite_lbcache_put(c, uuid_a, 0, in, N), 0);
	entry_path(q, sizeof(q), dir, uuid_a, N);
	assert_int_equal(link(p, q), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, N, out, N), 0);
	assert_false(has_entry(dir, uuid_a, N));
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 1);
	assert_memory_equal(in, out, N);

	/* Asked with another length: a miss (and the entry goes). */
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N / 2), 0);
	assert_false(has_entry(dir, uuid_a, 0));

	/* A symbolic link where an entry would be is not followed. */
	write_file(q, raw, sizeof(raw));
	assert_int_equal(symlink(q, p), 0);
	assert_int_equal(halite_lbcache_get(c, uuid_a, 0, out, N), 0);
	assert_false(has_entry(dir, uuid_a, 0));
	unlink(q);

	halite_lbcache_stats(c, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 6);
	halite_lbcache_close(c);

	/* A state file left busy by a process that died is recounted at open. */
	c = open_ok(dir, 1 << 20);
	assert_int_equal(halite_lbcache_put(c, uuid_b, 0, in, N), 0);
	halite_lbcache_close(c);
	snprintf(q, sizeof(q), "%s/state", dir);
	fd = open(q, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, "\1\0\0\0\0\0\0\0\xff", 9, 8), 9); /* busy, wrong total */
	close(fd);
	c = open_ok(dir, 1 << 20);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.bytes_stored, HDR + N);
	halite_lbcache_close(c);
	rm_cache(dir);
}

static int open_err(const char *dir, char *err, size_t len)
{
	struct halite_lbcache *c = (struct halite_lbcache *)0x1;
	int ret = halite_lbcache_open(&c, dir, 1 << 20, err, len);

	assert_ptr_equal(c, (struct halite_lbcache *)0x1); /* untouched on failure */
	return ret;
}

static void test_dir_checks(void **state)
{
	const char *dir = case_dir("perm");
	char err[512], want[1024], link_path[600], sub[600];
	struct halite_lbcache *c;

	(void)state;
	assert_int_equal(mkdir(dir, 0700), 0);
	assert_int_equal(chmod(dir, 0777), 0);
	assert_int_equal(open_err(dir, err, sizeof(err)), -EPERM);
	snprintf(want, sizeof(want), "cache directory %s is group- or world-writable (mode 0777)",
		 dir);
	assert_non_null(strstr(err, want));
	assert_int_equal(chmod(dir, 0720), 0);
	assert_int_equal(open_err(dir, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "(mode 0720)"));
	assert_int_equal(chmod(dir, 0755), 0); /* readable by others is fine */
	c = open_ok(dir, 1 << 20);
	halite_lbcache_close(c);

	/* Its lb directory is checked the same way. */
	snprintf(sub, sizeof(sub), "%s/lb", dir);
	assert_int_equal(chmod(sub, 0707), 0);
	assert_int_equal(open_err(dir, err, sizeof(err)), -EPERM);
	snprintf(want, sizeof(want), "cache directory %s is group- or world-writable", sub);
	assert_non_null(strstr(err, want));
	assert_int_equal(chmod(sub, 0700), 0);

	/* A symbolic link to a good directory is refused. */
	snprintf(link_path, sizeof(link_path), "%s-link", dir);
	assert_int_equal(symlink(dir, link_path), 0);
	assert_int_equal(open_err(link_path, err, sizeof(err)), -ELOOP);
	snprintf(want, sizeof(want), "cache directory %s is a symbolic link", link_path);
	assert_non_null(strstr(err, want));
	unlink(link_path);

	/* A file, a missing parent, a size of 0. */
	snprintf(sub, sizeof(sub), "%s/state", dir);
	assert_int_equal(open_err(sub, err, sizeof(err)), -ENOTDIR);
	assert_non_null(strstr(err, sub));
	snprintf(sub, sizeof(sub), "%s/no/such", dir);
	assert_int_equal(open_err(sub, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "cannot create cache directory %s", sub);
	assert_non_null(strstr(err, want));
	c = (struct halite_lbcache *)0x1;
	assert_int_equal(halite_lbcache_open(&c, dir, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "a size of 0 bytes"));

	/* Not ours: only root can make one to test with. */
	if (geteuid() == 0) {
		assert_int_equal(chown(dir, 65534, 65534), 0);
		assert_int_equal(open_err(dir, err, sizeof(err)), -EPERM);
		snprintf(want, sizeof(want), "cache directory %s is owned by uid 65534", dir);
		assert_non_null(strstr(err, want));
		assert_int_equal(chown(dir, 0, 0), 0);
	}
	rm_cache(dir);
}

/*
 * Processes (or threads) sharing one cache: concurrent puts and gets of the
 * same keys, versions changing, evictions running; every hit's bytes are
 * one whole version of that key.
 */
struct worker {
	const char *dir;
	uint64_t max;
	struct halite_lbcache *shared; /* threads: the one handle; processes: NULL */
	bool no_tmpfile;
	int id;
	int ret;
	uint64_t hits;
};

static int work(struct worker *w)
{
	enum { KEYS = 24, OPS = 1500 };
	uint8_t *in = malloc(3 * LB), *out = in + LB, *want = in + 2 * LB;
	struct halite_lbcache *c = w->shared;
	char err[256];
	uint64_t s = g_seed * 31 + (uint64_t)w->id + 1;
	int ret = 1;

	if (!in)
		return 1;
	if (!c && halite_lbcache_open(&c, w->dir, w->max, err, sizeof(err))) {
		fprintf(stderr, "worker %d: %s\n", w->id, err);
		goto out;
	}
	if (w->no_tmpfile)
		halite_lbcache_no_tmpfile(c);
	for (int op = 0; op < OPS; op++) {
		uint64_t k = t_rand(&s) % KEYS, ver;
		int r;

		if (t_rand(&s) % 3 == 0) {
			ver = t_rand(&s);
			fill_lb(in, LB, k, ver);
			r = halite_lbcache_put(c, uuid_a, k * LB, in, LB);
			if (r) {
				fprintf(stderr, "worker %d: put %d\n", w->id, r);
				goto out;
			}
			continue;
		}
		r = halite_lbcache_get(c, uuid_a, k * LB, out, LB);
		if (r < 0) {
			fprintf(stderr, "worker %d: get %d\n", w->id, r);
			goto out;
		}
		if (r == 1) {
			memcpy(&ver, out, 8);
			fill_lb(want, LB, k, ver);
			if (memcmp(want, out, LB)) {
				fprintf(stderr, "worker %d: torn entry, key %llu\n", w->id,
					(unsigned long long)k);
				goto out;
			}
			w->hits++;
		}
	}
	ret = 0;
out:
	if (!w->shared)
		halite_lbcache_close(c);
	free(in);
	return ret;
}

static void *work_thread(void *arg)
{
	struct worker *w = arg;

	w->ret = work(w);
	return NULL;
}

enum { WORKERS = 4 };

static void check_after(const char *dir, struct halite_lbcache *c, uint64_t max)
{
	struct halite_lbcache_stats st;
	uint64_t bytes;

	count_entries(dir, &bytes);
	assert_true(bytes <= max);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.bytes_stored, bytes);
}

static void run_processes(const char *dir, bool no_tmpfile)
{
	const uint64_t max = 12 * (HDR + LB);
	struct halite_lbcache *c;
	pid_t pids[WORKERS];

	c = open_ok(dir, max); /* created here, used by the children */
	for (int i = 0; i < WORKERS; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			struct worker w = { .dir = dir, .max = max, .no_tmpfile = no_tmpfile,
					    .id = i };

			_exit(work(&w));
		}
	}
	for (int i = 0; i < WORKERS; i++) {
		int status;

		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	check_after(dir, c, max);
	halite_lbcache_close(c);
	rm_cache(dir);
}

static void test_processes(void **state)
{
	(void)state;
	run_processes(case_dir("procs"), false);
}

/* The same through named temporary files and rename(); none is left. */
static void test_processes_rename(void **state)
{
	(void)state;
	run_processes(case_dir("procs-rename"), true);
}

/* Threads of one process sharing one handle. */
static void test_threads(void **state)
{
	const char *dir = case_dir("threads");
	const uint64_t max = 12 * (HDR + LB);
	struct worker w[WORKERS];
	pthread_t th[WORKERS];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	uint64_t hits = 0;

	(void)state;
	c = open_ok(dir, max);
	for (int i = 0; i < WORKERS; i++) {
		w[i] = (struct worker){ .dir = dir, .max = max, .shared = c, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, work_thread, &w[i]), 0);
	}
	for (int i = 0; i < WORKERS; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(w[i].ret, 0);
		hits += w[i].hits;
	}
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.hits, hits);
	check_after(dir, c, max);
	halite_lbcache_close(c);
	rm_cache(dir);
}

/*
 * Writers killed at random points (SIGKILL, mid-put or not): every entry
 * left reads back whole or not at all, nothing else is left in the
 * directory, and the next open's total is exact.
 */
static void test_crash(void **state)
{
	const char *dir = case_dir("crash");
	enum { KEYS = 16, ROUNDS = 8 };
	const uint64_t max = 10 * (HDR + LB);
	static uint8_t out[LB], want[LB];
	struct halite_lbcache_stats st;
	struct halite_lbcache *c;
	uint64_t s = g_seed + 3, bytes;
	int hits = 0;

	(void)state;
	halite_lbcache_close(open_ok(dir, max));
	for (int round = 0; round < ROUNDS; round++) {
		pid_t pid = fork();
		int status;

		assert_true(pid >= 0);
		if (pid == 0) {
			static uint8_t in[LB];
			struct halite_lbcache *w = NULL;
			uint64_t cs = s + (uint64_t)round;

			if (halite_lbcache_open(&w, dir, max, NULL, 0))
				_exit(1);
			for (;;) {
				uint64_t k = t_rand(&cs) % KEYS, ver = t_rand(&cs);

				fill_lb(in, LB, k, ver);
				halite_lbcache_put(w, uuid_a, k * LB, in, LB);
			}
		}
		usleep(2000 + (useconds_t)(t_rand(&s) % 30000));
		assert_int_equal(kill(pid, SIGKILL), 0);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFSIGNALED(status));
	}
	c = open_ok(dir, max);
	for (uint64_t k = 0; k < KEYS; k++) {
		int r = halite_lbcache_get(c, uuid_a, k * LB, out, LB);
		uint64_t ver;

		assert_true(r == 0 || r == 1);
		if (r == 1) {
			memcpy(&ver, out, 8);
			fill_lb(want, LB, k, ver);
			assert_memory_equal(want, out, LB);
			hits++;
		}
	}
	assert_true(hits > 0);
	count_entries(dir, &bytes); /* only entries: no temporary file left */
	assert_true(bytes <= max);
	halite_lbcache_stats(c, &st);
	assert_int_equal(st.bytes_stored, bytes);
	halite_lbcache_close(c);
	rm_cache(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_put_get),	   cmocka_unit_test(test_too_large),
		cmocka_unit_test(test_lru_order),  cmocka_unit_test(test_lru_model),
		cmocka_unit_test(test_lru_many),
		cmocka_unit_test(test_bound),	   cmocka_unit_test(test_bad_entries),
		cmocka_unit_test(test_dir_checks), cmocka_unit_test(test_processes),
		cmocka_unit_test(test_processes_rename), cmocka_unit_test(test_threads),
		cmocka_unit_test(test_crash),
	};

	g_seed = t_seed("unit_lbcache");
	if (getenv("HALITE_TEST_FILTER")) /* one case: HALITE_TEST_FILTER=test_bound */
		cmocka_set_test_filter(getenv("HALITE_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
