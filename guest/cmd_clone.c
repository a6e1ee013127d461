// SPDX-License-Identifier: MIT
/*
 * halite-synth clone: one clone of a saved synthetic guest, the process a
 * clone service (issue 14) starts per clone. Its guest memory is the
 * template memory file mapped privately (pages no clone wrote exist once on
 * the host, a write copies); the guest is attached to it (SYNTH_F_ATTACH:
 * nothing is written, its vCPUs parked until `start`), and a userfaultfd
 * made here (no UFFDIO_API: the engine does the handshake) is handed to
 * whoever asks on the control socket, so the engine can serve the clone's
 * faults from outside.
 *
 * Control protocol, on a unix stream socket: one connection at a time;
 * newline-terminated commands, one JSON line answers each, until EOF; then
 * the next connection (a restarted daemon comes back). A failing command
 * answers {"error": "..."} and the clone goes on serving.
 *
 *   info              {"pid","host":"0x..","mem_bytes","region","nvcpus",
 *                      "vcpu_tids":[..],"state"}
 *   uffd              {"ok":true}, the userfaultfd attached (SCM_RIGHTS)
 *   start|pause|resume {"ok":true}
 *   stats             {"accesses","faults","done","vcpus":[{..}]}
 *   wait-done MS      {"ok":true} or {"error":"timed out"}; MS 0: forever
 *   dump PATH         {"ok":true,"bytes":N}: the memory into PATH (0600)
 *   digest            {"xxh3":"16 hex digits"} of the memory
 *   quit              {"ok":true}, then exit 0
 *
 * dump and digest pause a running guest for a consistent image and resume
 * it after. They read the memory through this process's own mapping, so
 * pages the engine has not served yet block them (the server with them)
 * until it does: the userfaultfd sees them as any other fault.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <linux/userfaultfd.h>
#include <xxhash.h>

#include "internal.h"
#include "tool.h"

#define LINE_MAX_BYTES 4096
#define COPY_CHUNK (1u << 20)

enum clone_state { CL_CREATED, CL_RUNNING, CL_PAUSED };

struct clone {
	struct hs_args a;
	struct synth_guest *g;
	struct synth_info info;
	pid_t tids[SYNTH_MAX_VCPUS];
	void *mem;
	uint64_t mem_bytes;
	int uffd;
	int lfd;
	enum clone_state state;
	bool quit;
};

static const char *const state_names[] = { "created", "running", "paused" };

/* --- replies --- */

static cJSON *reply_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static cJSON *reply_error(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	cJSON *r = cJSON_CreateObject();

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r)
		cJSON_AddStringToObject(r, "error", msg);
	return r;
}

static cJSON *reply_ok(void)
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
	cJSON_free(s);
	return ret;
}

/* --- the guest's memory, read through the mapping --- */

/* Pause a running guest around a read of its memory: a consistent image. */
static int quiesce(struct clone *c, bool *was_running)
{
	int ret;

	*was_running = c->state == CL_RUNNING;
	if (!*was_running)
		return 0;
	ret = synth_pause(c->g);
	if (!ret)
		c->state = CL_PAUSED;
	return ret;
}

static int unquiesce(struct clone *c, bool was_running)
{
	int ret;

	if (!was_running)
		return 0;
	ret = synth_resume(c->g);
	if (!ret)
		c->state = CL_RUNNING;
	return ret;
}

