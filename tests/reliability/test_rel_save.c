// SPDX-License-Identifier: MIT
/*
 * The save engine under what guests and callers really do (issue 12):
 *
 *   busy      a second save of memory a first save is saving: refused with
 *             -EBUSY at arm before anything changes (anonymous and memfd);
 *             every byte of the guest's memory stays, the first save
 *             finishes exactly, and a good older file at the second save's
 *             path survives (item 1; before, the second arm moved the first
 *             save's pages away and its undo dropped the first registration:
 *             the memory read zeros)
 *   failed    a save that fails (an injected write error) over a good older
 *             snapshot leaves that file byte for byte (item 1)
 *   discard   private memory the guest discards during the save: a page of a
 *             block already given back reads zero at once (before: the fault
 *             looped forever, copy_in() stopping at EEXIST on the block's
 *             first page), a whole block too (before: the snapshot's bytes
 *             came back), and a block not yet saved still goes into the file
 *             as it was at the snapshot instant (item 3)
 *   external  another process's private memory (QEMU's default RAM): its pages
 *             move aside inside it (an mremap it runs when asked, as QEMU
 *             does when halite-qemu injects it), the save reads them from
 *             there while the owner's threads write; the file is the snapshot
 *             instant, the owner's memory what its threads wrote, and the pages
 *             moved aside are gone at the end, after a failed save too
 *             (issue 13)
 *   punch     a hole punched in shared memory's file during the save: refused
 *             (the file is append-only while the save needs it) and the save
 *             exact; where it cannot be refused, a punched block not yet saved
 *             fails the save with a message naming where, never zeros in the
 *             file (item 2)
 *
 *   test_rel_save [CASE...]     all cases by default
 *
 * Exit 0 pass, 1 fail, 77 no userfaultfd.
 */
#define _GNU_SOURCE
#include <linux/fs.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>

#include <halite/save.h>

#include "rel.h"
#include "save_test.h"

#define NMB 256u /* 2 MiB of guest memory */
#define LEN ((size_t)NMB * REL_MB)

static uint64_t g_seed;

/* Guest memory with the snapshot's contents: random, every 8th block zero. */
struct guest {
	uint8_t *mem;
	int fd;		  /* memfd, or -1 */
	uint8_t *snap;	  /* what it held at the snapshot instant */
};

static void guest_make(struct guest *g, bool shared)
{
	uint64_t s = g_seed;

	g->fd = -1;
	g->mem = shared ? rel_map_memfd(LEN, &g->fd) : rel_map_anon(LEN);
	g->snap = malloc(LEN);
	REQUIRE(g->snap, "malloc");
	for (uint64_t mb = 0; mb < NMB; mb++) {
		if (mb % 8 == 3)
			memset(g->snap + mb * REL_MB, 0, REL_MB);
		else
			t_fill(g->snap + mb * REL_MB, REL_MB, 70, &s);
	}
	memcpy(g->mem, g->snap, LEN);
}

static void guest_free(struct guest *g)
{
	munmap(g->mem, LEN);
	if (g->fd >= 0)
		close(g->fd);
	free(g->snap);
}

static struct halite_save *save_start(const struct guest *g, const char *path, unsigned flags,
				      bool no_refusal, int *ret)
{
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save_region reg = { "ram", 0, LEN, (uintptr_t)g->mem,
					  g->fd >= 0 ? HALITE_MEM_SHARED : HALITE_MEM_ANON, g->fd,
					  0 };
	struct halite_save *s;

	o.flags = HALITE_SAVE_NO_SYNC | flags;
	*ret = halite_save_create(&s, path, &reg, 1, &o);
	if (*ret)
		return NULL;
	if (no_refusal)
		halite_save_test_no_discard_refusal(s);
	*ret = halite_save_arm(s);
	return s;
}

