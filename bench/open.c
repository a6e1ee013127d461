/* SPDX-License-Identifier: MIT */
/*
 * halite-bench-open: open to guest running, against memory size, format 1.0
 * against 1.1 (chunked index) in the same run (issue 15 part 4).
 *
 * For each size (1, 4, 16, 64 GiB; --quick 1 and 4) it writes two files of
 * the same content with the writer API, one per format version: one region,
 * 1 in --stored-every MBs stored (cheap data that lz4 halves: a realistic
 * count of LBs, so the lb-table is big), the rest never touched. Then, per
 * file, --runs times: t0, halite_restore_open, halite_restore_start (no
 * prefetch: "running" is the engine serving faults), and the first access
 * of the "guest" (this thread reads an MB in the middle of memory) done:
 * that read's bytes are checked against what was written. Reported: the
 * median of each phase, and the reader's open alone (halite_reader_open).
 *
 * The machine may be shared: compare 1.0 and 1.1 within this run. Never
 * asserts timings. Files go under --dir (default /var/tmp) and are removed.
 * Output: a table, or with --json one JSON object. Exit 0, 1 on a failed
 * check, 2 usage, 77 without userfaultfd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "bench_util.h"
#include "cli.h"
#include "stats.h"

#define GIB (1ull << 30)
#define MAX_RUNS 15

/* MB @m's bytes: its index, then a pattern half of which is noise (lz4 halves it). */
static void mb_data(uint64_t m, uint8_t *p, uint32_t len)
{
	uint64_t s = 0x9e3779b97f4a7c15ull ^ (m % 64);

	for (uint32_t i = 0; i < len; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		p[i] = (i / 64) % 2 ? (uint8_t)s : (uint8_t)(i / 8);
	}
	memcpy(p, &m, sizeof(m));
}

static int write_file(const char *path, uint64_t bytes, uint64_t every, bool v10,
		      uint64_t *stored)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_region reg = { "pc.ram", 0, bytes };
	struct halite_writer *w;
	uint8_t *buf;
	uint64_t n;
	int ret;

	o.codec = HALITE_CODEC_LZ4;
	o.flags = HALITE_WRITER_NO_SYNC | (v10 ? HALITE_WRITER_V1_0 : 0);
	ret = halite_writer_create(&w, path, &reg, 1, &o);
	if (ret)
		return ret;
	n = halite_writer_mb_count(w);
	buf = malloc(halite_writer_mb_size(w));
	*stored = 0;
	for (uint64_t m = 0; m < n && !ret; m += every) {
		mb_data(m, buf, halite_writer_mb_size(w));
		ret = halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, m / every % 4), m, buf);
		(*stored)++;
	}
	if (!ret)
		ret = halite_writer_finish(w);
	if (ret)
		fprintf(stderr, "%s: %s\n", path, halite_writer_errmsg(w));
	halite_writer_free(w, ret != 0);
	free(buf);
	return ret;
}

struct run {
	double reader_open_ms, open_ms, start_ms, first_ms, total_ms;
};

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One open-to-running; 0, 1 on a wrong byte, or a negative error. */
static int one_run(const char *path, uint64_t bytes, uint64_t every, struct run *out)
{
	HALITE_OPTS(halite_restore_opts, ro);
	struct halite_restore_region reg = { .name = "pc.ram", .length = bytes };
	struct halite_restore *r = NULL;
	struct halite_reader *rd = NULL;
	uint64_t t0, t1, t2, t3, mb, want[1];
	volatile uint64_t got;
	uint8_t *mem;
	int ret;

	t0 = halite_now_ns();
	ret = halite_reader_open(&rd, path, NULL);
	out->reader_open_ms = (double)(halite_now_ns() - t0) / 1e6;
	halite_reader_free(rd);
	if (ret)
		return ret;
	mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED)
		return -errno;
	reg.host = (uint64_t)(uintptr_t)mem;
	ro.flags = HALITE_RESTORE_NO_PREFETCH;
	/* An MB in the middle of memory, one that was stored: the guest's first access. */
	mb = (bytes / 8192 / 2) / every * every;
	t0 = halite_now_ns();
	ret = halite_restore_open(&r, path, &reg, 1, &ro);
	t1 = halite_now_ns();
	if (!ret)
		ret = halite_restore_start(r);
	t2 = halite_now_ns();
	if (!ret) {
		got = *(volatile uint64_t *)(mem + mb * 8192);
		t3 = halite_now_ns();
		want[0] = mb;
		ret = got == want[0] ? 0 : 1;
		if (ret)
			fprintf(stderr, "%s: MB %llu reads %llx, wrote %llx\n", path,
				(unsigned long long)mb, (unsigned long long)got,
				(unsigned long long)want[0]);
		*out = (struct run){ out->reader_open_ms, (double)(t1 - t0) / 1e6,
				     (double)(t2 - t1) / 1e6, (double)(t3 - t2) / 1e6,
				     (double)(t3 - t0) / 1e6 };
	} else {
		fprintf(stderr, "%s: %s\n", path, r ? halite_restore_errmsg(r) : halite_strerror(ret));
	}
	halite_restore_free(r);
	munmap(mem, bytes);
	return ret;
}

