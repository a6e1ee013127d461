/* SPDX-License-Identifier: MIT */
/*
 * Acceptance tests of the lazy restore engine (halite/restore.h).
 *
 * Exact content. Every byte of guest memory after the restore is the
 * snapshot's, with vCPU threads running on that memory from the moment the
 * restore starts, for files made two ways:
 * - by the writer as `halite-inspect import` makes them (halite_writer_put of
 *   a memory image in physical order; two regions, the second ending in a
 *   short memory block; holes, zero, random and text-like blocks), restored
 *   under an in-test guest whose vCPUs each own every third page: on the
 *   first visit a vCPU compares the whole page with the snapshot (what the
 *   guest saw, not only what is left at the end), then bumps a counter word
 *   and counts the bump, so the memory at the end is known exactly;
 * - by the save engine on a running synthetic guest (testing/synth/synth.h), restored
 *   into a guest created with SYNTH_F_ATTACH: empty memory, the same layout,
 *   vCPUs that translate through the page tables the restore is bringing in
 *   (4- and 5-level, 2 MiB pages, the MMU writing A/D bits). Every access is
 *   recorded (trace_out) and replayed here through an independent MMU over
 *   the snapshot, which gives the exact final memory;
 * for every codec, in this process (private anonymous memory, memfd) and in
 * a child process that owns the memory and made the userfaultfd (anonymous
 * and memfd), with the engine's I/O options varied across the runs. Also
 * after each: the counts add up, every LB was read exactly once, the ranges
 * are unregistered, no vCPU translation failed.
 *
 * Exact counts. With NO_PREFETCH, two threads (one a vCPU) take turns
 * touching a planned set of pages, waiting after each touch until the
 * engine is quiet; faults, cached, zero and vCPU faults, LBs read, blocks
 * installed by fault and by the pool, staged and staged-then-accessed
 * (TRACK_ACCESS), and which pages are present (pagemap) are predicted from
 * the file's MB map and LB table, after every step.
 *
 * Learning (LEARN). Two vCPU threads and another thread touch a planned
 * sequence of blocks one at a time (blocks of one LB from different
 * threads, zero and never-touched blocks, touches that must not count):
 * the trace's touch lines are the plan's first touches exactly (order,
 * vCPU, kind, each block once); with the window until done every LB is
 * read on demand (prefetch and readahead held), with one ending mid-way
 * nothing is prefetched inside it and memory is the snapshot after.
 *
 * Failure. A locality block with one flipped byte, and one cut off by
 * truncating the file mid-restore, never reach memory: the faulting thread
 * stays blocked, none of the LB's pages is present, the restore fails with
 * the reader's code and a message naming the LB after the configured
 * retries, and halite_restore_free() then kills the blocked thread with
 * SIGSEGV (in a forked child whose termination signal is checked); the same
 * from outside (the owner's thread stays blocked, also after the free); and
 * SIGKILL of a restoring process leaves the owner's faulting thread blocked,
 * never reading zeros.
 *
 * Copies (HALITE_MEM_COPY, as halite-qemu restores video memory): a region
 * restored into memory of this process beside guest memory holds the
 * snapshot once start returns, before any fault and with no prefetcher; a
 * copy already written is refused, and an LB of it that fails its checksum
 * fails the start, naming it.
 *
 * Clones: three restores of one file at once, each exact. Bad arguments:
 * region mismatches, unknown flags and kinds, populated memory, damaged
 * files (refused at open with the reader's own code).
 *
 * Children never call cmocka: they record what they see in shared memory and
 * the parent asserts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "restore_util.h"
#include "synth.h"
#include "test_util.h"
#include "uffd.h"

#define PAGE R_PAGE
#define CHUNK (4 * PAGE) /* the image's unit of kind: a hole is whole chunks */
#define WAIT_MS 60000

static uint64_t g_seed;
static struct r_log g_log;

enum mode { ANON, SHARED, EXT_ANON, EXT_SHARED, NMODES };
static const char *const mode_name[] = { "anonymous", "memfd", "external anonymous",
					 "external memfd" };

static bool mode_external(enum mode m)
{
	return m == EXT_ANON || m == EXT_SHARED;
}

static int mode_kind(enum mode m)
{
	return m == ANON || m == EXT_ANON ? HALITE_MEM_ANON : HALITE_MEM_SHARED;
}

static char *tmp_path(const char *fmt, ...)
{
	char name[128], *p;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	assert_true(asprintf(&p, "%s/%s", t_tmpdir(), name) > 0);
	return p;
}

static pid_t my_tid(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* ---------------------------------------------------------------------- */
/* Memory images and the files the writer makes of them                    */

#define MAXREG 2

struct image {
	uint32_t nreg;
	struct halite_region reg[MAXREG];
	uint64_t off[MAXREG]; /* of each region in snap */
	uint64_t len;	      /* all regions */
	uint8_t *snap;	      /* the regions back to back */
	uint8_t *hole;	      /* per CHUNK of snap: never written */
};

static const char *const reg_names[MAXREG] = { "pc.ram", "pc.ram.hi" };

/*
 * Two regions: @len0 bytes at GPA 0 and @len1 at 4 GiB (ending in a short
 * memory block when len1 is not a multiple of the MB size). Per 16 KiB
 * chunk: 1/8 holes, 1/16 zero, 1/4 random, 7/16 text-like, 1/8 a zero page
 * followed by text.
 */
static void make_image(struct image *img, uint64_t len0, uint64_t len1, uint64_t seed)
{
	uint64_t nchunks;

	memset(img, 0, sizeof(*img));
	img->nreg = len1 ? 2 : 1;
	img->reg[0] = (struct halite_region){ reg_names[0], 0, len0 };
	img->reg[1] = (struct halite_region){ reg_names[1], 4ull << 30, len1 };
	img->off[1] = len0;
	img->len = len0 + len1;
	assert_int_equal(len0 % CHUNK, 0);
	img->snap = calloc(1, img->len);
	nchunks = (img->len + CHUNK - 1) / CHUNK;
	img->hole = calloc(1, nchunks);
	assert_non_null(img->snap);
	for (uint64_t c = 0; c < nchunks; c++) {
		uint8_t *p = img->snap + c * CHUNK;
		uint64_t n = img->len - c * CHUNK < CHUNK ? img->len - c * CHUNK : CHUNK;
		unsigned k = (unsigned)(t_rand(&seed) % 16);

		if (k < 2)
			img->hole[c] = 1;
		else if (k == 2)
			; /* zero, but written */
		else if (k < 7)
			t_fill(p, n, 100, &seed);
		else if (k < 14)
			t_fill(p, n, 20, &seed);
		else if (n > PAGE)
			t_fill(p + PAGE, n - PAGE, 50, &seed);
	}
}

static void free_image(struct image *img)
{
	free(img->snap);
	free(img->hole);
}

static void write_image_meta(const char *path, const struct image *img, int codec,
			     uint32_t mb_pages, uint32_t lb_size, const char *devstate,
			     const char *meta_key, const char *meta);

/* As `halite-inspect import` does: every written block in physical order, holes never put. */
static void write_image(const char *path, const struct image *img, int codec, uint32_t mb_pages,
			uint32_t lb_size, const char *devstate)
{
	write_image_meta(path, img, codec, mb_pages, lb_size, devstate, NULL, NULL);
}

/* ... with metadata @meta_key = @meta (a relayouted file's "halite.relayout"). */
static void write_image_meta(const char *path, const struct image *img, int codec,
			     uint32_t mb_pages, uint32_t lb_size, const char *devstate,
			     const char *meta_key, const char *meta)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_writer *w;
	uint64_t mb = 0;

	wo.codec = codec;
	wo.mb_pages = mb_pages;
	wo.lb_size = lb_size;
	wo.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, path, img->reg, img->nreg, &wo), 0);
	for (uint32_t r = 0; r < img->nreg; r++) {
		uint32_t mbs = halite_writer_mb_size(w);

		for (uint64_t o = 0; o < img->reg[r].length; o += mbs, mb++) {
			uint64_t at = img->off[r] + o;

			if (img->hole[at / CHUNK])
				continue;
			assert_int_equal(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0),
							   mb, img->snap + at),
					 0);
		}
	}
	assert_int_equal(mb, halite_writer_mb_count(w));
	if (devstate)
		assert_int_equal(halite_writer_set_device_state(w, devstate, strlen(devstate)), 0);
	if (meta_key)
		assert_int_equal(halite_writer_set_meta(w, meta_key, meta, (uint32_t)strlen(meta)), 0);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, false);
}

/* The file decodes to @snap: the file is what the restore must reproduce. */
static void check_file_is(const char *path, const uint8_t *snap, uint64_t len)
{
	struct halite_reader *rd;
	uint8_t *out;
	uint64_t at = 0;

	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	out = malloc(halite_reader_info(rd)->mb_size);
	for (uint64_t mb = 0; mb < halite_reader_info(rd)->mb_count; mb++) {
		uint32_t n = halite_reader_mb_bytes(rd, mb);

		assert_int_equal(halite_reader_read_mb(rd, mb, out), 0);
		if (memcmp(out, snap + at, n))
			fail_msg("%s: memory block %" PRIu64 " is not the snapshot's", path, mb);
		at += n;
	}
	assert_int_equal(at, len);
	free(out);
	halite_reader_free(rd);
}

/* ---------------------------------------------------------------------- */
/* The in-test guest                                                        */

#define SG_MAXV 3
#define SG_MAXTOUCH 4

/* A one-off access by a new thread of the owner. */
struct touch {
	uint64_t addr;		/* in the owner */
	const uint8_t *snap;	/* if set, compare the page with snap's page snap_page */
	uint64_t snap_page;
	_Atomic int req;	/* 1: wanted, 2: thread created */
	_Atomic pid_t tid;
	_Atomic int started, returned;
	uint64_t value;
	int snap_ok;		/* after the access, the page is the snapshot's */
};

struct sg;

struct sg_arg {
	struct sg *g;
	unsigned v;
};

/*
 * In MAP_SHARED memory: the owner may be a child. Pages are numbered across
 * the regions in snap order; page p belongs to vCPU p % nv, which visits a
 * random 3/4 of its pages in a fresh random order each pass.
 */
struct sg {
	enum mode mode;
	const struct image *img;
	uint64_t npages;
	unsigned nv, passes;
	uint64_t seed;
	uint32_t *ws[SG_MAXV];
	uint64_t nws[SG_MAXV];
	uint32_t *count;	/* per page: counter bumps */
	/* the owner's */
	uint64_t host[MAXREG];
	int memfd[MAXREG];
	pid_t owner;
	pthread_t thr[SG_MAXV];
	struct sg_arg args[SG_MAXV];
	pid_t tids[SG_MAXV];	/* stable copy for the engine's options */
	_Atomic pid_t tid[SG_MAXV];
	_Atomic int go, stop;
	_Atomic unsigned vdone;
	_Atomic uint64_t mismatches, first_bad; /* first_bad: page + 1 */
	struct touch touch[SG_MAXTOUCH];
	int sock;
	bool mapped;
};


static uint8_t *sg_page(const struct sg *g, uint64_t p)
{
	uint64_t at = p * PAGE;
	uint32_t r = g->img->nreg > 1 && at >= g->img->off[1];

	return (uint8_t *)(uintptr_t)(g->host[r] + at - g->img->off[r]);
}

/* The counter word of page p: spread over the page so every word position is used. */
static size_t sg_word(uint64_t p)
{
	return (size_t)((p * 72) % PAGE) & ~(size_t)7;
}

static void *sg_vcpu(void *arg)
{
	struct sg_arg *a = arg;
	struct sg *g = a->g;
	unsigned v = a->v;
	uint64_t rng = g->seed ^ (0x1234567ull * (v + 1));
	uint64_t n = g->nws[v];
	uint32_t *order = malloc(n * sizeof(uint32_t) + 1);
	uint8_t *seen = calloc(g->npages, 1);

	atomic_store(&g->tid[v], my_tid());
	/* Runnable, not asleep, when the guest is resumed: it faults at once. */
	while (!atomic_load(&g->go) && !atomic_load(&g->stop))
		sched_yield();
	memcpy(order, g->ws[v], n * sizeof(uint32_t));
	for (unsigned pass = 0; pass < g->passes && !atomic_load(&g->stop); pass++) {
		for (uint64_t i = n; i > 1; i--) {
			uint64_t j = t_rand(&rng) % i;
			uint32_t t = order[i - 1];

			order[i - 1] = order[j];
			order[j] = t;
		}
		for (uint64_t i = 0; i < n && !atomic_load(&g->stop); i++) {
			uint64_t p = order[i];
			uint8_t *pg = sg_page(g, p);
			volatile uint64_t *w = (volatile uint64_t *)(pg + sg_word(p));

			if (!seen[p]) {
				/* What the guest sees first is the snapshot, not only what is left. */
				if (memcmp(pg, g->img->snap + p * PAGE, PAGE)) {
					uint64_t z = 0;

					atomic_fetch_add(&g->mismatches, 1);
					atomic_compare_exchange_strong(&g->first_bad, &z, p + 1);
				}
				seen[p] = 1;
			}
			*w = *w + 1;
			g->count[p]++; /* one writer per page */
		}
	}
	free(order);
	free(seen);
	atomic_fetch_add(&g->vdone, 1);
	return NULL;
}

static void *sg_toucher(void *arg)
{
	struct touch *t = arg;
	volatile uint64_t *w = (volatile uint64_t *)(uintptr_t)t->addr;

	atomic_store(&t->tid, my_tid());
	atomic_store(&t->started, 1);
	t->value = *w;
	if (t->snap)
		t->snap_ok = !memcmp((void *)(uintptr_t)(t->addr & ~(uint64_t)(PAGE - 1)),
				     t->snap + t->snap_page * PAGE, PAGE);
	atomic_store(&t->returned, 1);
	return NULL;
}

static int start_thread(void *(*fn)(void *), void *arg, pthread_t *out)
{
	pthread_t t;
	int ret = pthread_create(&t, NULL, fn, arg);

	if (!ret && out)
		*out = t;
	else if (!ret)
		pthread_detach(t);
	return ret;
}

/* Map the regions (empty) and start the vCPUs, parked until go. In the owner. */
static int sg_owner_setup(struct sg *g)
{
	bool shared = mode_kind(g->mode) == HALITE_MEM_SHARED;

	for (uint32_t r = 0; r < g->img->nreg; r++) {
		size_t len = g->img->reg[r].length;
		void *p;

		g->memfd[r] = -1;
		if (shared) {
			g->memfd[r] = memfd_create("guest", MFD_CLOEXEC);
			if (g->memfd[r] < 0 || ftruncate(g->memfd[r], (off_t)len))
				return -errno;
			p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g->memfd[r], 0);
		} else {
			p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		}
		if (p == MAP_FAILED)
			return -errno;
		/* 4 KiB pages: THP would populate neighbours of a written page. */
		madvise(p, len, MADV_NOHUGEPAGE);
		g->host[r] = (uintptr_t)p;
	}
	g->mapped = true;
	g->owner = getpid();
	for (unsigned v = 0; v < g->nv; v++) {
		g->args[v] = (struct sg_arg){ g, v };
		if (pthread_create(&g->thr[v], NULL, sg_vcpu, &g->args[v]))
			return -EAGAIN;
	}
	for (unsigned v = 0; v < g->nv; v++) {
		while (!atomic_load(&g->tid[v]))
			r_sleep_us(50);
		g->tids[v] = atomic_load(&g->tid[v]);
	}
	return 0;
}

static void sg_owner_unmap(struct sg *g)
{
	for (uint32_t r = 0; r < g->img->nreg && g->mapped; r++) {
		munmap((void *)(uintptr_t)g->host[r], g->img->reg[r].length);
		if (g->memfd[r] >= 0)
			close(g->memfd[r]);
	}
	g->mapped = false;
}

/* Serve touch requests until told to stop; a child owner's main loop. */
static void sg_child_loop(struct sg *g)
{
	while (!atomic_load(&g->stop)) {
		for (int i = 0; i < SG_MAXTOUCH; i++)
			if (atomic_load(&g->touch[i].req) == 1) {
				atomic_store(&g->touch[i].req, 2);
				if (start_thread(sg_toucher, &g->touch[i], NULL))
					_exit(4);
			}
		r_sleep_us(200);
	}
	for (unsigned v = 0; v < g->nv; v++)
		pthread_join(g->thr[v], NULL);
	_exit(0);
}

static struct sg *sg_create(const struct image *img, enum mode mode, unsigned nv, unsigned passes,
			    uint64_t seed)
{
	struct sg *g = r_shared_alloc(sizeof(*g));

	g->mode = mode;
	g->img = img;
	g->npages = img->len / PAGE;
	g->nv = nv;
	g->passes = passes;
	g->seed = seed ? seed : 1;
	g->count = r_shared_alloc(g->npages * sizeof(uint32_t));
	for (unsigned v = 0; v < nv; v++) {
		g->ws[v] = r_shared_alloc(g->npages * sizeof(uint32_t));
		for (uint64_t p = v; p < g->npages; p += nv)
			if (t_rand(&seed) % 4)
				g->ws[v][g->nws[v]++] = (uint32_t)p;
	}
	return g;
}

/*
 * Bring the owner up: here, or a forked child that also makes a
 * userfaultfd and sends it back (*uffd). Returns with the vCPUs parked.
 */
