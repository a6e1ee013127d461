/* SPDX-License-Identifier: MIT */
/*
 * tests/reliability: small programs against the public API, one per way the
 * engines were seen to lose data, hang or crash (issue 12). Each case is a
 * function; CHECK() (tests/check.h) records a failure and goes on; main()
 * ends with check_result(). Everything that faults on guest memory runs
 * under an alarm, so a hung engine fails the test instead of hanging the
 * runner.
 */
#ifndef HALITE_TESTS_REL_H
#define HALITE_TESTS_REL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "check.h"
#include "test_util.h"

#define REL_PAGE 4096u
#define REL_MB (2 * REL_PAGE)

/* Dies: a step the rest of the case cannot go on without. */
#define REQUIRE(cond, ...)                                                             \
	do {                                                                           \
		if (!(cond)) {                                                         \
			printf("FATAL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
			printf(__VA_ARGS__);                                           \
			printf("\n");                                                  \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

/*
 * Whether case @name was asked for on the command line (all are when none
 * is named).
 */
static inline bool rel_wanted(int argc, char **argv, const char *name)
{
	if (argc < 2)
		return true;
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], name))
			return true;
	return false;
}

static inline uint64_t rel_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void rel_sleep_us(unsigned us)
{
	struct timespec ts = { us / 1000000, (long)(us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static inline pid_t rel_tid(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* Skip (77) without userfaultfd; a 300 s alarm over the whole program. */
static inline void rel_begin(const char *name)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		printf("SKIP %s: userfaultfd: %s\n", name, strerror(errno));
		exit(77);
	}
	close(fd);
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(300);
}

static inline char *rel_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *rel_path(const char *fmt, ...)
{
	char name[128], *p;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	if (asprintf(&p, "%s/halite-rel-%d-%s", t_tmpdir(), (int)getpid(), name) < 0)
		exit(1);
	return p;
}

/* Private anonymous memory, 4 KiB pages (THP would populate neighbours). */
static inline uint8_t *rel_map_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	REQUIRE(p != MAP_FAILED, "mmap %zu: %s", len, strerror(errno));
	madvise(p, len, MADV_NOHUGEPAGE);
	return p;
}

/* A shared memfd mapping of @len bytes; *fd gets the memfd. */
static inline uint8_t *rel_map_memfd(size_t len, int *fd)
{
	void *p;

	*fd = memfd_create("halite-rel", MFD_CLOEXEC);
	REQUIRE(*fd >= 0 && !ftruncate(*fd, (off_t)len), "memfd: %s", strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	REQUIRE(p != MAP_FAILED, "mmap memfd: %s", strerror(errno));
	return p;
}

/* A thread that reads (or writes, @value != 0) one word and says when it returned. */
struct rel_touch {
	volatile uint64_t *addr;
	uint64_t value;	  /* 0: read; else written */
	uint64_t got;	  /* what the read saw */
	_Atomic pid_t tid;
	_Atomic int done;
	pthread_t thr;
};

static void *rel_touch_main(void *arg)
{
	struct rel_touch *t = arg;

	atomic_store(&t->tid, rel_tid());
	if (t->value)
		*t->addr = t->value;
	else
		t->got = *t->addr;
	atomic_store(&t->done, 1);
	return NULL;
}

static inline void rel_touch_start(struct rel_touch *t, void *addr, uint64_t value)
{
	*t = (struct rel_touch){ .addr = addr, .value = value };
	REQUIRE(!pthread_create(&t->thr, NULL, rel_touch_main, t), "pthread_create");
}

/* Waits up to @ms for the touch; true if it returned (then joined). */
static inline bool rel_touch_wait(struct rel_touch *t, unsigned ms)
{
	uint64_t end = rel_now_ms() + ms;

	while (!atomic_load(&t->done) && rel_now_ms() < end)
		rel_sleep_us(200);
	if (!atomic_load(&t->done))
		return false;
	pthread_join(t->thr, NULL);
	return true;
}

/*
 * Read the word at @p from a thread (it may fault) and wait up to @ms: true
 * and *v when it returned. A thread that never returns keeps its record,
 * leaked, rather than write into a stack frame long gone.
 */
static inline bool rel_read_word(void *p, uint64_t *v, unsigned ms)
{
	struct rel_touch *t = malloc(sizeof(*t));

	REQUIRE(t, "malloc");
	rel_touch_start(t, p, 0);
	if (!rel_touch_wait(t, ms))
		return false;
	*v = t->got;
	free(t);
	return true;
}

/* Bytes of @p that are not zero. */
static inline size_t rel_nonzero(const uint8_t *p, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++)
		n += p[i] != 0;
	return n;
}

/* Send / receive one descriptor over a unix socket. */
static inline int rel_send_fd(int sock, int fd)
{
	char c = 0, ctl[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { &c, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
			    .msg_controllen = sizeof(ctl) };
	struct cmsghdr *h = CMSG_FIRSTHDR(&m);

	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof(int));
	return sendmsg(sock, &m, 0) == 1 ? 0 : -errno;
}

static inline int rel_recv_fd(int sock)
{
	char c, ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &c, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
			    .msg_controllen = sizeof(ctl) };
	struct cmsghdr *h;
	int fd = -1;

	if (recvmsg(sock, &m, 0) != 1)
		return -errno;
	h = CMSG_FIRSTHDR(&m);
	if (h && h->cmsg_type == SCM_RIGHTS)
		memcpy(&fd, CMSG_DATA(h), sizeof(int));
	return fd;
}

/* A userfaultfd of this process, no handshake: as an owner hands one to a handler. */
static inline int rel_raw_uffd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	REQUIRE(fd >= 0, "userfaultfd: %s", strerror(errno));
	return fd;
}

/* Shared memory for results from children. */
static inline void *rel_shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	REQUIRE(p != MAP_FAILED, "mmap shared: %s", strerror(errno));
	return p;
}

#endif
