// SPDX-License-Identifier: MIT
/*
 * halite-inspect relayout: rewrite a snapshot's locality blocks in the order
 * its guest touched memory in recorded restores (issue 17), from the
 * learning traces the restore engine writes (docs/restore-trace.md,
 * version 2: a touch line per memory block first touched after resume).
 *
 * The merge of several traces is a pure function of the set of traces, not
 * of the order they are given in:
 *
 *   1. every stored memory block touched in any trace gets: count, how many
 *      traces touched it; rank, the lower median of its touch positions (0
 *      for a trace's first touch line, 1 for the next, ...) over the traces
 *      that touched it; vCPU, the one that touched it first in most of them
 *      (a tie: the lowest index; a thread that is not a vCPU after every
 *      vCPU). The median, not the earliest: one restore that happened to
 *      touch a block early should not pull it ahead of where the others
 *      agree it belongs; with one or two traces it is the earliest;
 *   2. blocks by count, highest first: what every restore needed before what
 *      only one did. Within a count, each vCPU's blocks in rank order (ties:
 *      the lower block number), packed into locality blocks exactly as the
 *      writer packs them, and those LBs written in rounds: vCPU 0's first,
 *      vCPU 1's first, ..., then each one's second, so that each vCPU's
 *      early blocks are at the front of the file and the streams advance
 *      together, as a prefetcher reads them. Each vCPU's blocks go to its
 *      own stream (vcpuN; blocks of a thread that is not a vCPU to "other"),
 *      so that stream readahead after a demand read follows that vCPU;
 *   3. those LBs are the hot prefix: the file's first hot-lbs LBs, each
 *      flushed before the next is filled so that nothing else lands among
 *      them; --hot-max cuts the list of LBs (the least shared last);
 *   4. every other stored block after them, each in its source stream, in
 *      the source's order (its LBs read in file order); the streams' LBs
 *      interleave as they fill, as in a save, so the file keeps roughly the
 *      save's order and exactly each stream's. Zero blocks stay zero,
 *      never-touched blocks never touched.
 *
 * Bytes are copied as stored (halite_writer_put_encoded): never decoded or
 * re-encoded, from locality blocks whose checksums halite_reader_read_lb()
 * verified. The output is a new file with a new uuid (the writer draws
 * one): its LB numbers differ from the source's, so a restore trace of the
 * source must not be read against it, and its uuid makes every reader refuse
 * that. The source's uuid is recorded in metadata halite.relayout.
 *
 * Memory: the touch records of all traces (about 16 bytes per stored block
 * touched), the hot blocks' stored bytes (at most the hot prefix), one LB.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "inspect.h"
#include "trace.h"

void help_relayout(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " relayout FILE --trace TRACE [--trace TRACE...] -o OUT\n"
		"       [--hot-max SIZE] [--no-sync] [--progress[=MODE]] [--json]\n\n"
		"Write OUT: snapshot FILE with its locality blocks (LBs) re-laid out in\n"
		"the order the guest touched its memory in the restores that wrote the\n"
		"TRACEs (learning restores: halite-qemu restore --learn; trace version 2,\n"
		"docs/restore-trace.md). The stored blocks the traces touched come first,\n"
		"the hot prefix: those touched by the most traces first; within that,\n"
		"each vCPU's blocks in its stream vcpuN ('other' for a thread that is\n"
		"not a vCPU), in the order the guest touched them (a block's place: the\n"
		"median of its places in the traces that touched it), the vCPUs' LBs in\n"
		"rounds. The result does not depend on the order of the TRACEs. Then\n"
		"every other stored block, each in its stream of FILE and in FILE's\n"
		"order. Every memory block's stored bytes are copied unchanged (checked\n"
		"against their LB's checksum, never decoded); regions, vCPUs, device\n"
		"state, metadata, save statistics, page, memory-block and LB sizes and\n"
		"the codec are FILE's.\n"
		"OUT is a new file (a new uuid): FILE's traces do not apply to it.\n"
		"Metadata " HLT_RELAYOUT_META " records 'traces=N hot-lbs=K hot-blocks=M\n"
		"source-uuid=HEX': OUT's first K LBs hold the M hot blocks.\n\n"
		"  --trace TRACE      a learning restore's trace of FILE, or the hot set\n"
		"                     a template of FILE saved (halite-cloned:\n"
		"                     templates/ID.hot) (repeat for several); refused:\n"
		"                     a trace of another file, a\n"
		"                     version 1 trace (no touches), a failed restore's\n"
		"                     (a cancelled one is taken: what the guest touched\n"
		"                     until the VM stopped)\n"
		"  -o, --output OUT   the snapshot to write (not FILE nor a TRACE;\n"
		"                     replaced only once complete, mode 0600)\n"
		"  --hot-max SIZE     at most SIZE bytes of hot prefix: whole LBs, at\n"
		"                     least one (K and M suffixes, powers of 1024; 4K\n"
		"                     to 2^63); the least shared blocks are cut first\n"
		"  --no-sync          do not fdatasync OUT at the end\n"
		"  --progress[=MODE]  progress on stderr about every 0.5 s: text, json\n"
		"                     or none (the default)\n"
		"  --json             one JSON object on stdout\n"
		"  -h, --help         this text\n"
		"  --version          the program's and the file format's version\n\n"
		"JSON keys: ok (and on failure error and exit), file, output, traces[]\n"
		"  (the paths), source_uuid, uuid (OUT's), hot_max (bytes, null without\n"
		"  --hot-max), touched_blocks (stored blocks any trace touched), hot_lbs,\n"
		"  hot_blocks, hot_bytes (their stored bytes), cut_blocks (touched but\n"
		"  left out of the hot prefix by --hot-max), lb_count (OUT's),\n"
		"  hot_streams[]: stream, lbs, blocks; mbs: stored, zero, untouched.\n\n"
		"Exit status: 0 ok, 1 FILE or a TRACE is bad or does not open, or OUT\n"
		"was not written, 2 usage: a bad option, a TRACE that cannot be used\n"
		"(another file's, version 1, a failed restore), OUT an input, --hot-max\n"
		"below one of FILE's LBs (nothing is written).\n");
	help_store(f);
}

struct opts {
	const char *file, *out;
	const char **traces;
	unsigned ntraces;
	uint64_t hot_max;	/* 0: no bound */
	bool no_sync, json;
	int progress;
};

