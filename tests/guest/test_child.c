// SPDX-License-Identifier: MIT
/*
 * Child mode: the guest in a forked child, driven across the process
 * boundary (start, pause, copy, resume, stop), and the mechanism an engine
 * working from outside will use, end to end: a userfaultfd created in the
 * child, UFFDIO_API and UFFDIO_REGISTER (minor faults, shared memory) done
 * here on the child's address after the child dropped its page-table entries
 * with MADV_DONTNEED; the child's vCPU accesses then fault to us with the
 * vCPU's thread id, and we map each page back with UFFDIO_CONTINUE. The pages
 * that faulted must be exactly the ones the vCPUs touched first (their logs,
 * page-table pages included), each once.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gtest.h"
#include "uffd.h" /* the project's one uffd compat header */

static bool pagemap_present(int fd, uint64_t addr)
{
	uint64_t e = 0;

	CHECK_EQ(pread(fd, &e, 8, (off_t)(addr / 4096 * 8)), 8);
	return e & (3ull << 62);
}

static void anon_child(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = 2, .map_bytes = 2 << 20,
		   .write_pct = 50, .untouched_pct = 30, .flags = SYNTH_F_CHILD, .seed = seed,
		   .log_fn = capture_log);
	struct synth_guest *g;
	struct synth_info info;
	struct synth_vcpu_info vi[2];
	struct synth_vcpu_stats s1[2], s2[2], s3[2];
	uint8_t *m0, *m1, *m2, *kinds;
	uint64_t pages, gpa[64], va[64], pa;
	char path[64];
	int pm;

	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	CHECK(info.owner_pid != getpid() && info.owner_pid > 0);
	CHECK(info.host_addr && !info.local_addr);
	CHECK_EQ(info.memfd, -1);
	pages = info.mem_bytes / 4096;
	for (unsigned v = 0; v < 2; v++) {
		CHECK_OK(synth_vcpu_info(g, v, &vi[v]));
		snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)info.owner_pid, (int)vi[v].tid);
		CHECK_OK(access(path, F_OK) ? -errno : 0);
	}
	CHECK(vi[0].tid != vi[1].tid);
	m0 = xmalloc(info.mem_bytes);
	m1 = xmalloc(info.mem_bytes);
	m2 = xmalloc(info.mem_bytes);
	kinds = xmalloc(pages);
	CHECK_EQ(synth_frame_kinds(g, 0, kinds, pages), pages);

	/* The copy through process_vm_readv leaves untouched pages unpopulated. */
	CHECK_OK(synth_copy_memory(g, m0));
	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)info.owner_pid);
	pm = open(path, O_RDONLY);
	CHECK(pm >= 0);
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t addr = (uint64_t)(uintptr_t)info.host_addr + p * 4096;

		CHECK_EQ(pagemap_present(pm, addr), kinds[p] != SYNTH_FRAME_UNTOUCHED);
		if (kinds[p] == SYNTH_FRAME_UNTOUCHED)
			CHECK(m0[p * 4096] == 0 && !memcmp(m0 + p * 4096, m0 + p * 4096 + 1, 4095));
	}
	close(pm);
	/* The child's tables decode here, against the builder's record. */
	CHECK_EQ(synth_vcpu_pages(g, 1, 100, va, gpa, 64), 64);
	for (int i = 0; i < 64; i++) {
		CHECK_OK(tw_translate(m0, info.mem_bytes, vi[1].cr3, 4, va[i], &pa, NULL) ? -EFAULT : 0);
		CHECK_EQ(pa, gpa[i]);
	}

	CHECK_OK(synth_start(g));
	CHECK_EQ(synth_copy_memory(g, m1), -EBUSY);
	wait_progress(g, 2, NULL);
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < 2; v++)
		CHECK_OK(synth_vcpu_stats(g, v, &s1[v]));
	CHECK_OK(synth_copy_memory(g, m1));
	sleep_ms(100);
	CHECK_OK(synth_copy_memory(g, m2));
	CHECK(!memcmp(m1, m2, info.mem_bytes));
	CHECK(memcmp(m0, m1, info.mem_bytes));
	for (unsigned v = 0; v < 2; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &s2[v]));
		CHECK(s1[v].accesses > 0);
		CHECK_EQ(s2[v].accesses, s1[v].accesses);
	}
	CHECK_OK(synth_resume(g));
	wait_progress(g, 2, (uint64_t[]){ s2[0].accesses, s2[1].accesses });
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < 2; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &s3[v]));
		CHECK(s3[v].accesses > s2[v].accesses);
	}
	CHECK_OK(synth_copy_memory(g, m2));
	CHECK(memcmp(m1, m2, info.mem_bytes));
	/* Writes went to mapped data pages only. */
	for (uint64_t p = 0; p < pages; p++)
		if (memcmp(m0 + p * 4096, m2 + p * 4096, 4096))
			CHECK_EQ(kinds[p] & 0x7f, SYNTH_FRAME_MAPPED);
	CHECK_OK(synth_stop(g));
	CHECK_EQ(synth_resume(g), -ESRCH);
	synth_free(g);
	CHECK(kill(info.owner_pid, 0) && errno == ESRCH);
	fprintf(stderr, "anon child %d: %" PRIu64 " + %" PRIu64 " accesses, reaped\n",
		(int)info.owner_pid, s3[0].accesses, s3[1].accesses);
	free(m0);
	free(m1);
	free(m2);
	free(kinds);
}

