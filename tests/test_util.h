/* SPDX-License-Identifier: MIT */
/* Shared by the tests: seeded randomness, scratch files, test data, fd passing. */
#ifndef HALITE_TEST_UTIL_H
#define HALITE_TEST_UTIL_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

/* xorshift64*: deterministic for a seed, printed so a failure can be replayed. */
static inline uint64_t t_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

/* HALITE_TEST_SEED from the environment, else time; printed either way. */
static inline uint64_t t_seed(const char *test)
{
	const char *e = getenv("HALITE_TEST_SEED");
	uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;

	if (!seed)
		seed = 1;
	fprintf(stderr, "%s: HALITE_TEST_SEED=%llu\n", test, (unsigned long long)seed);
	return seed;
}

/*
 * Fill @len bytes with data that compresses to about @pct_random percent:
 * that share of each 256-byte run is random, the rest a repeating pattern.
 */
static inline void t_fill(uint8_t *p, size_t len, unsigned pct_random, uint64_t *s)
{
	for (size_t i = 0; i < len; i++) {
		if ((i % 256) < pct_random * 256 / 100)
			p[i] = (uint8_t)t_rand(s);
		else
			p[i] = (uint8_t)(i / 7);
	}
}

/*
 * The whole of @path, NUL-terminated (free() it), its length in *@len if
 * @len is not NULL; NULL with errno set when it cannot be read.
 */
static inline char *t_slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n = -1;
	int err = 0;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET))
		err = errno;
	else if (!(buf = calloc(1, (size_t)n + 1)))
		err = ENOMEM;
	else if (fread(buf, 1, (size_t)n, f) != (size_t)n)
		err = ferror(f) ? EIO : ENODATA;
	fclose(f);
	if (err) {
		free(buf);
		errno = err;
		return NULL;
	}
	if (len)
		*len = (size_t)n;
	return buf;
}

static char t_tmpdir_path[256];

/* At exit: the scratch directory goes if the test left it empty (rmdir). */
static inline void t_tmpdir_remove(void)
{
	if (t_tmpdir_path[0])
		rmdir(t_tmpdir_path);
}

/*
 * A scratch directory for this test, created under TMPDIR or /tmp, and
 * removed at exit if the test emptied it (a failing test's files stay).
 */
static inline const char *t_tmpdir(void)
{
	char *dir = t_tmpdir_path;

	if (!dir[0]) {
		const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

		snprintf(dir, sizeof(t_tmpdir_path), "%s/halite-test-XXXXXX", base);
		if (!mkdtemp(dir)) {
			perror("mkdtemp");
			exit(1);
		}
		atexit(t_tmpdir_remove);
	}
	return dir;
}

/* --- descriptors over a unix socket (SCM_RIGHTS) --- */

/* One byte and room for one descriptor: what both ends exchange. */
struct t_fd_msg {
	char byte;
	struct iovec iov;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m;
};

static inline struct msghdr *t_fd_msg_init(struct t_fd_msg *f)
{
	memset(f, 0, sizeof(*f));
	f->iov = (struct iovec){ &f->byte, 1 };
	f->m = (struct msghdr){ .msg_iov = &f->iov, .msg_iovlen = 1, .msg_control = f->u.buf,
				.msg_controllen = sizeof(f->u.buf) };
	return &f->m;
}

/* @fd to the other end of @sock: 0 or -errno. */
static inline int t_send_fd(int sock, int fd)
{
	struct t_fd_msg f;
	struct msghdr *m = t_fd_msg_init(&f);
	struct cmsghdr *c0 = CMSG_FIRSTHDR(m);

	c0->cmsg_level = SOL_SOCKET;
	c0->cmsg_type = SCM_RIGHTS;
	c0->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c0), &fd, sizeof(int));
	return sendmsg(sock, m, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* The descriptor the other end of @sock sent (close-on-exec), or -1. */
static inline int t_recv_fd(int sock)
{
	struct t_fd_msg f;
	struct msghdr *m = t_fd_msg_init(&f);
	int fd;

	if (recvmsg(sock, m, MSG_CMSG_CLOEXEC) != 1 || !CMSG_FIRSTHDR(m))
		return -1;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(m)), sizeof(int));
	return fd;
}

/*
 * A test guest's vCPU threads started: wait until all @n have parked
 * (*@parked == @n), then take their thread ids from @tid into @tids.
 */
static inline void t_wait_parked(_Atomic int *parked, int n, _Atomic pid_t *tid, pid_t *tids)
{
	while (atomic_load(parked) != n)
		usleep(50);
	for (int i = 0; i < n; i++)
		tids[i] = atomic_load(&tid[i]);
}

/*
 * Copy guest memory without touching it: reading a never-touched page maps
 * the zero page there, and an engine would rightly see it as touched.
 * Unpopulated 4 KiB pages are left as they are in @dst.
 */
static inline void t_copy_resident(uint8_t *dst, const uint8_t *mem, size_t len)
{
	unsigned char *vec = malloc(len / 4096);

	if (!vec || mincore((void *)mem, len, vec)) {
		fprintf(stderr, "t_copy_resident: mincore: %s\n", strerror(errno));
		abort();
	}
	for (size_t p = 0; p < len / 4096; p++)
		if (vec[p] & 1)
			memcpy(dst + p * 4096, mem + p * 4096, 4096);
	free(vec);
}

#endif