static void sg_start_owner(struct sg *g, int *uffd)
{
	int sv[2];
	pid_t pid;

	*uffd = -1;
	if (!mode_external(g->mode)) {
		assert_int_equal(sg_owner_setup(g), 0);
		return;
	}
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		int fd;

		close(sv[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (sg_owner_setup(g))
			_exit(3);
		/* The owner makes the userfaultfd and keeps its own copy, as QEMU would. */
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (fd < 0 || t_send_fd(sv[1], fd))
			_exit(3);
		sg_child_loop(g);
	}
	close(sv[1]);
	*uffd = t_recv_fd(sv[0]);
	close(sv[0]);
	assert_true(*uffd >= 0);
	g->owner = pid; /* also written by the child: the same value */
	for (unsigned v = 0; v < g->nv; v++) {
		uint64_t t0 = r_now_ms();

		while (!atomic_load(&g->tid[v]) && r_now_ms() - t0 < 10000)
			r_sleep_us(100);
		assert_true(atomic_load(&g->tid[v]) > 0);
		g->tids[v] = atomic_load(&g->tid[v]);
	}
}

/*
 * Region @i for the engine; a shared one with a descriptor of its file that
 * is valid here (the owner's, through /proc, when the owner is a child).
 * regions_close() closes them once the engine has its own.
 */
static struct halite_restore_region sg_region(const struct sg *g, uint32_t i)
{
	struct halite_restore_region reg = { g->img->reg[i].name, g->host[i],
					     g->img->reg[i].length, mode_kind(g->mode), -1, 0 };

	if (reg.kind == HALITE_MEM_SHARED) {
		char path[64];

		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)g->owner, g->memfd[i]);
		reg.fd = open(path, O_RDWR | O_CLOEXEC);
		assert_true(reg.fd >= 0);
	}
	return reg;
}

static void regions_close(struct halite_restore_region *reg, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (reg[i].kind == HALITE_MEM_SHARED && reg[i].fd >= 0)
			close(reg[i].fd);
}

/* Stop the vCPUs (and the child), unmap. */
static void sg_destroy(struct sg *g)
{
	atomic_store(&g->stop, 1);
	if (mode_external(g->mode)) {
		int st;

		assert_int_equal(waitpid(g->owner, &st, 0), g->owner);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	} else {
		for (unsigned v = 0; v < g->nv; v++)
			pthread_join(g->thr[v], NULL);
		sg_owner_unmap(g);
	}
	r_shared_free(g->count, g->npages * sizeof(uint32_t));
	for (unsigned v = 0; v < g->nv; v++)
		r_shared_free(g->ws[v], g->npages * sizeof(uint32_t));
	r_shared_free(g, sizeof(*g));
}

/* Read the owner's memory at @addr: here, or process_vm_readv. */
static void owner_read(pid_t owner, uint64_t addr, void *buf, size_t len)
{
	if (owner == getpid()) {
		memcpy(buf, (void *)(uintptr_t)addr, len);
		return;
	}
	for (size_t done = 0; done < len;) {
		struct iovec l = { (uint8_t *)buf + done, len - done };
		struct iovec r = { (void *)(uintptr_t)(addr + done), len - done };
		ssize_t n = process_vm_readv(owner, &l, 1, &r, 1, 0);

		if (n <= 0)
			fail_msg("process_vm_readv of %d: %s", (int)owner, strerror(errno));
		done += (size_t)n;
	}
}

/* What a memory block is in the file, for messages. */
static const char *mb_desc(struct halite_reader *rd, uint64_t mb, char *buf, size_t len)
{
	struct halite_mb_loc loc;
	static const char *const st[] = { "untouched", "zero", "stored" };

	if (halite_reader_mb_lookup(rd, mb, &loc))
		snprintf(buf, len, "MB %" PRIu64 " (?)", mb);
	else if (loc.state == HALITE_MB_STORED)
		snprintf(buf, len, "MB %" PRIu64 " (stored in LB %" PRIu64 ", %scompressed)", mb,
			 loc.lb, loc.compressed ? "" : "not ");
	else
		snprintf(buf, len, "MB %" PRIu64 " (%s)", mb, st[loc.state % 3]);
	return buf;
}

/* The MB of snap page @p, for an image file. */
static uint64_t image_mb(struct halite_reader *rd, const struct image *img, uint64_t p)
{
	uint64_t at = p * PAGE;
	uint32_t r = img->nreg > 1 && at >= img->off[1];
	const struct halite_region_info *ri = halite_reader_region(rd, r);

	return ri->first_mb + (at - img->off[r]) / halite_reader_info(rd)->mb_size;
}

/*
 * The owner's memory is the snapshot plus each page's counter bumps, and the
 * vCPUs saw the snapshot on their first visit.
 */
static void sg_check(struct sg *g, struct halite_reader *rd)
{
	uint8_t got[PAGE], want[PAGE];
	char d[96];

	if (atomic_load(&g->mismatches))
		fail_msg("%s: a vCPU's first visit of page %" PRIu64 " (%s) saw other bytes than "
			 "the snapshot (%" PRIu64 " pages)",
			 mode_name[g->mode], atomic_load(&g->first_bad) - 1,
			 mb_desc(rd, image_mb(rd, g->img, atomic_load(&g->first_bad) - 1), d,
				 sizeof(d)),
			 atomic_load(&g->mismatches));
	for (uint64_t p = 0; p < g->npages; p++) {
		uint64_t w;

		owner_read(g->owner, (uintptr_t)sg_page(g, p), got, PAGE);
		memcpy(want, g->img->snap + p * PAGE, PAGE);
		memcpy(&w, want + sg_word(p), 8);
		w += g->count[p];
		memcpy(want + sg_word(p), &w, 8);
		if (memcmp(got, want, PAGE)) {
			size_t i = 0;

			while (got[i] == want[i])
				i++;
			fail_msg("%s: page %" PRIu64 " (%s), byte %zu: 0x%02x, expected 0x%02x "
				 "(bumped %u times)",
				 mode_name[g->mode], p, mb_desc(rd, image_mb(rd, g->img, p), d, sizeof(d)),
				 i, got[i], want[i], g->count[p]);
		}
	}
}

/* ---------------------------------------------------------------------- */
/* Checks common to every restore                                          */

/*
 * Vary the engine's I/O and pool options over the runs. All but the first
 * also throttle the prefetcher hard until the guest faults (50 ms idle, 8
 * MiB/s): on a loaded 2-CPU machine the vCPU threads may wait 20 ms for a
 * CPU, and a few MiB restore faster than that; with the throttle the vCPUs
 * surely run during the restore, which those runs assert.
 */
static bool vary_opts(struct halite_restore_opts *o, unsigned i)
{
	/*
	 * Throttled: the prefetcher yields to the vCPUs' faults, at 1 MiB/s
	 * at least, so a 5 MiB guest leaves its vCPUs 5 s to be scheduled and
	 * fault (at 8 MiB/s a loaded machine once ran none of them before the
	 * restore was done).
	 */
	if (i % 4) {
		o->prefetch_idle_us = 50000;
		o->prefetch_min_rate = 1u << 20;
	}
	switch (i % 4) {
	case 0:
		return false; /* every default */
	case 1:
		o->io_backend = HALITE_IO_BACKEND_URING;
		o->queue_depth = 2;
		o->workers = 1;
		o->demand_readers = 1;
		break;
	case 2:
		o->io_backend = HALITE_IO_BACKEND_AIO;
		o->read_latency_us = 300;
		o->workers = 2;
		break;
	case 3:
		o->io_backend = HALITE_IO_BACKEND_PSYNC;
		o->flags |= HALITE_RESTORE_DIRECT;
		o->workers = 3;
		o->demand_readers = 2;
		o->queue_depth = 16;
		break;
	}
	return true;
}

/* After a successful restore (prefetch on): every block counted once, every LB read once. */
static void check_done_stats(struct halite_restore *r, struct halite_reader *file, const char *what)
{
	struct halite_restore_stats st;
	const struct halite_file_info *fi = halite_reader_info(file);

	halite_restore_stats(r, &st);
	fprintf(stderr, "  %s: %" PRIu64 " faults (%" PRIu64 " vCPU, %" PRIu64 " cached, %" PRIu64
		" zero), LBs %" PRIu64 " demand + %" PRIu64 " prefetch; MBs %" PRIu64 " fault + %" PRIu64
		" pool + %" PRIu64 " prefetch + %" PRIu64 " zero; p50 %" PRIu64 " ns p99 %" PRIu64
		" ns; ready %" PRIu64 " us, %" PRIu64 " ms\n",
		what, st.faults, st.faults_vcpu, st.faults_cached, st.faults_zero, st.lb_demand,
		st.lb_prefetch, st.mb_fault, st.mb_pool, st.mb_prefetch, st.mb_zero, st.fault_p50_ns,
		st.fault_p99_ns, st.ready_ns / 1000, st.duration_ns / 1000000);
	assert_true(st.done);
	assert_int_equal(st.error, 0);
	assert_int_equal(st.mb_total, fi->mb_count);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_int_equal(st.mb_zero, fi->mb_zero + fi->mb_untouched);
	assert_int_equal(st.lb_total, fi->lb_count);
	assert_int_equal(st.lb_demand + st.lb_prefetch, st.lb_total);
	assert_int_equal(st.lb_retries, 0);
	assert_int_equal(st.bytes_read, st.lb_total * fi->lb_size); /* each LB, whole, once */
	assert_true(st.ready_ns > 0 && st.duration_ns > 0);
	assert_true(st.faults_cached + st.faults_zero <= st.faults);
	assert_true(st.faults_vcpu <= st.faults);
	assert_true(st.fault_p50_ns <= st.fault_p99_ns);
	assert_true(st.vm_access_pct < 0);
	assert_int_equal(st.mb_staged, 0);
	assert_int_equal(st.mb_staged_accessed, 0);
}

/* ---------------------------------------------------------------------- */
/* Exact content: writer-made files under the in-test guest               */

static void restore_sg(const char *path, const struct image *img, enum mode mode, unsigned vary,
		       const char *devstate, uint32_t latency_us)
{
	struct sg *g = sg_create(img, mode, SG_MAXV, 2, t_rand(&g_seed));
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_reader *file;
	struct halite_restore_stats st;
	char what[96], *trace = NULL;
	bool throttled;
	int uffd;

	snprintf(what, sizeof(what), "writer file, %s, options %u", mode_name[mode], vary % 4);
	sg_start_owner(g, &uffd);
	for (uint32_t i = 0; i < img->nreg; i++)
		reg[i] = sg_region(g, i);
	throttled = vary_opts(&o, vary);
	if (latency_us)
		o.read_latency_us = latency_us;
	o.vcpu_tids = g->tids;
	o.nvcpus = g->nv;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	if (mode_external(mode)) {
		o.owner_pid = g->owner;
		o.owner_uffd = uffd;
	}
	if (vary == 0) {
		trace = tmp_path("restore-trace-%d", mode);
		o.trace_path = trace;
	}
	assert_int_equal(halite_restore_open(&r, path, reg, img->nreg, &o), 0);
	regions_close(reg, img->nreg);
	if (devstate) {
		const void *data;
		uint64_t len;

		assert_int_equal(halite_restore_device_state(r, &data, &len), 0);
		assert_int_equal(len, strlen(devstate));
		assert_memory_equal(data, devstate, len);
	}
	assert_int_equal(halite_reader_open(&file, path, NULL), 0);
	assert_non_null(halite_restore_reader(r));
	assert_memory_equal(halite_reader_info(halite_restore_reader(r))->uuid,
			    halite_reader_info(file)->uuid, 16);
	assert_int_equal(halite_restore_start(r), 0);
	if (uffd >= 0)
		close(uffd); /* the engine keeps a dup; the owner keeps its own */
	atomic_store(&g->go, 1); /* the guest resumes at once */
	{
		uint64_t t0 = r_now_ms();

		while (atomic_load(&g->vdone) < g->nv && r_now_ms() - t0 < WAIT_MS)
			r_sleep_us(1000);
		assert_int_equal(atomic_load(&g->vdone), g->nv);
	}
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	check_done_stats(r, file, what);
	halite_restore_stats(r, &st);
	if (!st.faults_vcpu && throttled)
		fail_msg("%s: the restore was done before any vCPU faulted", what);
	for (uint32_t i = 0; i < img->nreg; i++)
		assert_int_equal(r_uffd_registered(g->owner, g->host[i], img->reg[i].length), 0);
	sg_check(g, file);
	halite_restore_free(r);
	/* Still the same after the engine is gone. */
	sg_check(g, file);
	if (trace) {
		assert_true(r_file_size(trace) > 0);
		unlink(trace);
		free(trace);
	}
	halite_reader_free(file);
	sg_destroy(g);
}

static void test_writer_file_every_codec(void **state)
{
	struct image img;
	unsigned vary = 0;

	make_image(&img, 4u << 20, (1u << 20) + PAGE, g_seed);
	for (int c = HALITE_CODEC_NONE; c < HALITE_CODEC_MAX; c++) {
		char *path = tmp_path("import-%s.hlt", halite_codec_name(c));
		const char *dev = c == HALITE_CODEC_LZ4 ? "device state: registers, devices" : NULL;

		write_image(path, &img, c, 0, 0, dev);
		check_file_is(path, img.snap, img.len);
		for (enum mode m = ANON; m < NMODES; m++) {
			fprintf(stderr, "writer file, codec %s, %s\n", halite_codec_name(c), mode_name[m]);
			restore_sg(path, &img, m, vary++ + (unsigned)c, dev, 0);
		}
		unlink(path);
		free(path);
	}
	free_image(&img);
}

/* Other block geometries: 1- and 4-page memory blocks, small and large LBs. */
static void test_writer_file_geometry(void **state)
{
	static const struct {
		uint32_t mb_pages, lb_size;
	} geo[] = { { 1, 4096 }, { 4, 32768 }, { 2, 1u << 20 } };
	struct image img;

	make_image(&img, 2u << 20, (1u << 20) + PAGE, g_seed + 7);
	for (size_t i = 0; i < sizeof(geo) / sizeof(geo[0]); i++) {
		char *path = tmp_path("geo-%zu.hlt", i);
		/* Two LBs of 1 MiB are read in one go: slow storage lets the vCPUs fault first. */
		uint32_t lat = geo[i].lb_size >= (1u << 20) ? 20000 : 0;

		write_image(path, &img, HALITE_CODEC_LZ4, geo[i].mb_pages, geo[i].lb_size, NULL);
		check_file_is(path, img.snap, img.len);
		fprintf(stderr, "writer file, %u-page MBs, %u-byte LBs\n", geo[i].mb_pages,
			geo[i].lb_size);
		restore_sg(path, &img, (enum mode)(i % NMODES), (unsigned)i + 1, NULL, lat);
		restore_sg(path, &img, EXT_SHARED - (enum mode)(i % 2), (unsigned)i + 2, NULL, lat);
		unlink(path);
		free(path);
	}
	free_image(&img);
}

/* ---------------------------------------------------------------------- */
/* Exact content: save-engine files of the synthetic guest                 */

struct synth_case {
	unsigned levels, flags, huge_2m;
};

/* Per codec: 4-level; 5-level with A/D bits; 2 MiB pages, junk, A/D; one address space. */
static const struct synth_case synth_cases[] = {
	{ 4, 0, 0 },
	{ 5, SYNTH_F_AD_BITS, 0 },
	{ 4, SYNTH_F_AD_BITS | SYNTH_F_NP_JUNK, 1 },
	{ 4, SYNTH_F_SHARED_AS, 0 },
};

#define SYNTH_NV 3
#define SYNTH_ACCESSES 30000u

/* What shapes memory: the snapshot's guest and the restore's target share these. */
static void synth_base(struct synth_opts *so, const struct synth_case *c, uint64_t seed)
{
	*so = (struct synth_opts){
		.sz = sizeof(*so), .mem_bytes = 16ull << 20, .nvcpus = SYNTH_NV, .stride = 16,
		.map_bytes = 3ull << 20, .ws_bytes = 2ull << 20, .compress_pct = 40,
		.zero_pct = 5, .untouched_pct = 20, .hole_every = 9, .paging_levels = c->levels,
		.flags = c->flags, .huge_2m = c->huge_2m, .seed = seed,
	};
}

/*
 * Run a guest, snapshot it with the save engine (memfd memory: the save's
 * anonymous mode needs MREMAP_DONTUNMAP, which TSan's mappings refuse), and
 * return the memory at the snapshot instant.
 */
