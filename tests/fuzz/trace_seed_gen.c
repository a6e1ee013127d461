// SPDX-License-Identifier: MIT
/*
 * Write the snapshot fuzz_trace parses against and the seed traces of
 * corpus/trace/ (see fuzz_trace.c for the command):
 *
 *   fuzz_trace_seed_gen SNAPSHOT DIR
 *
 * SNAPSHOT: 24 one-page memory blocks in region "ram", lz4, 4 KiB LBs; the
 * stored blocks compress to about 1.2 KiB, so an LB holds three (two in the
 * last LB of each stream). Two streams, interleaved:
 *   vcpu0     MBs 0..5, 12, 13   LBs {0,1,2} {3,4,5} {12,13}
 *   physical  MBs 6..11, 14, 15  LBs {6,7,8} {9,10,11} {14,15}
 *   zero 16, 17 (all-zero data), 18 (put_zero); never touched 19..23.
 * Its uuid and creation time are fixed (the file re-sealed after writing),
 * so that the same command makes the same bytes, and the corpus, whose
 * traces name that uuid, stays valid when the snapshot is remade.
 *
 * DIR/seed-*: real traces of restores of SNAPSHOT, written by the restore
 * engine (as tests/inspect/mkrestore.c makes them), this thread being the
 * one vCPU, then two edited copies for what no run writes:
 *   seed-demand     NO_PREFETCH, NO_READAHEAD: the second block of the first
 *                   LB, a zero and an untouched block, the first block of the
 *                   fourth LB; then freed (cancelled: done 0, -ECANCELED);
 *   seed-full       prefetch on, nothing touched: every LB prefetched, done;
 *   seed-track      NO_PREFETCH, NO_READAHEAD, TRACK_ACCESS: every LB
 *                   demanded in file order, some staged blocks touched, done;
 *   seed-readahead  NO_PREFETCH: the first LB of each stream demanded, the
 *                   rest of each stream read ahead (prefetch lines), done;
 *   seed-failed     prefetch on, from a copy with one LB damaged: every read
 *                   of it fails its checksum (lb_retries), the restore fails
 *                   (done 0, -HALITE_E_LB_CHECKSUM), that LB has no line;
 *   seed-unknown-stats  seed-full with two stats this version does not know;
 *   seed-failed-early   seed-demand failed with -EIO before any LB came in;
 *   seed-line-4096      seed-full with an unknown stat line of exactly the
 *                       longest length accepted, seed-line-4097 one byte more
 *                       (mutations seldom grow a line that long by chance);
 *   seed-empty          no bytes.
 * Exit 0, 1 on failure, 77 without userfaultfd. Built, not a test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>
#include <halite/restore.h>

#include "corrupt_util.h"
#include "endian_util.h"
#include "uffd.h"

#define PAGE 4096u
#define NMB 24u
#define LEN (NMB * PAGE)
#define MAX_LB 16u
#define MAX_MEMBERS 4u
#define VCPU0 HALITE_STREAM(HALITE_STREAM_VCPU, 0)
#define PHYS HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0)

/* "hlt-fuzz-trace-1": a uuid no writer draws, so a trace naming it is one of these. */
static const uint8_t fixed_uuid[16] = { 'h', 'l', 't', '-', 'f', 'u', 'z', 'z',
					'-', 't', 'r', 'a', 'c', 'e', '-', '1' };
/* 2026-01-01T00:00:00Z in ns. */
#define FIXED_CREATED 1767225600000000000ull

static uint8_t image[LEN];

