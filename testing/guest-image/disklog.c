// SPDX-License-Identifier: MIT
/*
 * disklog: a guest program whose disk and memory must agree (tests/qemu,
 * case disks). It counts, and for each count N first writes N to sector 0
 * of a disk (O_DIRECT | O_DSYNC: on the disk, not in the page cache, before
 * it goes on), then keeps N in memory: its own variable and /run/disklog
 * (tmpfs: memory too). So at any instant the disk holds the memory's count
 * or the next one. A snapshot that freezes the disk and memory at the same
 * instant keeps that true in every restore of it; a disk from another
 * instant (one the source wrote on after the snapshot, one an earlier
 * restore wrote on) breaks it.
 *
 *   disklog DEV          count forever (about 50 a second), from what DEV holds
 *   disklog check DEV    one line: "disklog disk D mem M1 M2 ok" (M1 <= D <= M2 + 1:
 *                        memory read before and after the disk) or "... MISMATCH"
 *
 * Sector 0 holds "disklog N\n", zero-padded to 512 bytes; anything else
 * reads as 0 (a fresh disk).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SECTOR 512
#define STATE "/run/disklog"

static char sector[SECTOR] __attribute__((aligned(4096)));

static int disk_read(int fd, uint64_t *n)
{
	unsigned long long v;

	if (pread(fd, sector, SECTOR, 0) != SECTOR)
		return -1;
	*n = sscanf(sector, "disklog %llu\n", &v) == 1 ? v : 0;
	return 0;
}

static int disk_write(int fd, uint64_t n)
{
	memset(sector, 0, SECTOR);
	snprintf(sector, SECTOR, "disklog %" PRIu64 "\n", n);
	return pwrite(fd, sector, SECTOR, 0) == SECTOR ? 0 : -1;
}

/* The count in memory, as /run/disklog holds it; 0 before the first. */
static uint64_t mem_read(void)
{
	unsigned long long v = 0;
	FILE *f = fopen(STATE, "r");

	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

static void mem_write(uint64_t n)
{
	char tmp[] = STATE ".tmp";
	FILE *f = fopen(tmp, "w");

	/* Renamed over: a reader sees the old count or the new, never half. */
	if (f) {
		fprintf(f, "%" PRIu64 "\n", n);
		if (!fclose(f))
			rename(tmp, STATE);
	}
}

static int run(const char *dev)
{
	int fd = open(dev, O_RDWR | O_DIRECT | O_DSYNC);
	uint64_t n;

	if (fd < 0 || disk_read(fd, &n)) {
		printf("disklog: %s: %s\n", dev, strerror(errno));
		return 1;
	}
	printf("disklog: counting on %s from %" PRIu64 "\n", dev, n);
	fflush(stdout);
	mem_write(n);
	for (;;) {
		if (disk_write(fd, n + 1)) {
			printf("disklog: writing %s: %s\n", dev, strerror(errno));
			return 1;
		}
		mem_write(++n);
		nanosleep(&(struct timespec){ 0, 20 * 1000 * 1000 }, NULL);
	}
}

static int check(const char *dev)
{
	int fd = open(dev, O_RDONLY | O_DIRECT);
	uint64_t m1, m2, d;

	m1 = mem_read();
	if (fd < 0 || disk_read(fd, &d)) {
		printf("disklog: %s: %s\n", dev, strerror(errno));
		return 1;
	}
	m2 = mem_read();
	printf("disklog disk %" PRIu64 " mem %" PRIu64 " %" PRIu64 " %s\n", d, m1, m2,
	       m1 <= d && d <= m2 + 1 ? "ok" : "MISMATCH");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2)
		return run(argv[1]);
	if (argc == 3 && !strcmp(argv[1], "check"))
		return check(argv[2]);
	fprintf(stderr, "usage: disklog DEV | disklog check DEV\n");
	return 2;
}
