// SPDX-License-Identifier: MIT
/*
 * Traces: replaying a recorded trace reproduces exactly the same sequence of
 * accessed GPAs (and writes) per vCPU, and so the same memory; recording
 * works from seq and random, in-process and in a child; looping; a record
 * that translates to nothing counts a fault; malformed files are refused.
 */
#include <fcntl.h>
#include <unistd.h>

#include "endian_util.h"
#include "gtest.h"

#define NV 3
#define K 4000

struct run {
	uint64_t *log[NV];
	struct synth_vcpu_stats st[NV];
	uint8_t *mem;
	uint64_t mem_bytes;
};

static void run_guest(struct synth_opts *o, struct run *r)
{
	struct synth_guest *g;
	struct synth_info info;

	CHECK_OK(synth_create(&g, o));
	CHECK_OK(synth_info(g, &info));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	r->mem_bytes = info.mem_bytes;
	r->mem = xmalloc(info.mem_bytes);
	CHECK_OK(synth_copy_memory(g, r->mem));
	for (unsigned v = 0; v < NV; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &r->st[v]));
		r->log[v] = xmalloc(K * 8);
		CHECK_EQ(synth_log_read(g, v, 0, r->log[v], K), r->st[v].log_len);
	}
	CHECK_OK(synth_stop(g)); /* flushes the trace */
	synth_free(g);
}

static void free_run(struct run *r)
{
	for (unsigned v = 0; v < NV; v++)
		free(r->log[v]);
	free(r->mem);
}

static void record_replay(unsigned pattern, unsigned flags, uint64_t seed)
{
	char path[512];
	SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = NV, .map_bytes = 2 << 20,
		   .ws_bytes = 1 << 20, .hole_every = 11, .pattern = pattern, .write_pct = 30,
		   .max_accesses = K, .log_mode = SYNTH_LOG_ALL, .log_entries = K,
		   .flags = flags, .seed = seed, .log_fn = capture_log, .trace_out = path);
	struct run a = { 0 }, b = { 0 };

	snprintf(path, sizeof(path), "%s/%s%s.trace", t_tmpdir(), synth_pattern_name(pattern),
		 flags & SYNTH_F_CHILD ? "-child" : "");
	run_guest(&o, &a);
	/* The same guest (same seed: same layout and data), driven by the trace. */
	o.trace_out = NULL;
	o.trace_in = path;
	o.pattern = SYNTH_PAT_TRACE;
	run_guest(&o, &b);
	for (unsigned v = 0; v < NV; v++) {
		CHECK_EQ(a.st[v].accesses, K);
		CHECK_EQ(b.st[v].accesses, K);
		CHECK_EQ(b.st[v].writes, a.st[v].writes);
		CHECK_EQ(b.st[v].faults, 0);
		CHECK_EQ(a.st[v].log_len, K);
		CHECK_EQ(b.st[v].log_len, K);
		CHECK(a.st[v].writes > 0 && a.st[v].writes < K);
		for (unsigned i = 0; i < K; i++)
			CHECK_EQ(b.log[v][i], a.log[v][i]);
	}
	CHECK(!memcmp(a.mem, b.mem, a.mem_bytes));
	unlink(path);
	fprintf(stderr, "%s%s: %u vCPUs x %u accesses replayed GPA for GPA\n",
		synth_pattern_name(pattern), flags & SYNTH_F_CHILD ? " (child)" : "", NV, K);
	free_run(&a);
	free_run(&b);
}

static void write_trace(const char *path, const uint8_t *hdr, size_t hlen, const uint64_t *va,
			const uint32_t *vcpu, const uint32_t *fl, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	CHECK(fd >= 0);
	CHECK_EQ(write(fd, hdr, hlen), hlen);
	for (size_t i = 0; i < n; i++) {
		uint8_t r[16];

		halite_put_le64(r, va[i]);
		halite_put_le32(r + 8, vcpu[i]);
		halite_put_le32(r + 12, fl[i]);
		CHECK_EQ(write(fd, r, 16), 16);
	}
	close(fd);
}

