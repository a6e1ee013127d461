/* SPDX-License-Identifier: MIT */
/*
 * A snapshot read straight from a real S3 store (run_with_store.sh exports
 * it), through the I/O layer's S3 backend (halite/src/io_s3.c):
 * - opening a reader costs an exact number of requests: one HEAD, the
 *   head and the tail in one GET each, and one more only when the sections
 *   start below the tail;
 * - a lazy restore of the synthetic guest's snapshot from s3:// gives
 *   exactly the snapshot's memory, read by demand faults (this thread
 *   touching every page) and by the prefetcher (asynchronous GETs);
 * - a template (the clone service's engine) filled from s3:// holds
 *   exactly the snapshot's memory;
 * - an object replaced between open and the reads fails the restore with
 *   the changed-object error, in the message, and no memory of the other
 *   object is installed (the restore stops at its first failed read);
 * - a missing key fails the open with an error that names the object.
 * Plain program: exit 0 pass, 1 fail, 77 skip.
 *
 *   s3_read_test   (HALITE_TEST_BUCKET and AWS_* in the environment)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "io.h"
#include "reader_io.h"
#include "s3.h"
#include "synth.h"

#define PAGE 4096u
#define NV 2
#define WAIT_MS 60000

static char g_dir[] = "/tmp/halite-s3-read.XXXXXX";
static char g_bucket[128], g_prefix[128];

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "FAIL: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

#define CHECK(c, ...)                                                                   \
	do {                                                                            \
		if (!(c))                                                               \
			die(__VA_ARGS__);                                               \
	} while (0)

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* A synthetic guest, saved by the save engine to @path: its memory at the snapshot instant. */
static uint8_t *make_snapshot(const char *path, struct synth_opts *base, uint64_t *mem_bytes)
{
	HALITE_OPTS(halite_save_opts, o);
	struct synth_opts so = *base;
	struct halite_root roots[NV];
	struct halite_save_region reg;
	struct synth_guest *g;
	struct synth_info info;
	struct halite_save *s;
	pid_t tids[NV];
	uint8_t *snap;
	int ret;

	so.backing = SYNTH_MEM_SHARED;
	so.write_pct = 50;
	so.pattern = SYNTH_PAT_SEQ;
	CHECK(!synth_create(&g, &so) && !synth_info(g, &info), "synth_create");
	CHECK(!synth_start(g), "synth_start");
	sleep_ms(5);
	CHECK(!synth_pause(g), "synth_pause");
	snap = malloc(info.mem_bytes);
	CHECK(snap && !synth_copy_memory(g, snap), "copy memory");
	reg = (struct halite_save_region){ SYNTH_REGION_NAME, 0, info.mem_bytes,
					   (uintptr_t)info.host_addr, HALITE_MEM_SHARED, info.memfd,
					   0 };
	/* Each vCPU's thread (its faults' stream) and page-table root (the walk's start). */
	for (unsigned v = 0; v < NV; v++) {
		struct synth_vcpu_info vi;

		CHECK(!synth_vcpu_info(g, v, &vi), "vcpu info");
		tids[v] = vi.tid;
		roots[v] = (struct halite_root){ v, vi.paging_levels, vi.cr3 };
	}
	o.flags = HALITE_SAVE_NO_SYNC;
	o.vcpu_tids = tids;
	o.nvcpus = NV;
	o.workers = 2;
	ret = halite_save_create(&s, path, &reg, 1, &o);
	CHECK(!ret, "save_create: %s", halite_strerror(ret));
	for (unsigned v = 0; v < NV; v++)
		CHECK(!halite_save_add_root(s, &roots[v]), "add_root");
	CHECK(!halite_save_arm(s), "arm");
	CHECK(!synth_resume(g), "resume");
	ret = halite_save_wait(s, WAIT_MS);
	CHECK(!ret, "save: %s", halite_strerror(ret));
	halite_save_free(s);
	CHECK(!synth_stop(g), "stop");
	synth_free(g);
	*mem_bytes = info.mem_bytes;
	return snap;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	CHECK(fd >= 0 && !fstat(fd, &st), "%s: %s", path, strerror(errno));
	buf = malloc((size_t)st.st_size);
	CHECK(buf && read(fd, buf, (size_t)st.st_size) == st.st_size, "%s: read", path);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

static struct halite_s3 *client(void)
{
	struct halite_s3_config c;
	struct halite_s3 *s;
	char err[256];

	CHECK(!halite_s3_config_load(&c, err, sizeof(err)), "S3 configuration: %s", err);
	CHECK(!halite_s3_open(&s, &c, g_bucket), "halite_s3_open");
	halite_s3_config_clear(&c);
	return s;
}

static void put(struct halite_s3 *s, const char *key, const void *buf, size_t len)
{
	int ret = halite_s3_put(s, key, buf, len);

	CHECK(!ret, "PUT %s: %s", key, halite_s3_errmsg(s));
}

/* The sections a reader reads at open (reader.c): a 1.1 file's chunked index comes in on use. */
static bool read_at_open(uint32_t type, bool chunked)
{
	return !chunked || (type != HALITE_SECTION_LB_TABLE && type != HALITE_SECTION_MB_MAP &&
			    type != HALITE_SECTION_LB_MEMBERS);
}

/* Requests at open: HEAD, the head, the tail, and the sections when they start below the tail. */
static void test_open_requests(const char *local, const char *url)
{
	struct halite_reader *rd, *lr;
	struct halite_s3_stats st;
	uint64_t size, lo = UINT64_MAX, want;
	uint32_t type;
	bool chunked = false;
	int ret;

	ret = halite_reader_open(&lr, local, NULL);
	CHECK(!ret, "open %s: %s", local, halite_strerror(ret));
	size = halite_reader_info(lr)->file_size;
	for (uint32_t i = 0; i < halite_reader_section_count(lr); i++) {
		uint64_t off, len;

		CHECK(!halite_reader_section(lr, i, &type, &off, &len), "section");
		chunked |= type == HALITE_SECTION_INDEX;
	}
	for (uint32_t i = 0; i < halite_reader_section_count(lr); i++) {
		uint64_t off, len;

		CHECK(!halite_reader_section(lr, i, &type, &off, &len), "section");
		if (len && off < lo && read_at_open(type, chunked))
			lo = off;
	}
	want = size <= (68u << 10) ? 2 : lo < size - (64u << 10) ? 4 : 3;

	ret = halite_reader_open(&rd, url, NULL);
	CHECK(!ret, "open %s: %s", url, halite_strerror(ret));
	CHECK(halite_reader_info(rd)->file_size == size, "size");
	CHECK(!memcmp(halite_reader_info(rd)->uuid, halite_reader_info(lr)->uuid, 16), "uuid");
	halite_io_s3_stats(halite_reader_io(rd), &st);
	printf("open: %" PRIu64 " requests (%" PRIu64 " connections, %" PRIu64
	       " bytes) for a %" PRIu64 "-byte object, want %" PRIu64 "\n",
	       st.requests, st.connects, st.bytes_down, size, want);
	CHECK(st.requests == want && st.retries == 0, "open took %" PRIu64 " requests, not %" PRIu64,
	      st.requests, want);
	/* Verifying the sections open read costs no request more: open kept them. */
	for (uint32_t i = 0; i < halite_reader_section_count(rd); i++) {
		uint64_t off, len;

		CHECK(!halite_reader_section(rd, i, &type, &off, &len), "section");
		if (read_at_open(type, chunked))
			CHECK(!halite_reader_verify_section(rd, i), "verify section %u", i);
	}
	halite_io_s3_stats(halite_reader_io(rd), &st);
	CHECK(st.requests == want, "verifying the sections took %" PRIu64 " more requests",
	      st.requests - want);
	{
		/* A second reader of the version this one read (same_as): no request at all. */
		HALITE_OPTS(halite_reader_opts, ro);
		struct halite_reader *again;

		ro.same_as = rd;
		ret = halite_reader_open(&again, url, &ro);
		CHECK(!ret, "open %s same_as: %s", url, halite_strerror(ret));
		CHECK(!memcmp(halite_reader_info(again)->uuid, halite_reader_info(lr)->uuid, 16),
		      "same_as: uuid");
		for (uint32_t i = 0; i < halite_reader_section_count(again); i++) {
			uint64_t off, len;

			CHECK(!halite_reader_section(again, i, &type, &off, &len), "section");
			if (read_at_open(type, chunked))
				CHECK(!halite_reader_verify_section(again, i), "same_as: section %u", i);
		}
		/* The object's counts, both readers' (one version, one pool of clients). */
		halite_io_s3_stats(halite_reader_io(again), &st);
		printf("open same_as: %" PRIu64 " requests more\n", st.requests - want);
		CHECK(st.requests == want, "a reader same_as another sent %" PRIu64 " requests",
		      st.requests - want);
		halite_reader_free(again);
	}
	halite_reader_free(rd);
	halite_reader_free(lr);
}

/*
 * A file whose sections do not fit in the reader's tail: 256 KiB of device
 * state and 64 MiB of memory blocks, half of them stored.
 */
static void make_big_sections(const char *path)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region reg = { "ram", 0, 64ull << 20 };
	struct halite_writer *w;
	uint8_t *dev = malloc(256u << 10), mb[8192];
	uint64_t n;
	int ret;

	CHECK(dev, "malloc");
	for (size_t i = 0; i < (256u << 10); i++)
		dev[i] = (uint8_t)(i * 131 + 7);
	wo.flags = HALITE_WRITER_NO_SYNC;
	ret = halite_writer_create(&w, path, &reg, 1, &wo);
	CHECK(!ret, "writer_create: %s", halite_strerror(ret));
	n = halite_writer_mb_count(w);
	CHECK(halite_writer_mb_size(w) <= sizeof(mb), "mb size");
	for (uint64_t i = 0; i < n; i += 2) {
		memset(mb, (int)(i & 0xff) | 1, sizeof(mb));
		CHECK(!halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), i, mb), "put");
	}
	CHECK(!halite_writer_set_device_state(w, dev, 256u << 10), "device state");
	ret = halite_writer_finish(w);
	CHECK(!ret, "finish: %s", halite_strerror(ret));
	halite_writer_free(w, true);
	free(dev);
}

