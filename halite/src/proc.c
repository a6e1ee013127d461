// SPDX-License-Identifier: MIT
/* Another process's descriptors, read from /proc (proc.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

int halite_proc_find_uffd(pid_t pid, int *fdnum)
{
	char path[64], link[64];
	struct dirent *e;
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return -errno;
	while ((e = readdir(dir))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		/* A link longer than @link comes back cut short, and so never matches. */
		k = readlinkat(dirfd(dir), e->d_name, link, sizeof(link) - 1);
		if (k <= 0)
			continue;
		link[k] = '\0';
		if (strcmp(link, "anon_inode:[userfaultfd]"))
			continue;
		if (!n++)
			*fdnum = atoi(e->d_name);
	}
	closedir(dir);
	return n;
}
