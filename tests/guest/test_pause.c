// SPDX-License-Identifier: MIT
/*
 * Control: while paused, memory does not change over 100 ms and the access
 * counters are frozen; resume continues; many quick pause/resume cycles;
 * the state rules (start twice, copy while running, calls after stop); free
 * without start; stop while paused and while running; edge sizes (4 MiB,
 * 16 vCPUs, several GiB); bad options rejected with -EINVAL and a message.
 */
#include <sys/mman.h>

#include "gtest.h"

static void frozen_while_paused(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 4, .write_pct = 50,
		   .pattern = SYNTH_PAT_SEQ, .seed = seed, .log_fn = capture_log);
	struct synth_guest *g;
	struct synth_info info;
	struct synth_vcpu_stats s1[4], s2[4], s3[4];
	uint8_t *m1, *m2;

	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	m1 = xmalloc(info.mem_bytes);
	m2 = xmalloc(info.mem_bytes);

	/* Created paused: nothing moves before start. */
	CHECK_OK(synth_copy_memory(g, m1));
	sleep_ms(20);
	for (unsigned v = 0; v < 4; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &s1[v]));
		CHECK_EQ(s1[v].accesses, 0);
	}
	CHECK_EQ(synth_resume(g), -EINVAL);

	CHECK_OK(synth_start(g));
	CHECK_EQ(synth_start(g), -EALREADY);
	CHECK_OK(synth_resume(g)); /* running already: fine */
	CHECK_EQ(synth_copy_memory(g, m1), -EBUSY);
	CHECK_EQ(synth_log_reset(g), -EBUSY);
	wait_progress(g, 4, NULL);
	CHECK_OK(synth_pause(g));
	CHECK_OK(synth_pause(g)); /* paused already: fine */
	for (unsigned v = 0; v < 4; v++)
		CHECK_OK(synth_vcpu_stats(g, v, &s1[v]));
	CHECK_OK(synth_copy_memory(g, m1));
	sleep_ms(100);
	CHECK_OK(synth_copy_memory(g, m2));
	for (unsigned v = 0; v < 4; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &s2[v]));
		CHECK(s1[v].accesses > 0);
		CHECK_EQ(s2[v].accesses, s1[v].accesses);
		CHECK_EQ(s2[v].writes, s1[v].writes);
	}
	CHECK(!memcmp(m1, m2, info.mem_bytes));

	CHECK_OK(synth_resume(g));
	{
		uint64_t base[4] = { s2[0].accesses, s2[1].accesses, s2[2].accesses,
				     s2[3].accesses };

		wait_progress(g, 4, base);
	}
	CHECK_OK(synth_pause_timed(g, 5000));
	for (unsigned v = 0; v < 4; v++) {
		CHECK_OK(synth_vcpu_stats(g, v, &s3[v]));
		CHECK(s3[v].accesses > s2[v].accesses);
	}
	CHECK_OK(synth_copy_memory(g, m2));
	CHECK(memcmp(m1, m2, info.mem_bytes)); /* the writes went on */

	/* Quick cycles: each pause freezes the counters at once. */
	for (int i = 0; i < 30; i++) {
		CHECK_OK(synth_resume(g));
		if (i % 3)
			sleep_ms(1);
		CHECK_OK(synth_pause(g));
		for (unsigned v = 0; v < 4; v++)
			CHECK_OK(synth_vcpu_stats(g, v, &s1[v]));
		sleep_ms(2);
		for (unsigned v = 0; v < 4; v++) {
			CHECK_OK(synth_vcpu_stats(g, v, &s2[v]));
			CHECK_EQ(s2[v].accesses, s1[v].accesses);
		}
	}
	fprintf(stderr, "pause: counters and memory frozen; vcpu0 %" PRIu64 " accesses\n",
		s2[0].accesses);
	CHECK_OK(synth_copy_memory(g, m2));

	/* Stop while paused; afterwards memory still reads, control says -ESRCH. */
	CHECK_OK(synth_stop(g));
	CHECK_OK(synth_stop(g));
	CHECK_EQ(synth_start(g), -ESRCH);
	CHECK_EQ(synth_pause(g), -ESRCH);
	CHECK_EQ(synth_resume(g), -ESRCH);
	CHECK_OK(synth_copy_memory(g, m1));
	CHECK(!memcmp(m1, m2, info.mem_bytes));
	synth_free(g);
	free(m1);
	free(m2);
}