/* An attached guest (empty memory, the snapshot's layout) to restore into. */
static struct synth_guest *target(const struct synth_opts *base, struct synth_info *info)
{
	struct synth_opts t = *base;
	struct synth_guest *g;

	t.flags |= SYNTH_F_ATTACH;
	t.backing = SYNTH_MEM_ANON;
	CHECK(!synth_create(&g, &t) && !synth_info(g, info), "target guest");
	return g;
}

/* @flags: HALITE_RESTORE_*; the guest's memory a HALITE_MEM_COPY region with HALITE_RESTORE_COPY_T. */
#define HALITE_RESTORE_COPY_T 0x80000000u
static struct halite_restore *restore_open(const char *url, const struct synth_info *info,
					   unsigned flags)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { SYNTH_REGION_NAME, (uintptr_t)info->host_addr,
					     info->mem_bytes, HALITE_MEM_ANON, -1, 0 };

	if (flags & HALITE_RESTORE_COPY_T) {
		reg.kind = HALITE_MEM_COPY;
		flags &= ~HALITE_RESTORE_COPY_T;
	}
	struct halite_restore *r;
	int ret;

	o.flags |= flags;
	ret = halite_restore_open(&r, url, &reg, 1, &o);
	if (ret == -HALITE_E_UNSUPPORTED || ret == -EPERM) {
		printf("SKIP: userfaultfd: %s\n", halite_strerror(ret));
		exit(77);
	}
	CHECK(!ret, "restore_open %s: %s", url, halite_strerror(ret));
	return r;
}

