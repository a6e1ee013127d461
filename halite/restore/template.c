// SPDX-License-Identifier: MIT
/*
 * The template source (template.h): one snapshot, read and decoded once for
 * every clone, into the template memory file.
 *
 * Files, both on tmpfs, beside each other:
 *   MEM_PATH       the snapshot's memory: region i at offset[i] (each region
 *                  starts 2 MiB aligned), length[i] bytes; zero and
 *                  never-touched blocks stay holes.
 *   MEM_PATH.fill  the fill map: a 64-byte header, then one byte per memory
 *                  block, 1 once the block's bytes are all in MEM_PATH.
 *
 *   fill header    off  size  field
 *                    0     8  magic "HLTFILL1"
 *                    8    16  snapshot uuid
 *                   24     8  memory blocks (u64 LE)
 *                   32     8  MEM_PATH size (u64 LE)
 *                   40     4  memory block size (u32 LE)
 *                   44    20  zero
 *
 * Both are created O_EXCL 0600 and never opened through a symbolic link; an
 * existing pair is used only if both are regular files of our uid that no
 * one else may write (clones map MEM_PATH: its bytes are their memory).
 * Open reserves (fallocate) the ranges of every stored block in MEM_PATH and
 * the whole fill map, so that a full tmpfs fails the open with -ENOSPC
 * rather than a decode later; blocks are written with pwrite(), so a write
 * that still fails is an LB's error, never SIGBUS.
 *
 * The fill map is a shared mapping, so its bytes outlive this process: a
 * block's byte is set (release) only after the block is written, and a
 * template reopened over the same files keeps every block whose byte is
 * set. A block half written when the process died has no byte: it is
 * decoded again, and no session ever mapped it (sessions map only blocks
 * whose byte is set).
 *
 * Reading. Locality blocks move IDLE -> QUEUED (a session waits on one of
 * its blocks) -> READING -> DONE or FAILED; the prefetcher takes IDLE ones
 * straight to READING. Reader threads serve the demand queue first and
 * prefetch only when no fault came for prefetch_idle_us or the prefetch
 * has fallen below prefetch_min_rate. An LB is read and verified (re-read
 * read_retries times), the blocks sessions wait for are decoded first and
 * their sessions called back, then the rest. A failed LB is never decoded;
 * its waiting sessions get the failure, later requests too.
 *
 * The hot set: the stored blocks sessions faulted on in their first
 * hot_window_ms, in first-fault order (learned), then, for a relayouted
 * snapshot, the stored blocks of its hot prefix (LBs 0..hot-lbs-1 of
 * metadata halite.relayout, in file order) that were not learned. Learned
 * first: it is what clones of this very file touched, the prefix what
 * restores of the file it was relayouted from touched. Only the learned part
 * is saved: the prefix is the file's already.
 *
 * The hot set file (hotset_path) is a restore trace of version 2 without
 * stat and lb lines (docs/restore-trace.md, "written by a template"), so
 * that `halite-inspect relayout SNAPSHOT --trace HOTSET` takes it: a touch
 * line per learned block, t_ns counted from the start of the first session
 * that added one (after the last t_ns read at open, for a reopened
 * template), the session's vCPU index or '-', kind stored. At open any
 * version 2 trace of this snapshot is read (a learning restore's too: its
 * stored blocks' touches). A file of the format before it,
 *   "HLTHOT01" | uuid (16) | count (u64) | count x memory block (u64) |
 *   XXH3-64 of everything before it (u64); all little-endian,
 * is still read (a daemon's state directory from before; its blocks get
 * t_ns 0 and vCPU '-'), and the next save writes it as a trace.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <halite/errors.h>
#include <halite/template.h>

#include "endian_util.h"
#include "learned.h"
#include "log_internal.h"
#include "opts.h"
#include "relayout_meta.h"
#include "stats.h"
#include "template_int.h"
#include "zalloc.h"

#define FILL_MAGIC "HLTFILL1"
#define FILL_HDR 64u
#define HOT_MAGIC "HLTHOT01"
#define REGION_ALIGN (2ull << 20)
#define ULL(x) ((unsigned long long)(x))

enum { LB_IDLE, LB_QUEUED, LB_READING, LB_DONE, LB_FAILED };

struct waiter {
	struct waiter *next;
	struct tpl_client *c;
	uint64_t mb;
	uint64_t tag;
};

struct lbstate {
	uint8_t st;
	bool demand;
	int err;
	char *msg;		/* FAILED: what failed, said once when it did */
	struct waiter *waiters;
};

struct halite_template {
	struct halite_template_opts o;
	struct halite_logger log;
	char *mem_path, *fill_path, *hot_path;
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	struct tpl_region *regions;
	uint32_t nregions;
	uint64_t mb_stored;

	int memfd, ro_fd, fillfd;
	bool created_mem, created_fill; /* by this open: removed if it fails */
	uint64_t mem_size;
	uint8_t *fillmap;  /* MEM_PATH.fill */
	_Atomic uint8_t *fill;

	pthread_mutex_t mu;
	pthread_cond_t work_cv;	 /* readers: work queued, or stop */
	pthread_cond_t state_cv; /* completion, failure, callbacks ended */
	struct lbstate *lbs;
	uint64_t *dq;		 /* demand queue: a ring of lb_total + 1 */
	uint64_t dq_head, dq_tail, dq_cap;
	uint64_t *porder;	 /* prefetch order: hot set's LBs (nhot), then file order */
	uint64_t pcount, pcursor, nhot;
	_Atomic uint64_t last_fault_ns;
	uint64_t open_ns, prefetch_bytes;
	bool stop;
	pthread_t *readers;
	unsigned nreaders;

	uint8_t *hot_bit;	 /* per block: 1 once learned (in @hot) */
	struct learn_touch *hot; /* learned, in first-fault order */
	uint64_t hot_n, hot_cap;
	uint64_t *pre;		 /* the relayouted file's prefix blocks */
	uint64_t pre_n;
	uint64_t hot_base_ns;	 /* start of the first session that added a block */
	uint64_t hot_t_off;	 /* the last t_ns read at open: learned t_ns go on from it */

	_Atomic uint64_t mb_in;
	uint64_t mb_in_at_open, lb_in_at_open;
	_Atomic uint64_t lb_demand, lb_prefetch, lb_failed, lb_retries, bytes_read, mb_decoded;
	_Atomic uint64_t requests, hits, joined;
	int error;
	char errmsg[512];
};

