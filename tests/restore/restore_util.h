/* SPDX-License-Identifier: MIT */
/*
 * Shared by the restore engine's tests: what the kernel says about a range of
 * some process's memory (present pages, userfaultfd registration, a thread's
 * state), descriptor passing, scratch files and their damage (a format 1.1
 * file with a damaged index chunk among them), a log capture.
 * Nothing here uses cmocka: forked children call these too, and a cmocka
 * failure inside a child would run the rest of the suite there.
 */
#ifndef HALITE_RESTORE_UTIL_H
#define HALITE_RESTORE_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "test_util.h"

#define R_PAGE 4096u

static inline uint64_t r_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void r_sleep_us(unsigned us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Zeroed MAP_SHARED memory: seen alike by this process and its forked children. */
static inline void *r_shared_alloc(size_t len)
{
	void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		       -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		abort();
	}
	return p;
}

static inline void r_shared_free(void *p, size_t len)
{
	if (p)
		munmap(p, len ? len : 1);
}

/* --- what the kernel says --- */

/*
 * Pages of [addr, addr+len) of @pid that are populated (pagemap: present or
 * swapped). With @present non-NULL, also one byte per page. -errno on error.
 */
static inline long r_pages_present(pid_t pid, uint64_t addr, uint64_t len, uint8_t *present)
{
	char path[64];
	uint64_t pages = len / R_PAGE, buf[512];
	long n = 0;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (uint64_t p = 0; p < pages;) {
		uint64_t k = pages - p < 512 ? pages - p : 512;
		ssize_t got = pread(fd, buf, k * 8, (off_t)((addr / R_PAGE + p) * 8));

		if (got != (ssize_t)(k * 8)) {
			close(fd);
			return got < 0 ? -errno : -EIO;
		}
		for (uint64_t i = 0; i < k; i++) {
			bool there = buf[i] & (3ull << 62);

			n += there;
			if (present)
				present[p + i] = there;
		}
		p += k;
	}
	close(fd);
	return n;
}

/*
 * Whether any mapping of @pid overlapping [addr, addr+len) is registered
 * with a userfaultfd for missing faults ("um" in smaps' VmFlags): 1, 0, or
 * -errno.
 */
static inline int r_uffd_registered(pid_t pid, uint64_t addr, uint64_t len)
{
	char path[64], line[512];
	unsigned long long lo = 0, hi = 0;
	bool in = false;
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		size_t hex = strspn(line, "0123456789abcdef");

		/* A mapping's header line; attribute lines start with a capital. */
		if (hex && line[hex] == '-' && sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
			in = lo < addr + len && hi > addr;
			continue;
		}
		if (in && !strncmp(line, "VmFlags:", 8)) {
			char *t = strtok(line + 8, " \n");

			for (; t; t = strtok(NULL, " \n"))
				if (!strcmp(t, "um"))
					found = 1;
		}
	}
	fclose(f);
	return found;
}

/* The state letter of thread @tid of @pid (R, S, D, T, Z, ...), or '?' if gone. */
static inline char r_thread_state(pid_t pid, pid_t tid)
{
	char path[64], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return '?';
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return '?';
	buf[n] = 0;
	p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
	return p && p[1] == ' ' ? p[2] : '?';
}

/* --- scratch files --- */

static inline int r_copy_file(const char *src, const char *dst)
{
	char buf[1 << 16];
	int in = open(src, O_RDONLY | O_CLOEXEC), out;
	ssize_t n;

	if (in < 0)
		return -errno;
	out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		close(in);
		return -errno;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n) {
			n = -1;
			break;
		}
	close(in);
	if (close(out) || n < 0)
		return -EIO;
	return 0;
}