/* Demand faults (this thread, every page in order) and the prefetcher, both from the store. */
static void test_restore_exact(const char *url, const uint8_t *snap, const struct synth_opts *base)
{
	struct synth_info info;
	struct synth_guest *g = target(base, &info);
	struct halite_restore *r = restore_open(url, &info, 0);
	struct halite_restore_stats st;
	const uint8_t *mem = info.host_addr;
	int ret;

	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	for (uint64_t p = 0; p < info.mem_bytes / PAGE; p++)
		CHECK(!memcmp(mem + p * PAGE, snap + p * PAGE, PAGE),
		      "restored page %" PRIu64 " differs from the snapshot's", p);
	ret = halite_restore_wait(r, WAIT_MS);
	CHECK(!ret, "restore: %s", halite_restore_errmsg(r));
	halite_restore_stats(r, &st);
	printf("restore: %" PRIu64 " faults, LBs %" PRIu64 " demand + %" PRIu64
	       " prefetch of %" PRIu64 "\n", st.faults, st.lb_demand, st.lb_prefetch, st.lb_total);
	CHECK(st.lb_demand + st.lb_prefetch == st.lb_total, "every LB read once");
	CHECK(!memcmp(mem, snap, info.mem_bytes), "memory differs after the restore");
	halite_restore_free(r);
	synth_free(g);
}

/*
 * A fault's read from an object brings the LBs after its LB in the file
 * with it, in the same GET (source.c, read_span()): with the prefetcher and
 * stream readahead off, one fault costs one request after the open, and
 * the LBs up to 512 KiB on come in with it, verified and installed.
 */