static cJSON *cmd_dump(struct clone *c, const char *path)
{
	bool was_running;
	uint8_t *buf = NULL;
	uint64_t off = 0;
	cJSON *r = NULL;
	int fd = -1, ret;

	if (!path || !*path)
		return reply_error("dump: missing PATH");
	ret = quiesce(c, &was_running);
	if (ret)
		return reply_error("dump: pausing the guest: %s", strerror(-ret));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = reply_error("dump: %s: %s", path, strerror(errno));
		goto out;
	}
	/*
	 * Through a buffer: the copy faults in user mode, which a userfaultfd
	 * made with UFFD_USER_MODE_ONLY serves too (write() from the mapping
	 * would fault in the kernel).
	 */
	buf = malloc(COPY_CHUNK);
	if (!buf) {
		r = reply_error("dump: out of memory");
		goto out;
	}
	while (off < c->mem_bytes) {
		size_t n = c->mem_bytes - off < COPY_CHUNK ? (size_t)(c->mem_bytes - off) : COPY_CHUNK;
		size_t done = 0;

		memcpy(buf, (uint8_t *)c->mem + off, n);
		while (done < n) {
			ssize_t w = write(fd, buf + done, n - done);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				r = reply_error("dump: writing %s: %s", path,
						w < 0 ? strerror(errno) : "short write");
				goto out;
			}
			done += (size_t)w;
		}
		off += n;
	}
	if (close(fd)) {
		fd = -1;
		r = reply_error("dump: closing %s: %s", path, strerror(errno));
		goto out;
	}
	fd = -1;
	r = reply_ok();
	if (r)
		cJSON_AddNumberToObject(r, "bytes", (double)c->mem_bytes);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	ret = unquiesce(c, was_running);
	if (ret) {
		cJSON_Delete(r);
		r = reply_error("dump: resuming the guest: %s", strerror(-ret));
	}
	return r;
}

static cJSON *cmd_digest(struct clone *c)
{
	XXH3_state_t *st = XXH3_createState();
	bool was_running;
	char hex[17];
	cJSON *r;
	int ret;

	if (!st)
		return reply_error("digest: out of memory");
	ret = quiesce(c, &was_running);
	if (ret) {
		XXH3_freeState(st);
		return reply_error("digest: pausing the guest: %s", strerror(-ret));
	}
	XXH3_64bits_reset(st);
	for (uint64_t off = 0; off < c->mem_bytes; off += COPY_CHUNK) {
		size_t n = c->mem_bytes - off < COPY_CHUNK ? (size_t)(c->mem_bytes - off) : COPY_CHUNK;

		XXH3_64bits_update(st, (const uint8_t *)c->mem + off, n);
	}
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH3_64bits_digest(st));
	XXH3_freeState(st);
	ret = unquiesce(c, was_running);
	if (ret)
		return reply_error("digest: resuming the guest: %s", strerror(-ret));
	r = cJSON_CreateObject();
	if (r)
		cJSON_AddStringToObject(r, "xxh3", hex);
	return r;
}

/* --- commands --- */

static cJSON *cmd_info(struct clone *c)
{
	cJSON *r = cJSON_CreateObject(), *tids;
	char host[32];

	if (!r)
		return NULL;
	snprintf(host, sizeof(host), "0x%" PRIxPTR, (uintptr_t)c->mem);
	cJSON_AddNumberToObject(r, "pid", (double)getpid());
	cJSON_AddStringToObject(r, "host", host);
	cJSON_AddNumberToObject(r, "mem_bytes", (double)c->mem_bytes);
	cJSON_AddStringToObject(r, "region", SYNTH_REGION_NAME);
	cJSON_AddNumberToObject(r, "nvcpus", c->info.nvcpus);
	tids = cJSON_AddArrayToObject(r, "vcpu_tids");
	for (unsigned v = 0; tids && v < c->info.nvcpus; v++)
		cJSON_AddItemToArray(tids, cJSON_CreateNumber(c->tids[v]));
	cJSON_AddStringToObject(r, "state", state_names[c->state]);
	return r;
}

static cJSON *cmd_stats(struct clone *c)
{
	cJSON *r = cJSON_CreateObject(), *arr;
	uint64_t acc = 0, faults = 0;
	bool done = true;

	if (!r)
		return NULL;
	arr = cJSON_CreateArray();
	for (unsigned v = 0; v < c->info.nvcpus; v++) {
		struct synth_vcpu_stats st;
		cJSON *o;
		int ret = synth_vcpu_stats(c->g, v, &st);

		if (ret) {
			cJSON_Delete(arr);
			cJSON_Delete(r);
			return reply_error("stats: vCPU %u: %s", v, strerror(-ret));
		}
		acc += st.accesses;
		faults += st.faults;
		done &= st.done != 0;
		o = cJSON_CreateObject();
		if (o) {
			cJSON_AddNumberToObject(o, "accesses", (double)st.accesses);
			cJSON_AddNumberToObject(o, "faults", (double)st.faults);
			cJSON_AddBoolToObject(o, "done", st.done != 0);
		}
		cJSON_AddItemToArray(arr, o);
	}
	cJSON_AddNumberToObject(r, "accesses", (double)acc);
	cJSON_AddNumberToObject(r, "faults", (double)faults);
	cJSON_AddBoolToObject(r, "done", done);
	cJSON_AddItemToObject(r, "vcpus", arr);
	return r;
}