/* A stored block's touch in one trace. */
struct touch_rec {
	uint64_t mb;
	uint64_t rank;
	uint32_t vcpu;
};

/* A hot block: the merged view of its touches. */
struct hot {
	uint64_t mb;
	uint64_t rank;
	uint32_t count;
	uint32_t vcpu;
	/* from the source's map */
	uint64_t lb;
	uint32_t offset, length;
	bool compressed;
	uint64_t buf_off;	/* where its bytes are gathered */
};

/* One LB of the hot prefix: hot[from .. to - 1], all of one vCPU. */
struct group {
	size_t from, to;
	uint32_t vcpu;
};

struct relayout {
	const struct opts *o;
	struct halite_reader *r;
	const struct halite_file_info *fi;
	struct touch_rec *recs;
	size_t nrecs, recs_cap;
	struct hot *hot;
	size_t nhot;
	struct group *groups;
	size_t ngroups, groups_cap, ngroups_kept;
	uint8_t *is_hot;	/* one bit per memory block: in the hot prefix */
	uint8_t *hot_bytes;
	uint64_t hot_len;
	struct halite_writer *w;
	struct progress progress;
	uint64_t done_bytes;
	char log[512];
};

static uint32_t stream_of(uint32_t vcpu)
{
	return vcpu == TOUCH_NOT_VCPU ? HALITE_STREAM(HALITE_STREAM_OTHER, 0)
				      : HALITE_STREAM(HALITE_STREAM_VCPU, vcpu);
}

static int on_touch(void *ctx, const struct touch_line *l)
{
	struct relayout *rl = ctx;

	/* Zero and never-touched blocks take no space: nothing to place. */
	if (l->kind != HALITE_MB_STORED)
		return 0;
	if (rl->nrecs == rl->recs_cap) {
		size_t cap = rl->recs_cap ? 2 * rl->recs_cap : 4096;
		struct touch_rec *v = realloc(rl->recs, cap * sizeof(*v));

		if (!v) {
			errorf("out of memory for the touches");
			return EXIT_FAIL;
		}
		rl->recs = v;
		rl->recs_cap = cap;
	}
	rl->recs[rl->nrecs++] = (struct touch_rec){ l->mb, l->rank, l->vcpu };
	return 0;
}

