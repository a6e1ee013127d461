/* pages: writes the test guest's numbered web pages at boot, so that a
 * client's requests for them are served from the guest's own memory (the
 * initramfs's page cache), which a lazy restore must bring in first.
 *
 *   pages DIR [COUNT]      (COUNT default 2000, at most 100000)
 *
 * Page I (0 <= I < COUNT) is DIR/I.txt. Its content is a function of I
 * alone, so a client can check every byte it gets (bench/qemu.py has the same
 * function; keep the two in step):
 *   size  = 4096 + mix(I) % 12289            (4 KiB .. 16 KiB)
 *   bytes = "halite page I\n", then byte K (K counted from the page's start)
 *           is ALPHABET[(mix(I << 32 | K / 8) >> (8 * (K % 8))) & 63]
 * mix() is splitmix64's finalizer over x + golden ratio. Random-looking text
 * that compresses like ordinary pages (6 bits of entropy a byte).
 *
 * Exit 0 when every page was written, 1 with a message otherwise, 2 on bad
 * usage. Built static by scripts/make-guest.sh; runs on the host too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE_MIN 4096u
#define PAGE_SPREAD 12289u /* sizes 4096 .. 16384 bytes */
#define COUNT_MAX 100000ul

static const char alphabet[64] =
	"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n";

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Fills @buf with page @i; returns its size. */
static size_t page(uint64_t i, char *buf)
{
	size_t size = PAGE_MIN + mix(i) % PAGE_SPREAD;
	int n = snprintf(buf, size, "halite page %llu\n", (unsigned long long)i);

	for (size_t k = (size_t)n; k < size; k++)
		buf[k] = alphabet[(mix(i << 32 | k / 8) >> (8 * (k % 8))) & 63];
	return size;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static char buf[PAGE_MIN + PAGE_SPREAD];
	unsigned long count = 2000;
	char path[4096];
	char *end;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: pages DIR [COUNT]\n");
		return 2;
	}
	if (argc == 3) {
		errno = 0;
		count = strtoul(argv[2], &end, 10);
		if (errno || *end || end == argv[2] || count > COUNT_MAX) {
			fprintf(stderr, "pages: COUNT '%s' is not a number up to %lu\n", argv[2],
				COUNT_MAX);
			return 2;
		}
	}
	if (mkdir(argv[1], 0755) && errno != EEXIST) {
		fprintf(stderr, "pages: cannot make %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	for (unsigned long i = 0; i < count; i++) {
		size_t size = page(i, buf);
		int fd;

		if ((size_t)snprintf(path, sizeof(path), "%s/%lu.txt", argv[1], i) >= sizeof(path)) {
			fprintf(stderr, "pages: directory name too long\n");
			return 1;
		}
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0 || write_all(fd, buf, size) || close(fd)) {
			fprintf(stderr, "pages: cannot write %s: %s\n", path, strerror(errno));
			return 1;
		}
	}
	return 0;
}
