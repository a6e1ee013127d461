/* SPDX-License-Identifier: MIT */
/* Refusing discards of shared guest memory (discard.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "discard.h"
#include "log_internal.h"

#define OWNER_XATTR "user.halite.nodiscard"

/* Field 22 of /proc/PID/stat: the process's start time, so a reused pid is not taken for it. */
static unsigned long long start_time(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long t = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* After the command name, which may hold anything but ends at the last ')'. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
			 "%*d %*d %*d %*d %llu", &t) != 1)
		return 0;
	return t;
}

static int owner_mark(char *buf, size_t len, pid_t pid)
{
	return snprintf(buf, len, "%d:%llu", (int)pid, start_time(pid));
}

/* Is the process named by the mark still the one alive under that pid? */
static bool owner_alive(const char *mark)
{
	unsigned long long t;
	int pid;
	char now[64];

	if (sscanf(mark, "%d:%llu", &pid, &t) != 2 || pid <= 0)
		return false;
	if (kill(pid, 0) && errno == ESRCH)
		return false;
	owner_mark(now, sizeof(now), pid);
	return strcmp(now, mark) == 0;
}

int halite_discard_refuse(int fd, bool *ours)
{
	char mark[64], old[64];
	ssize_t n;
	int fl = 0;

	*ours = false;
	if (ioctl(fd, FS_IOC_GETFLAGS, &fl))
		return -errno;
	owner_mark(mark, sizeof(mark), getpid());
	if (fl & FS_APPEND_FL) {
		n = fgetxattr(fd, OWNER_XATTR, old, sizeof(old) - 1);
		if (n <= 0)
			return 0; /* someone's chattr +a: theirs */
		old[n] = '\0';
		if (owner_alive(old))
			return 0; /* another engine's, for as long as it runs */
		/* Left by an engine that died: ours to clear when done. */
		/*
		 * Left by an engine that died: ours to clear when done (an
		 * append-only file takes no new xattr, so its mark stays).
		 */
	} else {
		/*
		 * The mark first: an append-only file refuses xattr changes.
		 * Without it (no xattrs there) a death leaves the flag for
		 * chattr -a.
		 */
		fsetxattr(fd, OWNER_XATTR, mark, strlen(mark), 0);
		fl |= FS_APPEND_FL;
		if (ioctl(fd, FS_IOC_SETFLAGS, &fl)) {
			int err = errno;

			fremovexattr(fd, OWNER_XATTR);
			return -err;
		}
	}
	*ours = true;
	return 0;
}

int halite_discard_allow(int fd)
{
	int fl = 0, ret = 0;

	if (ioctl(fd, FS_IOC_GETFLAGS, &fl))
		return -errno;
	fl &= ~FS_APPEND_FL;
	if (ioctl(fd, FS_IOC_SETFLAGS, &fl))
		ret = -errno;
	fremovexattr(fd, OWNER_XATTR);
	return ret;
}

void halite_discard_release(int fd, bool *refused, const struct halite_logger *log,
			    const char *name)
{
	int ret;

	if (!*refused)
		return;
	*refused = false;
	ret = halite_discard_allow(fd);
	if (ret)
		halite_logf(log, HALITE_LOG_WARN, "region '%s': its file still refuses hole punches "
			    "(%s): chattr -a it", name, strerror(-ret));
}

int halite_discard_reclaim(int fd, pid_t *owner)
{
	char mark[64];
	ssize_t n;
	int fl = 0;

	if (ioctl(fd, FS_IOC_GETFLAGS, &fl))
		return errno == ENOTTY || errno == EOPNOTSUPP ? 0 : -errno;
	if (!(fl & FS_APPEND_FL))
		return 0;
	n = fgetxattr(fd, OWNER_XATTR, mark, sizeof(mark) - 1);
	if (n <= 0)
		return -EPERM;
	mark[n] = '\0';
	if (owner_alive(mark)) {
		*owner = (pid_t)atoi(mark);
		return -EBUSY;
	}
	return halite_discard_allow(fd);
}

int halite_file_data_pages(int fd, uint64_t off, uint64_t len, uint64_t page, uint64_t *bits)
{
	off_t end = (off_t)(off + len), d = (off_t)off, h;

	while (d < end) {
		d = lseek(fd, d, SEEK_DATA);
		if (d < 0)
			return errno == ENXIO ? 0 : -errno;
		if (d >= end)
			break;
		h = lseek(fd, d, SEEK_HOLE);
		if (h < 0)
			return -errno;
		for (uint64_t p = ((uint64_t)d - off) / page; p < len / page && off + p * page <
		     (uint64_t)h; p++)
			bits[p / 64] |= 1ull << (p % 64);
		d = h;
	}
	return 0;
}
