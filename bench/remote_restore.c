/* SPDX-License-Identifier: MIT */
/*
 * halite-bench-remote-restore: one lazy restore of a saved synthetic guest
 * (halite-synth save) from a local file or s3://BUCKET/KEY, timed, for
 * bench/remote.py. The guest options must be those the snapshot was saved
 * with (its synth.args); the restored vCPUs only read (write 0%), so the
 * memory's digest at the end is the snapshot's whatever the timing, and the
 * peers of one run must all print the same digest.
 *
 *   halite-bench-remote-restore [--timeout S] SNAPSHOT
 *                               [GUEST OPTIONS...]
 *
 * `halite-bench-remote-restore relayout [--lb-size N] [--compressed]
 * [--physical-only] SNAPSHOT DIR` writes the physical-order peer's file
 * (bench/relayout.c's physical.hlt; the physical-chunk peer with
 * --lb-size 4M --compressed). `halite-bench-remote-restore pages ...` is
 * the page-granular peer (bench/s3_pages.h): the same guest and workload,
 * its memory fetched 4 KiB per fault from the raw image's object.
 *
 * Times run from the call to halite_restore_open(): open_s (the reader has
 * the index), resume_s (the vCPUs start), first_access_s and
 * all_first_access_s (the first vCPU's, and every vCPU's, first access
 * done: the synthetic guest's "first answer", each needing a page-table
 * walk through restored memory), done_s (every memory block in), and
 * lbs_before_first (LBs read, demand and prefetch, when the first access
 * was seen: the reads the first answer could have waited for), and from an
 * object store engine_store: the reader's own count of requests (after the
 * open, at the first access, in all) and of the host's LB cache. One JSON
 * object on stdout; exit 0, 1 on failure (a JSON "error"), 2 on usage, 77
 * without userfaultfd.
 *
 * A failed restore leaves the vCPUs blocked on memory that will never be
 * filled: that path reports and exits without freeing the restore (as
 * halite-cycle does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include <halite/halite.h>

#include "cli.h"
#include "endian_util.h"
#include "stats.h"
#include "synth.h"
#include "relayout.h"
#include "s3_pages.h"
#include "tool.h"

#define PROG "halite-bench-remote-restore"
#define POLL_NS 200000
#define CHUNK (4u << 20)

struct run {
	const char *path;
	unsigned timeout_s;
	struct synth_opts o;
	uint64_t t_open, open_ns, resume_ns, first_ns, all_first_ns, done_ns;
	uint64_t accesses;
	uint64_t lbs_before_first;	/* LBs read when the first access was seen */
	/* The store's side (s3:// only): after the open, at the first access, at the end. */
	struct halite_store_stats store_open, store_first, store;
	struct halite_restore_stats st;
	char digest[17];
	/* The page-granular peer (pages): */
	struct s3_pages *pages;
	const char *state_path, *raw_path;
	unsigned threads, window_ms;
	uint64_t gets_before_first, pages_checked, pages_differ;
	struct s3_pages_stats pst;
};

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, PROG ": %s\n", msg);
	halite_cli_json_fail(stdout, msg, 1);
	fflush(stdout);
	return 1;
}

static void __attribute__((noreturn)) died(struct halite_restore *r, int ret, const char *what)
{
	fail("%s: %s (%s)", what, halite_strerror(ret), halite_restore_errmsg(r));
	_exit(1);
}

/* The vCPUs resume at the steps the file's device state holds: u64 LE each. */
static int seek_steps(struct synth_guest *g, unsigned nvcpus, int ret, const void *data,
		      uint64_t len, const char *where)
{
	if (ret || len != 8ull * nvcpus)
		return fail("%s: the device state is %s, not one 8-byte step per vCPU (%u): "
			    "were the guest options those of the save?", where,
			    ret ? halite_strerror(ret) : "of another size", nvcpus);
	for (unsigned v = 0; v < nvcpus; v++) {
		ret = synth_vcpu_seek(g, v, halite_get_le64((const uint8_t *)data + 8 * v));
		if (ret)
			return fail("synth_vcpu_seek vCPU %u: %s", v, strerror(-ret));
	}
	return 0;
}

