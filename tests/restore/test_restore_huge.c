/* SPDX-License-Identifier: MIT */
/*
 * The lazy restore onto hugetlbfs (halite/restore/huge.c): the unit of installation
 * is the huge page, which the guest sees only once every block of it is
 * decoded and verified.
 *
 * - kernel: the guarantee the engine rests on. A hugetlbfs page present in
 *   the page cache (written through another mapping) but not mapped for a
 *   range registered MINOR faults into the handler, and its thread stays
 *   blocked until UFFDIO_CONTINUE, then reads the whole page.
 * - exact: a hugetlbfs memfd region (and a small anonymous one beside it)
 *   restored while three threads visit every page, each comparing the page
 *   with the snapshot on its first visit (what the guest saw): files in
 *   physical order and shuffled over three streams (each LB then holds
 *   blocks of several huge pages), every codec, with and without the
 *   prefetcher, TRACK_ACCESS once, LEARN once (its trace: one touch line
 *   per huge page at most); then every byte, the counts' sums, every
 *   LB read once, the ranges unregistered. A 1 GiB page too, when the
 *   kernel can give one.
 * - counts: with NO_PREFETCH, two threads (one a vCPU) touch the huge pages
 *   one at a time; faults, zero faults, vCPU faults, LBs read, blocks
 *   installed by fault and by the pool are predicted from the file's maps
 *   after every touch, exactly, and a huge page is mapped (pagemap) exactly
 *   when all its blocks are in: never partly.
 * - corrupt: a locality block with a flipped byte, holding blocks of a huge
 *   page whose other LBs are good: the restore fails naming the LB after
 *   the retries, the faulting thread stays blocked, the page is not mapped
 *   for the guest (though the page cache holds what the good LBs gave it),
 *   and halite_restore_free() kills the thread with SIGSEGV (in a child).
 * - punch: hugetlbfs cannot refuse a hole punch; a huge page punched out
 *   once in reads zeros, one punched out while being assembled comes in
 *   with zeros where its blocks written before were: never a byte that was
 *   not verified; the restore completes.
 * - attach: the handler of another process's hugetlbfs memory killed
 *   mid-restore; HALITE_RESTORE_ATTACH takes over, keeps the huge pages in,
 *   and finishes; the owner's threads read the snapshot throughout.
 * - refused: a file range that holds a huge page already (-EEXIST, naming
 *   it), a misaligned file offset (-EINVAL), a read-only descriptor, too
 *   few free huge pages to reserve the range (-ENOMEM at open).
 *
 * Huge pages are reserved through /proc/sys/vm/nr_hugepages (and the
 * setting put back); without them, and without root to reserve them, the
 * test is skipped (77).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/halite.h>

#include "restore_util.h"
#include "test_util.h"
#include "uffd.h"

#define PAGE R_PAGE
#define HP (2ull << 20)
#define MBS 8192u /* memory block: 2 pages */
#define WAIT_MS 60000
#define PAGES_NEEDED 24 /* the largest case: 16 huge pages, plus slack */
#define GIB_SYSFS "/sys/kernel/mm/hugepages/hugepages-1048576kB/"
#define MFD_HUGE_1GB_ (30u << 26) /* linux/memfd.h: log2 of the page size << MFD_HUGE_SHIFT */

static uint64_t g_seed;
static struct r_log g_log;
static long g_old_nr = -1;

static pid_t my_tid(void)
{
	return (pid_t)syscall(SYS_gettid);
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

/* ---------------------------------------------------------------------- */
/* Huge pages                                                              */

static long meminfo(const char *key)
{
	char line[128];
	long v = -1;
	size_t n = strlen(key);
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static long read_long(const char *path)
{
	long v = -1;
	FILE *f = fopen(path, "r");

	if (f && fscanf(f, "%ld", &v) != 1)
		v = -1;
	if (f)
		fclose(f);
	return v;
}

static bool write_long(const char *path, long v)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return false;
	fprintf(f, "%ld\n", v);
	return !fclose(f);
}

/*
 * At least @n free 2 MiB huge pages (unreserved), reserving more if this
 * process may; the first change remembers the setting for main() to put
 * back. False: not to be had.
 */
static bool huge_pages(long n)
{
	long total = meminfo("HugePages_Total"), avail;

	avail = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
	if (avail >= n)
		return true;
	if (total < 0 || !write_long("/proc/sys/vm/nr_hugepages", total + n - avail))
		return false;
	if (g_old_nr < 0)
		g_old_nr = total;
	return meminfo("HugePages_Free") - meminfo("HugePages_Rsvd") >= n;
}

/* An empty hugetlbfs memfd of @len bytes mapped shared (the guest's view): fd, or -errno. */
static int huge_memfd(uint64_t len, unsigned flags, void **map)
{
	int fd = memfd_create("halite-huge", MFD_CLOEXEC | MFD_HUGETLB | flags);
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len)) {
		close(fd);
		return -errno;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int e = -errno;

		close(fd);
		return e;
	}
	*map = p;
	return fd;
}

/* ---------------------------------------------------------------------- */
/* Images and files                                                        */

#define MAXREG 2

struct image {
	uint32_t nreg;
	struct halite_region reg[MAXREG];
	uint64_t off[MAXREG];	/* of each region in snap */
	uint64_t len;
	uint8_t *snap;		/* regions back to back */
	uint8_t *hole;		/* per memory block: never written (not put) */
	uint64_t hp;		/* region 0's huge page size */
};

static const char *const reg_names[MAXREG] = { "pc.ram", "pc.ram.hi" };

/*
 * Region 0 of @nhp huge pages of @hp bytes (on hugetlbfs), region 1 of
 * @len1 bytes (anonymous; none if 0). Huge page k of region 0: k % 8 == 3
 * never written, k % 8 == 5 written with zeros, the others a mix per 16 KiB
 * (holes, zeros, random, text-like). @sparse: only 1 block in 64 written
 * (a 1 GiB page without writing 1 GiB).
 */
static void make_image(struct image *img, uint64_t hp, uint64_t nhp, uint64_t len1, bool sparse,
		       uint64_t seed)
{
	uint64_t nmb;

	memset(img, 0, sizeof(*img));
	img->hp = hp;
	img->nreg = len1 ? 2 : 1;
	img->reg[0] = (struct halite_region){ reg_names[0], 0, hp * nhp };
	img->reg[1] = (struct halite_region){ reg_names[1], 4ull << 30, len1 };
	img->off[1] = hp * nhp;
	img->len = hp * nhp + len1;
	img->snap = calloc(1, img->len);
	nmb = (img->len + MBS - 1) / MBS;
	img->hole = calloc(1, nmb);
	assert_non_null(img->snap);
	assert_non_null(img->hole);
	for (uint64_t mb = 0; mb < nmb; mb++) {
		uint64_t at = mb * MBS, k = at < img->off[1] ? at / hp : UINT64_MAX;
		uint64_t n = img->len - at < MBS ? img->len - at : MBS;
		uint8_t *p = img->snap + at;
		unsigned kind = (unsigned)(t_rand(&seed) % 16);

		if (k % 8 == 3 || (sparse && mb % 64)) {
			img->hole[mb] = 1;
			continue;
		}
		if (k % 8 == 5)
			continue; /* zeros, written */
		if (kind < 2)
			img->hole[mb] = 1;
		else if (kind == 2)
			; /* zeros, written */
		else if (kind < 7)
			t_fill(p, n, 100, &seed);
		else
			t_fill(p, n, 25, &seed);
	}
}

static void free_image(struct image *img)
{
	free(img->snap);
	free(img->hole);
}

/*
 * Write @img: @shuffle puts the written blocks in a random order over three
 * vCPU streams, as a save of a guest touching 4 KiB pages all over would.
 */