static uint8_t *make_synth_file(const char *path, int codec, const struct synth_opts *base)
{
	struct synth_opts so = *base;
	HALITE_OPTS(halite_save_opts, o);
	struct synth_guest *g;
	struct synth_info info;
	struct halite_save *s;
	struct halite_save_region reg;
	pid_t tids[SYNTH_NV];
	uint8_t *snap;

	so.backing = SYNTH_MEM_SHARED;
	so.write_pct = 50;
	so.pattern = SYNTH_PAT_SEQ;
	assert_int_equal(synth_create(&g, &so), 0);
	assert_int_equal(synth_info(g, &info), 0);
	assert_int_equal(synth_start(g), 0);
	r_sleep_us(5000);
	assert_int_equal(synth_pause(g), 0);
	snap = malloc(info.mem_bytes);
	assert_int_equal(synth_copy_memory(g, snap), 0);

	reg = (struct halite_save_region){ SYNTH_REGION_NAME, 0, info.mem_bytes,
					   (uintptr_t)info.host_addr, HALITE_MEM_SHARED, info.memfd,
					   0 };
	for (unsigned v = 0; v < SYNTH_NV; v++) {
		struct synth_vcpu_info vi;

		assert_int_equal(synth_vcpu_info(g, v, &vi), 0);
		tids[v] = vi.tid;
	}
	o.codec = codec;
	o.flags = HALITE_SAVE_NO_SYNC;
	o.vcpu_tids = tids;
	o.nvcpus = SYNTH_NV;
	o.workers = 2;
	o.bg_idle_us = 500;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_save_create(&s, path, &reg, 1, &o), 0);
	for (unsigned v = 0; v < SYNTH_NV; v++) {
		struct synth_vcpu_info vi;
		struct halite_root root;

		assert_int_equal(synth_vcpu_info(g, v, &vi), 0);
		root = (struct halite_root){ v, vi.paging_levels, vi.cr3 };
		assert_int_equal(halite_save_add_root(s, &root), 0);
	}
	assert_int_equal(halite_save_arm(s), 0);
	assert_int_equal(synth_resume(g), 0);
	assert_int_equal(halite_save_wait(s, WAIT_MS), 0);
	halite_save_free(s);
	assert_int_equal(synth_stop(g), 0);
	synth_free(g);
	check_file_is(path, snap, info.mem_bytes);
	return snap;
}

#define X86_P (1ull << 0)
#define X86_RW (1ull << 1)
#define X86_A (1ull << 5)
#define X86_D (1ull << 6)
#define X86_PS (1ull << 7)
#define X86_ADDR 0x000ffffffffff000ull

/*
 * The x86-64 walk (SDM vol. 3, 4.5) over @mem, setting A (and D on a written
 * leaf) as the hardware does when @ad: 0 and *pa, or -1.
 */
static int mmu_walk(uint8_t *mem, uint64_t len, uint64_t cr3, unsigned levels, uint64_t va,
		    bool write, bool ad, uint64_t *pa)
{
	uint64_t table = cr3 & X86_ADDR;

	for (int lvl = (int)levels; lvl >= 1; lvl--) {
		unsigned shift = 12 + 9 * (unsigned)(lvl - 1);
		uint64_t ea = table + ((va >> shift) & 511) * 8, e;
		bool leaf;

		if (ea + 8 > len)
			return -1;
		memcpy(&e, mem + ea, 8);
		if (!(e & X86_P) || (write && !(e & X86_RW)) || ((e & X86_PS) && lvl > 3))
			return -1;
		leaf = lvl == 1 || (e & X86_PS);
		if (ad) {
			e |= X86_A | (leaf && write ? X86_D : 0);
			memcpy(mem + ea, &e, 8);
		}
		if (leaf) {
			uint64_t size = 1ull << shift;

			*pa = (e & X86_ADDR & ~(size - 1)) | (va & (size - 1));
			return *pa + 8 <= len ? 0 : -1;
		}
		table = e & X86_ADDR;
	}
	return -1;
}

/*
 * Replay the guest's recorded accesses over @mem (the snapshot): the exact
 * memory the vCPUs leave behind. Returns the number of accesses of each vCPU.
 */
static void replay_trace(const char *path, uint8_t *mem, uint64_t len, const uint64_t *cr3,
			 unsigned levels, bool ad, uint64_t *per_vcpu)
{
	uint8_t h[SYNTH_TRACE_HDR], rec[SYNTH_TRACE_REC];
	FILE *f = fopen(path, "rb");
	uint32_t ver, rsz, nv;

	assert_non_null(f);
	assert_int_equal(fread(h, 1, sizeof(h), f), sizeof(h));
	assert_memory_equal(h, SYNTH_TRACE_MAGIC, 8);
	memcpy(&ver, h + 8, 4);
	memcpy(&rsz, h + 12, 4);
	memcpy(&nv, h + 16, 4);
	assert_int_equal(ver, 1);
	assert_int_equal(rsz, SYNTH_TRACE_REC);
	assert_int_equal(nv, SYNTH_NV);
	while (fread(rec, 1, sizeof(rec), f) == sizeof(rec)) {
		uint64_t va, pa = 0, w;
		uint32_t v, fl;

		memcpy(&va, rec, 8);
		memcpy(&v, rec + 8, 4);
		memcpy(&fl, rec + 12, 4);
		assert_true(v < SYNTH_NV);
		if (mmu_walk(mem, len, cr3[v], levels, va, fl & SYNTH_TRACE_WRITE, ad, &pa))
			fail_msg("vCPU %u's access to 0x%" PRIx64 " does not translate in the snapshot",
				 v, va);
		if (fl & SYNTH_TRACE_WRITE) {
			memcpy(&w, mem + (pa & ~7ull), 8);
			w += SYNTH_WRITE_ADD;
			memcpy(mem + (pa & ~7ull), &w, 8);
		}
		per_vcpu[v]++;
	}
	fclose(f);
}

static void restore_synth(const char *path, const uint8_t *snap, const struct synth_opts *base,
			  enum mode mode, unsigned vary)
{
	struct synth_opts t = *base;
	HALITE_OPTS(halite_restore_opts, o);
	struct synth_guest *g;
	struct synth_info info;
	struct halite_restore *r;
	struct halite_restore_region reg;
	struct halite_restore_stats st;
	struct halite_reader *file;
	pid_t tids[SYNTH_NV];
	uint64_t cr3[SYNTH_NV], acc[SYNTH_NV] = { 0 };
	uint8_t *got, *want, *kinds;
	char *trace = tmp_path("synth-%d.trace", mode), what[96];
	bool throttled;
	int uffd = -1;

	snprintf(what, sizeof(what), "synthetic guest, %s, options %u", mode_name[mode], vary % 4);
	t.flags |= SYNTH_F_ATTACH | (mode_external(mode) ? SYNTH_F_CHILD : 0);
	t.backing = mode_kind(mode) == HALITE_MEM_SHARED ? SYNTH_MEM_SHARED : SYNTH_MEM_ANON;
	t.write_pct = 30;
	t.pattern = vary % 2 ? SYNTH_PAT_RANDOM : SYNTH_PAT_SEQ;
	t.max_accesses = SYNTH_ACCESSES;
	t.trace_out = trace;
	assert_int_equal(synth_create(&g, &t), 0);
	assert_int_equal(synth_info(g, &info), 0);
	for (unsigned v = 0; v < SYNTH_NV; v++) {
		struct synth_vcpu_info vi;

		assert_int_equal(synth_vcpu_info(g, v, &vi), 0);
		tids[v] = vi.tid;
		cr3[v] = vi.cr3;
	}
	reg = (struct halite_restore_region){ SYNTH_REGION_NAME, (uintptr_t)info.host_addr,
					      info.mem_bytes, mode_kind(mode), info.memfd, 0 };
	throttled = vary_opts(&o, vary);
	o.vcpu_tids = tids;
	o.nvcpus = SYNTH_NV;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	if (mode_external(mode)) {
		uffd = synth_get_uffd(g);
		assert_true(uffd >= 0);
		o.owner_pid = info.owner_pid;
		o.owner_uffd = uffd;
	}
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	if (uffd >= 0)
		close(uffd);
	/* The vCPUs start on empty memory: their first walk faults on the root table. */
	assert_int_equal(synth_start(g), 0);
	assert_int_equal(synth_wait_done(g, WAIT_MS), 0);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	assert_int_equal(halite_reader_open(&file, path, NULL), 0);
	check_done_stats(r, file, what);
	halite_restore_stats(r, &st);
	if (!st.faults_vcpu && throttled)
		fail_msg("%s: the restore was done before any vCPU faulted", what);
	assert_int_equal(r_uffd_registered(info.owner_pid, (uintptr_t)info.host_addr, info.mem_bytes),
			 0);
	for (unsigned v = 0; v < SYNTH_NV; v++) {
		struct synth_vcpu_stats vs;

		assert_int_equal(synth_vcpu_stats(g, v, &vs), 0);
		assert_int_equal(vs.accesses, SYNTH_ACCESSES);
		if (vs.faults)
			fail_msg("%s: vCPU %u: %" PRIu64 " translations failed: it read page tables "
				 "that were not the snapshot's", what, v, vs.faults);
	}
	assert_int_equal(synth_stop(g), 0); /* flushes the trace */
	got = malloc(info.mem_bytes);
	want = malloc(info.mem_bytes);
	kinds = malloc(info.mem_bytes / PAGE);
	assert_int_equal(synth_copy_memory(g, got), 0);
	assert_int_equal(synth_frame_kinds(g, 0, kinds, info.mem_bytes / PAGE),
			 (int)(info.mem_bytes / PAGE));
	memcpy(want, snap, info.mem_bytes);
	replay_trace(trace, want, info.mem_bytes, cr3, t.paging_levels, t.flags & SYNTH_F_AD_BITS,
		     acc);
	for (unsigned v = 0; v < SYNTH_NV; v++)
		assert_int_equal(acc[v], SYNTH_ACCESSES);
	for (uint64_t p = 0; p < info.mem_bytes / PAGE; p++) {
		if (memcmp(got + p * PAGE, want + p * PAGE, PAGE)) {
			size_t i = 0;
			char d[96];

			while (got[p * PAGE + i] == want[p * PAGE + i])
				i++;
			fail_msg("%s: frame %" PRIu64 " (kind 0x%x, %s), byte %zu: 0x%02x, expected "
				 "0x%02x",
				 what, p, kinds[p],
				 mb_desc(file, p * PAGE / halite_reader_info(file)->mb_size, d,
					 sizeof(d)),
				 i, got[p * PAGE + i], want[p * PAGE + i]);
		}
	}
	halite_restore_free(r);
	synth_free(g);
	halite_reader_free(file);
	unlink(trace);
	free(trace);
	free(got);
	free(want);
	free(kinds);
}

static void test_saved_synth_every_codec(void **state)
{
	for (int c = HALITE_CODEC_NONE; c < HALITE_CODEC_MAX; c++) {
		const struct synth_case *sc = &synth_cases[(c - HALITE_CODEC_NONE) % 4];
		char *path = tmp_path("synth-%s.hlt", halite_codec_name(c));
		struct synth_opts base;
		uint8_t *snap;

		synth_base(&base, sc, t_rand(&g_seed));
		snap = make_synth_file(path, c, &base);
		for (enum mode m = ANON; m < NMODES; m++) {
			fprintf(stderr, "synthetic guest (%u-level, flags 0x%x, %u huge), codec %s, %s\n",
				sc->levels, sc->flags, sc->huge_2m, halite_codec_name(c), mode_name[m]);
			restore_synth(path, snap, &base, m, (unsigned)(c + m));
		}
		free(snap);
		unlink(path);
		free(path);
	}
}

/* ---------------------------------------------------------------------- */
/* Exact counts                                                             */

/* In-process memory for an image's regions, empty. */
struct mem {
	uint32_t nreg;
	uint64_t host[MAXREG], len[MAXREG];
	int fd[MAXREG]; /* shared: the memfd; else -1 */
	int kind;
};

