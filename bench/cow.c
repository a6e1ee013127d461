/* SPDX-License-Identifier: MIT */
/*
 * The "plain copy-on-write" peer (see cow.h): what a write-protect-only
 * background snapshot does (QEMU's background-snapshot is the model).
 *
 * Per page a state byte: 0 not saved, 1 held by a saver (copying), 2 saved
 * and unprotected. Whoever takes 0 -> 1 copies the page while it is still
 * write-protected (so the copy is the snapshot instant's content: every
 * write since arm has to go through a fault, which waits), writes it, then
 * unprotects; a page is therefore saved exactly once and never after the
 * guest changed it. A write fault on a page the background holds waits for
 * its state to reach 2 and then unprotects again, which is idempotent and
 * wakes the faulting thread. Reads never fault: that is the point of the
 * peer, against halite's copy-on-access.
 *
 * If anything fails the whole range is unprotected (which wakes every
 * waiter), so a failed save never leaves the guest hung.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cli.h"
#include "cow.h"
#include "stats.h"
#include "uffd.h"

#define PAGE 4096u

enum { ST_FREE = 0, ST_HELD = 1, ST_SAVED = 2 };

struct cow_save {
	int uffd, fd, stop_efd;
	uint8_t *mem;
	uint64_t len, npages;
	_Atomic uint8_t *state;
	struct halite_hist *hist;
	pthread_t fault_thr, bg_thr;
	bool registered, fault_started, bg_started, waited;
	_Atomic int error;
	atomic_uint_fast64_t faults, pages_fault, pages_bg;
	uint64_t t_arm, arm_ns, duration_ns;
};

int cow_probe(char *msg, size_t len)
{
	struct halite_uffd_caps caps;
	uint64_t need = UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_UNPOPULATED;
	char names[256];
	int ret = halite_uffd_probe(&caps);

	if (ret) {
		snprintf(msg, len, "userfaultfd unavailable: %s", strerror(-ret));
		return ret;
	}
	if ((caps.features & need) != need) {
		snprintf(msg, len, "kernel lacks userfaultfd feature(s) %s (WP_UNPOPULATED is Linux 6.4+)",
			 halite_uffd_feature_names(need & ~caps.features, names, sizeof(names)));
		return -HALITE_E_UNSUPPORTED;
	}
	return 0;
}

int cow_create(struct cow_save **out, const char *path, void *mem, uint64_t len)
{
	struct cow_save *c;
	uint64_t missing = 0;
	int ret;

	if (!len || len % PAGE || (uintptr_t)mem % PAGE)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->uffd = c->fd = c->stop_efd = -1;
	c->mem = mem;
	c->len = len;
	c->npages = len / PAGE;
	c->state = calloc(c->npages, 1);
	c->hist = malloc(sizeof(*c->hist));
	if (!c->state || !c->hist) {
		ret = -ENOMEM;
		goto fail;
	}
	halite_hist_init(c->hist);
	c->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (c->fd < 0 || ftruncate(c->fd, (off_t)len)) {
		ret = -errno;
		goto fail;
	}
	c->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->stop_efd < 0) {
		ret = -errno;
		goto fail;
	}
	ret = halite_uffd_open(UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_UNPOPULATED, &missing);
	if (ret < 0)
		goto fail;
	c->uffd = ret;
	*out = c;
	return 0;
fail:
	cow_free(c);
	return ret;
}

static int wp(struct cow_save *c, uint64_t off, uint64_t len, bool protect)
{
	struct uffdio_writeprotect w = {
		.range = { .start = (uintptr_t)c->mem + off, .len = len },
		.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};

	/* EAGAIN: the mm is changing under us (mremap and the like); retry. */
	while (ioctl(c->uffd, UFFDIO_WRITEPROTECT, &w))
		if (errno != EAGAIN)
			return -errno;
	return 0;
}

static void fail(struct cow_save *c, int err)
{
	int zero = 0;

	if (atomic_compare_exchange_strong(&c->error, &zero, err))
		fprintf(stderr, "cow: failed: %s\n", halite_strerror(err));
	/* Never leave a vCPU blocked: unprotect (and so wake) everything. */
	wp(c, 0, c->len, false);
}

/* Save page @p if nobody has; returns 1 if this call saved it, 0 if not, < 0. */
/*
 * Copy, un-protect (which wakes a writer), and only then write the copy out,
 * as a real copy-on-write saver (QEMU's background snapshot) does: the guest
 * never waits for the file. @t0: the fault's arrival, to record its service
 * time at the wake; 0 for the background.
 */
static int take_and_save(struct cow_save *c, uint64_t p, void *buf, uint64_t t0)
{
	uint8_t expect = ST_FREE;
	int ret;

	if (!atomic_compare_exchange_strong(&c->state[p], &expect, ST_HELD))
		return 0;
	memcpy(buf, c->mem + p * PAGE, PAGE);
	ret = wp(c, p * PAGE, PAGE, false);
	/* Release: the waiter in serve_fault() sees the copy done. */
	atomic_store_explicit(&c->state[p], ST_SAVED, memory_order_release);
	if (t0)
		halite_hist_add(c->hist, halite_now_ns() - t0);
	if (!ret)
		ret = halite_pwrite_all(c->fd, buf, PAGE, p * PAGE);
	return ret < 0 ? ret : 1;
}

static int serve_fault(struct cow_save *c, uint64_t addr, void *buf, uint64_t t0)
{
	uint64_t p = (addr - (uintptr_t)c->mem) / PAGE;
	int ret;

	if (addr < (uintptr_t)c->mem || p >= c->npages)
		return -EFAULT;
	ret = take_and_save(c, p, buf, t0);
	if (ret)
		return ret < 0 ? ret : 0;
	/* The background holds it (or saved it just now): wait, then make sure we are woken. */
	while (atomic_load_explicit(&c->state[p], memory_order_acquire) != ST_SAVED)
		sched_yield();
	ret = wp(c, p * PAGE, PAGE, false);
	halite_hist_add(c->hist, halite_now_ns() - t0);
	return ret;
}