static void test_span(const char *url, const uint8_t *snap, const struct synth_opts *base)
{
	struct synth_info info;
	struct synth_guest *g = target(base, &info);
	struct halite_restore *r = restore_open(url, &info, HALITE_RESTORE_NO_PREFETCH |
					       HALITE_RESTORE_NO_READAHEAD);
	struct halite_reader *rd = halite_restore_reader(r);
	const struct halite_file_info *fi = halite_reader_info(rd);
	struct halite_store_stats before, after;
	struct halite_restore_stats st;
	struct halite_mb_loc loc = { 0 };
	uint64_t mb, want, pages_per_mb = fi->mb_size / PAGE;
	volatile const uint8_t *mem = info.host_addr;
	uint8_t sink;

	/* A stored memory block in an LB with 8 more after it. */
	for (mb = 0; mb < fi->mb_count; mb++)
		if (!halite_reader_mb_lookup(rd, mb, &loc) && loc.state == HALITE_MB_STORED &&
		    loc.lb + 8 < fi->lb_count)
			break;
	CHECK(mb < fi->mb_count, "no stored block with 8 LBs after its own");
	want = (512u << 10) / fi->lb_size;
	if (want > fi->lb_count - loc.lb)
		want = fi->lb_count - loc.lb;
	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	halite_reader_store_stats(rd, &before);
	sink = mem[mb * pages_per_mb * PAGE];
	(void)sink;
	/* The others land after the faulting one: wait for them, then for none more. */
	for (int i = 0; i < 500; i++) {
		halite_restore_stats(r, &st);
		if (st.lb_demand + st.lb_prefetch >= want)
			break;
		sleep_ms(10);
	}
	sleep_ms(200);
	halite_restore_stats(r, &st);
	halite_reader_store_stats(rd, &after);
	printf("span: a fault in LB %" PRIu64 " read %" PRIu64 " + %" PRIu64 " LBs in %" PRIu64
	       " request(s)\n", loc.lb, st.lb_demand, st.lb_prefetch,
	       after.requests - before.requests);
	CHECK(st.lb_demand == 1 && st.lb_prefetch == want - 1,
	      "one fault read %" PRIu64 " + %" PRIu64 " LBs, not 1 + %" PRIu64, st.lb_demand,
	      st.lb_prefetch, want - 1);
	/* A retry of the store's (a 5xx, a reset) is the client's, not the engine's. */
	CHECK(after.requests - after.retries - (before.requests - before.retries) == 1,
	      "one fault sent %" PRIu64 " requests", after.requests - before.requests);
	/* Every block of those LBs is the snapshot's. */
	for (uint64_t m = 0; m < fi->mb_count; m++) {
		struct halite_mb_loc l;

		if (halite_reader_mb_lookup(rd, m, &l) || l.state != HALITE_MB_STORED ||
		    l.lb < loc.lb || l.lb >= loc.lb + want)
			continue;
		CHECK(!memcmp((const uint8_t *)mem + m * fi->mb_size, snap + m * fi->mb_size,
			      fi->mb_size), "block %" PRIu64 " of LB %" PRIu64 " differs", m, l.lb);
	}
	halite_restore_free(r);
	synth_free(g);
}

/*
 * A copy (HALITE_MEM_COPY, as QEMU's device RAM is restored) is filled at
 * start, its LBs that follow each other in the file read together
 * (restore.c fill_copies(), src_read_run()): the memory is exact when
 * start returns, in one request per run of up to 8 LBs.
 */
static void test_copy_runs(const char *url, const uint8_t *snap, const struct synth_opts *base)
{
	struct synth_info info;
	struct synth_guest *g = target(base, &info);
	struct halite_restore *r = restore_open(url, &info, HALITE_RESTORE_COPY_T |
					       HALITE_RESTORE_NO_PREFETCH);
	struct halite_reader *rd = halite_restore_reader(r);
	const struct halite_file_info *fi = halite_reader_info(rd);
	struct halite_store_stats before, after;
	uint64_t prev = 0, runs = 0, len = 0, lbs = 0;
	uint8_t *has = calloc(fi->lb_count, 1);

	CHECK(has, "out of memory");
	for (uint64_t m = 0; m < fi->mb_count; m++) {
		struct halite_mb_loc l;

		if (!halite_reader_mb_lookup(rd, m, &l) && l.state == HALITE_MB_STORED)
			has[l.lb] = 1;
	}
	/* Runs of LBs with a stored block, cut every 8 (512 KiB of 64 KiB LBs). */
	for (uint64_t lb = 0; lb < fi->lb_count; lb++) {
		if (!has[lb])
			continue;
		lbs++;
		if (!runs || lb != prev + 1 || len == (512u << 10) / fi->lb_size) {
			runs++;
			len = 0;
		}
		len++;
		prev = lb;
	}
	halite_reader_store_stats(rd, &before);
	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	halite_reader_store_stats(rd, &after);
	printf("copy: %" PRIu64 " LBs in %" PRIu64 " requests (%" PRIu64 " runs)\n", lbs,
	       after.requests - before.requests, runs);
	CHECK(!memcmp(info.host_addr, snap, info.mem_bytes), "the copy differs from the snapshot");
	CHECK(after.requests - after.retries - (before.requests - before.retries) == runs,
	      "the copy took %" PRIu64 " requests, not %" PRIu64, after.requests - before.requests,
	      runs);
	CHECK(runs < lbs, "no run of LBs");
	CHECK(!halite_restore_wait(r, WAIT_MS), "copy restore: %s", halite_restore_errmsg(r));
	free(has);
	halite_restore_free(r);
	synth_free(g);
}

