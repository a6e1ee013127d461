// SPDX-License-Identifier: MIT
/*
 * What halite-qemu leaves on the host while it works, and the clean-up of
 * what killed runs left: the records in HQ_ASIDE_DIR (a save's of private
 * RAM moved aside, a restore's for a take-over), and the work directories
 * in /tmp. A leaf: it knows paths and processes, no QEMU.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "records.h"

bool hq_aside_record_path(pid_t pid, char *buf, size_t len)
{
	snprintf(buf, len, HQ_ASIDE_DIR "/qemu-%d.save", (int)pid);
	return !access(buf, F_OK);
}


void hq_records_prune(void)
{
	DIR *d = opendir(HQ_ASIDE_DIR);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		int pid = 0, n = 0;

		if (sscanf(e->d_name, "qemu-%d.%*[a-z]%n", &pid, &n) != 1 || !n ||
		    (strcmp(e->d_name + n - 5, ".save") && strcmp(e->d_name + n - 8, ".restore")) ||
		    e->d_name[n] || pid <= 0 || hq_proc_state(pid))
			continue;
		unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

/* Does a QEMU listen on the socket @path? (connect succeeds: queued if not yet accepted) */
static bool listening(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd, ok;

	if (strlen(path) >= sizeof(a.sun_path))
		return true; /* cannot tell: keep it */
	strcpy(a.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return true;
	ok = !connect(fd, (struct sockaddr *)&a, sizeof(a)) || errno != ECONNREFUSED;
	close(fd);
	return ok;
}

void hq_tmpdirs_prune(void)
{
	/* What halite-qemu puts there (restore.c, vm.c): nothing else is removed. */
	static const char *const ours[] = { "qmp.sock", "in.sock", "qemu.log", "devices" };
	DIR *d = opendir("/tmp");
	struct dirent *e;
	char dir[PATH_MAX], path[PATH_MAX + 16];
	struct stat st;

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, "halite-qemu.", 12) || strlen(e->d_name) != 18)
			continue;
		snprintf(dir, sizeof(dir), "/tmp/%s", e->d_name);
		if (lstat(dir, &st) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
		    time(NULL) - st.st_mtime < HQ_TMPDIR_STALE_S)
			continue;
		snprintf(path, sizeof(path), "%s/qmp.sock", dir);
		if (!lstat(path, &st) && listening(path))
			continue; /* its QEMU runs on: a take-over may need it */
		for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
			snprintf(path, sizeof(path), "%s/%s", dir, ours[i]);
			unlink(path);
		}
		rmdir(dir); /* fails, and leaves it, if anything else is in it */
	}
	closedir(d);
}