static void write_image(const char *path, const struct image *img, int codec, uint32_t lb_size,
			bool shuffle, uint64_t seed)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_writer *w;
	uint64_t nmb, *order;

	wo.codec = codec;
	wo.lb_size = lb_size;
	wo.flags = HALITE_WRITER_NO_SYNC;
	assert_int_equal(halite_writer_create(&w, path, img->reg, img->nreg, &wo), 0);
	assert_int_equal(halite_writer_mb_size(w), MBS);
	nmb = halite_writer_mb_count(w);
	order = malloc(nmb * sizeof(*order));
	for (uint64_t i = 0; i < nmb; i++)
		order[i] = i;
	for (uint64_t i = nmb; shuffle && i > 1; i--) {
		uint64_t j = t_rand(&seed) % i, t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	for (uint64_t i = 0; i < nmb; i++) {
		uint64_t mb = order[i];
		uint32_t stream = shuffle ? HALITE_STREAM(HALITE_STREAM_VCPU, (unsigned)(mb % 3))
					  : HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0);

		if (!img->hole[mb])
			assert_int_equal(halite_writer_put(w, stream, mb, img->snap + mb * MBS), 0);
	}
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, false);
	free(order);
}

/* Memory for an image: region 0 on a hugetlbfs memfd, region 1 anonymous. */
struct mem {
	uint32_t nreg;
	uint8_t *host[MAXREG];
	uint64_t len[MAXREG];
	int fd;
};

static int mem_map_try(struct mem *m, const struct image *img)
{
	void *p;

	memset(m, 0, sizeof(*m));
	m->nreg = img->nreg;
	m->len[0] = img->reg[0].length;
	m->fd = huge_memfd(m->len[0], img->hp == HP ? 0 : MFD_HUGE_1GB_, &p);
	if (m->fd < 0)
		return m->fd;
	m->host[0] = p;
	if (img->nreg > 1) {
		m->len[1] = img->reg[1].length;
		p = mmap(NULL, m->len[1], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return -errno;
		madvise(p, m->len[1], MADV_NOHUGEPAGE);
		m->host[1] = p;
	}
	return 0;
}

static void mem_unmap(struct mem *m)
{
	for (uint32_t r = 0; r < m->nreg; r++)
		if (m->host[r])
			munmap(m->host[r], m->len[r]);
	if (m->fd >= 0)
		close(m->fd);
}

static void mem_regions(const struct mem *m, const struct image *img,
			struct halite_restore_region *reg)
{
	reg[0] = (struct halite_restore_region){ img->reg[0].name, (uintptr_t)m->host[0], m->len[0],
						 HALITE_MEM_SHARED, m->fd, 0 };
	if (m->nreg > 1)
		reg[1] = (struct halite_restore_region){ img->reg[1].name, (uintptr_t)m->host[1],
							 m->len[1], HALITE_MEM_ANON, -1, 0 };
}

/* Page @p of the image (numbered across the regions) in memory. */
static uint8_t *mem_page(const struct mem *m, const struct image *img, uint64_t p)
{
	uint64_t at = p * PAGE;
	uint32_t r = img->nreg > 1 && at >= img->off[1];

	return m->host[r] + at - img->off[r];
}

/* ---------------------------------------------------------------------- */
/* kernel: a page in the page cache still faults until UFFDIO_CONTINUE     */

struct toucher1 {
	volatile uint8_t *addr;
	_Atomic int returned;
	_Atomic pid_t tid;
	uint8_t value;
};

static void *touch1_main(void *arg)
{
	struct toucher1 *t = arg;

	atomic_store(&t->tid, my_tid());
	t->value = *t->addr;
	atomic_store(&t->returned, 1);
	return NULL;
}

static void test_kernel_minor(void **state)
{
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING |
					       UFFDIO_REGISTER_MODE_MINOR };
	struct toucher1 t = { 0 };
	struct uffd_msg m;
	struct pollfd pf;
	pthread_t thr;
	uint8_t *guest, *engine;
	int fd, uffd;

	(void)state;
	fd = huge_memfd(2 * HP, 0, (void **)&guest);
	assert_true(fd >= 0);
	engine = mmap(NULL, 2 * HP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	assert_true(engine != MAP_FAILED);
	uffd = halite_uffd_open(UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS |
				UFFD_FEATURE_EXACT_ADDRESS, NULL);
	if (uffd < 0) {
		fprintf(stderr, "userfaultfd lacks MINOR_HUGETLBFS: skipped\n");
		skip();
	}
	reg.range = (struct uffdio_range){ (uintptr_t)guest, 2 * HP };
	assert_int_equal(ioctl(uffd, UFFDIO_REGISTER, &reg), 0);
	/* Half a page written through the engine's mapping: in the page cache. */
	assert_int_equal(fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, HP), 0);
	memset(engine, 0x5a, HP / 2);
	t.addr = guest + 100;
	assert_int_equal(pthread_create(&thr, NULL, touch1_main, &t), 0);
	pf = (struct pollfd){ uffd, POLLIN, 0 };
	assert_int_equal(poll(&pf, 1, 5000), 1);
	assert_int_equal(read(uffd, &m, sizeof(m)), sizeof(m));
	assert_int_equal(m.event, UFFD_EVENT_PAGEFAULT);
	assert_true(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR);
	assert_int_equal(m.arg.pagefault.address, (uintptr_t)guest + 100);
	r_sleep_us(200000);
	assert_int_equal(atomic_load(&t.returned), 0);
	assert_true(r_thread_state(getpid(), atomic_load(&t.tid)) == 'S');
	assert_int_equal(r_pages_present(getpid(), (uintptr_t)guest, HP, NULL), 0);
	/* The rest, then the page shown: the thread reads what was written. */
	memset(engine + HP / 2, 0xa5, HP / 2);
	assert_int_equal(ioctl(uffd, UFFDIO_CONTINUE, &(struct uffdio_continue){
						   .range = { (uintptr_t)guest, HP } }), 0);
	pthread_join(thr, NULL);
	assert_int_equal(t.value, 0x5a);
	assert_int_equal(guest[HP - 1], 0xa5);
	/* A hole faults MISSING; UFFDIO_CONTINUE there fails (EFAULT) and allocates nothing. */
	t = (struct toucher1){ .addr = guest + HP + 3 * PAGE };
	assert_int_equal(pthread_create(&thr, NULL, touch1_main, &t), 0);
	assert_int_equal(poll(&pf, 1, 5000), 1);
	assert_int_equal(read(uffd, &m, sizeof(m)), sizeof(m));
	assert_false(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR);
	assert_int_equal(ioctl(uffd, UFFDIO_CONTINUE, &(struct uffdio_continue){
						   .range = { (uintptr_t)guest + HP, HP } }), -1);
	assert_int_equal(errno, EFAULT);
	memset(engine + HP, 0x77, HP);
	assert_int_equal(ioctl(uffd, UFFDIO_CONTINUE, &(struct uffdio_continue){
						   .range = { (uintptr_t)guest + HP, HP } }), 0);
	pthread_join(thr, NULL);
	assert_int_equal(t.value, 0x77);
	close(uffd);
	munmap(engine, 2 * HP);
	munmap(guest, 2 * HP);
	close(fd);
}

/* ---------------------------------------------------------------------- */
/* exact: every byte, with threads visiting every page meanwhile            */

struct visit {
	const struct mem *mem;
	const struct image *img;
	uint64_t seed;
	_Atomic uint64_t mismatches, first_bad; /* page + 1 */
	_Atomic int go;
	_Atomic int started; /* visitors that took their index */
	_Atomic int led;     /* the first visitor's page of region 1 is in */
};

/* Page @p as the visitor sees it on first sight: the snapshot's bytes, else counted. */
static void visit_page(struct visit *v, uint64_t p)
{
	uint64_t z = 0;

	if (!memcmp(mem_page(v->mem, v->img, p), v->img->snap + p * PAGE, PAGE))
		return;
	atomic_fetch_add(&v->mismatches, 1);
	atomic_compare_exchange_strong(&v->first_bad, &z, p + 1);
}

