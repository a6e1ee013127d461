// SPDX-License-Identifier: MIT
/*
 * A restored guest resumes where the snapshot left it. synth_vcpu_seek():
 * a guest whose vCPUs start at step k makes exactly the accesses (GPA and
 * write, in order) that an unseeked guest made from its step k on, for the
 * sequential and the random pattern, and ends at max_accesses counted from 0.
 * mem_host: an attach guest runs on memory the caller mapped (here a
 * MAP_PRIVATE mapping of an image of the other guest's memory, as a restore
 * through the kernel's paging would give it), without translation faults,
 * and leaves the mapping to the caller. synth_vcpu_limit(): vCPUs stopped at
 * exact steps and let go on make the same accesses as a run never stopped.
 * Bad uses are refused by code.
 */
#include "gtest.h" /* first: it defines _GNU_SOURCE */

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define NV 2
#define K 6000u
#define SEEK 2500u

struct run {
	uint64_t *log[NV];
	struct synth_vcpu_stats st[NV];
};

static void run(struct synth_opts *o, uint64_t seek, struct run *r)
{
	struct synth_guest *g;

	CHECK_OK(synth_create(&g, o));
	for (unsigned v = 0; v < NV && seek; v++)
		CHECK_OK(synth_vcpu_seek(g, v, seek));
	CHECK_OK(synth_start(g));
	CHECK_EQ(synth_vcpu_seek(g, 0, 1), -EBUSY);
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < NV; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &r->st[v]));
		r->log[v] = xmalloc(K * 8);
		CHECK_EQ(synth_log_read(g, v, 0, r->log[v], K), r->st[v].log_len);
	}
	synth_free(g);
}

static void seek_pattern(unsigned pattern, uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = NV, .map_bytes = 1 << 20,
		   .ws_bytes = 512 << 10, .pattern = pattern, .write_pct = 40, .max_accesses = K,
		   .log_mode = SYNTH_LOG_ALL, .log_entries = K, .seed = seed,
		   .log_fn = capture_log);
	struct run a = { 0 }, b = { 0 };

	run(&o, 0, &a);
	run(&o, SEEK, &b);
	for (unsigned v = 0; v < NV; v++) {
		CHECK_EQ(a.st[v].accesses, K);
		CHECK_EQ(b.st[v].accesses, K);
		CHECK_EQ(b.st[v].log_len, K - SEEK);
		CHECK_EQ(b.st[v].faults, 0);
		for (unsigned i = 0; i < K - SEEK; i++)
			CHECK_EQ(b.log[v][i], a.log[v][SEEK + i]);
		free(a.log[v]);
		free(b.log[v]);
	}
	fprintf(stderr, "%s: vCPUs seeked to %u replay steps %u..%u access for access\n",
		synth_pattern_name(pattern), SEEK, SEEK, K - 1);
}

static void mem_host(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = NV, .map_bytes = 1 << 20,
		   .ws_bytes = 512 << 10, .write_pct = 40, .max_accesses = K,
		   .log_mode = SYNTH_LOG_ALL, .log_entries = K, .seed = seed,
		   .log_fn = capture_log);
	uint64_t len = o.mem_bytes;
	uint8_t *image = xmalloc(len), *mem;
	char path[512];
	struct run a = { 0 }, b = { 0 };
	struct synth_guest *g;
	int fd;

	/* The source: its memory as created, imaged into a file; then its run. */
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_copy_memory(g, image));
	synth_free(g);
	run(&o, 0, &a);
	snprintf(path, sizeof(path), "%s/image", t_tmpdir());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, image, len, 0), (ssize_t)len);
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	CHECK(mem != MAP_FAILED);

	/* The same guest on the caller's mapping: the same accesses, no fault. */
	o.flags = SYNTH_F_ATTACH;
	o.mem_host = mem;
	run(&o, 0, &b);
	for (unsigned v = 0; v < NV; v++) {
		CHECK_EQ(b.st[v].accesses, K);
		CHECK_EQ(b.st[v].faults, 0);
		for (unsigned i = 0; i < K; i++)
			CHECK_EQ(b.log[v][i], a.log[v][i]);
		free(a.log[v]);
		free(b.log[v]);
	}
	/* Still mapped after synth_free(): private writes went to the mapping, not the file. */
	CHECK_EQ(pread(fd, image, len, 0), (ssize_t)len);
	CHECK(memcmp(mem, image, len) != 0);
	CHECK_OK(munmap(mem, len));
	close(fd);
	unlink(path);

	/* Refused: without ATTACH, unaligned, in a child, shared backing. */
	o.mem_host = image + 1;
	CHECK_EQ(synth_create(&g, &o), -EINVAL);
	o.mem_host = image;
	o.flags = 0;
	CHECK_EQ(synth_create(&g, &o), -EINVAL);
	o.flags = SYNTH_F_ATTACH | SYNTH_F_CHILD;
	CHECK_EQ(synth_create(&g, &o), -EINVAL);
	o.flags = SYNTH_F_ATTACH;
	o.backing = SYNTH_MEM_SHARED;
	CHECK_EQ(synth_create(&g, &o), -EINVAL);
	CHECK(strstr(g_logbuf, "mem_host") != NULL);
	free(image);
	fprintf(stderr, "mem_host: a guest on a MAP_PRIVATE image ran %u accesses as the source\n",
		K);
}

