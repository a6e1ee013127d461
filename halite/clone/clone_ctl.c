// SPDX-License-Identifier: MIT
/*
 * The client side of a synthetic clone's control socket (halite-synth
 * clone --control, protocol in testing/synth/cmd_clone.c): one line command, one
 * JSON line reply; `uffd` brings the userfaultfd created inside the clone
 * as SCM_RIGHTS. One connection per command, so a command that blocks in
 * the clone (it touched memory no one serves) never holds up the next one,
 * and every wait is bounded. Used by halite-cloned and halite-bench clones.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "clone_ctl.h"
#include "stats.h"

int ctl_connect(const char *path, int timeout_ms)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A unix stream connect does not wait for accept(): no timeout needed. */
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

static int wait_fd(int fd, short ev, uint64_t deadline)
{
	uint64_t now = halite_now_ns();
	struct pollfd p = { .fd = fd, .events = ev };
	int n;

	if (now >= deadline)
		return -ETIMEDOUT;
	n = poll(&p, 1, (int)((deadline - now) / 1000000) + 1);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	return n == 0 ? -ETIMEDOUT : 0;
}

int ctl_command(const char *sock, const char *cmd, cJSON **reply, int *fdp, int timeout_ms,
		char *err, size_t errlen)
{
	uint64_t deadline = halite_now_ns() + (uint64_t)timeout_ms * 1000000u;
	char line[4096], buf[8192];
	size_t len = 0, n = (size_t)snprintf(line, sizeof(line), "%s\n", cmd);
	int fd, got_fd = -1, ret;
	cJSON *j, *e;

	fd = ctl_connect(sock, timeout_ms);
	if (fd < 0) {
		snprintf(err, errlen, "control socket %s: %s", sock, strerror(-fd));
		return fd;
	}
	if (send(fd, line, n, MSG_NOSIGNAL) != (ssize_t)n) {
		ret = -errno;
		snprintf(err, errlen, "control socket: sending '%s': %s", cmd, strerror(errno));
		goto out;
	}
	for (;;) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cb;
		struct iovec iov = { buf + len, sizeof(buf) - 1 - len };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
				    .msg_controllen = sizeof(cb.b) };
		ssize_t r;

		ret = wait_fd(fd, POLLIN, deadline);
		if (ret) {
			snprintf(err, errlen, "control socket: no reply to '%s' within %d ms", cmd,
				 timeout_ms);
			goto out;
		}
		r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (r < 0) {
			ret = -errno;
			snprintf(err, errlen, "control socket: '%s': %s", cmd, strerror(errno));
			goto out;
		}
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
			    c->cmsg_len == CMSG_LEN(sizeof(int))) {
				if (got_fd >= 0)
					close(got_fd);
				memcpy(&got_fd, CMSG_DATA(c), sizeof(int));
			}
		if (r == 0) {
			ret = -ECONNRESET;
			snprintf(err, errlen, "control socket: the clone closed it on '%s'", cmd);
			goto out;
		}
		len += (size_t)r;
		buf[len] = 0;
		if (memchr(buf, '\n', len))
			break;
		if (len == sizeof(buf) - 1) {
			ret = -EPROTO;
			snprintf(err, errlen, "control socket: reply to '%s' too long", cmd);
			goto out;
		}
	}
	j = cJSON_Parse(buf);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		ret = -EPROTO;
		snprintf(err, errlen, "control socket: reply to '%s' is not a JSON object: %.200s",
			 cmd, buf);
		goto out;
	}
	e = cJSON_GetObjectItemCaseSensitive(j, "error");
	if (e) {
		snprintf(err, errlen, "clone refused '%s': %s", cmd,
			 cJSON_IsString(e) ? e->valuestring : "(no message)");
		cJSON_Delete(j);
		ret = -EPROTO;
		goto out;
	}
	if (fdp) {
		if (got_fd < 0) {
			cJSON_Delete(j);
			ret = -EPROTO;
			snprintf(err, errlen, "control socket: '%s' brought no descriptor", cmd);
			goto out;
		}
		*fdp = got_fd;
		got_fd = -1;
	}
	if (reply)
		*reply = j;
	else
		cJSON_Delete(j);
	ret = 0;
out:
	if (got_fd >= 0)
		close(got_fd);
	close(fd);
	return ret;
}
