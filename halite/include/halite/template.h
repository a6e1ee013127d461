/* SPDX-License-Identifier: MIT */
/*
 * Many guests from one snapshot: a template source shared by every clone,
 * and one session per clone (docs/clones.md).
 *
 * Template. One per snapshot file: the reader, and the template memory
 * file, a file on tmpfs holding the snapshot's memory (each region at its
 * offset, see halite_template_region()). Every locality block (LB) is read,
 * verified and decoded once, into that file, whoever asks first; the page
 * cache of that file is the decoded-block cache every clone shares. A
 * per-memory-block fill map beside it (MEM_PATH.fill, a shared mapping) says
 * which blocks are in: a block's bit is set only after all its bytes are
 * written, so a template reopened after its process died (same snapshot,
 * same files) keeps what it had and decodes again only what was half done.
 * A background prefetcher fills the rest, the learned hot set first, then in
 * file order (the saved access order), throttled while faults are busy.
 *
 * Session. One per clone: the clone's VMM maps the template memory file
 * privately (MAP_PRIVATE: pages no clone wrote exist once on the host, a
 * write copies) and hands over a userfaultfd created inside it. Its regions
 * are registered MISSING and MINOR. A fault on a block already in the file
 * is answered with UFFDIO_CONTINUE (the page cache page mapped read-only;
 * a write then copies it), on a zero or never-touched block with the zero
 * page, on any other block by asking the template for its LB and answering
 * once the block is in; then the other blocks of that LB that are in are
 * mapped as well (what the guest touched next during the save). Per clone there is only its descriptor, its waiting
 * faults and its statistics. When the template is complete every session
 * unregisters: its clone runs on without the engine.
 *
 * Failure. An LB that fails its checksum (after read_retries re-reads) is
 * never decoded into the file; every session waiting for it fails with a
 * message naming the LB, its threads stay blocked (never zeros), the other
 * sessions go on. A session freed while faults wait leaves its clone's
 * faulting threads blocked: the userfaultfd lives in the clone, and a new
 * session with HALITE_SESSION_ATTACH takes it over (a restarted daemon),
 * waking every waiting thread so their faults come again.
 *
 * The hot set: stored blocks any session faulted on in its first
 * hot_window_ms, in first-fault order (learned), saved beside the template
 * (halite_template_hotset_save()) as a restore trace of version 2
 * (docs/restore-trace.md: `halite-inspect relayout SNAPSHOT --trace HOTSET`
 * takes it) and read at open; then, for a snapshot that halite-inspect
 * relayout wrote, the stored blocks of its hot prefix (metadata
 * halite.relayout hot-lbs=K: LBs 0..K-1, in file order) not learned. The
 * prefetcher fills them first, and a session started with
 * HALITE_SESSION_PREMAP_HOT maps them before it returns (the clone then
 * never faults on them).
 */
#ifndef HALITE_TEMPLATE_H
#define HALITE_TEMPLATE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/format.h>
#include <halite/log.h>