static int seek_vcpus(struct halite_restore *r, struct synth_guest *g, unsigned nvcpus)
{
	const void *data = NULL;
	uint64_t len = 0;
	int ret = halite_restore_device_state(r, &data, &len);

	return seek_steps(g, nvcpus, ret, data, len, halite_restore_errmsg(r));
}

/* A handler failed (its sentence written: the error code is set just before). */
static bool pages_failed(struct run *run)
{
	return s3_pages_errmsg(run->pages)[0] != '\0';
}

/* What the first answer could have waited for: the reads done when it was seen. */
static void note_first(struct run *run, struct halite_restore *r, uint64_t now)
{
	run->first_ns = now;
	if (r) {
		struct halite_restore_stats st;

		halite_restore_stats(r, &st);
		run->lbs_before_first = st.lb_demand + st.lb_prefetch;
		halite_reader_store_stats(halite_restore_reader(r), &run->store_first);
	} else {
		struct s3_pages_stats pst;

		s3_pages_stats(run->pages, &pst);
		run->gets_before_first = pst.gets;
	}
}

static void watch_first_access(struct run *run, struct synth_guest *g, struct halite_restore *r)
{
	uint64_t start[SYNTH_MAX_VCPUS];
	bool seen[SYNTH_MAX_VCPUS] = { false };
	unsigned left = run->o.nvcpus;
	uint64_t limit = halite_now_ns() + (uint64_t)run->timeout_s * 1000000000ull;
	struct timespec ts = { 0, POLL_NS };

	for (unsigned v = 0; v < run->o.nvcpus; v++) {
		struct synth_vcpu_stats vs;

		start[v] = synth_vcpu_stats(g, v, &vs) ? 0 : vs.accesses;
	}
	while (left && halite_now_ns() < limit) {
		for (unsigned v = 0; v < run->o.nvcpus; v++) {
			struct synth_vcpu_stats vs;
			uint64_t now;

			if (seen[v] || synth_vcpu_stats(g, v, &vs) || vs.accesses <= start[v])
				continue;
			now = halite_now_ns() - run->t_open;
			seen[v] = true;
			if (!run->first_ns)
				note_first(run, r, now);
			if (!--left)
				run->all_first_ns = now;
		}
		if (left && r && halite_restore_wait(r, 0) != -ETIMEDOUT)
			break;
		if (left && !r && pages_failed(run))
			break;
		nanosleep(&ts, NULL);
	}
}

static int digest(struct run *run, struct synth_guest *g, uint64_t mem_bytes)
{
	XXH3_state_t *h = XXH3_createState();
	uint8_t *buf = malloc(CHUNK);
	int ret = 0;

	if (!h || !buf || XXH3_64bits_reset(h) != XXH_OK) {
		ret = fail("no memory for the digest");
		goto out;
	}
	for (uint64_t off = 0; off < mem_bytes; off += CHUNK) {
		uint64_t n = mem_bytes - off < CHUNK ? mem_bytes - off : CHUNK;
		int err = synth_copy_range(g, off, n, buf);

		if (err) {
			ret = fail("synth_copy_range: %s", strerror(-err));
			goto out;
		}
		XXH3_64bits_update(h, buf, n);
	}
	snprintf(run->digest, sizeof(run->digest), "%016llx",
		 (unsigned long long)XXH3_64bits_digest(h));
out:
	free(buf);
	XXH3_freeState(h);
	return ret;
}