/* No cmocka: forked children map their memory with this too. 0 or -errno. */
static int mem_map_try(struct mem *m, const struct image *img, int kind)
{
	m->nreg = img->nreg;
	m->kind = kind;
	for (uint32_t r = 0; r < img->nreg; r++) {
		void *p;

		m->len[r] = img->reg[r].length;
		m->fd[r] = -1;
		if (kind == HALITE_MEM_SHARED) {
			int fd = memfd_create("guest", MFD_CLOEXEC);

			if (fd < 0 || ftruncate(fd, (off_t)m->len[r]))
				return -errno;
			p = mmap(NULL, m->len[r], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			m->fd[r] = fd; /* the engine is given the file */
		} else {
			p = mmap(NULL, m->len[r], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
		}
		if (p == MAP_FAILED)
			return -errno;
		madvise(p, m->len[r], MADV_NOHUGEPAGE);
		m->host[r] = (uintptr_t)p;
	}
	return 0;
}

static void mem_map(struct mem *m, const struct image *img, int kind)
{
	assert_int_equal(mem_map_try(m, img, kind), 0);
}

static void mem_unmap(struct mem *m)
{
	for (uint32_t r = 0; r < m->nreg; r++) {
		munmap((void *)(uintptr_t)m->host[r], m->len[r]);
		if (m->fd[r] >= 0)
			close(m->fd[r]);
	}
}

static void mem_regions(const struct mem *m, const struct image *img,
			struct halite_restore_region *reg)
{
	for (uint32_t r = 0; r < m->nreg; r++)
		reg[r] = (struct halite_restore_region){ img->reg[r].name, m->host[r], m->len[r],
							 m->kind, m->fd[r], 0 };
}

/* The file's view of memory blocks, and what the engine must have done so far. */
struct model {
	struct halite_reader *rd;
	const struct mem *mem;
	uint64_t nmb, nlb, npages;
	uint32_t mb_size;
	uint8_t *state;		/* per MB: enum halite_mb_state */
	uint64_t *lb;		/* per MB: its LB when stored */
	uint8_t *installed, *staged, *lb_read;
	uint8_t *present;	/* per page of the whole memory, from pagemap */
	bool track;
	struct {
		uint64_t faults, cached, zero, vcpu, lb_demand, mb_fault, mb_pool, staged,
			staged_acc;
	} e;
};

static void model_init(struct model *m, struct halite_reader *rd, const struct mem *mem, bool track)
{
	memset(m, 0, sizeof(*m));
	m->rd = rd;
	m->mem = mem;
	m->track = track;
	m->nmb = halite_reader_info(rd)->mb_count;
	m->nlb = halite_reader_info(rd)->lb_count;
	m->mb_size = halite_reader_info(rd)->mb_size;
	m->state = calloc(m->nmb, 1);
	m->lb = calloc(m->nmb, sizeof(uint64_t));
	m->installed = calloc(m->nmb, 1);
	m->staged = calloc(m->nmb, 1);
	m->lb_read = calloc(m->nlb, 1);
	for (uint32_t r = 0; r < mem->nreg; r++)
		m->npages += mem->len[r] / PAGE;
	m->present = calloc(m->npages, 1);
	for (uint64_t mb = 0; mb < m->nmb; mb++) {
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_mb_lookup(rd, mb, &loc), 0);
		m->state[mb] = (uint8_t)loc.state;
		m->lb[mb] = loc.lb;
	}
}

static void model_free(struct model *m)
{
	free(m->state);
	free(m->lb);
	free(m->installed);
	free(m->staged);
	free(m->lb_read);
	free(m->present);
}

/* Region of @mb, its first page in the whole memory, and its address. */
static uint64_t model_mb_addr(const struct model *m, uint64_t mb, uint64_t *first_page)
{
	uint64_t pages_before = 0;

	for (uint32_t r = 0; r < m->mem->nreg; r++) {
		const struct halite_region_info *ri = halite_reader_region(m->rd, r);

		if (mb >= ri->first_mb && mb < ri->first_mb + ri->mb_count) {
			uint64_t off = (mb - ri->first_mb) * m->mb_size;

			if (first_page)
				*first_page = pages_before + off / PAGE;
			return m->mem->host[r] + off;
		}
		pages_before += m->mem->len[r] / PAGE;
	}
	fail_msg("MB %" PRIu64 " is in no region", mb);
	return 0;
}

static uint32_t model_mb_pages(const struct model *m, uint64_t mb)
{
	return halite_reader_mb_bytes(m->rd, mb) / PAGE;
}

/* What touching @mb from a vCPU (or not) must do. */
static void model_touch(struct model *m, uint64_t mb, bool vcpu)
{
	const uint64_t *mbs;
	uint32_t n;

	if (m->installed[mb])
		return; /* present: no fault at all */
	m->e.faults++;
	m->e.vcpu += vcpu;
	m->installed[mb] = 1;
	if (m->state[mb] != HALITE_MB_STORED) {
		m->e.zero++; /* the whole block gets the zero page */
		return;
	}
	if (m->staged[mb]) {
		m->staged[mb] = 0;
		m->e.cached++;	     /* answered from the stage: the LB is in memory */
		m->e.staged_acc++;
		m->e.mb_fault++;     /* installed by the fault that wanted it */
		return;
	}
	assert_false(m->lb_read[m->lb[mb]]); /* quiet engine: a read LB's blocks are in or staged */
	m->lb_read[m->lb[mb]] = 1;
	m->e.lb_demand++;
	m->e.mb_fault++;
	assert_int_equal(halite_reader_lb_members(m->rd, m->lb[mb], &mbs, &n), 0);
	for (uint32_t i = 0; i < n; i++) {
		if (mbs[i] == mb)
			continue;
		if (m->track) {
			m->staged[mbs[i]] = 1;
			m->e.staged++;
		} else {
			m->installed[mbs[i]] = 1;
			m->e.mb_pool++;
		}
	}
}

/*
 * Whether the engine is where the model is: counters and which pages are
 * present. NULL if so, else what differs (into @buf).
 */
static const char *model_differs(struct model *m, struct halite_restore *r, char *buf, size_t len)
{
	struct halite_restore_stats st;
	uint64_t at = 0;

	halite_restore_stats(r, &st);
#define SAME(field, want)                                                                    \
	if (st.field != (want)) {                                                            \
		snprintf(buf, len, #field " %" PRIu64 ", expected %" PRIu64, st.field,       \
			 (uint64_t)(want));                                                  \
		return buf;                                                                  \
	}
	SAME(faults, m->e.faults);
	SAME(faults_cached, m->e.cached);
	SAME(faults_zero, m->e.zero);
	SAME(faults_vcpu, m->e.vcpu);
	SAME(lb_demand, m->e.lb_demand);
	SAME(lb_prefetch, 0);
	SAME(mb_prefetch, 0);
	SAME(mb_staged, m->e.staged);
	SAME(mb_staged_accessed, m->e.staged_acc);
	if (!m->track)
		SAME(mb_fault + st.mb_pool, m->e.mb_fault + m->e.mb_pool);
#undef SAME
	for (uint32_t i = 0; i < m->mem->nreg; i++) {
		long n = r_pages_present(getpid(), m->mem->host[i], m->mem->len[i], m->present + at);

		assert_true(n >= 0);
		at += m->mem->len[i] / PAGE;
	}
	for (uint64_t mb = 0; mb < m->nmb; mb++) {
		uint64_t p0;

		model_mb_addr(m, mb, &p0);
		for (uint32_t i = 0; i < model_mb_pages(m, mb); i++)
			if (m->present[p0 + i] != m->installed[mb]) {
				char d[96];

				snprintf(buf, len, "page %u of %s is %spresent", i,
					 mb_desc(m->rd, mb, d, sizeof(d)),
					 m->present[p0 + i] ? "" : "not ");
				return buf;
			}
	}
	return NULL;
}

/* Wait (10 s at most) for the engine to be where the model is. */
static void model_settle(struct model *m, struct halite_restore *r, const char *when)
{
	char buf[256];
	const char *d = NULL;
	uint64_t t0 = r_now_ms();

	while ((d = model_differs(m, r, buf, sizeof(buf))) && r_now_ms() - t0 < 10000)
		r_sleep_us(200);
	if (d)
		fail_msg("%s: %s", when, d);
}

/*
 * A thread that touches what it is told to, one address at a time. The test's
 * main thread never touches restored memory itself: a thread blocked in a
 * userfault that is woken for another reason (a signal, or io_uring task
 * work: the main thread ran the writer's io_uring ring) faults again, and the
 * engine rightly counts a second fault. Fresh threads get no such wake-ups.
 */
struct toucher {
	pthread_t thr;
	_Atomic pid_t tid;
	_Atomic uint64_t addr;	/* 0: nothing to do */
	_Atomic int write, quit;
};

/* Touchers still running when a test failed: stopped by the teardown. */
static struct toucher *g_touchers[4];

static void touch_addr(uint64_t addr, bool write)
{
	volatile uint64_t *p = (volatile uint64_t *)(uintptr_t)addr;

	if (write) /* a write access first, of nothing: the content stays */
		__atomic_fetch_add((uint64_t *)(uintptr_t)addr, 0, __ATOMIC_SEQ_CST);
	else
		(void)*p;
}

static void *toucher_main(void *arg)
{
	struct toucher *t = arg;

	atomic_store(&t->tid, my_tid());
	while (!atomic_load(&t->quit)) {
		uint64_t a = atomic_load(&t->addr);

		if (!a) {
			r_sleep_us(20);
			continue;
		}
		touch_addr(a, atomic_load(&t->write));
		atomic_store(&t->addr, 0);
	}
	return NULL;
}

static struct toucher *toucher_start(void)
{
	struct toucher *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	assert_int_equal(pthread_create(&t->thr, NULL, toucher_main, t), 0);
	while (!atomic_load(&t->tid))
		r_sleep_us(50);
	for (size_t i = 0; i < sizeof(g_touchers) / sizeof(g_touchers[0]); i++)
		if (!g_touchers[i]) {
			g_touchers[i] = t;
			return t;
		}
	fail_msg("too many touchers");
	return NULL;
}

/* Stop a toucher (NULL: all); a test's teardown after a failure. */
static void toucher_stop(struct toucher *t)
{
	for (size_t i = 0; i < sizeof(g_touchers) / sizeof(g_touchers[0]); i++) {
		struct toucher *u = g_touchers[i];

		if (!u || (t && u != t))
			continue;
		atomic_store(&u->quit, 1);
		/* One blocked in a fault of a failed test's restore is left behind. */
		if (!atomic_load(&u->addr))
			pthread_join(u->thr, NULL);
		else
			pthread_detach(u->thr);
		g_touchers[i] = NULL;
		if (!atomic_load(&u->addr))
			free(u);
	}
}

static int teardown_touchers(void **state)
{
	toucher_stop(NULL);
	return 0;
}

static void toucher_do(struct toucher *t, uint64_t addr, bool write)
{
	atomic_store(&t->write, write);
	atomic_store(&t->addr, addr);
	for (uint64_t t0 = r_now_ms(); atomic_load(&t->addr); r_sleep_us(20))
		if (r_now_ms() - t0 > 10000)
			fail_msg("the vCPU thread's touch of 0x%" PRIx64 " did not return", addr);
}

struct step {
	uint64_t mb;
	uint32_t page;
	bool vcpu, write;
};

/*
 * The plan: one block of each LB but a last one, in random order, mixed with
 * zero and never-touched blocks, touches of present pages and second pages
 * of blocks in; then a quarter of the blocks that came in with an LB (staged
 * with TRACK_ACCESS); then the last LB, which completes the restore.
 */
static size_t make_plan(struct model *m, struct step *s, size_t cap, uint64_t *seed)
{
	uint64_t *order = malloc(m->nlb * sizeof(uint64_t)), *other = malloc(m->nmb * 8);
	size_t n = 0, nother = 0;

	for (uint64_t mb = 0; mb < m->nmb; mb++)
		if (m->state[mb] != HALITE_MB_STORED)
			other[nother++] = mb;
	assert_true(nother > 4);
	for (uint64_t i = 0; i < m->nlb; i++)
		order[i] = i;
	for (uint64_t i = m->nlb; i > 1; i--) {
		uint64_t j = t_rand(seed) % i, t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
#define ADD(mb_, page_)                                                                    \
	do {                                                                               \
		assert_true(n < cap);                                                      \
		s[n] = (struct step){ (mb_), (page_), t_rand(seed) % 5 < 3, t_rand(seed) % 3 == 0 }; \
		n++;                                                                       \
	} while (0)
	for (uint64_t i = 0; i + 1 < m->nlb; i++) {
		const uint64_t *mbs;
		uint32_t cnt;
		uint64_t mb;

		assert_int_equal(halite_reader_lb_members(m->rd, order[i], &mbs, &cnt), 0);
		mb = mbs[t_rand(seed) % cnt];
		ADD(mb, (uint32_t)(t_rand(seed) % model_mb_pages(m, mb)));
		if (t_rand(seed) % 3 == 0) {
			uint64_t z = other[t_rand(seed) % nother];

			ADD(z, (uint32_t)(t_rand(seed) % model_mb_pages(m, z)));
		}
		if (t_rand(seed) % 4 == 0)
			ADD(s[n - 1].mb, s[n - 1].page); /* present now: no fault */
		if (t_rand(seed) % 4 == 0 && model_mb_pages(m, mb) > 1)
			ADD(mb, model_mb_pages(m, mb) - 1); /* its other page came with it */
	}
	for (uint64_t mb = 0; mb < m->nmb; mb++)
		if (m->state[mb] == HALITE_MB_STORED && m->lb[mb] != order[m->nlb - 1] &&
		    t_rand(seed) % 4 == 0)
			ADD(mb, (uint32_t)(t_rand(seed) % model_mb_pages(m, mb)));
	{
		const uint64_t *mbs;
		uint32_t cnt;

		assert_int_equal(halite_reader_lb_members(m->rd, order[m->nlb - 1], &mbs, &cnt), 0);
		ADD(mbs[0], 0);
	}
#undef ADD
	free(order);
	free(other);
	return n;
}

static void run_counts(int kind, bool track)
{
	struct image img;
	struct mem mem;
	struct model m;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_reader *rd;
	struct halite_restore_stats st;
	struct toucher *tv, *to;
	struct step *plan;
	size_t n;
	pid_t vtid;
	uint64_t seed = t_rand(&g_seed);
	char *path = tmp_path("counts.hlt"), when[128];

	fprintf(stderr, "counts: %s memory, %s\n", kind == HALITE_MEM_SHARED ? "memfd" : "anonymous",
		track ? "TRACK_ACCESS" : "no tracking");
	/* Small LBs: many of them, holding 1 to 8 blocks each. */
	make_image(&img, 2u << 20, (512u << 10) + PAGE, seed);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 16384, NULL);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	mem_map(&mem, &img, kind);
	mem_regions(&mem, &img, reg);
	model_init(&m, rd, &mem, track);
	plan = calloc(4 * m.nmb, sizeof(*plan));
	n = make_plan(&m, plan, 4 * m.nmb, &seed);

	tv = toucher_start();
	to = toucher_start();
	vtid = atomic_load(&tv->tid);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD |
		  (track ? HALITE_RESTORE_TRACK_ACCESS : 0);
	o.vcpu_tids = &vtid;
	o.nvcpus = 1;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), 0);
	for (uint32_t i = 0; i < img.nreg; i++)
		assert_int_equal(r_uffd_registered(getpid(), mem.host[i], mem.len[i]), 0);
	assert_int_equal(halite_restore_start(r), 0);
	for (uint32_t i = 0; i < img.nreg; i++)
		assert_int_equal(r_uffd_registered(getpid(), mem.host[i], mem.len[i]), 1);
	model_settle(&m, r, "after start");

	for (size_t i = 0; i < n; i++) {
		uint64_t addr = model_mb_addr(&m, plan[i].mb, NULL) + (uint64_t)plan[i].page * PAGE +
				(t_rand(&seed) % (PAGE / 8)) * 8;
		char d[96];

		toucher_do(plan[i].vcpu ? tv : to, addr, plan[i].write);
		model_touch(&m, plan[i].mb, plan[i].vcpu);
		if (i + 1 == n)
			break; /* the last one completes the restore */
		snprintf(when, sizeof(when), "step %zu of %zu (%s page %u, %s, %s)", i, n,
			 mb_desc(rd, plan[i].mb, d, sizeof(d)), plan[i].page,
			 plan[i].vcpu ? "vCPU" : "other thread", plan[i].write ? "write" : "read");
		model_settle(&m, r, when);
		halite_restore_stats(r, &st);
		assert_false(st.done);
	}
	assert_int_equal(halite_restore_wait(r, 10000), 0);
	halite_restore_stats(r, &st);
	/* Staged blocks nobody touched are installed at the end. */
	if (track) {
		for (uint64_t mb = 0; mb < m.nmb; mb++)
			if (m.staged[mb]) {
				m.staged[mb] = 0;
				m.installed[mb] = 1;
				m.e.mb_pool++;
			}
	}
	model_settle(&m, r, "done");
	fprintf(stderr, "  %zu touches: %" PRIu64 " faults (%" PRIu64 " vCPU, %" PRIu64
		" cached, %" PRIu64 " zero), %" PRIu64 " LBs; MBs %" PRIu64 " fault + %" PRIu64
		" pool + %" PRIu64 " zero; staged %" PRIu64 ", accessed %" PRIu64 " (%.1f%%)\n",
		n, st.faults, st.faults_vcpu, st.faults_cached, st.faults_zero, st.lb_demand,
		st.mb_fault, st.mb_pool, st.mb_zero, st.mb_staged, st.mb_staged_accessed,
		st.vm_access_pct);
	assert_true(st.done);
	assert_int_equal(st.error, 0);
	assert_int_equal(st.mb_total, m.nmb);
	assert_int_equal(st.lb_total, m.nlb);
	assert_int_equal(st.lb_demand, m.nlb);
	assert_int_equal(st.lb_retries, 0);
	assert_int_equal(st.mb_fault, m.e.mb_fault);
	assert_int_equal(st.mb_pool, m.e.mb_pool);
	assert_int_equal(st.mb_prefetch, 0);
	assert_int_equal(st.mb_zero, halite_reader_info(rd)->mb_zero +
					    halite_reader_info(rd)->mb_untouched);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_true(st.fault_p50_ns > 0 && st.fault_p50_ns <= st.fault_p99_ns);
	if (track) {
		assert_true(m.e.staged > 0 && m.e.staged_acc > 0 && m.e.staged_acc < m.e.staged);
		assert_true(fabs(st.vm_access_pct - 100.0 * (double)m.e.staged_acc /
							    (double)m.e.staged) < 1e-9);
	} else {
		assert_true(st.vm_access_pct < 0);
	}
	for (uint32_t i = 0; i < img.nreg; i++)
		assert_int_equal(r_uffd_registered(getpid(), mem.host[i], mem.len[i]), 0);

	/* After done: memory is the snapshot, and nothing faults any more. */
	for (uint32_t i = 0; i < img.nreg; i++)
		assert_memory_equal((void *)(uintptr_t)mem.host[i], img.snap + img.off[i], mem.len[i]);
	{
		struct halite_restore_stats st2;

		halite_restore_stats(r, &st2);
		assert_int_equal(st2.faults, st.faults);
	}
	toucher_stop(tv);
	toucher_stop(to);
	halite_restore_free(r);
	model_free(&m);
	free(plan);
	halite_reader_free(rd);
	mem_unmap(&mem);
	unlink(path);
	free(path);
	free_image(&img);
}

static void test_counts_exact(void **state)
{
	run_counts(HALITE_MEM_ANON, false);
	run_counts(HALITE_MEM_SHARED, false);
}

static void test_counts_track_access(void **state)
{
	run_counts(HALITE_MEM_ANON, true);
	run_counts(HALITE_MEM_SHARED, true);
}

/* ---------------------------------------------------------------------- */
/* Failure                                                                  */

static bool wait_flag(_Atomic int *f, unsigned ms)
{
	for (uint64_t t0 = r_now_ms(); !atomic_load(f); r_sleep_us(200))
		if (r_now_ms() - t0 > ms)
			return false;
	return true;
}

/* Where a memory block of an image file is: region, offset, page in snap, bytes. */
struct mbloc {
	uint64_t mb;
	uint32_t r;
	uint64_t off, page;
	uint32_t bytes;
};

static struct mbloc image_mb_loc(struct halite_reader *rd, const struct image *img, uint64_t mb)
{
	for (uint32_t r = 0; r < img->nreg; r++) {
		const struct halite_region_info *ri = halite_reader_region(rd, r);

		if (mb >= ri->first_mb && mb < ri->first_mb + ri->mb_count) {
			uint64_t off = (mb - ri->first_mb) * halite_reader_info(rd)->mb_size;

			return (struct mbloc){ mb, r, off, (img->off[r] + off) / PAGE,
					       halite_reader_mb_bytes(rd, mb) };
		}
	}
	fail_msg("MB %" PRIu64 " is in no region", mb);
	return (struct mbloc){ 0 };
}

#define MAXMEMBERS 64

/* A restore in a forked child, and what goes wrong in it. */
struct fail_plan {
	const char *path;
	const struct image *img;
	int kind;
	bool truncate;		/* cut the file at @cut after the good touch */
	uint64_t cut;
	unsigned retries;	/* read_retries; 0: the default */
	uint64_t bad_lb;
	struct mbloc good[MAXMEMBERS], bad[MAXMEMBERS];
	uint32_t ngood, nbad;
};

struct fail_res {
	int phase, setup_err, ret, good_ok, returned_at_check;
	char tstate;
	char msg[512];
	struct halite_restore_stats st;
	long bad_present, bad_resident, good_present;
	uint64_t bad_pages, good_pages;
	struct touch t;
};

static void count_pages(const struct mem *mem, const struct mbloc *l, uint32_t n, long *present,
			long *resident, uint64_t *pages)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t addr = mem->host[l[i].r] + l[i].off;
		uint64_t len = (l[i].bytes + PAGE - 1) / PAGE * PAGE;
		unsigned char vec[64];

		*present += r_pages_present(getpid(), addr, len, NULL);
		*pages += len / PAGE;
		if (resident && !mincore((void *)(uintptr_t)addr, len, vec))
			for (uint64_t p = 0; p < len / PAGE; p++)
				*resident += vec[p] & 1;
	}
}

/*
 * The child: restore in this process, touch a good block, then a block of the
 * bad LB from another thread; see the restore fail and the thread stay
 * blocked, then free the restore: the blocked thread must die of SIGSEGV.
 */