static int tpl_fail(struct halite_template *t, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int tpl_fail(struct halite_template *t, int err, const char *fmt, ...)
{
	va_list ap;

	if (!t->errmsg[0]) {
		va_start(ap, fmt);
		halite_vformat_error(t->errmsg, sizeof(t->errmsg), err, fmt, ap);
		va_end(ap);
		halite_logf(&t->log, HALITE_LOG_ERROR, "%s", t->errmsg);
	}
	return err;
}

/*
 * A failure the template cannot serve past (an LB, or a lookup in a damaged
 * index chunk): the first one becomes the template's error and errmsg.
 * Takes t->mu.
 */
static void tpl_error(struct halite_template *t, int err, const char *msg)
{
	pthread_mutex_lock(&t->mu);
	if (!t->error)
		t->error = err;
	tpl_fail(t, err, "%s", msg);
	pthread_cond_broadcast(&t->state_cv);
	pthread_mutex_unlock(&t->mu);
}

/*
 * Where block @mb is. A format 1.1 file's lookup can fail after open (its
 * index chunk damaged): that is the template's error, with the reader's
 * message naming the chunk, and never a zero block (docs/failure-model.md).
 */
static int mb_lookup(struct halite_template *t, uint64_t mb, struct halite_mb_loc *loc)
{
	int ret = halite_reader_mb_lookup(t->rd, mb, loc);

	if (ret) {
		char msg[512];

		snprintf(msg, sizeof(msg), "memory block %llu: %s", ULL(mb),
			 halite_reader_errmsg(t->rd));
		tpl_error(t, ret, msg);
	}
	return ret;
}

/* ---- geometry ---------------------------------------------------------- */

uint32_t tpl_mb_size(const struct halite_template *t)
{
	return t->fi->mb_size;
}

uint32_t tpl_lb_size(const struct halite_template *t)
{
	return t->fi->lb_size;
}

uint32_t tpl_region_count(const struct halite_template *t)
{
	return t->nregions;
}

const struct tpl_region *tpl_region_at(const struct halite_template *t, uint32_t i)
{
	return i < t->nregions ? &t->regions[i] : NULL;
}

int tpl_find_region(const struct halite_template *t, const char *name)
{
	for (uint32_t i = 0; i < t->nregions; i++)
		if (!strcmp(t->regions[i].name, name))
			return (int)i;
	return -HALITE_E_NOT_FOUND;
}

static const struct tpl_region *mb_region(const struct halite_template *t, uint64_t mb)
{
	for (uint32_t i = 0; i < t->nregions; i++)
		if (mb >= t->regions[i].first_mb && mb - t->regions[i].first_mb < t->regions[i].mb_count)
			return &t->regions[i];
	return NULL;
}

int tpl_mb_state(struct halite_template *t, uint64_t mb)
{
	struct halite_mb_loc loc;
	int ret;

	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire))
		return TPL_MB_IN;
	ret = mb_lookup(t, mb, &loc);
	if (ret)
		return ret;
	return loc.state == HALITE_MB_STORED ? TPL_MB_OUT : TPL_MB_EMPTY;
}

int tpl_lb_members(struct halite_template *t, uint64_t mb, const uint64_t **mbs, uint32_t *n)
{
	struct halite_mb_loc loc;
	int ret = mb_lookup(t, mb, &loc);

	if (ret)
		return ret;
	if (loc.state != HALITE_MB_STORED)
		return -HALITE_E_NOT_FOUND;
	ret = halite_reader_lb_members(t->rd, loc.lb, mbs, n);
	if (ret) {
		char msg[512];

		snprintf(msg, sizeof(msg), "locality block %llu's member list: %s", ULL(loc.lb),
			 halite_reader_errmsg(t->rd));
		tpl_error(t, ret, msg);
	}
	return ret;
}

bool tpl_complete(struct halite_template *t)
{
	return atomic_load(&t->mb_in) == t->mb_stored;
}

uint32_t tpl_hot_window_ms(const struct halite_template *t)
{
	return t->o.hot_window_ms;
}

void tpl_fault_seen(struct halite_template *t)
{
	atomic_store_explicit(&t->last_fault_ns, halite_now_ns(), memory_order_relaxed);
}

/* ---- the memory and fill files ----------------------------------------- */

static void fill_header(const struct halite_template *t, uint8_t *h)
{
	memset(h, 0, FILL_HDR);
	memcpy(h, FILL_MAGIC, 8);
	memcpy(h + 8, t->fi->uuid, 16);
	halite_put_le64(h + 24, t->fi->mb_count);
	halite_put_le64(h + 32, t->mem_size);
	halite_put_le32(h + 40, t->fi->mb_size);
}

/*
 * Create @path (O_EXCL, mode 0600: 1), or open the one there (0), refusing
 * what another user could have put or changed under us: a symbolic link
 * (not followed), anything but a regular file, a file of another uid, or
 * one that group or others may write. Clones map the memory file, so its
 * bytes are their memory.
 */
static int open_own(struct halite_template *t, const char *path, const char *what, int *fdp)
{
	struct stat st;
	int fd;

	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		*fdp = fd;
		return 1;
	}
	if (errno != EEXIST)
		return tpl_fail(t, -errno, "creating the %s %s", what, path);
	fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == ELOOP)
		return tpl_fail(t, -EPERM, "the %s %s is a symbolic link, which the template does "
				"not follow; remove it", what, path);
	if (fd < 0)
		return tpl_fail(t, -errno, "opening the %s %s", what, path);
	*fdp = fd;
	if (fstat(fd, &st))
		return tpl_fail(t, -errno, "%s", path);
	if (!S_ISREG(st.st_mode))
		return tpl_fail(t, -EPERM, "the %s %s is not a regular file; remove it", what, path);
	if (st.st_uid != geteuid())
		return tpl_fail(t, -EPERM, "the %s %s belongs to uid %u, not to this process's "
				"uid %u; remove it", what, path, (unsigned)st.st_uid,
				(unsigned)geteuid());
	if (st.st_mode & 022)
		return tpl_fail(t, -EPERM, "the %s %s may be written by group or others (mode "
				"%04o); remove it, or chmod it 0600", what, path,
				(unsigned)(st.st_mode & 07777));
	return 0;
}

/* Reserve @len bytes at @off of @fd (tmpfs: the pages are allocated now). 0 or -errno. */
static int reserve_range(int fd, uint64_t off, uint64_t len)
{
	int ret;

	if (!len)
		return 0;
	do
		ret = fallocate(fd, 0, (off_t)off, (off_t)len);
	while (ret && errno == EINTR);
	return ret ? -errno : 0;
}

/*
 * Reserve the space every stored block will take in the memory file (runs
 * of neighbouring stored blocks, one fallocate() each; zero and
 * never-touched blocks stay holes) and the whole fill map, so that filling
 * them later cannot run out of room: on a full tmpfs a store to a shared
 * mapping is SIGBUS, for the fill map's bytes as for memory. A block whose
 * map entry fails is not reserved (it is never decoded; its sessions fail).
 */