/* The object replaced after open: the prefetcher's first GET fails with 412, the restore with it. */
static void test_replaced(struct halite_s3 *s, const char *key, const char *url, uint8_t *file,
			  size_t len, const struct synth_opts *base)
{
	struct synth_info info;
	struct synth_guest *g = target(base, &info);
	struct halite_restore *r = restore_open(url, &info, 0);
	const char *msg, *want = halite_strerror(-HALITE_S3_E_CHANGED);
	int ret;

	/* Another object under the key: the same bytes but one, so a new ETag. */
	file[len / 2] ^= 0x5a;
	put(s, key, file, len);
	file[len / 2] ^= 0x5a;
	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	ret = halite_restore_wait(r, WAIT_MS);
	msg = halite_restore_errmsg(r);
	printf("replaced: %d: %s\n", ret, msg);
	CHECK(ret == -HALITE_S3_E_CHANGED, "the restore of a replaced object ended with %d (%s), "
	      "not -HALITE_S3_E_CHANGED", ret, halite_strerror(ret));
	CHECK(strstr(msg, want), "the message '%s' does not say '%s'", msg, want);
	CHECK(strstr(msg, url), "the message '%s' does not name %s", msg, url);
	/* Reading a replaced object again cannot mend it: one read, not read_retries more. */
	CHECK(strstr(msg, "after 1 read"), "the message '%s' says the LB was read again", msg);
	halite_restore_free(r);
	synth_free(g);
}

/* The clone service's engine: a template filled from the store holds the snapshot's memory. */
static void test_template(const char *url, const uint8_t *snap, uint64_t mem_bytes)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template *t;
	char mem[128], fill[160];
	uint64_t off, len;
	uint8_t *p;
	int ret;

	snprintf(mem, sizeof(mem), "/dev/shm/halite-s3-read-%d.mem", (int)getpid());
	snprintf(fill, sizeof(fill), "%s.fill", mem);
	ret = halite_template_open(&t, url, mem, &o);
	if (ret == -HALITE_E_UNSUPPORTED) {
		printf("template: skipped, %s\n", halite_strerror(ret));
		return;
	}
	CHECK(!ret, "template_open %s: %s", url, halite_strerror(ret));
	ret = halite_template_wait(t, WAIT_MS);
	CHECK(!ret, "template: %s", halite_template_errmsg(t));
	CHECK(!halite_template_region(t, SYNTH_REGION_NAME, &off, &len) && len == mem_bytes,
	      "template region");
	p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, halite_template_memfd(t), (off_t)off);
	CHECK(p != MAP_FAILED, "mmap the template");
	CHECK(!memcmp(p, snap, len), "the template's memory differs from the snapshot's");
	munmap(p, len);
	halite_template_free(t);
	unlink(mem);
	unlink(fill);
	printf("template: %" PRIu64 " bytes exact\n", len);
}

/* The store's counts and the cache's, for a restore or a template's reader. */
static void store_stats(struct halite_reader *rd, const char *what, struct halite_store_stats *ss)
{
	halite_reader_store_stats(rd, ss);
	printf("%s: %" PRIu64 " requests, %" PRIu64 " bytes; cache %" PRIu64 " hits, %" PRIu64
	       " misses, %" PRIu64 " puts, %" PRIu64 " put errors\n", what, ss->requests, ss->bytes,
	       ss->cache_hits, ss->cache_misses, ss->cache_puts, ss->cache_put_errors);
	CHECK(ss->cached, "%s: no cache in use with HALITE_CACHE_DIR set", what);
}

/* A restore from @url, every page compared; its store counts in @ss, its LB total returned. */
static uint64_t restore_counted(const char *url, const uint8_t *snap, const struct synth_opts *base,
				const char *what, struct halite_store_stats *ss)
{
	struct synth_info info;
	struct synth_guest *g = target(base, &info);
	struct halite_restore *r = restore_open(url, &info, 0);
	struct halite_restore_stats st;
	uint64_t lbs;

	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	CHECK(!halite_restore_wait(r, WAIT_MS), "%s: %s", what, halite_restore_errmsg(r));
	CHECK(!memcmp(info.host_addr, snap, info.mem_bytes), "%s: memory differs", what);
	halite_restore_stats(r, &st);
	store_stats(halite_restore_reader(r), what, ss);
	lbs = st.lb_total;
	halite_restore_free(r);
	synth_free(g);
	return lbs;
}

