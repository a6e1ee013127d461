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
 * engine (as tests/inspect/mkrestore.c makes them, with the same helpers:
 * tests/restore_gen.h), this thread being the one vCPU, then two edited
 * copies for what no run writes:
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
 *   seed-learn          seed-full as version 2 (a learning restore): the learn
 *                       line and touches of stored, zero and never-touched
 *                       blocks, by vCPU 0 and by a thread that is not one,
 *                       two at the same time;
 *   seed-learn-none     seed-full as version 2, a window cut short, no touch;
 *   seed-learn-failed   seed-demand (cancelled) as version 2 with touches.
 *   seed-template       version 2 as a template writes its hot set: header,
 *                       file-uuid, the learn line and touches of stored
 *                       blocks, no stat or lb lines.
 * Exit 0, 1 on failure, 77 without userfaultfd. Built, not a test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corrupt_util.h"
#include "endian_util.h"
#include "restore_gen.h"

#define PAGE 4096u
#define NMB 24u
#define LEN (NMB * PAGE)
#define NLB 6u
#define VCPU0 HALITE_STREAM(HALITE_STREAM_VCPU, 0)
#define PHYS HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0)

/* "hlt-fuzz-trace-1": a uuid no writer draws, so a trace naming it is one of these. */
static const uint8_t fixed_uuid[16] = { 'h', 'l', 't', '-', 'f', 'u', 'z', 'z',
					'-', 't', 'r', 'a', 'c', 'e', '-', '1' };
/* 2026-01-01T00:00:00Z in ns. */
#define FIXED_CREATED 1767225600000000000ull

static uint8_t image[LEN];

/* 1200 random bytes, then zeros: lz4 makes about 1.2 KiB of it, three to an LB. */
static const struct rg_snap snap = {
	.image = image,
	.len = LEN,
	.mb_size = PAGE,
	.nrandom = 1200,
	.codec = HALITE_CODEC_LZ4,
	.lb_size = 4096,
	.lb_count = NLB,
	.mb_stored = 16,
	.mb_zero = 3,
	.mb_untouched = 5,
	.uuid = fixed_uuid,
	.v1_0 = true, /* re-sealed with the fixed uuid below: cu_reseal() knows 1.0 */
};

/* The snapshot's layout as its reader tells it; the runs below follow it. */
static struct rg_lb lbs[NLB];

static void make_file(const char *path)
{
	struct halite_writer *w = rg_writer_create(&snap, path);
	uint8_t *b;
	size_t len;

	rg_put(w, &snap, VCPU0, 0, 3);
	rg_put(w, &snap, PHYS, 6, 3);
	rg_put(w, &snap, VCPU0, 3, 3);
	rg_put(w, &snap, PHYS, 9, 3);
	rg_put(w, &snap, VCPU0, 12, 2);
	rg_put(w, &snap, PHYS, 14, 2);
	rg_check(halite_writer_flush_stream(w, VCPU0), "flush vcpu0");
	rg_check(halite_writer_flush_stream(w, PHYS), "flush physical");
	rg_check(halite_writer_put(w, PHYS, 16, image + 16 * PAGE), "put zero data");
	rg_check(halite_writer_put(w, VCPU0, 17, image + 17 * PAGE), "put zero data");
	rg_check(halite_writer_put_zero(w, 18), "put_zero");
	rg_writer_finish(w);

	b = cu_read_file(path, &len);
	if (!b || len < HLT_DATA_OFFSET + HLT_FTR_SIZE)
		rg_die("%s: cannot read it back", path);
	memcpy(b + HLT_HDR_UUID, fixed_uuid, 16);
	memcpy(b + len - HLT_FTR_SIZE + HLT_FTR_UUID, fixed_uuid, 16);
	halite_put_le64(b + HLT_HDR_CREATED, FIXED_CREATED);
	cu_reseal(b, len, CU_RESEAL_LBS);
	rg_check(cu_write_file(path, b, len), path);
	free(b);
	rg_read_layout(&snap, path, lbs);
}

