/* SPDX-License-Identifier: MIT */
/*
 * The page-granular peer (s3_pages.h): userfaultfd handler threads that
 * fetch each faulting 4 KiB page with one ranged GET.
 *
 * Several threads read the one userfaultfd, each with its own S3 client (a
 * client is one thread's), so faults of different vCPUs are fetched at once,
 * as a handler with one thread per vCPU would. Two messages for one page
 * (two vCPUs faulting on it) fetch it once: a page's state goes 0 -> 1 (a
 * thread fetches it) -> 2 (installed) by compare-and-swap, and the copy that
 * installs it wakes every thread waiting on it, so a message for a page
 * another thread is fetching is dropped.
 */
#define _GNU_SOURCE
#include "s3_pages.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <halite/halite.h>

#include "s3.h"
#include "uffd.h"

#define PAGE 4096u

enum { PG_NONE, PG_FETCHING, PG_IN };

struct handler {
	struct s3_pages *p;
	struct halite_s3 *s3;
	pthread_t thread;
	bool started;
	void *page;
};

struct s3_pages {
	uint8_t *mem;
	uint64_t len;
	char *bucket, *key;
	int uffd, stop_fd;
	bool registered, stopped;
	_Atomic uint8_t *state;		/* per page: PG_* */
	atomic_uint_fast64_t faults, pages, gets;
	atomic_int error;
	char errmsg[512];		/* the first failure's, written once by its thread */
	atomic_bool errmsg_set;
	unsigned nthreads;
	struct handler h[S3_PAGES_MAX_THREADS];
};

static void set_error(struct s3_pages *p, int err, const char *what, uint64_t off,
		      struct halite_s3 *s3)
{
	int none = 0;

	/* The faulting vCPU stays blocked: nothing better to give it. Say so once. */
	if (!atomic_compare_exchange_strong(&p->error, &none, err))
		return;
	snprintf(p->errmsg, sizeof(p->errmsg), "%s of page %#llx: %s%s%s", what,
		 (unsigned long long)off, halite_strerror(err), s3 ? ": " : "",
		 s3 ? halite_s3_errmsg(s3) : "");
	atomic_store(&p->errmsg_set, true);
}

static int wake(struct s3_pages *p, uint64_t off)
{
	struct uffdio_range w = { (uintptr_t)(p->mem + off), PAGE };

	return ioctl(p->uffd, UFFDIO_WAKE, &w) ? -errno : 0;
}

static int install(struct s3_pages *p, uint64_t off, const void *src)
{
	struct uffdio_copy c = { .dst = (uintptr_t)(p->mem + off), .src = (uintptr_t)src,
				 .len = PAGE, .mode = 0 };

	for (;;) {
		c.copy = 0;
		if (!ioctl(p->uffd, UFFDIO_COPY, &c))
			return 0;
		if (errno == EAGAIN)	/* the mapping changed under the copy: again */
			continue;
		if (errno == EEXIST)	/* a failed copy wakes nobody */
			return wake(p, off);
		return -errno;
	}
}

/* One fault: the page's one GET, unless another thread has it or is getting it. */
static void serve(struct handler *h, uint64_t addr)
{
	struct s3_pages *p = h->p;
	uint64_t off = (addr & ~(uint64_t)(PAGE - 1)) - (uintptr_t)p->mem;
	uint8_t none = PG_NONE;
	int64_t n;
	int ret;

	atomic_fetch_add(&p->faults, 1);
	if (off >= p->len) {
		set_error(p, -EFAULT, "a fault outside the memory", off, NULL);
		return;
	}
	if (!atomic_compare_exchange_strong(&p->state[off / PAGE], &none, PG_FETCHING)) {
		if (none == PG_IN && (ret = wake(p, off)))
			set_error(p, ret, "UFFDIO_WAKE", off, NULL);
		return;
	}
	atomic_fetch_add(&p->gets, 1);
	n = halite_s3_get_range(h->s3, p->key, off, PAGE, h->page, NULL);
	if (n < 0) {
		set_error(p, (int)n, "GET", off, h->s3);
		return;
	}
	if ((size_t)n < PAGE)	/* past the image's end: zeros */
		memset((char *)h->page + n, 0, PAGE - (size_t)n);
	ret = install(p, off, h->page);
	if (ret) {
		set_error(p, ret, "UFFDIO_COPY", off, NULL);
		return;
	}
	atomic_store(&p->state[off / PAGE], PG_IN);
	atomic_fetch_add(&p->pages, 1);
}

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct s3_pages *p = h->p;
	struct uffd_msg msg;

	for (;;) {
		struct pollfd fds[2] = { { p->uffd, POLLIN, 0 }, { p->stop_fd, POLLIN, 0 } };

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			set_error(p, -errno, "poll", 0, NULL);
			break;
		}
		if (fds[1].revents)
			break;
		/* One message at a time: the other threads take the rest meanwhile. */
		if (read(p->uffd, &msg, sizeof(msg)) != sizeof(msg)) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			set_error(p, -errno, "read of the userfaultfd", 0, NULL);
			break;
		}
		if (msg.event == UFFD_EVENT_PAGEFAULT)
			serve(h, msg.arg.pagefault.address);
	}
	return NULL;
}

static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return ret;
}

