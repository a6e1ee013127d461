// SPDX-License-Identifier: MIT
/*
 * Access traces as a benchmark's workload: checked and sized before a guest
 * is made from them, so a trace that cannot be replayed is refused with the
 * reason (the guest's own loader, testing/synth/trace.c, only says -EINVAL). The
 * file is input: nothing in it is used before being checked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "endian_util.h"
#include "trace_file.h"

#define CHUNK 4096u

/* Open, check the header and the size: records in *nrec, header nvcpus in *nv. */
static int open_trace(const char *path, uint64_t *nrec, unsigned *nv, char *err, size_t errlen)
{
	uint8_t h[SYNTH_TRACE_HDR];
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret;

	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot open the trace %s: %s", path, strerror(errno));
		return ret;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < SYNTH_TRACE_HDR ||
	    ((uint64_t)st.st_size - SYNTH_TRACE_HDR) % SYNTH_TRACE_REC) {
		snprintf(err, errlen, "the trace %s is not a regular file of a 32-byte header and "
			 "16-byte records (size %lld)", path, (long long)st.st_size);
		goto bad;
	}
	if (bench_pread_full(fd, h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    memcmp(h, SYNTH_TRACE_MAGIC, 8)) {
		snprintf(err, errlen, "%s is not an access trace (no HSYNTRC1 magic)", path);
		goto bad;
	}
	if (halite_get_le32(h + 8) != 1 || halite_get_le32(h + 12) != SYNTH_TRACE_REC) {
		snprintf(err, errlen, "the trace %s is version %u with %u-byte records; this build "
			 "reads version 1 with 16-byte records", path, halite_get_le32(h + 8),
			 halite_get_le32(h + 12));
		goto bad;
	}
	if (halite_get_le32(h + 20) || halite_get_le64(h + 24)) {
		snprintf(err, errlen, "the trace %s has reserved header bytes 20..31 set", path);
		goto bad;
	}
	*nv = halite_get_le32(h + 16);
	if (*nv < 1 || *nv > SYNTH_MAX_VCPUS) {
		snprintf(err, errlen, "the trace %s is for %u vCPUs; 1 to %u can be replayed", path,
			 *nv, SYNTH_MAX_VCPUS);
		goto bad;
	}
	*nrec = ((uint64_t)st.st_size - SYNTH_TRACE_HDR) / SYNTH_TRACE_REC;
	return fd;
bad:
	close(fd);
	return -EINVAL;
}

/* Both passes: with @fn, call it per record; without, check and size into *ti. */
static int walk(const char *path, struct trace_info *ti, trace_fn fn, void *ctx, char *err,
		size_t errlen)
{
	uint8_t *buf = malloc((size_t)CHUNK * SYNTH_TRACE_REC);
	uint64_t nrec = 0, seen[SYNTH_MAX_VCPUS] = { 0 };
	unsigned nv = 0;
	int fd, ret = 0;

	if (!buf)
		return -ENOMEM;
	fd = open_trace(path, &nrec, &nv, err, errlen);
	if (fd < 0) {
		free(buf);
		return fd;
	}
	for (uint64_t done = 0; done < nrec && !ret;) {
		uint64_t n = nrec - done < CHUNK ? nrec - done : CHUNK;

		if (bench_pread_full(fd, buf, n * SYNTH_TRACE_REC,
				     SYNTH_TRACE_HDR + done * SYNTH_TRACE_REC) !=
		    (ssize_t)(n * SYNTH_TRACE_REC)) {
			snprintf(err, errlen, "reading the trace %s failed", path);
			ret = -EIO;
			break;
		}
		for (uint64_t i = 0; i < n; i++, done++) {
			const uint8_t *r = buf + i * SYNTH_TRACE_REC;
			uint64_t va = halite_get_le64(r), lo;
			uint32_t v = halite_get_le32(r + 8), f = halite_get_le32(r + 12);

			if (v >= nv || (f & ~SYNTH_TRACE_WRITE)) {
				snprintf(err, errlen, "the trace %s: record %" PRIu64 " has %s", path,
					 done, v >= nv ? "a vCPU beyond the header's count" :
							 "reserved flag bits set");
				ret = -EINVAL;
				break;
			}
			lo = TRACE_VBASE + (uint64_t)v * TRACE_VSPAN;
			if (va < lo || va - lo >= TRACE_VSPAN) {
				snprintf(err, errlen, "the trace %s does not fit: record %" PRIu64
					 " of vCPU %u is at 0x%" PRIx64 ", outside its window "
					 "[0x%" PRIx64 ", 0x%" PRIx64 ")", path, done, v, va, lo,
					 lo + TRACE_VSPAN);
				ret = -EINVAL;
				break;
			}
			if (fn) {
				fn(ctx, v, seen[v]++, (va - lo) / SYNTH_PAGE_SIZE,
				   (unsigned)((va % SYNTH_PAGE_SIZE) / 8), f & SYNTH_TRACE_WRITE);
				continue;
			}
			ti->nrec[v]++;
			ti->writes[v] += f & SYNTH_TRACE_WRITE;
			if ((va - lo) / SYNTH_PAGE_SIZE + 1 > ti->map_units[v])
				ti->map_units[v] = (va - lo) / SYNTH_PAGE_SIZE + 1;
		}
	}
	close(fd);
	free(buf);
	if (ret || fn)
		return ret;
	ti->nvcpus = nv;
	ti->records = nrec;
	for (unsigned v = 0; v < nv; v++) {
		/* Save at the midpoint, restore for the rest: both halves need a record. */
		if (ti->nrec[v] < 2) {
			snprintf(err, errlen, "the trace %s does not fit: vCPU %u has %" PRIu64
				 " records, at least 2 are needed (one before the snapshot, one "
				 "after)", path, v, ti->nrec[v]);
			return -EINVAL;
		}
		if (ti->map_units[v] * SYNTH_PAGE_SIZE > ti->map_bytes)
			ti->map_bytes = ti->map_units[v] * SYNTH_PAGE_SIZE;
	}
	return 0;
}