/* Stopped at steps 1000 and 2500 (a snapshot at a trace's midpoint), then run on to K. */
static void limit_resume(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = NV, .map_bytes = 1 << 20,
		   .ws_bytes = 512 << 10, .write_pct = 40, .max_accesses = K,
		   .log_mode = SYNTH_LOG_ALL, .log_entries = K, .seed = seed,
		   .log_fn = capture_log);
	const uint64_t stop[NV] = { 1000, 2500 };
	struct run a = { 0 };
	struct synth_guest *g;

	run(&o, 0, &a);
	CHECK_OK(synth_create(&g, &o));
	for (unsigned v = 0; v < NV; v++)
		CHECK_OK(synth_vcpu_limit(g, v, stop[v]));
	CHECK_EQ(synth_vcpu_limit(g, NV, 1), -EINVAL);
	CHECK_OK(synth_start(g));
	CHECK_EQ(synth_vcpu_limit(g, 0, K), -EBUSY);
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < NV; v++) {
		struct synth_vcpu_stats st;

		CHECK_OK(synth_vcpu_stats(g, v, &st));
		CHECK_EQ(st.accesses, stop[v]);
		CHECK(st.done);
		CHECK_OK(synth_vcpu_limit(g, v, K));
		CHECK_OK(synth_vcpu_stats(g, v, &st));
		CHECK(!st.done);
	}
	CHECK_OK(synth_resume(g));
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < NV; v++) {
		struct synth_vcpu_stats st;
		uint64_t *log = xmalloc(K * 8);

		CHECK_OK(synth_vcpu_stats(g, v, &st));
		CHECK_EQ(st.accesses, K);
		CHECK_EQ(synth_log_read(g, v, 0, log, K), K);
		for (unsigned i = 0; i < K; i++)
			CHECK_EQ(log[i], a.log[v][i]);
		free(log);
		free(a.log[v]);
	}
	synth_free(g);
	fprintf(stderr, "limit: vCPUs stopped at steps 1000 and 2500 and let go on made the "
		"unstopped run's %u accesses\n", K);
}

static void seek_refused(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 8 << 20, .nvcpus = 1, .seed = seed, .flags = SYNTH_F_CHILD,
		   .log_fn = capture_log);
	struct synth_guest *g;

	CHECK_OK(synth_create(&g, &o));
	CHECK_EQ(synth_vcpu_seek(g, 0, 5), -ENOTSUP);
	CHECK_EQ(synth_vcpu_limit(g, 0, 5), -ENOTSUP);
	synth_free(g);
	o.flags = 0;
	CHECK_OK(synth_create(&g, &o));
	CHECK_EQ(synth_vcpu_seek(g, 1, 5), -EINVAL);
	synth_free(g);
}

int main(void)
{
	uint64_t seed = t_seed("guest_seek");

	seek_pattern(SYNTH_PAT_SEQ, seed);
	seek_pattern(SYNTH_PAT_RANDOM, seed);
	mem_host(seed);
	limit_resume(seed);
	seek_refused(seed);
	rmdir(t_tmpdir());
	return 0;
}
