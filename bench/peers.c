/* SPDX-License-Identifier: MIT */
/*
 * The restore methods halite-bench compares (peers.h).
 *
 * Read latency is applied as the engine applies it (halite/src/io.c): a read
 * request completes no earlier than read_latency_us after it was issued; the
 * thread that issued it sleeps out the rest. A cold read on a fast disk thus
 * costs max(device time, latency), not their sum, in every method alike.
 *
 * Counts, per method (method_result):
 * - halite: the engine's own statistics. storage_reads = LBs read for faults
 *   + LBs prefetched + re-reads (lb_demand + lb_prefetch + lb_retries),
 *   bytes_read = the engine's bytes_read, demand_faults = missing-page faults
 *   it handled, vm_access_pct = the engine's (TRACK_ACCESS only).
 * - eager: one request per read of at most EAGER_READ bytes of the raw
 *   image's data extents (SEEK_DATA/SEEK_HOLE: a hole is not storage, it is
 *   never read and stays zero in memory); demand_faults = 0.
 * - 4k-on-demand: one 4 KiB pread per fault on a page not yet installed
 *   (holes and zero pages of the raw image included: the handler does not
 *   know them, it reads); demand_faults = fault messages handled (a second
 *   message for a page already installed is woken without a read).
 * - working-set: the working-set file's reads (at most WS_READ bytes each)
 *   plus the 4 KiB reads of the faults served afterwards, as 4k-on-demand.
 * - mmap-private: the kernel reads. demand_faults = this process's major
 *   faults between method_start() and method_finish() (getrusage; the
 *   guest's vCPU threads are the only ones faulting on file memory during
 *   the run, so they are the mapping's). bytes_read = pages of the file
 *   that entered its page cache during the run (mincore() of a separate
 *   read-only shared mapping of the file, before and after), readahead
 *   included. Cold or with latency the file is served by delayfs and
 *   storage_reads = the read requests delayfs answered (exact, readahead
 *   included; each paid the latency). Warm without latency the file is
 *   mapped directly and in the page cache already: storage_reads = the major
 *   faults, which is 0 when the whole file is cached (the kernel's
 *   asynchronous readahead requests would not be counted, but there are
 *   none to make).
 *
 * done_s: halite when the engine finished; eager when start returned; the
 * others never bring in everything by themselves (-1). After method_finish()
 * of 4k-on-demand and working-set, pages the guest never touched were never
 * restored and read as zeros: compare memory before finishing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/log.h>
#include <halite/restore.h>

#include "bench_util.h"
#include "delayfs.h"
#include "peers.h"
#include "stats.h"
#include "uffd.h"

#define PAGE 4096u
#define EAGER_READ (1u << 20) /* QEMU's mapped-ram restore reads in chunks of this order */
#define WS_READ (1u << 20)
#define ALIGN_DOWN(x, a) ((x) & ~((uint64_t)(a) - 1))
#define ALIGN_UP(x, a) ALIGN_DOWN((x) + (a) - 1, a)

struct method {
	struct method_cfg cfg; /* strings point at our copies; vcpu_tids at the caller's */
	uint8_t *mem;
	uint64_t len;
	uint64_t t0;	       /* method_start() entered */
	double start_s, done_s;
	bool started;

	/* halite */
	struct halite_restore *r;

	/* eager, 4k-on-demand, working-set: the raw image */
	int raw_fd;

	/* 4k-on-demand, working-set */
	int uffd, stop_fd;
	bool registered, thread_on;
	pthread_t thread;
	uint8_t *installed;   /* one byte per page; the handler thread's after start */
	void *page;	      /* aligned bounce page for O_DIRECT */
	uint64_t faults, reads, bytes; /* handler thread's (read after join), plus the WS load */
	uint64_t fault_reads;	       /* of reads, the handler thread's */
	int thread_err;

	/* mmap-private */
	struct delayfs *dfs;
	void *file_map;	      /* PROT_READ, MAP_SHARED: page cache residency only */
	uint64_t file_pages;
	uint64_t resident0, dfs_req0, dfs_bytes0;
	long majflt0;
};