static cJSON *cmd_control(struct clone *c, const char *cmd)
{
	int ret;

	if (!strcmp(cmd, "start")) {
		ret = synth_start(c->g);
		if (ret == -EALREADY)
			return reply_error("start: already started (resume to run a paused guest)");
		if (!ret)
			c->state = CL_RUNNING;
	} else if (!strcmp(cmd, "pause")) {
		if (c->state == CL_CREATED)
			return reply_error("pause: not started");
		ret = synth_pause(c->g);
		if (!ret)
			c->state = CL_PAUSED;
	} else {
		if (c->state == CL_CREATED)
			return reply_error("resume: not started (start first)");
		ret = synth_resume(c->g);
		if (!ret)
			c->state = CL_RUNNING;
	}
	if (ret)
		return reply_error("%s: %s", cmd, strerror(-ret));
	return reply_ok();
}

static cJSON *cmd_wait_done(struct clone *c, const char *arg)
{
	unsigned long long ms;
	char *end;
	int ret;

	if (!arg || !*arg)
		return reply_error("wait-done: missing MS (milliseconds, 0 = forever)");
	errno = 0;
	ms = strtoull(arg, &end, 10);
	if (errno || *end || *arg < '0' || *arg > '9' || ms > 0xffffffffull)
		return reply_error("wait-done: bad MS '%s'", arg);
	if (c->state == CL_CREATED)
		return reply_error("wait-done: not started");
	ret = synth_wait_done(c->g, (unsigned)ms);
	if (ret == -ETIMEDOUT)
		return reply_error("timed out");
	if (ret == -EINVAL)
		return reply_error("wait-done: the vCPUs never finish (the clone runs without "
				   "--accesses)");
	if (ret)
		return reply_error("wait-done: %s", strerror(-ret));
	return reply_ok();
}

/* One command line (NUL-terminated, no newline) -> its reply; *pass_fd set for uffd. */
static cJSON *handle(struct clone *c, char *line, int *pass_fd)
{
	char *arg = strchr(line, ' ');
	size_t n;

	/* Tolerate CRLF and trailing blanks (a human with socat). */
	n = strlen(line);
	while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
		line[--n] = '\0';
	if (arg) {
		*arg++ = '\0';
		while (*arg == ' ')
			arg++;
	}
	if (!strcmp(line, "info") && !arg)
		return cmd_info(c);
	if (!strcmp(line, "uffd") && !arg) {
		*pass_fd = c->uffd;
		return reply_ok();
	}
	if ((!strcmp(line, "start") || !strcmp(line, "pause") || !strcmp(line, "resume")) && !arg)
		return cmd_control(c, line);
	if (!strcmp(line, "stats") && !arg)
		return cmd_stats(c);
	if (!strcmp(line, "wait-done"))
		return cmd_wait_done(c, arg);
	if (!strcmp(line, "dump"))
		return cmd_dump(c, arg);
	if (!strcmp(line, "digest") && !arg)
		return cmd_digest(c);
	if (!strcmp(line, "quit") && !arg) {
		c->quit = true;
		return reply_ok();
	}
	if (arg && (!strcmp(line, "info") || !strcmp(line, "uffd") || !strcmp(line, "start") ||
		    !strcmp(line, "pause") || !strcmp(line, "resume") || !strcmp(line, "stats") ||
		    !strcmp(line, "digest") || !strcmp(line, "quit")))
		return reply_error("%s takes no argument (got '%s')", line, arg);
	return reply_error("unknown command: %s", line);
}

