// SPDX-License-Identifier: MIT
/*
 * halite-trace-lackey: a real program's memory accesses, as recorded by
 * `valgrind --tool=lackey --trace-mem=yes`, converted to an access trace
 * (docs/trace-format.md) that halite-bench micro --trace and halite-cycle
 * --trace replay on one vCPU of the synthetic guest.
 *
 * Three steps, each keeping what a snapshot engine can see and dropping
 * what it cannot:
 *
 * 1. Accesses. Every instruction fetch (I), load (L), store (S) and modify
 *    (M) is an access to the page(s) of its bytes; S and M write. --data-only
 *    drops instruction fetches.
 * 2. Collapsing. A snapshot engine sees pages, not words: what decides its
 *    faults and reads is the order in which pages are first touched (before
 *    the snapshot for the save, after it for the restore) and which pages are
 *    written. A record is kept when its page is not among the --window most
 *    recently used pages (an LRU, like a small TLB), or when it writes a page
 *    no kept record wrote since the page entered the window. So every page's
 *    first touch and first write are kept, in order, and a page coming back
 *    after others is kept again; the runs of accesses inside a few hot pages
 *    (the stack, the current code and data) are what goes. --window 1 keeps
 *    every change of page.
 * 3. Packing. A process's address space has its regions far apart (the
 *    executable near 0x55..., heap after it, libraries and mmaps near
 *    0x7f..., the stack near 0x7ffe...), too far apart for a guest mapping.
 *    Touched pages are grouped into regions: sorted, a gap of more than
 *    --gap untouched pages starts a new region. Regions are placed in
 *    address order, each at the next --align pages boundary after the
 *    previous one, from vbase + vcpu x 1 GiB; inside a region every page
 *    keeps its offset (and every access its offset in the page), so the
 *    locality the program had inside a region is the locality the guest
 *    has. A program whose packed regions exceed 1 GiB does not fit (exit 2).
 *
 *    The defaults, --gap 0 --align 1, pack the touched pages densely in
 *    address order (a region is then a run of contiguous touched pages):
 *    the synthetic guest maps and fills every page of its mapping, while a
 *    real guest's page tables map only the pages a process populated. An
 *    untouched page kept inside a region would be a mapped page the save's
 *    background copier walks (its guest-virtual stream) between touched
 *    ones, which no real guest has; with --gap 16 --align 16 such pages
 *    (22-30% of the mapping of the committed traces) lowered the
 *    locality organisation's VM access % (docs/benchmarks.md).
 *
 *	halite-trace-lackey [options] OUT [LACKEY_LOG | -]
 *
 * Exit 0 written, 1 I/O error, 2 usage or bad input (a line that is not
 * lackey's, or a trace that does not fit), with one line on stderr saying
 * which. A summary line on stderr: lines, accesses, records kept, pages,
 * regions, packed bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cli.h"
#include "endian_util.h"
#include "synth.h"

#define PROG "halite-trace-lackey"
#define PG 4096ull
#define GIB (1ull << 30)
#define MAX_WINDOW 4096

struct rec {
	uint64_t va;
	bool write;
};

struct conv {
	/* options */
	unsigned window, gap, align, vcpu;
	uint64_t vbase, max_records;
	bool data_only;
	/* the LRU: lru[0] most recent; written: a kept record wrote it since it entered */
	uint64_t lru[MAX_WINDOW];
	bool lru_w[MAX_WINDOW];
	unsigned lru_n;
	/* kept records */
	struct rec *recs;
	uint64_t nrecs, cap;
	uint64_t lines, accesses;
	bool full;
};

