// SPDX-License-Identifier: MIT
/*
 * halite-synth: run the synthetic guest by hand, e.g. to look at it with an
 * engine attached, to record a trace, or to time the paper's workload
 * ("time to access 100,000 pages": --accesses 100000); save one with the
 * lazy save engine (cmd_save.c) and serve clones of it (cmd_clone.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "endian_util.h"
#include "stats.h"
#include "synth.h"
#include "tool.h"

static int trace_dump(const char *path)
{
	uint8_t h[SYNTH_TRACE_HDR], r[SYNTH_TRACE_REC];
	FILE *f = fopen(path, "rb");
	uint64_t n = 0;

	if (!f) {
		fprintf(stderr, HS_PROG ": trace-dump: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (fread(h, 1, sizeof(h), f) != sizeof(h) || memcmp(h, SYNTH_TRACE_MAGIC, 8)) {
		fprintf(stderr, HS_PROG ": trace-dump: %s: not a trace of the synthetic guest "
			"(docs/trace-format.md)\n", path);
		fclose(f);
		return 1;
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

static int cmd_run(int argc, char **argv)
{
	struct hs_args a;
	struct synth_opts o;
	struct synth_guest *g;
	struct synth_info info;
	uint64_t seconds, t0, t1, total = 0;
	int ret;

	ret = hs_parse(argc, argv, HS_CMD_RUN, &a);
	if (ret)
		return ret > 0 ? 0 : 2;
	o = a.o;
	seconds = a.seconds;

	t0 = halite_now_ns();
	ret = synth_create(&g, &o);
	if (ret) {
		fprintf(stderr, HS_PROG ": run: creating the guest: %s\n", strerror(-ret));
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
		fprintf(stderr, HS_PROG ": run: running the guest: %s\n", strerror(-ret));
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
		fprintf(stderr, HS_PROG ": run: stopping the guest: %s\n", strerror(-ret));
	synth_free(g);
	return ret ? 1 : 0;
}

/* trace-dump FILE: its own tiny command line (--help, --version, one FILE). */
static int cmd_trace_dump(int argc, char **argv)
{
	const char *file = NULL;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			hs_usage(stdout);
			return 0;
		}
		if (!strcmp(a, "--version"))
			return halite_cli_version(HS_PROG);
		if (a[0] == '-' && a[1]) {
			fprintf(stderr, HS_PROG ": trace-dump: unknown option '%.*s' (" HS_PROG
				" trace-dump --help)\n", (int)strcspn(a, "="), a);
			return 2;
		}
		if (file) {
			fprintf(stderr, HS_PROG ": trace-dump: unexpected argument '%s' (" HS_PROG
				" trace-dump --help)\n", a);
			return 2;
		}
		file = a;
	}
	if (!file) {
		fprintf(stderr, HS_PROG ": trace-dump: missing FILE (" HS_PROG
			" trace-dump --help)\n");
		return 2;
	}
	return trace_dump(file);
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : NULL;

	if (cmd && !strcmp(cmd, "trace-dump"))
		return cmd_trace_dump(argc - 1, argv + 1);
	if (cmd && !strcmp(cmd, "save"))
		return hs_cmd_save(argc - 1, argv + 1);
	if (cmd && !strcmp(cmd, "clone"))
		return hs_cmd_clone(argc - 1, argv + 1);
	if (cmd && !strcmp(cmd, "run"))
		return cmd_run(argc - 1, argv + 1);
	/* No command: run, as always; a word that is not one is a mistake, not a stray argument. */
	if (cmd && cmd[0] != '-') {
		fprintf(stderr, HS_PROG ": unknown command '%s': run, save, clone or trace-dump ("
			HS_PROG " --help)\n", cmd);
		return 2;
	}
	return cmd_run(argc, argv);
}