static void *fault_main(void *arg)
{
	struct cow_save *c = arg;
	struct uffd_msg msg[64];
	struct pollfd pfd[2] = { { c->uffd, POLLIN, 0 }, { c->stop_efd, POLLIN, 0 } };
	void *buf = aligned_alloc(PAGE, PAGE);

	if (!buf) {
		fail(c, -ENOMEM);
		return NULL;
	}
	for (;;) {
		ssize_t n;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			fail(c, -errno);
			break;
		}
		if (pfd[1].revents)
			break;
		n = read(c->uffd, msg, sizeof(msg));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			fail(c, -errno);
			break;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++) {
			/*
			 * Timed from its turn, as the peer always was: the pwrite of
			 * the fault before it in the batch is not counted (the engine
			 * times from the batch's read, which is stricter).
			 */
			uint64_t t0 = halite_now_ns();
			int ret;

			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			ret = serve_fault(c, msg[i].arg.pagefault.address & ~(uint64_t)(PAGE - 1), buf,
					  t0);
			if (ret < 0) {
				fail(c, ret);
				continue;
			}
			atomic_fetch_add(&c->faults, 1);
		}
	}
	free(buf);
	return NULL;
}

static void *bg_main(void *arg)
{
	struct cow_save *c = arg;
	void *buf = aligned_alloc(PAGE, PAGE);
	uint64_t mine = 0;

	if (!buf) {
		fail(c, -ENOMEM);
		return NULL;
	}
	for (uint64_t p = 0; p < c->npages && !atomic_load(&c->error); p++) {
		int ret = take_and_save(c, p, buf, 0);

		if (ret < 0)
			fail(c, ret);
		mine += ret > 0;
	}
	/* Pages the fault thread still holds finish quickly. */
	for (uint64_t p = 0; p < c->npages && !atomic_load(&c->error); p++)
		while (atomic_load_explicit(&c->state[p], memory_order_acquire) != ST_SAVED)
			sched_yield();
	atomic_store(&c->pages_bg, mine);
	if (!atomic_load(&c->error) && fdatasync(c->fd))
		fail(c, -errno);
	free(buf);
	return NULL;
}

int cow_arm(struct cow_save *c)
{
	struct uffdio_register reg = {
		.range = { .start = (uintptr_t)c->mem, .len = c->len },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};
	int ret;

	c->t_arm = halite_now_ns();
	if (ioctl(c->uffd, UFFDIO_REGISTER, &reg))
		return -errno;
	c->registered = true;
	if (!(reg.ioctls & (1ull << _UFFDIO_WRITEPROTECT)))
		return -HALITE_E_UNSUPPORTED;
	/* O(memory): every PTE (and, with WP_UNPOPULATED, a marker for every hole). */
	ret = wp(c, 0, c->len, true);
	if (ret)
		return ret;
	c->arm_ns = halite_now_ns() - c->t_arm;
	ret = pthread_create(&c->fault_thr, NULL, fault_main, c);
	if (ret) {
		wp(c, 0, c->len, false);
		return -ret;
	}
	c->fault_started = true;
	ret = pthread_create(&c->bg_thr, NULL, bg_main, c);
	if (ret) {
		fail(c, -ret);
		return -ret;
	}
	c->bg_started = true;
	return 0;
}

static void stop_threads(struct cow_save *c)
{
	uint64_t one = 1;

	if (c->bg_started) {
		pthread_join(c->bg_thr, NULL);
		c->bg_started = false;
	}
	if (c->fault_started) {
		/* Every page is unprotected by now, so no fault can still need us. */
		if (write(c->stop_efd, &one, sizeof(one)) != sizeof(one))
			abort();
		pthread_join(c->fault_thr, NULL);
		c->fault_started = false;
	}
	if (c->registered) {
		struct uffdio_range r = { (uintptr_t)c->mem, c->len };

		if (ioctl(c->uffd, UFFDIO_UNREGISTER, &r))
			fail(c, -errno);
		c->registered = false;
	}
}

int cow_wait(struct cow_save *c)
{
	if (!c->waited) {
		stop_threads(c);
		c->duration_ns = halite_now_ns() - c->t_arm;
		c->waited = true;
	}
	return atomic_load(&c->error);
}

void cow_get_stats(struct cow_save *c, struct cow_stats *st)
{
	*st = (struct cow_stats){
		.arm_ns = c->arm_ns,
		.duration_ns = c->duration_ns,
		.faults = atomic_load(&c->faults),
		.fault_p50_ns = halite_hist_quantile(c->hist, 0.5),
		.fault_p99_ns = halite_hist_quantile(c->hist, 0.99),
		.fault_max_ns = halite_hist_quantile(c->hist, 1.0),
		.pages_bg = atomic_load(&c->pages_bg),
		.done = c->waited,
		.error = atomic_load(&c->error),
	};
	st->pages_fault = c->npages - st->pages_bg;
}

void cow_free(struct cow_save *c)
{
	if (!c)
		return;
	if (c->bg_started || c->fault_started || c->registered) {
		/* Abandoned mid-save: stop the background, let the guest run free. */
		atomic_store(&c->error, -ECANCELED);
		wp(c, 0, c->len, false);
		stop_threads(c);
	}
	if (c->uffd >= 0)
		close(c->uffd);
	if (c->fd >= 0)
		close(c->fd);
	if (c->stop_efd >= 0)
		close(c->stop_efd);
	free(c->hist);
	free((void *)c->state);
	free(c);
}