static void *visitor_main(void *arg)
{
	struct visit *v = arg;
	uint64_t n = v->img->len / PAGE, s = v->seed ^ (uint64_t)my_tid();
	uint32_t *order = malloc(n * sizeof(*order));
	bool lead = atomic_fetch_add(&v->started, 1) == 0;

	for (uint64_t i = 0; i < n; i++)
		order[i] = (uint32_t)i;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = t_rand(&s) % i;
		uint32_t t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	while (!atomic_load(&v->go))
		sched_yield();
	/*
	 * The first visitor touches a page of region 1 (4 KiB pages) before
	 * anyone touches a huge page: a huge page's fault reads every LB that
	 * holds one of its blocks, and a learning restore may then be done
	 * before a later touch of region 1, which its trace would not show.
	 */
	if (lead && v->img->nreg > 1)
		visit_page(v, v->img->off[1] / PAGE);
	if (lead)
		atomic_store(&v->led, 1);
	while (!atomic_load(&v->led))
		sched_yield();
	/* What the guest sees first is the snapshot, not only what is left at the end. */
	for (uint64_t i = 0; i < n; i++)
		visit_page(v, order[i]);
	free(order);
	return NULL;
}

static void check_sums(const struct halite_restore_stats *st, struct halite_reader *rd)
{
	const struct halite_file_info *fi = halite_reader_info(rd);

	assert_true(st->done);
	assert_int_equal(st->error, 0);
	assert_int_equal(st->mb_fault + st->mb_pool + st->mb_prefetch + st->mb_zero, st->mb_total);
	assert_int_equal(st->mb_zero, fi->mb_zero + fi->mb_untouched);
	assert_int_equal(st->lb_demand + st->lb_prefetch, st->lb_total);
	assert_int_equal(st->lb_total, fi->lb_count);
	assert_int_equal(st->lb_retries, 0);
}

/*
 * A learning restore's trace (LEARN, window 0): version 2, complete, and per
 * huge page of region 0 one touch line at most, for a block of that page;
 * blocks of region 1 (4 KiB pages) once each.
 */
static void check_learn_trace(const char *trace, struct halite_reader *rd, uint64_t hp)
{
	const struct halite_region_info *r0 = halite_reader_region(rd, 0);
	uint64_t per = hp / halite_reader_info(rd)->mb_size, nmb = halite_reader_info(rd)->mb_count;
	uint8_t *seen = calloc(nmb, 1);
	FILE *f = fopen(trace, "r");
	char line[256];
	size_t n = 0, huge = 0;
	bool learn = false;

	assert_true(f && seen);
	assert_non_null(fgets(line, sizeof(line), f));
	assert_string_equal(line, "halite-restore-trace 2\n");
	while (fgets(line, sizeof(line), f)) {
		unsigned long long t, mb;
		char v[16], kind[16];
		uint64_t key;

		if (!strcmp(line, "learn 0 1\n")) {
			learn = true;
			continue;
		}
		if (!learn)
			continue;
		assert_int_equal(sscanf(line, "touch %llu %15s %llu %15s", &t, v, &mb, kind), 4);
		assert_true(mb < nmb);
		key = mb;
		if (mb >= r0->first_mb && mb < r0->first_mb + r0->mb_count) {
			key = mb - (mb - r0->first_mb) % per;
			huge++;
		}
		if (seen[key])
			fail_msg("%s: a second touch line for memory block %llu's %s", trace, mb,
				 key == mb ? "block" : "huge page");
		seen[key] = 1;
		n++;
	}
	fclose(f);
	free(seen);
	assert_true(learn);
	assert_true(huge > 0 && huge <= r0->mb_count / per && n > huge);
}

static void restore_exact(const char *path, const struct image *img, unsigned flags,
			  const char *what)
{
	char *trace = flags & HALITE_RESTORE_LEARN ? tmp_path("exact.trace") : NULL;
	struct mem mem;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_reader *rd;
	struct visit v = { .img = img, .seed = t_rand(&g_seed) };
	pthread_t thr[3];
	pid_t tids[3] = { 0 };
	uint64_t t0 = r_now_ms();

	if (img->hp == HP)
		assert_true(huge_pages((long)(img->reg[0].length / HP) + 2));
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	assert_int_equal(mem_map_try(&mem, img), 0);
	mem_regions(&mem, img, reg);
	v.mem = &mem;
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&thr[i], NULL, visitor_main, &v), 0);
	tids[0] = my_tid(); /* not a visitor: vCPU counts need not be exact here */
	o.flags = flags;
	o.vcpu_tids = tids;
	o.nvcpus = 1;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	o.trace_path = trace;
	/*
	 * The prefetcher waits for 300 ms without a fault: on a busy host the
	 * visitors may start later than the default 2 ms, and an image this
	 * small is then all prefetched before anyone faults (and the restore
	 * over before the registration is looked at).
	 */
	o.prefetch_idle_us = 300000;
	o.prefetch_min_rate = 1;
	assert_int_equal(halite_restore_open(&r, path, reg, img->nreg, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	for (uint32_t i = 0; i < img->nreg; i++)
		assert_int_equal(r_uffd_registered(getpid(), (uintptr_t)mem.host[i], mem.len[i]), 1);
	atomic_store(&v.go, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(thr[i], NULL);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	halite_restore_stats(r, &st);
	fprintf(stderr, "  %s: %.0f ms; %" PRIu64 " faults (%" PRIu64 " zero, %" PRIu64
		" cached); MBs %" PRIu64 " fault + %" PRIu64 " pool + %" PRIu64 " prefetch + %"
		PRIu64 " zero; LBs %" PRIu64 " demand + %" PRIu64 " prefetch; fault p50 %.0f us\n",
		what, (double)(r_now_ms() - t0), st.faults, st.faults_zero, st.faults_cached,
		st.mb_fault, st.mb_pool, st.mb_prefetch, st.mb_zero, st.lb_demand,
		st.lb_prefetch, (double)st.fault_p50_ns / 1e3);
	if (atomic_load(&v.mismatches))
		fail_msg("%s: %" PRIu64 " pages differed on first sight, first page %" PRIu64, what,
			 atomic_load(&v.mismatches), atomic_load(&v.first_bad) - 1);
	check_sums(&st, rd);
	assert_true(st.faults > 0);
	if (flags & HALITE_RESTORE_TRACK_ACCESS) {
		/* Only blocks of the anonymous region are staged. */
		uint64_t anon = halite_reader_region(rd, 1)->mb_count;

		assert_true(st.mb_staged <= anon);
	}
	for (uint32_t i = 0; i < img->nreg; i++) {
		assert_int_equal(r_uffd_registered(getpid(), (uintptr_t)mem.host[i], mem.len[i]), 0);
		assert_memory_equal(mem.host[i], img->snap + img->off[i], mem.len[i]);
	}
	if (trace) {
		check_learn_trace(trace, rd, img->hp);
		unlink(trace);
		free(trace);
	}
	halite_restore_free(r);
	halite_reader_free(rd);
	mem_unmap(&mem);
}

static void test_exact(void **state)
{
	static const struct {
		int codec;
		uint32_t lb_size;
		bool shuffle;
		unsigned flags;
	} runs[] = {
		{ HALITE_CODEC_LZ4, 65536, false, 0 },
		{ HALITE_CODEC_LZ4, 65536, false, HALITE_RESTORE_NO_PREFETCH },
		{ HALITE_CODEC_ZSTD, 16384, true, 0 },
		{ HALITE_CODEC_ZSTD, 16384, true, HALITE_RESTORE_NO_PREFETCH |
						     HALITE_RESTORE_NO_READAHEAD },
		{ HALITE_CODEC_NONE, 32768, true, HALITE_RESTORE_TRACK_ACCESS },
		{ HALITE_CODEC_ZLIB, 65536, false, 0 },
		/* Until done: the visitors touch every page, so every LB is read. */
		{ HALITE_CODEC_LZ4, 16384, true, HALITE_RESTORE_LEARN },
	};
	char *path = tmp_path("exact.hlt");
	struct image img;

	(void)state;
	make_image(&img, HP, 16, (1u << 20) + PAGE, false, t_rand(&g_seed));
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		char what[96];

		snprintf(what, sizeof(what), "%s, %u KiB LBs, %s, flags 0x%x",
			 halite_codec_name(runs[i].codec), runs[i].lb_size >> 10,
			 runs[i].shuffle ? "shuffled" : "physical", runs[i].flags);
		write_image(path, &img, runs[i].codec, runs[i].lb_size, runs[i].shuffle,
			    t_rand(&g_seed));
		restore_exact(path, &img, runs[i].flags, what);
	}
	free_image(&img);
	unlink(path);
	free(path);
}

/* One 1 GiB page: works the same, one fault waiting for the whole page. */
static void test_exact_1g(void **state)
{
	char *path = tmp_path("gib.hlt");
	struct image img;
	long old = read_long(GIB_SYSFS "nr_hugepages");

	(void)state;
	if (read_long(GIB_SYSFS "free_hugepages") < 1 &&
	    (old < 0 || !write_long(GIB_SYSFS "nr_hugepages", old + 1) ||
	     read_long(GIB_SYSFS "free_hugepages") < 1)) {
		if (old >= 0)
			write_long(GIB_SYSFS "nr_hugepages", old);
		fprintf(stderr, "no 1 GiB huge page to be had: skipped\n");
		skip();
	}
	make_image(&img, 1ull << 30, 1, 0, true, t_rand(&g_seed));
	write_image(path, &img, HALITE_CODEC_LZ4, 65536, true, t_rand(&g_seed));
	/*
	 * Without the prefetcher: it would install the one page by itself when
	 * the visitors are slow to start (a loaded host), and the test is of
	 * the fault path assembling a 1 GiB page (faults > 0).
	 */
	restore_exact(path, &img, HALITE_RESTORE_NO_PREFETCH,
		      "one 1 GiB page, 1 block in 64 written, no prefetch");
	free_image(&img);
	unlink(path);
	free(path);
	if (old >= 0)
		write_long(GIB_SYSFS "nr_hugepages", old);
}

/* ---------------------------------------------------------------------- */
/* counts: exact, touch by touch                                            */

struct toucher {
	pthread_t thr;
	_Atomic pid_t tid;
	_Atomic uint64_t addr; /* 0: nothing to do */
	_Atomic int quit;
};

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
		(void)*(volatile uint8_t *)(uintptr_t)a;
		atomic_store(&t->addr, 0);
	}
	return NULL;
}

