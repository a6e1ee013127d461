/* SPDX-License-Identifier: MIT */
/*
 * A check of the restore methods (peers.h) by hand, not a CTest test: makes
 * a raw image with known pages (holes, zero pages, patterned pages), its
 * Halite snapshot (halite-inspect import) and a working-set file, then for
 * each method prepares memory, starts, touches every page from several
 * threads comparing it with the image, finishes and prints the counts.
 *
 *   halite-peers-selftest --dir D --inspect PATH [--mib N] [--threads N]
 *                         [--latency US] [--cold] [--only NAME] [--abort]
 *
 * --abort: touch a few pages, then method_free() without method_finish().
 *
 * Exit 0 when every method restored every page exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "peers.h"

#define PAGE 4096u

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* 0: hole, 1: zero page written, 2: patterned. */
static int page_kind(uint64_t i)
{
	if ((i / 64) % 7 == 3)
		return 0;
	if (i % 13 == 5)
		return 1;
	return 2;
}

static void page_fill(uint64_t i, uint64_t *w)
{
	for (unsigned k = 0; k < PAGE / 8; k++)
		w[k] = (i * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)k << 48) ^ 0x5a5a;
}

static int make_files(const char *dir, uint64_t bytes, char *raw, char *ws, size_t n)
{
	uint64_t pages = bytes / PAGE, w[PAGE / 8], zero[PAGE / 8] = { 0 };
	int fd, wfd;

	snprintf(raw, n, "%s/raw.img", dir);
	snprintf(ws, n, "%s/ws.bin", dir);
	fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	wfd = open(ws, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || wfd < 0 || ftruncate(fd, (off_t)bytes))
		return -errno;
	for (uint64_t i = 0; i < pages; i++) {
		int k = page_kind(i);

		if (k == 0)
			continue;
		page_fill(i, w);
		if (pwrite(fd, k == 1 ? zero : w, PAGE, (off_t)(i * PAGE)) != PAGE)
			return -EIO;
		/* The working set: patterned pages of the first quarter, every third. */
		if (k == 2 && i < pages / 4 && i % 3 == 0) {
			uint8_t gpa[8];
			uint64_t a = i * PAGE;

			for (int b = 0; b < 8; b++)
				gpa[b] = (uint8_t)(a >> (8 * b));
			if (write(wfd, gpa, 8) != 8 || write(wfd, w, PAGE) != PAGE)
				return -EIO;
		}
	}
	fsync(fd);
	fsync(wfd);
	close(fd);
	close(wfd);
	return 0;
}

struct toucher {
	const uint8_t *mem;
	uint64_t first, last; /* pages */
	uint64_t bad;
};

