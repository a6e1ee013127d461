/* SPDX-License-Identifier: MIT */
/* Private to testing/synth: the guest's insides, shared by its .c files. */
#ifndef HALITE_SYNTH_INTERNAL_H
#define HALITE_SYNTH_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log_internal.h"
#include "synth.h"

#define PG_SHIFT 12
#define PG_SIZE 4096ull
#define HUGE2M_FRAMES 512ull
#define HUGE1G_FRAMES (512ull * 512)

/* x86-64 paging entry bits (SDM vol. 3, 4.5). */
#define PTE_P		(1ull << 0)
#define PTE_RW		(1ull << 1)
#define PTE_US		(1ull << 2)
#define PTE_A		(1ull << 5)
#define PTE_D		(1ull << 6)
#define PTE_PS		(1ull << 7)
#define PTE_NX		(1ull << 63)
#define PTE_ADDR	0x000ffffffffff000ull	/* bits 12..51 */
#define PTE_ADDR_2M	0x000fffffffe00000ull
#define PTE_ADDR_1G	0x000fffffc0000000ull

enum synth_state {
	ST_CREATED = 0,	/* parked, never started */
	ST_RUN,
	ST_PAUSE,
	ST_STOP,
};

struct tlb_entry {
	uint64_t tag;	/* vpn + 1; 0 = empty */
	uint64_t gpa;	/* page GPA; bit 0: walk already set D (AD mode) */
};

#define REC_BUF 1024

struct synth_vcpu {
	struct synth_guest *g;
	unsigned idx;
	pthread_t thread;
	bool thread_ok;
	pid_t tid;
	uint64_t cr3;
	uint64_t vbase, vspan;
	uint64_t map_units, ws_units;
	uint64_t *unit_va, *unit_gpa;	/* builder's record, VA order */

	/* Replay: this vCPU's records. */
	uint64_t *rep_va;
	uint8_t *rep_wr;
	uint64_t rep_n;
	/* Done after this many accesses (0: never); set under g->mu while quiet. */
	uint64_t limit;

	/* Written by the vCPU thread; read by others with __atomic loads. */
	_Alignas(64) uint64_t accesses;
	uint64_t writes, faults, walks;
	uint64_t log_len;	/* release-stored after the entry */
	uint64_t log_dropped;
	uint64_t *log;
	uint64_t sink;		/* reads go here so they are not optimized out */
	uint64_t rng;
	struct tlb_entry *tlb;
	/* Record buffer (the vCPU's; flushed under g->trace_mu). */
	uint8_t *rec;
	unsigned rec_n;
	bool done;		/* under g->mu */
};

struct synth_remote;

struct synth_guest {
	struct synth_opts o;		/* normalized */
	struct halite_logger log;
	struct synth_remote *rem;	/* child mode: everything else unused */

	uint8_t *mem;
	uint64_t nframes;
	int memfd;
	struct synth_info info;

	uint8_t *kinds;			/* per frame, enum synth_frame_kind */
	uint64_t *touched;		/* SYNTH_LOG_FIRST: bitmap of frames */

	/* Control. state is written under mu, read relaxed by the vCPUs. */
	pthread_mutex_t ctl_mu;		/* serializes control calls */
	pthread_mutex_t mu;
	pthread_cond_t cv_run;		/* vCPUs wait: state changed */
	pthread_cond_t cv_parked;	/* controllers wait: parked/done changed */
	int state;
	unsigned nparked, ndone;
	bool mu_ok;

	int trace_fd;
	pthread_mutex_t trace_mu;
	int trace_err;

	unsigned nvcpus;
	struct synth_vcpu vcpu[SYNTH_MAX_VCPUS];
};

/* options.c */
int synth_normalize_opts(struct synth_opts *o, const struct synth_opts *in);
/* The VA extent reserved per vCPU: its layout (synth.h) rounded up to 1 GiB. */
uint64_t synth_vspan(const struct synth_opts *o);

/* pagetable.c */
/* Build the tables into @mem (guest memory, or a scratch copy with SYNTH_F_ATTACH). */
int synth_build_tables(struct synth_guest *g, uint8_t *mem);
/* Translate @va for @vc; 0 and *gpa, or -EFAULT. Logs walk frames. */
int synth_mmu_translate(struct synth_vcpu *vc, uint64_t va, bool write, uint64_t *gpa);