#ifdef __cplusplus
extern "C" {
#endif

struct halite_template;
struct halite_session;

#define HALITE_TEMPLATE_NO_PREFETCH 0x1u /* faults only (tests, measurements) */
/*
 * Never start over a memory file that exists: one that belongs to another
 * snapshot (or layout) fails the open with -HALITE_E_STATE instead of being
 * truncated (a daemon reloading a template whose clones map that file).
 */
#define HALITE_TEMPLATE_NO_RESET 0x2u
#define HALITE_TEMPLATE_FLAGS_ALL 0x3u

struct halite_template_opts {
	size_t sz;
	unsigned flags;		    /* HALITE_TEMPLATE_* */
	unsigned readers;	    /* LB reader threads; 0 = 4, at most 64 */
	unsigned read_retries;	    /* extra attempts at an LB that fails; 0 = 2 */
	uint32_t read_latency_us;   /* added to every LB read (benchmarks) */
	uint32_t prefetch_idle_us;  /* prefetch once no fault came for this long; 0 = 2000 */
	uint64_t prefetch_min_rate; /* bytes per second at least; 0 = 64 MiB/s */
	/*
	 * The hot set file: read at open if it exists, written by
	 * halite_template_hotset_save(). Read: a version 2 restore trace of
	 * this snapshot (its touch lines of stored blocks, in order), or the
	 * binary format before it ("HLTHOT01", template.c). One that is not
	 * this snapshot's, or is damaged, is ignored with a warning saying why.
	 * NULL: none (a relayouted snapshot's hot prefix is still used).
	 * Copied.
	 */
	const char *hotset_path;
	uint32_t hot_window_ms;	    /* a session's faults this long after its start are hot;
				       0 = 2000 */
	halite_log_fn log;
	void *log_ctx;
	int log_level;
	/*
	 * An open reader of @snapshot (halite_reader_opts.same_as), or NULL:
	 * the template reads the version the caller looked into, and an
	 * object costs no second open. Only read during halite_template_open().
	 */
	const struct halite_reader *same_as;
};

/*
 * Open @snapshot and the template memory file @mem_path (on tmpfs:
 * -HALITE_E_UNSUPPORTED elsewhere), creating it and @mem_path.fill if
 * missing (O_EXCL, mode 0600), reusing them if they belong to this snapshot
 * (same file uuid and layout), else starting them over (unless
 * HALITE_TEMPLATE_NO_RESET). Existing files are opened without following a
 * symbolic link and refused with -EPERM unless they are regular files of
 * this process's uid that group and others cannot write. @snapshot may be
 * "/proc/self/fd/N" (a descriptor the caller keeps: the file it was opened
 * as, whatever its path names since).
 * Returns 0, the reader's code for a bad file, -EINVAL, -EPERM,
 * -HALITE_E_STATE (NO_RESET), or -errno; a failed open leaves no file it
 * created.
 */
int halite_template_open(struct halite_template **t, const char *snapshot, const char *mem_path,
			 const struct halite_template_opts *opts);

/* The template memory file, open read-only: map it MAP_PRIVATE. */
int halite_template_memfd(const struct halite_template *t);
/* Where region @name lives in the memory file. 0 or -HALITE_E_NOT_FOUND. */
int halite_template_region(const struct halite_template *t, const char *name, uint64_t *offset,
			   uint64_t *length);
struct halite_reader *halite_template_reader(struct halite_template *t);

/* Wait until every stored block is in the memory file (0), -ETIMEDOUT, or an LB's failure. */
int halite_template_wait(struct halite_template *t, int timeout_ms);

/*
 * Write the hot set learned so far (read at open and since; not a
 * relayouted file's prefix, which is the file's already) to hotset_path:
 * a restore trace of version 2 without stat and lb lines
 * (docs/restore-trace.md, "written by a template"), to a temporary file
 * renamed over it. 0, -EINVAL (no hotset_path) or -errno.
 */
int halite_template_hotset_save(struct halite_template *t);

struct halite_template_stats {
	uint64_t mb_total, mb_stored; /* memory blocks; of them stored (not zero or untouched) */
	uint64_t mb_in;		      /* stored blocks in the memory file */
	uint64_t mb_in_at_open;	      /* of which found there at open (a reopened template) */
	uint64_t lb_total;
	uint64_t lb_in_at_open;	      /* LBs all of whose blocks were in at open: never read
					 (lb_demand + lb_prefetch + lb_in_at_open == lb_total
					 once complete) */
	uint64_t lb_demand;	      /* LBs read because a session waited for one of their blocks */
	uint64_t lb_prefetch;	      /* LBs read by the prefetcher */
	uint64_t lb_failed;	      /* LBs that failed for good */
	uint64_t lb_retries;
	uint64_t bytes_read;	      /* every LB read that returned, retries included */
	uint64_t mb_decoded;	      /* blocks decoded into the memory file */
	uint64_t requests;	      /* blocks sessions asked for */
	uint64_t hits;		      /* ... that were in already */
	uint64_t joined;	      /* ... whose LB was being read already */
	uint64_t mem_bytes;	      /* memory file's resident bytes */
	uint64_t hot_mb;	      /* blocks in the hot set: read at open, learned since, and a
					 relayouted file's prefix blocks not among those */
	uint64_t hot_mb_prefix;	      /* of hot_mb: from the relayouted file's prefix */
	bool complete;
	int error;		      /* first LB failure, else 0 */
};
void halite_template_stats(struct halite_template *t, struct halite_template_stats *st);
/* The first failure, "" if none. Valid until free. */
const char *halite_template_errmsg(const struct halite_template *t);
/* Free every session first. NULL is fine. The memory and fill files stay. */
void halite_template_free(struct halite_template *t);

struct halite_session_region {
	const char *name; /* a region of the template's file */
	uint64_t host;	  /* the owner's private mapping of the memory file at the region's
			     offset, same length, host-page aligned */
	uint64_t length;
};

/* The descriptor had its handshake already and may have pages in (a daemon restarted). */
#define HALITE_SESSION_ATTACH 0x1u
/* Map the template's hot set (reading what is not in yet) before start returns. */
#define HALITE_SESSION_PREMAP_HOT 0x2u
/* This session's faults do not add to the hot set. */
#define HALITE_SESSION_NO_HOT_RECORD 0x4u
#define HALITE_SESSION_FLAGS_ALL 0x7u

struct halite_session_opts {
	size_t sz;
	unsigned flags;		  /* HALITE_SESSION_* */
	pid_t owner_pid;	  /* the clone's VMM; 0 = this process */
	int owner_uffd;		  /* a userfaultfd created inside the owner (duplicated);
				     -1 with owner_pid 0: the engine makes one */
	const pid_t *vcpu_tids;	  /* optional, for per-vCPU fault counts */
	uint32_t nvcpus;
	char *errbuf;		  /* if set, a failed start explains itself here (as
				     halite_reader_opts's: the session is gone by then) */
	size_t errbuf_len;
};

struct halite_session_stats {
	uint64_t ready_ns;	/* start call to return (registered; hot set mapped) */
	uint64_t duration_ns;	/* return to done (or to now) */
	uint64_t faults;	/* page faults served */
	uint64_t faults_cached; /* ... on a block in the memory file already */
	uint64_t faults_read;	/* ... that waited for an LB read (own or another clone's) */
	uint64_t faults_zero;	/* ... on zero or never-touched blocks */
	uint64_t faults_vcpu;	/* ... from the vCPU threads given */
	uint64_t mb_premapped;	/* hot blocks mapped at start */
	uint64_t mb_neighbours; /* blocks mapped because another block of their LB faulted */
	uint64_t lb_read;	/* LBs the template read because this session asked first (its
				   share of the template's demand reads; prefetched ones are no
				   one's) */
	uint64_t bytes_read;	/* ... their bytes */
	uint64_t fault_p50_ns, fault_p99_ns; /* fault read to wake */
	bool done;		/* template complete, ranges unregistered */
	int error;
};

/*
 * Register the regions and serve their faults from @t. Returns once the
 * clone may run (0), or -errno / -HALITE_E_*: -EINVAL (bad regions),
 * -HALITE_E_UNSUPPORTED (kernel features), -HALITE_E_STATE (ATTACH on a
 * descriptor without a handshake, or a handshake without ATTACH).
 */
int halite_session_start(struct halite_session **s, struct halite_template *t,
			 const struct halite_session_region *regions, uint32_t nregions,
			 const struct halite_session_opts *opts);
/* Wait for done (0), -ETIMEDOUT, or the session's failure; -EINVAL for NULL. Thread-safe. */
int halite_session_wait(struct halite_session *s, int timeout_ms);
void halite_session_stats(struct halite_session *s, struct halite_session_stats *st);
const char *halite_session_errmsg(const struct halite_session *s);
/*
 * Stop serving and free. Faults waiting stay blocked in the clone (take it
 * over with HALITE_SESSION_ATTACH, or kill the clone). A session of this
 * process's memory (owner_pid 0) not done makes its regions PROT_NONE
 * first, so a waiting thread gets SIGSEGV, never zeros. NULL is fine.
 */
void halite_session_free(struct halite_session *s);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_TEMPLATE_H */
