// SPDX-License-Identifier: MIT
/* Snapshots and real restore traces for the tests: see restore_gen.h. */
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

#include "restore_gen.h"
#include "uffd.h"

void rg_die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", program_invocation_short_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void rg_check(int ret, const char *what)
{
	if (ret < 0)
		rg_die("%s: %s", what, halite_strerror(ret));
}

void rg_begin(void)
{
	struct halite_uffd_caps caps;

	if (halite_uffd_probe(&caps) || !(caps.features & UFFD_FEATURE_THREAD_ID)) {
		fprintf(stderr, "no userfaultfd with THREAD_ID: skipped\n");
		exit(77);
	}
	alarm(120);
}

struct halite_writer *rg_writer_create(const struct rg_snap *snap, const char *path)
{
	const struct halite_region reg = { "ram", 0, snap->len };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;

	o.codec = snap->codec;
	o.mb_pages = snap->mb_size / RG_PAGE;
	o.lb_size = snap->lb_size;
	o.vcpu_count = 1;
	o.flags = HALITE_WRITER_NO_SYNC | (snap->v1_0 ? HALITE_WRITER_V1_0 : 0);
	rg_check(halite_writer_create(&w, path, &reg, 1, &o), "create");
	return w;
}

/*
 * Random bytes, then zeros: the share of random bytes sets what a block
 * compresses to, and so how many blocks an LB holds.
 */
static void fill(const struct rg_snap *snap, uint64_t mb)
{
	uint64_t x = mb * 0x9e3779b97f4a7c15ull + 7;

	for (uint32_t i = 0; i < snap->nrandom; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		snap->image[mb * snap->mb_size + i] = (uint8_t)(x >> 56);
	}
}

void rg_put(struct halite_writer *w, const struct rg_snap *snap, uint32_t stream, uint64_t first,
	    uint64_t n)
{
	for (uint64_t mb = first; mb < first + n; mb++) {
		fill(snap, mb);
		if (halite_writer_put(w, stream, mb, snap->image + mb * snap->mb_size) < 0)
			rg_die("put %" PRIu64 ": %s", mb, halite_writer_errmsg(w));
	}
}

void rg_writer_finish(struct halite_writer *w)
{
	if (halite_writer_finish(w) < 0)
		rg_die("finish: %s", halite_writer_errmsg(w));
	halite_writer_free(w, true);
}

void rg_read_layout(const struct rg_snap *snap, const char *path, struct rg_lb *lbs)
{
	const struct halite_file_info *fi;
	struct halite_reader *r;

	rg_check(halite_reader_open(&r, path, NULL), "open");
	fi = halite_reader_info(r);
	if (fi->lb_count != snap->lb_count || fi->mb_count != snap->len / snap->mb_size ||
	    fi->mb_stored != snap->mb_stored || fi->mb_zero != snap->mb_zero ||
	    fi->mb_untouched != snap->mb_untouched ||
	    (snap->uuid && memcmp(fi->uuid, snap->uuid, 16)))
		rg_die("layout: %" PRIu64 " LBs, %" PRIu64 " MBs (%" PRIu64 " stored, %" PRIu64
		       " zero, %" PRIu64 " untouched)",
		       fi->lb_count, fi->mb_count, fi->mb_stored, fi->mb_zero, fi->mb_untouched);
	for (uint32_t i = 0; i < snap->lb_count; i++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n;

		rg_check(halite_reader_lb_info(r, i, &li), "lb_info");
		rg_check(halite_reader_lb_members(r, i, &mbs, &n), "lb_members");
		if (n < 2 || n > RG_MAX_MEMBERS)
			rg_die("layout: LB %u holds %u blocks", i, n);
		lbs[i].stream = li.stream;
		lbs[i].seq = li.seq;
		lbs[i].n = n;
		memcpy(lbs[i].mb, mbs, n * sizeof(*mbs));
	}
	halite_reader_free(r);
}

void rg_run_open(struct rg_run *run, const struct rg_snap *snap, const char *file,
		 const char *trace, unsigned flags, int log_level)
{
	struct halite_restore_region reg;
	HALITE_OPTS(halite_restore_opts, o);
	int ret;

	run->snap = snap;
	run->mem = mmap(NULL, snap->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (run->mem == MAP_FAILED)
		rg_die("mmap: %s", strerror(errno));
	reg = (struct halite_restore_region){ "ram", (uintptr_t)run->mem, snap->len,
					      HALITE_MEM_ANON, -1, 0 };
	run->tid = gettid();
	o.flags = flags;
	o.vcpu_tids = &run->tid;
	o.nvcpus = 1;
	o.trace_path = trace;
	o.log = log_level == RG_LOG_NONE ? NULL : halite_log_stderr;
	o.log_level = log_level;
	unlink(trace);
	rg_check(halite_restore_open(&run->r, file, &reg, 1, &o), "restore open");
	ret = halite_restore_start(run->r);
	if (ret == -HALITE_E_UNSUPPORTED) {
		fprintf(stderr, "restore: %s: skipped\n", halite_strerror(ret));
		exit(77);
	}
	rg_check(ret, "restore start");
}

void rg_run_close(struct rg_run *run, const char *trace)
{
	halite_restore_free(run->r);
	munmap(run->mem, run->snap->len);
	if (access(trace, R_OK))
		rg_die("%s: no trace written: %s", trace, strerror(errno));
}

void rg_touch(const struct rg_run *run, uint64_t mb, uint32_t page)
{
	(void)((volatile uint8_t *)run->mem)[mb * run->snap->mb_size + page * RG_PAGE];
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void rg_settle(struct halite_restore *r, uint64_t lbs, uint64_t others, bool track)
{
	struct halite_restore_stats st;
	uint64_t t0 = now_ms();

	for (;;) {
		halite_restore_stats(r, &st);
		if (st.lb_demand + st.lb_prefetch == lbs &&
		    (track ? st.mb_staged : st.mb_pool + st.mb_prefetch) == others)
			return;
		if (now_ms() - t0 > 20000)
			rg_die("engine does not settle: %" PRIu64 " LBs, %" PRIu64 " pool, %" PRIu64
			       " prefetch, %" PRIu64 " staged; expected %" PRIu64 " LBs, %" PRIu64
			       " others",
			       st.lb_demand + st.lb_prefetch, st.mb_pool, st.mb_prefetch, st.mb_staged,
			       lbs, others);
		usleep(1000);
	}
}
