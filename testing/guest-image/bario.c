// SPDX-License-Identifier: MIT
/*
 * bario: copy bytes between stdin or stdout and a PCI BAR, through an mmap
 * of its sysfs resource file (/sys/bus/pci/devices/D/resourceN). The guest's
 * video memory is written and read this way for tests of its save and
 * restore (cgi-bin/vram): read() and write() of /dev/mem stop at the end of
 * low memory (EFAULT), and busybox devmem moves one word per run.
 *
 *   bario RESOURCE read OFF LEN    LEN bytes of the BAR from OFF to stdout
 *   bario RESOURCE write OFF LEN   LEN bytes from stdin into the BAR at OFF
 *
 * OFF and LEN are decimal; exit 0, or 1 with a message on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int die(const char *what)
{
	fprintf(stderr, "bario: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	unsigned long long off, len, done = 0;
	struct stat st;
	unsigned char *bar;
	char *end;
	int fd, wr;

	if (argc != 5 || (strcmp(argv[2], "read") && strcmp(argv[2], "write"))) {
		fprintf(stderr, "usage: bario RESOURCE read|write OFF LEN\n");
		return 1;
	}
	wr = !strcmp(argv[2], "write");
	off = strtoull(argv[3], &end, 10);
	if (*end || !*argv[3])
		return fprintf(stderr, "bario: bad OFF '%s'\n", argv[3]), 1;
	len = strtoull(argv[4], &end, 10);
	if (*end || !*argv[4])
		return fprintf(stderr, "bario: bad LEN '%s'\n", argv[4]), 1;
	fd = open(argv[1], wr ? O_RDWR : O_RDONLY);
	if (fd < 0 || fstat(fd, &st))
		return die(argv[1]);
	if (off > (unsigned long long)st.st_size || len > (unsigned long long)st.st_size - off) {
		fprintf(stderr, "bario: %llu bytes at %llu: past the BAR's %lld\n", len, off,
			(long long)st.st_size);
		return 1;
	}
	bar = mmap(NULL, (size_t)st.st_size, wr ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED,
		   fd, 0);
	if (bar == MAP_FAILED)
		return die("mmap");
	while (done < len) {
		ssize_t n = wr ? read(0, bar + off + done, (size_t)(len - done))
			       : write(1, bar + off + done, (size_t)(len - done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return die(wr ? "stdin" : "stdout");
		if (n == 0) {
			fprintf(stderr, "bario: stdin ended after %llu of %llu bytes\n", done, len);
			return 1;
		}
		done += (unsigned long long)n;
	}
	return 0;
}