/* Parses one trace into rl->recs; 0 or the exit code, said. */
static int read_trace(struct relayout *rl, const char *path)
{
	struct trace t = { 0 };
	struct stat st;
	int ret;

	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
		return usage_error("%s: not a regular file%s", path,
				   S_ISDIR(st.st_mode) ? " (a directory)" : "");
	t.f = fopen(path, "r");
	if (!t.f) {
		errorf("%s: %s", path, strerror(errno));
		return EXIT_FAIL;
	}
	t.path = path;
	t.file = rl->o->file;
	t.r = rl->r;
	t.touch_fn = on_touch;
	t.touch_ctx = rl;
	ret = trace_parse(&t, NULL, NULL);
	/* A trace of another snapshot is a wrong argument, not a bad file. */
	if (ret && t.wrong_file)
		ret = EXIT_USAGE;
	if (!ret && t.version < 2)
		ret = usage_error("%s: a version 1 trace records no touches; relayout needs a "
				  "learning restore's trace (halite-qemu restore --learn)", path);
	/*
	 * A restore that failed (an LB that did not read or verify) left the
	 * guest stuck at the failure: its last touches are the failure's, not
	 * the guest at work, and a layout should not learn them. One cancelled
	 * (the VM stopped before all memory was in: -ECANCELED) was working
	 * normally until then, and is taken. A template's hot set (no stat
	 * lines) records no one restore: its touches are clones' at work.
	 */
	if (!ret && !t.from_template && !t.u[S_DONE] && t.error != -ECANCELED)
		ret = usage_error("%s: the restore it records failed (%s): its last touches are "
				  "the failure's; use a trace of a restore that completed", path,
				  halite_strerror(t.error));
	trace_free(&t);
	fclose(t.f);
	return ret;
}

static int cmp_rec(const void *a, const void *b)
{
	const struct touch_rec *x = a, *y = b;

	if (x->mb != y->mb)
		return x->mb < y->mb ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->vcpu < y->vcpu ? -1 : x->vcpu > y->vcpu;
}

static int cmp_hot(const void *a, const void *b)
{
	const struct hot *x = a, *y = b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	if (x->vcpu != y->vcpu)
		return x->vcpu < y->vcpu ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->mb < y->mb ? -1 : x->mb > y->mb;
}

/* Step 1: one entry per touched stored block, from the records sorted by block. */
static int merge(struct relayout *rl)
{
	size_t n = 0;

	qsort(rl->recs, rl->nrecs, sizeof(*rl->recs), cmp_rec);
	rl->hot = calloc(rl->nrecs ? rl->nrecs : 1, sizeof(*rl->hot));
	if (!rl->hot) {
		errorf("out of memory for the hot blocks");
		return EXIT_FAIL;
	}
	for (size_t i = 0, j; i < rl->nrecs; i = j) {
		const struct touch_rec *g = &rl->recs[i];
		struct hot *h = &rl->hot[n++];
		uint32_t best = 0, best_n = 0;
		struct halite_mb_loc loc;
		int ret;

		for (j = i; j < rl->nrecs && rl->recs[j].mb == g->mb; j++)
			;
		/* Sorted by rank within the block: the lower median is in the middle. */
		h->mb = g->mb;
		h->count = (uint32_t)(j - i);
		h->rank = g[(h->count - 1) / 2].rank;
		/* The vote: a trace counts once per block; count <= traces, small. */
		for (size_t a = 0; a < h->count; a++) {
			uint32_t v = g[a].vcpu, c = 0;

			for (size_t b = 0; b < h->count; b++)
				c += g[b].vcpu == v;
			if (c > best_n || (c == best_n && v < best)) {
				best = v;
				best_n = c;
			}
		}
		h->vcpu = best;
		ret = halite_reader_mb_lookup(rl->r, h->mb, &loc);
		if (ret < 0) {
			report_error(rl->o->file, NULL, ret, halite_reader_errmsg(rl->r));
			return exit_code_for(ret);
		}
		h->lb = loc.lb;
		h->offset = loc.offset;
		h->length = loc.length;
		h->compressed = loc.compressed;
	}
	rl->nhot = n;
	qsort(rl->hot, rl->nhot, sizeof(*rl->hot), cmp_hot);
	return 0;
}

static int add_group(struct relayout *rl, size_t from, size_t to, uint32_t vcpu)
{
	if (rl->ngroups == rl->groups_cap) {
		size_t cap = rl->groups_cap ? 2 * rl->groups_cap : 64;
		struct group *v = realloc(rl->groups, cap * sizeof(*v));

		if (!v) {
			errorf("out of memory");
			return EXIT_FAIL;
		}
		rl->groups = v;
		rl->groups_cap = cap;
	}
	rl->groups[rl->ngroups++] = (struct group){ from, to, vcpu };
	return 0;
}