/* The snapshot's layout as its reader tells it; the runs below follow it. */
static struct {
	uint32_t stream, seq, n;
	uint64_t mb[MAX_MEMBERS];
} lbs[MAX_LB];
static uint32_t nlb;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("fuzz_trace_seed_gen: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void check(int ret, const char *what)
{
	if (ret < 0)
		die("%s: %s", what, halite_strerror(ret));
}

/* 1200 random bytes, then zeros: lz4 makes about 1.2 KiB of it, three to an LB. */
static void fill(uint64_t mb)
{
	uint64_t x = mb * 0x9e3779b97f4a7c15ull + 7;

	for (uint32_t i = 0; i < 1200; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		image[mb * PAGE + i] = (uint8_t)(x >> 56);
	}
}

static void put(struct halite_writer *w, uint32_t stream, uint64_t first, uint64_t n)
{
	for (uint64_t mb = first; mb < first + n; mb++) {
		fill(mb);
		if (halite_writer_put(w, stream, mb, image + mb * PAGE) < 0)
			die("put %" PRIu64 ": %s", mb, halite_writer_errmsg(w));
	}
}

static void load_layout(const char *path)
{
	const struct halite_file_info *fi;
	struct halite_reader *r;

	check(halite_reader_open(&r, path, NULL), "open");
	fi = halite_reader_info(r);
	if (fi->lb_count != 6 || fi->mb_count != NMB || fi->mb_stored != 16 || fi->mb_zero != 3 ||
	    fi->mb_untouched != 5 || memcmp(fi->uuid, fixed_uuid, 16))
		die("layout: %" PRIu64 " LBs, %" PRIu64 " MBs (%" PRIu64 " stored, %" PRIu64
		    " zero, %" PRIu64 " untouched)",
		    fi->lb_count, fi->mb_count, fi->mb_stored, fi->mb_zero, fi->mb_untouched);
	nlb = (uint32_t)fi->lb_count;
	for (uint32_t i = 0; i < nlb; i++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n;

		check(halite_reader_lb_info(r, i, &li), "lb_info");
		check(halite_reader_lb_members(r, i, &mbs, &n), "lb_members");
		if (n < 2 || n > MAX_MEMBERS)
			die("layout: LB %u holds %u blocks", i, n);
		lbs[i].stream = li.stream;
		lbs[i].seq = li.seq;
		lbs[i].n = n;
		memcpy(lbs[i].mb, mbs, n * sizeof(*mbs));
	}
	halite_reader_free(r);
}

static void make_file(const char *path)
{
	static const struct halite_region reg = { "ram", 0, LEN };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	uint8_t *b;
	size_t len;

	o.codec = HALITE_CODEC_LZ4;
	o.mb_pages = 1;
	o.lb_size = 4096;
	o.vcpu_count = 1;
	o.flags = HALITE_WRITER_NO_SYNC;
	check(halite_writer_create(&w, path, &reg, 1, &o), "create");
	put(w, VCPU0, 0, 3);
	put(w, PHYS, 6, 3);
	put(w, VCPU0, 3, 3);
	put(w, PHYS, 9, 3);
	put(w, VCPU0, 12, 2);
	put(w, PHYS, 14, 2);
	check(halite_writer_flush_stream(w, VCPU0), "flush vcpu0");
	check(halite_writer_flush_stream(w, PHYS), "flush physical");
	check(halite_writer_put(w, PHYS, 16, image + 16 * PAGE), "put zero data");
	check(halite_writer_put(w, VCPU0, 17, image + 17 * PAGE), "put zero data");
	check(halite_writer_put_zero(w, 18), "put_zero");
	if (halite_writer_finish(w) < 0)
		die("finish: %s", halite_writer_errmsg(w));
	halite_writer_free(w, true);

	b = cu_read_file(path, &len);
	if (!b || len < HLT_DATA_OFFSET + HLT_FTR_SIZE)
		die("%s: cannot read it back", path);
	memcpy(b + HLT_HDR_UUID, fixed_uuid, 16);
	memcpy(b + len - HLT_FTR_SIZE + HLT_FTR_UUID, fixed_uuid, 16);
	halite_put_le64(b + HLT_HDR_CREATED, FIXED_CREATED);
	cu_reseal(b, len, CU_RESEAL_LBS);
	check(cu_write_file(path, b, len), path);
	free(b);
	load_layout(path);
}

/* A copy of @path with one byte of LB @lb flipped behind its (unchanged) checksum. */
static void make_damaged(const char *path, const char *out, uint32_t lb)
{
	size_t len;
	uint8_t *b = cu_read_file(path, &len);

	if (!b || len < HLT_DATA_OFFSET + (lb + 1) * 4096u)
		die("%s: cannot read it back", path);
	b[HLT_DATA_OFFSET + lb * 4096u + 100] ^= 0x40;
	check(cu_write_file(out, b, len), out);
	free(b);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * Wait until @nlbs LBs are in and @others blocks of them were installed
 * without a fault of their own (pool and prefetch; with TRACK_ACCESS,
 * staged): the next touch then finds the engine at rest, so each run's
 * trace says what the run meant.
 */
static void settle(struct halite_restore *r, uint64_t nlbs, uint64_t others, bool track)
{
	struct halite_restore_stats st;
	uint64_t t0 = now_ms();

	for (;;) {
		halite_restore_stats(r, &st);
		if (st.lb_demand + st.lb_prefetch == nlbs &&
		    (track ? st.mb_staged : st.mb_pool + st.mb_prefetch) == others)
			return;
		if (now_ms() - t0 > 20000)
			die("engine does not settle: %" PRIu64 " LBs, %" PRIu64 " pool, %" PRIu64
			    " prefetch, %" PRIu64 " staged; expected %" PRIu64 " LBs, %" PRIu64
			    " others",
			    st.lb_demand + st.lb_prefetch, st.mb_pool, st.mb_prefetch, st.mb_staged,
			    nlbs, others);
		usleep(1000);
	}
}

static void touch(volatile uint8_t *mem, uint64_t mb)
{
	(void)mem[mb * PAGE];
}

struct run {
	struct halite_restore *r;
	uint8_t *mem;
	pid_t tid;
};

/* @quiet: the run is meant to fail, its error log would only alarm. */
static void run_open(struct run *run, const char *file, const char *trace, unsigned flags,
		     bool quiet)
{
	struct halite_restore_region reg;
	HALITE_OPTS(halite_restore_opts, o);
	int ret;

	run->mem = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (run->mem == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	reg = (struct halite_restore_region){ "ram", (uintptr_t)run->mem, LEN, HALITE_MEM_ANON };
	run->tid = gettid();
	o.flags = flags;
	o.vcpu_tids = &run->tid;
	o.nvcpus = 1;
	o.trace_path = trace;
	o.log = quiet ? NULL : halite_log_stderr;
	o.log_level = HALITE_LOG_ERROR;
	unlink(trace);
	check(halite_restore_open(&run->r, file, &reg, 1, &o), "restore open");
	ret = halite_restore_start(run->r);
	if (ret == -HALITE_E_UNSUPPORTED) {
		fprintf(stderr, "restore: %s: skipped\n", halite_strerror(ret));
		exit(77);
	}
	check(ret, "restore start");
}

static void run_close(struct run *run, const char *trace)
{
	halite_restore_free(run->r);
	munmap(run->mem, LEN);
	if (access(trace, R_OK))
		die("%s: no trace written: %s", trace, strerror(errno));
	printf("%s\n", trace);
}

static void run_demand(const char *file, const char *trace)
{
	struct run run;

	run_open(&run, file, trace, HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD,
		 false);
	touch(run.mem, lbs[0].mb[1]);
	settle(run.r, 1, lbs[0].n - 1, false);
	touch(run.mem, 16);	/* zero */
	touch(run.mem, 21);	/* never touched */
	touch(run.mem, lbs[3].mb[0]);
	settle(run.r, 2, lbs[0].n - 1 + lbs[3].n - 1, false);
	if (halite_restore_wait(run.r, 0) != -ETIMEDOUT)
		die("demand: the restore ended by itself");
	run_close(&run, trace);
}

static void run_full(const char *file, const char *trace)
{
	struct run run;

	run_open(&run, file, trace, 0, false);
	check(halite_restore_wait(run.r, 60000), "full: wait");
	if (memcmp(run.mem, image, LEN))
		die("full: restored memory differs from the image");
	run_close(&run, trace);
}

static void run_track(const char *file, const char *trace)
{
	uint64_t staged = 0;
	struct run run;

	run_open(&run, file, trace,
		 HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD |
			 HALITE_RESTORE_TRACK_ACCESS,
		 false);
	for (uint32_t i = 0; i < nlb; i++) {
		touch(run.mem, lbs[i].mb[0]);
		if (i + 1 == nlb)
			break; /* the last LB completes the restore */
		staged += lbs[i].n - 1;
		settle(run.r, i + 1, staged, true);
		/* LB 0: one of its staged blocks used; LB 1: all of them. */
		for (uint32_t j = 1; j < lbs[i].n && (i == 1 || (i == 0 && j == 1)); j++)
			touch(run.mem, lbs[i].mb[j]);
	}
	check(halite_restore_wait(run.r, 60000), "track: wait");
	if (memcmp(run.mem, image, LEN))
		die("track: restored memory differs from the image");
	run_close(&run, trace);
}

/* Demand the first LB of each stream; readahead brings in the rest of it. */
static void run_readahead(const char *file, const char *trace)
{
	bool in[MAX_LB] = { false };
	uint64_t nin = 0, others = 0;
	struct run run;

	run_open(&run, file, trace, HALITE_RESTORE_NO_PREFETCH, false);
	for (uint32_t i = 0; i < nlb; i++) {
		if (in[i])
			continue;
		for (uint32_t j = 0; j < nlb; j++) {
			if (lbs[j].stream != lbs[i].stream)
				continue;
			in[j] = true;
			nin++;
			others += j == i ? lbs[j].n - 1 : lbs[j].n;
		}
		touch(run.mem, lbs[i].mb[0]);
		if (nin == nlb)
			break;
		settle(run.r, nin, others, false);
	}
	check(halite_restore_wait(run.r, 60000), "readahead: wait");
	if (memcmp(run.mem, image, LEN))
		die("readahead: restored memory differs from the image");
	run_close(&run, trace);
}

static void run_failed(const char *file, const char *trace)
{
	struct run run;
	int ret;

	run_open(&run, file, trace, HALITE_RESTORE_NO_READAHEAD, true);
	ret = halite_restore_wait(run.r, 60000);
	if (ret != -HALITE_E_LB_CHECKSUM)
		die("failed: the restore ended with %d (%s)", ret, halite_strerror(ret));
	run_close(&run, trace);
}

static char *slurp(const char *path)
{
	size_t len;
	uint8_t *b = cu_read_file(path, &len);
	char *s;

	if (!b)
		die("%s: cannot read it", path);
	s = realloc(b, len + 1);
	if (!s)
		die("out of memory");
	s[len] = '\0';
	return s;
}

static void write_text(const char *path, const char *s)
{
	check(cu_write_file(path, s, strlen(s)), path);
	printf("%s\n", path);
}

/* seed-full with "stat long xxx...", @len bytes long, after the known stats. */
static void make_long_line(const char *full, const char *out, size_t len)
{
	char *s = slurp(full), *p, *t;
	char *line = malloc(len + 1);

	p = strstr(s, "stat error 0\n");
	if (!p || !line)
		die("%s: no 'stat error 0' line", full);
	p += strlen("stat error 0\n");
	memset(line, 'x', len);
	memcpy(line, "stat long ", 10);
	line[len] = '\0';
	if (asprintf(&t, "%.*s%s\n%s", (int)(p - s), s, line, p) < 0)
		die("out of memory");
	write_text(out, t);
	free(t);
	free(line);
	free(s);
}

/* Edited copies: traces no run writes but the format allows, and the limits. */
static void make_edited(const char *dir)
{
	char full[4200], demand[4200], out[4200];
	char *s, *p, *t;

	snprintf(full, sizeof(full), "%s/seed-full", dir);
	snprintf(demand, sizeof(demand), "%s/seed-demand", dir);

	/* Stats a later version adds at the end: a version 1 reader skips them. */
	s = slurp(full);
	p = strstr(s, "stat error 0\n");
	if (!p)
		die("%s: no 'stat error 0' line", full);
	p += strlen("stat error 0\n");
	if (asprintf(&t, "%.*sstat lb_future 3\nstat mb_future_bytes 4096\n%s", (int)(p - s), s,
		     p) < 0)
		die("out of memory");
	snprintf(out, sizeof(out), "%s/seed-unknown-stats", dir);
	write_text(out, t);
	free(t);
	free(s);

	/* Failed before any LB was read: no lb lines. */
	s = slurp(demand);
	p = strstr(s, "stat error -125\n");
	if (!p)
		die("%s: no 'stat error -125' line", demand);
	strcpy(p, "stat error -5\n");
	snprintf(out, sizeof(out), "%s/seed-failed-early", dir);
	write_text(out, s);
	free(s);

	snprintf(out, sizeof(out), "%s/seed-line-4096", dir);
	make_long_line(full, out, 4096);
	snprintf(out, sizeof(out), "%s/seed-line-4097", dir);
	make_long_line(full, out, 4097);
	snprintf(out, sizeof(out), "%s/seed-empty", dir);
	write_text(out, "");
}

int main(int argc, char **argv)
{
	struct halite_uffd_caps caps;
	char trace[4200], bad[4200];

	if (argc != 3) {
		fprintf(stderr, "usage: fuzz_trace_seed_gen SNAPSHOT DIR\n");
		return 2;
	}
	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_THREAD_ID)) {
		fprintf(stderr, "no userfaultfd with THREAD_ID: skipped\n");
		return 77;
	}
	/* This thread faults on guest memory: a hung engine must not hang forever. */
	alarm(120);
	make_file(argv[1]);
	printf("%s\n", argv[1]);
	snprintf(trace, sizeof(trace), "%s/seed-demand", argv[2]);
	run_demand(argv[1], trace);
	snprintf(trace, sizeof(trace), "%s/seed-full", argv[2]);
	run_full(argv[1], trace);
	snprintf(trace, sizeof(trace), "%s/seed-track", argv[2]);
	run_track(argv[1], trace);
	snprintf(trace, sizeof(trace), "%s/seed-readahead", argv[2]);
	run_readahead(argv[1], trace);
	snprintf(bad, sizeof(bad), "%s.damaged", argv[1]);
	make_damaged(argv[1], bad, 2);
	snprintf(trace, sizeof(trace), "%s/seed-failed", argv[2]);
	run_failed(bad, trace);
	unlink(bad);
	make_edited(argv[2]);
	return 0;
}