#define PROG "halite-bench-open"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [--quick] [--json] [--runs N] [--stored-every K] [--dir DIR]\n"
		"                         [--sizes GiB,GiB,...]\n"
		"Open to guest running against memory size, format 1.0 against 1.1 (chunked\n"
		"index), in one run: two files per size, each opened and started --runs times.\n"
		"  --sizes LIST     memory sizes in GiB, up to 8, each 1 .. 1024 (1,4,16,64)\n"
		"  --quick          the first two sizes, 3 runs\n"
		"  --runs N         runs per file, the median reported, 1 .. %d (5)\n"
		"  --stored-every K one memory block in K stored, the rest never touched,\n"
		"                   1 .. 65536 (4)\n"
		"  --dir DIR        where the files go, removed after (/var/tmp)\n"
		"  --json           one JSON object on stdout instead of the table (on a\n"
		"                   failure too: \"ok\", \"error\", \"exit\")\n"
		"  --help, --version\n"
		"Exit: 0 ok, 1 a failed check, 2 usage, 77 without userfaultfd.\n", MAX_RUNS);
}

/* --sizes: up to 8 GiB counts, 1 .. 1024 each. 0 or -1. */
static int parse_sizes(const char *s, unsigned *sizes, unsigned *n)
{
	uint64_t v;
	char buf[256], *save = NULL;

	if (snprintf(buf, sizeof(buf), "%s", s) >= (int)sizeof(buf))
		return -1;
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n == 8 || !bench_parse_u64(t, 1, 1024, &v))
			return -1;
		sizes[(*n)++] = (unsigned)v;
	}
	return *n ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "quick", no_argument, NULL, 'q' },   { "json", no_argument, NULL, 'j' },
		{ "runs", required_argument, NULL, 'r' },
		{ "stored-every", required_argument, NULL, 'e' },
		{ "dir", required_argument, NULL, 'd' },
		{ "sizes", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },	{ NULL, 0, NULL, 0 },
	};
	unsigned sizes[8] = { 1, 4, 16, 64 }, nsizes = 4;
	const char *dir = "/var/tmp";
	uint64_t every = 4, n;
	bool json = halite_cli_has_json(argc, argv), first = true, runs_set = false;
	char err[600] = "";
	int runs = 5, c, status = 0;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'q':
			nsizes = 2;
			if (!runs_set)
				runs = 3;
			break;
		case 'j':
			json = true;
			break;
		case 'r':
			if (!bench_parse_u64(optarg, 1, MAX_RUNS, &n))
				return bench_bad_arg(PROG, json, "--runs", optarg, "1 .. 15");
			runs = (int)n;
			runs_set = true;
			break;
		case 'e':
			if (!bench_parse_u64(optarg, 1, 65536, &every))
				return bench_bad_arg(PROG, json, "--stored-every", optarg,
						     "1 .. 65536");
			break;
		case 'd':
			dir = optarg;
			break;
		case 's':
			if (parse_sizes(optarg, sizes, &nsizes))
				return bench_bad_arg(PROG, json, "--sizes", optarg, "up to 8 GiB "
						     "counts, 1 .. 1024, comma-separated");
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			return halite_cli_version(PROG);
		default:
			return bench_opt_error(PROG, json, c, argc, argv, PROG);
		}
	}
	if (optind != argc)
		return bench_fail(PROG, json, 2, "unexpected argument '%s' (" PROG " --help)",
				  argv[optind]);
	c = bench_preflight(PROG, json, dir);
	if (c)
		return c;
	if (json)
		printf("{\"bench\":\"open\",\"stored_every\":%llu,\"runs\":%d,\"shared_machine\":true,"
		       "\"results\":[", (unsigned long long)every, runs);
	else
		printf("%6s %4s %10s %9s %12s %10s %10s %10s %10s\n", "GiB", "fmt", "stored_mb",
		       "file_MiB", "reader_open", "open_ms", "start_ms", "first_ms", "total_ms");
	for (unsigned i = 0; i < nsizes && !status; i++) {
		uint64_t bytes = (uint64_t)sizes[i] * GIB;

		for (int v = 0; v < 2 && !status; v++) {
			double ro[MAX_RUNS], op[MAX_RUNS], st[MAX_RUNS], fa[MAX_RUNS], to[MAX_RUNS];
			char path[512];
			uint64_t stored = 0, fsize;
			FILE *f;
			int ret;

			snprintf(path, sizeof(path), "%s/halite-open-%d-%ug-v1%d.hlt", dir, (int)getpid(),
				 sizes[i], v);
			fprintf(stderr, "writing %s\n", path);
			ret = write_file(path, bytes, every, v == 0, &stored);
			if (ret) {
				snprintf(err, sizeof(err), "writing %s: %s", path,
					 halite_strerror(ret));
				status = 1;
				break;
			}
			f = fopen(path, "r");
			fseek(f, 0, SEEK_END);
			fsize = (uint64_t)ftell(f);
			fclose(f);
			for (int k = 0; k < runs && !ret; k++) {
				struct run rr = { 0 };

				ret = one_run(path, bytes, every, &rr);
				ro[k] = rr.reader_open_ms;
				op[k] = rr.open_ms;
				st[k] = rr.start_ms;
				fa[k] = rr.first_ms;
				to[k] = rr.total_ms;
			}
			unlink(path);
			if (ret == -HALITE_E_UNSUPPORTED || ret == -ENOSYS || ret == -EPERM) {
				snprintf(err, sizeof(err), "no userfaultfd: %s: skipped",
					 halite_strerror(ret));
				status = 77;
				break;
			}
			if (ret) {
				snprintf(err, sizeof(err), "%s: the restore or its check "
					 "failed: %s", path, halite_strerror(ret));
				status = 1;
				break;
			}
			if (json)
				printf("%s{\"gib\":%u,\"format\":\"1.%d\",\"stored_mb\":%llu,"
				       "\"file_bytes\":%llu,\"reader_open_ms\":%.3f,\"open_ms\":%.3f,"
				       "\"start_ms\":%.3f,\"first_access_ms\":%.3f,"
				       "\"open_to_running_ms\":%.3f}", first ? "" : ",", sizes[i], v,
				       (unsigned long long)stored, (unsigned long long)fsize,
				       median(ro, runs), median(op, runs), median(st, runs),
				       median(fa, runs), median(to, runs));
			else
				printf("%6u %4s %10llu %9.1f %12.3f %10.3f %10.3f %10.3f %10.3f\n",
				       sizes[i], v ? "1.1" : "1.0", (unsigned long long)stored,
				       (double)fsize / (1 << 20), median(ro, runs), median(op, runs),
				       median(st, runs), median(fa, runs), median(to, runs));
			fflush(stdout);
			first = false;
		}
	}
	if (status)
		fprintf(stderr, PROG ": %s\n", err);
	if (json) {
		printf("],\"ok\":%s,\"error\":", status ? "false" : "true");
		if (status)
			halite_json_str(stdout, err);
		else
			fputs("null", stdout);
		printf(",\"exit\":%d}\n", status);
	}
	return status;
}