/* XOR byte @off of @path with @mask (non-zero). */
static inline int r_flip_byte(const char *path, uint64_t off, uint8_t mask)
{
	uint8_t b;
	int fd = open(path, O_RDWR | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (pread(fd, &b, 1, (off_t)off) != 1)
		ret = -EIO;
	b ^= mask;
	if (!ret && pwrite(fd, &b, 1, (off_t)off) != 1)
		ret = -EIO;
	close(fd);
	return ret;
}

static inline uint64_t r_file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

/*
 * Whether @msg names locality block @lb: "locality block N" or "LB N" with N
 * not followed by another digit.
 */
static inline bool r_names_lb(const char *msg, uint64_t lb)
{
	static const char *const fmt[] = { "locality block %llu", "LB %llu", "lb %llu" };
	char want[64];

	for (size_t i = 0; i < sizeof(fmt) / sizeof(fmt[0]); i++) {
		const char *p = msg;
		size_t n = (size_t)snprintf(want, sizeof(want), fmt[i], (unsigned long long)lb);

		while ((p = strstr(p, want))) {
			if (p[n] < '0' || p[n] > '9')
				return true;
			p += n;
		}
	}
	return false;
}

/* --- a format 1.1 file with two mb-map chunks, and damage to one --- */

/*
 * 8192 + 64 blocks of 4 KiB in one region "pc.ram": two mb-map chunks
 * (8192 entries each, docs/format.md 5.7), the second of 64. Blocks cycle
 * through zero, never touched and stored (two of four), written in order
 * into one stream, so an LB holds consecutive blocks.
 */
#define R_CHUNKED_MB 4096u
#define R_CHUNKED_NMB (8192u + 64u)
#define R_CHUNKED_LEN ((uint64_t)R_CHUNKED_NMB * R_CHUNKED_MB)

/* Block @mb's kind: 1 zero, 0 never touched, 2 stored. */
static inline int r_chunked_kind(uint64_t mb)
{
	return mb % 4 == 0 ? 1 : mb % 4 == 1 ? 0 : 2;
}

/* Writes that file at @path; its image (R_CHUNKED_LEN bytes, free() it) in *@img. 0 or < 0. */
static inline int r_write_chunked(const char *path, uint8_t **img)
{
	const struct halite_region reg = { "pc.ram", 0, R_CHUNKED_LEN };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	uint8_t *im = calloc(1, R_CHUNKED_LEN);
	uint64_t x = 0xc0ffee;
	int ret;

	if (!im)
		return -ENOMEM;
	o.mb_pages = 1;
	o.vcpu_count = 1;
	o.flags = HALITE_WRITER_NO_SYNC;
	ret = halite_writer_create(&w, path, &reg, 1, &o);
	for (uint64_t mb = 0; !ret && mb < R_CHUNKED_NMB; mb++) {
		uint8_t *b = im + mb * R_CHUNKED_MB;

		if (r_chunked_kind(mb) == 1) {
			ret = halite_writer_put_zero(w, mb);
		} else if (r_chunked_kind(mb) == 2) {
			for (uint32_t i = 0; i < 512; i++)
				b[i] = (uint8_t)t_rand(&x);
			b[R_CHUNKED_MB - 1] = (uint8_t)mb | 1;
			ret = halite_writer_put(w, 0, mb, b);
			ret = ret > 0 ? 0 : ret;
		}
	}
	if (!ret)
		ret = halite_writer_finish(w);
	if (w)
		halite_writer_free(w, true);
	if (ret) {
		free(im);
		return ret;
	}
	*img = im;
	return 0;
}

/* Flips a bit of block @mb's mb-map entry in 1.1 file @path: its chunk's checksum fails. */
static inline int r_damage_map_entry(const char *path, uint64_t mb)
{
	struct halite_reader *rd;
	uint64_t off = 0, len;
	uint32_t type = 0;
	int ret = halite_reader_open(&rd, path, NULL);

	if (ret)
		return ret;
	if (halite_reader_info(rd)->version_minor != 1)
		ret = -EINVAL;
	for (uint32_t i = 0; !ret && i < halite_reader_section_count(rd); i++) {
		ret = halite_reader_section(rd, i, &type, &off, &len);
		if (type == HALITE_SECTION_MB_MAP)
			break;
	}
	halite_reader_free(rd);
	if (!ret && type != HALITE_SECTION_MB_MAP)
		ret = -HALITE_E_NOT_FOUND;
	return ret ? ret : r_flip_byte(path, off + 8 * mb + 1, 0x01);
}

/* --- a log capture: every message kept (up to a size), and echoed at WARN and above --- */

struct r_log {
	pthread_mutex_t mu;
	char buf[16384];
	size_t len;
	bool quiet;
};

static inline void r_log_fn(void *ctx, int level, const char *msg)
{
	struct r_log *l = ctx;

	if (level <= 1 && !l->quiet)
		fprintf(stderr, "  halite: %s: %s\n", level == 0 ? "error" : "warning", msg);
	pthread_mutex_lock(&l->mu);
	if (l->len < sizeof(l->buf) - 2) {
		int n = snprintf(l->buf + l->len, sizeof(l->buf) - l->len, "%s\n", msg);

		if (n > 0)
			l->len += (size_t)n < sizeof(l->buf) - l->len ? (size_t)n : sizeof(l->buf) - l->len - 1;
	}
	pthread_mutex_unlock(&l->mu);
}

static inline void r_log_init(struct r_log *l, bool quiet)
{
	memset(l, 0, sizeof(*l));
	pthread_mutex_init(&l->mu, NULL);
	l->quiet = quiet;
}

static inline void r_log_reset(struct r_log *l)
{
	pthread_mutex_lock(&l->mu);
	l->len = 0;
	l->buf[0] = 0;
	pthread_mutex_unlock(&l->mu);
}

static inline bool r_log_has(struct r_log *l, const char *s)
{
	bool ret;

	pthread_mutex_lock(&l->mu);
	ret = strstr(l->buf, s) != NULL;
	pthread_mutex_unlock(&l->mu);
	return ret;
}

#endif