static void __attribute__((noreturn)) fail_child(const struct fail_plan *fp, struct fail_res *res)
{
	struct mem mem;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct r_log log;
	const struct mbloc *g0 = &fp->good[0], *b0 = &fp->bad[0];
	long dummy = 0;

	signal(SIGSEGV, SIG_DFL); /* sanitizers: let it kill the process */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	r_log_init(&log, true);
	res->setup_err = mem_map_try(&mem, fp->img, fp->kind);
	if (res->setup_err)
		_exit(3);
	for (uint32_t i = 0; i < mem.nreg; i++)
		reg[i] = (struct halite_restore_region){ fp->img->reg[i].name, mem.host[i], mem.len[i],
							 fp->kind, mem.fd[i], 0 };
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	o.read_retries = fp->retries;
	o.log = r_log_fn;
	o.log_ctx = &log;
	o.log_level = HALITE_LOG_WARN;
	res->setup_err = halite_restore_open(&r, fp->path, reg, mem.nreg, &o);
	if (!res->setup_err)
		res->setup_err = halite_restore_start(r);
	if (res->setup_err)
		_exit(3);
	res->phase = 1;
	touch_addr(mem.host[g0->r] + g0->off, false);
	res->good_ok = !memcmp((void *)(uintptr_t)(mem.host[g0->r] + g0->off),
			       fp->img->snap + g0->page * PAGE, g0->bytes);
	/* The pool brings in the rest of that LB: wait for it (a failure stops the pool). */
	for (uint64_t t0 = r_now_ms(); r_now_ms() - t0 < 5000; r_sleep_us(1000)) {
		long n = 0;
		uint64_t pages = 0;

		count_pages(&mem, fp->good, fp->ngood, &n, NULL, &pages);
		if ((uint64_t)n == pages)
			break;
	}
	res->phase = 2;
	if (fp->truncate && truncate(fp->path, (off_t)fp->cut)) {
		res->setup_err = -errno;
		_exit(3);
	}
	res->t.addr = mem.host[b0->r] + b0->off + 40;
	if (start_thread(sg_toucher, &res->t, NULL) || !wait_flag(&res->t.started, 5000))
		_exit(4);
	res->ret = halite_restore_wait(r, 20000);
	snprintf(res->msg, sizeof(res->msg), "%s", halite_restore_errmsg(r));
	halite_restore_stats(r, &res->st);
	res->phase = 3;
	r_sleep_us(500000);
	res->returned_at_check = atomic_load(&res->t.returned);
	res->tstate = r_thread_state(getpid(), atomic_load(&res->t.tid));
	count_pages(&mem, fp->bad, fp->nbad, &res->bad_present, &res->bad_resident, &res->bad_pages);
	count_pages(&mem, fp->good, fp->ngood, &res->good_present, NULL, &res->good_pages);
	(void)dummy;
	res->phase = 4;
	halite_restore_free(r);
	r_sleep_us(10000000);
	res->phase = 5; /* the blocked thread was not killed */
	_exit(0);
}

/* Fill the plan's good (LB @good_lb) and bad (LB @bad_lb) member lists. */
static void plan_lbs(struct fail_plan *fp, struct halite_reader *rd, uint64_t good_lb,
		     uint64_t bad_lb)
{
	const uint64_t *mbs;
	uint32_t n;

	fp->bad_lb = bad_lb;
	assert_int_equal(halite_reader_lb_members(rd, good_lb, &mbs, &n), 0);
	for (fp->ngood = 0; fp->ngood < n && fp->ngood < MAXMEMBERS; fp->ngood++)
		fp->good[fp->ngood] = image_mb_loc(rd, fp->img, mbs[fp->ngood]);
	assert_int_equal(halite_reader_lb_members(rd, bad_lb, &mbs, &n), 0);
	assert_true(n >= 2 && n <= MAXMEMBERS);
	for (fp->nbad = 0; fp->nbad < n; fp->nbad++)
		fp->bad[fp->nbad] = image_mb_loc(rd, fp->img, mbs[fp->nbad]);
}

/* An LB in the second half of the file holding two blocks or more. */
static uint64_t pick_bad_lb(struct halite_reader *rd)
{
	uint64_t nlb = halite_reader_info(rd)->lb_count;

	for (uint64_t lb = nlb / 2 + 1; lb < nlb; lb++) {
		struct halite_lb_info li;

		assert_int_equal(halite_reader_lb_info(rd, lb, &li), 0);
		if (li.mb_count >= 2 && li.mb_count <= MAXMEMBERS)
			return lb;
	}
	fail_msg("no locality block with two memory blocks or more");
	return 0;
}

static void run_fail_child(struct fail_plan *fp, const char *what)
{
	struct fail_res *res = r_shared_alloc(sizeof(*res));
	int st = 0;
	pid_t pid;
	uint64_t t0;
	unsigned retries = fp->retries ? fp->retries : 2;

	fprintf(stderr, "%s, %s memory, LB %" PRIu64 "\n", what,
		fp->kind == HALITE_MEM_SHARED ? "memfd" : "anonymous", fp->bad_lb);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid)
		fail_child(fp, res);
	for (t0 = r_now_ms(); waitpid(pid, &st, WNOHANG) != pid; r_sleep_us(10000))
		if (r_now_ms() - t0 > 45000) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("%s: the child hung in phase %d", what, res->phase);
		}
	if (res->setup_err)
		fail_msg("%s: the child's set-up failed: %s", what, halite_strerror(res->setup_err));
	fprintf(stderr, "  wait: %s; \"%s\"; %" PRIu64 " retries; thread state %c; %ld of %" PRIu64
		" pages of the LB present, %ld resident\n",
		halite_strerror(res->ret), res->msg, res->st.lb_retries, res->tstate,
		res->bad_present, res->bad_pages, res->bad_resident);
	assert_true(res->good_ok);
	assert_int_equal(res->phase, 4); /* it reached the free, and died there */
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
		fail_msg("%s: after halite_restore_free() the blocked thread's process %s %d, not "
			 "SIGSEGV", what, WIFSIGNALED(st) ? "died of signal" : "exited with",
			 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	if (fp->truncate) {
		if (res->ret != -HALITE_E_TRUNCATED && res->ret != -EIO)
			fail_msg("%s: wait returned %d (%s)", what, res->ret, halite_strerror(res->ret));
	} else {
		assert_int_equal(res->ret, -HALITE_E_LB_CHECKSUM);
	}
	assert_int_equal(res->st.error, res->ret);
	assert_false(res->st.done);
	if (!r_names_lb(res->msg, fp->bad_lb))
		fail_msg("%s: the message \"%s\" does not name locality block %" PRIu64, what,
			 res->msg, fp->bad_lb);
	assert_int_equal(res->st.lb_retries, retries);
	/* Never installed: not one page of the LB's blocks, not even in the page cache. */
	assert_int_equal(res->bad_present, 0);
	assert_int_equal(res->bad_resident, 0);
	assert_true(res->bad_pages > 0);
	assert_int_equal(res->good_present, (long)res->good_pages); /* the check sees pages */
	/* Blocked, not reading: it never returned, before or after the free. */
	assert_int_equal(res->returned_at_check, 0);
	assert_int_equal(atomic_load(&res->t.returned), 0);
	assert_true(res->tstate == 'S' || res->tstate == 'D');
	r_shared_free(res, sizeof(*res));
}

static void test_corrupt_lb(void **state)
{
	struct image img;
	struct halite_reader *rd;
	char *path = tmp_path("good.hlt"), *bad = tmp_path("corrupt.hlt");
	struct fail_plan fp = { .path = bad, .img = &img };
	struct halite_mb_loc loc;
	struct halite_lb_info li;

	make_image(&img, 2u << 20, 1u << 20, g_seed + 3);
	write_image(path, &img, HALITE_CODEC_ZSTD, 2, 32768, NULL);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	plan_lbs(&fp, rd, 0, pick_bad_lb(rd));
	assert_int_equal(halite_reader_lb_info(rd, fp.bad_lb, &li), 0);
	assert_int_equal(halite_reader_mb_lookup(rd, fp.bad[1].mb, &loc), 0);
	/* One byte of the second block's stored bytes; the block touched is the first. */
	for (int kind = HALITE_MEM_ANON; kind <= HALITE_MEM_SHARED; kind++) {
		assert_int_equal(r_copy_file(path, bad), 0);
		assert_int_equal(r_flip_byte(bad, li.offset + loc.offset + loc.length / 2, 0x10), 0);
		fp.kind = kind;
		fp.retries = kind == HALITE_MEM_ANON ? 0 : 3;
		run_fail_child(&fp, "corrupt locality block");
	}
	halite_reader_free(rd);
	unlink(path);
	unlink(bad);
	free(path);
	free(bad);
	free_image(&img);
}

static void test_truncated_mid_restore(void **state)
{
	struct image img;
	struct halite_reader *rd;
	char *path = tmp_path("good.hlt"), *cut = tmp_path("cut.hlt");
	struct fail_plan fp = { .path = cut, .img = &img, .truncate = true };
	struct halite_lb_info li;

	make_image(&img, 2u << 20, 1u << 20, g_seed + 4);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 32768, NULL);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	plan_lbs(&fp, rd, 0, pick_bad_lb(rd));
	assert_int_equal(halite_reader_lb_info(rd, fp.bad_lb, &li), 0);
	fp.cut = li.offset; /* this LB and everything after it */
	for (int kind = HALITE_MEM_ANON; kind <= HALITE_MEM_SHARED; kind++) {
		assert_int_equal(r_copy_file(path, cut), 0);
		fp.kind = kind;
		run_fail_child(&fp, "file truncated mid-restore");
	}
	halite_reader_free(rd);
	unlink(path);
	unlink(cut);
	free(path);
	free(cut);
	free_image(&img);
}

/* Kill a child owner (it never exits by itself with a thread blocked in a fault). */
static void sg_kill(struct sg *g)
{
	int st;

	kill(g->owner, SIGKILL);
	assert_int_equal(waitpid(g->owner, &st, 0), g->owner);
	assert_true(WIFSIGNALED(st));
	r_shared_free(g->count, g->npages * sizeof(uint32_t));
	r_shared_free(g, sizeof(*g));
}

/* Ask a child owner to touch one block's page from a new thread. */
static struct touch *sg_touch(struct sg *g, int slot, const struct mbloc *l)
{
	struct touch *t = &g->touch[slot];

	t->addr = (uintptr_t)sg_page(g, l->page) + 24;
	t->snap = g->img->snap;
	t->snap_page = l->page;
	atomic_store(&t->req, 1);
	assert_true(wait_flag(&t->started, 5000));
	return t;
}

static long sg_present(const struct sg *g, const struct mbloc *l, uint32_t n, uint64_t *pages)
{
	long p = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t len = (l[i].bytes + PAGE - 1) / PAGE * PAGE;

		p += r_pages_present(g->owner, (uintptr_t)sg_page(g, l[i].page), len, NULL);
		if (pages)
			*pages += len / PAGE;
	}
	return p;
}

/*
 * From outside: the owner's thread faulting on a corrupt LB stays blocked
 * while the restore fails, and after the engine is freed too (the owner
 * holds the userfaultfd), with nothing of the LB installed.
 */
/*
 * Another process's memory that already has a page is refused at start,
 * naming the first one (PAGEMAP_SCAN on its pagemap, or the pagemap read
 * page by page on a kernel without it): it would never fault, and would
 * keep what it holds instead of the snapshot.
 */
static void test_external_populated(void **state)
{
	struct image img;
	char *path = tmp_path("populated.hlt");
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct sg *g;
	uint8_t one = 0x5a;
	int uffd;

	(void)state;
	make_image(&img, 2u << 20, 1u << 20, g_seed + 6);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 32768, NULL);
	for (int populate = 0; populate < 2; populate++) {
		g = sg_create(&img, EXT_ANON, 0, 0, 1);
		sg_start_owner(g, &uffd);
		if (populate) {
			struct iovec local = { &one, 1 };
			struct iovec remote = { (void *)(uintptr_t)(g->host[0] + 7 * PAGE + 3), 1 };

			assert_int_equal(process_vm_writev(g->owner, &local, 1, &remote, 1, 0), 1);
		}
		for (uint32_t i = 0; i < img.nreg; i++)
			reg[i] = (struct halite_restore_region){ img.reg[i].name, g->host[i],
								 img.reg[i].length, HALITE_MEM_ANON,
								 -1, 0 };
		o.flags = HALITE_RESTORE_NO_PREFETCH;
		o.owner_pid = g->owner;
		o.owner_uffd = uffd;
		o.log = r_log_fn;
		o.log_ctx = &g_log;
		o.log_level = HALITE_LOG_WARN;
		g_log.quiet = true;
		assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), 0);
		if (!populate) {
			assert_int_equal(halite_restore_start(r), 0);
		} else {
			char want[64];

			assert_int_equal(halite_restore_start(r), -EEXIST);
			snprintf(want, sizeof(want), "at offset %u is already populated in process %d",
				 7 * PAGE, (int)g->owner);
			if (!strstr(halite_restore_errmsg(r), want))
				fail_msg("\"%s\" does not say \"%s\"", halite_restore_errmsg(r), want);
		}
		close(uffd);
		halite_restore_free(r);
		g_log.quiet = false;
		sg_kill(g);
	}
	free_image(&img);
	unlink(path);
	free(path);
}

static void test_corrupt_lb_external(void **state)
{
	struct image img;
	struct halite_reader *rd;
	char *path = tmp_path("good.hlt"), *bad = tmp_path("corrupt.hlt");
	struct fail_plan fp = { .path = bad, .img = &img };
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_mb_loc loc;
	struct halite_lb_info li;
	struct touch *t;
	struct sg *g;
	uint64_t pages = 0, gpages = 0;
	int uffd, ret;

	make_image(&img, 2u << 20, 1u << 20, g_seed + 5);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 32768, NULL);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	plan_lbs(&fp, rd, 0, pick_bad_lb(rd));
	assert_int_equal(halite_reader_lb_info(rd, fp.bad_lb, &li), 0);
	assert_int_equal(halite_reader_mb_lookup(rd, fp.bad[0].mb, &loc), 0);
	assert_int_equal(r_copy_file(path, bad), 0);
	assert_int_equal(r_flip_byte(bad, li.offset + loc.offset, 0x01), 0);

	g = sg_create(&img, EXT_ANON, 0, 0, 1);
	sg_start_owner(g, &uffd);
	for (uint32_t i = 0; i < img.nreg; i++)
		reg[i] = (struct halite_restore_region){ img.reg[i].name, g->host[i],
							 img.reg[i].length, HALITE_MEM_ANON, -1, 0 };
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	o.owner_pid = g->owner;
	o.owner_uffd = uffd;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	g_log.quiet = true;
	assert_int_equal(halite_restore_open(&r, bad, reg, img.nreg, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	close(uffd);
	t = sg_touch(g, 0, &fp.good[0]);
	assert_true(wait_flag(&t->returned, 5000));
	assert_true(t->snap_ok);
	/* The pool brings in the rest of that LB: wait for it (a failure stops the pool). */
	for (uint64_t t0 = r_now_ms(); r_now_ms() - t0 < 5000; r_sleep_us(1000)) {
		uint64_t n = 0;

		if (sg_present(g, fp.good, fp.ngood, &n) == (long)n)
			break;
	}
	t = sg_touch(g, 1, &fp.bad[1]);
	ret = halite_restore_wait(r, 20000);
	halite_restore_stats(r, &st);
	fprintf(stderr, "external, corrupt LB %" PRIu64 ": %s; \"%s\"\n", fp.bad_lb,
		halite_strerror(ret), halite_restore_errmsg(r));
	assert_int_equal(ret, -HALITE_E_LB_CHECKSUM);
	assert_true(r_names_lb(halite_restore_errmsg(r), fp.bad_lb));
	assert_int_equal(st.lb_retries, 2);
	r_sleep_us(500000);
	assert_int_equal(atomic_load(&t->returned), 0);
	assert_true(strchr("SD", r_thread_state(g->owner, atomic_load(&t->tid))) != NULL);
	assert_int_equal(sg_present(g, fp.bad, fp.nbad, &pages), 0);
	{
		long good = sg_present(g, fp.good, fp.ngood, &gpages);

		assert_int_equal(good, (long)gpages);
	}
	halite_restore_free(r);
	r_sleep_us(300000);
	assert_int_equal(atomic_load(&t->returned), 0);
	assert_int_equal(sg_present(g, fp.bad, fp.nbad, NULL), 0);
	g_log.quiet = false;
	sg_kill(g);
	halite_reader_free(rd);
	unlink(path);
	unlink(bad);
	free(path);
	free(bad);
	free_image(&img);
}

/*
 * The restoring process dies (SIGKILL) mid-restore: the owner's thread that
 * then faults on memory not restored stays blocked, never reading zeros.
 */
static void test_restorer_killed(void **state)
{
	struct image img;
	struct halite_reader *rd;
	char *path = tmp_path("killed.hlt");
	struct fail_plan fp = { .path = path, .img = &img };
	struct { _Atomic int started; int ret; } *res = r_shared_alloc(sizeof(*res));
	struct touch *t;
	struct sg *g;
	pid_t rp;
	int uffd, st;

	make_image(&img, 2u << 20, 1u << 20, g_seed + 6);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 32768, NULL);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	plan_lbs(&fp, rd, 0, pick_bad_lb(rd));

	for (int kind = HALITE_MEM_ANON; kind <= HALITE_MEM_SHARED; kind++) {
		fprintf(stderr, "restorer killed, %s memory\n",
			kind == HALITE_MEM_SHARED ? "memfd" : "anonymous");
		memset(res, 0, sizeof(*res));
		g = sg_create(&img, kind == HALITE_MEM_ANON ? EXT_ANON : EXT_SHARED, 0, 0, 1);
		sg_start_owner(g, &uffd);
		rp = fork();
		assert_true(rp >= 0);
		if (!rp) {
			struct halite_restore_region reg[MAXREG];
			HALITE_OPTS(halite_restore_opts, o);
			struct halite_restore *r;

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			for (uint32_t i = 0; i < img.nreg; i++)
				reg[i] = sg_region(g, i);
			o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
			o.owner_pid = g->owner;
			o.owner_uffd = uffd;
			res->ret = halite_restore_open(&r, path, reg, img.nreg, &o);
			regions_close(reg, img.nreg);
			if (!res->ret)
				res->ret = halite_restore_start(r);
			atomic_store(&res->started, 1);
			for (;;)
				pause();
		}
		close(uffd); /* now only the owner and the restorer hold it */
		assert_true(wait_flag(&res->started, 10000));
		assert_int_equal(res->ret, 0);
		/* The restorer serves faults. */
		t = sg_touch(g, 0, &fp.good[0]);
		assert_true(wait_flag(&t->returned, 5000));
		assert_true(t->snap_ok);
		kill(rp, SIGKILL);
		assert_int_equal(waitpid(rp, &st, 0), rp);
		assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		/* Never restored, then touched: blocked, not zeros. */
		assert_int_equal(sg_present(g, fp.bad, fp.nbad, NULL), 0);
		t = sg_touch(g, 1, &fp.bad[0]);
		r_sleep_us(500000);
		assert_int_equal(atomic_load(&t->returned), 0);
		assert_true(strchr("SD", r_thread_state(g->owner, atomic_load(&t->tid))) != NULL);
		assert_int_equal(sg_present(g, fp.bad, fp.nbad, NULL), 0);
		sg_kill(g);
	}
	r_shared_free(res, sizeof(*res));
	halite_reader_free(rd);
	unlink(path);
	free(path);
	free_image(&img);
}