/* Serve one connection until EOF, an I/O error or quit. */
static void serve(struct clone *c, int cfd)
{
	char buf[LINE_MAX_BYTES + 1];
	size_t have = 0;
	bool skipping = false; /* in a line too long: dropping it up to its newline */

	while (!c->quit) {
		ssize_t rd = recv(cfd, buf + have, LINE_MAX_BYTES - have, 0);
		char *nl;

		if (rd < 0 && errno == EINTR)
			continue;
		if (rd <= 0)
			return;
		have += (size_t)rd;
		while (!c->quit && (nl = memchr(buf, '\n', have))) {
			size_t len = (size_t)(nl - buf);
			int pass_fd = -1;
			cJSON *r;

			*nl = '\0';
			if (skipping) {
				skipping = false;
				r = reply_error("command too long (over %u bytes)", LINE_MAX_BYTES);
			} else if (memchr(buf, '\0', len)) {
				r = reply_error("a NUL byte in the command");
			} else {
				r = handle(c, buf, &pass_fd);
			}
			if (send_reply(cfd, r, pass_fd)) {
				cJSON_Delete(r);
				return;
			}
			cJSON_Delete(r);
			memmove(buf, nl + 1, have - len - 1);
			have -= len + 1;
		}
		if (have == LINE_MAX_BYTES) {
			skipping = true;
			have = 0;
		}
	}
}

/* --- setup --- */

static int listen_on(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old;
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, HS_PROG " clone: --control %s: longer than %zu bytes\n", path,
			sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* A stale socket of an earlier clone goes; anything else is not ours to remove. */
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode)) {
			fprintf(stderr, HS_PROG " clone: --control %s exists and is not a socket\n",
				path);
			return -EEXIST;
		}
		if (unlink(path) && errno != ENOENT) {
			ret = -errno;
			fprintf(stderr, HS_PROG " clone: removing the stale socket %s: %s\n", path,
				strerror(errno));
			return ret;
		}
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		fprintf(stderr, HS_PROG " clone: socket: %s\n", strerror(errno));
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
		fprintf(stderr, HS_PROG " clone: --control %s: %s\n", path, strerror(-ret));
		close(fd);
		return ret;
	}
	return fd;
}

/* A userfaultfd of this process, handshake left to the engine. */
static int make_uffd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

#ifdef UFFD_USER_MODE_ONLY
	/* Without CAP_SYS_PTRACE and vm.unprivileged_userfaultfd = 0, user faults only. */
	if (fd < 0 && errno == EPERM)
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
#endif
	return fd < 0 ? -errno : fd;
}

static int map_template(struct clone *c)
{
	struct synth_opts norm;
	struct stat st;
	long pg = sysconf(_SC_PAGESIZE);
	int fd, ret;

	if (synth_normalize_opts(&norm, &c->a.o)) {
		fprintf(stderr, HS_PROG " clone: bad guest options\n");
		return -EINVAL;
	}
	c->mem_bytes = norm.mem_bytes;
	if (c->a.mem_offset % (uint64_t)pg) {
		fprintf(stderr, HS_PROG " clone: --mem-offset %llu is not a multiple of the page "
			"size (%ld)\n", (unsigned long long)c->a.mem_offset, pg);
		return -EINVAL;
	}
	fd = open(c->a.mem_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		fprintf(stderr, HS_PROG " clone: --mem-file %s: %s\n", c->a.mem_file,
			strerror(errno));
		return ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		fprintf(stderr, HS_PROG " clone: --mem-file %s: %s\n", c->a.mem_file,
			strerror(errno));
		close(fd);
		return ret;
	}
	if (!S_ISREG(st.st_mode) || c->a.mem_offset > (uint64_t)st.st_size ||
	    (uint64_t)st.st_size - c->a.mem_offset < c->mem_bytes) {
		fprintf(stderr, HS_PROG " clone: --mem-file %s is %s%llu bytes: too short for "
			"--mem-offset %llu + %llu bytes of guest memory\n", c->a.mem_file,
			S_ISREG(st.st_mode) ? "" : "not a regular file, ",
			(unsigned long long)st.st_size, (unsigned long long)c->a.mem_offset,
			(unsigned long long)c->mem_bytes);
		close(fd);
		return -EINVAL;
	}
	/* Private: the clone's writes copy, the template stays as it is. */
	c->mem = mmap(NULL, (size_t)c->mem_bytes, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_NORESERVE, fd, (off_t)c->a.mem_offset);
	ret = c->mem == MAP_FAILED ? -errno : 0;
	close(fd); /* the mapping holds the file */
	if (ret) {
		c->mem = NULL;
		fprintf(stderr, HS_PROG " clone: mapping %llu bytes of %s: %s\n",
			(unsigned long long)c->mem_bytes, c->a.mem_file, strerror(-ret));
	}
	return ret;
}