/*
 * Step 2: the hot prefix's LBs in file order. For each count, each vCPU's
 * run of rl->hot is cut into LBs as the writer packs (a block that does not
 * fit the LB's remaining bytes starts the next), then dealt out in rounds.
 */
static int plan(struct relayout *rl)
{
	uint32_t lb_size = rl->fi->lb_size;
	size_t level = 0;

	while (level < rl->nhot) {
		size_t end = level, nv = 0, *pos = NULL;
		bool more = true;
		int ret = 0;

		while (end < rl->nhot && rl->hot[end].count == rl->hot[level].count)
			end++;
		/* pos[k]: where the k-th vCPU of this level has got to. */
		for (size_t i = level; i < end; i++)
			nv += i == level || rl->hot[i].vcpu != rl->hot[i - 1].vcpu;
		pos = malloc(2 * nv * sizeof(*pos));
		if (!pos) {
			errorf("out of memory");
			return EXIT_FAIL;
		}
		for (size_t i = level, k = 0; i < end; i++) {
			if (i == level || rl->hot[i].vcpu != rl->hot[i - 1].vcpu) {
				pos[2 * k] = i;
				if (k)
					pos[2 * k - 1] = i;
				k++;
			}
		}
		pos[2 * nv - 1] = end;
		/* pos[2k] .. pos[2k+1]: the k-th vCPU's blocks not placed yet. */
		while (more && !ret) {
			more = false;
			for (size_t k = 0; k < nv && !ret; k++) {
				size_t from = pos[2 * k], to = from;
				uint64_t used = 0;

				if (from == pos[2 * k + 1])
					continue;
				while (to < pos[2 * k + 1] && used + rl->hot[to].length <= lb_size)
					used += rl->hot[to++].length;
				ret = add_group(rl, from, to, rl->hot[from].vcpu);
				pos[2 * k] = to;
				more = more || to < pos[2 * k + 1];
			}
		}
		free(pos);
		if (ret)
			return ret;
		level = end;
	}
	return 0;
}

struct where {
	uint64_t lb;
	size_t idx;
};