static int restore(struct run *run)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct synth_guest *g;
	struct synth_info info;
	struct halite_restore *r;
	pid_t tids[SYNTH_MAX_VCPUS];
	int ret;

	ret = synth_create(&g, &run->o);
	if (ret)
		return fail("creating the restore's guest: %s", strerror(-ret));
	synth_info(g, &info);
	run->o.nvcpus = info.nvcpus;	/* defaults resolved */
	run->o.mem_bytes = info.mem_bytes;
	for (unsigned v = 0; v < run->o.nvcpus; v++) {
		struct synth_vcpu_info vi;

		if (!synth_vcpu_info(g, v, &vi))
			tids[v] = vi.tid;
	}
	struct halite_restore_region reg = { SYNTH_REGION_NAME, (uintptr_t)info.host_addr,
					     info.mem_bytes, HALITE_MEM_ANON, -1, 0 };

	o.vcpu_tids = tids;
	o.nvcpus = run->o.nvcpus;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	run->t_open = halite_now_ns();
	ret = halite_restore_open(&r, run->path, &reg, 1, &o);
	run->open_ns = halite_now_ns() - run->t_open;
	if (!ret)
		halite_reader_store_stats(halite_restore_reader(r), &run->store_open);
	if (ret == -HALITE_E_UNSUPPORTED || ret == -EPERM) {
		fprintf(stderr, PROG ": userfaultfd: %s\n", halite_strerror(ret));
		return 77;
	}
	if (ret) {
		synth_free(g);
		return fail("halite_restore_open %s: %s", run->path, halite_strerror(ret));
	}
	ret = seek_vcpus(r, g, run->o.nvcpus);
	if (ret) {
		halite_restore_free(r);
		synth_free(g);
		return ret;
	}
	ret = halite_restore_start(r);
	if (ret)
		died(r, ret, "halite_restore_start");
	ret = synth_start(g);
	run->resume_ns = halite_now_ns() - run->t_open;
	if (ret)
		died(r, ret, "synth_start");
	watch_first_access(run, g, r);
	ret = halite_restore_wait(r, (int)(run->timeout_s * 1000));
	run->done_ns = halite_now_ns() - run->t_open;
	halite_restore_stats(r, &run->st);
	halite_reader_store_stats(halite_restore_reader(r), &run->store);
	if (ret)
		died(r, ret, "the restore");
	ret = synth_stop(g);
	for (unsigned v = 0; !ret && v < run->o.nvcpus; v++) {
		struct synth_vcpu_stats vs;

		if (!synth_vcpu_stats(g, v, &vs))
			run->accesses += vs.accesses;
	}
	if (ret)
		ret = fail("synth_stop: %s", strerror(-ret));
	else
		ret = digest(run, g, info.mem_bytes);
	halite_restore_free(r);
	synth_free(g);
	return ret;
}

static double sec(uint64_t ns)
{
	return ns / 1e9;
}

/*
 * The engine's own count of the store's work (the proxy counts it too):
 * the open's requests, those before the first access, in all, and the
 * host's LB cache. lb_requests are the requests after the open: those for
 * LBs (0 on a second restore whose LBs are all in the cache).
 */
static void print_store(const struct run *run)
{
	const struct halite_store_stats *s = &run->store;

	printf("\"engine_store\": ");
	if (!s->requests && !s->cached) {
		printf("null");
		return;
	}
	printf("{\"open_requests\": %" PRIu64 ", \"requests_before_first\": %" PRIu64
	       ", \"bytes_before_first\": %" PRIu64 ", \"requests\": %" PRIu64
	       ", \"lb_requests\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"retries\": %" PRIu64
	       ", \"connects\": %" PRIu64 ", \"cache\": ",
	       run->store_open.requests, run->store_first.requests, run->store_first.bytes,
	       s->requests, s->requests - run->store_open.requests, s->bytes, s->retries,
	       s->connects);
	if (s->cached)
		printf("{\"hits\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"bytes_hit\": %" PRIu64
		       ", \"puts\": %" PRIu64 ", \"put_errors\": %" PRIu64 "}}",
		       s->cache_hits, s->cache_misses, s->cache_bytes_hit, s->cache_puts,
		       s->cache_put_errors);
	else
		printf("null}");
}

static void print_json(const struct run *run)
{
	const struct halite_restore_stats *st = &run->st;

	printf("{\"snapshot\": ");
	halite_json_str(stdout, run->path);
	printf(", \"open_s\": %.6f, \"resume_s\": %.6f, ", sec(run->open_ns),
	       sec(run->resume_ns));
	if (run->first_ns)
		printf("\"first_access_s\": %.6f, ", sec(run->first_ns));
	else
		printf("\"first_access_s\": null, ");
	if (run->all_first_ns)
		printf("\"all_first_access_s\": %.6f, ", sec(run->all_first_ns));
	else
		printf("\"all_first_access_s\": null, ");
	printf("\"done_s\": %.6f, \"faults\": %" PRIu64 ", \"faults_vcpu\": %" PRIu64
	       ", \"lb_total\": %" PRIu64 ", \"lb_demand\": %" PRIu64 ", \"lb_prefetch\": %" PRIu64
	       ", \"lb_retries\": %" PRIu64 ", \"lbs_before_first\": %" PRIu64
	       ", \"bytes_read\": %" PRIu64
	       ", \"vcpu_accesses\": %" PRIu64 ", \"mem_bytes\": %" PRIu64
	       ", \"mem_xxh3\": \"%s\", ",
	       sec(run->done_ns), st->faults, st->faults_vcpu, st->lb_total, st->lb_demand,
	       st->lb_prefetch, st->lb_retries, run->lbs_before_first, st->bytes_read, run->accesses,
	       run->o.mem_bytes, run->digest);
	print_store(run);
	printf("}\n");
}