static int reserve(struct halite_template *t, uint64_t fill_size)
{
	uint64_t run_off = 0, run_len = 0, mbsz = t->fi->mb_size;
	uint64_t need = t->mb_stored * mbsz;
	int ret = 0;

	for (uint32_t i = 0; i < t->nregions && !ret; i++) {
		const struct tpl_region *g = &t->regions[i];

		for (uint64_t k = 0; k < g->mb_count && !ret; k++) {
			uint64_t mb = g->first_mb + k, off = g->offset + k * mbsz;
			uint64_t len = g->length - k * mbsz < mbsz ? g->length - k * mbsz : mbsz;
			struct halite_mb_loc loc;

			if (mb_lookup(t, mb, &loc)) {
				/*
				 * A failed chunk is read again at every use: skip
				 * the rest of its smallest possible span (64
				 * entries, 64-aligned: docs/format.md 5.7) rather
				 * than re-read it for each entry.
				 */
				k += 63 - mb % 64;
				continue;
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			if (run_len && run_off + run_len == off) {
				run_len += len;
				continue;
			}
			ret = reserve_range(t->memfd, run_off, run_len);
			run_off = off;
			run_len = len;
		}
	}
	if (!ret)
		ret = reserve_range(t->memfd, run_off, run_len);
	if (ret)
		return tpl_fail(t, ret, "reserving %llu MiB for the template memory file %s",
				ULL((need + (1 << 20) - 1) >> 20), t->mem_path);
	ret = reserve_range(t->fillfd, 0, fill_size);
	if (ret)
		return tpl_fail(t, ret, "reserving %llu KiB for the template fill map %s",
				ULL((fill_size + 1023) >> 10), t->fill_path);
	return 0;
}

static void uuid_hex(const uint8_t *u, char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", u[i]);
}

/* Reuse the files if they are this snapshot's (1), else start them over (0). */
static int open_files(struct halite_template *t)
{
	uint64_t fill_size = FILL_HDR + t->fi->mb_count;
	uint8_t want[FILL_HDR], have[FILL_HDR] = { 0 };
	struct statfs sfs;
	struct stat st, ro;
	bool reuse = false;
	int ret;

	ret = open_own(t, t->mem_path, "template memory file", &t->memfd);
	if (ret < 0)
		return ret;
	t->created_mem = ret;
	if (fstatfs(t->memfd, &sfs))
		return tpl_fail(t, -errno, "%s", t->mem_path);
	if (sfs.f_type != TMPFS_MAGIC)
		return tpl_fail(t, -HALITE_E_UNSUPPORTED, "template memory file %s is not on tmpfs "
				"(clones map it and fault on it as shared memory)", t->mem_path);
	/* The same file, read-only for the clones: not whatever the path names by now. */
	t->ro_fd = open(t->mem_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (t->ro_fd < 0)
		return tpl_fail(t, -errno, "%s", t->mem_path);
	if (fstat(t->memfd, &st) || fstat(t->ro_fd, &ro) || st.st_dev != ro.st_dev ||
	    st.st_ino != ro.st_ino)
		return tpl_fail(t, -EPERM, "the template memory file %s was replaced while it was "
				"being opened", t->mem_path);
	ret = open_own(t, t->fill_path, "template fill map", &t->fillfd);
	if (ret < 0)
		return ret;
	t->created_fill = ret;

	fill_header(t, want);
	if (!fstat(t->fillfd, &st) && (uint64_t)st.st_size >= FILL_HDR &&
	    pread(t->fillfd, have, FILL_HDR, 0) == FILL_HDR) {
		reuse = (uint64_t)st.st_size == fill_size && !memcmp(have, want, FILL_HDR) &&
			!fstat(t->memfd, &st) && (uint64_t)st.st_size == t->mem_size;
	}
	if (!reuse && (t->o.flags & HALITE_TEMPLATE_NO_RESET) &&
	    (!t->created_mem || !t->created_fill)) {
		char h[33], w[33];

		uuid_hex(want + 8, w);
		if (memcmp(have, FILL_MAGIC, 8))
			return tpl_fail(t, -HALITE_E_STATE, "the template memory file %s exists and "
					"its fill map %s names no snapshot (none, or damaged), not "
					"snapshot %s: not starting them over "
					"(HALITE_TEMPLATE_NO_RESET); remove both, or use another path",
					t->mem_path, t->fill_path, w);
		uuid_hex(have + 8, h);
		return tpl_fail(t, -HALITE_E_STATE, "the template memory file %s belongs to "
				"snapshot %s%s, not to snapshot %s: not starting it over "
				"(HALITE_TEMPLATE_NO_RESET; clones may map it); remove it and %s, or "
				"use another path", t->mem_path, h,
				memcmp(have + 8, want + 8, 16) ? "" : " with another layout", w,
				t->fill_path);
	}
	if (!reuse) {
		/* Start over: drop any old contents, then size both files. */
		if (ftruncate(t->memfd, 0) || ftruncate(t->memfd, (off_t)t->mem_size) ||
		    ftruncate(t->fillfd, 0) || ftruncate(t->fillfd, (off_t)fill_size) ||
		    pwrite(t->fillfd, want, FILL_HDR, 0) != FILL_HDR)
			return tpl_fail(t, -errno, "sizing %s and its fill map", t->mem_path);
	}
	ret = reserve(t, fill_size);
	if (ret) {
		/* Started over: give back what was reserved (a reused pair keeps its blocks). */
		if (!reuse && !t->created_mem) {
			(void)!ftruncate(t->memfd, 0);
			(void)!ftruncate(t->memfd, (off_t)t->mem_size);
		}
		return ret;
	}
	t->fillmap = mmap(NULL, fill_size, PROT_READ | PROT_WRITE, MAP_SHARED, t->fillfd, 0);
	if (t->fillmap == MAP_FAILED) {
		t->fillmap = NULL;
		return tpl_fail(t, -errno, "mapping %s", t->fill_path);
	}
	t->fill = (_Atomic uint8_t *)(t->fillmap + FILL_HDR);
	return reuse ? 1 : 0;
}

/* Remove what this open created, if the path still names it (a failed open leaves nothing). */
static void remove_created(struct halite_template *t)
{
	struct stat a, b;

	if (t->created_mem && t->memfd >= 0 && !fstat(t->memfd, &a) &&
	    !lstat(t->mem_path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		unlink(t->mem_path);
	if (t->created_fill && t->fillfd >= 0 && !fstat(t->fillfd, &a) &&
	    !lstat(t->fill_path, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
		unlink(t->fill_path);
}

/* Count what a reopened template has, and forget bytes of blocks that cannot be in. */
static void count_in(struct halite_template *t)
{
	uint64_t in = 0;

	for (uint64_t mb = 0; mb < t->fi->mb_count; mb++) {
		struct halite_mb_loc loc;

		if (!atomic_load_explicit(&t->fill[mb], memory_order_relaxed))
			continue;
		/*
		 * A block whose entry cannot be read now is not served from the
		 * file: its byte goes, and its sessions fail on their own lookup.
		 */
		if (mb_lookup(t, mb, &loc) || loc.state != HALITE_MB_STORED) {
			atomic_store(&t->fill[mb], 0);
			continue;
		}
		in++;
	}
	atomic_store(&t->mb_in, in);
	t->mb_in_at_open = in;
	/* An LB all of whose blocks are in is never read again. */
	for (uint64_t lb = 0; lb < t->fi->lb_count; lb++) {
		const uint64_t *mbs;
		uint32_t n;
		bool all = !halite_reader_lb_members(t->rd, lb, &mbs, &n);

		for (uint32_t i = 0; all && i < n; i++)
			all = atomic_load_explicit(&t->fill[mbs[i]], memory_order_relaxed);
		if (all) {
			t->lbs[lb].st = LB_DONE;
			t->lb_in_at_open++;
		}
	}
}

/* ---- the hot set ------------------------------------------------------- */

/* Add a learned block (first time wins): 1, 0 if it was, -ENOMEM. */
static int hot_add_locked(struct halite_template *t, const struct learn_touch *lt)
{
	if (t->hot_bit[lt->mb])
		return 0;
	if (t->hot_n == t->hot_cap) {
		uint64_t cap = t->hot_cap ? t->hot_cap * 2 : 1024;
		struct learn_touch *h = realloc(t->hot, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		t->hot = h;
		t->hot_cap = cap;
	}
	t->hot_bit[lt->mb] = 1;
	t->hot[t->hot_n++] = *lt;
	return 1;
}

void tpl_hot_note(struct halite_template *t, uint64_t mb, uint32_t vcpu, uint64_t now,
		  uint64_t start_ns)
{
	struct learn_touch lt = { .mb = mb, .vcpu = vcpu, .kind = HALITE_MB_STORED };

	pthread_mutex_lock(&t->mu);
	if (!t->hot_bit[mb]) {
		if (!t->hot_base_ns)
			t->hot_base_ns = start_ns;
		lt.t_ns = t->hot_t_off + (now > t->hot_base_ns ? now - t->hot_base_ns : 0);
		/* Sessions' faults are noted in lock order; t_ns never goes back. */
		if (t->hot_n && lt.t_ns < t->hot[t->hot_n - 1].t_ns)
			lt.t_ns = t->hot[t->hot_n - 1].t_ns;
		(void)hot_add_locked(t, &lt);
	}
	pthread_mutex_unlock(&t->mu);
}

/* Blocks in the hot set: learned, and the prefix's not learned. Under t->mu. */
static uint64_t hot_count_locked(const struct halite_template *t, uint64_t *prefix)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < t->pre_n; i++)
		n += !t->hot_bit[t->pre[i]];
	if (prefix)
		*prefix = n;
	return t->hot_n + n;
}

int tpl_hot_list(struct halite_template *t, uint64_t **mbs, uint64_t *count)
{
	uint64_t *copy, n, k = 0;

	pthread_mutex_lock(&t->mu);
	n = hot_count_locked(t, NULL);
	copy = malloc((n ? n : 1) * sizeof(*copy));
	if (copy) {
		for (uint64_t i = 0; i < t->hot_n; i++)
			copy[k++] = t->hot[i].mb;
		for (uint64_t i = 0; i < t->pre_n; i++)
			if (!t->hot_bit[t->pre[i]])
				copy[k++] = t->pre[i];
		*count = k;
		*mbs = copy;
	}
	pthread_mutex_unlock(&t->mu);
	return copy ? 0 : -ENOMEM;
}

/* The format before the trace (see the top): 0, or -EINVAL with @why set. */
static int hot_load_old(struct halite_template *t, int fd, char *why, size_t whylen)
{
	uint8_t *buf = NULL;
	struct stat st;
	uint64_t n;
	int ret = -EINVAL;

	if (fstat(fd, &st) || st.st_size < 40 || (st.st_size - 40) % 8 ||
	    (uint64_t)(st.st_size - 40) / 8 > t->fi->mb_count) {
		snprintf(why, whylen, "an old-format hot set of the wrong size");
		return -EINVAL;
	}
	buf = malloc((size_t)st.st_size);
	if (!buf || pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
		snprintf(why, whylen, "reading: %s", buf ? strerror(errno) : "out of memory");
		goto out;
	}
	n = halite_get_le64(buf + 24);
	if (memcmp(buf + 8, t->fi->uuid, 16)) {
		snprintf(why, whylen, "an old-format hot set of another snapshot (uuid)");
		goto out;
	}
	if (n != (uint64_t)(st.st_size - 40) / 8 ||
	    XXH3_64bits(buf, (size_t)st.st_size - 8) != halite_get_le64(buf + st.st_size - 8)) {
		snprintf(why, whylen, "an old-format hot set that is damaged (count or checksum)");
		goto out;
	}
	for (uint64_t i = 0; i < n; i++) {
		struct learn_touch lt = { .mb = halite_get_le64(buf + 32 + 8 * i),
					  .kind = HALITE_MB_STORED };
		struct halite_mb_loc loc;

		if (halite_reader_mb_lookup(t->rd, lt.mb, &loc)) {
			snprintf(why, whylen, "looking up its block %llu: %s", ULL(lt.mb),
				 halite_reader_errmsg(t->rd));
			goto out;
		}
		if (loc.state != HALITE_MB_STORED) {
			snprintf(why, whylen, "an old-format hot set naming block %llu, which the "
				 "snapshot does not store", ULL(lt.mb));
			goto out;
		}
		if (hot_add_locked(t, &lt) < 0) {
			snprintf(why, whylen, "out of memory");
			goto out;
		}
	}
	ret = 0;
out:
	free(buf);
	return ret;
}

static int on_touch(void *ctx, const struct learn_touch *lt)
{
	struct halite_template *t = ctx;

	t->hot_t_off = lt->t_ns;
	/* Zero and never-touched blocks need no read: not hot (a restore's trace has them). */
	if (lt->kind != HALITE_MB_STORED)
		return 0;
	return hot_add_locked(t, lt) < 0 ? -ENOMEM : 0;
}

/* Read the hot set file, if any; a bad one is ignored with a warning saying why. */
static void hot_load(struct halite_template *t)
{
	char magic[8], why[200] = "";
	FILE *f;
	int ret;

	if (!t->hot_path)
		return;
	f = fopen(t->hot_path, "re");
	if (!f) {
		if (errno != ENOENT)
			halite_logf(&t->log, HALITE_LOG_WARN, "hot set %s: %s (ignored)", t->hot_path,
				    strerror(errno));
		return;
	}
	if (fread(magic, 1, 8, f) == 8 && !memcmp(magic, HOT_MAGIC, 8)) {
		ret = hot_load_old(t, fileno(f), why, sizeof(why));
	} else {
		rewind(f);
		ret = trace_read_touches(f, t->rd, on_touch, t, why, sizeof(why));
		if (ret && !why[0])
			snprintf(why, sizeof(why), "%s", strerror(-ret));
	}
	fclose(f);
	if (!ret) {
		halite_logf(&t->log, HALITE_LOG_INFO, "hot set %s: %llu blocks", t->hot_path,
			    ULL(t->hot_n));
		return;
	}
	halite_logf(&t->log, HALITE_LOG_WARN, "hot set %s ignored: %s", t->hot_path, why);
	for (uint64_t i = 0; i < t->hot_n; i++)
		t->hot_bit[t->hot[i].mb] = 0;
	t->hot_n = 0;
	t->hot_t_off = 0;
}

/* A relayouted snapshot's hot prefix: its stored blocks join the hot set after the learned. */
static int hot_prefix(struct halite_template *t)
{
	struct hlt_relayout rel;
	uint64_t n = 0;

	if (hlt_relayout_read(t->rd, &rel)) {
		halite_logf(&t->log, HALITE_LOG_WARN, "template: metadata %s is not 'hot-lbs=K' "
			    "with K at most %llu (the file's locality blocks): no hot prefix",
			    HLT_RELAYOUT_META, ULL(t->fi->lb_count));
		return 0;
	}
	for (uint64_t lb = 0; lb < rel.hot_lbs; lb++) {
		uint32_t m;
		const uint64_t *mbs;

		/* Only a hint: an LB whose list fails is left out (its sessions fail on use). */
		if (!halite_reader_lb_members(t->rd, lb, &mbs, &m))
			n += m;
		else
			halite_logf(&t->log, HALITE_LOG_WARN, "template: hot prefix without locality "
				    "block %llu: %s", ULL(lb), halite_reader_errmsg(t->rd));
	}
	if (!n)
		return 0;
	t->pre = malloc(n * sizeof(*t->pre));
	if (!t->pre)
		return -ENOMEM;
	/* Each stored block is in one LB's member list, once (the reader checks): no repeats. */
	for (uint64_t lb = 0; lb < rel.hot_lbs; lb++) {
		uint32_t m;
		const uint64_t *mbs;

		/* Within what the first pass counted, whatever the reader says now. */
		if (halite_reader_lb_members(t->rd, lb, &mbs, &m) || m > n - t->pre_n)
			continue;
		memcpy(t->pre + t->pre_n, mbs, m * sizeof(*mbs));
		t->pre_n += m;
	}
	halite_logf(&t->log, HALITE_LOG_INFO, "template: relayouted snapshot, hot prefix of %llu "
		    "LBs, %llu blocks", ULL(rel.hot_lbs), ULL(t->pre_n));
	return 0;
}

int halite_template_hotset_save(struct halite_template *t)
{
	struct trace_out o;
	int ret;

	if (!t || !t->hot_path)
		return -EINVAL;
	ret = trace_out_begin(&o, t->hot_path, 2, t->fi->uuid);
	if (ret)
		return ret;
	/* No stat or lb lines: a template is no one restore (docs/restore-trace.md). */
	pthread_mutex_lock(&t->mu);
	trace_write_learn(o.f, t->o.hot_window_ms, false, t->hot, t->hot_n);
	pthread_mutex_unlock(&t->mu);
	return trace_out_end(&o, 0);
}

/*
 * Prefetch order: the hot set's LBs in its order (tpl_hot_list()), then every LB in
 * file order (porder_at(): not stored, so that open does not take time in
 * the number of LBs; a hot LB comes again there, taken already, and is
 * skipped as any LB that is not idle).
 */
static uint64_t porder_at(const struct halite_template *t, uint64_t i)
{
	return i < t->nhot ? t->porder[i] : i - t->nhot;
}

static int build_porder(struct halite_template *t)
{
	uint64_t lbn = t->fi->lb_count, n = 0;
	uint8_t *seen = halite_zalloc(lbn);

	uint64_t *hot = NULL, nh = 0;

	if (tpl_hot_list(t, &hot, &nh)) {
		halite_zfree(seen);
		return -ENOMEM;
	}
	t->porder = malloc((nh ? nh : 1) * sizeof(*t->porder));
	if (!seen || !t->porder) {
		halite_zfree(seen);
		free(hot);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < nh; i++) {
		struct halite_mb_loc loc;

		if (!halite_reader_mb_lookup(t->rd, hot[i], &loc) && !seen[loc.lb]) {
			seen[loc.lb] = 1;
			t->porder[n++] = loc.lb;
		}
	}
	t->nhot = n;
	t->pcount = n + lbn;
	halite_zfree(seen);
	free(hot);
	return 0;
}

/* ---- requests and callbacks -------------------------------------------- */

/* "locality block 3 at offset 65536: <why>", or without the offset if its entry fails too. */
static void lb_errmsg(struct halite_template *t, uint64_t lb, const char *why, char *buf,
		      size_t len)
{
	struct halite_lb_info li = { 0 };

	if (halite_reader_lb_info(t->rd, lb, &li))
		snprintf(buf, len, "locality block %llu: %s", ULL(lb), why);
	else
		snprintf(buf, len, "locality block %llu at offset %llu: %s", ULL(lb),
			 ULL(li.offset), why);
}

void tpl_errmsg_mb(struct halite_template *t, uint64_t mb, char *buf, size_t len)
{
	struct halite_mb_loc loc;

	if (halite_reader_mb_lookup(t->rd, mb, &loc)) {
		snprintf(buf, len, "memory block %llu: %s", ULL(mb), halite_reader_errmsg(t->rd));
		return;
	}
	if (loc.state != HALITE_MB_STORED) {
		snprintf(buf, len, "memory block %llu", ULL(mb));
		return;
	}
	pthread_mutex_lock(&t->mu);
	if (t->lbs[loc.lb].msg)
		snprintf(buf, len, "%s", t->lbs[loc.lb].msg);
	else
		lb_errmsg(t, loc.lb, halite_strerror(t->lbs[loc.lb].err ? t->lbs[loc.lb].err :
						     -EIO), buf, len);
	pthread_mutex_unlock(&t->mu);
}

int tpl_request(struct halite_template *t, struct tpl_client *c, uint64_t mb, uint64_t tag)
{
	struct halite_mb_loc loc;
	struct lbstate *l;
	struct waiter *w = NULL;
	int ret = 0;

	atomic_fetch_add(&t->requests, 1);
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire)) {
		atomic_fetch_add(&t->hits, 1);
		return 1;
	}
	ret = mb_lookup(t, mb, &loc);
	if (ret)
		return ret; /* the index's failure: never a zero block */
	if (loc.state != HALITE_MB_STORED)
		return -EINVAL;
	if (c && !(w = malloc(sizeof(*w))))
		return -ENOMEM;
	pthread_mutex_lock(&t->mu);
	l = &t->lbs[loc.lb];
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire)) {
		atomic_fetch_add(&t->hits, 1);
		ret = 1;
	} else if (l->st == LB_FAILED) {
		ret = l->err;
	} else {
		if (w) {
			*w = (struct waiter){ .next = l->waiters, .c = c, .mb = mb, .tag = tag };
			l->waiters = w;
			c->pending++;
			w = NULL;
		}
		if (l->st == LB_IDLE) {
			l->st = LB_QUEUED;
			l->demand = true;
			if (c)
				c->lb_asked++;
			t->dq[t->dq_tail] = loc.lb;
			t->dq_tail = (t->dq_tail + 1) % t->dq_cap;
			pthread_cond_signal(&t->work_cv);
		} else {
			atomic_fetch_add(&t->joined, 1);
		}
	}
	pthread_mutex_unlock(&t->mu);
	free(w);
	return ret;
}

/*
 * Take the waiters of @l whose block is in (all of them if @all): under the
 * lock, each client's callback count is raised so tpl_detach() waits for it.
 */
static struct waiter *take_waiters(struct halite_template *t, struct lbstate *l, bool all)
{
	struct waiter *out = NULL, **pp = &l->waiters;

	while (*pp) {
		struct waiter *w = *pp;

		if (all || atomic_load_explicit(&t->fill[w->mb], memory_order_relaxed)) {
			*pp = w->next;
			w->next = out;
			out = w;
			w->c->pending--;
			w->c->callbacks++;
		} else {
			pp = &w->next;
		}
	}
	return out;
}

static void call_waiters(struct halite_template *t, struct waiter *w, int err)
{
	while (w) {
		struct waiter *next = w->next;
		struct tpl_client *c = w->c;

		c->block_in(c, w->mb, w->tag, err);
		pthread_mutex_lock(&t->mu);
		if (!--c->callbacks)
			pthread_cond_broadcast(&t->state_cv);
		pthread_mutex_unlock(&t->mu);
		free(w);
		w = next;
	}
}

uint64_t tpl_lb_asked(struct halite_template *t, const struct tpl_client *c)
{
	uint64_t n;

	pthread_mutex_lock(&t->mu);
	n = c->lb_asked;
	pthread_mutex_unlock(&t->mu);
	return n;
}

uint64_t tpl_pending(struct halite_template *t, const struct tpl_client *c)
{
	uint64_t n;

	pthread_mutex_lock(&t->mu);
	n = c->pending + c->callbacks;
	pthread_mutex_unlock(&t->mu);
	return n;
}

void tpl_detach(struct halite_template *t, struct tpl_client *c)
{
	pthread_mutex_lock(&t->mu);
	for (uint64_t lb = 0; c->pending && lb < t->fi->lb_count; lb++) {
		struct waiter **pp = &t->lbs[lb].waiters;

		while (*pp) {
			struct waiter *w = *pp;

			if (w->c == c) {
				*pp = w->next;
				c->pending--;
				free(w);
			} else {
				pp = &w->next;
			}
		}
	}
	while (c->callbacks)
		pthread_cond_wait(&t->state_cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

/* ---- reading and decoding ---------------------------------------------- */

/*
 * Block @mb of the verified LB @lbbuf into the memory file, through @mbbuf
 * (mb_size bytes): 0, or < 0 and @why says what. Written with pwrite(), not
 * through a shared mapping: a failing write is an error to report, where a
 * store into a mapping that cannot get a page is SIGBUS.
 */
static int decode_mb(struct halite_template *t, uint64_t mb, const void *lbbuf, uint8_t *mbbuf,
		     char *why, size_t whylen)
{
	const struct tpl_region *g = mb_region(t, mb);
	uint32_t len = halite_reader_mb_bytes(t->rd, mb);
	uint64_t off;
	int ret;

	if (!g)
		return -HALITE_E_INTERNAL;
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire))
		return 0; /* in already (a reopened template) */
	ret = halite_reader_decode_mb(t->rd, mb, lbbuf, mbbuf);
	if (ret) {
		snprintf(why, whylen, "decoding memory block %llu: %s", ULL(mb),
			 ret == -HALITE_E_CHECKSUM || ret == -HALITE_E_CORRUPT ?
			 halite_reader_errmsg(t->rd) : halite_strerror(ret));
		return ret;
	}
	off = g->offset + (mb - g->first_mb) * t->fi->mb_size;
	for (uint32_t done = 0; done < len;) {
		ssize_t n = pwrite(t->memfd, mbbuf + done, len - done, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			snprintf(why, whylen, "writing memory block %llu to %s: %s", ULL(mb),
				 t->mem_path, strerror(-ret));
			return ret;
		}
		done += (uint32_t)n;
	}
	atomic_store_explicit(&t->fill[mb], 1, memory_order_release);
	atomic_fetch_add(&t->mb_in, 1);
	atomic_fetch_add(&t->mb_decoded, 1);
	return 0;
}

static int read_lb(struct halite_template *t, uint64_t lb, void *buf)
{
	unsigned tries = 1 + t->o.read_retries;
	int ret = -EIO;

	for (unsigned i = 0; i < tries; i++) {
		if (i)
			atomic_fetch_add(&t->lb_retries, 1);
		ret = halite_reader_read_lb(t->rd, lb, buf);
		if (!ret || ret == -HALITE_E_LB_CHECKSUM)
			atomic_fetch_add(&t->bytes_read, t->fi->lb_size);
		if (!ret)
			break;
	}
	return ret;
}

static void process_lb(struct halite_template *t, uint64_t lb, void *buf, uint8_t *mbbuf)
{
	struct lbstate *l = &t->lbs[lb];
	const uint64_t *mbs;
	uint32_t n = 0;
	struct waiter *w;
	uint64_t *want = NULL;
	size_t nwant = 0;
	char why[448] = "";
	int ret;

	ret = read_lb(t, lb, buf);
	if (ret)
		snprintf(why, sizeof(why), "%s", ret == -HALITE_E_LB_CHECKSUM ? "checksum mismatch" :
			 ret == -HALITE_E_CHECKSUM || ret == -HALITE_E_CORRUPT ?
			 halite_reader_errmsg(t->rd) : halite_strerror(ret));
	if (!ret) {
		ret = halite_reader_lb_members(t->rd, lb, &mbs, &n);
		if (ret)
			snprintf(why, sizeof(why), "its member list: %s",
				 halite_reader_errmsg(t->rd));
	}
	if (!ret) {
		/* The blocks sessions wait for first. */
		pthread_mutex_lock(&t->mu);
		for (w = l->waiters; w; w = w->next)
			nwant++;
		want = nwant ? malloc(nwant * sizeof(*want)) : NULL;
		nwant = 0;
		for (w = l->waiters; want && w; w = w->next)
			want[nwant++] = w->mb;
		pthread_mutex_unlock(&t->mu);
		for (size_t i = 0; !ret && i < nwant; i++)
			ret = decode_mb(t, want[i], buf, mbbuf, why, sizeof(why));
		free(want);
		if (!ret) {
			pthread_mutex_lock(&t->mu);
			w = take_waiters(t, l, false);
			pthread_mutex_unlock(&t->mu);
			call_waiters(t, w, 0);
		}
		for (uint32_t i = 0; !ret && i < n; i++) {
			struct halite_mb_loc loc;

			/*
			 * A member whose own map entry fails (its index chunk
			 * damaged) stays out, never marked in; that is the
			 * template's error, and the sessions that need it fail
			 * on their lookup. The LB's other blocks are good.
			 */
			if (mb_lookup(t, mbs[i], &loc))
				continue;
			ret = decode_mb(t, mbs[i], buf, mbbuf, why, sizeof(why));
		}
	}

	pthread_mutex_lock(&t->mu);
	if (ret) {
		char msg[512];

		lb_errmsg(t, lb, why[0] ? why : halite_strerror(ret), msg, sizeof(msg));
		l->st = LB_FAILED;
		l->err = ret;
		l->msg = strdup(msg);
		atomic_fetch_add(&t->lb_failed, 1);
		if (!t->error)
			t->error = ret;
		tpl_fail(t, ret, "%s", msg);
	} else {
		l->st = LB_DONE;
	}
	w = take_waiters(t, l, true);
	pthread_cond_broadcast(&t->state_cv);
	pthread_mutex_unlock(&t->mu);
	/* A failure fails those still waiting; done, every block is in. */
	call_waiters(t, w, ret);
}

static bool prefetch_allowed(struct halite_template *t, uint64_t now)
{
	uint64_t floor_bytes, last = atomic_load_explicit(&t->last_fault_ns, memory_order_relaxed);

	if (t->o.flags & HALITE_TEMPLATE_NO_PREFETCH)
		return false;
	if (now > last && now - last >= (uint64_t)t->o.prefetch_idle_us * 1000)
		return true;
	floor_bytes = (uint64_t)((double)t->o.prefetch_min_rate * (double)(now - t->open_ns) / 1e9);
	return t->prefetch_bytes < floor_bytes;
}

static void *reader_main(void *arg)
{
	struct halite_template *t = arg;
	void *buf = halite_reader_alloc_lb(t->rd);
	uint8_t *mbbuf = malloc(t->fi->mb_size);

	pthread_mutex_lock(&t->mu);
	while (buf && mbbuf && !t->stop) {
		uint64_t lb = UINT64_MAX, now = halite_now_ns();
		bool demand = false;

		if (t->dq_head != t->dq_tail) {
			lb = t->dq[t->dq_head];
			t->dq_head = (t->dq_head + 1) % t->dq_cap;
			demand = true;
		} else if (t->pcursor < t->pcount && prefetch_allowed(t, now)) {
			while (t->pcursor < t->pcount && t->lbs[porder_at(t, t->pcursor)].st != LB_IDLE)
				t->pcursor++;
			if (t->pcursor < t->pcount)
				lb = porder_at(t, t->pcursor++);
		}
		if (lb == UINT64_MAX) {
			struct timespec ts;

			halite_deadline(&ts, t->pcursor < t->pcount ?
				(uint64_t)t->o.prefetch_idle_us * 1000 / 2 + 100000 : 50000000);
			pthread_cond_timedwait(&t->work_cv, &t->mu, &ts);
			continue;
		}
		t->lbs[lb].st = LB_READING;
		if (!demand)
			t->prefetch_bytes += t->fi->lb_size;
		pthread_mutex_unlock(&t->mu);
		atomic_fetch_add(demand ? &t->lb_demand : &t->lb_prefetch, 1);
		process_lb(t, lb, buf, mbbuf);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	free(mbbuf);
	halite_reader_free_lb(buf);
	return NULL;
}

/* ---- open, wait, stats, free ------------------------------------------- */

static int layout_regions(struct halite_template *t)
{
	uint64_t off = 0;

	t->nregions = t->fi->region_count;
	t->regions = calloc(t->nregions ? t->nregions : 1, sizeof(*t->regions));
	if (!t->regions)
		return -ENOMEM;
	for (uint32_t i = 0; i < t->nregions; i++) {
		const struct halite_region_info *ri = halite_reader_region(t->rd, i);
		struct tpl_region *g = &t->regions[i];

		snprintf(g->name, sizeof(g->name), "%s", ri->name);
		g->offset = off;
		g->length = ri->length;
		g->first_mb = ri->first_mb;
		g->mb_count = ri->mb_count;
		off += (ri->length + REGION_ALIGN - 1) & ~(REGION_ALIGN - 1);
	}
	t->mem_size = off ? off : REGION_ALIGN;
	return 0;
}

static char *suffixed(const char *path, const char *suffix)
{
	char *s;

	return asprintf(&s, "%s%s", path, suffix) < 0 ? NULL : s;
}

int halite_template_open(struct halite_template **tp, const char *snapshot, const char *mem_path,
			 const struct halite_template_opts *opts)
{
	struct halite_reader_opts ro = { .sz = sizeof(ro) };
	struct halite_template *t;
	char rerr[256] = "";
	int ret;

	if (!tp || !snapshot || !mem_path)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->memfd = t->ro_fd = t->fillfd = -1;
	pthread_mutex_init(&t->mu, NULL);
	halite_cond_init_mono(&t->work_cv);
	halite_cond_init_mono(&t->state_cv);
	ret = halite_opts_copy(&t->o, sizeof(t->o), opts);
	if (ret || (t->o.flags & ~HALITE_TEMPLATE_FLAGS_ALL) || t->o.readers > 64) {
		ret = ret ? ret : -EINVAL;
		goto err;
	}
	t->log = (struct halite_logger){ t->o.log, t->o.log_ctx, t->o.log_level };
	if (!t->o.readers)
		t->o.readers = 4;
	if (!t->o.read_retries)
		t->o.read_retries = 2;
	if (!t->o.prefetch_idle_us)
		t->o.prefetch_idle_us = 2000;
	if (!t->o.prefetch_min_rate)
		t->o.prefetch_min_rate = 64ull << 20;
	if (!t->o.hot_window_ms)
		t->o.hot_window_ms = 2000;
	t->mem_path = strdup(mem_path);
	t->fill_path = suffixed(mem_path, ".fill");
	t->hot_path = t->o.hotset_path ? strdup(t->o.hotset_path) : NULL;
	t->o.hotset_path = NULL;
	if (!t->mem_path || !t->fill_path || (opts && opts->hotset_path && !t->hot_path)) {
		ret = -ENOMEM;
		goto err;
	}

	ro.read_latency_us = t->o.read_latency_us;
	ro.errbuf = rerr;
	ro.errbuf_len = sizeof(rerr);
	ret = halite_reader_open(&t->rd, snapshot, &ro);
	if (ret) {
		if (rerr[0])
			snprintf(t->errmsg, sizeof(t->errmsg), "%s", rerr);
		goto err;
	}
	t->fi = halite_reader_info(t->rd);
	t->mb_stored = t->fi->mb_stored;
	ret = layout_regions(t);
	if (ret)
		goto err;
	/* O(1) whatever the memory size (zalloc.h). */
	t->lbs = halite_zalloc(t->fi->lb_count * sizeof(*t->lbs));
	t->dq_cap = t->fi->lb_count + 1;
	t->dq = malloc(t->dq_cap * sizeof(*t->dq));
	t->hot_bit = halite_zalloc(t->fi->mb_count);
	if (!t->lbs || !t->dq || !t->hot_bit) {
		ret = -ENOMEM;
		goto err;
	}
	ret = open_files(t);
	if (ret < 0)
		goto err;
	if (ret == 1)
		count_in(t);
	hot_load(t);
	ret = hot_prefix(t);
	if (!ret)
		ret = build_porder(t);
	if (ret)
		goto err;
	t->open_ns = halite_now_ns();
	atomic_store(&t->last_fault_ns, t->open_ns);
	t->readers = calloc(t->o.readers, sizeof(*t->readers));
	if (!t->readers) {
		ret = -ENOMEM;
		goto err;
	}
	for (; t->nreaders < t->o.readers; t->nreaders++) {
		ret = -pthread_create(&t->readers[t->nreaders], NULL, reader_main, t);
		if (ret)
			goto err;
	}
	halite_logf(&t->log, HALITE_LOG_INFO, "template %s: %llu of %llu stored blocks in %s "
		    "at open", snapshot, ULL(t->mb_in_at_open), ULL(t->mb_stored), t->mem_path);
	*tp = t;
	return 0;
err:
	if (!t->errmsg[0] && ret)
		tpl_fail(t, ret, "template %s", snapshot);
	halite_logf(&t->log, HALITE_LOG_ERROR, "%s", t->errmsg);
	remove_created(t);
	halite_template_free(t);
	return ret;
}

int halite_template_memfd(const struct halite_template *t)
{
	return t ? t->ro_fd : -EINVAL;
}

int halite_template_region(const struct halite_template *t, const char *name, uint64_t *offset,
			   uint64_t *length)
{
	int i;

	if (!t || !name)
		return -EINVAL;
	i = tpl_find_region(t, name);
	if (i < 0)
		return i;
	if (offset)
		*offset = t->regions[i].offset;
	if (length)
		*length = t->regions[i].length;
	return 0;
}

struct halite_reader *halite_template_reader(struct halite_template *t)
{
	return t ? t->rd : NULL;
}

int halite_template_wait(struct halite_template *t, int timeout_ms)
{
	struct timespec ts;
	int ret = 0;

	if (!t)
		return -EINVAL;
	halite_deadline(&ts, timeout_ms > 0 ? (uint64_t)timeout_ms * 1000000 : 0);
	pthread_mutex_lock(&t->mu);
	while (!tpl_complete(t) && !t->error) {
		if (timeout_ms < 0) {
			pthread_cond_wait(&t->state_cv, &t->mu);
		} else if (pthread_cond_timedwait(&t->state_cv, &t->mu, &ts) == ETIMEDOUT) {
			ret = -ETIMEDOUT;
			break;
		}
	}
	if (!ret && !tpl_complete(t))
		ret = t->error;
	pthread_mutex_unlock(&t->mu);
	return ret;
}

void halite_template_stats(struct halite_template *t, struct halite_template_stats *st)
{
	struct stat sb;

	memset(st, 0, sizeof(*st));
	if (!t)
		return;
	st->mb_total = t->fi->mb_count;
	st->mb_stored = t->mb_stored;
	st->mb_in = atomic_load(&t->mb_in);
	st->mb_in_at_open = t->mb_in_at_open;
	st->lb_in_at_open = t->lb_in_at_open;
	st->lb_total = t->fi->lb_count;
	st->lb_demand = atomic_load(&t->lb_demand);
	st->lb_prefetch = atomic_load(&t->lb_prefetch);
	st->lb_failed = atomic_load(&t->lb_failed);
	st->lb_retries = atomic_load(&t->lb_retries);
	st->bytes_read = atomic_load(&t->bytes_read);
	st->mb_decoded = atomic_load(&t->mb_decoded);
	st->requests = atomic_load(&t->requests);
	st->hits = atomic_load(&t->hits);
	st->joined = atomic_load(&t->joined);
	if (!fstat(t->memfd, &sb))
		st->mem_bytes = (uint64_t)sb.st_blocks * 512;
	pthread_mutex_lock(&t->mu);
	st->hot_mb = hot_count_locked(t, &st->hot_mb_prefix);
	st->error = t->error;
	pthread_mutex_unlock(&t->mu);
	st->complete = st->mb_in == st->mb_stored;
}

const char *halite_template_errmsg(const struct halite_template *t)
{
	return t ? t->errmsg : "";
}

void halite_template_free(struct halite_template *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_broadcast(&t->work_cv);
	pthread_mutex_unlock(&t->mu);
	for (unsigned i = 0; i < t->nreaders; i++)
		pthread_join(t->readers[i], NULL);
	free(t->readers);
	if (t->lbs)
		for (uint64_t lb = 0; lb < t->fi->lb_count; lb++) {
			while (t->lbs[lb].waiters) {
				struct waiter *w = t->lbs[lb].waiters;

				t->lbs[lb].waiters = w->next;
				free(w);
			}
			free(t->lbs[lb].msg);
		}
	if (t->fillmap)
		munmap(t->fillmap, FILL_HDR + t->fi->mb_count);
	if (t->memfd >= 0)
		close(t->memfd);
	if (t->ro_fd >= 0)
		close(t->ro_fd);
	if (t->fillfd >= 0)
		close(t->fillfd);
	halite_reader_free(t->rd);
	halite_zfree(t->lbs);
	free(t->dq);
	free(t->porder);
	free(t->hot);
	free(t->pre);
	halite_zfree(t->hot_bit);
	free(t->regions);
	free(t->mem_path);
	free(t->fill_path);
	free(t->hot_path);
	pthread_cond_destroy(&t->work_cv);
	pthread_cond_destroy(&t->state_cv);
	pthread_mutex_destroy(&t->mu);
	free(t);
}
