/* SPDX-License-Identifier: MIT */
/*
 * Private to restore/: a session, one guest's side of a lazy restore,
 * whatever installs its blocks. The single restore (restore.c) and each
 * clone session (session.c) are a session over a snapshot source
 * (source.h); they differ only in how a block reaches the guest, which is
 * the session's install strategy (struct gs_ops):
 *
 *   copy      the single restore (fault.c, install.c): each block decoded
 *             and copied into private or shared memory (UFFDIO_COPY,
 *             UFFDIO_ZEROPAGE); hugetlbfs regions by huge page (huge.c)
 *   continue  a clone (session.c): the template's memory file holds the
 *             block, the clone's private mapping of it is shown the page
 *             (MINOR faults, UFFDIO_CONTINUE)
 *
 * What the session owns, the same for both: the userfaultfd (its own, or
 * another process's adopted), the regions and their registration, gmem
 * (every install and wake, the guest's discards, unmaps and moves), the
 * vCPU thread table, the fault thread (fault_loop.h) and the place of each
 * fault, the fault counters and service-time histogram, the error (first
 * message wins), the state that wait() sees, the unregistering at the end,
 * and, freed while not done, the PROT_NONE that keeps a guest thread from
 * reading unrestored memory as zeros.
 *
 * Lifecycle: gs_init(), gs_setup() and the regions filled in, gs_open_uffd(),
 * gs_register_all(), gs_make_gmem(), gs_running(), gs_start_thread(); then
 * the strategy serves faults until gs_end() (done or failed), and
 * gs_destroy() after the consumer stopped everything that installs.
 */
#ifndef HALITE_RESTORE_GUEST_SESSION_H
#define HALITE_RESTORE_GUEST_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "gmem.h"
#include "log_internal.h"
#include "stats.h"

struct gsession;

enum { GS_CREATED, GS_RUNNING, GS_DONE, GS_FAILED };

/* A region of guest memory as the session reaches it (filled in by the consumer). */
struct gs_region {
	const char *name;	/* the consumer's, borrowed */
	uint64_t host, length;	/* in the owner's address space */
	uint32_t page;		/* the mapping's page size: 4 KiB or a huge page */
	bool shared;		/* gmem: a discard keeps the data in the page cache */
	/*
	 * Not reached through the descriptor (a copy in this process): never
	 * registered, and a placeholder in gmem.
	 */
	bool placeholder;
	uint64_t mode, need;	/* UFFDIO_REGISTER mode; the ioctls it must allow */
	const char *hint;	/* what the memory must be, said when registering is refused */
	bool registered;
};

/* A fault, placed: its page, whether a write, its thread, when it was read. */
struct gs_fault {
	uint32_t ri;		/* region */
	uint64_t off;		/* page offset in the region */
	bool write;
	uint32_t tid;		/* the faulting thread (UFFD_FEATURE_THREAD_ID) */
	uint32_t vcpu;		/* its vCPU index + 1; 0: another thread */
	uint64_t t0;		/* the message read (halite_now_ns()) */
	/*
	 * The same thread's last fault was on this page too. If the page's
	 * block is not in yet, this is that fault again, not a new one: a
	 * thread waiting on a fault can be woken before it is answered (a
	 * signal, such as QEMU's kick of a vCPU) and faults again at once.
	 * The strategy clears it when the block is in (the thread was
	 * answered: a new fault); what is left is served as any fault but
	 * counted only in faults_again (gs_count_fault(), gs_count_kind()).
	 */
	bool again;
};

/* The install strategy: what the session's faults mean. */
struct gs_ops {
	/* The fault thread: fault @f, inside guest memory. */
	void (*fault)(struct gsession *s, const struct gs_fault *f);
	/* A fault outside guest memory could not be served (@err). NULL: ignored. */
	void (*stray_failed)(struct gsession *s, uint64_t addr, int err);
	/* Before each wait: the poll timeout in ms (-1: none). NULL: -1. */
	int (*timeout_ms)(struct gsession *s);
	/* After each wake-up with the @n faults served: false ends the thread. NULL: go on. */
	bool (*next)(struct gsession *s, int n);
	/* Once, when the session ends (@err 0: done), before wait() sees it. NULL: none. */
	void (*ending)(struct gsession *s, int err);
};

/* Threads whose last fault is remembered at once (more share slots: fewer repeats seen). */
#define GS_LAST_FAULTS 64

struct gsession {
	const struct gs_ops *ops;
	const struct halite_logger *log; /* the consumer's; NULL: none */
	struct gs_region *regions;
	uint32_t nregions;
	pid_t *vcpus;		/* a copy of the caller's vCPU thread ids */
	uint32_t nvcpus;
	uint64_t page;		/* the host's page size */

	int uffd, stop_fd;
	struct halite_gmem *gm;
	pthread_t thread;
	bool thread_started;