/* fill.c */
/* Choose the zeroed data frames (kinds) and, if @write, fill memory. */
int synth_fill(struct synth_guest *g, bool write);

/* trace.c */
int synth_trace_open_out(struct synth_guest *g);
int synth_trace_load(struct synth_guest *g);
void synth_trace_append(struct synth_vcpu *vc, uint64_t va, bool write);
int synth_trace_flush_vcpu(struct synth_vcpu *vc);

/* log.c */
void synth_log_append(struct synth_vcpu *vc, uint64_t ent);
int synth_local_log_read(struct synth_guest *g, unsigned vcpu, uint64_t off, uint64_t *out,
			 size_t max);
/* Every vCPU parked: the logs and the first-touch bitmap emptied. */
void synth_log_clear(struct synth_guest *g);

/*
 * local.c: the guest in this process, for the API in guest.c and for the
 * child's server in child.c. Arguments are checked by the caller (a vCPU
 * index below nvcpus; a range of whole pages inside memory); the calls that
 * need the guest quiet return -EBUSY while it runs, as the API says.
 */
int synth_local_create(struct synth_guest **gp, const struct synth_opts *o);
void synth_local_free(struct synth_guest *g);
/* From created (@start) or paused to running. */
int synth_local_run(struct synth_guest *g, bool start);
/* @timeout_ms < 0: wait forever. */
int synth_local_pause(struct synth_guest *g, long timeout_ms);
int synth_local_stop(struct synth_guest *g);
int synth_local_wait_done(struct synth_guest *g, unsigned timeout_ms);
int synth_local_vcpu_seek(struct synth_guest *g, unsigned vcpu, uint64_t accesses);
int synth_local_vcpu_limit(struct synth_guest *g, unsigned vcpu, uint64_t accesses);
int synth_local_vcpu_pages(struct synth_guest *g, unsigned vcpu, uint64_t first, uint64_t *va,
			   uint64_t *gpa, size_t n);
int synth_local_frame_kinds(struct synth_guest *g, uint64_t first, uint8_t *kinds, size_t n);
void synth_local_vcpu_stats(struct synth_guest *g, unsigned vcpu, struct synth_vcpu_stats *st);
int synth_local_log_reset(struct synth_guest *g);
int synth_local_trace_flush(struct synth_guest *g);
int synth_local_copy_range(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf);
int synth_local_get_uffd(void);
int synth_local_madvise_dontneed(struct synth_guest *g, uint64_t gpa, uint64_t len);
/* Copy [gpa, gpa+len) of a memfd: pread, which reads holes as zeros without filling them. */
int synth_memfd_copy(int fd, uint64_t gpa, uint64_t len, void *buf);

/* child.c: the child that holds the guest in child mode, and the parent's end of it. */
int synth_remote_create(struct synth_guest *g);
void synth_remote_free(struct synth_guest *g);
int synth_remote_call(struct synth_guest *g, unsigned op, uint64_t a0, uint64_t a1,
		      uint64_t a2, void *out, size_t out_len, int *fd_out);
int synth_remote_copy(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf);

enum synth_op {
	OP_HELLO = 1,
	OP_START,
	OP_PAUSE,
	OP_RESUME,
	OP_STOP,
	OP_WAIT_DONE,
	OP_STATS,
	OP_LOG_READ,
	OP_LOG_RESET,
	OP_PAGES,
	OP_KINDS,
	OP_UFFD,
	OP_MADVISE,
	OP_TRACE_FLUSH,
	OP_EXIT,
};

/* splitmix64: seeds from (seed, salt) pairs, so streams do not overlap. */
static inline uint64_t synth_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* xorshift64*, the tests' t_rand. */
static inline uint64_t synth_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static inline uint64_t synth_seed(uint64_t seed, uint64_t salt)
{
	uint64_t s = synth_mix(seed ^ synth_mix(salt));

	return s ? s : 1;
}

/* How many of @n items from @first a reply holds: those below @total, at most INT32_MAX. */
static inline size_t synth_run_len(uint64_t first, uint64_t total, size_t n)
{
	if (first >= total)
		return 0;
	if (n > total - first)
		n = (size_t)(total - first);
	return n > INT32_MAX ? INT32_MAX : n;
}

#define synth_err(g, ...) halite_logf(&(g)->log, HALITE_LOG_ERROR, "synth: " __VA_ARGS__)

#endif