/* ---------------------------------------------------------------------- */
/* Clones: many restores of one file at once                               */

static void test_clones(void **state)
{
	static const enum mode modes[] = { EXT_ANON, ANON, SHARED };
	enum { N = 3 };
	struct image img;
	struct sg *g[N];
	struct halite_restore *r[N];
	struct halite_reader *file;
	char *path = tmp_path("clones.hlt");
	int uffd[N];

	make_image(&img, 3u << 20, (1u << 20) + PAGE, g_seed + 8);
	write_image(path, &img, HALITE_CODEC_ZSTD, 0, 0, NULL);
	assert_int_equal(halite_reader_open(&file, path, NULL), 0);
	/* The child owner first: fork while this process has no threads (TSan). */
	for (int i = 0; i < N; i++) {
		g[i] = sg_create(&img, modes[i], 2, 2, t_rand(&g_seed));
		sg_start_owner(g[i], &uffd[i]);
	}
	for (int i = 0; i < N; i++) {
		struct halite_restore_region reg[MAXREG];
		HALITE_OPTS(halite_restore_opts, o);

		for (uint32_t k = 0; k < img.nreg; k++)
			reg[k] = sg_region(g[i], k);
		vary_opts(&o, (unsigned)i);
		o.vcpu_tids = g[i]->tids;
		o.nvcpus = g[i]->nv;
		o.log = r_log_fn;
		o.log_ctx = &g_log;
		o.log_level = HALITE_LOG_WARN;
		if (uffd[i] >= 0) {
			o.owner_pid = g[i]->owner;
			o.owner_uffd = uffd[i];
		}
		assert_int_equal(halite_restore_open(&r[i], path, reg, img.nreg, &o), 0);
		regions_close(reg, img.nreg);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(halite_restore_start(r[i]), 0);
		if (uffd[i] >= 0)
			close(uffd[i]);
		atomic_store(&g[i]->go, 1);
	}
	for (int i = 0; i < N; i++) {
		char what[64];
		uint64_t t0 = r_now_ms();

		while (atomic_load(&g[i]->vdone) < g[i]->nv && r_now_ms() - t0 < WAIT_MS)
			r_sleep_us(1000);
		assert_int_equal(atomic_load(&g[i]->vdone), g[i]->nv);
		assert_int_equal(halite_restore_wait(r[i], WAIT_MS), 0);
		snprintf(what, sizeof(what), "clone %d (%s)", i, mode_name[modes[i]]);
		check_done_stats(r[i], file, what);
	}
	for (int i = 0; i < N; i++) {
		sg_check(g[i], file);
		halite_restore_free(r[i]);
		sg_destroy(g[i]);
	}
	halite_reader_free(file);
	unlink(path);
	free(path);
	free_image(&img);
}

/* ---------------------------------------------------------------------- */
/* Bad arguments                                                            */

/*
 * open must fail with @want and leave *r alone; with @msg, say why in the
 * log, naming @names if set.
 */
/*
 * The image's second region as a copy, beside the first as guest memory of
 * @kind; @flags: the engine's. Returns start's result; on success the
 * restore is checked exact and done.
 */
static int restore_copy(const char *path, const struct image *img, int kind, unsigned flags,
			bool dirty, char *errmsg, size_t errlen)
{
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_stats st;
	struct halite_restore *r;
	struct halite_reader *file;
	uint64_t len1 = img->reg[1].length, stored = 0;
	struct mem m;
	uint8_t *copy;
	int ret;

	assert_int_equal(halite_reader_open(&file, path, NULL), 0);
	for (uint64_t mb = halite_reader_region(file, 1)->first_mb;
	     mb < halite_reader_info(file)->mb_count; mb++) {
		struct halite_mb_loc loc;

		/* A damaged 1.1 index chunk fails here as in the restore (the caller's case). */
		if (halite_reader_mb_lookup(file, mb, &loc))
			break;
		stored += loc.state == HALITE_MB_STORED;
	}
	mem_map(&m, img, kind);
	/* The whole image mapped, the second region unused: the copy is ours. */
	copy = mmap(NULL, len1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(copy != MAP_FAILED);
	assert_int_equal(madvise(copy, len1, MADV_NOHUGEPAGE), 0);
	if (dirty)
		copy[len1 / 2] = 1;
	mem_regions(&m, img, reg);
	reg[1] = (struct halite_restore_region){ img->reg[1].name, (uintptr_t)copy, len1,
						 HALITE_MEM_COPY, -1, 0 };
	o.flags = flags;
	o.read_retries = 1;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, reg, 2, &o), 0);
	ret = halite_restore_start(r);
	snprintf(errmsg, errlen, "%s", halite_restore_errmsg(r));
	if (ret)
		goto out;
	/* In before anything faulted, with no prefetcher. */
	if (memcmp(copy, img->snap + img->off[1], len1))
		fail_msg("the copy is not the snapshot once start returned");
	halite_restore_stats(r, &st);
	assert_int_equal(st.faults, 0);
	assert_true(st.mb_prefetch >= stored);
	/* The guest memory by faults (this thread's reads), then done. */
	if (memcmp((void *)(uintptr_t)m.host[0], img->snap, img->reg[0].length))
		fail_msg("guest memory beside the copy is not the snapshot");
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	halite_restore_stats(r, &st);
	assert_true(st.done);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_int_equal(st.lb_demand + st.lb_prefetch, st.lb_total);
	assert_int_equal(st.bytes_read, st.lb_total * halite_reader_info(file)->lb_size);
	assert_memory_equal(copy, img->snap + img->off[1], len1);
	fprintf(stderr, "  copy beside %s memory%s: %" PRIu64 " faults, LBs %" PRIu64 " demand + %"
		PRIu64 " prefetch, MBs %" PRIu64 " prefetch (%" PRIu64 " stored in the copy)\n",
		kind == HALITE_MEM_ANON ? "anonymous" : "memfd",
		flags & HALITE_RESTORE_TRACK_ACCESS ? ", tracked" : "", st.faults, st.lb_demand,
		st.lb_prefetch, st.mb_prefetch, stored);
out:
	halite_restore_free(r);
	munmap(copy, len1);
	mem_unmap(&m);
	halite_reader_free(file);
	return ret;
}

static void test_copy_region(void **state)
{
	struct image img;
	struct halite_reader *rd;
	struct halite_mb_loc loc;
	struct halite_lb_info li;
	char *path = tmp_path("copy.hlt"), *bad = tmp_path("copy-bad.hlt"), msg[256], want[64];
	uint64_t last;

	/* Physical order: the LB where the first region ends holds the copy's first blocks. */
	make_image(&img, 1u << 20, (256u << 10) + PAGE, g_seed + 11);
	write_image(path, &img, HALITE_CODEC_LZ4, 2, 16384, NULL);
	for (int kind = HALITE_MEM_ANON; kind <= HALITE_MEM_SHARED; kind++) {
		assert_int_equal(restore_copy(path, &img, kind, HALITE_RESTORE_NO_PREFETCH, false,
					      msg, sizeof(msg)), 0);
		assert_int_equal(restore_copy(path, &img, kind, HALITE_RESTORE_NO_PREFETCH |
					      HALITE_RESTORE_TRACK_ACCESS, false, msg, sizeof(msg)), 0);
	}
	assert_int_equal(restore_copy(path, &img, HALITE_MEM_ANON, 0, true, msg, sizeof(msg)),
			 -EEXIST);
	assert_non_null(strstr(msg, "already populated"));
	/* The copy's last stored block, one byte of it flipped: start fails, naming its LB. */
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	last = halite_reader_info(rd)->mb_count;
	do
		assert_int_equal(halite_reader_mb_lookup(rd, --last, &loc), 0);
	while (loc.state != HALITE_MB_STORED);
	assert_true(last >= halite_reader_region(rd, 1)->first_mb);
	assert_int_equal(halite_reader_lb_info(rd, loc.lb, &li), 0);
	assert_int_equal(r_copy_file(path, bad), 0);
	assert_int_equal(r_flip_byte(bad, li.offset + loc.offset + loc.length / 2, 0x10), 0);
	assert_int_equal(restore_copy(bad, &img, HALITE_MEM_ANON, HALITE_RESTORE_NO_PREFETCH,
				      false, msg, sizeof(msg)), -HALITE_E_LB_CHECKSUM);
	snprintf(want, sizeof(want), "locality block %" PRIu64 " at offset", loc.lb);
	if (!strstr(msg, want) || !strstr(msg, "checksum mismatch after 2 reads"))
		fail_msg("corrupt copy LB: '%s'", msg);
	/*
	 * Format 1.1: the MB map chunk of that block damaged. Open verifies only
	 * the index, so it succeeds; start's first use of the chunk fails, naming it.
	 */
	for (uint32_t i = 0; i < halite_reader_section_count(rd); i++) {
		uint32_t type;
		uint64_t off, len;

		assert_int_equal(halite_reader_section(rd, i, &type, &off, &len), 0);
		if (type != HALITE_SECTION_MB_MAP)
			continue;
		assert_int_equal(r_copy_file(path, bad), 0);
		assert_int_equal(r_flip_byte(bad, off + 8 * last + 1, 0x01), 0);
	}
	assert_int_equal(halite_reader_info(rd)->version_minor, 1);
	assert_int_equal(restore_copy(bad, &img, HALITE_MEM_ANON, HALITE_RESTORE_NO_PREFETCH,
				      false, msg, sizeof(msg)), -HALITE_E_CHECKSUM);
	if (!strstr(msg, "mb-map chunk 0 ") || !strstr(msg, "checksum mismatch"))
		fail_msg("damaged MB map chunk: '%s'", msg);
	halite_reader_free(rd);
	unlink(bad);
	unlink(path);
	free(bad);
	free(path);
	free_image(&img);
}

static void expect_open_fails(const char *path, const struct halite_restore_region *reg,
			      uint32_t n, const struct halite_restore_opts *o, int want, bool msg,
			      const char *names, const char *what)
{
	struct halite_restore *r = (struct halite_restore *)(uintptr_t)0x1;
	HALITE_OPTS(halite_restore_opts, oo);
	int ret;

	if (o)
		oo = *o;
	oo.log = r_log_fn;
	oo.log_ctx = &g_log;
	oo.log_level = HALITE_LOG_WARN;
	r_log_reset(&g_log);
	ret = halite_restore_open(&r, path, reg, n, &oo);
	fprintf(stderr, "  %s: %s; \"%.*s\"\n", what, halite_strerror(ret),
		(int)(g_log.len ? g_log.len - 1 : 0), g_log.buf);
	if (ret != want)
		fail_msg("%s: open returned %d (%s), expected %d (%s)", what, ret,
			 halite_strerror(ret), want, halite_strerror(want));
	assert_ptr_equal(r, (void *)(uintptr_t)0x1);
	if (msg && !g_log.len)
		fail_msg("%s: refused without a message", what);
	if (names && !r_log_has(&g_log, names))
		fail_msg("%s: the message \"%s\" does not name \"%s\"", what, g_log.buf, names);
}

/*
 * open or start must refuse (< 0; exactly @want if non-zero), say why naming
 * @names, and leave the memory unregistered.
 */
static void expect_refused(const char *path, const struct halite_restore_region *reg, uint32_t n,
			   int want, const char *names, const char *what)
{
	struct halite_restore *r = NULL;
	HALITE_OPTS(halite_restore_opts, oo);
	int ret;

	oo.log = r_log_fn;
	oo.log_ctx = &g_log;
	oo.log_level = HALITE_LOG_WARN;
	r_log_reset(&g_log);
	ret = halite_restore_open(&r, path, reg, n, &oo);
	if (!ret) {
		ret = halite_restore_start(r);
		if (!ret) {
			/* Not refused: do not leave the range registered to a dead handler. */
			halite_restore_free(r);
			fail_msg("%s: accepted", what);
		}
	}
	fprintf(stderr, "  %s: %s; \"%.*s\"\n", what, halite_strerror(ret),
		(int)(g_log.len ? g_log.len - 1 : 0), g_log.buf);
	if (want && ret != want)
		fail_msg("%s: returned %d (%s), expected %d (%s)", what, ret, halite_strerror(ret),
			 want, halite_strerror(want));
	assert_true(ret < 0);
	if (!r_log_has(&g_log, names))
		fail_msg("%s: the message \"%s\" does not name \"%s\"", what, g_log.buf, names);
	halite_restore_free(r);
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(r_uffd_registered(getpid(), reg[i].host, reg[i].length), 0);
}

static void test_bad_arguments(void **state)
{
	struct image img;
	struct mem mem;
	struct halite_restore_region reg[3];
	HALITE_OPTS(halite_restore_opts, o);
	char *path = tmp_path("args.hlt"), *bad = tmp_path("args-bad.hlt");
	struct halite_reader *rd;
	uint64_t size;

	g_log.quiet = true;
	make_image(&img, 1u << 20, 256u << 10, g_seed + 9);
	write_image(path, &img, HALITE_CODEC_LZ4, 0, 0, NULL);
	mem_map(&mem, &img, HALITE_MEM_ANON);
	mem_regions(&mem, &img, reg);

	/*
	 * Regions that do not match the file's: -EINVAL, but an unknown name
	 * is -HALITE_E_NOT_FOUND ("no such region", errors.h), with a message
	 * naming the region. Calls that are wrong in themselves (no regions,
	 * unknown flags) need no message.
	 */
	fprintf(stderr, "bad arguments:\n");
	reg[1].name = "pc.rom";
	expect_open_fails(path, reg, 2, NULL, -HALITE_E_NOT_FOUND, true, "pc.rom",
			  "unknown region name");
	mem_regions(&mem, &img, reg);
	reg[1].length -= PAGE;
	expect_open_fails(path, reg, 2, NULL, -EINVAL, true, "pc.ram.hi", "region length");
	mem_regions(&mem, &img, reg);
	reg[0].length += 2 * PAGE;
	expect_open_fails(path, reg, 2, NULL, -EINVAL, true, "pc.ram",
			  "region longer than the file's");
	mem_regions(&mem, &img, reg);
	expect_open_fails(path, reg, 1, NULL, -EINVAL, true, NULL, "a file region not given");
	reg[0] = reg[1];
	expect_open_fails(path, reg, 2, NULL, -EINVAL, true, "pc.ram.hi", "a region given twice");
	mem_regions(&mem, &img, reg);
	expect_open_fails(path, reg, 0, NULL, -EINVAL, false, NULL, "no regions");
	reg[0].kind = 7;
	expect_open_fails(path, reg, 2, NULL, -EINVAL, true, "pc.ram", "unknown memory kind");
	mem_regions(&mem, &img, reg);
	reg[1].host += 8;
	expect_open_fails(path, reg, 2, NULL, -EINVAL, true, "pc.ram.hi",
			  "host address not page aligned");
	mem_regions(&mem, &img, reg);
	o.flags = HALITE_RESTORE_FLAGS_ALL + 1;
	expect_open_fails(path, reg, 2, &o, -EINVAL, false, NULL, "unknown flag");
	o.flags = 0;
	o.io_backend = 99;
	expect_open_fails(path, reg, 2, &o, -EINVAL, false, NULL, "unknown I/O backend");
	o.io_backend = 0;
	o.nvcpus = 2; /* and no vcpu_tids */
	expect_open_fails(path, reg, 2, &o, -EINVAL, false, NULL, "nvcpus without vcpu_tids");
	o.nvcpus = 0;

	/* Damaged or foreign files: the reader's own code. */
	{
		static const char *const what[] = { "missing file", "incomplete (no footer)",
						    "a section's checksum", "not a Halite file" };

		size = r_file_size(path);
		static const int codes[] = { -ENOENT, -HALITE_E_INCOMPLETE, -HALITE_E_CHECKSUM,
					     -HALITE_E_BAD_MAGIC };

		for (int k = 0; k < 4; k++) {
			int want;

			unlink(bad);
			if (k == 1) {
				assert_int_equal(r_copy_file(path, bad), 0);
				assert_int_equal(truncate(bad, (off_t)(size - 64)), 0);
			} else if (k == 2) {
				uint32_t type;
				uint64_t off, len;

				assert_int_equal(r_copy_file(path, bad), 0);
				assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
				for (uint32_t i = 0; i < halite_reader_section_count(rd); i++) {
					assert_int_equal(halite_reader_section(rd, i, &type, &off, &len), 0);
					/* 1.1: open verifies the index; the map's chunks on use (test_copy_region) */
					if (type == HALITE_SECTION_INDEX)
						assert_int_equal(r_flip_byte(bad, off + len / 2, 0x40), 0);
				}
				halite_reader_free(rd);
			} else if (k == 3) {
				assert_int_equal(r_copy_file(path, bad), 0);
				assert_int_equal(r_flip_byte(bad, 0, 0xff), 0);
			}
			want = halite_reader_open(&rd, bad, NULL);
			assert_true(want < 0);
			assert_int_equal(want, codes[k]);
			expect_open_fails(bad, reg, 2, NULL, want, true, NULL, what[k]);
		}
	}

	/* Memory that is not empty: refused, and left as it was. */
	((volatile uint8_t *)(uintptr_t)mem.host[1])[5 * PAGE + 3] = 0x5a;
	expect_refused(path, reg, 2, 0, "pc.ram.hi", "anonymous, one page written");
	assert_int_equal(((volatile uint8_t *)(uintptr_t)mem.host[1])[5 * PAGE + 3], 0x5a);
	mem_unmap(&mem);
	mem_map(&mem, &img, HALITE_MEM_ANON);
	mem_regions(&mem, &img, reg);
	(void)((volatile uint8_t *)(uintptr_t)mem.host[0])[100 * PAGE];
	expect_refused(path, reg, 2, 0, "pc.ram", "anonymous, one page read (the zero page)");
	mem_unmap(&mem);
	mem_map(&mem, &img, HALITE_MEM_SHARED);
	mem_regions(&mem, &img, reg);
	((volatile uint8_t *)(uintptr_t)mem.host[0])[7 * PAGE] = 0xa5;
	expect_refused(path, reg, 2, 0, "pc.ram", "memfd, one page written");
	assert_int_equal(((volatile uint8_t *)(uintptr_t)mem.host[0])[7 * PAGE], 0xa5);
	mem_unmap(&mem);

	halite_restore_free(NULL);
	g_log.quiet = false;
	unlink(path);
	unlink(bad);
	free(path);
	free(bad);
	free_image(&img);
}