static int cmp_where(const void *a, const void *b)
{
	const struct where *x = a, *y = b;

	if (x->lb != y->lb)
		return x->lb < y->lb ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Step 3: the kept groups' blocks, marked hot, their stored bytes gathered. */
static int gather(struct relayout *rl)
{
	const struct halite_file_info *fi = rl->fi;
	uint64_t max_lbs = rl->o->hot_max ? rl->o->hot_max / fi->lb_size : UINT64_MAX;
	struct where *order = NULL;
	uint64_t cur = UINT64_MAX;
	uint8_t *lb = NULL;
	size_t nkept = 0;
	int ret = EXIT_FAIL;

	rl->ngroups_kept = rl->ngroups < max_lbs ? rl->ngroups : (size_t)max_lbs;
	for (size_t g = 0; g < rl->ngroups_kept; g++)
		nkept += rl->groups[g].to - rl->groups[g].from;
	rl->is_hot = calloc(fi->mb_count / 8 + 1, 1);
	order = malloc((nkept ? nkept : 1) * sizeof(*order));
	if (!rl->is_hot || !order)
		goto oom;
	rl->hot_len = 0;
	for (size_t g = 0, k = 0; g < rl->ngroups_kept; g++) {
		for (size_t i = rl->groups[g].from; i < rl->groups[g].to; i++) {
			struct hot *h = &rl->hot[i];

			rl->is_hot[h->mb / 8] |= (uint8_t)(1u << (h->mb % 8));
			h->buf_off = rl->hot_len;
			rl->hot_len += h->length;
			order[k++] = (struct where){ h->lb, i };
		}
	}
	rl->hot_bytes = malloc(rl->hot_len ? rl->hot_len : 1);
	lb = halite_reader_alloc_lb(rl->r);
	if (!rl->hot_bytes || !lb)
		goto oom;
	/* Each source LB read (and its checksum verified) once. */
	qsort(order, nkept, sizeof(*order), cmp_where);
	ret = 0;
	for (size_t k = 0; k < nkept; k++) {
		const struct hot *h = &rl->hot[order[k].idx];

		if (h->lb != cur) {
			ret = halite_reader_read_lb(rl->r, h->lb, lb);
			if (ret < 0) {
				report_error(rl->o->file, NULL, ret, halite_reader_errmsg(rl->r));
				ret = exit_code_for(ret);
				break;
			}
			cur = h->lb;
		}
		memcpy(rl->hot_bytes + h->buf_off, (uint8_t *)lb + h->offset, h->length);
	}
	halite_reader_free_lb(lb);
	free(order);
	return ret;
oom:
	errorf("out of memory for the hot blocks");
	halite_reader_free_lb(lb);
	free(order);
	return ret;
}

static void capture_log(void *ctx, int level, const char *msg)
{
	struct relayout *rl = ctx;

	if (level <= HALITE_LOG_ERROR)
		snprintf(rl->log, sizeof(rl->log), "%s", msg);
}

/* A writer call failed: says so with the writer's detail; returns EXIT_FAIL. */
static int write_failed(struct relayout *rl, const char *what, int err)
{
	report_error(rl->o->out, what, err, halite_writer_errmsg(rl->w));
	return EXIT_FAIL;
}

static int put(struct relayout *rl, uint32_t stream, uint64_t mb, const uint8_t *bytes,
	       uint32_t len, bool compressed)
{
	char what[48];
	int ret;

	ret = halite_writer_put_encoded(rl->w, stream, mb, bytes, len, compressed);
	if (ret < 0) {
		snprintf(what, sizeof(what), "MB %" PRIu64, mb);
		return write_failed(rl, what, ret);
	}
	rl->done_bytes += len;
	progress_update(&rl->progress, (int64_t)rl->done_bytes, false);
	return 0;
}

/* The hot prefix: each group one LB, flushed before the next is filled. */
static int write_hot(struct relayout *rl)
{
	for (size_t g = 0; g < rl->ngroups_kept; g++) {
		const struct group *gr = &rl->groups[g];
		uint32_t stream = stream_of(gr->vcpu);
		int ret;

		for (size_t i = gr->from; i < gr->to; i++) {
			const struct hot *h = &rl->hot[i];

			ret = put(rl, stream, h->mb, rl->hot_bytes + h->buf_off, h->length,
				  h->compressed);
			if (ret)
				return ret;
		}
		ret = halite_writer_flush_stream(rl->w, stream);
		if (ret < 0)
			return write_failed(rl, NULL, ret);
	}
	return 0;
}

/* Zero blocks as zero; then every stored block not hot, in the source's order. */
static int write_rest(struct relayout *rl)
{
	const struct halite_file_info *fi = rl->fi;
	uint8_t *lb = halite_reader_alloc_lb(rl->r);
	int ret = 0;

	if (!lb) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	for (uint64_t mb = 0; mb < fi->mb_count && !ret; mb++) {
		struct halite_mb_loc loc;

		ret = halite_reader_mb_lookup(rl->r, mb, &loc);
		if (ret < 0) {
			report_error(rl->o->file, NULL, ret, halite_reader_errmsg(rl->r));
			ret = exit_code_for(ret);
		} else if (loc.state == HALITE_MB_ZERO &&
			   (ret = halite_writer_put_zero(rl->w, mb)) < 0) {
			ret = write_failed(rl, NULL, ret);
		} else {
			ret = 0;
		}
	}
	for (uint64_t i = 0; i < fi->lb_count && !ret; i++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n, cold = 0;

		ret = halite_reader_lb_info(rl->r, i, &li);
		if (!ret)
			ret = halite_reader_lb_members(rl->r, i, &mbs, &n);
		for (uint32_t k = 0; !ret && k < n; k++)
			cold += !(rl->is_hot[mbs[k] / 8] & (1u << (mbs[k] % 8)));
		if (!ret && cold)
			ret = halite_reader_read_lb(rl->r, i, lb);
		if (ret < 0) {
			report_error(rl->o->file, NULL, ret, halite_reader_errmsg(rl->r));
			ret = exit_code_for(ret);
			break;
		}
		for (uint32_t k = 0; k < n && cold && !ret; k++) {
			struct halite_mb_loc loc;

			if (rl->is_hot[mbs[k] / 8] & (1u << (mbs[k] % 8)))
				continue;
			ret = halite_reader_mb_lookup(rl->r, mbs[k], &loc);
			if (ret < 0) {
				report_error(rl->o->file, NULL, ret, halite_reader_errmsg(rl->r));
				ret = exit_code_for(ret);
				break;
			}
			ret = put(rl, li.stream, mbs[k], lb + loc.offset, loc.length,
				  loc.compressed);
		}
	}
	halite_reader_free_lb(lb);
	return ret;
}

/* vCPUs and their roots, device state, metadata (ours replaced), save statistics. */
static int write_sections(struct relayout *rl, const char *relayout_value)
{
	const struct halite_root *roots;
	uint32_t vcount, nroots;
	const void *dev, *val;
	const char *key;
	uint64_t devlen, v;
	uint32_t len;
	int ret = 0;

	if (!halite_reader_vcpus(rl->r, &vcount, &roots, &nroots))
		for (uint32_t i = 0; i < nroots && !ret; i++)
			ret = halite_writer_add_root(rl->w, &roots[i]);
	if (!ret && !halite_reader_device_state(rl->r, &dev, &devlen))
		ret = halite_writer_set_device_state(rl->w, dev, devlen);
	for (uint32_t i = 0; !ret && i < halite_reader_meta_count(rl->r); i++) {
		ret = halite_reader_meta(rl->r, i, &key, &val, &len);
		/* A relayouted file relayouted again: the new record replaces the old. */
		if (!ret && strcmp(key, HLT_RELAYOUT_META) != 0)
			ret = halite_writer_set_meta(rl->w, key, val, len);
	}
	if (!ret)
		ret = halite_writer_set_meta(rl->w, HLT_RELAYOUT_META, relayout_value,
					     (uint32_t)strlen(relayout_value));
	for (uint32_t i = 0; !ret && i < halite_reader_stat_count(rl->r); i++) {
		ret = halite_reader_stat(rl->r, i, &key, &v);
		if (!ret)
			ret = halite_writer_set_stat(rl->w, key, v);
	}
	return ret < 0 ? write_failed(rl, "sections", ret) : 0;
}

static int write_out(struct relayout *rl, const char *relayout_value)
{
	const struct halite_file_info *fi = rl->fi;
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region *regions;
	const struct halite_root *roots;
	uint32_t vcount = 0, nroots;
	int ret;

	regions = calloc(fi->region_count, sizeof(*regions));
	if (!regions) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	for (uint32_t i = 0; i < fi->region_count; i++) {
		const struct halite_region_info *ri = halite_reader_region(rl->r, i);

		regions[i] = (struct halite_region){ ri->name, ri->gpa, ri->length };
	}
	if (!halite_reader_vcpus(rl->r, &vcount, &roots, &nroots))
		wo.vcpu_count = vcount;
	wo.page_size = fi->page_size;
	wo.mb_pages = fi->mb_pages;
	wo.lb_size = fi->lb_size;
	wo.codec = fi->codec;
	wo.level = fi->codec_level;
	wo.flags = rl->o->no_sync ? HALITE_WRITER_NO_SYNC : 0;
	wo.log = capture_log;
	wo.log_ctx = rl;
	wo.log_level = HALITE_LOG_ERROR;
	ret = halite_writer_create(&rl->w, rl->o->out, regions, fi->region_count, &wo);
	free(regions);
	if (ret < 0) {
		report_error(rl->o->out, NULL, ret, rl->log);
		return EXIT_FAIL;
	}
	progress_begin(&rl->progress, rl->o->progress, "relayout", rl->o->out,
		       (int64_t)fi->stored_bytes);
	ret = write_hot(rl);
	if (!ret)
		ret = write_rest(rl);
	progress_update(&rl->progress, ret ? -1 : (int64_t)rl->done_bytes, true);
	if (!ret)
		ret = write_sections(rl, relayout_value);
	if (!ret && (ret = halite_writer_finish(rl->w)) < 0)
		ret = write_failed(rl, NULL, ret);
	return ret;
}

/* ---- the command ---- */

enum { O_TRACE = 0x200, O_HOT_MAX, O_NO_SYNC, O_PROGRESS };

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "trace", required_argument, NULL, O_TRACE },
		{ "output", required_argument, NULL, 'o' },
		{ "hot-max", required_argument, NULL, O_HOT_MAX },
		{ "no-sync", no_argument, NULL, O_NO_SYNC },
		{ "progress", optional_argument, NULL, O_PROGRESS },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	o->progress = HALITE_PROGRESS_NONE;
	o->traces = calloc((size_t)argc, sizeof(*o->traces));
	if (!o->traces) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, ":ho:", lo, NULL)) != -1) {
		switch (c) {
		case O_TRACE:
			o->traces[o->ntraces++] = optarg;
			break;
		case 'o':
			o->out = optarg;
			break;
		case O_HOT_MAX:
			if (halite_parse_size(optarg, &o->hot_max) < 0 || o->hot_max < HALITE_MIN_LB_SIZE ||
			    o->hot_max > INT64_MAX)
				return usage_error("--hot-max: a size from 4K to 2^63 bytes, not '%s'",
						   optarg);
			break;
		case O_NO_SYNC:
			o->no_sync = true;
			break;
		case O_PROGRESS:
			if (progress_parse(optarg, &o->progress))
				return EXIT_USAGE;
			break;
		case OPT_JSON:
			run_set_json();
			break;
		default:
			/* -1: done, exit 0 (help, version); else the exit code. */
			c = common_option(c, argv, help_relayout);
			return c == EXIT_OK ? -1 : c;
		}
	}
	o->json = run_json();
	if (argc - optind != 1)
		return usage_hint(argc - optind ? "expected one FILE" : "expected FILE");
	o->file = argv[optind];
	if (!o->ntraces)
		return usage_hint("--trace TRACE is required (a learning restore's trace)");
	if (!o->out)
		return usage_hint("-o OUT is required");
	return 0;
}