static void lat_wait(uint64_t t_issue_ns, uint32_t us)
{
	uint64_t due = t_issue_ns + (uint64_t)us * 1000u;
	struct timespec ts = { (time_t)(due / 1000000000u), (long)(due % 1000000000u) };

	if (!us)
		return;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int open_data(const char *path, bool direct, int *fd)
{
	int f = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));

	if (f < 0) {
		int err = errno;

		fprintf(stderr, "peers: open %s%s: %s\n", path, direct ? " (O_DIRECT)" : "",
			strerror(err));
		return -err;
	}
	*fd = f;
	return 0;
}

static char *dup_or_null(const char *s, bool *fail)
{
	char *d;

	if (!s)
		return NULL;
	d = strdup(s);
	if (!d)
		*fail = true;
	return d;
}

const char *method_name(int kind)
{
	switch (kind) {
	case METHOD_HALITE:
		return "halite";
	case METHOD_EAGER:
		return "eager";
	case METHOD_4K:
		return "4k-on-demand";
	case METHOD_MMAP:
		return "mmap-private";
	case METHOD_WS:
		return "working-set";
	}
	return "?";
}

/* --- userfaultfd: 4k-on-demand and the rest of working-set --- */

static int uffd_copy_page(struct method *m, uint64_t idx, const void *src)
{
	struct uffdio_copy c = { .dst = (uintptr_t)(m->mem + idx * PAGE), .src = (uintptr_t)src,
				 .len = PAGE, .mode = 0 };

	for (;;) {
		c.copy = 0;
		if (!ioctl(m->uffd, UFFDIO_COPY, &c))
			break;
		if (errno == EAGAIN) /* the mapping changed under the copy: again */
			continue;
		if (errno == EEXIST) {
			/*
			 * Already there: the faulting thread may still be
			 * waiting, and a failed copy wakes nobody.
			 */
			struct uffdio_range w = { c.dst, PAGE };

			if (ioctl(m->uffd, UFFDIO_WAKE, &w))
				return -errno;
			break;
		}
		return -errno;
	}
	m->installed[idx] = 1;
	return 0;
}

/* One fault: read the page from the raw image (one request) and install it. */
static int serve_fault(struct method *m, uint64_t addr)
{
	uint64_t idx = (addr - (uintptr_t)m->mem) / PAGE, t;
	ssize_t n;

	m->faults++;
	if (idx >= m->len / PAGE)
		return -EFAULT;
	if (m->installed[idx]) {
		struct uffdio_range w = { (uintptr_t)(m->mem + idx * PAGE), PAGE };

		return ioctl(m->uffd, UFFDIO_WAKE, &w) ? -errno : 0;
	}
	t = halite_now_ns();
	n = bench_pread_full(m->raw_fd, m->page, PAGE, idx * PAGE);
	m->reads++;
	m->fault_reads++;
	if (n < 0)
		return (int)n;
	m->bytes += (uint64_t)n;
	if ((size_t)n < PAGE) /* past the image's end: zeros */
		memset((char *)m->page + n, 0, PAGE - (size_t)n);
	lat_wait(t, m->cfg.read_latency_us);
	return uffd_copy_page(m, idx, m->page);
}

static void *fault_thread(void *arg)
{
	struct method *m = arg;
	struct uffd_msg msgs[16];

	for (;;) {
		struct pollfd p[2] = { { m->uffd, POLLIN, 0 }, { m->stop_fd, POLLIN, 0 } };
		ssize_t n;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			m->thread_err = -errno;
			break;
		}
		if (p[1].revents)
			break;
		n = read(m->uffd, msgs, sizeof(msgs));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			m->thread_err = -errno;
			break;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msgs[0]); i++) {
			int ret;

			if (msgs[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			ret = serve_fault(m, ALIGN_DOWN(msgs[i].arg.pagefault.address, PAGE));
			if (ret && !m->thread_err) {
				/*
				 * The faulting thread stays blocked: there is
				 * nothing better to give it. Say so once.
				 */
				m->thread_err = ret;
				fprintf(stderr, "peers: %s: fault at %#llx: %s\n",
					method_name(m->cfg.kind),
					(unsigned long long)msgs[i].arg.pagefault.address,
					strerror(-ret));
			}
		}
	}
	return NULL;
}

