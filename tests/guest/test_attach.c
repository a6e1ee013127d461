// SPDX-License-Identifier: MIT
/*
 * SYNTH_F_ATTACH: the empty target of a restore. A guest created with the
 * flag leaves its memory unpopulated (mincore, the memfd's blocks, the
 * child's pagemap) yet has exactly the layout of the guest made with the
 * same options without it: info counts, CR3s, units, frame kinds. Filled
 * from outside with the other guest's memory, it is that guest: the same
 * workload on both ends with the same memory and no translation fault. In
 * this process and in a child, anonymous and memfd memory.
 */
#include "gtest.h" /* first: it defines _GNU_SOURCE */

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* Nothing of [addr, addr+len) of @pid is populated (present or swapped). */
static void check_unpopulated(pid_t pid, const void *local, uint64_t addr, uint64_t len,
			      int memfd)
{
	uint64_t pages = len / 4096;

	if (local) {
		unsigned char *vec = xmalloc(pages);

		CHECK_OK(mincore((void *)local, len, vec) ? -errno : 0);
		for (uint64_t p = 0; p < pages; p++)
			if (vec[p] & 1) {
				fprintf(stderr, "page %" PRIu64 " is resident\n", p);
				exit(1);
			}
		free(vec);
	}
	if (memfd >= 0) {
		struct stat st;

		CHECK_OK(fstat(memfd, &st) ? -errno : 0);
		CHECK_EQ(st.st_blocks, 0);
	}
	{
		char path[64];
		uint64_t e;
		int fd;

		snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
		fd = open(path, O_RDONLY);
		CHECK(fd >= 0);
		for (uint64_t p = 0; p < pages; p++) {
			CHECK_EQ(pread(fd, &e, 8, (off_t)((addr / 4096 + p) * 8)), 8);
			if (e & (3ull << 62)) {
				fprintf(stderr, "page %" PRIu64 " is present in %d\n", p, (int)pid);
				exit(1);
			}
		}
		close(fd);
	}
}

/* Write @len bytes of guest memory from outside, as a restore engine would. */
static void fill_from_outside(const struct synth_info *info, const uint8_t *src)
{
	if (info->owner_pid == getpid()) {
		memcpy(info->host_addr, src, info->mem_bytes);
	} else if (info->memfd >= 0) {
		CHECK_EQ(pwrite(info->memfd, src, info->mem_bytes, 0), info->mem_bytes);
	} else {
		for (uint64_t off = 0; off < info->mem_bytes;) {
			struct iovec l = { (void *)(src + off), info->mem_bytes - off };
			struct iovec r = { (uint8_t *)info->host_addr + off, info->mem_bytes - off };
			ssize_t n = process_vm_writev(info->owner_pid, &l, 1, &r, 1, 0);

			CHECK(n > 0);
			off += (uint64_t)n;
		}
	}
}