/* OUT is no input; no trace given twice (it would count twice). */
static int check_paths(const struct opts *o)
{
	int ret = refuse_input_as_output(o->out, o->file, "the snapshot to re-lay out");

	for (unsigned i = 0; !ret && i < o->ntraces; i++) {
		struct stat a, b;

		ret = refuse_input_as_output(o->out, o->traces[i], "a trace");
		for (unsigned j = 0; !ret && j < i; j++) {
			bool same = strcmp(o->traces[i], o->traces[j]) == 0;

			if (!same && stat(o->traces[i], &a) == 0 && stat(o->traces[j], &b) == 0)
				same = a.st_dev == b.st_dev && a.st_ino == b.st_ino;
			if (same)
				ret = usage_error("--trace %s given twice (as %s): each restore counts "
						  "once", o->traces[i], o->traces[j]);
		}
	}
	return ret;
}

static const char *const relayout_keys[] = {
	"file", "output", "traces", "source_uuid", "uuid", "hot_max", "touched_blocks",
	"hot_lbs", "hot_blocks", "hot_bytes", "cut_blocks", "lb_count", "hot_streams", "mbs",
	NULL,
};

/* JSON and text: what OUT holds, read back from it. */
static int report(struct relayout *rl, uint64_t hot_blocks)
{
	const struct opts *o = rl->o;
	const struct halite_file_info *fi = rl->fi, *oi;
	struct halite_reader *out = NULL;
	cJSON *root, *a, *e;
	char uuid[33], sn[48], b1[32];
	int ret;

	ret = open_reader(&out, o->out);
	if (ret)
		return ret;
	oi = halite_reader_info(out);
	if (!o->json) {
		notef("%s: %" PRIu64 " locality blocks, the first %zu the hot prefix (%" PRIu64
		      " memory blocks, %s, from %u trace%s), then %" PRIu64 " in %s's order",
		      o->out, oi->lb_count, rl->ngroups_kept, hot_blocks,
		      human_bytes(rl->hot_len, b1, sizeof(b1)), o->ntraces,
		      o->ntraces == 1 ? "" : "s", oi->lb_count - rl->ngroups_kept, o->file);
		halite_reader_free(out);
		return EXIT_OK;
	}
	root = cJSON_CreateObject();
	cJSON_AddStringToObject(root, "file", o->file);
	cJSON_AddStringToObject(root, "output", o->out);
	a = cJSON_AddArrayToObject(root, "traces");
	for (unsigned i = 0; i < o->ntraces; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(o->traces[i]));
	trace_fmt_uuid(fi->uuid, uuid);
	cJSON_AddStringToObject(root, "source_uuid", uuid);
	trace_fmt_uuid(oi->uuid, uuid);
	cJSON_AddStringToObject(root, "uuid", uuid);
	if (o->hot_max)
		json_add_u64(root, "hot_max", o->hot_max);
	else
		cJSON_AddNullToObject(root, "hot_max");
	json_add_u64(root, "touched_blocks", rl->nhot);
	json_add_u64(root, "hot_lbs", rl->ngroups_kept);
	json_add_u64(root, "hot_blocks", hot_blocks);
	json_add_u64(root, "hot_bytes", rl->hot_len);
	json_add_u64(root, "cut_blocks", rl->nhot - hot_blocks);
	json_add_u64(root, "lb_count", oi->lb_count);
	a = cJSON_AddArrayToObject(root, "hot_streams");
	/* Per stream, in the order the streams' first LBs come. */
	for (size_t g = 0; g < rl->ngroups_kept; g++) {
		uint64_t lbs = 0, blocks = 0;
		bool first = true;

		for (size_t k = 0; k < g && first; k++)
			first = rl->groups[k].vcpu != rl->groups[g].vcpu;
		if (!first)
			continue;
		for (size_t k = g; k < rl->ngroups_kept; k++) {
			if (rl->groups[k].vcpu != rl->groups[g].vcpu)
				continue;
			lbs++;
			blocks += rl->groups[k].to - rl->groups[k].from;
		}
		e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "stream",
					halite_stream_name(stream_of(rl->groups[g].vcpu), sn,
							   sizeof(sn)));
		json_add_u64(e, "lbs", lbs);
		json_add_u64(e, "blocks", blocks);
		cJSON_AddItemToArray(a, e);
	}
	e = cJSON_AddObjectToObject(root, "mbs");
	json_add_u64(e, "stored", oi->mb_stored);
	json_add_u64(e, "zero", oi->mb_zero);
	json_add_u64(e, "untouched", oi->mb_untouched);
	halite_reader_free(out);
	return json_emit(root, EXIT_OK);
}

