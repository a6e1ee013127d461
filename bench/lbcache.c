/* SPDX-License-Identifier: MIT */
/*
 * halite-bench-lbcache: the host's LB cache (halite/src/lbcache.c) alone:
 * throughput and latency of put, get (hit) and get (miss) for --count
 * entries of --size bytes (64 KiB, an LB), and of puts that each evict one
 * entry (a full cache). Both ways of writing an entry are measured in the
 * same run: an unnamed file linked when complete (O_TMPFILE, the default)
 * and a named temporary file renamed (what a file system without O_TMPFILE
 * gets). Every hit's bytes are compared with what was put.
 *
 * The page cache is warm throughout: this measures the cache's own cost
 * (system calls, locking, checksums), not the disk's. Never asserts
 * timings. Files go under --dir (default /var/tmp) and are removed.
 * Output: a table, or with --json one JSON object. Exit 0, 1 on a failed
 * check, 2 usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "lbcache.h"
#include "stats.h"

static const char *prog = "halite-bench-lbcache";

struct phase {
	const char *name;
	uint64_t ops, bytes, ns;
	struct halite_hist lat;
};

struct mode {
	const char *write;
	struct phase ph[4]; /* put, put_evicting, get_hit, get_miss */
};

static void fill(uint8_t *p, size_t len, uint64_t key)
{
	uint64_t s = key * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < len; i += 8) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		memcpy(p + i, &s, len - i < 8 ? len - i : 8);
	}
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path) ? -1 : 0;
}

/* The bench's own cache directory, whatever is in it. */
static void rm_cache(const char *dir)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const uint8_t uuid[16] = { 0x48, 0x4c, 0x54, [15] = 1 };

/* One phase: @n operations on keys @first.., timed one by one. */
static int run_phase(struct halite_lbcache *c, struct phase *ph, int op, uint64_t first,
		     uint64_t n, size_t size, uint8_t *buf, uint8_t *want)
{
	halite_hist_init(&ph->lat);
	for (uint64_t k = first; k < first + n; k++) {
		uint64_t t0, dt;
		int r;

		if (op == 0)
			fill(buf, size, k);
		t0 = halite_now_ns();
		r = op == 0 ? halite_lbcache_put(c, uuid, k * size, buf, size)
			    : halite_lbcache_get(c, uuid, k * size, buf, size);
		dt = halite_now_ns() - t0;
		if (r != (op == 0 ? 0 : op == 1 ? 1 : 0)) {
			fprintf(stderr, "%s: %s of key %llu returned %d\n", prog, ph->name,
				(unsigned long long)k, r);
			return -1;
		}
		if (op == 1) {
			fill(want, size, k);
			if (memcmp(buf, want, size)) {
				fprintf(stderr, "%s: key %llu: wrong bytes\n", prog,
					(unsigned long long)k);
				return -1;
			}
		}
		halite_hist_add(&ph->lat, dt);
		ph->ns += dt;
		ph->ops++;
		ph->bytes += op == 2 ? 0 : size;
	}
	return 0;
}