/* A copy of @path with one byte of LB @lb flipped behind its (unchanged) checksum. */
static void make_damaged(const char *path, const char *out, uint32_t lb)
{
	size_t len;
	uint8_t *b = cu_read_file(path, &len);

	if (!b || len < HLT_DATA_OFFSET + (lb + 1) * 4096u)
		rg_die("%s: cannot read it back", path);
	b[HLT_DATA_OFFSET + lb * 4096u + 100] ^= 0x40;
	rg_check(cu_write_file(out, b, len), out);
	free(b);
}

/* The trace's name on stdout: the list of files made, for the one who remakes the corpus. */
static void run_close(struct rg_run *run, const char *trace)
{
	rg_run_close(run, trace);
	printf("%s\n", trace);
}

static void run_demand(const char *file, const char *trace)
{
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace,
		    HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD, HALITE_LOG_ERROR);
	rg_touch(&run, lbs[0].mb[1], 0);
	rg_settle(run.r, 1, lbs[0].n - 1, false);
	rg_touch(&run, 16, 0);	/* zero */
	rg_touch(&run, 21, 0);	/* never touched */
	rg_touch(&run, lbs[3].mb[0], 0);
	rg_settle(run.r, 2, lbs[0].n - 1 + lbs[3].n - 1, false);
	if (halite_restore_wait(run.r, 0) != -ETIMEDOUT)
		rg_die("demand: the restore ended by itself");
	run_close(&run, trace);
}

static void run_full(const char *file, const char *trace)
{
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace, 0, HALITE_LOG_ERROR);
	rg_check(halite_restore_wait(run.r, 60000), "full: wait");
	if (memcmp(run.mem, image, LEN))
		rg_die("full: restored memory differs from the image");
	run_close(&run, trace);
}

static void run_track(const char *file, const char *trace)
{
	uint64_t staged = 0;
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace,
		    HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD |
			    HALITE_RESTORE_TRACK_ACCESS,
		    HALITE_LOG_ERROR);
	for (uint32_t i = 0; i < NLB; i++) {
		rg_touch(&run, lbs[i].mb[0], 0);
		if (i + 1 == NLB)
			break; /* the last LB completes the restore */
		staged += lbs[i].n - 1;
		rg_settle(run.r, i + 1, staged, true);
		/* LB 0: one of its staged blocks used; LB 1: all of them. */
		for (uint32_t j = 1; j < lbs[i].n && (i == 1 || (i == 0 && j == 1)); j++)
			rg_touch(&run, lbs[i].mb[j], 0);
	}
	rg_check(halite_restore_wait(run.r, 60000), "track: wait");
	if (memcmp(run.mem, image, LEN))
		rg_die("track: restored memory differs from the image");
	run_close(&run, trace);
}

/* Demand the first LB of each stream; readahead brings in the rest of it. */
static void run_readahead(const char *file, const char *trace)
{
	bool in[NLB] = { false };
	uint64_t nin = 0, others = 0;
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace, HALITE_RESTORE_NO_PREFETCH, HALITE_LOG_ERROR);
	for (uint32_t i = 0; i < NLB; i++) {
		if (in[i])
			continue;
		for (uint32_t j = 0; j < NLB; j++) {
			if (lbs[j].stream != lbs[i].stream)
				continue;
			in[j] = true;
			nin++;
			others += j == i ? lbs[j].n - 1 : lbs[j].n;
		}
		rg_touch(&run, lbs[i].mb[0], 0);
		if (nin == NLB)
			break;
		rg_settle(run.r, nin, others, false);
	}
	rg_check(halite_restore_wait(run.r, 60000), "readahead: wait");
	if (memcmp(run.mem, image, LEN))
		rg_die("readahead: restored memory differs from the image");
	run_close(&run, trace);
}

static void run_failed(const char *file, const char *trace)
{
	struct rg_run run;
	int ret;

	/* Meant to fail: its error log would only alarm. */
	rg_run_open(&run, &snap, file, trace, HALITE_RESTORE_NO_READAHEAD, RG_LOG_NONE);
	ret = halite_restore_wait(run.r, 60000);
	if (ret != -HALITE_E_LB_CHECKSUM)
		rg_die("failed: the restore ended with %d (%s)", ret, halite_strerror(ret));
	run_close(&run, trace);
}