/* ---------------------------------------------------------------------- */
/* Learning (HALITE_RESTORE_LEARN, docs/restore-trace.md version 2)          */

/* A planned touch: block, page in it, who (0, 1: the vCPUs; 2: another thread). */
struct ltouch {
	uint64_t mb;
	uint32_t page;
	int who;
};

/* A touch line, or what one must be. */
struct lline {
	uint64_t t_ns, mb;
	int vcpu; /* -1: '-' */
	char kind[16];
};

static const char *lkind(const struct model *m, uint64_t mb)
{
	return m->state[mb] == HALITE_MB_STORED ? "stored" :
	       m->state[mb] == HALITE_MB_ZERO ? "zero" : "untouched";
}

/*
 * The plan: blocks of one LB from different threads (the LB's other blocks
 * staged: each still a fault), zero and never-touched blocks, touches that
 * must not count (a block's other page, a block again from another thread),
 * then @nrand random blocks, then, if @cover, one block of every LB not read
 * yet (the restore is then done). Returns the number of touches.
 */
static size_t learn_plan(struct model *m, struct ltouch *p, size_t cap, size_t nrand, bool cover,
			 uint64_t *seed)
{
	uint64_t lb3 = UINT64_MAX, z = UINT64_MAX, u = UINT64_MAX;
	const uint64_t *mbs = NULL;
	uint8_t *read = calloc(m->nlb, 1);
	uint32_t n = 0;
	size_t k = 0;

	assert_non_null(read);
	for (uint64_t lb = 0; lb < m->nlb && lb3 == UINT64_MAX; lb++) {
		assert_int_equal(halite_reader_lb_members(m->rd, lb, &mbs, &n), 0);
		if (n >= 3 && model_mb_pages(m, mbs[0]) > 1)
			lb3 = lb;
	}
	for (uint64_t mb = 0; mb < m->nmb; mb++) {
		if (m->state[mb] == HALITE_MB_ZERO && z == UINT64_MAX)
			z = mb;
		if (m->state[mb] == HALITE_MB_UNTOUCHED && u == UINT64_MAX)
			u = mb;
	}
	assert_true(lb3 != UINT64_MAX && z != UINT64_MAX && u != UINT64_MAX);
	assert_int_equal(halite_reader_lb_members(m->rd, lb3, &mbs, &n), 0);
#define ADD(mb_, page_, who_)                                                              \
	do {                                                                               \
		assert_true(k < cap);                                                      \
		p[k++] = (struct ltouch){ (mb_), (page_), (who_) };                        \
		if (m->state[mb_] == HALITE_MB_STORED)                                     \
			read[m->lb[mb_]] = 1;                                              \
	} while (0)
	ADD(mbs[0], 0, 0);
	ADD(z, 0, 2);
	ADD(mbs[n - 1], model_mb_pages(m, mbs[n - 1]) - 1, 1); /* staged: a fault all the same */
	ADD(mbs[0], 1, 1);					/* its other page: in already */
	ADD(u, 0, 0);
	ADD(mbs[1], 0, 2);
	ADD(mbs[n - 1], 0, 0);					/* again, another vCPU: nothing */
	ADD(z, 0, 1);
	for (size_t i = 0; i < nrand; i++) {
		uint64_t mb = t_rand(seed) % m->nmb;

		ADD(mb, (uint32_t)(t_rand(seed) % model_mb_pages(m, mb)), (int)(t_rand(seed) % 3));
	}
	for (uint64_t lb = 0; cover && lb < m->nlb; lb++) {
		if (read[lb])
			continue;
		assert_int_equal(halite_reader_lb_members(m->rd, lb, &mbs, &n), 0);
		ADD(mbs[t_rand(seed) % n], 0, (int)(t_rand(seed) % 3));
	}
#undef ADD
	free(read);
	return k;
}

/* What the touch lines must be: each block's first touch, in plan order. */
static size_t learn_expect(struct model *m, const struct ltouch *p, size_t n, struct lline *e)
{
	uint8_t *seen = calloc(m->nmb, 1);
	size_t k = 0;

	assert_non_null(seen);
	for (size_t i = 0; i < n; i++) {
		if (seen[p[i].mb])
			continue;
		seen[p[i].mb] = 1;
		e[k] = (struct lline){ 0, p[i].mb, p[i].who == 2 ? -1 : p[i].who, "" };
		snprintf(e[k].kind, sizeof(e[k].kind), "%s", lkind(m, p[i].mb));
		k++;
	}
	free(seen);
	return k;
}

/*
 * The trace: version 2, version 1's lines (the stats, then the lb lines,
 * whose how and t_ns go into @lb_how / @lb_t, indexed by LB), then the learn
 * line, then the touch lines into @t. Returns how many touch lines.
 */
static size_t learn_read(const char *path, struct model *m, unsigned *window, int *complete,
			 char *lb_how, uint64_t *lb_t, struct lline *t, size_t cap)
{
	FILE *f = fopen(path, "r");
	char line[256];
	size_t nt = 0, ln = 0, nstat = 0;
	bool learn = false;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		unsigned long long a, b, c;
		char w[16], x[16];
		int vc;

		assert_true(len > 0 && line[len - 1] == '\n');
		line[len - 1] = 0;
		if (ln++ == 0) {
			assert_string_equal(line, "halite-restore-trace 2");
			continue;
		}
		if (!strncmp(line, "file-uuid ", 10) || !strncmp(line, "stat ", 5)) {
			assert_false(learn);
			nstat += line[0] == 's';
			continue;
		}
		if (!strncmp(line, "lb ", 3)) {
			assert_false(learn);
			assert_int_equal(sscanf(line, "lb %llu %15s %llu", &a, w, &b), 3);
			assert_true(a < m->nlb);
			lb_how[a] = w[0];
			lb_t[a] = b;
			continue;
		}
		if (!strncmp(line, "learn ", 6)) {
			assert_false(learn);
			assert_int_equal(sscanf(line, "learn %u %d", window, complete), 2);
			learn = true;
			continue;
		}
		assert_true(learn);
		assert_true(nt < cap);
		if (sscanf(line, "touch %llu %d %llu %15s", &a, &vc, &c, x) == 4) {
			t[nt] = (struct lline){ a, c, vc, "" };
		} else {
			assert_int_equal(sscanf(line, "touch %llu - %llu %15s", &a, &c, x), 3);
			t[nt] = (struct lline){ a, c, -1, "" };
		}
		snprintf(t[nt].kind, sizeof(t[nt].kind), "%s", x);
		/* Exactly that text: no stray spaces or leading zeros. */
		{
			char again[256];
			char v[16] = "-";

			if (t[nt].vcpu >= 0)
				snprintf(v, sizeof(v), "%d", t[nt].vcpu);
			snprintf(again, sizeof(again), "touch %llu %s %llu %s", a, v, c, x);
			assert_string_equal(line, again);
		}
		nt++;
	}
	fclose(f);
	assert_true(learn);
	assert_int_equal(nstat, 24);
	return nt;
}

static void learn_compare(const struct lline *got, size_t ngot, const struct lline *want,
			  size_t nwant, struct halite_reader *rd)
{
	char d[96];

	for (size_t i = 0; i < ngot && i < nwant; i++)
		if (got[i].mb != want[i].mb || got[i].vcpu != want[i].vcpu ||
		    strcmp(got[i].kind, want[i].kind) || (i && got[i].t_ns < got[i - 1].t_ns))
			fail_msg("touch line %zu: MB %" PRIu64 " vCPU %d %s at %" PRIu64 " ns, "
				 "expected %s from vCPU %d (%s)", i, got[i].mb, got[i].vcpu,
				 got[i].kind, got[i].t_ns, mb_desc(rd, want[i].mb, d, sizeof(d)),
				 want[i].vcpu, want[i].kind);
	if (ngot != nwant)
		fail_msg("%zu touch lines, expected %zu", ngot, nwant);
}

/*
 * What run_learn and run_learn_track share: a file of a 2 MiB image, its
 * model (@track: TRACK_ACCESS's), a learn_plan() of @nrand random touches
 * (@cover: then every LB) and the first touches it should record, two
 * vCPU touchers and another, and the options of a learning restore of it.
 */
struct learn_bed {
	struct image img;
	struct mem mem;
	struct model m;
	struct halite_restore_region reg[MAXREG];
	struct halite_reader *rd;
	struct toucher *tt[3];
	pid_t vt[2];
	struct ltouch *plan;
	struct lline *want, *got;
	char *how;
	uint64_t *lbt;
	size_t n, nwant;
	char *path, *trace;
};

static void learn_bed_init(struct learn_bed *b, const char *name, int kind, bool track,
			   size_t nrand, bool cover, uint64_t *seed)
{
	char f[64];

	snprintf(f, sizeof(f), "%s.hlt", name);
	b->path = tmp_path(f);
	snprintf(f, sizeof(f), "%s.trace", name);
	b->trace = tmp_path(f);
	make_image(&b->img, 2u << 20, (512u << 10) + PAGE, *seed);
	write_image(b->path, &b->img, HALITE_CODEC_LZ4, 2, 16384, NULL);
	assert_int_equal(halite_reader_open(&b->rd, b->path, NULL), 0);
	mem_map(&b->mem, &b->img, kind);
	mem_regions(&b->mem, &b->img, b->reg);
	model_init(&b->m, b->rd, &b->mem, track);
	b->plan = calloc(4 * b->m.nmb, sizeof(*b->plan));
	b->want = calloc(4 * b->m.nmb, sizeof(*b->want));
	b->got = calloc(4 * b->m.nmb, sizeof(*b->got));
	b->how = calloc(b->m.nlb, 1);
	b->lbt = calloc(b->m.nlb, sizeof(*b->lbt));
	assert_true(b->plan && b->want && b->got && b->how && b->lbt);
	b->n = learn_plan(&b->m, b->plan, 4 * b->m.nmb, nrand, cover, seed);
	b->nwant = learn_expect(&b->m, b->plan, b->n, b->want);
	for (int i = 0; i < 3; i++)
		b->tt[i] = toucher_start();
	b->vt[0] = atomic_load(&b->tt[0]->tid);
	b->vt[1] = atomic_load(&b->tt[1]->tid);
}

/* Options for a learning restore of @b (@flags with LEARN), logging at @log_level. */
static void learn_bed_opts(struct learn_bed *b, struct halite_restore_opts *o, unsigned flags,
			   unsigned window_ms, int log_level)
{
	o->flags = HALITE_RESTORE_LEARN | flags;
	o->learn_window_ms = window_ms;
	o->vcpu_tids = b->vt;
	o->nvcpus = 2;
	o->trace_path = b->trace;
	o->log = r_log_fn;
	o->log_ctx = &g_log;
	o->log_level = log_level;
}

/* The plan's touch in @i, by its thread: a random word of the planned page. */
static void learn_bed_touch(struct learn_bed *b, size_t i, uint64_t *seed)
{
	uint64_t addr = model_mb_addr(&b->m, b->plan[i].mb, NULL) +
			(uint64_t)b->plan[i].page * PAGE + (t_rand(seed) % (PAGE / 8)) * 8;

	toucher_do(b->tt[b->plan[i].who], addr, t_rand(seed) % 3 == 0);
}

/*
 * The trace's @ngot touch lines against the plan's: all of them when
 * @all_in_window (every touch came before the window's end), else the
 * prefix a slow machine got in; all inside the window either way.
 */
static void learn_bed_compare(struct learn_bed *b, size_t ngot, unsigned window_ms,
			      bool all_in_window)
{
	if (all_in_window)
		learn_compare(b->got, ngot, b->want, b->nwant, b->rd);
	else
		learn_compare(b->got, ngot, b->want, ngot <= b->nwant ? ngot : b->nwant, b->rd);
	for (size_t i = 0; i < ngot; i++)
		assert_true(b->got[i].t_ns < (uint64_t)window_ms * 1000000);
}

static void learn_bed_free(struct learn_bed *b, struct halite_restore *r)
{
	for (int i = 0; i < 3; i++)
		toucher_stop(b->tt[i]);
	halite_restore_free(r);
	model_free(&b->m);
	halite_reader_free(b->rd);
	mem_unmap(&b->mem);
	unlink(b->trace);
	unlink(b->path);
	free(b->plan);
	free(b->want);
	free(b->got);
	free(b->how);
	free(b->lbt);
	free(b->path);
	free(b->trace);
	free_image(&b->img);
}

/*
 * A learning restore (LEARN, prefetch and readahead on: the engine must
 * hold them) under two vCPU threads and another thread touching a planned
 * sequence of blocks one at a time. @window_ms 0: learning until done, the
 * plan reading every LB (complete 1, every LB read on demand); else the
 * window ends mid-way (complete 0), the prefetcher resumes and brings in the
 * rest, and nothing was prefetched before the window's end. Either way the
 * touch lines are the plan's first touches exactly and memory is the
 * snapshot.
 */
static void run_learn(int kind, unsigned window_ms)
{
	struct learn_bed b;
	struct model *m = &b.m;
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	uint64_t seed = t_rand(&g_seed), t0, elapsed, stored = 0, nvcpu = 0;
	size_t ngot;
	unsigned w = 99;
	int complete = -1;

	fprintf(stderr, "learn: %s memory, window %u ms\n",
		kind == HALITE_MEM_SHARED ? "memfd" : "anonymous", window_ms);
	learn_bed_init(&b, "learn", kind, false, window_ms ? 24 : 60, !window_ms, &seed);
	for (size_t i = 0; i < b.nwant; i++) {
		stored += !strcmp(b.want[i].kind, "stored");
		nvcpu += b.want[i].vcpu >= 0;
	}

	learn_bed_opts(&b, &o, 0, window_ms, HALITE_LOG_WARN);
	assert_int_equal(halite_restore_open(&r, b.path, b.reg, b.img.nreg, &o), 0);
	t0 = r_now_ms();
	assert_int_equal(halite_restore_start(r), 0);
	for (size_t i = 0; i < b.n; i++)
		learn_bed_touch(&b, i, &seed);
	elapsed = r_now_ms() - t0;
	if (!window_ms) {
		/* Nothing came in unasked: the plan's last touch read the last LB. */
		assert_int_equal(halite_restore_wait(r, 10000), 0);
	} else {
		/* The prefetcher, back after the window, brings in the rest. */
		assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	}
	halite_restore_stats(r, &st);
	assert_true(st.done);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	assert_int_equal(st.lb_demand + st.lb_prefetch, m->nlb);
	for (uint32_t i = 0; i < b.img.nreg; i++)
		assert_memory_equal((void *)(uintptr_t)b.mem.host[i], b.img.snap + b.img.off[i],
				    b.mem.len[i]);

	ngot = learn_read(b.trace, m, &w, &complete, b.how, b.lbt, b.got, 4 * m->nmb);
	assert_int_equal(w, window_ms);
	assert_int_equal(complete, window_ms ? 0 : 1);
	fprintf(stderr, "  %zu touches, %zu first touches expected, %zu recorded; %" PRIu64
		" faults, %" PRIu64 " LBs on demand, %" PRIu64 " prefetched; %" PRIu64 " ms\n", b.n,
		b.nwant, ngot, st.faults, st.lb_demand, st.lb_prefetch, elapsed);
	for (uint64_t lb = 0; lb < m->nlb; lb++)
		assert_true(b.how[lb] == 'd' || b.how[lb] == 'p');
	if (!window_ms) {
		learn_compare(b.got, ngot, b.want, b.nwant, b.rd);
		/* Each first touch a fault, the others none; every LB read for one. */
		assert_int_equal(st.faults, b.nwant);
		assert_int_equal(st.faults_vcpu, nvcpu);
		assert_int_equal(st.mb_fault, stored);
		assert_int_equal(st.lb_demand, m->nlb);
		assert_int_equal(st.lb_prefetch, 0);
	} else {
		/*
		 * All touched before the window's end (a slow machine may not
		 * have: then a prefix of them, all within the window).
		 */
		learn_bed_compare(&b, ngot, window_ms, elapsed + 200 < window_ms);
		/* Prefetch and readahead held back for the window. */
		for (uint64_t lb = 0; lb < m->nlb; lb++)
			if (b.how[lb] == 'p' && b.lbt[lb] < (uint64_t)window_ms * 1000000)
				fail_msg("LB %" PRIu64 " prefetched %" PRIu64 " ns after ready, "
					 "inside the learning window", lb, b.lbt[lb]);
		assert_true(st.lb_prefetch > 0);
	}
	learn_bed_free(&b, r);
}