static int setup(struct clone *c)
{
	struct synth_opts o = c->a.o;
	int ret;

	ret = map_template(c);
	if (ret)
		return ret;
	o.flags |= SYNTH_F_ATTACH;
	o.backing = SYNTH_MEM_ANON;
	o.mem_host = c->mem;
	ret = synth_create(&c->g, &o);
	if (ret) {
		fprintf(stderr, HS_PROG " clone: creating the guest: %s\n", strerror(-ret));
		return ret;
	}
	synth_info(c->g, &c->info);
	for (unsigned v = 0; v < c->info.nvcpus; v++) {
		struct synth_vcpu_info vi;

		synth_vcpu_info(c->g, v, &vi);
		c->tids[v] = vi.tid;
	}
	c->uffd = make_uffd();
	if (c->uffd < 0) {
		ret = c->uffd;
		fprintf(stderr, HS_PROG " clone: userfaultfd: %s\n", strerror(-ret));
		return ret;
	}
	c->lfd = listen_on(c->a.control);
	return c->lfd < 0 ? c->lfd : 0;
}

static void teardown(struct clone *c)
{
	/*
	 * vCPUs blocked on faults nobody serves (the engine gone) would never
	 * park, and synth_stop() would wait for them forever: leave then, the
	 * kernel takes everything back.
	 */
	if (c->g && c->state == CL_RUNNING && synth_pause_timed(c->g, 2000) == -ETIMEDOUT) {
		if (c->lfd >= 0)
			unlink(c->a.control);
		fprintf(stderr, HS_PROG " clone: vCPUs blocked on memory nobody serves; leaving\n");
		_exit(0);
	}
	if (c->g) {
		synth_stop(c->g);
		synth_free(c->g);
	}
	if (c->mem)
		munmap(c->mem, (size_t)c->mem_bytes);
	if (c->uffd >= 0)
		close(c->uffd);
	if (c->lfd >= 0) {
		close(c->lfd);
		unlink(c->a.control);
	}
}

int hs_cmd_clone(int argc, char **argv)
{
	struct clone c = { .uffd = -1, .lfd = -1 };
	int ret;

	ret = hs_parse(argc, argv, HS_CMD_CLONE, &c.a);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (!c.a.mem_file || !c.a.control) {
		fprintf(stderr, HS_PROG " clone: missing %s (--help for usage)\n",
			!c.a.mem_file ? "--mem-file PATH" : "--control SOCKPATH");
		return 2;
	}
	/* The daemon that started us may die: we live on, and the parent may close our stdio. */
	signal(SIGPIPE, SIG_IGN);
	setsid(); /* EPERM when a group leader already: as good */

	ret = setup(&c);
	if (ret) {
		teardown(&c);
		return ret == -EINVAL ? 2 : 1;
	}
	printf("ready\n");
	fflush(stdout);

	while (!c.quit) {
		int cfd = accept4(c.lfd, NULL, NULL, SOCK_CLOEXEC);

		if (cfd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			fprintf(stderr, HS_PROG " clone: accept: %s\n", strerror(errno));
			teardown(&c);
			return 1;
		}
		serve(&c, cfd);
		close(cfd);
	}
	teardown(&c);
	return 0;
}