/* Every fetched page against the local raw image: the bytes the store gave are the image's. */
static int check_pages(struct run *run, const uint8_t *mem, uint64_t len)
{
	uint8_t page[4096];
	int fd = open(run->raw_path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return fail("%s: %s", run->raw_path, strerror(errno));
	for (uint64_t off = 0; off < len; off += sizeof(page)) {
		ssize_t n;

		if (!s3_pages_fetched(run->pages, off))
			continue;
		n = pread(fd, page, sizeof(page), (off_t)off);
		if (n < 0) {
			close(fd);
			return fail("%s: read at %#llx: %s", run->raw_path,
				    (unsigned long long)off, strerror(errno));
		}
		memset(page + n, 0, sizeof(page) - (size_t)n);
		run->pages_checked++;
		run->pages_differ += memcmp(page, mem + off, sizeof(page)) != 0;
	}
	close(fd);
	return 0;
}

/*
 * The page-granular peer: the same guest and workload as restore(), its
 * memory filled by s3_pages.c, one GET per faulting page. No moment has all
 * memory in (pages the guest does not touch are never fetched): the guest
 * runs window_ms after every vCPU's first access, then stops.
 */
static int pages_restore(struct run *run)
{
	struct halite_reader *rd = NULL;
	struct synth_guest *g;
	struct synth_info info;
	const void *dev = NULL;
	uint64_t devlen = 0;
	char err[512] = "";
	int ret;

	ret = halite_reader_open(&rd, run->state_path, NULL);
	if (ret)
		return fail("%s: %s", run->state_path, halite_strerror(ret));
	ret = synth_create(&g, &run->o);
	if (ret) {
		halite_reader_free(rd);
		return fail("creating the restore's guest: %s", strerror(-ret));
	}
	synth_info(g, &info);
	run->o.nvcpus = info.nvcpus;
	run->o.mem_bytes = info.mem_bytes;
	ret = halite_reader_device_state(rd, &dev, &devlen);
	ret = seek_steps(g, run->o.nvcpus, ret, dev, devlen, run->state_path);
	halite_reader_free(rd);
	if (ret)
		goto out;
	run->t_open = halite_now_ns();
	ret = s3_pages_start(&run->pages, info.host_addr, info.mem_bytes, run->path, run->threads,
			     err, sizeof(err));
	run->open_ns = halite_now_ns() - run->t_open;
	if (ret == -HALITE_E_UNSUPPORTED || ret == -EPERM) {
		fprintf(stderr, PROG ": %s\n", err);
		ret = 77;
		goto out;
	}
	if (ret) {
		ret = fail("%s", err);
		goto out;
	}
	ret = synth_start(g);
	run->resume_ns = halite_now_ns() - run->t_open;
	if (ret) {
		ret = fail("synth_start: %s", strerror(-ret));
		goto out;
	}
	watch_first_access(run, g, NULL);
	if (run->all_first_ns) {
		struct timespec ts = { run->window_ms / 1000, (run->window_ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
	}
	/*
	 * A failed handler leaves a vCPU blocked on a page that will never
	 * come, and synth_stop() would wait for it: report and exit, as died().
	 */
	if (pages_failed(run)) {
		fail("the page handler failed: %s", s3_pages_errmsg(run->pages));
		_exit(1);
	}
	/* The handlers still serve the faults the vCPUs are blocked in while they stop. */
	ret = synth_stop(g);
	run->done_ns = halite_now_ns() - run->t_open;
	for (unsigned v = 0; !ret && v < run->o.nvcpus; v++) {
		struct synth_vcpu_stats vs;

		if (!synth_vcpu_stats(g, v, &vs))
			run->accesses += vs.accesses;
	}
	s3_pages_stop(run->pages);
	s3_pages_stats(run->pages, &run->pst);
	if (ret)
		ret = fail("synth_stop: %s", strerror(-ret));
	else if (!run->all_first_ns)
		ret = fail("not every vCPU made its first access in %u s", run->timeout_s);
	else
		ret = check_pages(run, info.host_addr, info.mem_bytes);
out:
	synth_free(g);
	s3_pages_free(run->pages);
	run->pages = NULL;
	return ret;
}

static void print_pages_json(const struct run *run)
{
	const struct s3_pages_stats *p = &run->pst;

	printf("{\"snapshot\": ");
	halite_json_str(stdout, run->path);
	printf(", \"open_s\": %.6f, \"resume_s\": %.6f, \"first_access_s\": %.6f"
	       ", \"all_first_access_s\": %.6f, \"done_s\": null, \"stopped_s\": %.6f"
	       ", \"window_s\": %.3f, \"threads\": %u, \"faults\": %" PRIu64
	       ", \"pages_fetched\": %" PRIu64 ", \"gets_before_first\": %" PRIu64
	       ", \"pages_checked\": %" PRIu64 ", \"pages_differ\": %" PRIu64
	       ", \"vcpu_accesses\": %" PRIu64 ", \"mem_bytes\": %" PRIu64
	       ", \"mem_xxh3\": null, \"engine_store\": {\"requests_before_first\": %" PRIu64
	       ", \"bytes_before_first\": %" PRIu64 ", \"requests\": %" PRIu64
	       ", \"bytes\": %" PRIu64 ", \"connects\": %" PRIu64 ", \"cache\": null}}\n",
	       sec(run->open_ns), sec(run->resume_ns), sec(run->first_ns), sec(run->all_first_ns),
	       sec(run->done_ns), run->window_ms / 1e3, run->threads, p->faults, p->pages,
	       run->gets_before_first, run->pages_checked, run->pages_differ, run->accesses,
	       run->o.mem_bytes, run->gets_before_first, run->gets_before_first * 4096,
	       p->requests, p->bytes, p->connects);
}

static int usage(FILE *f, int code)
{
	fprintf(f, "Usage: " PROG " [--timeout S] SNAPSHOT [GUEST OPTIONS...]\n\n"
		"One timed lazy restore of a saved synthetic guest from SNAPSHOT (a file or\n"
		"s3://BUCKET/KEY, with AWS_* in the environment). GUEST OPTIONS are halite-synth's\n"
		"(halite-synth --help), those the guest was saved with. Prints one JSON object.\n"
		"  --timeout S     for the whole restore (600)\n\n"
		"       " PROG " relayout SNAPSHOT DIR\n"
		"       " PROG " relayout [--lb-size N] [--compressed] [--physical-only]\n"
		"                          SNAPSHOT DIR\n"
		"Write DIR/physical.hlt (and the other organisations of halite-bench micro):\n"
		"SNAPSHOT's blocks in guest-physical order, uncompressed at its LB size, or in\n"
		"LBs of N bytes (up to 4M) compressed as SNAPSHOT; prints its path.\n\n"
		"       " PROG " pages [--timeout S] [--threads N] [--window-ms MS]\n"
		"                          --state SNAPSHOT --check RAW URL [GUEST OPTIONS...]\n"
		"The page-granular peer: a userfaultfd handler (N threads, 2) that fetches\n"
		"each faulting 4 KiB page of the guest's raw image at s3://URL with one GET.\n"
		"The vCPUs' steps come from SNAPSHOT's device state; the guest runs MS (2000)\n"
		"after every vCPU's first access, then each fetched page is compared with\n"
		"RAW's bytes (the local image).\n");
	return code;
}

/*
 * The physical-order peer's file: SRC re-laid out by bench/relayout.c into
 * DIR (physical.hlt: blocks in guest-physical order). Without options, codec
 * none at SRC's LB size, and the other organisations are written too;
 * --lb-size and --compressed make the physical-chunk peer (4 MiB LBs
 * compressed as SRC), --physical-only leaves the others out.
 */
static int cmd_relayout(int argc, char **argv)
{
	struct relayout_opts ro = { 0 };
	struct relayout_out out = { 0 };
	char err[512] = "";
	uint64_t v;
	int i, ret;

	for (i = 2; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--lb-size") && i + 1 < argc) {
			if (halite_parse_size(argv[++i], &v) || v < HALITE_MIN_LB_SIZE ||
			    v > HALITE_MAX_LB_SIZE || (v & (v - 1)))
				return fail("--lb-size '%s': a power of two from %u to %u bytes",
					    argv[i], HALITE_MIN_LB_SIZE, HALITE_MAX_LB_SIZE) + 1;
			ro.physical_lb_size = (uint32_t)v;
		} else if (!strcmp(argv[i], "--compressed")) {
			ro.physical_compressed = true;
		} else if (!strcmp(argv[i], "--physical-only")) {
			ro.physical_only = true;
		} else {
			return fail("relayout: unknown option '%s' (--help)", argv[i]) + 1;
		}
	}
	if (argc - i != 2)
		return usage(stderr, 2);
	ret = relayout_ext(argv[i], argv[i + 1], 1, &ro, &out, err, sizeof(err));
	if (ret)
		return fail("relayout %s: %s (%s)", argv[i], err, halite_strerror(ret));
	printf("{\"physical\": ");
	halite_json_str(stdout, out.hlt_path[ORG_PHYSICAL]);
	printf(", \"raw\": ");
	halite_json_str(stdout, out.raw_path);
	printf(", \"lb_size\": %u, \"physical_lb_size\": %u, \"compressed\": %s, \"lb_count\": %" PRIu64
	       ", \"file_bytes\": %" PRIu64 ", \"seconds\": %.3f}\n", out.lb_size,
	       ro.physical_lb_size ? ro.physical_lb_size : out.lb_size,
	       ro.physical_compressed ? "true" : "false", out.lb_count[ORG_PHYSICAL],
	       out.file_bytes[ORG_PHYSICAL], out.seconds);
	relayout_out_free(&out);
	return 0;
}

int main(int argc, char **argv)
{
	struct run run = { .timeout_s = 600 };
	struct hs_args a;
	uint64_t v;
	int i;

	if (argc > 1 && !strcmp(argv[1], "relayout"))
		return cmd_relayout(argc, argv);
	if (argc > 1 && !strcmp(argv[1], "pages")) {
		run.threads = 2;
		run.window_ms = 2000;
		argv++;
		argc--;
	}

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return usage(stdout, 0);
		else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			if (halite_parse_u64_range(argv[++i], 1, 86400, &v))
				return fail("--timeout '%s': want seconds, 1 .. 86400", argv[i]) + 1;
			run.timeout_s = (unsigned)v;
		} else if (run.threads && !strcmp(argv[i], "--threads") && i + 1 < argc) {
			if (halite_parse_u64_range(argv[++i], 1, S3_PAGES_MAX_THREADS, &v))
				return fail("--threads '%s': want 1 .. %u", argv[i],
					    S3_PAGES_MAX_THREADS) + 1;
			run.threads = (unsigned)v;
		} else if (run.threads && !strcmp(argv[i], "--window-ms") && i + 1 < argc) {
			if (halite_parse_u64_range(argv[++i], 0, 3600000, &v))
				return fail("--window-ms '%s': want 0 .. 3600000", argv[i]) + 1;
			run.window_ms = (unsigned)v;
		} else if (run.threads && !strcmp(argv[i], "--state") && i + 1 < argc) {
			run.state_path = argv[++i];
		} else if (run.threads && !strcmp(argv[i], "--check") && i + 1 < argc) {
			run.raw_path = argv[++i];
		} else if (argv[i][0] == '-')
			return fail("unknown option '%s' before SNAPSHOT (--help)", argv[i]) + 1;
		else
			break;
	}
	if (i >= argc || (run.threads && (!run.state_path || !run.raw_path)))
		return usage(stderr, 2);
	run.path = argv[i];
	/* The rest are the guest's options: hs_parse() wants a command name first. */
	argv[i] = "run";
	if (hs_parse(argc - i, argv + i, HS_CMD_RUN, &a))
		return 2;
	run.o = a.o;
	run.o.flags |= SYNTH_F_ATTACH;
	run.o.write_pct = 0;
	run.o.backing = SYNTH_MEM_ANON;
	run.o.log_fn = halite_log_stderr;
	{
		int ret = run.threads ? pages_restore(&run) : restore(&run);

		if (ret)
			return ret;
	}
	if (run.threads)
		print_pages_json(&run);
	else
		print_json(&run);
	return 0;
}