/* Every block of @path against @want (LEN bytes): the count of blocks that differ. */
static uint64_t file_diff(const char *path, const uint8_t *want)
{
	struct halite_reader *rd;
	uint8_t buf[REL_MB];
	uint64_t bad = 0;
	int ret = halite_reader_open(&rd, path, NULL);

	if (ret) {
		printf("  %s: %s\n", path, halite_strerror(ret));
		return NMB;
	}
	for (uint64_t mb = 0; mb < NMB; mb++)
		if (halite_reader_read_mb(rd, mb, buf) || memcmp(buf, want + mb * REL_MB, REL_MB))
			bad++;
	halite_reader_free(rd);
	return bad;
}

/* Touch (read) every page from a thread; false if one never returned. */
static bool touch_all(uint8_t *mem)
{
	uint64_t v;

	for (size_t off = 0; off < LEN; off += REL_PAGE) {
		if (!rel_read_word(mem + off, &v, 10000)) {
			printf("  a read at offset %zu never returned\n", off);
			return false;
		}
	}
	return true;
}

static size_t diff_count(const uint8_t *a, const uint8_t *b, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++)
		n += a[i] != b[i];
	return n;
}


/* A small, complete snapshot at @path (anything the reader accepts), and its bytes. */
static uint8_t *write_old_file(const char *path, size_t *len)
{
	struct guest g;
	struct halite_save *s;
	uint8_t *bytes = NULL;
	int ret, fd;
	struct stat st;

	guest_make(&g, false);
	memset(g.mem, 0x5a, REL_MB); /* not the guests' content */
	s = save_start(&g, path, 0, false, &ret);
	REQUIRE(!ret, "old file: %s", halite_strerror(ret));
	REQUIRE(!halite_save_wait(s, 60000), "old file: wait");
	halite_save_free(s);
	guest_free(&g);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0 && !fstat(fd, &st), "old file: %s", strerror(errno));
	bytes = malloc((size_t)st.st_size);
	REQUIRE(bytes && read(fd, bytes, (size_t)st.st_size) == st.st_size, "old file: read");
	close(fd);
	*len = (size_t)st.st_size;
	return bytes;
}

static bool file_is(const char *path, const uint8_t *bytes, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	uint8_t *now = malloc(len + 1);
	ssize_t n = fd >= 0 && now ? read(fd, now, len + 1) : -1;
	bool same = n == (ssize_t)len && !memcmp(now, bytes, len);

	if (fd >= 0)
		close(fd);
	free(now);
	return same;
}

/* ---- busy ---- */

static void case_busy(bool shared)
{
	const char *what = shared ? "busy, memfd" : "busy, anonymous";
	char *p1 = rel_path("busy1-%d.hlt", shared), *p2 = rel_path("busy2-%d.hlt", shared);
	struct halite_save *s1, *s2;
	struct guest g;
	uint8_t *old;
	size_t oldlen;
	int ret;

	printf("%s: a second save of memory being saved\n", what);
	old = write_old_file(p2, &oldlen);
	guest_make(&g, shared);
	/* Only faults save: the first save runs until this test touches everything. */
	s1 = save_start(&g, p1, HALITE_SAVE_NO_BACKGROUND, false, &ret);
	REQUIRE(!ret, "%s: first save: %s", what, halite_strerror(ret));
	s2 = save_start(&g, p2, 0, false, &ret);
	CHECK(ret == -EBUSY, "%s: second arm %d (%s), want -EBUSY", what, ret, halite_strerror(ret));
	CHECK(s2 && strstr(halite_save_errmsg(s2), "already registered"),
	      "%s: message '%s'", what, s2 ? halite_save_errmsg(s2) : "");
	halite_save_free(s2);
	CHECK(file_is(p2, old, oldlen), "%s: the older file at the second save's path changed",
	      what);
	/* The guest's memory, every byte, through the first save's faults. */
	CHECK(touch_all(g.mem), "%s: touching memory", what);
	CHECK(!memcmp(g.mem, g.snap, LEN), "%s: %zu bytes of guest memory changed", what,
	      diff_count(g.mem, g.snap, LEN));
	ret = halite_save_wait(s1, 60000);
	CHECK(ret == 0, "%s: first save %d: %s", what, ret, halite_save_errmsg(s1));
	halite_save_free(s1);
	CHECK(file_diff(p1, g.snap) == 0, "%s: the first save's file differs in %llu blocks", what,
	      (unsigned long long)file_diff(p1, g.snap));
	guest_free(&g);
	free(old);
	unlink(p1);
	unlink(p2);
	free(p1);
	free(p2);
}

