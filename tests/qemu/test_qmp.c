// SPDX-License-Identifier: MIT
/*
 * halite-qemu's QMP client (halite/qemu/qmp.c) against a scripted
 * server on a unix socket: the greeting in pieces, several messages in one
 * write, events before and between replies, a late reply to an abandoned
 * call, an error reply, a 1 MiB reply, no reply (timeout), the server
 * going away, a reconnect, a wait ended by the abort function, and a reply
 * never awaited. No QEMU needed; every result is checked exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "qmp.h"

static char sock_path[108];

static long hq_now_test_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void put(int fd, const char *s)
{
	size_t n = strlen(s);

	if (write(fd, s, n) != (ssize_t)n)
		abort();
}

/* The next request's id (requests are one line each). */
static long next_id(int fd, char *cmd, size_t len)
{
	char line[4096];
	size_t n = 0;
	cJSON *j;
	long id;

	while (n < sizeof(line) - 1 && read(fd, line + n, 1) == 1 && line[n] != '\n')
		n++;
	line[n] = '\0';
	j = cJSON_Parse(line);
	id = (long)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "id"));
	snprintf(cmd, len, "%s", cJSON_GetStringValue(cJSON_GetObjectItem(j, "execute")) ?: "");
	cJSON_Delete(j);
	return id;
}

static void *server(void *arg)
{
	int lfd = *(int *)arg, fd;
	char buf[256], cmd[64];
	long id, old, cur;

	fd = accept(lfd, NULL, NULL);
	/* The greeting in two writes. */
	put(fd, "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, ");
	usleep(20000);
	put(fd, "\"major\": 7}, \"package\": \"\"}, \"capabilities\": []}}\r\n");
	id = next_id(fd, cmd, sizeof(cmd));
	/* An event and the reply in one write. */
	snprintf(buf, sizeof(buf), "{\"event\": \"EV1\", \"data\": {\"n\": 1}}\n"
		 "{\"return\": {}, \"id\": %ld}\n", id);
	put(fd, buf);
	/* call 1: query-status; a late reply for an old id first, then the right one. */
	id = next_id(fd, cmd, sizeof(cmd));
	snprintf(buf, sizeof(buf), "{\"return\": {\"status\": \"stale\"}, \"id\": %ld}\n"
		 "{\"event\": \"EV2\"}\n{\"return\": {\"status\": \"%s\"}, \"id\": %ld}\n",
		 id + 1000, strcmp(cmd, "query-status") ? "wrong-command" : "running", id);
	put(fd, buf);
	/* call 2: an error. */
	id = next_id(fd, cmd, sizeof(cmd));
	snprintf(buf, sizeof(buf), "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": "
		 "\"The command %s has not been found\"}, \"id\": %ld}\n", cmd, id);
	put(fd, buf);
	/* call 3: human-monitor-command with a 1 MiB answer, written in pieces. */
	id = next_id(fd, cmd, sizeof(cmd));
	put(fd, "{\"return\": \"");
	for (int i = 0; i < 1024; i++) {
		char kb[1025];

		memset(kb, 'a' + i % 26, 1024);
		kb[1024] = '\0';
		put(fd, kb);
	}
	snprintf(buf, sizeof(buf), "\", \"id\": %ld}\n", id);
	put(fd, buf);
	/* call 4: no answer (the client times out), then the late answer arrives. */
	id = next_id(fd, cmd, sizeof(cmd));
	usleep(300000);
	snprintf(buf, sizeof(buf), "{\"return\": {}, \"id\": %ld}\n", id);
	put(fd, buf);
	/* call 5: answered, after which the server goes away. */
	id = next_id(fd, cmd, sizeof(cmd));
	snprintf(buf, sizeof(buf), "{\"return\": 5, \"id\": %ld}\n", id);
	put(fd, buf);
	id = next_id(fd, cmd, sizeof(cmd));
	close(fd);

	/* The client connects again. */
	fd = accept(lfd, NULL, NULL);
	put(fd, "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, "
		"\"major\": 7}, \"package\": \"\"}, \"capabilities\": []}}\r\n");
	id = next_id(fd, cmd, sizeof(cmd));
	snprintf(buf, sizeof(buf), "{\"return\": {}, \"id\": %ld}\n", id);
	put(fd, buf);
	/* "hang": answered only with the next one (the client gave up on it). */
	id = next_id(fd, cmd, sizeof(cmd));
	/* "lost": sent without waiting; then "six". */
	old = next_id(fd, cmd, sizeof(cmd));
	cur = next_id(fd, cmd, sizeof(cmd));
	snprintf(buf, sizeof(buf), "{\"return\": 1, \"id\": %ld}\n{\"return\": 2, \"id\": %ld}\n"
		 "{\"return\": 6, \"id\": %ld}\n", id, old, cur);
	put(fd, buf);
	next_id(fd, cmd, sizeof(cmd));
	close(fd);
	return NULL;
}

static int abort_after_50ms(void *ctx)
{
	return hq_now_test_ms() - *(long *)ctx >= 50 ? -ECANCELED : 0;
}

