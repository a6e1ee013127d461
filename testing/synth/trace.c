// SPDX-License-Identifier: MIT
/*
 * Access traces: recording (per-vCPU buffers appended to one file under a
 * mutex, so each vCPU's records stay in its order) and loading for replay.
 * The format is in synth.h. A trace file is input: every count and field is
 * checked before anything is allocated from it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "endian_util.h"
#include "internal.h"

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int synth_trace_open_out(struct synth_guest *g)
{
	uint8_t h[SYNTH_TRACE_HDR] = { 0 };
	int ret;

	g->trace_fd = open(g->o.trace_out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (g->trace_fd < 0) {
		ret = -errno;
		synth_err(g, "cannot create trace %s: %s", g->o.trace_out, strerror(errno));
		return ret;
	}
	memcpy(h, SYNTH_TRACE_MAGIC, 8);
	halite_put_le32(h + 8, 1);
	halite_put_le32(h + 12, SYNTH_TRACE_REC);
	halite_put_le32(h + 16, g->nvcpus);
	return write_all(g->trace_fd, h, sizeof(h));
}

int synth_trace_flush_vcpu(struct synth_vcpu *vc)
{
	struct synth_guest *g = vc->g;
	int ret = 0;

	if (!vc->rec_n)
		return __atomic_load_n(&g->trace_err, __ATOMIC_RELAXED);
	pthread_mutex_lock(&g->trace_mu);
	if (!g->trace_err) {
		ret = write_all(g->trace_fd, vc->rec, (size_t)vc->rec_n * SYNTH_TRACE_REC);
		/* Keep the first error; later records are dropped, not misordered. */
		if (ret)
			__atomic_store_n(&g->trace_err, ret, __ATOMIC_RELAXED);
	}
	ret = g->trace_err;
	pthread_mutex_unlock(&g->trace_mu);
	vc->rec_n = 0;
	return ret;
}

void synth_trace_append(struct synth_vcpu *vc, uint64_t va, bool write)
{
	uint8_t *r = vc->rec + (size_t)vc->rec_n * SYNTH_TRACE_REC;

	halite_put_le64(r, va);
	halite_put_le32(r + 8, vc->idx);
	halite_put_le32(r + 12, write ? SYNTH_TRACE_WRITE : 0);
	if (++vc->rec_n == REC_BUF)
		synth_trace_flush_vcpu(vc);
}

static int read_full(int fd, void *buf, size_t len, off_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* the file shrank under us */
		p += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

/* Two passes over the records: count per vCPU, then fill. */
static int scan(struct synth_guest *g, int fd, uint64_t nrec, bool fill, uint64_t *count)
{
	enum { CHUNK = 4096 };
	uint8_t *buf = malloc((size_t)CHUNK * SYNTH_TRACE_REC);
	uint64_t done = 0;
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	while (done < nrec) {
		uint64_t n = nrec - done < CHUNK ? nrec - done : CHUNK;

		ret = read_full(fd, buf, n * SYNTH_TRACE_REC,
				(off_t)(SYNTH_TRACE_HDR + done * SYNTH_TRACE_REC));
		if (ret)
			break;
		for (uint64_t i = 0; i < n; i++) {
			const uint8_t *r = buf + i * SYNTH_TRACE_REC;
			uint32_t v = halite_get_le32(r + 8), f = halite_get_le32(r + 12);
			struct synth_vcpu *vc;

			if (v >= g->nvcpus || (f & ~SYNTH_TRACE_WRITE)) {
				synth_err(g, "trace %s: record %llu: %s", g->o.trace_in,
					  (unsigned long long)(done + i),
					  v >= g->nvcpus ? "vCPU beyond the guest's" :
							   "reserved flag bits set");
				ret = -EINVAL;
				goto out;
			}
			if (!fill) {
				count[v]++;
				continue;
			}
			vc = &g->vcpu[v];
			vc->rep_va[vc->rep_n] = halite_get_le64(r);
			vc->rep_wr[vc->rep_n] = f & SYNTH_TRACE_WRITE;
			vc->rep_n++;
		}
		done += n;
	}
out:
	free(buf);
	return ret;
}

int synth_trace_load(struct synth_guest *g)
{
	uint64_t count[SYNTH_MAX_VCPUS] = { 0 }, nrec;
	uint8_t h[SYNTH_TRACE_HDR];
	struct stat st;
	int fd, ret;

	fd = open(g->o.trace_in, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		synth_err(g, "cannot open trace %s: %s", g->o.trace_in, strerror(errno));
		return ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	ret = -EINVAL;
	if ((uint64_t)st.st_size < SYNTH_TRACE_HDR ||
	    ((uint64_t)st.st_size - SYNTH_TRACE_HDR) % SYNTH_TRACE_REC) {
		synth_err(g, "trace %s: size %lld is not a header plus whole records",
			  g->o.trace_in, (long long)st.st_size);
		goto out;
	}
	ret = read_full(fd, h, sizeof(h), 0);
	if (ret)
		goto out;
	ret = -EINVAL;
	if (memcmp(h, SYNTH_TRACE_MAGIC, 8) || halite_get_le32(h + 8) != 1 ||
	    halite_get_le32(h + 12) != SYNTH_TRACE_REC || halite_get_le32(h + 20) ||
	    halite_get_le64(h + 24)) {
		synth_err(g, "trace %s: not a version 1 trace", g->o.trace_in);
		goto out;
	}
	if (halite_get_le32(h + 16) > g->nvcpus) {
		synth_err(g, "trace %s: recorded with %u vCPUs, the guest has %u", g->o.trace_in,
			  halite_get_le32(h + 16), g->nvcpus);
		goto out;
	}
	nrec = ((uint64_t)st.st_size - SYNTH_TRACE_HDR) / SYNTH_TRACE_REC;
	ret = scan(g, fd, nrec, false, count);
	if (ret)
		goto out;
	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		/* At least one element: malloc(0) may return NULL. */
		vc->rep_va = malloc((count[v] + 1) * sizeof(uint64_t));
		vc->rep_wr = malloc(count[v] + 1);
		if (!vc->rep_va || !vc->rep_wr) {
			ret = -ENOMEM;
			goto out;
		}
	}
	ret = scan(g, fd, nrec, true, NULL);
out:
	close(fd);
	return ret;
}