/*
 * The host's LB cache (HALITE_CACHE_DIR): a first restore keeps every LB it
 * fetched; a second restore and a template on the host send the store only
 * the open's requests and take every LB from the cache; an entry damaged on
 * disk is fetched again, and the memory stays exact.
 */
static void test_cache(const char *url, const uint8_t *snap, const struct synth_opts *base)
{
	struct halite_store_stats ss;
	HALITE_OPTS(halite_template_opts, to);
	struct halite_template *t;
	char dir[256], mem[128], entry[600], fill[160];
	uint64_t lbs, open_requests, off, len;
	struct dirent *de;
	DIR *d;
	FILE *f;
	int ret;

	snprintf(dir, sizeof(dir), "%s/cache", g_dir);
	setenv("HALITE_CACHE_DIR", dir, 1);
	setenv("HALITE_CACHE_SIZE", "1G", 1);

	{
		struct halite_reader *rd;
		struct halite_s3_stats st;

		/* What an open costs (test_open_requests() checks it exactly). */
		CHECK(!halite_reader_open(&rd, url, NULL), "open %s", url);
		halite_io_s3_stats(halite_reader_io(rd), &st);
		open_requests = st.requests;
		halite_reader_free(rd);
	}
	lbs = restore_counted(url, snap, base, "cache, first restore", &ss);
	CHECK(ss.cache_hits == 0 && ss.cache_misses == lbs && ss.cache_puts == lbs &&
	      !ss.cache_put_errors, "first restore: every LB of %" PRIu64 " fetched and kept", lbs);
	/* The prefetcher's LBs come several to a GET (io_s3.c, take_run()). */
	CHECK(ss.requests - open_requests < lbs, "first restore: %" PRIu64 " GETs for %" PRIu64
	      " LBs: none coalesced", ss.requests - open_requests, lbs);

	restore_counted(url, snap, base, "cache, second restore", &ss);
	CHECK(ss.cache_hits == lbs && ss.cache_misses == 0 && ss.cache_puts == 0,
	      "second restore: every LB from the cache");
	CHECK(ss.requests == open_requests, "second restore: %" PRIu64 " requests to the store, "
	      "want the open's %" PRIu64 " only", ss.requests, open_requests);

	/* The clone service's template on the same host: no LB from the store either. */
	snprintf(mem, sizeof(mem), "/dev/shm/halite-s3-cache-%d.mem", (int)getpid());
	snprintf(fill, sizeof(fill), "%s.fill", mem);
	ret = halite_template_open(&t, url, mem, &to);
	if (ret != -HALITE_E_UNSUPPORTED) {
		uint8_t *p;

		CHECK(!ret, "template_open %s: %s", url, halite_strerror(ret));
		CHECK(!halite_template_wait(t, WAIT_MS), "template: %s", halite_template_errmsg(t));
		store_stats(halite_template_reader(t), "cache, template", &ss);
		CHECK(ss.cache_hits == lbs && ss.requests == open_requests,
		      "template: every LB from the cache, the store asked only at open");
		CHECK(!halite_template_region(t, SYNTH_REGION_NAME, &off, &len), "region");
		p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, halite_template_memfd(t), (off_t)off);
		CHECK(p != MAP_FAILED && !memcmp(p, snap, len), "template memory exact");
		munmap(p, len);
		halite_template_free(t);
		unlink(mem);
		unlink(fill);
	}

	/* One entry damaged on disk: a miss, fetched and kept again; memory exact. */
	snprintf(entry, sizeof(entry), "%s/lb", dir);
	d = opendir(entry);
	CHECK(d, "opendir %s", entry);
	while ((de = readdir(d)) && de->d_name[0] == '.')
		;
	CHECK(de, "no entry in %s", entry);
	snprintf(entry, sizeof(entry), "%s/lb/%s", dir, de->d_name);
	closedir(d);
	f = fopen(entry, "r+");
	CHECK(f && !fseek(f, 100, SEEK_SET), "opening %s", entry);
	ret = fgetc(f);
	CHECK(ret != EOF && !fseek(f, 100, SEEK_SET) && fputc(ret ^ 0xff, f) != EOF && !fclose(f),
	      "damaging %s", entry);
	restore_counted(url, snap, base, "cache, one entry damaged", &ss);
	CHECK(ss.cache_hits == lbs - 1 && ss.cache_misses == 1 && ss.cache_puts == 1,
	      "damaged entry: fetched again, the rest from the cache");
	CHECK(ss.requests == open_requests + 1, "damaged entry: one LB request");

	unsetenv("HALITE_CACHE_DIR");
	unsetenv("HALITE_CACHE_SIZE");
	{
		char cmd[400];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		CHECK(!system(cmd), "%s", cmd);
	}
}

