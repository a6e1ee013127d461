/* SPDX-License-Identifier: MIT */
/*
 * halite-bench-save: the save engine against plain copy-on-write tracking,
 * in the same run, on the synthetic guest (testing/synth/synth.h).
 *
 * For each peer a fresh guest (same options, same seed, so the same memory
 * and page tables) runs unsaved for --duration seconds (its baseline access
 * rate), is paused (the snapshot instant: a ground-truth copy is taken
 * then, outside the timed part), armed, resumed, and runs until the save
 * completes. Reported per peer: pause and arm times, fault service p50/p99,
 * save duration and throughput (guest memory bytes / duration), the guest's
 * access rate while the save ran and its slowdown against its own baseline,
 * the file's size, and whether the file holds exactly the snapshot.
 *
 * Peers:
 * - "halite": halite_save (copy-on-access, anonymous memory, default options:
 *   background throttle, fdatasync at the end);
 * - "cow-wp-physical": bench/cow.c, userfaultfd write-protect only, raw
 *   image in physical order, fdatasync at the end.
 *
 * Output: one JSON object on stdout; progress and a summary on stderr.
 * Never asserts timings; exits 0 when both saves completed (whatever the
 * content check says, which is in the JSON), 1 on errors, 77 when the kernel
 * lacks a needed userfaultfd feature.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "io.h"

#include "bench_util.h"
#include "cli.h"
#include "cow.h"
#include "stats.h"
#include "synth.h"
#include "uffd.h"

#define PROG "halite-bench-save"

struct params {
	uint64_t mem_mib;
	unsigned vcpus;
	unsigned stride;
	unsigned compress_pct;
	unsigned write_pct;
	uint64_t map_bytes; /* per vCPU; ws = map */
	double duration_s;
	const char *dir;
	bool json;
	bool quick;
	uint64_t seed;
	int io_backend; /* the engine's LB writes: HALITE_IO_BACKEND_* */
	bool no_rt;	/* HALITE_SAVE_NO_REALTIME */
};

struct result {
	const char *name;
	bool ok;
	double baseline_rate;
	uint64_t pause_ns, arm_ns;
	uint64_t fault_p50_ns, fault_p99_ns, fault_max_ns, faults;
	bool fault_realtime; /* halite: its fault thread ran SCHED_FIFO */
	uint64_t save_ns;
	double rate_during;
	uint64_t file_bytes;
	bool content_ok;
	uint64_t extra_bg; /* pages or blocks the background saved */
	uint64_t extra_total;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: halite-bench-save [--mem-mib N] [--vcpus N] [--duration S] [--dir DIR]\n"
		"                         [--map-mib N] [--seed N] [--io BACKEND] [--no-realtime]\n"
		"                         [--quick]\n"
		"                         [--json|--no-json]\n"
		"  --mem-mib N    guest memory, even, 4 .. 65536 (default 1024)\n"
		"  --vcpus N      vCPU threads, 1 .. 16 (default 4)\n"
		"  --map-mib N    per-vCPU mapped = working set, 1 .. mem/vcpus\n"
		"                 (default mem/4/vcpus)\n"
		"  --duration S   unsaved baseline run, seconds, more than 0, up to 3600\n"
		"                 (default 2)\n"
		"  --seed N       guest data and accesses (default 1)\n"
		"  --dir DIR      where the snapshot files go (default /var/tmp); removed after\n"
		"  --io BACKEND   the engine's writes: io_uring (default), libaio or psync\n"
		"  --no-realtime  the engine's fault thread stays an ordinary thread\n"
		"                 (HALITE_SAVE_NO_REALTIME; default: SCHED_FIFO where allowed)\n"
		"  --quick        128 MiB, 2 vCPUs\n"
		"  --json         JSON on stdout (default; on a failure too: \"ok\", \"error\",\n"
		"                 \"exit\"); --no-json: summary only\n"
		"  --help, --version\n"
		"Exit: 0 ok, 1 a save failed or its content differs, 2 usage, 77 the kernel\n"
		"lacks a userfaultfd feature.\n");
}