static void run(unsigned backing, bool child, uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = 2, .map_bytes = 2 << 20,
		   .ws_bytes = 1 << 20, .untouched_pct = 20, .zero_pct = 5, .write_pct = 50,
		   .backing = backing, .seed = seed, .max_accesses = 20000, .hole_every = 7,
		   .log_fn = capture_log);
	struct synth_guest *n, *a;
	struct synth_info in, ia;
	uint64_t pages;
	uint8_t *mn, *ma, *kn, *ka;

	fprintf(stderr, "%s, %s\n", backing == SYNTH_MEM_SHARED ? "memfd" : "anon",
		child ? "child" : "in process");
	if (child)
		o.flags |= SYNTH_F_CHILD;
	CHECK_OK(synth_create(&n, &o));
	o.flags |= SYNTH_F_ATTACH;
	CHECK_OK(synth_create(&a, &o));
	CHECK_OK(synth_info(n, &in));
	CHECK_OK(synth_info(a, &ia));
	pages = in.mem_bytes / 4096;

	/* Empty. */
	check_unpopulated(ia.owner_pid, ia.local_addr, (uint64_t)(uintptr_t)ia.host_addr,
			  ia.mem_bytes, ia.memfd);

	/* The same layout, fact by fact. */
	CHECK_EQ(ia.mem_bytes, in.mem_bytes);
	CHECK_EQ(ia.nvcpus, in.nvcpus);
	CHECK_EQ(ia.small_base_pfn, in.small_base_pfn);
	CHECK_EQ(ia.small_frames, in.small_frames);
	CHECK_EQ(ia.small_used, in.small_used);
	CHECK_EQ(ia.pt_frames, in.pt_frames);
	CHECK_EQ(ia.data_frames, in.data_frames);
	CHECK_EQ(ia.zero_frames, in.zero_frames);
	CHECK_EQ(ia.untouched_frames, in.untouched_frames);
	kn = xmalloc(pages);
	ka = xmalloc(pages);
	CHECK_EQ(synth_frame_kinds(n, 0, kn, pages), pages);
	CHECK_EQ(synth_frame_kinds(a, 0, ka, pages), pages);
	CHECK(!memcmp(kn, ka, pages));
	for (unsigned v = 0; v < in.nvcpus; v++) {
		struct synth_vcpu_info vn, va;
		uint64_t *an, *aa, *gn, *ga;

		CHECK_OK(synth_vcpu_info(n, v, &vn));
		CHECK_OK(synth_vcpu_info(a, v, &va));
		CHECK_EQ(va.cr3, vn.cr3);
		CHECK_EQ(va.vbase, vn.vbase);
		CHECK_EQ(va.map_units, vn.map_units);
		CHECK_EQ(va.ws_units, vn.ws_units);
		an = xmalloc(vn.map_units * 8);
		aa = xmalloc(vn.map_units * 8);
		gn = xmalloc(vn.map_units * 8);
		ga = xmalloc(vn.map_units * 8);
		CHECK_EQ(synth_vcpu_pages(n, v, 0, an, gn, vn.map_units), vn.map_units);
		CHECK_EQ(synth_vcpu_pages(a, v, 0, aa, ga, vn.map_units), vn.map_units);
		CHECK(!memcmp(an, aa, vn.map_units * 8) && !memcmp(gn, ga, vn.map_units * 8));
		free(an);
		free(aa);
		free(gn);
		free(ga);
	}

	/* Filled with the other's memory, it runs as that guest. */
	mn = xmalloc(in.mem_bytes);
	ma = xmalloc(in.mem_bytes);
	CHECK_OK(synth_copy_memory(n, mn));
	fill_from_outside(&ia, mn);
	CHECK_OK(synth_start(n));
	CHECK_OK(synth_start(a));
	CHECK_OK(synth_wait_done(n, 30000));
	CHECK_OK(synth_wait_done(a, 30000));
	CHECK_OK(synth_pause(n));
	CHECK_OK(synth_pause(a));
	for (unsigned v = 0; v < in.nvcpus; v++) {
		struct synth_vcpu_stats sn, sa;

		CHECK_OK(synth_vcpu_stats(n, v, &sn));
		CHECK_OK(synth_vcpu_stats(a, v, &sa));
		CHECK_EQ(sa.accesses, 20000);
		CHECK_EQ(sa.faults, 0);
		CHECK_EQ(sn.faults, 0);
		CHECK_EQ(sa.writes, sn.writes);
		CHECK(sa.writes > 0);
	}
	CHECK_OK(synth_copy_memory(n, mn));
	CHECK_OK(synth_copy_memory(a, ma));
	for (uint64_t p = 0; p < pages; p++)
		if (memcmp(mn + p * 4096, ma + p * 4096, 4096)) {
			fprintf(stderr, "frame %" PRIu64 " differs\n", p);
			exit(1);
		}
	free(mn);
	free(ma);
	free(kn);
	free(ka);
	synth_free(a);
	synth_free(n);
}

int main(void)
{
	uint64_t seed = t_seed("guest_attach");

	for (unsigned b = SYNTH_MEM_ANON; b <= SYNTH_MEM_SHARED; b++) {
		run(b, false, seed);
		run(b, true, seed + 1);
	}
	return 0;
}