static int uffd_register(struct method *m)
{
	struct uffdio_register reg = { .range = { (uintptr_t)m->mem, m->len },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	int fd = halite_uffd_open(0, NULL);

	if (fd < 0) {
		fprintf(stderr, "peers: userfaultfd: %s\n", halite_strerror(fd));
		return fd;
	}
	m->uffd = fd;
	if (ioctl(fd, UFFDIO_REGISTER, &reg)) {
		int err = errno;

		fprintf(stderr, "peers: UFFDIO_REGISTER: %s\n", strerror(err));
		return -err;
	}
	m->registered = true;
	if (!(reg.ioctls & (1ull << _UFFDIO_COPY))) {
		fprintf(stderr, "peers: UFFDIO_COPY not offered on this memory\n");
		return -HALITE_E_UNSUPPORTED;
	}
	m->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (m->stop_fd < 0)
		return -errno;
	return 0;
}

static int uffd_start_thread(struct method *m)
{
	int ret = pthread_create(&m->thread, NULL, fault_thread, m);

	if (ret) {
		fprintf(stderr, "peers: fault thread: %s\n", strerror(ret));
		return -ret;
	}
	m->thread_on = true;
	return 0;
}

static void uffd_stop(struct method *m)
{
	if (m->thread_on) {
		uint64_t one = 1;

		if (write(m->stop_fd, &one, sizeof(one)) != sizeof(one))
			abort(); /* an eventfd write of 1 cannot fail */
		pthread_join(m->thread, NULL);
		m->thread_on = false;
	}
	if (m->registered) {
		/* Wakes any thread still waiting: it then gets a zero page. */
		struct uffdio_range r = { (uintptr_t)m->mem, m->len };

		if (ioctl(m->uffd, UFFDIO_UNREGISTER, &r))
			fprintf(stderr, "peers: UFFDIO_UNREGISTER: %s\n", strerror(errno));
		m->registered = false;
	}
}

/*
 * Working set: records of WS_REC bytes (peers.h) read WS_READ bytes at a
 * time (file offsets aligned for O_DIRECT); a record cut by a read's end is
 * carried over into the bytes just before the next read's buffer.
 */
static int ws_load(struct method *m)
{
	const uint64_t carry_room = ALIGN_UP(WS_REC, PAGE);
	uint8_t *buf = NULL, *data;
	uint64_t off = 0, left = 0, t, nrec = 0;
	int fd = -1, ret;

	ret = open_data(m->cfg.ws_path, m->cfg.cold, &fd);
	if (ret)
		return ret;
	ret = posix_memalign((void **)&buf, PAGE, carry_room + WS_READ);
	if (ret) {
		close(fd);
		return -ret;
	}
	data = buf + carry_room;
	for (;;) {
		ssize_t n;
		uint8_t *p;

		t = halite_now_ns();
		n = bench_pread_full(fd, data, WS_READ, off);
		if (n < 0) {
			ret = (int)n;
			fprintf(stderr, "peers: reading %s at %" PRIu64 ": %s\n", m->cfg.ws_path,
				off, strerror(-ret));
			break;
		}
		if (n == 0)
			break;
		m->reads++;
		m->bytes += (uint64_t)n;
		lat_wait(t, m->cfg.read_latency_us);
		off += (uint64_t)n;
		p = data - left;
		left += (uint64_t)n;
		for (; left >= WS_REC; p += WS_REC, left -= WS_REC, nrec++) {
			uint64_t gpa = 0;

			for (int i = 7; i >= 0; i--)
				gpa = gpa << 8 | p[i];
			if (gpa % PAGE || gpa >= m->len) {
				fprintf(stderr, "peers: %s: record %" PRIu64 ": bad address %#" PRIx64
					" (memory is %" PRIu64 " bytes)\n", m->cfg.ws_path, nrec,
					gpa, m->len);
				ret = -EINVAL;
				goto out;
			}
			ret = uffd_copy_page(m, gpa / PAGE, p + 8);
			if (ret) {
				fprintf(stderr, "peers: installing %#" PRIx64 ": %s\n", gpa,
					strerror(-ret));
				goto out;
			}
		}
		memmove(data - left, p, left);
		if ((size_t)n < WS_READ)
			break;
	}
	if (!ret && left) {
		fprintf(stderr, "peers: %s: %" PRIu64 " bytes past the last whole record\n",
			m->cfg.ws_path, left);
		ret = -EINVAL;
	}
out:
	free(buf);
	close(fd);
	return ret;
}

/* --- eager --- */

/* Read the raw image's data extents straight into guest memory. */
static int eager_load(struct method *m)
{
	uint64_t off = 0;
	int fd = m->raw_fd;

	while (off < m->len) {
		off_t d = lseek(fd, (off_t)off, SEEK_DATA), h;
		uint64_t end;

		if (d < 0) {
			if (errno == ENXIO) /* only holes from here */
				break;
			return -errno;
		}
		h = lseek(fd, d, SEEK_HOLE);
		if (h < 0)
			return -errno;
		/* Extents are file-system blocks: page-aligned on ext4 and xfs; be safe. */
		off = ALIGN_DOWN((uint64_t)d, PAGE);
		end = ALIGN_UP((uint64_t)h, PAGE);
		if (end > m->len)
			end = m->len;
		while (off < end) {
			size_t len = end - off < EAGER_READ ? (size_t)(end - off) : EAGER_READ;
			uint64_t t = halite_now_ns();
			ssize_t n = bench_pread_full(fd, m->mem + off, len, off);

			if (n < 0) {
				fprintf(stderr, "peers: reading %s at %" PRIu64 ": %s\n",
					m->cfg.raw_path, off, strerror((int)-n));
				return (int)n;
			}
			m->reads++;
			m->bytes += (uint64_t)n;
			lat_wait(t, m->cfg.read_latency_us);
			if ((size_t)n < len) /* end of file */
				return 0;
			off += len;
		}
	}
	return 0;
}

/* --- mmap-private --- */

static uint64_t resident_pages(const struct method *m)
{
	uint64_t n = 0;
	unsigned char *vec = malloc(m->file_pages ? m->file_pages : 1);

	if (!vec)
		return 0;
	if (m->file_pages && !mincore(m->file_map, m->file_pages * PAGE, vec))
		for (uint64_t i = 0; i < m->file_pages; i++)
			n += vec[i] & 1;
	free(vec);
	return n;
}

static long major_faults(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_majflt;
}

static int mmap_prepare(struct method *m)
{
	const char *path = m->cfg.raw_path;
	struct stat st;
	uint64_t flen;
	void *p;
	int fd, ret;

	if (m->dfs)
		path = delayfs_file(m->dfs);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		fprintf(stderr, "peers: open %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	flen = ALIGN_UP((uint64_t)st.st_size, PAGE);
	if (flen > m->len)
		flen = m->len;
	/*
	 * Past the file's end a file mapping raises SIGBUS: the guest memory
	 * beyond it (an image whose tail is all holes may be short) stays the
	 * anonymous reservation under it, zeros.
	 */
	ret = 0;
	if (flen) {
		p = mmap(m->mem, flen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
		if (p == MAP_FAILED)
			ret = -errno;
		else
			m->file_map = mmap(NULL, flen, PROT_READ, MAP_SHARED, fd, 0);
		if (!ret && m->file_map == MAP_FAILED) {
			ret = -errno;
			m->file_map = NULL;
		}
		if (ret)
			fprintf(stderr, "peers: mmap %s: %s\n", path, strerror(-ret));
	}
	close(fd);
	m->file_pages = flen / PAGE;
	if (!ret)
		m->resident0 = resident_pages(m);
	return ret;
}

/* --- the interface --- */

int method_prepare(struct method **mp, const struct method_cfg *cfg, void **mem)
{
	struct method *m;
	bool fail = false;
	int ret = 0;

	if (!cfg->mem_bytes || cfg->mem_bytes % PAGE || cfg->kind < METHOD_HALITE ||
	    cfg->kind > METHOD_WS) {
		fprintf(stderr, "peers: bad configuration (kind %d, %" PRIu64 " bytes)\n",
			cfg->kind, cfg->mem_bytes);
		return -EINVAL;
	}
	if ((cfg->kind == METHOD_HALITE && (!cfg->hlt_path || !cfg->region)) ||
	    (cfg->kind != METHOD_HALITE && !cfg->raw_path) ||
	    (cfg->kind == METHOD_WS && !cfg->ws_path)) {
		fprintf(stderr, "peers: %s: a file path is missing\n", method_name(cfg->kind));
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->cfg = *cfg;
	m->cfg.hlt_path = dup_or_null(cfg->hlt_path, &fail);
	m->cfg.raw_path = dup_or_null(cfg->raw_path, &fail);
	m->cfg.ws_path = dup_or_null(cfg->ws_path, &fail);
	m->cfg.region = dup_or_null(cfg->region, &fail);
	m->cfg.fuse_dir = dup_or_null(cfg->fuse_dir, &fail);
	m->len = cfg->mem_bytes;
	m->raw_fd = m->uffd = m->stop_fd = -1;
	m->done_s = -1;
	if (fail) {
		ret = -ENOMEM;
		goto fail;
	}

	if (cfg->cold) {
		const char *files[2] = { cfg->kind == METHOD_HALITE ? m->cfg.hlt_path : m->cfg.raw_path,
					 cfg->kind == METHOD_WS ? m->cfg.ws_path : NULL };

		for (int i = 0; i < 2 && files[i] && !ret; i++) {
			ret = bench_drop_cache(files[i]);
			if (ret)
				fprintf(stderr, "peers: dropping the page cache of %s: %s\n",
					files[i], strerror(-ret));
		}
		if (ret)
			goto fail;
	}
	if (cfg->kind == METHOD_MMAP && (cfg->read_latency_us || cfg->cold)) {
		if (!m->cfg.fuse_dir) {
			fprintf(stderr, "peers: mmap-private cold or with read latency needs "
				"fuse_dir\n");
			ret = -EINVAL;
			goto fail;
		}
		ret = delayfs_mount(&m->dfs, m->cfg.fuse_dir, m->cfg.raw_path,
				    cfg->read_latency_us, cfg->cold);
		if (ret)
			goto fail;
	}
	/* (The delaying file system's child process was forked without it.) */
	m->mem = mmap(NULL, m->len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m->mem == MAP_FAILED) {
		ret = -errno;
		m->mem = NULL;
		fprintf(stderr, "peers: mmap %" PRIu64 " bytes: %s\n", m->len, strerror(-ret));
		goto fail;
	}
	if (cfg->kind != METHOD_MMAP)
		/* 4 KiB pages everywhere: userfaultfd installs them, eager must match. */
		madvise(m->mem, m->len, MADV_NOHUGEPAGE);

	switch (cfg->kind) {
	case METHOD_HALITE:
		break;
	case METHOD_EAGER:
		ret = open_data(m->cfg.raw_path, cfg->cold, &m->raw_fd);
		break;
	case METHOD_4K:
	case METHOD_WS:
		ret = open_data(m->cfg.raw_path, cfg->cold, &m->raw_fd);
		if (ret)
			break;
		m->installed = calloc(m->len / PAGE, 1);
		if (!m->installed || posix_memalign(&m->page, PAGE, PAGE)) {
			m->page = NULL;
			ret = -ENOMEM;
		}
		break;
	case METHOD_MMAP:
		ret = mmap_prepare(m);
		break;
	}
	if (ret)
		goto fail;
	*mp = m;
	*mem = m->mem;
	return 0;
fail:
	method_free(m);
	return ret;
}

static int halite_start(struct method *m)
{
	HALITE_OPTS(halite_restore_opts, o);
	struct halite_restore_region reg = { m->cfg.region, (uintptr_t)m->mem, m->len,
					     HALITE_MEM_ANON, -1, 0 };
	int ret;

	o.flags = m->cfg.halite_flags | (m->cfg.cold ? HALITE_RESTORE_DIRECT : 0);
	o.read_latency_us = m->cfg.read_latency_us;
	/* Read now, not at prepare: the guest's threads exist only after it. */
	o.vcpu_tids = m->cfg.vcpu_tids;
	o.nvcpus = m->cfg.vcpu_tids ? m->cfg.nvcpus : 0;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	ret = halite_restore_open(&m->r, m->cfg.hlt_path, &reg, 1, &o);
	if (ret) {
		m->r = NULL;
		fprintf(stderr, "peers: halite_restore_open %s: %s\n", m->cfg.hlt_path,
			halite_strerror(ret));
		return ret;
	}
	ret = halite_restore_start(m->r);
	if (ret)
		fprintf(stderr, "peers: halite_restore_start: %s (%s)\n", halite_strerror(ret),
			halite_restore_errmsg(m->r));
	return ret;
}

int method_start(struct method *m)
{
	int ret = 0;

	if (m->started)
		return -EBUSY;
	m->started = true;
	m->t0 = halite_now_ns();
	switch (m->cfg.kind) {
	case METHOD_HALITE:
		ret = halite_start(m);
		break;
	case METHOD_EAGER:
		ret = eager_load(m);
		if (!ret)
			m->done_s = (double)(halite_now_ns() - m->t0) / 1e9;
		break;
	case METHOD_4K:
		ret = uffd_register(m);
		if (!ret)
			ret = uffd_start_thread(m);
		break;
	case METHOD_WS:
		ret = uffd_register(m);
		if (!ret)
			ret = ws_load(m);
		if (!ret)
			ret = uffd_start_thread(m);
		break;
	case METHOD_MMAP:
		m->majflt0 = major_faults();
		if (m->dfs)
			delayfs_counts(m->dfs, &m->dfs_req0, &m->dfs_bytes0);
		break;
	}
	m->start_s = (double)(halite_now_ns() - m->t0) / 1e9;
	return ret;
}

int method_finish(struct method *m, int timeout_ms, struct method_result *res)
{
	struct method_result o = { .vm_access_pct = -1, .done_s = -1 };
	int ret = 0;

	if (!m->started)
		return -EINVAL;
	o.start_s = m->start_s;
	switch (m->cfg.kind) {
	case METHOD_HALITE: {
		struct halite_restore_stats st;

		if (!m->r)
			return -EINVAL;
		ret = halite_restore_wait(m->r, timeout_ms);
		halite_restore_stats(m->r, &st);
		o.storage_reads = st.lb_demand + st.lb_prefetch + st.lb_retries;
		o.demand_reads = st.lb_demand;
		o.have_engine = true;
		o.engine = st;
		o.bytes_read = st.bytes_read;
		o.demand_faults = st.faults;
		o.vm_access_pct = st.vm_access_pct;
		/* The engine's clock starts inside open, a moment after ours. */
		if (st.done)
			o.done_s = (double)(st.ready_ns + st.duration_ns) / 1e9;
		if (ret && ret != -ETIMEDOUT)
			fprintf(stderr, "peers: halite restore: %s (%s)\n", halite_strerror(ret),
				halite_restore_errmsg(m->r));
		break;
	}
	case METHOD_EAGER:
		o.storage_reads = m->reads;
		o.bytes_read = m->bytes;
		o.done_s = m->done_s;
		break;
	case METHOD_4K:
	case METHOD_WS:
		uffd_stop(m);
		o.storage_reads = m->reads;
		o.demand_reads = m->fault_reads;
		o.bytes_read = m->bytes;
		o.demand_faults = m->faults;
		ret = m->thread_err;
		break;
	case METHOD_MMAP: {
		uint64_t res1 = resident_pages(m);

		o.demand_faults = (uint64_t)(major_faults() - m->majflt0);
		o.bytes_read = (res1 > m->resident0 ? res1 - m->resident0 : 0) * PAGE;
		o.storage_reads = o.demand_faults;
		if (m->dfs) {
			uint64_t req, bytes;

			delayfs_counts(m->dfs, &req, &bytes);
			o.storage_reads = req - m->dfs_req0;
		}
		o.demand_reads = o.storage_reads;
		break;
	}
	}
	*res = o;
	return ret;
}

void method_free(struct method *m)
{
	if (!m)
		return;
	halite_restore_free(m->r);
	uffd_stop(m);
	if (m->uffd >= 0)
		close(m->uffd);
	if (m->stop_fd >= 0)
		close(m->stop_fd);
	if (m->raw_fd >= 0)
		close(m->raw_fd);
	if (m->file_map)
		munmap(m->file_map, m->file_pages * PAGE);
	if (m->mem)
		munmap(m->mem, m->len);
	/* After every mapping of its file is gone, or the unmount would be busy. */
	delayfs_unmount(m->dfs);
	free(m->installed);
	free(m->page);
	free((char *)m->cfg.hlt_path);
	free((char *)m->cfg.raw_path);
	free((char *)m->cfg.ws_path);
	free((char *)m->cfg.region);
	free((char *)m->cfg.fuse_dir);
	free(m);
}