static uint64_t accesses(struct synth_guest *g, unsigned n)
{
	uint64_t sum = 0;

	for (unsigned i = 0; i < n; i++) {
		struct synth_vcpu_stats st;

		if (!synth_vcpu_stats(g, i, &st))
			sum += st.accesses;
	}
	return sum;
}

static void sleep_s(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static int make_guest(const struct params *p, struct synth_guest **g, struct synth_info *info)
{
	SYNTH_OPTS(so, .mem_bytes = p->mem_mib << 20, .nvcpus = p->vcpus, .stride = p->stride,
		   .map_bytes = p->map_bytes, .ws_bytes = p->map_bytes,
		   .compress_pct = p->compress_pct, .write_pct = p->write_pct,
		   .pattern = SYNTH_PAT_SEQ, .backing = SYNTH_MEM_ANON, .seed = p->seed,
		   .log_fn = halite_log_stderr);
	int ret = synth_create(g, &so);

	if (ret) {
		fprintf(stderr, "synth_create: %s\n", strerror(-ret));
		return ret;
	}
	return synth_info(*g, info);
}

/* Start the guest, warm up, measure the unsaved access rate. */
static int baseline(const struct params *p, struct synth_guest *g, double *rate)
{
	uint64_t a0, a1, t0, t1;
	int ret = synth_start(g);

	if (ret)
		return ret;
	sleep_s(0.2);
	a0 = accesses(g, p->vcpus);
	t0 = halite_now_ns();
	sleep_s(p->duration_s);
	a1 = accesses(g, p->vcpus);
	t1 = halite_now_ns();
	*rate = (double)(a1 - a0) * 1e9 / (double)(t1 - t0);
	return 0;
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

static bool check_halite(const char *path, const uint8_t *snap, uint64_t mem)
{
	struct halite_reader *r;
	const struct halite_file_info *fi;
	uint8_t *buf;
	bool ok = true;
	int ret = halite_reader_open(&r, path, NULL);

	if (ret) {
		fprintf(stderr, "halite: reader_open: %s\n", halite_strerror(ret));
		return false;
	}
	fi = halite_reader_info(r);
	buf = malloc(fi->mb_size);
	if (!buf || fi->memory_bytes != mem)
		ok = false;
	for (uint64_t mb = 0; ok && mb < fi->mb_count; mb++) {
		uint32_t n = halite_reader_mb_bytes(r, mb);

		ret = halite_reader_read_mb(r, mb, buf);
		if (ret || mb * fi->mb_size + n > mem || memcmp(buf, snap + mb * fi->mb_size, n)) {
			fprintf(stderr, "halite: memory block %llu differs from the snapshot (%s)\n",
				(unsigned long long)mb, ret ? halite_strerror(ret) : "content");
			ok = false;
		}
	}
	free(buf);
	halite_reader_free(r);
	return ok;
}

static bool check_raw(const char *path, const uint8_t *snap, uint64_t mem)
{
	enum { CHUNK = 1 << 20 };
	uint8_t *buf = malloc(CHUNK);
	FILE *f = fopen(path, "rb");
	bool ok = buf && f && file_size(path) == mem;

	for (uint64_t off = 0; ok && off < mem; off += CHUNK) {
		size_t n = mem - off < CHUNK ? (size_t)(mem - off) : CHUNK;

		if (fread(buf, 1, n, f) != n || memcmp(buf, snap + off, n)) {
			fprintf(stderr, "cow: image differs from the snapshot near offset %llu\n",
				(unsigned long long)off);
			ok = false;
		}
	}
	if (f)
		fclose(f);
	free(buf);
	return ok;
}

enum peer { PEER_HALITE, PEER_COW };

static int run_peer(const struct params *p, enum peer peer, struct result *res)
{
	static const char *const names[] = { "halite", "cow-wp-physical" };
	struct synth_guest *g = NULL;
	struct synth_info info;
	struct halite_save *s = NULL;
	struct cow_save *c = NULL;
	uint8_t *snap = NULL;
	char *path = NULL;
	pid_t tids[SYNTH_MAX_VCPUS];
	uint64_t t0, a0, a1, t_resume, t_end;
	int ret;

	memset(res, 0, sizeof(*res));
	res->name = names[peer];
	fprintf(stderr, "[%s] creating a %llu MiB guest, %u vCPUs\n", res->name,
		(unsigned long long)p->mem_mib, p->vcpus);
	ret = make_guest(p, &g, &info);
	if (ret)
		goto out;
	if (asprintf(&path, "%s/halite-bench-save.%d.%s", p->dir, (int)getpid(),
		     peer == PEER_HALITE ? "hlt" : "raw") < 0) {
		path = NULL;
		ret = -ENOMEM;
		goto out;
	}
	snap = malloc(info.mem_bytes);
	if (!snap) {
		ret = -ENOMEM;
		goto out;
	}

	/* The engine is created before the pause: creation is not part of the snapshot instant. */
	if (peer == PEER_HALITE) {
		HALITE_OPTS(halite_save_opts, o);
		struct halite_save_region reg = {
			.name = SYNTH_REGION_NAME, .gpa = info.gpa_base, .length = info.mem_bytes,
			.host = (uintptr_t)info.host_addr, .kind = HALITE_MEM_ANON, .fd = -1,
		};

		for (unsigned i = 0; i < p->vcpus; i++) {
			struct synth_vcpu_info vi;

			synth_vcpu_info(g, i, &vi);
			tids[i] = vi.tid;
		}
		o.vcpu_tids = tids;
		o.nvcpus = p->vcpus;
		o.log = halite_log_stderr;
		o.log_level = HALITE_LOG_WARN;
		o.io_backend = p->io_backend;
		if (p->no_rt)
			o.flags |= HALITE_SAVE_NO_REALTIME;
		ret = halite_save_create(&s, path, &reg, 1, &o);
		if (ret) {
			fprintf(stderr, "halite_save_create: %s\n", halite_strerror(ret));
			goto out;
		}
		for (unsigned i = 0; i < p->vcpus; i++) {
			struct synth_vcpu_info vi;
			struct halite_root root;

			synth_vcpu_info(g, i, &vi);
			root = (struct halite_root){ i, vi.paging_levels, vi.cr3 };
			halite_save_add_root(s, &root);
		}
	} else {
		ret = cow_create(&c, path, info.host_addr, info.mem_bytes);
		if (ret) {
			fprintf(stderr, "cow_create: %s\n", halite_strerror(ret));
			goto out;
		}
	}

	fprintf(stderr, "[%s] baseline: %.1f s unsaved\n", res->name, p->duration_s);
	ret = baseline(p, g, &res->baseline_rate);
	if (ret)
		goto out;

	t0 = halite_now_ns();
	ret = synth_pause(g);
	res->pause_ns = halite_now_ns() - t0;
	if (ret)
		goto out;
	/* Ground truth, outside the timed part. */
	ret = synth_copy_memory(g, snap);
	if (ret)
		goto out;
	t0 = halite_now_ns();
	ret = peer == PEER_HALITE ? halite_save_arm(s) : cow_arm(c);
	res->arm_ns = halite_now_ns() - t0;
	if (ret) {
		fprintf(stderr, "[%s] arm: %s\n", res->name, halite_strerror(ret));
		synth_resume(g);
		goto out;
	}
	a0 = accesses(g, p->vcpus);
	t_resume = halite_now_ns();
	ret = synth_resume(g);
	if (ret)
		goto out;
	fprintf(stderr, "[%s] armed in %.1f us, saving\n", res->name, (double)res->arm_ns / 1e3);
	if (peer == PEER_HALITE) {
		struct halite_save_stats st;

		ret = halite_save_wait(s, -1);
		t_end = halite_now_ns();
		a1 = accesses(g, p->vcpus);
		halite_save_stats(s, &st);
		if (ret) {
			fprintf(stderr, "halite save failed: %s (%s)\n", halite_strerror(ret),
				halite_save_errmsg(s));
			goto out;
		}
		res->fault_p50_ns = st.fault_p50_ns;
		res->fault_p99_ns = st.fault_p99_ns;
		res->fault_max_ns = st.fault_max_ns;
		res->fault_realtime = st.fault_realtime;
		res->faults = st.faults;
		res->save_ns = st.duration_ns;
		res->extra_bg = st.mb_background;
		res->extra_total = st.mb_total;
		halite_save_free(s);
		s = NULL;
	} else {
		struct cow_stats st;

		ret = cow_wait(c);
		t_end = halite_now_ns();
		a1 = accesses(g, p->vcpus);
		cow_get_stats(c, &st);
		if (ret) {
			fprintf(stderr, "cow save failed: %s\n", halite_strerror(ret));
			goto out;
		}
		res->fault_p50_ns = st.fault_p50_ns;
		res->fault_p99_ns = st.fault_p99_ns;
		res->fault_max_ns = st.fault_max_ns;
		res->faults = st.faults;
		res->save_ns = st.duration_ns;
		res->extra_bg = st.pages_bg;
		res->extra_total = info.mem_bytes / SYNTH_PAGE_SIZE;
		cow_free(c);
		c = NULL;
	}
	res->rate_during = (double)(a1 - a0) * 1e9 / (double)(t_end - t_resume);
	synth_stop(g);
	res->file_bytes = file_size(path);
	fprintf(stderr, "[%s] saved in %.3f s, checking content\n", res->name,
		(double)res->save_ns / 1e9);
	res->content_ok = peer == PEER_HALITE ? check_halite(path, snap, info.mem_bytes)
					      : check_raw(path, snap, info.mem_bytes);
	res->ok = true;
out:
	halite_save_free(s);
	cow_free(c);
	synth_free(g);
	if (path)
		unlink(path);
	free(path);
	free(snap);
	return ret;
}

static double us(uint64_t ns)
{
	return (double)ns / 1e3;
}

static void print_json(const struct params *p, const struct result *res, size_t n, int code)
{
	struct utsname u;
	struct sysinfo si;

	uname(&u);
	sysinfo(&si);
	printf("{\"machine\": {\"cpus\": %ld, \"mem_total\": %llu, \"kernel\": \"%s\"},\n",
	       sysconf(_SC_NPROCESSORS_ONLN),
	       (unsigned long long)si.totalram * si.mem_unit, u.release);
	printf(" \"params\": {\"mem_mib\": %llu, \"vcpus\": %u, \"stride\": %u, "
	       "\"map_bytes_per_vcpu\": %llu, \"ws_bytes_per_vcpu\": %llu, \"compress_pct\": %u, "
	       "\"write_pct\": %u, \"pattern\": \"seq\", \"backing\": \"anon\", "
	       "\"duration_s\": %.3f, \"dir\": \"%s\", \"seed\": %llu, \"quick\": %s, "
	       "\"io\": \"%s\", \"no_realtime\": %s},\n",
	       (unsigned long long)p->mem_mib, p->vcpus, p->stride,
	       (unsigned long long)p->map_bytes, (unsigned long long)p->map_bytes,
	       p->compress_pct, p->write_pct, p->duration_s, p->dir,
	       (unsigned long long)p->seed, p->quick ? "true" : "false",
	       p->io_backend ? halite_io_backend_name(p->io_backend) : "default",
	       p->no_rt ? "true" : "false");
	/* The top-level baseline is the first peer's guest; each result has its own. */
	printf(" \"baseline\": {\"accesses_per_s\": %.0f},\n", n ? res[0].baseline_rate : 0.0);
	printf(" \"results\": [");
	for (size_t i = 0; i < n; i++) {
		const struct result *r = &res[i];
		double secs = (double)r->save_ns / 1e9;

		printf("%s\n  {\"name\": \"%s\", \"ok\": %s, \"pause_us\": %.1f, "
		       "\"pause_to_arm_us\": %.1f, \"arm_us\": %.1f, \"fault_p50_us\": %.2f, "
		       "\"fault_p99_us\": %.2f, \"fault_max_us\": %.2f, \"fault_realtime\": %s, "
		       "\"faults\": %llu, \"save_s\": %.4f, "
		       "\"throughput_mib_s\": %.1f, \"baseline_accesses_per_s\": %.0f, "
		       "\"guest_rate_during_save\": %.0f, \"slowdown_pct\": %.1f, "
		       "\"file_bytes\": %llu, \"background_units\": %llu, \"total_units\": %llu, "
		       "\"content_ok\": %s}",
		       i ? "," : "", r->name, r->ok ? "true" : "false", us(r->pause_ns),
		       us(r->pause_ns + r->arm_ns), us(r->arm_ns), us(r->fault_p50_ns),
		       us(r->fault_p99_ns), us(r->fault_max_ns), r->fault_realtime ? "true" : "false",
		       (unsigned long long)r->faults, secs,
		       secs > 0 ? (double)(p->mem_mib) / secs : 0.0, r->baseline_rate,
		       r->rate_during,
		       r->baseline_rate > 0 ? 100.0 * (1.0 - r->rate_during / r->baseline_rate) : 0.0,
		       (unsigned long long)r->file_bytes, (unsigned long long)r->extra_bg,
		       (unsigned long long)r->extra_total, r->content_ok ? "true" : "false");
	}
	printf("\n ],\n \"ok\": %s, \"error\": %s, \"exit\": %d}\n", code ? "false" : "true",
	       code ? "\"a save failed or its content differs (results: ok, content_ok)\"" : "null",
	       code);
	fflush(stdout);
}

static void print_summary(const struct params *p, const struct result *res, size_t n)
{
	fprintf(stderr, "\n%llu MiB, %u vCPUs:\n%-16s %10s %10s %9s %9s %9s %8s %8s %9s %8s %s\n",
		(unsigned long long)p->mem_mib, p->vcpus, "peer", "pause->arm", "arm us",
		"p50 us", "p99 us", "max us", "faults", "save s", "MiB/s", "slowdn%", "content");
	for (size_t i = 0; i < n; i++) {
		const struct result *r = &res[i];
		double secs = (double)r->save_ns / 1e9;

		fprintf(stderr, "%-16s %10.1f %10.1f %9.2f %9.2f %9.1f %8llu %8.3f %9.1f %8.1f %s\n",
			r->name, us(r->pause_ns + r->arm_ns), us(r->arm_ns), us(r->fault_p50_ns),
			us(r->fault_p99_ns), us(r->fault_max_ns), (unsigned long long)r->faults, secs,
			secs > 0 ? (double)p->mem_mib / secs : 0.0,
			r->baseline_rate > 0 ? 100.0 * (1.0 - r->rate_during / r->baseline_rate) : 0.0,
			!r->ok ? "FAILED" : r->content_ok ? "ok" : "MISMATCH");
	}
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "mem-mib", required_argument, NULL, 'm' },
		{ "vcpus", required_argument, NULL, 'v' },
		{ "map-mib", required_argument, NULL, 'M' },
		{ "duration", required_argument, NULL, 'd' },
		{ "dir", required_argument, NULL, 'D' },
		{ "seed", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "io", required_argument, NULL, 'i' },
		{ "no-realtime", no_argument, NULL, 'R' },
		{ "json", no_argument, NULL, 'j' },
		{ "no-json", no_argument, NULL, 'J' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	struct params p = {
		.mem_mib = 1024, .vcpus = 4, .stride = 16, .compress_pct = 50, .write_pct = 30,
		.duration_s = 2.0, .dir = "/var/tmp", .json = true, .seed = 1,
	};
	struct result res[2];
	uint64_t map_mib = 0;
	bool mem_set = false, vcpus_set = false, json = true;
	uint64_t v;
	char msg[256];
	int opt, ret, failed = 0;

	/* JSON is the default: a usage error prints its object unless --no-json came last. */
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		json = !strcmp(argv[i], "--json") ? true :
		       !strcmp(argv[i], "--no-json") ? false : json;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (opt) {
		case 'm':
			if (!bench_parse_u64(optarg, 4, 65536, &p.mem_mib) || p.mem_mib % 2)
				return bench_bad_arg(PROG, json, "--mem-mib", optarg,
						     "an even number of MiB, 4 .. 65536");
			mem_set = true;
			break;
		case 'v':
			if (!bench_parse_u64(optarg, 1, SYNTH_MAX_VCPUS, &v))
				return bench_bad_arg(PROG, json, "--vcpus", optarg, "1 .. 16");
			p.vcpus = (unsigned)v;
			vcpus_set = true;
			break;
		case 'M':
			if (!bench_parse_u64(optarg, 1, 65536, &map_mib))
				return bench_bad_arg(PROG, json, "--map-mib", optarg,
						     "MiB, 1 .. mem/vcpus");
			break;
		case 'd': {
			char *end;

			errno = 0;
			p.duration_s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(p.duration_s > 0) ||
			    p.duration_s > 3600)
				return bench_bad_arg(PROG, json, "--duration", optarg,
						     "seconds, more than 0, up to 3600");
			break;
		}
		case 'D': p.dir = optarg; break;
		case 's':
			if (!bench_parse_u64(optarg, 0, UINT64_MAX, &p.seed))
				return bench_bad_arg(PROG, json, "--seed", optarg, "a number");
			break;
		case 'q': p.quick = true; break;
		case 'i':
			p.io_backend = halite_io_backend_parse(optarg);
			if (p.io_backend < 0)
				return bench_bad_arg(PROG, json, "--io", optarg,
						     "io_uring, libaio or psync");
			break;
		case 'R': p.no_rt = true; break;
		case 'j': p.json = true; break;
		case 'J': p.json = false; break;
		case 'h': usage(stdout); return 0;
		case 'V': return halite_cli_version(PROG);
		default: return bench_opt_error(PROG, json, opt, argc, argv, PROG);
		}
	}
	if (optind != argc)
		return bench_fail(PROG, json, 2, "unexpected argument '%s' (" PROG " --help)",
				  argv[optind]);
	if (p.quick) {
		if (!mem_set)
			p.mem_mib = 128;
		if (!vcpus_set)
			p.vcpus = 2;
	}
	if (map_mib && map_mib > p.mem_mib / p.vcpus)
		return bench_fail(PROG, json, 2, "--map-mib %" PRIu64 " is more than memory per "
				  "vCPU (%" PRIu64 " MiB / %u)", map_mib, p.mem_mib, p.vcpus);
	ret = bench_preflight(PROG, json, p.dir);
	if (ret)
		return ret;
	/* The paper's microbenchmark: a quarter of memory mapped across the vCPUs, all of it accessed. */
	p.map_bytes = map_mib ? map_mib << 20 : ((p.mem_mib << 20) / 4 / p.vcpus) & ~4095ull;

	ret = cow_probe(msg, sizeof(msg));
	if (ret)
		return bench_fail(PROG, p.json, 77, "%s", msg);

	for (int i = 0; i < 2; i++) {
		ret = run_peer(&p, i == 0 ? PEER_HALITE : PEER_COW, &res[i]);
		if (ret) {
			if (ret == -HALITE_E_UNSUPPORTED)
				return bench_fail(PROG, p.json, 77, "the kernel lacks a "
						  "userfaultfd feature the save engine needs: "
						  "skipped");
			failed = 1;
		}
	}
	if (p.json)
		print_json(&p, res, 2, failed);
	print_summary(&p, res, 2);
	return failed;
}
