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
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <linux/userfaultfd.h>
#include <xxhash.h>

#include "clone_srv.h"
#include "internal.h"
#include "tool.h"

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
};

static const char *const state_names[] = { "created", "running", "paused" };

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
		return clone_srv_error("dump: missing PATH");
	ret = quiesce(c, &was_running);
	if (ret)
		return clone_srv_error("dump: pausing the guest: %s", strerror(-ret));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = clone_srv_error("dump: %s: %s", path, strerror(errno));
		goto out;
	}
	/*
	 * Through a buffer: the copy faults in user mode, which a userfaultfd
	 * made with UFFD_USER_MODE_ONLY serves too (write() from the mapping
	 * would fault in the kernel).
	 */
	buf = malloc(COPY_CHUNK);
	if (!buf) {
		r = clone_srv_error("dump: out of memory");
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
				r = clone_srv_error("dump: writing %s: %s", path,
						w < 0 ? strerror(errno) : "short write");
				goto out;
			}
			done += (size_t)w;
		}
		off += n;
	}
	if (close(fd)) {
		fd = -1;
		r = clone_srv_error("dump: closing %s: %s", path, strerror(errno));
		goto out;
	}
	fd = -1;
	r = clone_srv_ok();
	if (r)
		cJSON_AddNumberToObject(r, "bytes", (double)c->mem_bytes);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	ret = unquiesce(c, was_running);
	if (ret) {
		cJSON_Delete(r);
		r = clone_srv_error("dump: resuming the guest: %s", strerror(-ret));
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
		return clone_srv_error("digest: out of memory");
	ret = quiesce(c, &was_running);
	if (ret) {
		XXH3_freeState(st);
		return clone_srv_error("digest: pausing the guest: %s", strerror(-ret));
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
		return clone_srv_error("digest: resuming the guest: %s", strerror(-ret));
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
			return clone_srv_error("stats: vCPU %u: %s", v, strerror(-ret));
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
			return clone_srv_error("start: already started (resume to run a paused guest)");
		if (!ret)
			c->state = CL_RUNNING;
	} else if (!strcmp(cmd, "pause")) {
		if (c->state == CL_CREATED)
			return clone_srv_error("pause: not started");
		ret = synth_pause(c->g);
		if (!ret)
			c->state = CL_PAUSED;
	} else {
		if (c->state == CL_CREATED)
			return clone_srv_error("resume: not started (start first)");
		ret = synth_resume(c->g);
		if (!ret)
			c->state = CL_RUNNING;
	}
	if (ret)
		return clone_srv_error("%s: %s", cmd, strerror(-ret));
	return clone_srv_ok();
}

static cJSON *cmd_wait_done(struct clone *c, const char *arg)
{
	unsigned long long ms;
	char *end;
	int ret;

	if (!arg || !*arg)
		return clone_srv_error("wait-done: missing MS (milliseconds, 0 = forever)");
	errno = 0;
	ms = strtoull(arg, &end, 10);
	if (errno || *end || *arg < '0' || *arg > '9' || ms > 0xffffffffull)
		return clone_srv_error("wait-done: bad MS '%s'", arg);
	if (c->state == CL_CREATED)
		return clone_srv_error("wait-done: not started");
	ret = synth_wait_done(c->g, (unsigned)ms);
	if (ret == -ETIMEDOUT)
		return clone_srv_error("timed out");
	if (ret == -EINVAL)
		return clone_srv_error("wait-done: the vCPUs never finish (the clone runs without "
				   "--accesses)");
	if (ret)
		return clone_srv_error("wait-done: %s", strerror(-ret));
	return clone_srv_ok();
}

/* One command line (NUL-terminated, no newline) -> its reply; *pass_fd set for uffd. */
static cJSON *handle(void *ctx, char *line, int *pass_fd, bool *quit)
{
	struct clone *c = ctx;
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
		return clone_srv_ok();
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
		*quit = true;
		return clone_srv_ok();
	}
	if (arg && (!strcmp(line, "info") || !strcmp(line, "uffd") || !strcmp(line, "start") ||
		    !strcmp(line, "pause") || !strcmp(line, "resume") || !strcmp(line, "stats") ||
		    !strcmp(line, "digest") || !strcmp(line, "quit")))
		return clone_srv_error("%s takes no argument (got '%s')", line, arg);
	return clone_srv_error("unknown command: %s", line);
}

