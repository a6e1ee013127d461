// SPDX-License-Identifier: MIT
/* What /proc says of a process (proc.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

#define MAX_PROC_FILE (4u << 20)

/* A whole /proc file (its size is unknown beforehand); *len its length. */
char *hq_read_proc(pid_t pid, const char *what, size_t *len)
{
	char path[64], *buf = NULL;
	size_t used = 0, cap = 0;
	ssize_t k;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	do {
		if (used + 4096 > cap) {
			char *b = cap < MAX_PROC_FILE ? realloc(buf, cap + 65536) : NULL;

			if (!b) {
				free(buf);
				close(fd);
				errno = ENOMEM;
				return NULL;
			}
			buf = b;
			cap += 65536;
		}
		k = read(fd, buf + used, cap - used - 1);
		if (k > 0)
			used += (size_t)k;
	} while (k > 0);
	close(fd);
	if (k < 0) {
		free(buf);
		return NULL;
	}
	buf[used] = '\0';
	*len = used;
	return buf;
}

int hq_proc_status(pid_t pid, struct hq_proc_status *st)
{
	size_t len;
	char *buf = hq_read_proc(pid, "status", &len), *line, *save = NULL;
	unsigned long r, e;

	*st = (struct hq_proc_status){ .euid = (uid_t)-1, .egid = (gid_t)-1 };
	if (!buf)
		return -errno;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (sscanf(line, "Uid: %lu %lu", &r, &e) == 2)
			st->euid = (uid_t)e;
		else if (sscanf(line, "Gid: %lu %lu", &r, &e) == 2)
			st->egid = (gid_t)e;
		else if (sscanf(line, "CapEff: %llx", &st->cap_eff) == 1)
			continue;
		else
			sscanf(line, "Seccomp: %d", &st->seccomp);
	}
	free(buf);
	return 0;
}

char hq_proc_state(pid_t pid)
{
	size_t len;
	char *buf = hq_read_proc(pid, "stat", &len), *p, s;

	if (!buf)
		return errno == ENOENT ? 0 : '?';
	/* After the command name, which may hold anything but ends at the last ')'. */
	p = strrchr(buf, ')');
	s = p && p[1] == ' ' && p[2] ? p[2] : '?';
	free(buf);
	return s;
}

int hq_proc_fds_to(pid_t pid, const char *target, int *fds, int max)
{
	char dir[64], path[64 + 256], link[PATH_MAX];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		k = readlink(path, link, sizeof(link) - 1);
		if (k <= 0)
			continue;
		link[k] = '\0';
		if (strcmp(link, target))
			continue;
		if (n < max)
			fds[n] = atoi(e->d_name);
		n++;
	}
	closedir(d);
	return n;
}