static int run_mode(const char *base, struct mode *m, bool no_tmpfile, uint64_t count,
		    size_t size)
{
	char dir[4096], err[512];
	struct halite_lbcache *c;
	uint8_t *buf = malloc(size), *want = malloc(size);
	int ret = -1;

	snprintf(dir, sizeof(dir), "%s/halite-bench-lbcache-XXXXXX", base);
	if (!buf || !want || !mkdtemp(dir)) {
		fprintf(stderr, "%s: cannot make a directory under %s\n", prog, base);
		goto out;
	}
	m->write = no_tmpfile ? "rename" : "tmpfile";
	m->ph[0].name = "put";
	m->ph[1].name = "put_evicting";
	m->ph[2].name = "get_hit";
	m->ph[3].name = "get_miss";
	/* Room for all: puts that evict nothing, then hits and misses. */
	if (halite_lbcache_open(&c, dir, 2 * count * (size + 64), err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", prog, err);
		goto out_rm;
	}
	if (no_tmpfile)
		halite_lbcache_no_tmpfile(c);
	ret = run_phase(c, &m->ph[0], 0, 0, count, size, buf, want);
	if (!ret)
		ret = run_phase(c, &m->ph[2], 1, 0, count, size, buf, want);
	if (!ret)
		ret = run_phase(c, &m->ph[3], 2, count, count, size, buf, want);
	halite_lbcache_close(c);
	/* Now full at half the entries: every put evicts the oldest. */
	if (!ret && halite_lbcache_open(&c, dir, count / 2 * (size + 64), err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", prog, err);
		ret = -1;
	} else if (!ret) {
		if (no_tmpfile)
			halite_lbcache_no_tmpfile(c);
		ret = run_phase(c, &m->ph[1], 0, count, count, size, buf, want);
		halite_lbcache_close(c);
	}
out_rm:
	rm_cache(dir);
out:
	free(buf);
	free(want);
	return ret;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: %s [--json] [--count N] [--size BYTES] [--dir DIR]\n"
		"The host's LB cache alone: put, get (hit), get (miss) and a put that\n"
		"evicts, for entries written through O_TMPFILE and through rename, in one run.\n"
		"  --count N     entries per phase, 2 .. 1000000 (2048)\n"
		"  --size BYTES  entry size, 1 .. 64M (64K)\n"
		"  --dir DIR     where the cache goes, removed after (/var/tmp)\n"
		"  --json        one JSON object on stdout instead of the table (on a\n"
		"                failure too: \"ok\", \"error\", \"exit\")\n"
		"  --help, --version\n"
		"Exit: 0 ok, 1 a failed check, 2 usage.\n",
		prog);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "dir", required_argument, NULL, 'd' },  { "count", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },	  { "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	const char *dir = "/var/tmp";
	uint64_t count = 2048, size = 65536;
	struct mode modes[2] = { 0 };
	bool json = false;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'd':
			dir = optarg;
			break;
		case 'n':
			if (!bench_parse_u64(optarg, 2, 1000000, &count))
				return bench_bad_arg(prog, json, "--count", optarg,
						     "a whole number, 2 .. 1000000");
			break;
		case 's':
			if (halite_parse_size(optarg, &size) || !size ||
			    size > HALITE_LBCACHE_MAX_ENTRY)
				return bench_bad_arg(prog, json, "--size", optarg,
						     "a size, 1 .. 64M");
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			return halite_cli_version(prog);
		default:
			return bench_opt_error(prog, json, c, argc, argv, prog);
		}
	}
	if (optind < argc)
		return bench_fail(prog, json, 2, "unexpected argument '%s' (%s --help)", argv[optind],
				  prog);
	for (int i = 0; i < 2; i++)
		if (run_mode(dir, &modes[i], i == 1, count, size))
			return bench_fail(prog, json, 1, "a check failed (see above)");

	if (!json) {
		printf("%-8s %-13s %10s %10s %10s %10s\n", "write", "op", "ops/s", "MiB/s",
		       "p50 us", "p99 us");
		for (int i = 0; i < 2; i++) {
			for (int p = 0; p < 4; p++) {
				struct phase *ph = &modes[i].ph[p];
				double s = ph->ns / 1e9;

				printf("%-8s %-13s %10.0f %10.1f %10.1f %10.1f\n", modes[i].write,
				       ph->name, ph->ops / s, ph->bytes / s / 1048576.0,
				       halite_hist_quantile(&ph->lat, 0.5) / 1e3,
				       halite_hist_quantile(&ph->lat, 0.99) / 1e3);
			}
		}
		return 0;
	}
	printf("{\"bench\": \"lbcache\", \"ok\": true, \"entry_bytes\": %llu, \"count\": %llu, "
	       "\"page_cache\": \"warm\", \"machine\": ",
	       (unsigned long long)size, (unsigned long long)count);
	bench_machine_json(dir);
	printf(", \"modes\": [");
	for (int i = 0; i < 2; i++) {
		printf("%s{\"write\": ", i ? ", " : "");
		bench_json_str(modes[i].write);
		for (int p = 0; p < 4; p++) {
			struct phase *ph = &modes[i].ph[p];
			double s = ph->ns / 1e9;

			printf(", \"%s\": {\"ops\": %llu, \"ops_per_s\": ", ph->name,
			       (unsigned long long)ph->ops);
			bench_json_num(ph->ops / s, 0);
			printf(", \"mib_per_s\": ");
			bench_json_num(ph->bytes / s / 1048576.0, 1);
			printf(", \"p50_us\": ");
			bench_json_num(halite_hist_quantile(&ph->lat, 0.5) / 1e3, 1);
			printf(", \"p99_us\": ");
			bench_json_num(halite_hist_quantile(&ph->lat, 0.99) / 1e3, 1);
			printf("}");
		}
		printf("}");
	}
	printf("]}\n");
	return 0;
}