static void toucher_start(struct toucher *t)
{
	memset(t, 0, sizeof(*t));
	assert_int_equal(pthread_create(&t->thr, NULL, toucher_main, t), 0);
	while (!atomic_load(&t->tid))
		r_sleep_us(50);
}

static void toucher_do(struct toucher *t, uint64_t addr)
{
	atomic_store(&t->addr, addr);
	for (uint64_t t0 = r_now_ms(); atomic_load(&t->addr); r_sleep_us(20))
		if (r_now_ms() - t0 > 10000)
			fail_msg("the touch of 0x%" PRIx64 " did not return", addr);
}

static void toucher_stop(struct toucher *t)
{
	atomic_store(&t->quit, 1);
	pthread_join(t->thr, NULL);
}

/* What the engine must have done so far, from the file's maps. */
struct model {
	struct halite_reader *rd;
	uint64_t nmb, nlb, nhp, mbs_per_hp;
	uint8_t *stored, *written, *lb_read, *in;
	uint64_t *lb;
	struct {
		uint64_t faults, zero, vcpu, lb_demand, mb_fault, mb_pool;
	} e;
};

static void model_init(struct model *m, struct halite_reader *rd, uint64_t nhp)
{
	memset(m, 0, sizeof(*m));
	m->rd = rd;
	m->nmb = halite_reader_info(rd)->mb_count;
	m->nlb = halite_reader_info(rd)->lb_count;
	m->nhp = nhp;
	m->mbs_per_hp = HP / MBS;
	m->stored = calloc(m->nmb, 1);
	m->written = calloc(m->nmb, 1);
	m->lb = calloc(m->nmb, sizeof(uint64_t));
	m->lb_read = calloc(m->nlb, 1);
	m->in = calloc(nhp, 1);
	for (uint64_t mb = 0; mb < m->nmb; mb++) {
		struct halite_mb_loc loc;

		assert_int_equal(halite_reader_mb_lookup(rd, mb, &loc), 0);
		m->stored[mb] = loc.state == HALITE_MB_STORED;
		m->lb[mb] = loc.lb;
	}
}

static void model_free(struct model *m)
{
	free(m->stored);
	free(m->written);
	free(m->lb);
	free(m->lb_read);
	free(m->in);
}

static bool model_complete(const struct model *m, uint64_t hp, bool *any)
{
	bool all = true;

	*any = false;
	for (uint64_t mb = hp * m->mbs_per_hp; mb < (hp + 1) * m->mbs_per_hp; mb++)
		if (m->stored[mb]) {
			*any = true;
			all &= m->written[mb];
		}
	return all;
}

static bool model_all_read(const struct model *m)
{
	for (uint64_t lb = 0; lb < m->nlb; lb++)
		if (!m->lb_read[lb])
			return false;
	return true;
}

/* A touch of huge page @hp: the fault, the reads of its LBs, what completes. */
static void model_touch(struct model *m, uint64_t hp, bool vcpu)
{
	bool any;

	if (m->in[hp])
		return; /* mapped: no fault */
	m->e.faults++;
	m->e.vcpu += vcpu;
	m->in[hp] = 1;
	model_complete(m, hp, &any);
	if (!any) {
		m->e.zero++;
		return;
	}
	for (uint64_t mb = hp * m->mbs_per_hp; mb < (hp + 1) * m->mbs_per_hp; mb++) {
		const uint64_t *mbs;
		uint32_t n;

		if (!m->stored[mb] || m->written[mb])
			continue;
		/* A quiet engine has written every block of the LBs it read. */
		assert_false(m->lb_read[m->lb[mb]]);
		m->lb_read[m->lb[mb]] = 1;
		m->e.lb_demand++;
		assert_int_equal(halite_reader_lb_members(m->rd, m->lb[mb], &mbs, &n), 0);
		for (uint32_t i = 0; i < n; i++) {
			m->written[mbs[i]] = 1;
			if (mbs[i] / m->mbs_per_hp == hp)
				m->e.mb_fault++;
			else
				m->e.mb_pool++;
		}
	}
	/* Pages whose last block the pool wrote are complete too. */
	for (uint64_t k = 0; k < m->nhp; k++)
		if (!m->in[k] && model_complete(m, k, &any) && any)
			m->in[k] = 1;
}

static const char *model_differs(struct model *m, struct halite_restore *r, const uint8_t *host,
				 char *buf, size_t len)
{
	struct halite_restore_stats st;

	halite_restore_stats(r, &st);
#define SAME(field, want)                                                                    \
	if (st.field != (want)) {                                                            \
		snprintf(buf, len, #field " %" PRIu64 ", expected %" PRIu64, st.field,       \
			 (uint64_t)(want));                                                  \
		return buf;                                                                  \
	}
	SAME(faults, m->e.faults);
	SAME(faults_zero, m->e.zero);
	SAME(faults_cached, 0);
	SAME(faults_vcpu, m->e.vcpu);
	SAME(lb_demand, m->e.lb_demand);
	SAME(lb_prefetch, 0);
	SAME(mb_fault, m->e.mb_fault);
	SAME(mb_pool, m->e.mb_pool);
	SAME(mb_prefetch, 0);
#undef SAME
	/* Mapped for the guest exactly when complete: all of the page, or none of it. */
	for (uint64_t k = 0; k < m->nhp; k++) {
		long n = r_pages_present(getpid(), (uintptr_t)host + k * HP, HP, NULL);

		if (n != (m->in[k] ? (long)(HP / PAGE) : 0)) {
			snprintf(buf, len, "huge page %" PRIu64 ": %ld of its 4 KiB pages mapped, "
				 "expected %s", k, n, m->in[k] ? "all" : "none");
			return buf;
		}
	}
	return NULL;
}