static void child_create_fails(void)
{
	/* Fails in the child's builder, not in the parent's option checks. */
	SYNTH_OPTS(o, .mem_bytes = 8 << 20, .nvcpus = 1, .ws_bytes = 8 << 20,
		   .flags = SYNTH_F_CHILD, .log_fn = capture_log);
	struct synth_guest *g;

	CHECK_EQ(synth_create(&g, &o), -EINVAL);
}

/* --- the userfaultfd from the child --- */

struct handler {
	int uffd;
	uint64_t base, len;
	pid_t tids[SYNTH_MAX_VCPUS];
	unsigned ntids;
	int stop;
	uint32_t *faulted;	/* per page */
	uint64_t faults, eexist, bad_tid, bad_flags, bad_addr, errors;
	unsigned tid_seen;
};

static void *handler_main(void *arg)
{
	struct handler *h = arg;

	while (!__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd = { .fd = h->uffd, .events = POLLIN };
		struct uffd_msg msg[16];
		ssize_t n;

		if (poll(&pfd, 1, 10) <= 0)
			continue;
		n = read(h->uffd, msg, sizeof(msg));
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				h->errors++;
			continue;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++) {
			uint64_t addr = msg[i].arg.pagefault.address & ~4095ull;
			struct uffdio_continue c = { .range = { .start = addr, .len = 4096 } };
			unsigned t;

			if (msg[i].event != UFFD_EVENT_PAGEFAULT) {
				h->errors++;
				continue;
			}
			if (!(msg[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR))
				h->bad_flags++;
			for (t = 0; t < h->ntids; t++)
				if ((pid_t)msg[i].arg.pagefault.feat.ptid == h->tids[t])
					break;
			if (t == h->ntids)
				h->bad_tid++;
			else
				h->tid_seen |= 1u << t;
			if (addr < h->base || addr >= h->base + h->len) {
				h->bad_addr++;
				continue;
			}
			h->faults++;
			h->faulted[(addr - h->base) / 4096]++;
			if (ioctl(h->uffd, UFFDIO_CONTINUE, &c)) {
				/* Someone mapped it first: a normal race; the faulter must still wake. */
				if (errno == EEXIST) {
					struct uffdio_range r = { .start = addr, .len = 4096 };

					h->eexist++;
					ioctl(h->uffd, UFFDIO_WAKE, &r);
				} else {
					h->errors++;
				}
			}
		}
	}
	return NULL;
}

static void start_handler(struct handler *h, pthread_t *th)
{
	__atomic_store_n(&h->stop, 0, __ATOMIC_RELEASE);
	CHECK_EQ(pthread_create(th, NULL, handler_main, h), 0);
}

static void stop_handler(struct handler *h, pthread_t th)
{
	__atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
}

/* The kernel's features, probed on a scratch descriptor: 77 if lacking. */
static void probe_or_skip(uint64_t need)
{
	struct uffdio_api api = { .api = UFFD_API };
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		fprintf(stderr, "SKIP: userfaultfd: %s\n", strerror(errno));
		exit(77);
	}
	if (ioctl(fd, UFFDIO_API, &api) || (api.features & need) != need) {
		fprintf(stderr, "SKIP: kernel lacks uffd features 0x%llx\n",
			(unsigned long long)(need & ~api.features));
		exit(77);
	}
	close(fd);
}