static void header(uint8_t *h, uint32_t nvcpus)
{
	memset(h, 0, 32);
	memcpy(h, SYNTH_TRACE_MAGIC, 8);
	halite_put_le32(h + 8, 1);
	halite_put_le32(h + 12, 16);
	halite_put_le32(h + 16, nvcpus);
}

static void crafted(uint64_t seed)
{
	char path[512];
	SYNTH_OPTS(o, .mem_bytes = 8 << 20, .nvcpus = 2, .map_bytes = 64 << 10,
		   .pattern = SYNTH_PAT_TRACE, .trace_in = path, .log_mode = SYNTH_LOG_ALL,
		   .seed = seed, .log_fn = capture_log);
	struct synth_guest *g;
	struct synth_vcpu_info vi;
	struct synth_vcpu_stats st;
	uint8_t h[40];
	uint64_t va[3], log[8];
	uint32_t vc[3] = { 0, 0, 0 }, fl[3] = { 0, 1, 0 };

	snprintf(path, sizeof(path), "%s/crafted.trace", t_tmpdir());
	/* Need a guest to know a mapped VA; the layout is deterministic. */
	header(h, 2);
	write_trace(path, h, 32, NULL, NULL, NULL, 0);
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_vcpu_info(g, 0, &vi));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 10000)); /* an empty trace: done at once */
	CHECK_OK(synth_vcpu_stats(g, 0, &st));
	CHECK_EQ(st.accesses, 0);
	synth_free(g);

	/* Mapped, unmapped (a fault, nothing touched), mapped again: looping. */
	va[0] = vi.vbase + 8;
	va[1] = 0x1000;
	va[2] = vi.vbase + 4096 * 3 + 16;
	write_trace(path, h, 32, va, vc, fl, 3);
	o.flags = SYNTH_F_TRACE_LOOP;
	o.max_accesses = 7;
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 10000));
	CHECK_OK(synth_pause(g));
	CHECK_OK(synth_vcpu_stats(g, 0, &st));
	CHECK_EQ(st.accesses, 7);
	CHECK_EQ(st.faults, 2); /* records 1 and 4 */
	CHECK_EQ(st.writes, 0); /* the write record is the faulting one */
	CHECK_EQ(synth_log_read(g, 0, 0, log, 8), 5);
	CHECK_EQ(log[0], log[2]);
	CHECK_EQ(log[1], log[3]);
	CHECK_EQ(log[0], log[4]);
	CHECK(log[0] != log[1]);
	CHECK_OK(synth_vcpu_stats(g, 1, &st));
	CHECK_EQ(st.accesses, 0); /* no records for vCPU 1, and it is done */
	CHECK(st.done);
	synth_free(g);
	o.flags = 0;
	o.max_accesses = 0;

	/* Malformed files. */
	write_trace(path, h, 31, NULL, NULL, NULL, 0);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* short header */
	write_trace(path, h, 40, NULL, NULL, NULL, 0);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* a partial record */
	h[0] = 'X';
	write_trace(path, h, 32, NULL, NULL, NULL, 0);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* magic */
	header(h, 2);
	h[20] = 1;
	write_trace(path, h, 32, NULL, NULL, NULL, 0);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* reserved */
	header(h, 3);
	write_trace(path, h, 32, NULL, NULL, NULL, 0);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* more vCPUs than the guest */
	header(h, 2);
	vc[2] = 2;
	write_trace(path, h, 32, va, vc, fl, 3);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* a record for vCPU 2 */
	vc[2] = 0;
	fl[2] = 4;
	write_trace(path, h, 32, va, vc, fl, 3);
	CHECK_EQ(synth_create(&g, &o), -EINVAL); /* reserved flag bit */
	unlink(path);
	snprintf(path, sizeof(path), "%s/missing.trace", t_tmpdir());
	CHECK_EQ(synth_create(&g, &o), -ENOENT);
}

int main(void)
{
	uint64_t seed = t_seed("guest_trace");

	record_replay(SYNTH_PAT_RANDOM, 0, seed);
	record_replay(SYNTH_PAT_SEQ, 0, seed);
	record_replay(SYNTH_PAT_RANDOM, SYNTH_F_CHILD | SYNTH_F_SHARED_AS, seed);
	crafted(seed);
	rmdir(t_tmpdir());
	return 0;
}