/* ---- failed ---- */

static void case_failed(void)
{
	char *p = rel_path("failed.hlt");
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save *s;
	struct guest g;
	uint8_t *old;
	size_t oldlen;
	struct halite_save_region reg;
	int ret;

	printf("failed: a save that fails over a good older file\n");
	old = write_old_file(p, &oldlen);
	guest_make(&g, false);
	reg = (struct halite_save_region){ "ram", 0, LEN, (uintptr_t)g.mem, HALITE_MEM_ANON, -1, 0 };
	o.flags = HALITE_SAVE_NO_SYNC;
	REQUIRE(!halite_save_create(&s, p, &reg, 1, &o), "create");
	halite_save_test_fail_writes(s, 3, ENOSPC);
	REQUIRE(!halite_save_arm(s), "arm");
	ret = halite_save_wait(s, 60000);
	CHECK(ret == -ENOSPC, "failed: wait %d, want -ENOSPC", ret);
	halite_save_free(s);
	CHECK(file_is(p, old, oldlen), "failed: the older file did not survive the failed save");
	CHECK(!memcmp(g.mem, g.snap, LEN), "failed: guest memory changed");
	guest_free(&g);
	free(old);
	unlink(p);
	free(p);
}

/* ---- discard ---- */

static void case_discard(void)
{
	char *p = rel_path("discard.hlt");
	const size_t a = 10 * REL_MB, b = 20 * REL_MB, c = 30 * REL_MB;
	struct halite_save_stats st;
	struct halite_save *s;
	struct guest g;
	uint8_t *after;
	uint64_t v;
	int ret;

	printf("discard: private memory the guest discards during the save\n");
	guest_make(&g, false);
	s = save_start(&g, p, HALITE_SAVE_NO_BACKGROUND, false, &ret);
	REQUIRE(!ret, "discard: arm: %s", halite_strerror(ret));
	/* Block a: given back by a fault, then its second page discarded. */
	CHECK(rel_read_word(g.mem + a, &v, 10000) && !memcmp(&v, g.snap + a, 8), "discard: a before");
	REQUIRE(!madvise(g.mem + a + REL_PAGE, REL_PAGE, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(g.mem + a + REL_PAGE, &v, 5000),
	      "discard: a read of a discarded page of a given-back block never returned");
	CHECK(v == 0, "discard: block a's discarded page reads %llx", (unsigned long long)v);
	/* Block b: given back, then wholly discarded. */
	CHECK(rel_read_word(g.mem + b, &v, 10000) && !memcmp(&v, g.snap + b, 8), "discard: b before");
	REQUIRE(!madvise(g.mem + b, REL_MB, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(g.mem + b + REL_PAGE, &v, 5000) && v == 0,
	      "discard: block b after its discard: %llx", (unsigned long long)v);
	/* Block c: not saved yet when discarded. */
	REQUIRE(!madvise(g.mem + c, REL_MB, MADV_DONTNEED), "madvise");
	CHECK(rel_read_word(g.mem + c, &v, 5000) && v == 0, "discard: block c after its discard");
	/* The rest by faults; then the file must be the snapshot instant, all of it. */
	CHECK(touch_all(g.mem), "discard: touching memory");
	ret = halite_save_wait(s, 60000);
	CHECK(ret == 0, "discard: save %d: %s", ret, halite_save_errmsg(s));
	halite_save_stats(s, &st);
	halite_save_free(s);
	CHECK(file_diff(p, g.snap) == 0, "discard: the file differs in %llu blocks",
	      (unsigned long long)file_diff(p, g.snap));
	after = malloc(LEN);
	REQUIRE(after, "malloc");
	memcpy(after, g.snap, LEN);
	memset(after + a + REL_PAGE, 0, REL_PAGE);
	memset(after + b, 0, REL_MB);
	memset(after + c, 0, REL_MB);
	CHECK(!memcmp(g.mem, after, LEN), "discard: guest memory after the save");
	CHECK(rel_nonzero(g.mem + b, REL_MB) == 0 && rel_nonzero(g.mem + c, REL_MB) == 0,
	      "discard: discarded blocks hold bytes");
	free(after);
	guest_free(&g);
	unlink(p);
	free(p);
}

/* ---- external ---- */

/*
 * The owner: private memory holding the snapshot; two threads that write
 * into it once told to, each keeping what it wrote in a private copy; and
 * a loop that runs what the save's callbacks ask for (mremap, munmap), as
 * QEMU runs what halite-qemu injects.
 */
struct ext_req {
	char op;	/* 'M' remap, 'U' unmap, 'G' go, 'S' stop and check, 'Q' quit */
	uint64_t addr, len, to;
};

struct ext_res {
	int64_t ret;	/* the call's return or -errno; 'S': bytes that differ */
	uint64_t res;
};

struct ext_owner {
	uint8_t *mem;	/* the same address in both processes */
	uint8_t *expect;/* the owner's: what its memory must hold */
	pid_t pid;
	int sock, uffd;
	_Atomic int stop;
	uint64_t aside; /* as the last remap said */
};

struct ext_writer {
	struct ext_owner *ow;
	unsigned idx;
};

static void *ext_write_main(void *arg)
{
	struct ext_writer *w = arg;
	struct ext_owner *ow = w->ow;
	uint64_t s = g_seed ^ (w->idx + 7);

	while (!atomic_load(&ow->stop)) {
		/* Each thread its own half: what one writes, no other does. */
		size_t page = (size_t)(t_rand(&s) % (LEN / REL_PAGE / 2)) + w->idx * LEN / REL_PAGE / 2;
		uint64_t v = t_rand(&s);
		size_t at = page * REL_PAGE + (size_t)(v % (REL_PAGE / 8)) * 8;

		memcpy(ow->mem + at, &v, 8);
		memcpy(ow->expect + at, &v, 8);
	}
	return NULL;
}

static void ext_owner_main(struct ext_owner *ow)
{
	struct ext_writer w[2] = { { ow, 0 }, { ow, 1 } };
	pthread_t thr[2];
	bool going = false;

	for (;;) {
		struct ext_req q;
		struct ext_res a = { 0, 0 };

		if (read(ow->sock, &q, sizeof(q)) != sizeof(q))
			_exit(0);
		if (q.op == 'M') {
			void *p = mremap((void *)(uintptr_t)q.addr, q.len, q.len, MREMAP_MAYMOVE |
					 (q.to ? MREMAP_FIXED : MREMAP_DONTUNMAP),
					 (void *)(uintptr_t)q.to);

			a.ret = p == MAP_FAILED ? -errno : 0;
			a.res = (uintptr_t)p;
		} else if (q.op == 'U') {
			a.ret = munmap((void *)(uintptr_t)q.addr, q.len) ? -errno : 0;
		} else if (q.op == 'G') {
			for (int i = 0; i < 2; i++)
				pthread_create(&thr[i], NULL, ext_write_main, &w[i]);
			going = true;
		} else if (q.op == 'S') {
			atomic_store(&ow->stop, 1);
			for (int i = 0; going && i < 2; i++)
				pthread_join(thr[i], NULL);
			going = false;
			for (size_t i = 0; i < LEN; i++)
				a.ret += ow->mem[i] != ow->expect[i];
		} else {
			_exit(0);
		}
		if (write(ow->sock, &a, sizeof(a)) != sizeof(a))
			_exit(3);
	}
}

static int64_t ext_ask(struct ext_owner *ow, char op, uint64_t addr, uint64_t len, uint64_t to,
		       uint64_t *res)
{
	struct ext_req q = { op, addr, len, to };
	struct ext_res a;

	if (write(ow->sock, &q, sizeof(q)) != sizeof(q) || read(ow->sock, &a, sizeof(a)) !=
	    sizeof(a))
		return -EPIPE;
	if (res)
		*res = a.res;
	return a.ret;
}

static int ext_remap(void *ctx, uint64_t addr, uint64_t len, uint64_t to, uint64_t *res)
{
	struct ext_owner *ow = ctx;
	int64_t ret = ext_ask(ow, 'M', addr, len, to, res);

	if (!ret && !to)
		ow->aside = *res;
	return (int)ret;
}

static int ext_unmap(void *ctx, uint64_t addr, uint64_t len)
{
	return (int)ext_ask(ctx, 'U', addr, len, 0, NULL);
}

static void ext_start(struct ext_owner *ow, const uint8_t *snap)
{
	int sv[2];

	*ow = (struct ext_owner){ .sock = -1, .uffd = -1 };
	ow->mem = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(ow->mem != MAP_FAILED, "mmap");
	madvise(ow->mem, LEN, MADV_NOHUGEPAGE);
	REQUIRE(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), "socketpair");
	ow->pid = fork();
	REQUIRE(ow->pid >= 0, "fork");
	if (!ow->pid) {
		close(sv[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		ow->sock = sv[1];
		memcpy(ow->mem, snap, LEN);
		ow->expect = malloc(LEN);
		if (!ow->expect)
			_exit(3);
		memcpy(ow->expect, snap, LEN);
		/* The owner makes the userfaultfd and keeps its copy, as QEMU does. */
		ow->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (ow->uffd < 0 || rel_send_fd(ow->sock, ow->uffd))
			_exit(3);
		ext_owner_main(ow);
	}
	close(sv[1]);
	ow->sock = sv[0];
	ow->uffd = rel_recv_fd(ow->sock);
	REQUIRE(ow->uffd >= 0, "owner's userfaultfd");
}

static void ext_stop(struct ext_owner *ow)
{
	struct ext_req q = { 'Q', 0, 0, 0 };

	if (write(ow->sock, &q, sizeof(q)) != sizeof(q))
		kill(ow->pid, SIGKILL);
	waitpid(ow->pid, NULL, 0);
	close(ow->sock);
	close(ow->uffd);
	munmap(ow->mem, LEN);
}

/* Is @addr mapped in process @pid? */
static bool mapped_in(pid_t pid, uint64_t addr)
{
	char path[64], line[256];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	while (f && !found && fgets(line, sizeof(line), f)) {
		unsigned long long a, b;

		found = sscanf(line, "%llx-%llx", &a, &b) == 2 && addr >= a && addr < b;
	}
	if (f)
		fclose(f);
	return found;
}

static void case_external(bool fail)
{
	const char *what = fail ? "external, failed" : "external";
	char *p = rel_path("external-%d.hlt", fail);
	HALITE_OPTS(halite_save_opts, o);
	struct halite_save_region reg;
	struct halite_save_stats st;
	struct ext_owner ow;
	struct halite_save *s;
	struct guest g;
	int ret;

	printf("%s: another process's private memory, its pages moved aside inside it%s\n",
	       what, fail ? ", the save failing" : "");
	guest_make(&g, false); /* the snapshot's bytes; the owner holds its own copy */
	ext_start(&ow, g.snap);
	reg = (struct halite_save_region){ "ram", 0, LEN, (uintptr_t)ow.mem, HALITE_MEM_ANON, -1, 0 };
	o.flags = HALITE_SAVE_NO_SYNC;
	o.owner_pid = ow.pid;
	o.owner_uffd = ow.uffd;
	o.remap = ext_remap;
	o.unmap = ext_unmap;
	o.drop_ctx = &ow;
	REQUIRE(!halite_save_create(&s, p, &reg, 1, &o), "%s: create: %s", what,
		halite_save_errmsg(s));
	if (fail)
		halite_save_test_fail_writes(s, 5, EIO);
	ret = halite_save_arm(s);
	REQUIRE(!ret, "%s: arm %d: %s", what, ret, halite_save_errmsg(s));
	CHECK(ow.aside && mapped_in(ow.pid, ow.aside), "%s: the owner's pages were moved aside",
	      what);
	/* The guest runs on: its threads write while the save goes on. */
	REQUIRE(ext_ask(&ow, 'G', 0, 0, 0, NULL) == 0, "go");
	ret = halite_save_wait(s, 60000);
	CHECK(ret == (fail ? -EIO : 0), "%s: save %d (%s)", what, ret, halite_save_errmsg(s));
	halite_save_stats(s, &st);
	halite_save_free(s);
	CHECK(ext_ask(&ow, 'S', 0, 0, 0, NULL) == 0, "%s: the owner's memory is not what its "
	      "threads wrote over the snapshot", what);
	CHECK(!mapped_in(ow.pid, ow.aside), "%s: the pages moved aside are still mapped in the "
	      "owner at 0x%llx", what, (unsigned long long)ow.aside);
	if (!fail) {
		CHECK(st.faults > 0 && st.faults_vcpu + st.faults_other + st.mb_background ==
		      st.mb_saved && st.mb_saved == NMB, "%s: %llu first touches, %llu blocks "
		      "by them and %llu by the background of %llu", what,
		      (unsigned long long)st.faults, (unsigned long long)st.faults_other,
		      (unsigned long long)st.mb_background, (unsigned long long)st.mb_saved);
		CHECK(file_diff(p, g.snap) == 0, "%s: the file differs from the snapshot instant "
		      "in %llu blocks", what, (unsigned long long)file_diff(p, g.snap));
	} else {
		CHECK(access(p, F_OK) && errno == ENOENT, "%s: a file was left at the target", what);
	}
	ext_stop(&ow);
	guest_free(&g);
	unlink(p);
	free(p);
}

/* ---- punch ---- */

static int file_flags(int fd)
{
	int fl = 0;

	ioctl(fd, FS_IOC_GETFLAGS, &fl);
	return fl;
}

static void case_punch_refused(void)
{
	char *p = rel_path("punch.hlt");
	const size_t a = 40 * REL_MB, b = 50 * REL_MB;
	struct halite_save *s;
	struct guest g;
	int ret, r1, e1, r2, e2;

	printf("punch: holes punched in shared memory's file during the save are refused\n");
	guest_make(&g, true);
	s = save_start(&g, p, HALITE_SAVE_NO_BACKGROUND, false, &ret);
	REQUIRE(!ret, "punch: arm: %s", halite_strerror(ret));
	/* As QEMU's ram_block_discard_range(): punch, then madvise. */
	r1 = fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, REL_MB);
	e1 = errno;
	r2 = madvise(g.mem + b, REL_MB, MADV_REMOVE);
	e2 = errno;
	CHECK(r1 == -1 && e1 == EPERM, "punch: fallocate(PUNCH_HOLE) during the save: %d %s", r1,
	      strerror(e1));
	CHECK(r2 == -1 && e2 == EPERM, "punch: madvise(MADV_REMOVE) during the save: %d %s", r2,
	      strerror(e2));
	CHECK(touch_all(g.mem), "punch: touching memory");
	ret = halite_save_wait(s, 60000);
	CHECK(ret == 0, "punch: save %d: %s", ret, halite_save_errmsg(s));
	halite_save_free(s);
	CHECK(file_diff(p, g.snap) == 0, "punch: the file differs in %llu blocks",
	      (unsigned long long)file_diff(p, g.snap));
	CHECK(!memcmp(g.mem, g.snap, LEN), "punch: guest memory changed");
	/* Once the save is over, the VMM may discard again. */
	CHECK(!(file_flags(g.fd) & FS_APPEND_FL), "punch: the file is still append-only");
	CHECK(!fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, REL_MB),
	      "punch: after the save: %s", strerror(errno));
	guest_free(&g);
	unlink(p);
	free(p);
}

static void case_punch_detected(void)
{
	char *p = rel_path("punch2.hlt");
	const size_t a = 40 * REL_MB, done = 60 * REL_MB;
	struct halite_save *s;
	struct rel_touch *t = malloc(sizeof(*t));
	struct guest g;
	uint64_t v;
	int ret;
	char want[64];

	printf("punch: where the file cannot refuse it, a punched block not yet saved fails the "
	       "save\n");
	guest_make(&g, true);
	s = save_start(&g, p, HALITE_SAVE_NO_BACKGROUND, true, &ret);
	REQUIRE(!ret, "punch2: arm: %s", halite_strerror(ret));
	/* Saved first, punched after: no harm, its bytes are in the save. */
	CHECK(rel_read_word(g.mem + done, &v, 10000), "punch2: block done");
	REQUIRE(!fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)done,
			   REL_MB), "fallocate: %s", strerror(errno));
	/* Punched before it was saved, as a balloon would: then the guest touches it. */
	REQUIRE(!fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, REL_MB),
		"fallocate: %s", strerror(errno));
	REQUIRE(!madvise(g.mem + a, REL_MB, MADV_DONTNEED), "madvise");
	/* Its fault fails the save; the thread waits until the save has let go. */
	REQUIRE(t, "malloc");
	rel_touch_start(t, g.mem + a, 0);
	ret = halite_save_wait(s, 60000);
	/* Left allocated if it never returns: the thread still writes into it. */
	if (rel_touch_wait(t, 10000))
		free(t);
	else
		CHECK(false, "punch2: the fault on the punched block never returned");
	CHECK(ret == -ENODATA, "punch2: save %d (%s), want -ENODATA", ret, halite_strerror(ret));
	snprintf(want, sizeof(want), "0x%llx", (unsigned long long)a);
	CHECK(strstr(halite_save_errmsg(s), "discarded") && strstr(halite_save_errmsg(s), want),
	      "punch2: message '%s' (want it to name %s)", halite_save_errmsg(s), want);
	halite_save_free(s);
	CHECK(access(p, F_OK) && errno == ENOENT, "punch2: a file was left at the target");
	/* The guest keeps what it did: its discard, and nothing else changed. */
	CHECK(touch_all(g.mem), "punch2: touching memory after the failed save");
	CHECK(rel_nonzero(g.mem + a, REL_MB) == 0, "punch2: the punched block reads data");
	CHECK(!memcmp(g.mem, g.snap, a) && !memcmp(g.mem + a + REL_MB, g.snap + a + REL_MB,
						  done - a - REL_MB) &&
	      !memcmp(g.mem + done + REL_MB, g.snap + done + REL_MB, LEN - done - REL_MB),
	      "punch2: guest memory outside the punched blocks changed");
	guest_free(&g);
	free(p);
}

int main(int argc, char **argv)
{
	rel_begin("test_rel_save");
	g_seed = t_seed("test_rel_save");
	if (rel_wanted(argc, argv, "busy")) {
		case_busy(false);
		case_busy(true);
	}
	if (rel_wanted(argc, argv, "failed"))
		case_failed();
	if (rel_wanted(argc, argv, "discard"))
		case_discard();
	if (rel_wanted(argc, argv, "external")) {
		case_external(false);
		case_external(true);
	}
	if (rel_wanted(argc, argv, "punch")) {
		case_punch_refused();
		case_punch_detected();
	}
	return check_result();
}