static void uffd_from_child(uint64_t seed)
{
	enum { WS_UNITS = 64 };
	SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = 2, .map_bytes = 512 << 10,
		   .ws_bytes = WS_UNITS * 4096, .write_pct = 50, .backing = SYNTH_MEM_SHARED,
		   .log_mode = SYNTH_LOG_FIRST, .log_entries = 4096,
		   .flags = SYNTH_F_CHILD | SYNTH_F_LOG_WALK, .seed = seed, .log_fn = capture_log);
	uint64_t need = UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_MINOR_SHMEM;
	struct uffdio_api api = { .api = UFFD_API, .features = need };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MINOR };
	struct handler h = { 0 };
	struct synth_guest *g;
	struct synth_info info;
	uint64_t pages, first_touch = 0, faulted_pages = 0, faults_before, *log;
	uint8_t *m0, *m1, *touched;
	pthread_t th;
	int uffd;

	probe_or_skip(need);
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	CHECK(info.memfd >= 0 && info.local_addr);
	pages = info.mem_bytes / 4096;
	m0 = xmalloc(info.mem_bytes);
	m1 = xmalloc(info.mem_bytes);
	touched = calloc(pages, 1);
	log = xmalloc(4096 * 8);
	/* Through the memfd: neither faults nor populates anything in the child. */
	CHECK_OK(synth_copy_memory(g, m0));
	CHECK(!memcmp(m0, info.local_addr, info.mem_bytes));

	uffd = synth_get_uffd(g);
	if (uffd == -EPERM || uffd == -ENOSYS) {
		fprintf(stderr, "SKIP: userfaultfd in the child: %s\n", strerror(-uffd));
		exit(77);
	}
	CHECK_OK(uffd);
	CHECK_EQ(fcntl(uffd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
	CHECK(fcntl(uffd, F_GETFL) & O_NONBLOCK);
	/* The handshake is ours, not the child's. */
	CHECK_OK(ioctl(uffd, UFFDIO_API, &api) ? -errno : 0);
	CHECK_EQ(api.features & need, need);

	/* Drop the child's PTEs (the data stays in the memfd), then arm. */
	CHECK_OK(synth_madvise_dontneed(g, 0, info.mem_bytes));
	reg.range.start = (uint64_t)(uintptr_t)info.host_addr;
	reg.range.len = info.mem_bytes;
	CHECK_OK(ioctl(uffd, UFFDIO_REGISTER, &reg) ? -errno : 0);
	CHECK(reg.ioctls & (1ull << _UFFDIO_CONTINUE));

	h.uffd = uffd;
	h.base = reg.range.start;
	h.len = info.mem_bytes;
	h.ntids = info.nvcpus;
	h.faulted = calloc(pages, sizeof(uint32_t));
	for (unsigned v = 0; v < info.nvcpus; v++) {
		struct synth_vcpu_info vi;

		CHECK_OK(synth_vcpu_info(g, v, &vi));
		h.tids[v] = vi.tid;
	}
	start_handler(&h, &th);
	CHECK_OK(synth_start(g));
	/* Three laps over each working set, every first touch a fault. */
	for (uint64_t dl = now_ms() + 20000;;) {
		struct synth_vcpu_stats st[2];

		CHECK_OK(synth_vcpu_stats(g, 0, &st[0]));
		CHECK_OK(synth_vcpu_stats(g, 1, &st[1]));
		if (st[0].accesses >= 3 * WS_UNITS && st[1].accesses >= 3 * WS_UNITS)
			break;
		CHECK(now_ms() < dl);
		sleep_ms(2);
	}
	/* Pause while the handler still serves: a vCPU may be inside a fault. */
	CHECK_OK(synth_pause(g));
	stop_handler(&h, th);

	CHECK_EQ(h.errors, 0);
	CHECK_EQ(h.bad_tid, 0);
	CHECK_EQ(h.bad_flags, 0);
	CHECK_EQ(h.bad_addr, 0);
	CHECK_EQ(h.tid_seen, (1u << info.nvcpus) - 1);
	for (unsigned v = 0; v < info.nvcpus; v++) {
		int n = synth_log_read(g, v, 0, log, 4096);

		CHECK_OK(n);
		for (int i = 0; i < n; i++) {
			CHECK(!touched[SYNTH_LOG_PFN(log[i])]);
			touched[SYNTH_LOG_PFN(log[i])] = 1;
			first_touch++;
		}
	}
	for (uint64_t p = 0; p < pages; p++) {
		CHECK_EQ(!!h.faulted[p], touched[p]);
		/* Private address spaces share no page: one fault each. */
		CHECK(h.faulted[p] <= 1);
		faulted_pages += !!h.faulted[p];
	}
	CHECK_EQ(h.eexist, 0);
	/* Per vCPU: PML4, PDPT, PD, PT and 64 data pages. */
	CHECK_EQ(first_touch, info.nvcpus * (4 + WS_UNITS));
	CHECK_EQ(faulted_pages, first_touch);
	faults_before = h.faults;

	/* Everything it uses is mapped again: running on faults no more. */
	start_handler(&h, &th);
	CHECK_OK(synth_resume(g));
	sleep_ms(50);
	CHECK_OK(synth_pause(g));
	stop_handler(&h, th);
	CHECK_EQ(h.faults, faults_before);

	CHECK_OK(synth_copy_memory(g, m1));
	for (uint64_t p = 0; p < pages; p++)
		if (memcmp(m0 + p * 4096, m1 + p * 4096, 4096))
			CHECK(touched[p]);
	CHECK(memcmp(m0, m1, info.mem_bytes));
	fprintf(stderr, "uffd from child %d: %" PRIu64 " minor faults from both vCPU tids, "
		"each first-touched page once, resolved with UFFDIO_CONTINUE\n",
		(int)info.owner_pid, h.faults);

	CHECK_OK(synth_stop(g));
	close(uffd);
	synth_free(g);
	free(h.faulted);
	free(m0);
	free(m1);
	free(touched);
	free(log);
}

int main(void)
{
	uint64_t seed = t_seed("guest_child");

	/* Children fork before this process starts any thread (ThreadSanitizer). */
	anon_child(seed);
	child_create_fails();
	uffd_from_child(seed);
	return 0;
}