static int open_clients(struct s3_pages *p, const char *url, char *err, size_t errlen)
{
	struct halite_s3_config cfg;
	int ret = halite_s3_parse_url(url, &p->bucket, &p->key, err, errlen);

	if (ret)
		return ret == -HALITE_S3_E_URL ? ret : fail(err, errlen, ret, "out of memory");
	ret = halite_s3_config_load(&cfg, err, errlen);
	if (ret)
		return ret;
	for (unsigned i = 0; i < p->nthreads && !ret; i++) {
		p->h[i].p = p;
		p->h[i].page = aligned_alloc(PAGE, PAGE);
		ret = p->h[i].page ? halite_s3_open(&p->h[i].s3, &cfg, p->bucket) : -ENOMEM;
		if (ret)
			fail(err, errlen, ret, "an S3 client of %s: %s", url, halite_strerror(ret));
	}
	halite_s3_config_clear(&cfg);
	return ret;
}

static int register_mem(struct s3_pages *p, char *err, size_t errlen)
{
	struct uffdio_register reg = { .range = { (uintptr_t)p->mem, p->len },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	int fd = halite_uffd_open(0, NULL);

	if (fd < 0)
		return fail(err, errlen, fd, "userfaultfd: %s", halite_strerror(fd));
	p->uffd = fd;
	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		return fail(err, errlen, -errno, "UFFDIO_REGISTER: %s", strerror(errno));
	p->registered = true;
	if (!(reg.ioctls & (1ull << _UFFDIO_COPY)))
		return fail(err, errlen, -HALITE_E_UNSUPPORTED,
			    "UFFDIO_COPY is not offered on this memory");
	p->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (p->stop_fd < 0)
		return fail(err, errlen, -errno, "eventfd: %s", strerror(errno));
	return 0;
}

int s3_pages_start(struct s3_pages **pp, void *mem, uint64_t len, const char *url,
		   unsigned threads, char *err, size_t errlen)
{
	struct s3_pages *p;
	int ret;

	if (!threads || threads > S3_PAGES_MAX_THREADS || !len || len % PAGE ||
	    (uintptr_t)mem % PAGE)
		return fail(err, errlen, -EINVAL,
			    "%u handler threads (1 .. %u) for %llu bytes at %p (page aligned)",
			    threads, S3_PAGES_MAX_THREADS, (unsigned long long)len, mem);
	p = calloc(1, sizeof(*p));
	if (!p)
		return fail(err, errlen, -ENOMEM, "out of memory");
	p->mem = mem;
	p->len = len;
	p->uffd = p->stop_fd = -1;
	p->nthreads = threads;
	p->state = calloc(len / PAGE, 1);
	ret = p->state ? open_clients(p, url, err, errlen) : fail(err, errlen, -ENOMEM, "out of memory");
	if (!ret)
		ret = register_mem(p, err, errlen);
	for (unsigned i = 0; !ret && i < threads; i++) {
		ret = -pthread_create(&p->h[i].thread, NULL, handler_main, &p->h[i]);
		if (ret)
			fail(err, errlen, ret, "a handler thread: %s", strerror(-ret));
		else
			p->h[i].started = true;
	}
	if (ret) {
		s3_pages_free(p);
		return ret;
	}
	*pp = p;
	return 0;
}

void s3_pages_stats(struct s3_pages *p, struct s3_pages_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->faults = atomic_load(&p->faults);
	st->pages = atomic_load(&p->pages);
	st->gets = atomic_load(&p->gets);
	st->error = atomic_load(&p->error);
	/* A client's counters are its thread's: read them only once the threads are gone. */
	if (!p->stopped)
		return;
	for (unsigned i = 0; i < p->nthreads; i++) {
		struct halite_s3_stats s;

		if (!p->h[i].s3)
			continue;
		halite_s3_get_stats(p->h[i].s3, &s);
		st->requests += s.requests;
		st->bytes += s.bytes_down;
		st->connects += s.connects;
	}
}

const char *s3_pages_errmsg(struct s3_pages *p)
{
	return atomic_load(&p->errmsg_set) ? p->errmsg : "";
}

int s3_pages_fetched(const struct s3_pages *p, uint64_t off)
{
	return off < p->len && atomic_load(&p->state[off / PAGE]) == PG_IN;
}

void s3_pages_stop(struct s3_pages *p)
{
	uint64_t one = 1;

	if (!p || p->stopped)
		return;
	if (p->stop_fd >= 0 && write(p->stop_fd, &one, sizeof(one)) != sizeof(one))
		fprintf(stderr, "s3_pages: eventfd write: %s\n", strerror(errno));
	for (unsigned i = 0; i < p->nthreads; i++)
		if (p->h[i].started)
			pthread_join(p->h[i].thread, NULL);
	if (p->registered) {
		struct uffdio_range r = { (uintptr_t)p->mem, p->len };

		ioctl(p->uffd, UFFDIO_UNREGISTER, &r);
		p->registered = false;
	}
	p->stopped = true;
}

void s3_pages_free(struct s3_pages *p)
{
	if (!p)
		return;
	s3_pages_stop(p);
	for (unsigned i = 0; i < p->nthreads; i++) {
		halite_s3_close(p->h[i].s3);
		free(p->h[i].page);
	}
	if (p->uffd >= 0)
		close(p->uffd);
	if (p->stop_fd >= 0)
		close(p->stop_fd);
	free(p->state);
	free(p->bucket);
	free(p->key);
	free(p);
}
