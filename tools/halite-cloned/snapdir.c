// SPDX-License-Identifier: MIT
/*
 * halite-cloned: where snapshots may come from. The daemon runs as root and
 * a caller of the API names a path: opened as named, any root-only file would
 * become a template, and a FIFO would block the request thread in open().
 * So snapshots come only from the operator's --snapshot-dir directories,
 * each opened O_PATH at start and checked (root's or ours, not writable by
 * group or others). A caller's absolute path must lie inside one of them,
 * component by component; the rest is opened with openat2() beneath that
 * directory (no link leads out, no magic links), without blocking, and the
 * file itself is checked the same way. A path outside every directory gets
 * one answer whether it exists or not: the reply tells nothing about files
 * the caller could not read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/openat2.h>

#include "cloned.h"

/* glibc (2.36 on Debian 12) has no openat2() wrapper: the system call, as its man page shows. */
static int sys_openat2(int dirfd, const char *path, uint64_t flags, uint64_t resolve)
{
	struct open_how how = { .flags = flags, .resolve = resolve };

	return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
}

/* Whether @path has an empty, "." or ".." component (after its leading '/'). */
static bool bad_components(const char *path)
{
	const char *p = path + 1;

	for (;;) {
		const char *e = strchrnul(p, '/');
		size_t n = (size_t)(e - p);

		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return true;
		if (!*e)
			return false;
		p = e + 1;
	}
}

/* Owned by root or by the daemon's uid, and writable by neither group nor others. */
static bool trusted(const struct stat *st)
{
	return (st->st_uid == 0 || st->st_uid == geteuid()) && !(st->st_mode & 022);
}

int snapdir_add(struct cloned *d, const char *path, char *err, size_t errlen)
{
	struct snapdir *sd;
	struct stat st;
	size_t n = strlen(path);
	int fd;

	while (n > 1 && path[n - 1] == '/')
		n--;
	if (path[0] != '/' || n >= 4096) {
		snprintf(err, errlen, "--snapshot-dir %s: want an absolute path", path);
		return -EINVAL;
	}
	sd = calloc(1, sizeof(*sd));
	if (!sd || !(sd->path = strndup(path, n))) {
		free(sd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (n > 1 && bad_components(sd->path)) {
		snprintf(err, errlen, "--snapshot-dir %s: empty, '.' and '..' components are not "
			 "allowed", path);
		goto fail;
	}
	fd = open(sd->path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "--snapshot-dir %s: %s", path, strerror(errno));
		goto fail;
	}
	if (fstat(fd, &st)) {
		snprintf(err, errlen, "--snapshot-dir %s: %s", path, strerror(errno));
		close(fd);
		goto fail;
	}
	if (!trusted(&st)) {
		snprintf(err, errlen,
			 "--snapshot-dir %s is owned by uid %u with mode %04o: a snapshot directory "
			 "must belong to root or this daemon's uid %u and not be writable by group "
			 "or others (chown %u %s && chmod go-w %s)",
			 path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
			 (unsigned)geteuid(), (unsigned)geteuid(), sd->path, sd->path);
		close(fd);
		goto fail;
	}
	sd->fd = fd;
	sd->next = NULL;
	/* kept in the order given: the first that holds a path is used */
	struct snapdir **pp = &d->snapdirs;

	while (*pp)
		pp = &(*pp)->next;
	*pp = sd;
	return 0;
fail:
	free(sd->path);
	free(sd);
	return -EINVAL;
}

void snapdir_free_all(struct cloned *d)
{
	while (d->snapdirs) {
		struct snapdir *sd = d->snapdirs;

		d->snapdirs = sd->next;
		close(sd->fd);
		free(sd->path);
		free(sd);
	}
}

/* The one answer for every path outside the directories, existing or not. */
static unsigned outside(const struct cloned *d, char *err, size_t errlen)
{
	size_t len;

	snprintf(err, errlen, "the snapshot is not inside a snapshot directory of this daemon (");
	for (const struct snapdir *sd = d->snapdirs; sd; sd = sd->next) {
		len = strlen(err);
		snprintf(err + len, errlen - len, "%s--snapshot-dir %s", sd == d->snapdirs ? "" : ", ",
			 sd->path);
	}
	len = strlen(err);
	snprintf(err + len, errlen - len, ")");
	return 403;
}

unsigned snapdir_open(struct cloned *d, const char *path, int *out, char *err, size_t errlen)
{
	const struct snapdir *sd;
	const char *rest = NULL;
	struct stat st;
	int fd;

	if (!d->snapdirs) {
		snprintf(err, errlen, "this daemon takes no snapshots: start " PROG " with "
			 "--snapshot-dir DIR (snapshots are read from there only)");
		return 403;
	}
	if (path[0] != '/') {
		snprintf(err, errlen, "field 'snapshot' must be an absolute path (a string)");
		return 400;
	}
	if (bad_components(path)) {
		snprintf(err, errlen, "snapshot %s: empty, '.' and '..' components are not allowed",
			 path);
		return 400;
	}
	for (sd = d->snapdirs; sd && !rest; sd = sd->next) {
		size_t n = strlen(sd->path);

		if (n == 1) /* "/" */
			rest = path + 1;
		else if (!strncmp(path, sd->path, n) && path[n] == '/')
			rest = path + n + 1;
		if (rest)
			break;
	}
	if (!rest || !*rest)
		return outside(d, err, errlen);
	fd = sys_openat2(sd->fd, rest, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
			 RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
	if (fd < 0) {
		if (errno == EXDEV)
			return outside(d, err, errlen); /* a link that leads out */
		if (errno == ENOSYS) {
			snprintf(err, errlen, "snapshot %s: this kernel has no openat2 (Linux 5.6): "
				 "snapshots cannot be opened safely", path);
			return 500;
		}
		snprintf(err, errlen, "snapshot %s: %s", path, strerror(errno));
		return 400;
	}
	if (fstat(fd, &st)) {
		snprintf(err, errlen, "snapshot %s: %s", path, strerror(errno));
		close(fd);
		return 400;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "snapshot %s is not a regular file (%s)", path,
			 S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory" :
			 S_ISSOCK(st.st_mode) ? "a socket" : S_ISCHR(st.st_mode) ||
			 S_ISBLK(st.st_mode) ? "a device" : "a special file");
		close(fd);
		return 400;
	}
	if (st.st_uid != 0 && st.st_uid != geteuid()) {
		snprintf(err, errlen, "snapshot %s is owned by uid %u: snapshots must belong to root "
			 "or this daemon's uid %u (chown it)", path, (unsigned)st.st_uid,
			 (unsigned)geteuid());
		close(fd);
		return 400;
	}
	if (st.st_mode & 022) {
		snprintf(err, errlen, "snapshot %s is writable by group or others (mode %04o): "
			 "chmod go-w it", path, (unsigned)(st.st_mode & 07777));
		close(fd);
		return 400;
	}
	/* Opened without blocking (a FIFO would have); read as a file from here on. */
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)) {
		snprintf(err, errlen, "snapshot %s: %s", path, strerror(errno));
		close(fd);
		return 500;
	}
	*out = fd;
	return 0;
}