static void model_settle(struct model *m, struct halite_restore *r, const uint8_t *host,
			 const char *when)
{
	char buf[256];
	const char *d;
	uint64_t t0 = r_now_ms();

	while ((d = model_differs(m, r, host, buf, sizeof(buf))) && r_now_ms() - t0 < 10000)
		r_sleep_us(200);
	if (d)
		fail_msg("%s: %s", when, d);
}

static void run_counts(bool track)
{
	const uint64_t nhp = 12;
	char *path = tmp_path("counts.hlt");
	struct image img;
	struct mem mem;
	struct model m;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_reader *rd;
	struct halite_restore_stats st;
	struct toucher tv, to;
	uint64_t order[16], seed = t_rand(&g_seed);
	pid_t vtid;
	char when[96];

	fprintf(stderr, "counts%s\n", track ? ", TRACK_ACCESS" : "");
	assert_true(huge_pages((long)nhp + 2));
	make_image(&img, HP, nhp, 0, false, seed);
	/* Small LBs, shuffled: an LB holds blocks of several huge pages. */
	write_image(path, &img, HALITE_CODEC_LZ4, 16384, true, seed);
	assert_int_equal(halite_reader_open(&rd, path, NULL), 0);
	assert_int_equal(mem_map_try(&mem, &img), 0);
	mem_regions(&mem, &img, reg);
	model_init(&m, rd, nhp);
	toucher_start(&tv);
	toucher_start(&to);
	vtid = atomic_load(&tv.tid);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD |
		  (track ? HALITE_RESTORE_TRACK_ACCESS : 0);
	o.vcpu_tids = &vtid;
	o.nvcpus = 1;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	model_settle(&m, r, mem.host[0], "after start");
	for (uint64_t i = 0; i < nhp; i++)
		order[i] = i;
	for (uint64_t i = nhp; i > 1; i--) {
		uint64_t j = t_rand(&seed) % i, t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	for (uint64_t i = 0; i < nhp; i++) {
		uint64_t hp = order[i];
		bool vcpu = t_rand(&seed) % 2;
		uint64_t off = hp * HP + (t_rand(&seed) % (HP / PAGE)) * PAGE + t_rand(&seed) % PAGE;

		toucher_do(vcpu ? &tv : &to, (uintptr_t)mem.host[0] + off);
		model_touch(&m, hp, vcpu);
		snprintf(when, sizeof(when), "touch %" PRIu64 " (huge page %" PRIu64 ", %s)", i, hp,
			 vcpu ? "vCPU" : "other thread");
		model_settle(&m, r, mem.host[0], when);
		if (model_all_read(&m))
			break; /* done: the ranges are unregistered, nothing faults any more */
		if (t_rand(&seed) % 3 == 0) {
			/* A page in already: no fault. */
			toucher_do(&to, (uintptr_t)mem.host[0] + hp * HP + HP - 8);
			model_settle(&m, r, mem.host[0], "a touch of a page in");
		}
	}
	assert_int_equal(halite_restore_wait(r, 10000), 0);
	halite_restore_stats(r, &st);
	fprintf(stderr, "  %" PRIu64 " faults (%" PRIu64 " zero, %" PRIu64 " vCPU), %" PRIu64
		" LBs; MBs %" PRIu64 " fault + %" PRIu64 " pool + %" PRIu64 " zero\n", st.faults,
		st.faults_zero, st.faults_vcpu, st.lb_demand, st.mb_fault, st.mb_pool, st.mb_zero);
	check_sums(&st, rd);
	assert_int_equal(st.faults, m.e.faults);
	assert_int_equal(st.faults_zero, m.e.zero);
	assert_int_equal(st.faults_vcpu, m.e.vcpu);
	assert_int_equal(st.lb_demand, m.e.lb_demand);
	assert_int_equal(st.mb_fault, m.e.mb_fault);
	assert_int_equal(st.mb_pool, m.e.mb_pool);
	assert_int_equal(st.mb_staged, 0);
	assert_true(st.vm_access_pct < 0);
	assert_true(st.fault_p50_ns > 0 && st.fault_p50_ns <= st.fault_p99_ns);
	/* Zero pages never faulted are holes: unmapped until read after the end. */
	assert_memory_equal(mem.host[0], img.snap, mem.len[0]);
	toucher_stop(&tv);
	toucher_stop(&to);
	halite_restore_free(r);
	model_free(&m);
	halite_reader_free(rd);
	mem_unmap(&mem);
	free_image(&img);
	unlink(path);
	free(path);
}

static void test_counts(void **state)
{
	(void)state;
	run_counts(false);
	run_counts(true);
}

/* ---------------------------------------------------------------------- */
/* corrupt: the huge page never reaches the guest                           */

struct fail_plan {
	const char *path;
	const struct image *img;
	uint64_t prev_hp, bad_hp, bad_lb;
	uint64_t early_mb; /* a block of bad_hp in the LB of prev_hp's last block */
};

struct fail_res {
	int phase, setup_err, ret, prev_ok, early_in_cache, returned_at_check;
	char tstate;
	char msg[512];
	struct halite_restore_stats st;
	long bad_present, prev_present;
	struct toucher1 t;
};

/* Is block @mb of the image in the file's page cache (pread: a hole reads zeros)? */
static bool in_cache(int fd, const struct image *img, uint64_t mb)
{
	uint8_t buf[MBS];

	return pread(fd, buf, MBS, (off_t)(mb * MBS)) == MBS && !memcmp(buf, img->snap + mb * MBS,
									 MBS);
}

/*
 * The child: restore here; read huge page prev_hp whole, whose last LB
 * also brings the first blocks of bad_hp into bad_hp's page (the pool
 * writes them: the page is being assembled); then a thread touches bad_hp,
 * whose bad LB fails: the restore fails, the thread stays blocked, the page
 * is not mapped. Then free: the thread must die of SIGSEGV.
 */
static void __attribute__((noreturn)) corrupt_child(const struct fail_plan *fp,
						    struct fail_res *res)
{
	const struct image *img = fp->img;
	struct mem mem;
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct r_log log;
	pthread_t thr;

	signal(SIGSEGV, SIG_DFL); /* sanitizers: let it kill the process */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	r_log_init(&log, true);
	res->setup_err = mem_map_try(&mem, img);
	if (res->setup_err)
		_exit(3);
	mem_regions(&mem, img, reg);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	o.log = r_log_fn;
	o.log_ctx = &log;
	o.log_level = HALITE_LOG_WARN;
	res->setup_err = halite_restore_open(&r, fp->path, reg, 1, &o);
	if (!res->setup_err)
		res->setup_err = halite_restore_start(r);
	if (res->setup_err)
		_exit(3);
	res->phase = 1;
	res->prev_ok = !memcmp(mem.host[0] + fp->prev_hp * HP, img->snap + fp->prev_hp * HP, HP);
	for (uint64_t t0 = r_now_ms(); !in_cache(mem.fd, img, fp->early_mb) &&
	     r_now_ms() - t0 < 5000; r_sleep_us(1000))
		;
	res->early_in_cache = in_cache(mem.fd, img, fp->early_mb);
	res->phase = 2;
	res->t.addr = mem.host[0] + fp->bad_hp * HP + 40;
	if (pthread_create(&thr, NULL, touch1_main, &res->t))
		_exit(4);
	res->ret = halite_restore_wait(r, 20000);
	snprintf(res->msg, sizeof(res->msg), "%s", halite_restore_errmsg(r));
	halite_restore_stats(r, &res->st);
	res->phase = 3;
	r_sleep_us(500000);
	res->returned_at_check = atomic_load(&res->t.returned);
	res->tstate = r_thread_state(getpid(), atomic_load(&res->t.tid));
	res->bad_present = r_pages_present(getpid(), (uintptr_t)mem.host[0] + fp->bad_hp * HP, HP,
					   NULL);
	res->prev_present = r_pages_present(getpid(), (uintptr_t)mem.host[0] + fp->prev_hp * HP,
					    HP, NULL);
	/* Still there, in the page cache: assembled in part, never shown. */
	res->early_in_cache &= in_cache(mem.fd, img, fp->early_mb);
	res->phase = 4;
	halite_restore_free(r);
	r_sleep_us(10000000);
	res->phase = 5; /* the blocked thread was not killed */
	_exit(0);
}

/*
 * A huge page k (1 <= k < @nhp) whose first stored block shares an LB with
 * page k - 1's last one, and an LB holding blocks of page k alone: the plan.
 */
static bool plan_corrupt(struct halite_reader *rd, uint64_t nhp, struct fail_plan *fp)
{
	const uint64_t per = HP / MBS;

	for (uint64_t k = 1; k < nhp; k++) {
		struct halite_mb_loc loc, first = { 0 };
		uint64_t last = UINT64_MAX, fmb = UINT64_MAX;

		for (uint64_t mb = (k - 1) * per; mb < k * per; mb++) {
			assert_int_equal(halite_reader_mb_lookup(rd, mb, &loc), 0);
			if (loc.state == HALITE_MB_STORED)
				last = mb;
		}
		for (uint64_t mb = k * per; mb < (k + 1) * per && fmb == UINT64_MAX; mb++) {
			assert_int_equal(halite_reader_mb_lookup(rd, mb, &first), 0);
			if (first.state == HALITE_MB_STORED)
				fmb = mb;
		}
		if (last == UINT64_MAX || fmb == UINT64_MAX)
			continue;
		assert_int_equal(halite_reader_mb_lookup(rd, last, &loc), 0);
		if (loc.lb != first.lb)
			continue;
		*fp = (struct fail_plan){ .prev_hp = k - 1, .bad_hp = k, .early_mb = fmb,
					  .bad_lb = UINT64_MAX };
		for (uint64_t mb = fmb + 1; mb < (k + 1) * per; mb++) {
			const uint64_t *mbs;
			uint32_t n;

			assert_int_equal(halite_reader_mb_lookup(rd, mb, &loc), 0);
			if (loc.state != HALITE_MB_STORED || loc.lb == first.lb)
				continue;
			assert_int_equal(halite_reader_lb_members(rd, loc.lb, &mbs, &n), 0);
			if (mbs[0] / per == k && mbs[n - 1] / per == k) {
				fp->bad_lb = loc.lb;
				return true;
			}
		}
	}
	return false;
}

/*
 * An image of @nhp huge pages written to @path (@codec, 32 KiB LBs) that has
 * such a plan (a random one has, nearly always: up to 20 tries); its reader
 * open in *@rd.
 */
static void image_with_plan(struct image *img, const char *path, int codec, uint64_t nhp,
			    struct halite_reader **rd, struct fail_plan *fp)
{
	int tries = 0;

	do {
		make_image(img, HP, nhp, 0, false, t_rand(&g_seed));
		write_image(path, img, codec, 32768, false, 0);
		assert_int_equal(halite_reader_open(rd, path, NULL), 0);
		if (plan_corrupt(*rd, nhp, fp))
			return;
		halite_reader_free(*rd);
		free_image(img);
	} while (++tries < 20);
	fail_msg("no image of %llu huge pages with a corruptible LB in 20 tries",
		 (unsigned long long)nhp);
}

static void test_corrupt_lb(void **state)
{
	const uint64_t nhp = 6;
	char *good = tmp_path("good.hlt"), *bad = tmp_path("corrupt.hlt");
	struct fail_res *res = r_shared_alloc(sizeof(*res));
	struct fail_plan fp;
	struct halite_reader *rd;
	struct halite_mb_loc loc;
	struct halite_lb_info li;
	struct image img;
	const uint64_t *mbs;
	uint32_t n;
	uint64_t t0;
	int st = 0;
	pid_t pid;

	(void)state;
	assert_true(huge_pages((long)nhp + 2));
	image_with_plan(&img, good, HALITE_CODEC_ZSTD, nhp, &rd, &fp);
	fp.path = bad;
	fp.img = &img;
	/* One byte of the stored bytes of the bad LB's first block. */
	assert_int_equal(halite_reader_lb_info(rd, fp.bad_lb, &li), 0);
	assert_int_equal(halite_reader_lb_members(rd, fp.bad_lb, &mbs, &n), 0);
	assert_int_equal(halite_reader_mb_lookup(rd, mbs[0], &loc), 0);
	assert_int_equal(r_copy_file(good, bad), 0);
	assert_int_equal(r_flip_byte(bad, li.offset + loc.offset + loc.length / 2, 0x10), 0);
	fprintf(stderr, "corrupt LB %" PRIu64 " of huge page %" PRIu64 "\n", fp.bad_lb, fp.bad_hp);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid)
		corrupt_child(&fp, res);
	for (t0 = r_now_ms(); waitpid(pid, &st, WNOHANG) != pid; r_sleep_us(10000))
		if (r_now_ms() - t0 > 45000) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("the child hung in phase %d", res->phase);
		}
	if (res->setup_err)
		fail_msg("the child's set-up failed: %s", halite_strerror(res->setup_err));
	fprintf(stderr, "  wait: %s; \"%s\"; %" PRIu64 " retries; thread state %c; %ld 4 KiB "
		"pages of the huge page mapped; a block of it in the page cache: %d\n",
		halite_strerror(res->ret), res->msg, res->st.lb_retries, res->tstate,
		res->bad_present, res->early_in_cache);
	assert_true(res->prev_ok);
	assert_int_equal(res->phase, 4);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
		fail_msg("after halite_restore_free() the blocked thread's process %s %d, not "
			 "SIGSEGV", WIFSIGNALED(st) ? "died of signal" : "exited with",
			 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	assert_int_equal(res->ret, -HALITE_E_LB_CHECKSUM);
	assert_int_equal(res->st.error, res->ret);
	if (!r_names_lb(res->msg, fp.bad_lb))
		fail_msg("the message \"%s\" does not name locality block %" PRIu64, res->msg,
			 fp.bad_lb);
	assert_int_equal(res->st.lb_retries, 2);
	/* Assembled in part (the page cache holds a block of it), never mapped. */
	assert_true(res->early_in_cache);
	assert_int_equal(res->bad_present, 0);
	assert_int_equal(res->prev_present, (long)(HP / PAGE));
	assert_int_equal(res->returned_at_check, 0);
	assert_int_equal(atomic_load(&res->t.returned), 0);
	assert_true(res->tstate == 'S' || res->tstate == 'D');
	r_shared_free(res, sizeof(*res));
	halite_reader_free(rd);
	free_image(&img);
	unlink(good);
	unlink(bad);
	free(good);
	free(bad);
}

