// SPDX-License-Identifier: MIT
/*
 * Before a restore's QEMU starts: the sockets it would listen on and the
 * memory files it would map, checked not in use by another process on the
 * host (vmconfig.h, hq_cmdline_check_host()).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>


#include "proc.h"
#include "vmconfig.h"

/* --- the host: sockets and memory files in use --- */

/* @path relative to @cwd unless absolute, into @out; false if it does not fit. */
static bool at_cwd(const char *cwd, const char *path, char *out, size_t len)
{
	int n = path[0] == '/' || !cwd ? snprintf(out, len, "%s", path) :
		snprintf(out, len, "%s/%s", cwd, path);

	return n > 0 && (size_t)n < len;
}

static pid_t unix_listener_now(const char *path);

/* Whether @pid is exiting: its main thread a zombie, others maybe still tearing down. */
static bool exiting(pid_t pid)
{
	char st = hq_proc_state(pid);

	return !st || st == '?' || st == 'Z' || st == 'X';
}

/*
 * Someone listens on the unix socket @path: its pid (or 0 if unknown); -1
 * if nobody. A QEMU killed a moment ago still listens while its last
 * threads exit: it is waited for (up to 2 s), then taken as gone.
 */
static pid_t unix_listener(const char *path)
{
	pid_t pid = -1;

	for (int i = 0; i < 100; i++) {
		pid = unix_listener_now(path);
		if (pid <= 0 || !exiting(pid))
			return pid;
		usleep(20000);
	}
	return -1;
}

static pid_t unix_listener_now(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred = { 0 };
	socklen_t cl = sizeof(cred);
	pid_t pid = -1;
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		pid = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) ? 0 : cred.pid;
	close(fd);
	return pid;
}

/* A process (not us) that maps @path: its pid, or 0. */
static pid_t mapper(const char *path)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	size_t plen = strlen(path);
	pid_t found = 0;
	char line[4096];

	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		char maps[300];
		FILE *f;

		if (!isdigit((unsigned char)e->d_name[0]) || atoi(e->d_name) == getpid() ||
		    exiting(atoi(e->d_name)))
			continue;
		snprintf(maps, sizeof(maps), "/proc/%s/maps", e->d_name);
		f = fopen(maps, "re");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			size_t l = strlen(line);
			char *p;

			if (l && line[l - 1] == '\n')
				line[--l] = '\0';
			p = strchr(line, '/');
			if (p && (size_t)(line + l - p) == plen && !strcmp(p, path)) {
				found = atoi(e->d_name);
				break;
			}
		}
		fclose(f);
	}
	closedir(d);
	return found;
}

static void comm(pid_t pid, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(buf, len, "?");
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n > 0) {
		buf[n] = '\0';
		buf[strcspn(buf, "\n")] = '\0';
	}
}

/* A unix socket QEMU would listen on for this option: its path into @out. */
static bool server_socket(const struct hq_opt *o, char *out, size_t len)
{
	struct hq_kvs kv = { 0 };
	const char *path = NULL, *srv;
	bool yes = false;

	if (!o->arg)
		return false;
	if (!strcmp(o->name, "chardev")) {
		if (hq_kvs_split(o->arg, "backend", &kv))
			return false;
		if (hq_kvs_get(&kv, "backend") && !strcmp(hq_kvs_get(&kv, "backend"), "socket"))
			path = hq_kvs_get(&kv, "path");
	} else if (!strcmp(o->name, "qmp") || !strcmp(o->name, "qmp-pretty") ||
		   !strcmp(o->name, "monitor") || !strcmp(o->name, "serial") ||
		   !strcmp(o->name, "parallel") || !strcmp(o->name, "gdb")) {
		/* The legacy syntax: "unix:PATH,server=on,wait=off". */
		if (strncmp(o->arg, "unix:", 5) || hq_kvs_split(o->arg + 5, "path", &kv))
			return false;
		path = hq_kvs_get(&kv, "path");
	}
	if (path) {
		srv = hq_kvs_has(&kv, "server") ? hq_kvs_get(&kv, "server") : "off";
		yes = !srv || !strcmp(srv, "on") || !strcmp(srv, "yes") || !strcmp(srv, "true");
		if (yes)
			snprintf(out, len, "%s", path);
	}
	hq_kvs_free(&kv);
	return yes;
}

int hq_cmdline_check_host(char *const *argv, int argc, const char *cwd, char *err,
			  size_t errlen)
{
	struct hq_opt *opts = NULL;
	char path[4096], name[32];
	int n = 0, ret;

	if (argc < 1)
		return 0;
	ret = hq_opts_parse(argv + 1, argc - 1, &opts, &n, err, errlen);
	if (ret)
		return ret;
	for (int i = 0; i < n && !ret; i++) {
		const struct hq_opt *o = &opts[i];
		char sock[4096];
		struct stat st;
		pid_t pid;

		if (server_socket(o, sock, sizeof(sock)) && at_cwd(cwd, sock, path, sizeof(path)) &&
		    (pid = unix_listener(path)) >= 0) {
			comm(pid, name, sizeof(name));
			snprintf(err, errlen, "-%s %s: the socket %s is in use (process %d, %s, "
				 "listens on it; the source QEMU still running?): QEMU would take "
				 "its path over", o->name, o->arg, path, (int)pid, name);
			ret = -EADDRINUSE;
		} else if (o->arg && (!strcmp(o->name, "object") || !strcmp(o->name, "mem-path"))) {
			struct hq_kvs kv = { 0 };
			const char *mp = NULL;

			if (!strcmp(o->name, "mem-path"))
				mp = o->arg;
			else if (!hq_kvs_split(o->arg, "qom-type", &kv) && hq_kvs_get(&kv, "qom-type") &&
				 !strcmp(hq_kvs_get(&kv, "qom-type"), "memory-backend-file"))
				mp = hq_kvs_get(&kv, "mem-path");
			/* A directory gets a new file of QEMU's; a file is shared with whoever maps it. */
			if (mp && at_cwd(cwd, mp, path, sizeof(path)) && !stat(path, &st) &&
			    S_ISREG(st.st_mode) && (pid = mapper(path)) > 0) {
				comm(pid, name, sizeof(name));
				snprintf(err, errlen, "-%s %s: the memory file %s is mapped by process "
					 "%d (%s; the source QEMU still running?): a restore empties its "
					 "guest RAM's file, which would punch that process's memory: give "
					 "another mem-path", o->name, o->arg, path, (int)pid, name);
				ret = -EBUSY;
			}
			hq_kvs_free(&kv);
		}
	}
	free(opts);
	return ret;
}