	pthread_mutex_t mu;	/* state, error, errmsg, ending, done_ns */
	pthread_cond_t cv;
	int state, error;
	bool ending;
	_Atomic bool failed;	/* set as the session fails, before the end is published */
	char errmsg[512];
	uint64_t start_ns;	/* gs_init() */
	uint64_t running_ns;	/* gs_running(): registered, faults served from here */
	uint64_t done_ns;

	_Atomic uint64_t faults, faults_cached, faults_zero, faults_vcpu;
	_Atomic uint64_t faults_again; /* faults delivered again (gs_fault.again): not counted */
	struct halite_hist hist; /* fault service times, lock-free */
	/* Each thread's last fault page, by tid % GS_LAST_FAULTS (the fault thread's only). */
	struct gs_last_fault { uint32_t tid; uint64_t addr; } last[GS_LAST_FAULTS];
};

/* The error machinery and the state (CREATED), nothing allocated. */
void gs_init(struct gsession *s, const struct gs_ops *ops, const struct halite_logger *log);
/*
 * @nregions regions (zeroed, for the consumer to fill in) and a copy of
 * @nvcpus vCPU thread ids. 0 or -ENOMEM.
 */
int gs_setup(struct gsession *s, uint32_t nregions, const pid_t *vcpus, uint32_t nvcpus);
/* The thread stopped, gmem and the descriptors closed. Zeroed or gs_init()ed: safe. */
void gs_destroy(struct gsession *s);

/*
 * The userfaultfd: adopted from another process (@owner_uffd, our dup of
 * it; -1: our own), with @want features (halite_uffd_acquire() @flags). 0
 * or -errno with the message.
 */
int gs_open_uffd(struct gsession *s, int owner_uffd, uint64_t want, unsigned flags);
/* Every region but placeholders registered. 0 or -errno with the message. */
int gs_register_all(struct gsession *s);
/* Every registered region unregistered (a start that failed). */
void gs_unregister_regions(struct gsession *s);
/* The gmem map of the regions. 0 or -errno with the message. */
int gs_make_gmem(struct gsession *s);
/* Registered: faults are served from here (state RUNNING, running_ns). */
void gs_running(struct gsession *s);
/* The fault thread. 0 or -errno (the caller's message). */
int gs_start_thread(struct gsession *s);
/* The fault thread told to stop and joined (it may already be gone). */
void gs_stop_thread(struct gsession *s);
/* Taken over: the faults the dead handler read are lost; woken, they fault again. */
void gs_wake_all(struct gsession *s);
/*
 * Done: every region unregistered where its memory is now (moves
 * followed), which wakes every waiting thread. 0 or -errno.
 */
int gs_unregister(struct gsession *s);
/* Freed while not done, this process's memory: PROT_NONE, so nothing reads holes as zeros. */
void gs_protect_none(struct gsession *s);

/* The first message wins, logged at @level (later ones at debug). */
void gs_errmsg_level(struct gsession *s, const char *msg, int level);
/* The first message wins, logged as an error; returns -|err|. */
__attribute__((format(printf, 3, 4)))
int gs_fail(struct gsession *s, int err, const char *fmt, ...);
/*
 * Done (@err 0) or failed, once, while RUNNING: ops->ending, then the
 * state wait() sees. True when this call ended it.
 */
bool gs_end(struct gsession *s, int err);
/* Until done (0), failed (its error) or @timeout_ms (-ETIMEDOUT; < 0: none). */
int gs_wait(struct gsession *s, int timeout_ms);
/* GS_* and the error, at once. */
int gs_state(struct gsession *s, int *err);

/* ---- inline: on the fault path ---- */

static inline bool gs_failed(const struct gsession *s)
{
	return atomic_load(&s->failed);
}

/* A fault the strategy takes: counted (and its vCPU's), unless it is one again. */
static inline void gs_count_fault(struct gsession *s, const struct gs_fault *f)
{
	if (f->again) {
		atomic_fetch_add(&s->faults_again, 1);
		return;
	}
	atomic_fetch_add(&s->faults, 1);
	if (f->vcpu)
		atomic_fetch_add(&s->faults_vcpu, 1);
}

/* The kind of fault @f was (faults_cached, faults_zero, ...), unless it is one again. */
static inline void gs_count_kind(_Atomic uint64_t *kind, const struct gs_fault *f)
{
	if (!f->again)
		atomic_fetch_add(kind, 1);
}

/* A fault served: its service time, message read to wake, into the histogram. */
static inline void gs_fault_served(struct gsession *s, uint64_t t0)
{
	halite_hist_add(&s->hist, halite_now_ns() - t0);
}

/* The vCPU of thread @tid among the session's: its index + 1, or 0. */
static inline uint32_t gs_vcpu_of(const struct gsession *s, uint32_t tid)
{
	for (uint32_t i = 0; i < s->nvcpus; i++)
		if ((uint32_t)s->vcpus[i] == tid)
			return i + 1;
	return 0;
}

#endif