static char *slurp(const char *path)
{
	size_t len;
	uint8_t *b = cu_read_file(path, &len);
	char *s;

	if (!b)
		rg_die("%s: cannot read it", path);
	s = realloc(b, len + 1);
	if (!s)
		rg_die("out of memory");
	s[len] = '\0';
	return s;
}

static void write_text(const char *path, const char *s)
{
	rg_check(cu_write_file(path, s, strlen(s)), path);
	printf("%s\n", path);
}

/* seed-full with "stat long xxx...", @len bytes long, after the known stats. */
static void make_long_line(const char *full, const char *out, size_t len)
{
	char *s = slurp(full), *p, *t;
	char *line = malloc(len + 1);

	p = strstr(s, "stat error 0\n");
	if (!p || !line)
		rg_die("%s: no 'stat error 0' line", full);
	p += strlen("stat error 0\n");
	memset(line, 'x', len);
	memcpy(line, "stat long ", 10);
	line[len] = '\0';
	if (asprintf(&t, "%.*s%s\n%s", (int)(p - s), s, line, p) < 0)
		rg_die("out of memory");
	write_text(out, t);
	free(t);
	free(line);
	free(s);
}

/*
 * @in as version 2: its header's version changed, the learn line and
 * @touches (lines, each ending in a newline) appended.
 */
static void make_learn(const char *in, const char *out, const char *learn, const char *touches)
{
	char *s = slurp(in), *t;

	if (strncmp(s, "halite-restore-trace 1\n", 23) != 0)
		rg_die("%s: not a version 1 trace", in);
	s[21] = '2';
	if (asprintf(&t, "%s%s\n%s", s, learn, touches) < 0)
		rg_die("out of memory");
	write_text(out, t);
	free(t);
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
		rg_die("%s: no 'stat error 0' line", full);
	p += strlen("stat error 0\n");
	if (asprintf(&t, "%.*sstat lb_future 3\nstat mb_future_bytes 4096\n%s", (int)(p - s), s,
		     p) < 0)
		rg_die("out of memory");
	snprintf(out, sizeof(out), "%s/seed-unknown-stats", dir);
	write_text(out, t);
	free(t);
	free(s);

	/* Failed before any LB was read: no lb lines. */
	s = slurp(demand);
	p = strstr(s, "stat error -125\n");
	if (!p)
		rg_die("%s: no 'stat error -125' line", demand);
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

	/* Version 2, the learning restore's (the layout: the top of this file). */
	snprintf(out, sizeof(out), "%s/seed-learn", dir);
	make_learn(full, out, "learn 2000 1",
		   "touch 1000 0 4 stored\ntouch 1000 0 16 zero\ntouch 2500 - 7 stored\n"
		   "touch 3000 0 20 untouched\ntouch 3000 0 0 stored\ntouch 9000 - 18 zero\n");
	snprintf(out, sizeof(out), "%s/seed-learn-none", dir);
	make_learn(full, out, "learn 50 0", "");
	snprintf(out, sizeof(out), "%s/seed-learn-failed", dir);
	make_learn(demand, out, "learn 1000 0",
		   "touch 10 0 1 stored\ntouch 20 0 16 zero\ntouch 30 0 21 untouched\n"
		   "touch 40 0 12 stored\n");

	/* Version 2 written by a template: the uuid line is seed-full's. */
	s = slurp(full);
	p = strchr(s, '\n');
	t = p ? strchr(p + 1, '\n') : NULL;
	if (!t)
		rg_die("%s: no file-uuid line", full);
	t[1] = '\0';
	if (asprintf(&t, "%slearn 2000 0\ntouch 0 - 4 stored\ntouch 1200 0 7 stored\n"
		     "touch 1200 - 0 stored\ntouch 5000 0 12 stored\n", s) < 0)
		rg_die("out of memory");
	snprintf(out, sizeof(out), "%s/seed-template", dir);
	write_text(out, t);
	free(t);
	free(s);
}

int main(int argc, char **argv)
{
	char trace[4200], bad[4200];

	if (argc != 3) {
		fprintf(stderr, "usage: fuzz_trace_seed_gen SNAPSHOT DIR\n");
		return 2;
	}
	rg_begin();
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