/* ---------------------------------------------------------------------- */
/* punch: hugetlbfs cannot refuse a hole punched during the restore         */

/*
 * A huge page punched out once in reads zeros (what a discard means); one
 * punched out while being assembled comes in with zeros where the blocks
 * written before the punch were, the snapshot's bytes elsewhere: never a
 * byte that was not verified. The restore completes.
 */
static void test_punch(void **state)
{
	const uint64_t nhp = 6;
	char *path = tmp_path("punch.hlt");
	struct halite_restore_region reg[MAXREG];
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct halite_reader *rd;
	struct fail_plan fp;
	struct toucher t;
	struct image img;
	struct mem mem;
	uint64_t k, first;

	(void)state;
	assert_true(huge_pages((long)nhp + 4));
	image_with_plan(&img, path, HALITE_CODEC_LZ4, nhp, &rd, &fp);
	assert_int_equal(mem_map_try(&mem, &img), 0);
	mem_regions(&mem, &img, reg);
	toucher_start(&t);
	o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	/* Page prev_hp in; its last LB brings the first blocks of the next into its page. */
	toucher_do(&t, (uintptr_t)mem.host[0] + fp.prev_hp * HP);
	for (uint64_t t0 = r_now_ms(); !in_cache(mem.fd, &img, fp.early_mb) &&
	     r_now_ms() - t0 < 5000; r_sleep_us(1000))
		;
	assert_true(in_cache(mem.fd, &img, fp.early_mb));
	assert_int_equal(r_pages_present(getpid(), (uintptr_t)mem.host[0] + fp.bad_hp * HP, HP,
					 NULL), 0);
	/* Both punched out of the file. */
	assert_int_equal(fallocate(mem.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				   (off_t)(fp.prev_hp * HP), (off_t)(2 * HP)), 0);
	toucher_do(&t, (uintptr_t)mem.host[0] + fp.prev_hp * HP + 8);
	toucher_do(&t, (uintptr_t)mem.host[0] + fp.bad_hp * HP + HP - 8);
	halite_restore_stats(r, &st);
	assert_false(st.error);
	for (k = 0; k < nhp; k++)
		if (k != fp.prev_hp && k != fp.bad_hp)
			toucher_do(&t, (uintptr_t)mem.host[0] + k * HP);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	halite_restore_stats(r, &st);
	check_sums(&st, rd);
	/* The page in before the punch: zeros. */
	assert_int_equal(r_pages_present(getpid(), (uintptr_t)mem.host[0] + fp.prev_hp * HP, HP,
					 NULL), (long)(HP / PAGE));
	for (uint64_t i = 0; i < HP; i++)
		if (mem.host[0][fp.prev_hp * HP + i])
			fail_msg("byte %" PRIu64 " of the page punched out once in is not zero", i);
	/* The page being assembled: each block the snapshot's, or zeros (written before). */
	first = fp.bad_hp * HP / MBS;
	for (uint64_t mb = first; mb < first + HP / MBS; mb++) {
		const uint8_t *b = mem.host[0] + mb * MBS;
		bool zero = true;

		for (uint32_t i = 0; i < MBS && zero; i++)
			zero = !b[i];
		if (!zero && memcmp(b, img.snap + mb * MBS, MBS))
			fail_msg("block %" PRIu64 " is neither the snapshot's nor zeros", mb);
		if (mb == fp.early_mb && !zero)
			fail_msg("block %" PRIu64 ", written before the punch, is back", mb);
	}
	/* Every other page exact. */
	for (k = 0; k < nhp; k++)
		if (k != fp.prev_hp && k != fp.bad_hp)
			assert_memory_equal(mem.host[0] + k * HP, img.snap + k * HP, HP);
	toucher_stop(&t);
	halite_restore_free(r);
	halite_reader_free(rd);
	mem_unmap(&mem);
	free_image(&img);
	unlink(path);
	free(path);
}