static void test_learn(void **state)
{
	struct image img;
	struct mem mem;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r = (void *)1;
	char *path = tmp_path("learn-args.hlt");

	/* Refused: learning without a trace, a window without learning, learning a take-over. */
	make_image(&img, 256u << 10, 0, 1);
	write_image(path, &img, HALITE_CODEC_LZ4, 1, 16384, NULL);
	mem_map(&mem, &img, HALITE_MEM_ANON);
	mem_regions(&mem, &img, reg);
	o.flags = HALITE_RESTORE_LEARN;
	assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), -EINVAL);
	o.flags = 0;
	o.trace_path = "/nonexistent/t";
	o.learn_window_ms = 10;
	assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), -EINVAL);
	o.flags = HALITE_RESTORE_LEARN | HALITE_RESTORE_ATTACH;
	assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), -EINVAL);
	assert_ptr_equal(r, (void *)1);
	mem_unmap(&mem);
	unlink(path);
	free(path);
	free_image(&img);

	run_learn(HALITE_MEM_ANON, 0);
	run_learn(HALITE_MEM_SHARED, 0);
	run_learn(HALITE_MEM_ANON, 1500);
}

/*
 * LEARN with TRACK_ACCESS: both at once, as a restore that measures VM
 * access while it learns. Prefetch and readahead off (NO_PREFETCH,
 * NO_READAHEAD), so that every LB is read for a fault and the counts are
 * exact: the model is TRACK_ACCESS's (run_counts), whatever the window
 * does. A learn_plan() touched while learning (window @window_ms), then,
 * once the window is over, a second phase: some of the blocks staged
 * while learning (TRACK_ACCESS keeps them staged to the end: each touch
 * is still a fault, answered from the stage and counted as accessed),
 * then one block of every LB not read yet, the last completing the
 * restore. The touch lines are the first phase's first touches exactly;
 * the trace's lb lines say what the stats say.
 */
static void run_learn_track(int kind, unsigned window_ms)
{
	struct learn_bed b;
	struct model *m = &b.m;
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	char line[256], when[160];
	uint64_t seed = t_rand(&g_seed), t0, elapsed, sum_staged = 0, sum_acc = 0;
	uint64_t *cover, ncover = 0, nstaged_touch = 0;
	size_t ngot;
	unsigned w = 99;
	int complete = -1;
	bool late;
	FILE *f;

	fprintf(stderr, "learn + TRACK_ACCESS: %s memory, window %u ms, seed %" PRIu64 "\n",
		kind == HALITE_MEM_SHARED ? "memfd" : "anonymous", window_ms, seed);
	learn_bed_init(&b, "learn-track", kind, true, 24, false, &seed);
	cover = calloc(m->nlb, sizeof(*cover));
	assert_non_null(cover);
	/* INFO: the window's end is logged ("learning ends"). */
	learn_bed_opts(&b, &o, HALITE_RESTORE_TRACK_ACCESS | HALITE_RESTORE_NO_PREFETCH |
		       HALITE_RESTORE_NO_READAHEAD, window_ms, HALITE_LOG_INFO);
	r_log_reset(&g_log);
	assert_int_equal(halite_restore_open(&r, b.path, b.reg, b.img.nreg, &o), 0);
	t0 = r_now_ms();
	assert_int_equal(halite_restore_start(r), 0);
	model_settle(m, r, "after start");

	/* Phase 1, learning. */
	for (size_t i = 0; i < b.n; i++) {
		char d[96];

		learn_bed_touch(&b, i, &seed);
		model_touch(m, b.plan[i].mb, b.plan[i].who < 2);
		snprintf(when, sizeof(when), "learning, touch %zu of %zu (%s, thread %d)", i, b.n,
			 mb_desc(b.rd, b.plan[i].mb, d, sizeof(d)), b.plan[i].who);
		model_settle(m, r, when);
	}
	elapsed = r_now_ms() - t0;
	/* A slow machine may have ended the window already: then fewer touch lines. */
	late = r_log_has(&g_log, "learning ends");
	for (uint64_t t = r_now_ms(); !r_log_has(&g_log, "learning ends"); r_sleep_us(1000))
		if (r_now_ms() - t > 10000 + window_ms)
			fail_msg("no 'learning ends' in the log %u ms after a %u ms window",
				 (unsigned)(r_now_ms() - t0), window_ms);
	/* The window's end installs no staged block of a demand LB: TRACK_ACCESS keeps them. */
	r_sleep_us(100000);
	model_settle(m, r, "after the window");
	halite_restore_stats(r, &st);
	assert_false(st.done);

	/* Phase 2: staged blocks touched after the window, then one block of each LB left. */
	for (uint64_t mb = 0; mb < m->nmb; mb++) {
		if (!m->staged[mb] || t_rand(&seed) % 2)
			continue;
		int who = (int)(t_rand(&seed) % 3);

		toucher_do(b.tt[who], model_mb_addr(m, mb, NULL), who == 1);
		model_touch(m, mb, who < 2);
		nstaged_touch++;
		snprintf(when, sizeof(when), "after the window, staged MB %" PRIu64, mb);
		model_settle(m, r, when);
	}
	for (uint64_t mb = 0; mb < m->nmb; mb++)
		if (m->state[mb] == HALITE_MB_STORED && !m->lb_read[m->lb[mb]] &&
		    (!ncover || m->lb[cover[ncover - 1]] != m->lb[mb])) {
			bool seen = false;

			for (uint64_t i = 0; i < ncover && !seen; i++)
				seen = m->lb[cover[i]] == m->lb[mb];
			if (!seen)
				cover[ncover++] = mb;
		}
	assert_true(nstaged_touch > 0 && ncover > 0);
	for (uint64_t i = 0; i < ncover; i++) {
		toucher_do(b.tt[i % 2], model_mb_addr(m, cover[i], NULL), i % 3 == 0);
		model_touch(m, cover[i], true);
		if (i + 1 == ncover)
			break; /* the last one completes the restore */
		snprintf(when, sizeof(when), "after the window, LB %" PRIu64, m->lb[cover[i]]);
		model_settle(m, r, when);
		halite_restore_stats(r, &st);
		assert_false(st.done);
	}
	assert_int_equal(halite_restore_wait(r, 10000), 0);
	/* Staged blocks nobody touched are installed at the end. */
	for (uint64_t mb = 0; mb < m->nmb; mb++)
		if (m->staged[mb]) {
			m->staged[mb] = 0;
			m->installed[mb] = 1;
			m->e.mb_pool++;
		}
	model_settle(m, r, "done");
	halite_restore_stats(r, &st);
	fprintf(stderr, "  %zu touches while learning (%" PRIu64 " ms), %" PRIu64 " staged blocks "
		"and %" PRIu64 " LBs after: %" PRIu64 " faults, staged %" PRIu64 ", accessed %"
		PRIu64 " (%.2f%%)\n", b.n, elapsed, nstaged_touch, ncover, st.faults, st.mb_staged,
		st.mb_staged_accessed, st.vm_access_pct);
	assert_true(st.done);
	assert_int_equal(st.error, 0);
	assert_int_equal(st.lb_demand, m->nlb);
	assert_int_equal(st.lb_prefetch, 0);
	assert_int_equal(st.mb_fault, m->e.mb_fault);
	assert_int_equal(st.mb_pool, m->e.mb_pool);
	assert_int_equal(st.mb_prefetch, 0);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_zero, st.mb_total);
	assert_true(m->e.staged_acc > 0 && m->e.staged_acc < m->e.staged);
	assert_true(fabs(st.vm_access_pct - 100.0 * (double)m->e.staged_acc /
			 (double)m->e.staged) < 1e-9);
	for (uint32_t i = 0; i < b.img.nreg; i++)
		assert_memory_equal((void *)(uintptr_t)b.mem.host[i], b.img.snap + b.img.off[i],
				    b.mem.len[i]);

	/* The trace: version 2; the first phase's first touches; lb lines as the stats. */
	ngot = learn_read(b.trace, m, &w, &complete, b.how, b.lbt, b.got, 4 * m->nmb);
	assert_int_equal(w, window_ms);
	assert_int_equal(complete, 0);
	learn_bed_compare(&b, ngot, window_ms, !late && elapsed + 200 < window_ms);
	f = fopen(b.trace, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long lb, staged, acc;
		char h[16], fm[24];

		if (sscanf(line, "lb %llu %15s %*s %23s %llu %llu", &lb, h, fm, &staged, &acc) != 5)
			continue;
		assert_string_equal(h, "demand");
		sum_staged += staged;
		sum_acc += acc;
	}
	fclose(f);
	assert_int_equal(sum_staged, st.mb_staged);
	assert_int_equal(sum_acc, st.mb_staged_accessed);

	free(cover);
	learn_bed_free(&b, r);
}

static void test_learn_track_access(void **state)
{
	run_learn_track(HALITE_MEM_ANON, 600);
	run_learn_track(HALITE_MEM_SHARED, 600);
}

/* ---------------------------------------------------------------------- */
/* A relayouted file's hot prefix (opts.hot_prefix_max)                    */

/*
 * A file whose metadata says "hot-lbs=K" (as halite-inspect relayout
 * writes it), restored with the prefetcher held back (a fault at start on
 * the last LB, then prefetch_idle_us 10 s and a minimum rate of one byte a
 * second: without the hot prefix it would read at most one LB): the first
 * @want LBs are read by the prefetcher anyway, before any other, exactly
 * those (lb_hot), one read in flight so the trace's order is the reads'.
 * Then one touch per stored block brings in the rest: memory is the
 * snapshot, and the trace says the same (stat lb_hot, the hot LBs'
 * prefetch lines first). @meta NULL: no metadata.
 */
static void run_hot(const char *meta, unsigned flags, uint64_t hot_max, uint64_t want,
		    const char *warning)
{
	struct image img;
	struct mem mem;
	struct model m;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_reader *rd;
	struct halite_restore_stats st;
	struct toucher *t;
	char *path = tmp_path("hot.hlt"), *trace = tmp_path("hot.trace");
	char line[256], how[16];
	uint64_t last = UINT64_MAX, hot_max_t = 0, other_min_t = UINT64_MAX, nhot = 0;
	unsigned long long lb, tn, stat_hot = ~0ull;
	FILE *f;

	fprintf(stderr, "hot prefix: metadata '%s', flags %#x, bound %" PRIu64 ": %" PRIu64
		" LBs first\n", meta ? meta : "(none)", flags, hot_max, want);
	make_image(&img, 2u << 20, 256u << 10, 77);
	write_image_meta(path, &img, HALITE_CODEC_LZ4, 2, 16384, NULL,
			 meta ? "halite.relayout" : NULL, meta);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	mem_map(&mem, &img, HALITE_MEM_ANON);
	mem_regions(&mem, &img, reg);
	model_init(&m, rd, &mem, false);
	for (uint64_t mb = 0; mb < m.nmb; mb++)
		if (m.state[mb] == HALITE_MB_STORED && m.lb[mb] == m.nlb - 1)
			last = mb;
	assert_true(last != UINT64_MAX && m.nlb > 20);

	t = toucher_start();
	r_log_reset(&g_log);
	o.flags = flags | HALITE_RESTORE_NO_READAHEAD;
	o.hot_prefix_max = hot_max;
	o.queue_depth = 1;
	o.prefetch_idle_us = 10000000;
	o.prefetch_min_rate = 1;
	o.trace_path = trace;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, reg, img.nreg, &o), 0);
	if (warning)
		assert_true(r_log_has(&g_log, warning));
	else
		assert_false(r_log_has(&g_log, "halite.relayout"));
	assert_int_equal(halite_restore_start(r), 0);
	toucher_do(t, model_mb_addr(&m, last, NULL), false);
	for (uint64_t t0 = r_now_ms();; r_sleep_us(1000)) {
		halite_restore_stats(r, &st);
		if (st.lb_hot >= want && r_now_ms() - t0 >= (want ? 0 : 200))
			break;
		if (r_now_ms() - t0 > 10000)
			fail_msg("%" PRIu64 " hot LBs read of %" PRIu64, st.lb_hot, want);
	}
	/* The hot ones, and at most the one LB the minimum rate allows. */
	assert_int_equal(st.lb_hot, want);
	assert_int_equal(st.lb_demand, 1);
	assert_true(st.lb_prefetch == want || st.lb_prefetch == want + 1);

	for (uint64_t mb = 0; mb < m.nmb; mb++)
		if (m.state[mb] == HALITE_MB_STORED)
			toucher_do(t, model_mb_addr(&m, mb, NULL), false);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	halite_restore_stats(r, &st);
	assert_true(st.done);
	assert_int_equal(st.lb_hot, want);
	assert_int_equal(st.lb_demand + st.lb_prefetch, m.nlb);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero, st.mb_total);
	for (uint32_t i = 0; i < img.nreg; i++)
		assert_memory_equal((void *)(uintptr_t)mem.host[i], img.snap + img.off[i], mem.len[i]);
	toucher_stop(t);
	halite_restore_free(r);

	/* The trace: stat lb_hot, and LBs 0..want-1 prefetched before any other. */
	f = fopen(trace, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "stat lb_hot %llu", &stat_hot) == 1)
			continue;
		if (sscanf(line, "lb %llu %15s %llu", &lb, how, &tn) != 3)
			continue;
		if (lb < want) {
			if (strcmp(how, "prefetch"))
				fail_msg("hot LB %llu read by %s", lb, how);
			nhot++;
			hot_max_t = tn > hot_max_t ? tn : hot_max_t;
		} else if (!strcmp(how, "prefetch")) {
			other_min_t = tn < other_min_t ? tn : other_min_t;
		}
	}
	fclose(f);
	assert_int_equal(stat_hot, want);
	assert_int_equal(nhot, want);
	if (want && other_min_t != UINT64_MAX && hot_max_t > other_min_t)
		fail_msg("a hot LB landed at %" PRIu64 " ns, another prefetched LB at %" PRIu64,
			 hot_max_t, other_min_t);

	model_free(&m);
	halite_reader_free(rd);
	mem_unmap(&mem);
	unlink(trace);
	unlink(path);
	free(path);
	free(trace);
	free_image(&img);
}

static void test_hot_prefix(void **state)
{
	const char *warn = "is not 'hot-lbs=K'";

	run_hot("traces=2 hot-lbs=12 hot-blocks=40 source-uuid=00112233445566778899aabbccddeeff",
		0, 0, 12, NULL);
	/* Bounded: whole LBs within 3 LBs and a bit. */
	run_hot("traces=1 hot-lbs=12 hot-blocks=40 source-uuid=00", 0, 3 * 16384 + 100, 3, NULL);
	run_hot("traces=1 hot-lbs=12", HALITE_RESTORE_NO_HOT, 0, 0, NULL);
	/* Without the metadata: as before, nothing read ahead of the throttle. */
	run_hot(NULL, 0, 0, 0, NULL);
	/* Malformed: ignored with a warning, the restore as without it. */
	run_hot("traces=1 hot-lbs=twelve", 0, 0, 0, warn);
	run_hot("traces=1 hot-lbs=12x", 0, 0, 0, warn);
	run_hot("traces=1 hot-lbs=99999", 0, 0, 0, warn);
	run_hot("traces=1 hot-lbs=3 hot-lbs=4", 0, 0, 0, warn);
	run_hot("traces=1", 0, 0, 0, warn);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test_teardown(test_counts_exact, teardown_touchers),
		cmocka_unit_test_teardown(test_counts_track_access, teardown_touchers),
		cmocka_unit_test_teardown(test_learn, teardown_touchers),
		cmocka_unit_test_teardown(test_learn_track_access, teardown_touchers),
		cmocka_unit_test_teardown(test_hot_prefix, teardown_touchers),
		cmocka_unit_test(test_writer_file_every_codec),
		cmocka_unit_test(test_writer_file_geometry),
		cmocka_unit_test(test_saved_synth_every_codec),
		cmocka_unit_test(test_clones),
		cmocka_unit_test(test_copy_region),
		cmocka_unit_test(test_corrupt_lb),
		cmocka_unit_test(test_truncated_mid_restore),
		cmocka_unit_test(test_corrupt_lb_external),
		cmocka_unit_test(test_external_populated),
		cmocka_unit_test(test_restorer_killed),
	};
	struct halite_uffd_caps caps;
	int ret;

	ret = halite_uffd_probe(&caps);
	if (ret) {
		fprintf(stderr, "userfaultfd unavailable (%s): skipped\n", strerror(-ret));
		return 77;
	}
	g_seed = t_seed("test_restore");
	r_log_init(&g_log, false);
	/* HALITE_TEST_FILTER=test_counts* runs the matching tests only. */
	if (getenv("HALITE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("HALITE_TEST_FILTER"));
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