static void lifecycles(uint64_t seed)
{
	struct synth_guest *g;

	/* Free without start; stop without start. */
	{
		SYNTH_OPTS(o, .mem_bytes = 4 << 20, .seed = seed);
		struct synth_vcpu_info vi;

		CHECK_OK(synth_create(&g, &o));
		CHECK_OK(synth_vcpu_info(g, 3, &vi)); /* default 4 vCPUs */
		CHECK(vi.tid > 0);
		CHECK_EQ(synth_vcpu_info(g, 4, &vi), -EINVAL);
		synth_free(g);
		CHECK_OK(synth_create(&g, &o));
		CHECK_OK(synth_stop(g));
		synth_free(g);
	}
	synth_free(NULL);
	/* Stop while running, 16 vCPUs. */
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 16, .write_pct = 10,
			   .pattern = SYNTH_PAT_RANDOM, .seed = seed);

		CHECK_OK(synth_create(&g, &o));
		CHECK_OK(synth_start(g));
		wait_progress(g, 16, NULL); /* then stop while running */
		CHECK_OK(synth_stop(g));
		synth_free(g);
	}
	/* 1 vCPU in the smallest memory, all defaults but size. */
	{
		SYNTH_OPTS(o, .mem_bytes = 4 << 20, .nvcpus = 1, .seed = seed);

		CHECK_OK(synth_create(&g, &o));
		CHECK_OK(synth_start(g));
		sleep_ms(5);
		synth_free(g); /* free while running */
	}
	/* Several GiB: mostly never touched, so cheap to build. */
	{
		SYNTH_OPTS(o, .mem_bytes = 3ull << 30, .nvcpus = 2, .map_bytes = 8 << 20,
			   .untouched_pct = 97, .seed = seed, .log_fn = capture_log);
		struct synth_info info;
		struct synth_vcpu_stats st;

		CHECK_OK(synth_create(&g, &o));
		CHECK_OK(synth_info(g, &info));
		CHECK_EQ(info.untouched_frames, (3ull << 30) / 4096 * 97 / 100);
		CHECK_OK(synth_start(g));
		wait_progress(g, 2, NULL);
		CHECK_OK(synth_pause(g));
		CHECK_OK(synth_vcpu_stats(g, 1, &st));
		CHECK(st.accesses > 0);
		CHECK_EQ(st.faults, 0);
		synth_free(g);
	}
}

static void expect_einval(struct synth_opts *o, const char *needle)
{
	struct synth_guest *g = (struct synth_guest *)(uintptr_t)1;

	g_logbuf[0] = 0;
	o->log_fn = capture_log;
	CHECK_EQ(synth_create(&g, o), -EINVAL);
	CHECK(g == (struct synth_guest *)(uintptr_t)1); /* untouched on failure */
	if (needle && !strstr(g_logbuf, needle)) {
		fprintf(stderr, "message '%s' lacks '%s'\n", g_logbuf, needle);
		exit(1);
	}
}

static void bad_options(void)
{
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 4, .ws_bytes = 32 << 20);
		expect_einval(&o, "working set larger than memory");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 1, .ws_bytes = 64 << 20);
		expect_einval(&o, "working set does not fit"); /* no room for tables */
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 1, .ws_bytes = 32 << 20,
			   .untouched_pct = 60);
		expect_einval(&o, "untouched");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = (4 << 20) + 4096);
		expect_einval(&o, "multiple of 2 MiB");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 2 << 20);
		expect_einval(&o, "mem_bytes");
	}
	{
		SYNTH_OPTS(o, .nvcpus = 17, .mem_bytes = 64 << 20);
		expect_einval(&o, "nvcpus");
	}
	{
		SYNTH_OPTS(o, .flags = 1u << 20, .mem_bytes = 64 << 20);
		expect_einval(&o, "unknown flags");
	}
	{
		SYNTH_OPTS(o, .paging_levels = 3, .mem_bytes = 64 << 20);
		expect_einval(&o, "paging_levels");
	}
	{
		SYNTH_OPTS(o, .pattern = SYNTH_PAT_TRACE, .mem_bytes = 64 << 20);
		expect_einval(&o, "trace_in");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .huge_2m = 40, .nvcpus = 1,
			   .map_bytes = 40 << 21);
		expect_einval(&o, "larger than memory");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .ws_bytes = 4 << 20, .map_bytes = 2 << 20);
		expect_einval(&o, "more than map_bytes");
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .ws_bytes = 1000);
		expect_einval(&o, "4 KiB");
	}
	{
		/* A newer caller's bigger struct with a field we do not know set. */
		struct {
			struct synth_opts o;
			uint64_t future;
		} big = { .o = { .sz = sizeof(big), .mem_bytes = 64 << 20 }, .future = 1 };
		struct synth_guest *g;

		CHECK_EQ(synth_create(&g, &big.o), -EINVAL);
		big.future = 0;
		CHECK_OK(synth_create(&g, &big.o));
		synth_free(g);
	}
}

int main(void)
{
	uint64_t seed = t_seed("guest_pause");

	frozen_while_paused(seed);
	lifecycles(seed);
	bad_options();
	return 0;
}