int main(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct hq_qmp *q = NULL;
	char dir[] = "/tmp/test_qmp.XXXXXX", err[512] = "", *text = NULL;
	cJSON *ret = NULL, *data = NULL;
	int lfd, r, major, minor, micro;
	long t0, t1;
	pthread_t t;

	if (!mkdtemp(dir))
		return 1;
	snprintf(sock_path, sizeof(sock_path), "%s/qmp.sock", dir);
	/* Nothing listening yet: refused at once without a timeout. */
	r = hq_qmp_connect(&q, sock_path, 0, err, sizeof(err));
	CHECK(r == -ENOENT && strstr(err, sock_path), "no socket: %d %s", r, err);
	memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 1))
		return 1;
	pthread_create(&t, NULL, server, &lfd);

	r = hq_qmp_connect(&q, sock_path, 1000, err, sizeof(err));
	CHECK(r == 0, "connect: %d %s", r, err);
	if (r) {
		printf("FAIL\n");
		return 1;
	}
	hq_qmp_version(q, &major, &minor, &micro);
	CHECK(major == 7 && minor == 2 && micro == 22, "version %d.%d.%d", major, minor, micro);
	CHECK(hq_qmp_peer_pid(q) == getpid(), "peer pid %d", (int)hq_qmp_peer_pid(q));

	r = hq_qmp_call(q, "query-status", NULL, &ret, 1000);
	CHECK(r == 0 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ret, "status")) ?: "",
				 "running"), "the reply with our id, not the stale one: %d", r);
	cJSON_Delete(ret);
	ret = NULL;

	r = hq_qmp_call(q, "no-such-command", NULL, &ret, 1000);
	CHECK(r == -EIO && !strcmp(hq_qmp_errmsg(q), "no-such-command: CommandNotFound: The "
				   "command no-such-command has not been found") && !ret,
	      "error reply: %d '%s'", r, hq_qmp_errmsg(q));

	r = hq_qmp_hmp(q, "info big", &text, 5000);
	CHECK(r == 0 && text && strlen(text) == 1 << 20 && text[0] == 'a' &&
	      text[(1 << 20) - 1] == 'a' + 1023 % 26, "1 MiB HMP answer: %d %zu", r,
	      text ? strlen(text) : 0);
	free(text);

	r = hq_qmp_call(q, "slow", NULL, NULL, 100);
	CHECK(r == -ETIMEDOUT && strstr(hq_qmp_errmsg(q), "slow"), "timeout: %d", r);
	/* Its late answer must not be taken for the next call's. */
	r = hq_qmp_call(q, "five", NULL, &ret, 2000);
	CHECK(r == 0 && cJSON_IsNumber(ret) && ret->valuedouble == 5, "after a timeout: %d", r);
	cJSON_Delete(ret);

	/* Events queued during the calls, in order. */
	r = hq_qmp_wait_event(q, "EV2", &data, 0);
	CHECK(r == 0 && !data, "EV2 (no data): %d", r);
	r = hq_qmp_wait_event(q, "EV1", &data, 0);
	CHECK(r == 0 && data && cJSON_GetNumberValue(cJSON_GetObjectItem(data, "n")) == 1,
	      "EV1 with its data: %d", r);
	cJSON_Delete(data);
	r = hq_qmp_wait_event(q, "EV1", &data, 50);
	CHECK(r == -ETIMEDOUT, "EV1 only once: %d", r);

	r = hq_qmp_call(q, "gone", NULL, NULL, 2000);
	CHECK(r == -ECONNRESET, "server gone: %d '%s'", r, hq_qmp_errmsg(q));
	CHECK(!hq_qmp_usable(q), "a closed connection is not usable");
	r = hq_qmp_call(q, "again", NULL, NULL, 2000);
	CHECK(r == -ECONNRESET && strstr(hq_qmp_errmsg(q), "lost before"),
	      "calls on it fail at once: %d '%s'", r, hq_qmp_errmsg(q));
	r = hq_qmp_reconnect(q, 2000);
	CHECK(r == 0 && hq_qmp_usable(q), "reconnect: %d '%s'", r, hq_qmp_errmsg(q));

	/* A wait ended by the abort function, long before its timeout. */
	t0 = hq_now_test_ms();
	hq_qmp_set_abort(q, abort_after_50ms, &t0);
	r = hq_qmp_call(q, "hang", NULL, NULL, 5000);
	t1 = hq_now_test_ms();
	CHECK(r == -ECANCELED && t1 - t0 < 1000 && hq_qmp_aborted(q),
	      "aborted wait: %d after %ld ms", r, t1 - t0);
	r = hq_qmp_call(q, "not-sent", NULL, NULL, 5000);
	CHECK(r == -ECANCELED, "no call while the abort function says so: %d", r);
	hq_qmp_set_abort(q, NULL, NULL);
	/* A reply never awaited, and the aborted call's: neither taken for "six". */
	r = hq_qmp_send(q, "lost");
	CHECK(r == 0, "send without waiting: %d", r);
	r = hq_qmp_call(q, "six", NULL, &ret, 2000);
	CHECK(r == 0 && cJSON_IsNumber(ret) && ret->valuedouble == 6 && !hq_qmp_aborted(q),
	      "late replies dropped by id: %d %g", r, ret ? ret->valuedouble : -1);
	cJSON_Delete(ret);
	hq_qmp_close(q);
	hq_qmp_close(NULL);
	pthread_join(t, NULL);
	close(lfd);
	unlink(sock_path);
	rmdir(dir);
	return check_result();
}