/* --- setup --- */

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

	if (synth_normalize_opts(&norm, &c->a.o)) /* hs_parse() checked them */
		return -EINVAL;
	c->mem_bytes = norm.mem_bytes;
	if (c->a.mem_offset % (uint64_t)pg) {
		fprintf(stderr, HS_PROG ": clone: --mem-offset %llu is not a multiple of the page "
			"size (%ld)\n", (unsigned long long)c->a.mem_offset, pg);
		return -EINVAL;
	}
	if (c->a.anon) {
		/* An ordinary restore's target: empty private memory, filled by UFFDIO_COPY. */
		c->mem = mmap(NULL, (size_t)c->mem_bytes, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (c->mem == MAP_FAILED) {
			c->mem = NULL;
			ret = -errno;
			fprintf(stderr, HS_PROG ": clone: mapping %llu bytes: %s\n",
				(unsigned long long)c->mem_bytes, strerror(errno));
			return ret;
		}
		(void)madvise(c->mem, (size_t)c->mem_bytes, MADV_NOHUGEPAGE);
		return 0;
	}
	fd = open(c->a.mem_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		fprintf(stderr, HS_PROG ": clone: --mem-file %s: %s\n", c->a.mem_file,
			strerror(errno));
		return ret;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		fprintf(stderr, HS_PROG ": clone: --mem-file %s: %s\n", c->a.mem_file,
			strerror(errno));
		close(fd);
		return ret;
	}
	if (!S_ISREG(st.st_mode) || c->a.mem_offset > (uint64_t)st.st_size ||
	    (uint64_t)st.st_size - c->a.mem_offset < c->mem_bytes) {
		fprintf(stderr, HS_PROG ": clone: --mem-file %s is %s%llu bytes: too short for "
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
		fprintf(stderr, HS_PROG ": clone: mapping %llu bytes of %s: %s\n",
			(unsigned long long)c->mem_bytes, c->a.mem_file, strerror(-ret));
	}
	return ret;
}

static int setup(struct clone *c)
{
	struct synth_opts o = c->a.o;
	char err[PATH_MAX + 64];
	int ret;

	ret = map_template(c);
	if (ret)
		return ret;
	o.flags |= SYNTH_F_ATTACH;
	o.backing = SYNTH_MEM_ANON;
	o.mem_host = c->mem;
	ret = synth_create(&c->g, &o);
	if (ret) {
		fprintf(stderr, HS_PROG ": clone: creating the guest: %s\n", strerror(-ret));
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
		fprintf(stderr, HS_PROG ": clone: userfaultfd: %s\n", strerror(-ret));
		return ret;
	}
	c->lfd = clone_srv_listen(c->a.control, err, sizeof(err));
	if (c->lfd < 0)
		fprintf(stderr, HS_PROG ": clone: %s\n", err);
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
		fprintf(stderr,
			HS_PROG ": clone: vCPUs blocked on memory nobody serves; leaving\n");
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
	if ((!c.a.mem_file && !c.a.anon) || !c.a.control) {
		fprintf(stderr, HS_PROG ": clone: missing %s (" HS_PROG " clone --help)\n",
			!c.a.control ? "--control SOCKPATH" : "--mem-file PATH (or --anon)");
		return 2;
	}
	if (c.a.mem_file && c.a.anon) {
		fprintf(stderr, HS_PROG ": clone: --mem-file and --anon: one or the other\n");
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

	ret = clone_srv_run(c.lfd, -1, handle, &c);
	if (ret < 0)
		fprintf(stderr, HS_PROG ": clone: accept: %s\n", strerror(-ret));
	teardown(&c);
	return ret < 0 ? 1 : 0;
}
