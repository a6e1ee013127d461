// SPDX-License-Identifier: MIT
/* halite-cloned: logging, ids, paths, directories, /proc. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cloned.h"

static const char *const level_name[] = { "error", "warn", "info", "debug" };

static void vlog(int level, const char *fmt, va_list ap)
{
	char msg[2048], ts[32];
	struct timespec now;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	/* One write per line: lines from several threads never interleave. */
	fprintf(stderr, "%s.%03ldZ " PROG ": %s: %s\n", ts, now.tv_nsec / 1000000,
		level_name[level < 0 ? 0 : level > 3 ? 3 : level], msg);
}

void cl_log(const struct cloned *d, int level, const char *fmt, ...)
{
	va_list ap;

	if (d && level > d->o.log_level)
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void cl_engine_log(void *ctx, int level, const char *msg)
{
	cl_log(ctx, level, "engine: %s", msg);
}

int cl_random_id(char *out, char prefix)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		return -errno;
	snprintf(out, CLONED_ID_LEN + 1, "%c-%08x", prefix, v);
	return 0;
}

/* Ids become file names: only what cl_random_id() makes is accepted. */
bool cl_valid_id(const char *s, char prefix)
{
	if (strlen(s) != CLONED_ID_LEN || s[0] != prefix || s[1] != '-')
		return false;
	for (int i = 2; i < CLONED_ID_LEN; i++)
		if (!strchr("0123456789abcdef", s[i]))
			return false;
	return true;
}

int cl_mkdir_p(const char *path, mode_t mode)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, mode) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, mode) && errno != EEXIST)
		return -errno;
	return 0;
}

static const char *user_name(uid_t uid)
{
	struct passwd *pw = getpwuid(uid);

	return pw ? pw->pw_name : "no such user";
}

/*
 * One of the daemon's own directories (--state-dir, --mem-dir): made 0700
 * where missing, and refused unless it is the daemon's uid's and writable by
 * nobody else, and no component on the way is a symlink of another user (who
 * could point it elsewhere at will). Root's links (/var/run) are trusted.
 * 0, or -1 with the sentence and the fix in @err.
 */
int cl_own_dir(const char *path, const char *opt, char *err, size_t errlen)
{
	char buf[4096];
	size_t n = strlen(path);
	uid_t me = geteuid();
	struct stat st;

	if (path[0] != '/' || n >= sizeof(buf)) {
		snprintf(err, errlen, "%s %s: want an absolute path", opt, path);
		return -1;
	}
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1;; p++) {
		bool last = !*p;

		if (*p && *p != '/')
			continue;
		*p = 0;
		/* the directories on the way are anyone's to pass, as mkdir -p makes them */
		if (lstat(buf, &st) && errno == ENOENT && mkdir(buf, last ? 0700 : 0755) &&
		    errno != EEXIST) {
			snprintf(err, errlen, "%s %s: creating %s: %s", opt, path, buf,
				 strerror(errno));
			return -1;
		}
		if (lstat(buf, &st)) {
			snprintf(err, errlen, "%s %s: %s: %s", opt, path, buf, strerror(errno));
			return -1;
		}
		if (S_ISLNK(st.st_mode) && st.st_uid != 0 && st.st_uid != me) {
			snprintf(err, errlen, "%s %s: %s is a symbolic link owned by uid %u (%s), "
				 "who could point it anywhere: use a path without it", opt, path,
				 buf, (unsigned)st.st_uid, user_name(st.st_uid));
			return -1;
		}
		if (last)
			break;
		*p = '/';
	}
	if (stat(path, &st)) {
		snprintf(err, errlen, "%s %s: %s", opt, path, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s %s is not a directory", opt, path);
		return -1;
	}
	if (st.st_uid != me || (st.st_mode & 022)) {
		snprintf(err, errlen, "%s %s is owned by uid %u (%s) with mode %04o: it must be "
			 "this daemon's (uid %u) and writable by no one else: chown %u %s && "
			 "chmod 700 %s", opt, path, (unsigned)st.st_uid, user_name(st.st_uid),
			 (unsigned)(st.st_mode & 07777), (unsigned)me, (unsigned)me, path, path);
		return -1;
	}
	/* Ours: nobody else reads it either (an older daemon made it 0750). */
	if ((st.st_mode & 077) && chmod(path, 0700)) {
		snprintf(err, errlen, "%s %s: chmod 700: %s", opt, path, strerror(errno));
		return -1;
	}
	return 0;
}

/* A clone's or template's own files: one directory level, no symlinks followed. */
int cl_rm_rf(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;

	if (!dir)
		return errno == ENOENT ? 0 : -errno;
	while ((e = readdir(dir))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		unlinkat(dirfd(dir), e->d_name, 0);
	}
	closedir(dir);
	return rmdir(path) ? -errno : 0;
}

char *cl_path(const char *dir, const char *a, const char *b)
{
	char *p;

	if (asprintf(&p, "%s/%s%s", dir, a, b ? b : "") < 0)
		return NULL;
	return p;
}

int cl_proc_starttime(pid_t pid, uint64_t *st)
{
	char path[64], buf[1024], *p;
	unsigned long long v;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -ESRCH;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -ESRCH;
	buf[n] = 0;
	/* comm may hold spaces and parentheses: fields start after the last ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return -ESRCH;
	p++;
	/* p is at field 3 (state); a zombie is gone for us */
	if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X'))
		return -ESRCH;
	for (int field = 3; field < 22; field++) {
		p = strchr(p + 1, ' ');
		if (!p)
			return -ESRCH;
	}
	if (sscanf(p, " %llu", &v) != 1)
		return -ESRCH;
	*st = v;
	return 0;
}

char *cl_errstr(int err)
{
	if (err < 0)
		err = -err;
	return (char *)(err >= HALITE_E_BASE ? halite_strerror(err) : strerror(err));
}

/* The handlers' replies (api.c sends them). */
void reply_json(struct http_reply *r, unsigned status, cJSON *j)
{
	cJSON_Delete(r->json);
	r->status = status;
	r->json = j;
}

void reply_error(struct http_reply *r, unsigned status, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	cJSON *j = cJSON_CreateObject();

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cJSON_AddStringToObject(j, "error", msg);
	reply_json(r, status, j);
}

/* Whether @name is listed in the NUL-separated @list (qemu.device-ram). */
bool cl_in_list(const char *list, uint32_t len, const char *name)
{
	for (const char *p = list; list && p < list + len; p += strlen(p) + 1)
		if (!strcmp(p, name)) /* the list's last byte is a NUL: checked */
			return true;
	return false;
}