static void *touch(void *arg)
{
	struct toucher *t = arg;
	uint64_t w[PAGE / 8];

	for (uint64_t i = t->first; i < t->last; i++) {
		const volatile uint8_t *p = t->mem + i * PAGE;
		uint8_t got[PAGE];

		for (unsigned k = 0; k < PAGE; k++)
			got[k] = p[k];
		if (page_kind(i) == 2) {
			page_fill(i, w);
			if (memcmp(got, w, PAGE))
				t->bad++;
		} else {
			for (unsigned k = 0; k < PAGE; k++)
				if (got[k]) {
					t->bad++;
					break;
				}
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "dir", required_argument, NULL, 'd' },   { "inspect", required_argument, NULL, 'i' },
		{ "mib", required_argument, NULL, 'm' },   { "threads", required_argument, NULL, 't' },
		{ "latency", required_argument, NULL, 'l' }, { "cold", no_argument, NULL, 'c' },
		{ "only", required_argument, NULL, 'o' },  { "abort", no_argument, NULL, 'a' },
		{ NULL, 0, NULL, 0 }
	};
	const char *dir = NULL, *inspect = NULL, *only = NULL;
	unsigned mib = 64, nthreads = 3;
	uint32_t latency = 0;
	bool cold = false, abort_early = false;
	char raw[512], ws[512], hlt[512], fuse[512], cmd[2048];
	int c, fails = 0;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'd': dir = optarg; break;
		case 'i': inspect = optarg; break;
		case 'm': mib = (unsigned)atoi(optarg); break;
		case 't': nthreads = (unsigned)atoi(optarg); break;
		case 'l': latency = (uint32_t)atoi(optarg); break;
		case 'c': cold = true; break;
		case 'o': only = optarg; break;
		case 'a': abort_early = true; break;
		default: return 2;
		}
	}
	if (!dir || !inspect || !nthreads || nthreads > 16 || !mib) {
		fprintf(stderr, "usage: %s --dir D --inspect PATH [--mib N] [--threads N] "
			"[--latency US] [--cold] [--only NAME]\n", argv[0]);
		return 2;
	}
	if (make_files(dir, (uint64_t)mib << 20, raw, ws, sizeof(raw))) {
		perror("making the files");
		return 1;
	}
	snprintf(hlt, sizeof(hlt), "%s/snap.hlt", dir);
	snprintf(fuse, sizeof(fuse), "%s/fuse", dir);
	mkdir(fuse, 0755);
	snprintf(cmd, sizeof(cmd), "%s import %s --region pc.ram -o %s >/dev/null", inspect, raw,
		 hlt);
	if (system(cmd)) {
		fprintf(stderr, "failed: %s\n", cmd);
		return 1;
	}
	printf("%-14s %5s %9s %9s %10s %7s %9s %9s %9s %s\n", "method", "lat", "start_s", "touch_s",
	       "reads", "MiB", "faults", "done_s", "vm_acc%", "result");
	for (int kind = METHOD_HALITE; kind <= METHOD_WS; kind++) {
		struct method_cfg cfg = {
			.kind = kind, .hlt_path = hlt, .raw_path = raw, .ws_path = ws,
			.region = "pc.ram", .mem_bytes = (uint64_t)mib << 20,
			.read_latency_us = latency, .cold = cold,
			.halite_flags = 0x4u /* TRACK_ACCESS */, .fuse_dir = fuse,
		};
		struct toucher t[16];
		pthread_t th[16];
		struct method *m;
		struct method_result res;
		uint64_t pages = cfg.mem_bytes / PAGE, bad = 0, t0, t1, t2;
		void *mem;
		int ret;

		if (only && strcmp(only, method_name(kind)))
			continue;
		ret = method_prepare(&m, &cfg, &mem);
		if (ret) {
			printf("%-14s prepare: %s\n", method_name(kind), strerror(-ret));
			fails++;
			continue;
		}
		t0 = now_ns();
		ret = method_start(m);
		t1 = now_ns();
		if (ret) {
			printf("%-14s start: %s\n", method_name(kind), strerror(-ret));
			method_free(m);
			fails++;
			continue;
		}
		if (abort_early) {
			/* A few pages, then free without finishing: the error path's cleanup. */
			for (uint64_t i = 0; i < 16; i++)
				(void)*(volatile uint8_t *)((uint8_t *)mem + i * 64 * PAGE);
			method_free(m);
			printf("%-14s freed early\n", method_name(kind));
			continue;
		}
		/* Each thread a contiguous share, in order: as a vCPU walking its region. */
		for (unsigned k = 0; k < nthreads; k++) {
			t[k] = (struct toucher){ mem, pages * k / nthreads, pages * (k + 1) / nthreads, 0 };
			pthread_create(&th[k], NULL, touch, &t[k]);
		}
		for (unsigned k = 0; k < nthreads; k++) {
			pthread_join(th[k], NULL);
			bad += t[k].bad;
		}
		t2 = now_ns();
		ret = method_finish(m, 60000, &res);
		printf("%-14s %5u %9.4f %9.4f %10" PRIu64 " %7.1f %9" PRIu64 " %9.4f %9.1f %s\n",
		       method_name(kind), latency, (double)(t1 - t0) / 1e9,
		       (double)(t2 - t1) / 1e9, res.storage_reads,
		       (double)res.bytes_read / (1 << 20), res.demand_faults, res.done_s,
		       res.vm_access_pct, bad ? "BAD PAGES" : ret ? strerror(-ret) : "ok");
		if (bad)
			printf("  %" PRIu64 " pages differ from the image\n", bad);
		fails += bad || ret;
		method_free(m);
	}
	return fails ? 1 : 0;
}