/* ---------------------------------------------------------------------- */
/* attach: another process's memory, its handler killed                     */

struct owner_res {
	/* data_touches: of pages not all zero at the snapshot, so of stored blocks */
	_Atomic uint64_t touches, data_touches, mismatches, passes;
	_Atomic int go, stop;
};

static bool all_zero(const uint8_t *p, size_t len)
{
	return !p[0] && !memcmp(p, p + 1, len - 1);
}

static void *owner_thread(void *arg)
{
	void **a = arg;
	const struct image *img = a[0];
	uint8_t *mem = a[1];
	struct owner_res *res = a[2];
	uint64_t n = img->len / PAGE, s = g_seed ^ (uint64_t)my_tid();

	while (!atomic_load(&res->go))
		r_sleep_us(100);
	for (uint64_t k = 0; k < n; k++) {
		uint64_t p = t_rand(&s) % n;

		if (memcmp(mem + p * PAGE, img->snap + p * PAGE, PAGE))
			atomic_fetch_add(&res->mismatches, 1);
		atomic_fetch_add(&res->touches, 1);
		if (!all_zero(img->snap + p * PAGE, PAGE))
			atomic_fetch_add(&res->data_touches, 1);
	}
	for (uint64_t p = 0; p < n; p++)
		if (memcmp(mem + p * PAGE, img->snap + p * PAGE, PAGE))
			atomic_fetch_add(&res->mismatches, 1);
	atomic_fetch_add(&res->passes, 1);
	return NULL;
}