/* bench/s3_proxy.py in front of the store: a store that goes away on command. */
struct proxy {
	pid_t pid;
	char endpoint[128], control[100];	/* control: a sun_path */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "key": "value" of the proxy's JSON line into @out. */
static void json_str(const char *line, const char *key, char *out, size_t len)
{
	char pat[64];
	const char *p, *e;

	snprintf(pat, sizeof(pat), "\"%s\": \"", key);
	p = strstr(line, pat);
	CHECK(p, "the proxy's line has no %s: %s", key, line);
	p += strlen(pat);
	e = strchr(p, '"');
	CHECK(e && (size_t)(e - p) < len, "the proxy's %s: %s", key, line);
	memcpy(out, p, (size_t)(e - p));
	out[e - p] = 0;
}

static void proxy_start(struct proxy *px)
{
	const char *py = getenv("HALITE_S3_PROXY"), *up = getenv("AWS_ENDPOINT_URL");
	char line[1024];
	int fds[2];
	FILE *f;

	CHECK(py && up, "HALITE_S3_PROXY (bench/s3_proxy.py) and AWS_ENDPOINT_URL");
	CHECK(!pipe(fds), "pipe");
	px->pid = fork();
	CHECK(px->pid >= 0, "fork");
	if (!px->pid) {
		dup2(fds[1], 1);
		close(fds[0]);
		execlp("python3", "python3", py, "--upstream", up, "--rtt-ms", "0", "--die-with-parent",
		       (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	f = fdopen(fds[0], "r");
	CHECK(f && fgets(line, sizeof(line), f), "the proxy did not start");
	fclose(f);
	json_str(line, "endpoint", px->endpoint, sizeof(px->endpoint));
	json_str(line, "control", px->control, sizeof(px->control));
}

/* One command on the proxy's control socket; its answer line into @out. */
static void proxy_cmd(const struct proxy *px, const char *cmd, char *out, size_t len)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ssize_t n;

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", px->control);
	CHECK(fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof(a)), "proxy control %s: %s",
	      px->control, strerror(errno));
	CHECK(write(fd, cmd, strlen(cmd)) == (ssize_t)strlen(cmd) && write(fd, "\n", 1) == 1,
	      "proxy control: write");
	n = read(fd, out, len - 1);
	CHECK(n > 0, "proxy control: no answer to '%s'", cmd);
	out[n] = 0;
	close(fd);
}

static void proxy_stop(struct proxy *px)
{
	int st;

	kill(px->pid, SIGTERM);
	CHECK(waitpid(px->pid, &st, 0) == px->pid, "waitpid proxy");
}

/*
 * The store goes away for 3 s while the guest needs pages it lacks: the
 * guest waits (never zeros), and the restore completes exactly when the
 * store is back, the GETs retried meanwhile. Away for longer than
 * HALITE_S3_RETRY_FOR: the restore fails with the network's error.
 */
static void test_outage(const char *url, const uint8_t *snap, const struct synth_opts *base)
{
	char saved[256], ans[512];
	struct halite_store_stats ss;
	struct synth_info info;
	struct synth_guest *g;
	struct halite_restore *r;
	struct proxy px;
	const uint8_t *mem;
	double t0, waited;
	int ret;

	snprintf(saved, sizeof(saved), "%s", getenv("AWS_ENDPOINT_URL"));
	proxy_start(&px);
	setenv("AWS_ENDPOINT_URL", px.endpoint, 1);
	setenv("HALITE_S3_RETRY_FOR", "30", 1);

	g = target(base, &info);
	mem = info.host_addr;
	r = restore_open(url, &info, HALITE_RESTORE_NO_PREFETCH);
	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	CHECK(!memcmp(mem, snap, PAGE), "outage: page 0 before the outage");
	proxy_cmd(&px, "outage 3 reset", ans, sizeof(ans));
	CHECK(strstr(ans, "\"ok\": true"), "proxy: outage: %s", ans);
	t0 = now_s();
	/* Every page, in order: the first whose LB is not in waits for the store. */
	for (uint64_t p = 0; p < info.mem_bytes / PAGE; p++)
		CHECK(!memcmp(mem + p * PAGE, snap + p * PAGE, PAGE),
		      "outage: page %" PRIu64 " differs from the snapshot's", p);
	waited = now_s() - t0;
	ret = halite_restore_wait(r, WAIT_MS);
	CHECK(!ret, "outage: the restore: %s", halite_restore_errmsg(r));
	halite_reader_store_stats(halite_restore_reader(r), &ss);
	proxy_cmd(&px, "stats", ans, sizeof(ans));
	printf("outage: every page exact after %.2f s; %" PRIu64 " requests, %" PRIu64
	       " retries; proxy %s", waited, ss.requests, ss.retries, ans);
	CHECK(waited >= 2.5, "outage: the pages came in %.2f s, within the 3 s outage", waited);
	CHECK(ss.retries > 0, "outage: no GET was retried");
	CHECK(!memcmp(mem, snap, info.mem_bytes), "outage: memory differs after the restore");
	halite_restore_free(r);
	synth_free(g);

	/* Away for longer than the client waits: the restore fails, naming the network. */
	setenv("HALITE_S3_RETRY_FOR", "1", 1);
	g = target(base, &info);
	r = restore_open(url, &info, 0);
	proxy_cmd(&px, "outage 8 reset", ans, sizeof(ans));
	CHECK(!halite_restore_start(r), "restore_start: %s", halite_restore_errmsg(r));
	ret = halite_restore_wait(r, WAIT_MS);
	printf("outage beyond HALITE_S3_RETRY_FOR: %d: %s\n", ret, halite_restore_errmsg(r));
	CHECK(ret == -HALITE_S3_E_NETWORK, "outage: the restore ended with %d (%s), not "
	      "-HALITE_S3_E_NETWORK", ret, halite_strerror(ret));
	CHECK(strstr(halite_restore_errmsg(r), "attempts in"), "outage: the message does not say "
	      "how long it tried: %s", halite_restore_errmsg(r));
	halite_restore_free(r);
	synth_free(g);

	proxy_stop(&px);
	setenv("AWS_ENDPOINT_URL", saved, 1);
	unsetenv("HALITE_S3_RETRY_FOR");
}

static void test_missing(const char *url)
{
	char err[512];
	HALITE_OPTS(halite_reader_opts, o);
	struct halite_reader *rd;
	int ret;

	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	ret = halite_reader_open(&rd, url, &o);
	printf("missing: %d: %s\n", ret, err);
	CHECK(ret == -HALITE_S3_E_NO_SUCH_KEY, "open of a missing key: %d (%s)", ret,
	      halite_strerror(ret));
	CHECK(strstr(err, url) && strstr(err, halite_strerror(ret)), "message: %s", err);
}

int main(void)
{
	struct synth_opts base = {
		.sz = sizeof(base), .mem_bytes = 16ull << 20, .nvcpus = NV, .stride = 16,
		.map_bytes = 3ull << 20, .ws_bytes = 2ull << 20, .compress_pct = 40,
		.zero_pct = 5, .untouched_pct = 20, .hole_every = 9, .seed = 7,
	};
	char path[256], key[256], url[512], missing[512];
	const char *b = getenv("HALITE_TEST_BUCKET");
	struct halite_s3 *s;
	uint64_t mem_bytes;
	uint8_t *snap, *file;
	size_t len;

	if (!b) {
		printf("SKIP: no HALITE_TEST_BUCKET (run under run_with_store.sh)\n");
		return 77;
	}
	snprintf(g_bucket, sizeof(g_bucket), "%s", b);
	snprintf(g_prefix, sizeof(g_prefix), "s3read-%d", (int)getpid());
	CHECK(mkdtemp(g_dir), "mkdtemp");
	snprintf(path, sizeof(path), "%s/snap.hlt", g_dir);
	snap = make_snapshot(path, &base, &mem_bytes);
	file = slurp(path, &len);
	s = client();
	snprintf(key, sizeof(key), "%s/snap.hlt", g_prefix);
	snprintf(url, sizeof(url), "s3://%s/%s", g_bucket, key);
	snprintf(missing, sizeof(missing), "s3://%s/%s/none.hlt", g_bucket, g_prefix);
	put(s, key, file, len);

	test_open_requests(path, url);
	{
		char big[300], bkey[256], burl[512];
		uint8_t *bf;
		size_t blen;

		snprintf(big, sizeof(big), "%s/big.hlt", g_dir);
		make_big_sections(big);
		bf = slurp(big, &blen);
		snprintf(bkey, sizeof(bkey), "%s/big.hlt", g_prefix);
		snprintf(burl, sizeof(burl), "s3://%s/%s", g_bucket, bkey);
		put(s, bkey, bf, blen);
		test_open_requests(big, burl);
		halite_s3_delete(s, bkey);
		unlink(big);
		free(bf);
	}
	test_restore_exact(url, snap, &base);
	test_span(url, snap, &base);
	test_copy_runs(url, snap, &base);
	test_template(url, snap, mem_bytes);
	test_cache(url, snap, &base);
	test_outage(url, snap, &base);
	test_replaced(s, key, url, file, len, &base);
	test_missing(missing);

	halite_s3_delete(s, key);
	halite_s3_close(s);
	unlink(path);
	rmdir(g_dir);
	free(snap);
	free(file);
	printf("PASS\n");
	return 0;
}