static int keep(struct conv *c, uint64_t va, bool write)
{
	if (c->nrecs == c->cap) {
		uint64_t ncap = c->cap ? c->cap * 2 : 1 << 16;
		struct rec *n = realloc(c->recs, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->recs = n;
		c->cap = ncap;
	}
	c->recs[c->nrecs++] = (struct rec){ va, write };
	if (c->max_records && c->nrecs == c->max_records)
		c->full = true;
	return 0;
}

/* Step 2 for one access to one page. */
static int access_page(struct conv *c, uint64_t va, bool write)
{
	uint64_t page = va / PG;
	unsigned i;
	bool was_w = false, emit;

	for (i = 0; i < c->lru_n && c->lru[i] != page; i++)
		;
	if (i < c->lru_n) {
		was_w = c->lru_w[i];
		emit = write && !was_w;
	} else {
		emit = true;
		if (c->lru_n < c->window)
			c->lru_n++;
		i = c->lru_n - 1; /* the least recent falls out */
	}
	memmove(c->lru + 1, c->lru, i * sizeof(c->lru[0]));
	memmove(c->lru_w + 1, c->lru_w, i * sizeof(c->lru_w[0]));
	c->lru[0] = page;
	c->lru_w[0] = was_w || (emit && write);
	return emit ? keep(c, va & ~7ull, write) : 0;
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/*
 * One line: "I  ADDR,SIZE", " L ADDR,SIZE", " S ...", " M ..." (hex address,
 * decimal size); valgrind's own "==PID== ..." lines and blank lines are
 * skipped. 1 an access, 0 skipped, -1 not a lackey line.
 */
static int parse_line(const char *s, char *kind, uint64_t *addr, uint64_t *size)
{
	uint64_t a = 0, z = 0;
	int nd = 0, h;

	if (!s[0] || s[0] == '\n' || !strncmp(s, "==", 2) || !strncmp(s, "--", 2))
		return 0;
	if (s[0] == 'I' && s[1] == ' ' && s[2] == ' ')
		*kind = 'I';
	else if (s[0] == ' ' && (s[1] == 'L' || s[1] == 'S' || s[1] == 'M') && s[2] == ' ')
		*kind = s[1];
	else
		return -1;
	s += 3;
	while ((h = hexval(*s)) >= 0 && nd < 17) {
		a = a << 4 | (uint64_t)h;
		s++;
		nd++;
	}
	if (!nd || nd > 16 || *s++ != ',')
		return -1;
	nd = 0;
	while (*s >= '0' && *s <= '9' && nd < 6) {
		z = z * 10 + (uint64_t)(*s++ - '0');
		nd++;
	}
	if (!nd || z == 0 || (*s && *s != '\n'))
		return -1;
	*addr = a;
	*size = z;
	return 1;
}

static int read_lackey(struct conv *c, FILE *in, const char *name)
{
	char *line = NULL;
	size_t cap = 0;
	int ret = 0;

	while (!c->full && getline(&line, &cap, in) > 0) {
		uint64_t a, z;
		char k;
		int r;

		c->lines++;
		r = parse_line(line, &k, &a, &z);
		if (r < 0) {
			fprintf(stderr, PROG ": %s: line %" PRIu64 " is not a lackey --trace-mem line: "
				"%.60s\n", name, c->lines, line);
			ret = -EINVAL;
			break;
		}
		if (!r || (k == 'I' && c->data_only))
			continue;
		if (a > UINT64_MAX - z) {
			fprintf(stderr, PROG ": %s: line %" PRIu64 ": the access wraps the address "
				"space\n", name, c->lines);
			ret = -EINVAL;
			break;
		}
		c->accesses++;
		ret = access_page(c, a, k == 'S' || k == 'M');
		/* An access across a page boundary touches the next page too. */
		if (!ret && (a + z - 1) / PG != a / PG)
			ret = access_page(c, (a + z - 1) & ~(PG - 1), k == 'S' || k == 'M');
		if (ret)
			break;
	}
	if (!ret && ferror(in)) {
		fprintf(stderr, PROG ": reading %s: %s\n", name, strerror(errno));
		ret = -EIO;
	}
	free(line);
	return ret;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct region {
	uint64_t first, last;	/* pages */
	uint64_t off;		/* packed offset, bytes */
};

/* Step 3: regions of the sorted distinct pages, and where each goes. */
static int pack(struct conv *c, struct region **out, uint64_t *nout, uint64_t *pages,
		uint64_t *bytes)
{
	uint64_t *pg = malloc((c->nrecs + 1) * sizeof(*pg)), n = 0, nr = 0, off = 0;
	struct region *r = NULL;

	if (!pg)
		return -ENOMEM;
	for (uint64_t i = 0; i < c->nrecs; i++)
		pg[i] = c->recs[i].va / PG;
	qsort(pg, c->nrecs, sizeof(*pg), cmp_u64);
	for (uint64_t i = 0; i < c->nrecs; i++)
		if (!n || pg[n - 1] != pg[i])
			pg[n++] = pg[i];
	r = malloc((n + 1) * sizeof(*r));
	if (!r) {
		free(pg);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < n; i++) {
		if (nr && pg[i] - r[nr - 1].last <= (uint64_t)c->gap + 1) {
			r[nr - 1].last = pg[i];
			continue;
		}
		r[nr++] = (struct region){ pg[i], pg[i], 0 };
	}
	for (uint64_t i = 0; i < nr; i++) {
		off = (off + c->align * PG - 1) / (c->align * PG) * (c->align * PG);
		r[i].off = off;
		off += (r[i].last - r[i].first + 1) * PG;
	}
	free(pg);
	*out = r;
	*nout = nr;
	*pages = n;
	*bytes = off;
	return 0;
}

static uint64_t packed_va(const struct conv *c, const struct region *r, uint64_t nr, uint64_t va)
{
	uint64_t page = va / PG, lo = 0, hi = nr;

	/* The last region whose first page is <= page; every kept page is in one. */
	while (hi - lo > 1) {
		uint64_t mid = (lo + hi) / 2;

		if (r[mid].first <= page)
			lo = mid;
		else
			hi = mid;
	}
	return c->vbase + (uint64_t)c->vcpu * GIB + r[lo].off + (va - r[lo].first * PG);
}

static int write_trace(const struct conv *c, const char *path, const struct region *r,
		       uint64_t nr)
{
	uint8_t h[SYNTH_TRACE_HDR] = { 0 }, rec[SYNTH_TRACE_REC];
	FILE *f = fopen(path, "we");
	int ret = 0;

	if (!f) {
		fprintf(stderr, PROG ": cannot create %s: %s\n", path, strerror(errno));
		return -errno;
	}
	memcpy(h, SYNTH_TRACE_MAGIC, 8);
	halite_put_le32(h + 8, 1);
	halite_put_le32(h + 12, SYNTH_TRACE_REC);
	halite_put_le32(h + 16, c->vcpu + 1);
	if (fwrite(h, sizeof(h), 1, f) != 1)
		ret = -EIO;
	for (uint64_t i = 0; !ret && i < c->nrecs; i++) {
		halite_put_le64(rec, packed_va(c, r, nr, c->recs[i].va));
		halite_put_le32(rec + 8, c->vcpu);
		halite_put_le32(rec + 12, c->recs[i].write ? SYNTH_TRACE_WRITE : 0);
		if (fwrite(rec, sizeof(rec), 1, f) != 1)
			ret = -EIO;
	}
	if (fclose(f) && !ret)
		ret = -EIO;
	if (ret)
		fprintf(stderr, PROG ": writing %s failed\n", path);
	return ret;
}

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " PROG " [options] OUT [LACKEY_LOG | -]\n"
"\n"
"Convert `valgrind --tool=lackey --trace-mem=yes` output (a file, or - / none\n"
"for stdin) to an access trace for halite-bench micro --trace (docs/trace-format.md).\n"
"\n"
"  --window N       LRU of recently used pages whose repeat reads are dropped,\n"
"                   1 .. %d (64)\n"
"  --gap N          untouched pages that still keep two touched pages in one\n"
"                   region, 0 .. 1048576 (0: dense, see the top of trace_lackey.c)\n"
"  --align N        regions start at multiples of N pages, 1 .. 1048576 (1)\n"
"  --data-only      drop instruction fetches\n"
"  --max-records N  stop after N kept records (0: no limit)\n"
"  --vcpu N         the vCPU the records are for, 0 .. 15 (0); header nvcpus = N + 1\n"
"  --vbase HEX      the guest's mapping base (0x7f0000000000, synth.h's default)\n"
"  --help, --version\n"
"\n"
"Exit 0 written, 1 I/O error, 2 usage or bad input.\n", MAX_WINDOW);
}

int main(int argc, char **argv)
{
	struct conv c = { .window = 64, .gap = 0, .align = 1, .vbase = 0x7f0000000000ull };
	struct region *r = NULL;
	uint64_t nr = 0, pages = 0, bytes = 0, v;
	const char *out = NULL, *in = NULL;
	FILE *f = stdin;
	int i, ret;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--version")) {
			return halite_cli_version(PROG);
		} else if (!strcmp(a, "--data-only")) {
			c.data_only = true;
		} else if ((!strcmp(a, "--window") || !strcmp(a, "--gap") ||
			    !strcmp(a, "--align") || !strcmp(a, "--max-records") ||
			    !strcmp(a, "--vcpu") || !strcmp(a, "--vbase")) && !val) {
			return bench_fail(PROG, false, 2,
					  "option '%s' needs a value (" PROG " --help)", a);
		} else if (!strcmp(a, "--window") || !strcmp(a, "--gap") || !strcmp(a, "--align") ||
			   !strcmp(a, "--max-records") || !strcmp(a, "--vcpu")) {
			uint64_t min = !strcmp(a, "--window") || !strcmp(a, "--align");
			uint64_t max = !strcmp(a, "--window") ? MAX_WINDOW :
				       !strcmp(a, "--gap") || !strcmp(a, "--align") ? 1u << 20 :
				       !strcmp(a, "--vcpu") ? SYNTH_MAX_VCPUS - 1 : UINT64_MAX;
			char want[64];

			if (!bench_parse_u64(val, min, max, &v)) {
				snprintf(want, sizeof(want), "%" PRIu64 " .. %" PRIu64, min, max);
				return bench_bad_arg(PROG, false, a, val, want);
			}
			if (!strcmp(a, "--window"))
				c.window = (unsigned)v;
			else if (!strcmp(a, "--gap"))
				c.gap = (unsigned)v;
			else if (!strcmp(a, "--align"))
				c.align = (unsigned)v;
			else if (!strcmp(a, "--vcpu"))
				c.vcpu = (unsigned)v;
			else
				c.max_records = v;
			i++;
		} else if (!strcmp(a, "--vbase")) {
			char *end = NULL;

			errno = 0;
			v = strtoull(val, &end, 16);
			if (errno || !end || *end || !v || v % GIB ||
			    v + SYNTH_MAX_VCPUS * GIB > (1ull << 47))
				return bench_bad_arg(PROG, false, a, val,
						     "hex, 1 GiB aligned, below 2^47 - 16 GiB");
			c.vbase = v;
			i++;
		} else if (a[0] == '-' && a[1]) {
			return bench_fail(PROG, false, 2, "unknown option '%.*s' (" PROG " --help)",
					  (int)strcspn(a, "="), a);
		} else if (!out) {
			out = a;
		} else if (!in) {
			in = a;
		} else {
			return bench_fail(PROG, false, 2,
					  "unexpected argument '%s' (" PROG " --help)", a);
		}
	}
	if (!out)
		return bench_fail(PROG, false, 2,
				  "missing OUT, the trace to write (" PROG " --help)");
	if (in && strcmp(in, "-")) {
		f = fopen(in, "re");
		if (!f) {
			fprintf(stderr, PROG ": cannot open %s: %s\n", in, strerror(errno));
			return 1;
		}
	}
	ret = read_lackey(&c, f, in ? in : "stdin");
	if (f != stdin)
		fclose(f);
	if (!ret && !c.nrecs) {
		fprintf(stderr, PROG ": %s: no accesses: not lackey --trace-mem=yes output?\n",
			in ? in : "stdin");
		ret = -EINVAL;
	}
	if (!ret)
		ret = pack(&c, &r, &nr, &pages, &bytes);
	if (!ret && bytes > GIB) {
		fprintf(stderr, PROG ": the program's %" PRIu64 " touched pages pack into %" PRIu64
			" MiB, more than a vCPU's 1 GiB: it does not fit\n", pages, bytes >> 20);
		ret = -EFBIG;
	}
	if (!ret)
		ret = write_trace(&c, out, r, nr);
	if (!ret)
		fprintf(stderr, PROG ": %" PRIu64 " lines, %" PRIu64 " accesses, %" PRIu64
			" records kept (%.2f%%), %" PRIu64 " pages in %" PRIu64 " regions, packed "
			"into %" PRIu64 " KiB%s\n", c.lines, c.accesses, c.nrecs,
			c.accesses ? 100.0 * (double)c.nrecs / (double)c.accesses : 0.0, pages, nr,
			bytes >> 10, c.full ? " (stopped at --max-records)" : "");
	free(r);
	free(c.recs);
	return ret == -EIO ? 1 : ret == -ENOMEM ? 1 : ret ? 2 : 0;
}
