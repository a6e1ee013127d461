// SPDX-License-Identifier: MIT
/*
 * halite-synth: run the synthetic guest by hand, e.g. to look at it with an
 * engine attached, to record a trace, or to time the paper's workload
 * ("time to access 100,000 pages": --accesses 100000).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "endian_util.h"
#include "stats.h"
#include "synth.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: halite-synth [run] [options]\n"
		"       halite-synth trace-dump FILE\n"
		"\n"
		"run: create a guest, run it, pause, print counters, stop.\n"
		"  --mem MIB          guest memory, a multiple of 2 (1024)\n"
		"  --vcpus N          1..16 (4)\n"
		"  --ws MIB           working set per vCPU (mem / 4 / vcpus)\n"
		"  --map MIB          mapped per vCPU (ws)\n"
		"  --backing anon|shared\n"
		"  --levels 4|5       paging levels (4)\n"
		"  --stride N         frame allocation stride (16)\n"
		"  --shared-as        one address space for all vCPUs\n"
		"  --huge2m N --huge1g N   huge pages per vCPU\n"
		"  --holes N          every N-th 4 KiB virtual page unmapped\n"
		"  --junk             junk bits in non-present entries\n"
		"  --ad-bits          the MMU sets A/D bits\n"
		"  --compress PCT --zero PCT --untouched PCT --write PCT\n"
		"  --pattern seq|random|trace   (seq)\n"
		"  --trace FILE       replay FILE (implies --pattern trace)\n"
		"  --record FILE      record every access to FILE\n"
		"  --loop             replay the trace in a loop\n"
		"  --seed N --tlb N\n"
		"  --accesses N       per vCPU, then stop (else --seconds)\n"
		"  --seconds S        run time without --accesses (5)\n"
		"  --child            run the guest in a forked child\n");
}

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 0);
	return errno || end == s || *end ? -1 : 0;
}

static int trace_dump(const char *path)
{
	uint8_t h[SYNTH_TRACE_HDR], r[SYNTH_TRACE_REC];
	FILE *f = fopen(path, "rb");
	uint64_t n = 0;

	if (!f) {
		fprintf(stderr, "halite-synth: %s: %s\n", path, strerror(errno));
		return 2;
	}
	if (fread(h, 1, sizeof(h), f) != sizeof(h) || memcmp(h, SYNTH_TRACE_MAGIC, 8)) {
		fprintf(stderr, "halite-synth: %s: not a trace\n", path);
		fclose(f);
		return 2;
	}
	printf("# trace v%u, %u vCPUs\n# vcpu vaddr rw\n", halite_get_le32(h + 8),
	       halite_get_le32(h + 16));
	while (fread(r, 1, sizeof(r), f) == sizeof(r)) {
		printf("%u 0x%llx %c\n", halite_get_le32(r + 8),
		       (unsigned long long)halite_get_le64(r),
		       halite_get_le32(r + 12) & SYNTH_TRACE_WRITE ? 'w' : 'r');
		n++;
	}
	fprintf(stderr, "%llu records\n", (unsigned long long)n);
	fclose(f);
	return 0;
}

int main(int argc, char **argv)
{
	enum { O_MEM = 256, O_VCPUS, O_WS, O_MAP, O_BACKING, O_LEVELS, O_STRIDE, O_SHARED_AS,
	       O_HUGE2M, O_HUGE1G, O_HOLES, O_JUNK, O_AD, O_COMPRESS, O_ZERO, O_UNTOUCHED,
	       O_WRITE, O_PATTERN, O_TRACE, O_RECORD, O_LOOP, O_SEED, O_TLB, O_ACCESSES,
	       O_SECONDS, O_CHILD, O_HELP };
	static const struct option lo[] = {
		{ "mem", 1, 0, O_MEM },		{ "vcpus", 1, 0, O_VCPUS },
		{ "ws", 1, 0, O_WS },		{ "map", 1, 0, O_MAP },
		{ "backing", 1, 0, O_BACKING },	{ "levels", 1, 0, O_LEVELS },
		{ "stride", 1, 0, O_STRIDE },	{ "shared-as", 0, 0, O_SHARED_AS },
		{ "huge2m", 1, 0, O_HUGE2M },	{ "huge1g", 1, 0, O_HUGE1G },
		{ "holes", 1, 0, O_HOLES },	{ "junk", 0, 0, O_JUNK },
		{ "ad-bits", 0, 0, O_AD },	{ "compress", 1, 0, O_COMPRESS },
		{ "zero", 1, 0, O_ZERO },	{ "untouched", 1, 0, O_UNTOUCHED },
		{ "write", 1, 0, O_WRITE },	{ "pattern", 1, 0, O_PATTERN },
		{ "trace", 1, 0, O_TRACE },	{ "record", 1, 0, O_RECORD },
		{ "loop", 0, 0, O_LOOP },	{ "seed", 1, 0, O_SEED },
		{ "tlb", 1, 0, O_TLB },		{ "accesses", 1, 0, O_ACCESSES },
		{ "seconds", 1, 0, O_SECONDS },	{ "child", 0, 0, O_CHILD },
		{ "help", 0, 0, O_HELP },	{ 0 },
	};
	SYNTH_OPTS(o, .log_fn = halite_log_stderr);
	struct synth_guest *g;
	struct synth_info info;
	uint64_t v = 0, seconds = 5, t0, t1, total = 0;
	int c, ret;

	if (argc > 1 && !strcmp(argv[1], "trace-dump")) {
		if (argc != 3) {
			usage(stderr);
			return 2;
		}
		return trace_dump(argv[2]);
	}
	if (argc > 1 && !strcmp(argv[1], "run")) {
		argv++;
		argc--;
	}
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (c == 'h' || c == O_HELP) {
			usage(stdout);
			return 0;
		}
		if (c == '?') {
			usage(stderr);
			return 2;
		}
		if (optarg && c != O_BACKING && c != O_PATTERN && c != O_TRACE && c != O_RECORD &&
		    parse_u64(optarg, &v)) {
			fprintf(stderr, "halite-synth: bad number '%s'\n", optarg);
			return 2;
		}
		switch (c) {
		case O_MEM: o.mem_bytes = v << 20; break;
		case O_VCPUS: o.nvcpus = (unsigned)v; break;
		case O_WS: o.ws_bytes = v << 20; break;
		case O_MAP: o.map_bytes = v << 20; break;
		case O_BACKING:
			if (!strcmp(optarg, "anon"))
				o.backing = SYNTH_MEM_ANON;
			else if (!strcmp(optarg, "shared"))
				o.backing = SYNTH_MEM_SHARED;
			else
				goto bad;
			break;
		case O_LEVELS: o.paging_levels = (unsigned)v; break;
		case O_STRIDE: o.stride = (unsigned)v; break;
		case O_SHARED_AS: o.flags |= SYNTH_F_SHARED_AS; break;
		case O_HUGE2M: o.huge_2m = (unsigned)v; break;
		case O_HUGE1G: o.huge_1g = (unsigned)v; break;
		case O_HOLES: o.hole_every = (unsigned)v; break;
		case O_JUNK: o.flags |= SYNTH_F_NP_JUNK; break;
		case O_AD: o.flags |= SYNTH_F_AD_BITS; break;
		case O_COMPRESS: o.compress_pct = (unsigned)v; break;
		case O_ZERO: o.zero_pct = (unsigned)v; break;
		case O_UNTOUCHED: o.untouched_pct = (unsigned)v; break;
		case O_WRITE: o.write_pct = (unsigned)v; break;
		case O_PATTERN:
			if (!strcmp(optarg, "seq"))
				o.pattern = SYNTH_PAT_SEQ;
			else if (!strcmp(optarg, "random"))
				o.pattern = SYNTH_PAT_RANDOM;
			else if (!strcmp(optarg, "trace"))
				o.pattern = SYNTH_PAT_TRACE;
			else
				goto bad;
			break;
		case O_TRACE: o.trace_in = optarg; o.pattern = SYNTH_PAT_TRACE; break;
		case O_RECORD: o.trace_out = optarg; break;
		case O_LOOP: o.flags |= SYNTH_F_TRACE_LOOP; break;
		case O_SEED: o.seed = v; break;
		case O_TLB: o.tlb_entries = (unsigned)v; break;
		case O_ACCESSES: o.max_accesses = v; break;
		case O_SECONDS: seconds = v; break;
		case O_CHILD: o.flags |= SYNTH_F_CHILD; break;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}

	t0 = halite_now_ns();
	ret = synth_create(&g, &o);
	if (ret) {
		fprintf(stderr, "halite-synth: create: %s\n", strerror(-ret));
		return 1;
	}
	t1 = halite_now_ns();
	synth_info(g, &info);
	printf("guest      %llu MiB %s, %u vCPUs, %u-level, stride %u, pid %d, created in %llu ms\n",
	       (unsigned long long)(info.mem_bytes >> 20),
	       info.backing == SYNTH_MEM_SHARED ? "shared" : "anon", info.nvcpus,
	       info.paging_levels, info.stride, (int)info.owner_pid,
	       (unsigned long long)((t1 - t0) / 1000000));
	printf("frames     pt %llu, data %llu (zero %llu), untouched %llu\n",
	       (unsigned long long)info.pt_frames, (unsigned long long)info.data_frames,
	       (unsigned long long)info.zero_frames, (unsigned long long)info.untouched_frames);

	t0 = halite_now_ns();
	ret = synth_start(g);
	if (!ret && (o.max_accesses || (o.pattern == SYNTH_PAT_TRACE &&
					!(o.flags & SYNTH_F_TRACE_LOOP))))
		ret = synth_wait_done(g, 0);
	else if (!ret)
		sleep((unsigned)seconds);
	if (!ret)
		ret = synth_pause(g);
	t1 = halite_now_ns();
	if (ret) {
		fprintf(stderr, "halite-synth: run: %s\n", strerror(-ret));
		synth_free(g);
		return 1;
	}
	for (unsigned i = 0; i < info.nvcpus; i++) {
		struct synth_vcpu_info vi;
		struct synth_vcpu_stats st;

		synth_vcpu_info(g, i, &vi);
		synth_vcpu_stats(g, i, &st);
		total += st.accesses;
		printf("vcpu %-2u    tid %d cr3 0x%llx va 0x%llx: %llu accesses, %llu writes, "
		       "%llu faults, %llu walks\n",
		       i, (int)vi.tid, (unsigned long long)vi.cr3, (unsigned long long)vi.vbase,
		       (unsigned long long)st.accesses, (unsigned long long)st.writes,
		       (unsigned long long)st.faults, (unsigned long long)st.walks);
	}
	printf("run        %llu accesses in %.3f s, %.1f M/s\n", (unsigned long long)total,
	       (double)(t1 - t0) / 1e9, (double)total * 1e3 / (double)(t1 - t0 + 1));
	ret = synth_stop(g);
	if (ret)
		fprintf(stderr, "halite-synth: stop: %s\n", strerror(-ret));
	synth_free(g);
	return ret ? 1 : 0;
bad:
	fprintf(stderr, "halite-synth: bad value '%s'\n", optarg);
	return 2;
}
