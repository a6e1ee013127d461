// SPDX-License-Identifier: MIT
/*
 * The server side of a clone's control socket (protocol in
 * testing/synth/cmd_clone.c and tools/halite-qemu/clone.c; client: clone_ctl.c):
 * one connection at a time, newline-terminated commands, one JSON line
 * answers each, a descriptor riding with a reply as SCM_RIGHTS. The
 * commands are the caller's; framing, replies and the socket are here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "clone_srv.h"

cJSON *clone_srv_error(const char *fmt, ...)
{
	char msg[1400];
	va_list ap;
	cJSON *r = cJSON_CreateObject();

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r)
		cJSON_AddStringToObject(r, "error", msg);
	return r;
}

cJSON *clone_srv_ok(void)
{
	cJSON *r = cJSON_CreateObject();

	if (r)
		cJSON_AddTrueToObject(r, "ok");
	return r;
}

/* One JSON line to @fd, with @pass_fd attached (SCM_RIGHTS) if >= 0. */
static int send_reply(int fd, cJSON *r, int pass_fd)
{
	char *s = r ? cJSON_PrintUnformatted(r) : NULL;
	size_t n, off = 0;
	int ret = 0;

	if (!s) {
		/* Out of memory: still one line, the client keeps in step. */
		static const char oom[] = "{\"error\":\"out of memory\"}";

		s = strdup(oom);
		if (!s)
			return -ENOMEM;
	}
	n = strlen(s);
	s[n] = '\n'; /* over the NUL: the length is known */
	n++;
	if (pass_fd >= 0) {
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { s, n };
		struct msghdr mh = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf),
		};
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		ssize_t w;

		memset(&ctl, 0, sizeof(ctl));
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
		/* The descriptor goes with the first bytes only. */
		do
			w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		while (w < 0 && errno == EINTR);
		if (w < 0)
			ret = -errno;
		else
			off = (size_t)w;
	}
	while (!ret && off < n) {
		ssize_t w = send(fd, s + off, n - off, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			ret = -errno;
		else
			off += (size_t)w;
	}
	free(s); /* cJSON's allocator is the default one (never cJSON_InitHooks'd) */
	return ret;
}

/* Wait for @fd to be readable, or @watch_fd: 0, 1 for @watch_fd, -errno. */
static int wait_in(int fd, int watch_fd)
{
	for (;;) {
		struct pollfd p[2] = { { fd, POLLIN, 0 }, { watch_fd, POLLIN, 0 } };

		if (poll(p, watch_fd >= 0 ? 2 : 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (watch_fd >= 0 && p[1].revents)
			return 1;
		if (p[0].revents)
			return 0;
	}
}

/* Serve one connection until EOF, an I/O error, quit or @watch_fd (1). */
static int serve(int cfd, int watch_fd, clone_srv_fn *fn, void *ctx, bool *quit)
{
	char buf[CLONE_SRV_LINE_MAX + 1];
	size_t have = 0;
	bool skipping = false; /* in a line too long: dropping it up to its newline */

	while (!*quit) {
		ssize_t rd;
		char *nl;
		int w = watch_fd >= 0 ? wait_in(cfd, watch_fd) : 0;

		if (w)
			return w > 0 ? 1 : 0;
		rd = recv(cfd, buf + have, CLONE_SRV_LINE_MAX - have, 0);
		if (rd < 0 && errno == EINTR)
			continue;
		if (rd <= 0)
			return 0;
		have += (size_t)rd;
		while (!*quit && (nl = memchr(buf, '\n', have))) {
			size_t len = (size_t)(nl - buf);
			int pass_fd = -1;
			cJSON *r;

			*nl = '\0';
			if (skipping) {
				skipping = false;
				r = clone_srv_error("command too long (over %u bytes)",
						    CLONE_SRV_LINE_MAX);
			} else if (memchr(buf, '\0', len)) {
				r = clone_srv_error("a NUL byte in the command");
			} else {
				r = fn(ctx, buf, &pass_fd, quit);
			}
			if (send_reply(cfd, r, pass_fd)) {
				cJSON_Delete(r);
				return 0;
			}
			cJSON_Delete(r);
			memmove(buf, nl + 1, have - len - 1);
			have -= len + 1;
		}
		if (have == CLONE_SRV_LINE_MAX) {
			skipping = true;
			have = 0;
		}
	}
	return 0;
}

int clone_srv_run(int lfd, int watch_fd, clone_srv_fn *fn, void *ctx)
{
	bool quit = false;

	while (!quit) {
		int cfd, ret;

		ret = watch_fd >= 0 ? wait_in(lfd, watch_fd) : 0;
		if (ret)
			return ret;
		cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			return -errno;
		}
		ret = serve(cfd, watch_fd, fn, ctx, &quit);
		close(cfd);
		if (ret)
			return ret;
	}
	return 0;
}

int clone_srv_listen(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old;
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "--control %s: longer than %zu bytes", path,
			 sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* A stale socket of an earlier clone goes; anything else is not ours to remove. */
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "--control %s exists and is not a socket", path);
			return -EEXIST;
		}
		if (unlink(path) && errno != ENOENT) {
			ret = -errno;
			snprintf(err, errlen, "removing the stale socket %s: %s", path,
				 strerror(errno));
			return ret;
		}
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return ret;
	}
	old = umask(077); /* created 0600 (0700 & ~x is what bind gives unix sockets) */
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
	umask(old);
	if (!ret && chmod(path, 0600))
		ret = -errno;
	if (!ret && listen(fd, 4))
		ret = -errno;
	if (ret) {
		snprintf(err, errlen, "--control %s: %s", path, strerror(-ret));
		close(fd);
		return ret;
	}
	return fd;
}