static void test_attach(void **state)
{
	const uint64_t nhp = 16;
	char *path = tmp_path("attach.hlt");
	struct owner_res *res = r_shared_alloc(sizeof(*res));
	struct halite_restore_region reg;
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct halite_restore_stats st;
	struct image img;
	uint64_t before, t0;
	int sv[2], fd, uffd;
	pid_t owner, handler;
	void *mem;

	(void)state;
	assert_true(huge_pages((long)nhp + 2));
	make_image(&img, HP, nhp, 0, false, t_rand(&g_seed));
	/* Physical order: a fault reads its page's LBs only, so the handler dies mid-way. */
	write_image(path, &img, HALITE_CODEC_LZ4, 32768, false, 0);
	fd = huge_memfd(nhp * HP, 0, &mem);
	assert_true(fd >= 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	owner = fork();
	assert_true(owner >= 0);
	if (!owner) {
		/* The owner: the memory (mapped before the fork) and a userfaultfd made here. */
		pthread_t thr[2];
		void *a[3] = { &img, mem, res };
		int u = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (u < 0 || t_send_fd(sv[1], u))
			_exit(3);
		for (int i = 0; i < 2; i++)
			pthread_create(&thr[i], NULL, owner_thread, a);
		for (int i = 0; i < 2; i++)
			pthread_join(thr[i], NULL);
		while (!atomic_load(&res->stop))
			r_sleep_us(1000);
		_exit(0);
	}
	/* This process never touches the memory: a read would allocate a page. */
	munmap(mem, nhp * HP);
	uffd = t_recv_fd(sv[0]);
	assert_true(uffd >= 0);
	reg = (struct halite_restore_region){ reg_names[0], (uintptr_t)mem, nhp * HP,
					      HALITE_MEM_SHARED, fd, 0 };
	handler = fork();
	assert_true(handler >= 0);
	if (!handler) {
		/* The first handler, with slow reads: it dies with most pages not in. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		o.owner_pid = owner;
		o.owner_uffd = uffd;
		o.read_latency_us = 3000;
		o.flags = HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD;
		if (halite_restore_open(&r, path, &reg, 1, &o) || halite_restore_start(r))
			_exit(3);
		atomic_store(&res->go, 1);
		for (;;)
			pause();
	}
	/*
	 * Touches of data, not only of zero blocks (installed without a read,
	 * and fast): so a stored block is in when the handler dies, which the
	 * take-over must find (mb_present > 0 below).
	 */
	t0 = r_now_ms();
	while (atomic_load(&res->data_touches) < 4 && r_now_ms() - t0 < 20000)
		r_sleep_us(100);
	assert_true(atomic_load(&res->data_touches) >= 4);
	kill(handler, SIGKILL);
	assert_int_equal(waitpid(handler, NULL, 0), handler);
	/* Without a handler the owner's threads block on a page not in: nothing moves. */
	t0 = r_now_ms();
	do {
		before = atomic_load(&res->touches);
		r_sleep_us(500000);
	} while (atomic_load(&res->touches) != before && r_now_ms() - t0 < 10000);
	assert_int_equal(atomic_load(&res->touches), before);
	assert_int_equal(atomic_load(&res->passes), 0);
	fprintf(stderr, "attach: the handler killed after %" PRIu64 " touches\n", before);
	o.owner_pid = owner;
	o.owner_uffd = uffd;
	o.flags = HALITE_RESTORE_ATTACH;
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	halite_restore_stats(r, &st);
	fprintf(stderr, "  %" PRIu64 " blocks were in already, %" PRIu64 " faults after the "
		"take-over\n", st.mb_present, st.faults);
	assert_true(st.done && !st.error);
	assert_int_equal(st.mb_fault + st.mb_pool + st.mb_prefetch + st.mb_zero + st.mb_present,
			 st.mb_total);
	assert_true(st.mb_present > 0 && st.mb_present < st.mb_total - st.mb_zero);
	t0 = r_now_ms();
	while (atomic_load(&res->passes) < 2 && r_now_ms() - t0 < 60000)
		r_sleep_us(1000);
	assert_int_equal(atomic_load(&res->passes), 2);
	assert_int_equal(atomic_load(&res->mismatches), 0);
	halite_restore_free(r);
	atomic_store(&res->stop, 1);
	assert_int_equal(waitpid(owner, NULL, 0), owner);
	close(uffd);
	close(sv[0]);
	close(sv[1]);
	close(fd);
	r_shared_free(res, sizeof(*res));
	free_image(&img);
	unlink(path);
	free(path);
}

/* ---------------------------------------------------------------------- */
/* refused                                                                  */

static void test_refused(void **state)
{
	char *path = tmp_path("refused.hlt");
	struct halite_restore_region reg;
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore *r;
	struct image img;
	char ro[64];
	void *mem;
	int fd, rofd;

	(void)state;
	assert_true(huge_pages(6));
	make_image(&img, HP, 2, 0, false, t_rand(&g_seed));
	write_image(path, &img, HALITE_CODEC_LZ4, 65536, false, 0);
	o.log = r_log_fn;
	o.log_ctx = &g_log;
	o.log_level = HALITE_LOG_WARN;
	g_log.quiet = true;

	/* A huge page in the file already: found, named, refused; nothing registered. */
	fd = huge_memfd(4 * HP, 0, &mem);
	assert_true(fd >= 0);
	assert_int_equal(fallocate(fd, FALLOC_FL_KEEP_SIZE, 3 * HP, HP), 0);
	reg = (struct halite_restore_region){ reg_names[0], (uintptr_t)mem + 2 * HP, 2 * HP,
					      HALITE_MEM_SHARED, fd, 2 * HP };
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), -EEXIST);
	if (!strstr(halite_restore_errmsg(r), "huge page at offset 2097152"))
		fail_msg("the message does not name the page: %s", halite_restore_errmsg(r));
	assert_int_equal(r_uffd_registered(getpid(), (uintptr_t)mem, 4 * HP), 0);
	halite_restore_free(r);
	/* The same file, the other half (empty): restored. */
	reg.host = (uintptr_t)mem;
	reg.fd_offset = 0;
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), 0);
	assert_int_equal(halite_restore_start(r), 0);
	assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
	assert_memory_equal(mem, img.snap, 2 * HP);
	halite_restore_free(r);
	/* Not on a huge page boundary of the file. */
	reg.host = (uintptr_t)mem + 2 * HP;
	reg.fd_offset = PAGE;
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), -EINVAL);
	/* A read-only descriptor: the engine writes the pages through it. */
	snprintf(ro, sizeof(ro), "/proc/self/fd/%d", fd);
	rofd = open(ro, O_RDONLY | O_CLOEXEC);
	assert_true(rofd >= 0);
	reg.fd = rofd;
	reg.fd_offset = 2 * HP;
	assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), -EACCES);
	close(rofd);
	munmap(mem, 4 * HP);
	close(fd);
	/*
	 * Too few huge pages: the guest's mapping reserves none (NORESERVE) and
	 * another file holds all free pages but one. Refused at open, naming the
	 * region, not a SIGBUS later.
	 */
	{
		long avail = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
		int hog = memfd_create("halite-hog", MFD_CLOEXEC | MFD_HUGETLB);
		void *hm = NULL;

		assert_true(avail >= 2 && hog >= 0);
		assert_int_equal(ftruncate(hog, (off_t)((uint64_t)(avail - 1) * HP)), 0);
		if (avail > 1) {
			hm = mmap(NULL, (uint64_t)(avail - 1) * HP, PROT_READ, MAP_SHARED, hog, 0);
			assert_true(hm != MAP_FAILED);
		}
		fd = memfd_create("halite-huge", MFD_CLOEXEC | MFD_HUGETLB);
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, (off_t)(2 * HP)), 0);
		mem = mmap(NULL, 2 * HP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
		assert_true(mem != MAP_FAILED);
		reg = (struct halite_restore_region){ reg_names[0], (uintptr_t)mem, 2 * HP,
						      HALITE_MEM_SHARED, fd, 0 };
		r = NULL;
		assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), -ENOMEM);
		if (!r_log_has(&g_log, "cannot reserve its 2 huge pages"))
			fail_msg("no message names the shortage");
		if (hm)
			munmap(hm, (uint64_t)(avail - 1) * HP);
		close(hog);
		/* With the pages free again: restored. */
		assert_int_equal(halite_restore_open(&r, path, &reg, 1, &o), 0);
		assert_int_equal(halite_restore_start(r), 0);
		assert_int_equal(halite_restore_wait(r, WAIT_MS), 0);
		assert_memory_equal(mem, img.snap, 2 * HP);
		halite_restore_free(r);
		munmap(mem, 2 * HP);
		close(fd);
	}
	g_log.quiet = false;
	free_image(&img);
	unlink(path);
	free(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernel_minor),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_counts),
		cmocka_unit_test(test_exact),
		cmocka_unit_test(test_corrupt_lb),
		cmocka_unit_test(test_punch),
		cmocka_unit_test(test_attach),
		cmocka_unit_test(test_exact_1g),
	};
	struct halite_uffd_caps caps;
	struct statfs sf;
	void *p;
	int ret, fd;

	ret = halite_uffd_probe(&caps);
	if (ret) {
		fprintf(stderr, "userfaultfd unavailable (%s): skipped\n", strerror(-ret));
		return 77;
	}
	if ((caps.features & (UFFD_FEATURE_MINOR_HUGETLBFS | UFFD_FEATURE_MISSING_HUGETLBFS)) !=
	    (UFFD_FEATURE_MINOR_HUGETLBFS | UFFD_FEATURE_MISSING_HUGETLBFS)) {
		fprintf(stderr, "userfaultfd lacks MINOR_HUGETLBFS or MISSING_HUGETLBFS: skipped\n");
		return 77;
	}
	g_seed = t_seed("test_restore_huge");
	r_log_init(&g_log, false);
	if (!huge_pages(PAGES_NEEDED)) {
		fprintf(stderr, "no %d free 2 MiB huge pages and /proc/sys/vm/nr_hugepages not "
			"writable: skipped\n", PAGES_NEEDED);
		if (g_old_nr >= 0)
			write_long("/proc/sys/vm/nr_hugepages", g_old_nr);
		return 77;
	}
	fd = huge_memfd(HP, 0, &p);
	assert_true(fd >= 0 && !fstatfs(fd, &sf) && sf.f_type == HUGETLBFS_MAGIC &&
		    (uint64_t)sf.f_bsize == HP);
	munmap(p, HP);
	close(fd);
	/* HALITE_TEST_FILTER=test_counts runs the matching tests only. */
	if (getenv("HALITE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("HALITE_TEST_FILTER"));
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	if (g_old_nr >= 0)
		write_long("/proc/sys/vm/nr_hugepages", g_old_nr);
	rmdir(t_tmpdir());
	return ret ? 1 : 0;
}