#define MIB ((uint64_t)1 << 20)
/* The largest guest a trace is given; more does not fit the benchmarks' machine. */
#define TRACE_MAX_MEM ((uint64_t)8 << 30)

int trace_guest_mem(const struct trace_info *ti, const char *path, uint64_t mem_mib,
		    uint64_t *mem_bytes, char *err, size_t errlen)
{
	uint64_t mapped = ti->map_bytes * ti->nvcpus, mem;

	mem = mem_mib ? mem_mib * MIB : (4 * mapped + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
	if (mem < 16 * MIB)
		mem = 16 * MIB;
	if (!mem_mib && mem > TRACE_MAX_MEM) {
		snprintf(err, errlen, "the trace %s does not fit: %u vCPUs x %" PRIu64 " MiB mapped "
			 "need a %" PRIu64 " MiB guest, more than %" PRIu64 " MiB", path,
			 ti->nvcpus, ti->map_bytes / MIB, mem / MIB, TRACE_MAX_MEM / MIB);
		return -EINVAL;
	}
	if (mapped > mem / 2) {
		snprintf(err, errlen, "the trace %s does not fit in %" PRIu64 " MiB: %u vCPUs x "
			 "%" PRIu64 " KiB mapped need at least %" PRIu64 " MiB", path, mem_mib,
			 ti->nvcpus, ti->map_bytes >> 10, (2 * mapped + MIB - 1) / MIB);
		return -EINVAL;
	}
	*mem_bytes = mem;
	return 0;
}

int trace_file_readonly(const char *src, const char *dst)
{
	uint8_t *buf = malloc((size_t)CHUNK * SYNTH_TRACE_REC);
	int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, ret = 0;
	uint64_t off = 0;

	if (!buf || in < 0) {
		ret = !buf ? -ENOMEM : -errno;
		goto out;
	}
	out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		ret = -errno;
		goto out;
	}
	for (;;) {
		ssize_t n = bench_pread_full(in, buf, (size_t)CHUNK * SYNTH_TRACE_REC, off);

		if (n <= 0) {
			ret = (int)n;
			break;
		}
		/* Records start at 32 and are 16 bytes: chunks from 0 keep them aligned. */
		for (ssize_t i = off ? 0 : SYNTH_TRACE_HDR; i + (ssize_t)SYNTH_TRACE_REC <= n;
		     i += SYNTH_TRACE_REC)
			halite_put_le32(buf + i + 12, 0);
		if (pwrite(out, buf, (size_t)n, (off_t)off) != n) {
			ret = -EIO;
			break;
		}
		off += (uint64_t)n;
	}
out:
	if (out >= 0 && close(out) && !ret)
		ret = -EIO;
	if (in >= 0)
		close(in);
	free(buf);
	return ret;
}

int trace_file_scan(const char *path, struct trace_info *ti, char *err, size_t errlen)
{
	*ti = (struct trace_info){ 0 };
	return walk(path, ti, NULL, NULL, err, errlen);
}

int trace_file_each(const char *path, trace_fn fn, void *ctx)
{
	char err[256];

	return walk(path, NULL, fn, ctx, err, sizeof(err));
}
