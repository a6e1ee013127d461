// SPDX-License-Identifier: MIT
/*
 * The synthetic guest's API (synth.h): each call runs on the guest in this
 * process (local.c), or, in child mode, is forwarded to the child that holds
 * it (child.c). Arguments are checked here, once for both.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int synth_create(struct synth_guest **gp, const struct synth_opts *opts)
{
	struct synth_opts o;
	struct synth_guest *g;
	int ret;

	if (!gp)
		return -EINVAL;
	ret = synth_normalize_opts(&o, opts);
	if (ret)
		return ret;
	if (!(o.flags & SYNTH_F_CHILD))
		return synth_local_create(gp, &o);
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->o = o;
	g->log.fn = o.log_fn;
	g->log.ctx = o.log_ctx;
	g->log.level = HALITE_LOG_DEBUG;
	g->nvcpus = o.nvcpus;
	g->nframes = o.mem_bytes >> PG_SHIFT;
	ret = synth_remote_create(g);
	if (ret) {
		free(g);
		return ret;
	}
	*gp = g;
	return 0;
}

void synth_free(struct synth_guest *g)
{
	if (!g)
		return;
	if (g->rem) {
		synth_remote_free(g);
		free(g);
		return;
	}
	synth_local_free(g);
}

int synth_start(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_START, 0, 0, 0, NULL, 0, NULL);
	return synth_local_run(g, true);
}

int synth_vcpu_seek(struct synth_guest *g, unsigned vcpu, uint64_t accesses)
{
	if (g->rem)
		return -ENOTSUP;
	if (vcpu >= g->nvcpus)
		return -EINVAL;
	return synth_local_vcpu_seek(g, vcpu, accesses);
}

int synth_vcpu_limit(struct synth_guest *g, unsigned vcpu, uint64_t accesses)
{
	if (g->rem)
		return -ENOTSUP;
	if (vcpu >= g->nvcpus)
		return -EINVAL;
	return synth_local_vcpu_limit(g, vcpu, accesses);
}

int synth_resume(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_RESUME, 0, 0, 0, NULL, 0, NULL);
	return synth_local_run(g, false);
}

int synth_pause(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_PAUSE, UINT64_MAX, 0, 0, NULL, 0, NULL);
	return synth_local_pause(g, -1);
}

int synth_pause_timed(struct synth_guest *g, unsigned timeout_ms)
{
	if (g->rem)
		return synth_remote_call(g, OP_PAUSE, timeout_ms, 0, 0, NULL, 0, NULL);
	return synth_local_pause(g, timeout_ms);
}

int synth_stop(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_STOP, 0, 0, 0, NULL, 0, NULL);
	return synth_local_stop(g);
}

int synth_wait_done(struct synth_guest *g, unsigned timeout_ms)
{
	if (g->rem)
		return synth_remote_call(g, OP_WAIT_DONE, timeout_ms, 0, 0, NULL, 0, NULL);
	return synth_local_wait_done(g, timeout_ms);
}

#define CHUNK_ENTRIES 4096u

int synth_vcpu_pages(struct synth_guest *g, unsigned vcpu, uint64_t first, uint64_t *va,
		     uint64_t *gpa, size_t n)
{
	if (vcpu >= g->nvcpus)
		return -EINVAL;
	if (g->rem) {
		uint64_t buf[2 * CHUNK_ENTRIES];
		size_t done = 0;

		while (done < n) {
			size_t want = n - done < CHUNK_ENTRIES ? n - done : CHUNK_ENTRIES;
			int got = synth_remote_call(g, OP_PAGES, vcpu, first + done, want, buf,
						    sizeof(buf), NULL);

			if (got < 0)
				return got;
			for (int i = 0; i < got; i++) {
				if (va)
					va[done + (size_t)i] = buf[2 * i];
				if (gpa)
					gpa[done + (size_t)i] = buf[2 * i + 1];
			}
			done += (size_t)got;
			if ((size_t)got < want)
				break;
		}
		return (int)done;
	}
	return synth_local_vcpu_pages(g, vcpu, first, va, gpa, n);
}

int synth_frame_kinds(struct synth_guest *g, uint64_t first, uint8_t *kinds, size_t n)
{
	if (g->rem) {
		size_t done = 0;

		while (done < n) {
			size_t want = n - done < 65536 ? n - done : 65536;
			int got = synth_remote_call(g, OP_KINDS, first + done, want, 0,
						    kinds + done, want, NULL);

			if (got < 0)
				return got;
			done += (size_t)got;
			if ((size_t)got < want)
				break;
		}
		return (int)done;
	}
	return synth_local_frame_kinds(g, first, kinds, n);
}

int synth_vcpu_stats(struct synth_guest *g, unsigned vcpu, struct synth_vcpu_stats *st)
{
	if (vcpu >= g->nvcpus || !st)
		return -EINVAL;
	if (g->rem) {
		int ret = synth_remote_call(g, OP_STATS, vcpu, 0, 0, st, sizeof(*st), NULL);

		return ret < 0 ? ret : 0;
	}
	synth_local_vcpu_stats(g, vcpu, st);
	return 0;
}

int synth_log_read(struct synth_guest *g, unsigned vcpu, uint64_t off, uint64_t *out, size_t max)
{
	if (vcpu >= g->nvcpus)
		return -EINVAL;
	if (g->rem) {
		size_t done = 0;

		while (done < max) {
			size_t want = max - done < 2 * CHUNK_ENTRIES ? max - done : 2 * CHUNK_ENTRIES;
			int got = synth_remote_call(g, OP_LOG_READ, vcpu, off + done, want,
						    out + done, want * sizeof(uint64_t), NULL);

			if (got < 0)
				return got;
			done += (size_t)got;
			if ((size_t)got < want)
				break;
		}
		return (int)done;
	}
	return synth_local_log_read(g, vcpu, off, out, max);
}

int synth_log_reset(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_LOG_RESET, 0, 0, 0, NULL, 0, NULL);
	return synth_local_log_reset(g);
}

int synth_trace_flush(struct synth_guest *g)
{
	if (g->rem)
		return synth_remote_call(g, OP_TRACE_FLUSH, 0, 0, 0, NULL, 0, NULL);
	return synth_local_trace_flush(g);
}

static int check_range(struct synth_guest *g, uint64_t gpa, uint64_t len)
{
	uint64_t mem = g->nframes << PG_SHIFT;

	if (gpa % PG_SIZE || len % PG_SIZE || gpa > mem || len > mem - gpa)
		return -EINVAL;
	return 0;
}

int synth_copy_range(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf)
{
	int ret = check_range(g, gpa, len);

	if (ret)
		return ret;
	if (g->rem)
		return synth_remote_copy(g, gpa, len, buf);
	return synth_local_copy_range(g, gpa, len, buf);
}

int synth_copy_memory(struct synth_guest *g, void *buf)
{
	return synth_copy_range(g, 0, g->nframes << PG_SHIFT, buf);
}

int synth_get_uffd(struct synth_guest *g)
{
	int fd;

	if (g->rem) {
		int ret = synth_remote_call(g, OP_UFFD, 0, 0, 0, NULL, 0, &fd);

		return ret < 0 ? ret : fd;
	}
	return synth_local_get_uffd();
}

int synth_madvise_dontneed(struct synth_guest *g, uint64_t gpa, uint64_t len)
{
	int ret = check_range(g, gpa, len);

	if (ret)
		return ret;
	if (g->rem)
		return synth_remote_call(g, OP_MADVISE, gpa, len, 0, NULL, 0, NULL);
	return synth_local_madvise_dontneed(g, gpa, len);
}