int cmd_relayout(int argc, char **argv)
{
	struct opts o = { 0 };
	struct relayout rl = { .o = &o };
	char value[160], uuid[33];
	uint64_t hot_blocks = 0;
	int ret;

	run_keys(relayout_keys);
	ret = parse_args(argc, argv, &o);
	if (ret) {
		free(o.traces);
		return ret < 0 ? EXIT_OK : ret;
	}
	cJSON_AddStringToObject(run_result(), "file", o.file);
	cJSON_AddStringToObject(run_result(), "output", o.out);
	{
		cJSON *a = cJSON_AddArrayToObject(run_result(), "traces");

		for (unsigned i = 0; i < o.ntraces; i++)
			cJSON_AddItemToArray(a, cJSON_CreateString(o.traces[i]));
	}
	if (o.hot_max)
		json_add_u64(run_result(), "hot_max", o.hot_max);
	ret = check_paths(&o);
	if (ret)
		goto out;
	ret = halite_writer_check_path(o.out, rl.log, sizeof(rl.log));
	if (ret < 0) {
		errorf("%s", rl.log);
		ret = ret == -EISDIR || ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
		goto out;
	}
	ret = open_reader(&rl.r, o.file);
	if (ret)
		goto out;
	rl.fi = halite_reader_info(rl.r);
	if (o.hot_max && o.hot_max < rl.fi->lb_size) {
		ret = usage_error("--hot-max %" PRIu64 " is less than one locality block of %s "
				  "(%u bytes)", o.hot_max, o.file, rl.fi->lb_size);
		goto out;
	}
	for (unsigned i = 0; i < o.ntraces && !ret; i++)
		ret = read_trace(&rl, o.traces[i]);
	if (!ret)
		ret = merge(&rl);
	if (!ret)
		ret = plan(&rl);
	if (!ret)
		ret = gather(&rl);
	if (ret)
		goto out;
	for (size_t g = 0; g < rl.ngroups_kept; g++)
		hot_blocks += rl.groups[g].to - rl.groups[g].from;
	trace_fmt_uuid(rl.fi->uuid, uuid);
	snprintf(value, sizeof(value), "traces=%u hot-lbs=%zu hot-blocks=%" PRIu64
		 " source-uuid=%s", o.ntraces, rl.ngroups_kept, hot_blocks, uuid);
	ret = write_out(&rl, value);
	/* Without finish the writer leaves no footer; remove the incomplete file. */
	halite_writer_free(rl.w, true);
	rl.w = NULL;
	if (!ret)
		ret = report(&rl, hot_blocks);
out:
	halite_writer_free(rl.w, true);
	halite_reader_free(rl.r);
	free(rl.recs);
	free(rl.hot);
	free(rl.groups);
	free(rl.is_hot);
	free(rl.hot_bytes);
	free(o.traces);
	return ret;
}
