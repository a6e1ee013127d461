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
 * `halite-bench-remote-restore relayout SNAPSHOT DIR` writes the
 * physical-order peer's file (bench/relayout.c's physical.hlt).
 *
 * Times run from the call to halite_restore_open(): open_s (the reader has
 * the index), resume_s (the vCPUs start), first_access_s and
 * all_first_access_s (the first vCPU's, and every vCPU's, first access
 * done: the synthetic guest's "first answer", each needing a page-table
 * walk through restored memory), done_s (every memory block in), and
 * lbs_before_first (LBs read, demand and prefetch, when the first access
 * was seen: the reads the first answer could have waited for). One JSON
 * object on stdout; exit 0, 1 on failure (a JSON "error"), 2 on usage, 77
 * without userfaultfd.
 *
 * A failed restore leaves the vCPUs blocked on memory that will never be
 * filled: that path reports and exits without freeing the restore (as
 * halite-cycle does).
 */
#define _GNU_SOURCE
#include <errno.h>
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
	struct halite_restore_stats st;
	char digest[17];
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
static int seek_vcpus(struct halite_restore *r, struct synth_guest *g, unsigned nvcpus)
{
	const void *data;
	uint64_t len;
	int ret;

	ret = halite_restore_device_state(r, &data, &len);
	if (ret || len != 8ull * nvcpus)
		return fail("%s: the device state is %s, not one 8-byte step per vCPU (%u): "
			    "were the guest options those of the save?", halite_restore_errmsg(r),
			    ret ? halite_strerror(ret) : "of another size", nvcpus);
	for (unsigned v = 0; v < nvcpus; v++) {
		ret = synth_vcpu_seek(g, v, halite_get_le64((const uint8_t *)data + 8 * v));
		if (ret)
			return fail("synth_vcpu_seek vCPU %u: %s", v, strerror(-ret));
	}
	return 0;
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
			if (!run->first_ns) {
				struct halite_restore_stats st;

				run->first_ns = now;
				halite_restore_stats(r, &st);
				run->lbs_before_first = st.lb_demand + st.lb_prefetch;
			}
			if (!--left)
				run->all_first_ns = now;
		}
		if (left && halite_restore_wait(r, 0) != -ETIMEDOUT)
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
	       ", \"mem_xxh3\": \"%s\"}\n",
	       sec(run->done_ns), st->faults, st->faults_vcpu, st->lb_total, st->lb_demand,
	       st->lb_prefetch, st->lb_retries, run->lbs_before_first, st->bytes_read, run->accesses,
	       run->o.mem_bytes, run->digest);
}

static int usage(FILE *f, int code)
{
	fprintf(f, "Usage: " PROG " [--timeout S] SNAPSHOT [GUEST OPTIONS...]\n\n"
		"One timed lazy restore of a saved synthetic guest from SNAPSHOT (a file or\n"
		"s3://BUCKET/KEY, with AWS_* in the environment). GUEST OPTIONS are halite-synth's\n"
		"(halite-synth --help), those the guest was saved with. Prints one JSON object.\n"
		"  --timeout S     for the whole restore (600)\n\n"
		"       " PROG " relayout SNAPSHOT DIR\n"
		"Write DIR/physical.hlt (and the other organisations of halite-bench micro):\n"
		"SNAPSHOT's blocks in guest-physical order, uncompressed; prints its path.\n");
	return code;
}

/*
 * The physical-order peer's file: SRC re-laid out by bench/relayout.c into
 * DIR (physical.hlt: blocks in guest-physical order, codec none, SRC's LB
 * size; the other organisations are written too and left to the caller).
 */
static int cmd_relayout(const char *src, const char *dir)
{
	struct relayout_out out = { 0 };
	char err[512] = "";
	int ret = relayout(src, dir, 1, &out, err, sizeof(err));

	if (ret)
		return fail("relayout %s: %s (%s)", src, err, halite_strerror(ret));
	printf("{\"physical\": ");
	halite_json_str(stdout, out.hlt_path[ORG_PHYSICAL]);
	printf(", \"lb_size\": %u, \"lb_count\": %" PRIu64 ", \"file_bytes\": %" PRIu64
	       ", \"seconds\": %.3f}\n", out.lb_size, out.lb_count[ORG_PHYSICAL],
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

	if (argc == 4 && !strcmp(argv[1], "relayout"))
		return cmd_relayout(argv[2], argv[3]);

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return usage(stdout, 0);
		else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			if (halite_parse_u64_range(argv[++i], 1, 86400, &v))
				return fail("--timeout '%s': want seconds, 1 .. 86400", argv[i]) + 1;
			run.timeout_s = (unsigned)v;
		} else if (argv[i][0] == '-')
			return fail("unknown option '%s' before SNAPSHOT (--help)", argv[i]) + 1;
		else
			break;
	}
	if (i >= argc)
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
		int ret = restore(&run);

		if (ret)
			return ret;
	}
	print_json(&run);
	return 0;
}
