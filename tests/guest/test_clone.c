// SPDX-License-Identifier: MIT
/*
 * halite-synth save and clone (testing/synth/tool.h, testing/synth/cmd_save.c,
 * testing/synth/cmd_clone.c):
 *
 * - save in process: the file holds the guest's memory at the pause, byte
 *   for byte, while the guest runs on and writes during the save;
 * - save by the tool: its JSON line, and synth.args re-creates the guest:
 *   the same options and workload give the memory the file holds;
 * - clone: the tool on a memfd that holds that memory; info, the
 *   userfaultfd (a real one, never handshaken: this test does it and serves
 *   the clone's minor faults through it, as the engine would), start,
 *   wait-done, stats (every translation found its tables), digest and dump
 *   equal to the memory, errors that leave it serving, reconnection, quit;
 * - clone's argument errors.
 *
 * Without a userfaultfd (not root and vm.unprivileged_userfaultfd=0) only
 * the argument errors run, and the test skips (77).
 *
 * Usage: test_clone PATH-TO-halite-synth
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include <halite/format.h>

#include "gtest.h"
#include "tool.h"
#include "uffd.h"

#define MIB (1ull << 20)
#define MEM_OFFSET (2 * MIB)

static const char *g_tool;
static uint64_t g_seed;

/* Every memory block of @path equals @mem (@len bytes, region pc.ram at 0). */
static void check_file_memory(const char *path, const uint8_t *mem, uint64_t len)
{
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	const struct halite_region_info *ri;
	uint8_t *buf;
	uint64_t bad = 0;
	int idx;

	CHECK_OK(halite_reader_open(&rd, path, NULL));
	fi = halite_reader_info(rd);
	idx = halite_reader_find_region(rd, SYNTH_REGION_NAME);
	CHECK(idx >= 0);
	ri = halite_reader_region(rd, (uint32_t)idx);
	CHECK_EQ(ri->gpa, 0);
	CHECK_EQ(ri->length, len);
	CHECK_EQ(fi->memory_bytes, len);
	buf = xmalloc(fi->mb_size);
	for (uint64_t mb = 0; mb < ri->mb_count; mb++) {
		uint64_t off = mb * fi->mb_size;
		uint32_t n = halite_reader_mb_bytes(rd, ri->first_mb + mb);

		CHECK_OK(halite_reader_read_mb(rd, ri->first_mb + mb, buf));
		if (memcmp(buf, mem + off, n)) {
			if (bad++ < 5)
				fprintf(stderr, "memory block %llu (GPA 0x%llx) differs from the guest's\n",
					(unsigned long long)mb, (unsigned long long)off);
		}
	}
	CHECK_EQ(bad, 0);
	free(buf);
	halite_reader_free(rd);
}

/* The value of metadata @key in @path, malloc'd, NUL-terminated; NULL if none. */
static char *file_meta(const char *path, const char *key)
{
	struct halite_reader *rd;
	char *out = NULL;

	CHECK_OK(halite_reader_open(&rd, path, NULL));
	for (uint32_t i = 0; i < halite_reader_meta_count(rd); i++) {
		const char *k;
		const void *v;
		uint32_t len;

		CHECK_OK(halite_reader_meta(rd, i, &k, &v, &len));
		if (!strcmp(k, key)) {
			out = xmalloc(len + 1);
			memcpy(out, v, len);
			out[len] = '\0';
		}
	}
	halite_reader_free(rd);
	return out;
}

/* --- save, in this process --- */

struct at_pause {
	uint8_t *snap;
	uint64_t accesses; /* sum at the pause */
	unsigned nvcpus;
};

static int copy_at_pause(void *ctx, struct synth_guest *g)
{
	struct at_pause *ap = ctx;

	for (unsigned v = 0; v < ap->nvcpus; v++) {
		struct synth_vcpu_stats st;

		synth_vcpu_stats(g, v, &st);
		ap->accesses += st.accesses;
	}
	return synth_copy_memory(g, ap->snap);
}

static void test_save_in_process(void)
{
	SYNTH_OPTS(o, .mem_bytes = 32 * MIB, .nvcpus = 2, .write_pct = 40,
		   .pattern = SYNTH_PAT_RANDOM, .flags = SYNTH_F_AD_BITS, .hole_every = 7,
		   .zero_pct = 10, .untouched_pct = 10, .compress_pct = 40, .seed = g_seed,
		   .log_fn = halite_log_stderr);
	char path[512], args[512], *meta;
	struct synth_guest *g;
	struct hs_save_res res;
	struct at_pause ap = { .nvcpus = 2 };
	uint64_t after = 0;
	uint8_t *now;

	fprintf(stderr, "save in process\n");
	snprintf(path, sizeof(path), "%s/inproc.hal", t_tmpdir());
	CHECK_OK(hs_synth_args(&o, args, sizeof(args)));
	ap.snap = xmalloc(o.mem_bytes);
	now = xmalloc(o.mem_bytes);
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_start(g));
	wait_progress(g, 2, NULL);
	sleep_ms(50);
	CHECK_OK(hs_save_guest(g, &(struct hs_save_req){ .path = path, .synth_args = args,
							  .resume = true, .at_pause = copy_at_pause,
							  .ctx = &ap }, &res));
	CHECK(res.st.done);
	CHECK(res.st.file_bytes > 0);
	/* It ran on, writing, while saved: the file must still be the pause's memory. */
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < 2; v++) {
		struct synth_vcpu_stats st;

		CHECK_OK(synth_vcpu_stats(g, v, &st));
		after += st.accesses;
	}
	CHECK(after > ap.accesses);
	CHECK_OK(synth_copy_memory(g, now));
	CHECK(memcmp(now, ap.snap, o.mem_bytes) != 0);
	check_file_memory(path, ap.snap, o.mem_bytes);
	meta = file_meta(path, HS_META_ARGS);
	CHECK(meta && !strcmp(meta, args));
	fprintf(stderr, "  %s: %llu faults, %s\n", path, (unsigned long long)res.st.faults, args);
	free(meta);
	free(now);
	free(ap.snap);
	synth_stop(g);
	synth_free(g);
}

/* --- running the tool --- */

struct proc {
	pid_t pid;
	int out, err; /* pipes from its stdout and stderr */
};

static void spawn(struct proc *p, char **argv)
{
	int po[2], pe[2];

	CHECK_OK(pipe2(po, O_CLOEXEC));
	CHECK_OK(pipe2(pe, O_CLOEXEC));
	p->pid = fork();
	CHECK(p->pid >= 0);
	if (p->pid == 0) {
		dup2(po[1], 1);
		dup2(pe[1], 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(po[1]);
	close(pe[1]);
	p->out = po[0];
	p->err = pe[0];
}

/* Read @fd to EOF (or a line, with @line) into a malloc'd string, within @ms. */
static char *read_from(int fd, unsigned ms, bool line)
{
	size_t cap = 4096, n = 0;
	char *s = xmalloc(cap);
	uint64_t dl = now_ms() + ms;

	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (now_ms() > dl) {
			fprintf(stderr, "no output in %u ms\n", ms);
			exit(1);
		}
		if (poll(&pfd, 1, 100) <= 0)
			continue;
		if (n + 1 >= cap)
			s = realloc(s, cap *= 2);
		CHECK(s);
		r = read(fd, s + n, line ? 1 : cap - n - 1);
		if (r <= 0)
			break;
		n += (size_t)r;
		if (line && s[n - 1] == '\n')
			break;
	}
	s[n] = '\0';
	return s;
}

/* Wait for @pid within @ms: its exit status, or fail. */
static int wait_exit(pid_t pid, unsigned ms)
{
	uint64_t dl = now_ms() + ms;
	int st;

	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		CHECK(w >= 0);
		if (w == pid)
			break;
		if (now_ms() > dl) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fprintf(stderr, "pid %d did not exit in %u ms\n", (int)pid, ms);
			exit(1);
		}
		sleep_ms(5);
	}
	CHECK(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* Run the tool to its end: exit status, stdout and stderr. */
static int run_tool(char **argv, char **out, char **err)
{
	struct proc p;
	int rc;

	spawn(&p, argv);
	*out = read_from(p.out, 60000, false);
	*err = read_from(p.err, 60000, false);
	rc = wait_exit(p.pid, 60000);
	close(p.out);
	close(p.err);
	return rc;
}

/* --- save by the tool; synth.args re-creates the guest --- */

#define TOOL_ACCESSES 30000

static void test_save_tool(const char *path, char **args_out)
{
	char seed[32], acc[32];
	char *argv[] = { (char *)g_tool, "save", "--out", (char *)path, "--mem", "32",
			 "--vcpus", "2", "--accesses", acc, "--write", "50", "--pattern",
			 "random", "--seed", seed, "--holes", "5", "--zero", "10",
			 "--untouched", "10", "--huge2m", "1", "--map", "4", "--codec", "zstd",
			 NULL };
	char *out, *err, *meta, **gargv;
	struct hs_args a;
	struct synth_guest *g;
	cJSON *j;
	uint8_t *mem;
	int gargc;

	fprintf(stderr, "save by the tool\n");
	snprintf(seed, sizeof(seed), "%llu", (unsigned long long)g_seed);
	snprintf(acc, sizeof(acc), "%u", TOOL_ACCESSES);
	CHECK_EQ(run_tool(argv, &out, &err), 0);
	fprintf(stderr, "  %s", out);
	j = cJSON_Parse(out);
	CHECK(j);
	CHECK(cJSON_IsString(cJSON_GetObjectItem(j, "file")));
	CHECK(!strcmp(cJSON_GetObjectItem(j, "file")->valuestring, path));
	CHECK_EQ(cJSON_GetObjectItem(j, "mem_bytes")->valuedouble, 32 * MIB);
	CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "save_ms")));
	meta = file_meta(path, HS_META_ARGS);
	CHECK(meta);
	CHECK(!strcmp(cJSON_GetObjectItem(j, "synth_args")->valuestring, meta));
	/* Layout options only: not the workload's. */
	CHECK(!strstr(meta, "--write") && !strstr(meta, "--accesses") && !strstr(meta, "--pattern"));
	CHECK(strstr(meta, "--holes 5") && strstr(meta, "--huge2m 1") && strstr(meta, "--map 4 "));

	/* The same guest from the record, the same workload: the same memory. */
	gargv = hs_split_args("run", meta, &gargc);
	CHECK(gargv);
	CHECK_EQ(hs_parse(gargc, gargv, HS_CMD_RUN, &a), 0);
	a.o.write_pct = 50;
	a.o.pattern = SYNTH_PAT_RANDOM;
	a.o.max_accesses = TOOL_ACCESSES;
	CHECK_OK(synth_create(&g, &a.o));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 20000));
	CHECK_OK(synth_pause(g));
	mem = xmalloc(32 * MIB);
	CHECK_OK(synth_copy_memory(g, mem));
	check_file_memory(path, mem, 32 * MIB);
	synth_stop(g);
	synth_free(g);
	free(mem);
	free(gargv);
	cJSON_Delete(j);
	free(out);
	free(err);
	*args_out = meta;
}

/* --- the clone --- */

struct conn {
	int fd;
	char buf[65536];
	size_t have;
};

static void conn_open(struct conn *c, const char *sock)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	c->have = 0;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(c->fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	CHECK_OK(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)));
}

/* Send @cmd, read one reply line (and an fd passed with it into *fd). */
static cJSON *rpc(struct conn *c, const char *cmd, int *fd)
{
	char *nl;
	size_t len = strlen(cmd);
	cJSON *j;

	if (fd)
		*fd = -1;
	CHECK_EQ(send(c->fd, cmd, len, MSG_NOSIGNAL), len);
	CHECK_EQ(send(c->fd, "\n", 1, MSG_NOSIGNAL), 1);
	while (!(nl = memchr(c->buf, '\n', c->have))) {
		union {
			char b[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { c->buf + c->have, sizeof(c->buf) - c->have - 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
				     .msg_controllen = sizeof(ctl.b) };
		struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
		struct cmsghdr *cm;
		ssize_t r;

		CHECK(poll(&pfd, 1, 15000) == 1); /* a reply within 15 s */
		r = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
		CHECK(r > 0);
		for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
				int got;

				memcpy(&got, CMSG_DATA(cm), sizeof(int));
				CHECK(fd); /* nobody expected one */
				*fd = got;
			}
		}
		c->have += (size_t)r;
	}
	*nl = '\0';
	j = cJSON_Parse(c->buf);
	if (!j)
		fprintf(stderr, "not JSON: %s\n", c->buf);
	CHECK(j);
	fprintf(stderr, "  %s -> %.200s\n", cmd, c->buf);
	memmove(c->buf, nl + 1, c->have - (size_t)(nl + 1 - c->buf));
	c->have -= (size_t)(nl + 1 - c->buf);
	return j;
}

static bool is_ok(const cJSON *j)
{
	return cJSON_IsTrue(cJSON_GetObjectItem(j, "ok"));
}

static void check_ok(struct conn *c, const char *cmd)
{
	cJSON *j = rpc(c, cmd, NULL);

	CHECK(is_ok(j));
	cJSON_Delete(j);
}

/* The reply is an error whose message contains @what. */
static void check_error(struct conn *c, const char *cmd, const char *what)
{
	cJSON *j = rpc(c, cmd, NULL);
	const cJSON *e = cJSON_GetObjectItem(j, "error");

	CHECK(cJSON_IsString(e) && strstr(e->valuestring, what));
	cJSON_Delete(j);
}

static double num(const cJSON *j, const char *key)
{
	const cJSON *v = cJSON_GetObjectItem(j, key);

	CHECK(cJSON_IsNumber(v));
	return v->valuedouble;
}

/* Serves the clone's minor faults from outside, as the engine would: UFFDIO_CONTINUE. */
struct server {
	int uffd;
	int stop;
	uint64_t faults, errors;
	pthread_t th;
};

static void *server_main(void *arg)
{
	struct server *s = arg;

	while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pfd = { .fd = s->uffd, .events = POLLIN };
		struct uffd_msg msg[16];
		ssize_t n;

		if (poll(&pfd, 1, 10) <= 0)
			continue;
		n = read(s->uffd, msg, sizeof(msg));
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
			continue;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++) {
			uint64_t addr = msg[i].arg.pagefault.address & ~4095ull;
			struct uffdio_continue cont = { .range = { .start = addr, .len = 4096 } };

			if (msg[i].event != UFFD_EVENT_PAGEFAULT ||
			    !(msg[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_MINOR)) {
				__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
				continue;
			}
			__atomic_add_fetch(&s->faults, 1, __ATOMIC_RELAXED);
			if (ioctl(s->uffd, UFFDIO_CONTINUE, &cont)) {
				/* Mapped meanwhile: a normal race, the faulter still wakes. */
				struct uffdio_range r = { .start = addr, .len = 4096 };

				if (errno != EEXIST)
					__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
				ioctl(s->uffd, UFFDIO_WAKE, &r);
			}
		}
	}
	return NULL;
}

/* A memfd holding the snapshot's memory at MEM_OFFSET, read from the file. */
static int template_memfd(const char *path, uint8_t **mem_out, uint64_t *len_out)
{
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	uint8_t *mem;
	int fd = memfd_create("halite-test-template", 0); /* inherited: the clone opens it */

	CHECK(fd >= 0);
	CHECK_OK(halite_reader_open(&rd, path, NULL));
	fi = halite_reader_info(rd);
	mem = xmalloc(fi->memory_bytes);
	CHECK_OK(ftruncate(fd, (off_t)(MEM_OFFSET + fi->memory_bytes)));
	for (uint64_t mb = 0; mb < fi->mb_count; mb++) {
		uint64_t off = mb * fi->mb_size;
		uint32_t n = halite_reader_mb_bytes(rd, mb);

		CHECK_OK(halite_reader_read_mb(rd, mb, mem + off));
		CHECK_EQ(pwrite(fd, mem + off, n, (off_t)(MEM_OFFSET + off)), n);
	}
	*mem_out = mem;
	*len_out = fi->memory_bytes;
	halite_reader_free(rd);
	return fd;
}

static bool same_file(int a, int b)
{
	pid_t me = getpid();
	long r = syscall(SYS_kcmp, me, me, KCMP_FILE, a, b);

	return r == 0 || (r < 0 && errno == ENOSYS); /* no kcmp: not checked */
}

#define CLONE_ACCESSES 20000

static void test_clone(const char *snap, const char *synth_args)
{
	char memfile[64], sock[512], dump[512], offset[32], acc[32], cmd[600], link[64];
	char target[128];
	char *argv[64], *words, *tok, *sp, *ready, *dumped;
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MINOR_SHMEM };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MINOR };
	struct server srv = { 0 };
	struct conn c;
	struct proc p;
	struct stat st;
	uint8_t *mem;
	uint64_t len, host;
	int memfd, uffd, uffd2, argc = 0, dfd;
	cJSON *j;
	const cJSON *tids, *vcpus;
	char hex[17];

	fprintf(stderr, "clone\n");
	memfd = template_memfd(snap, &mem, &len);
	snprintf(memfile, sizeof(memfile), "/proc/%d/fd/%d", (int)getpid(), memfd);
	snprintf(sock, sizeof(sock), "%s/clone.sock", t_tmpdir());
	snprintf(dump, sizeof(dump), "%s/clone.dump", t_tmpdir());
	snprintf(offset, sizeof(offset), "%llu", MEM_OFFSET);
	snprintf(acc, sizeof(acc), "%u", CLONE_ACCESSES);
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)XXH3_64bits(mem, len));

	argv[argc++] = (char *)g_tool;
	argv[argc++] = "clone";
	argv[argc++] = "--mem-file";
	argv[argc++] = memfile;
	argv[argc++] = "--mem-offset";
	argv[argc++] = offset;
	argv[argc++] = "--control";
	argv[argc++] = sock;
	words = strdup(synth_args);
	CHECK(words);
	for (tok = strtok_r(words, " ", &sp); tok && argc < 50; tok = strtok_r(NULL, " ", &sp))
		argv[argc++] = tok;
	argv[argc++] = "--write";
	argv[argc++] = "0";
	argv[argc++] = "--pattern";
	argv[argc++] = "random";
	argv[argc++] = "--accesses";
	argv[argc++] = acc;
	argv[argc] = NULL;
	spawn(&p, argv);
	ready = read_from(p.out, 15000, true);
	CHECK(!strcmp(ready, "ready\n"));
	free(ready);
	CHECK_OK(stat(sock, &st));
	CHECK(S_ISSOCK(st.st_mode));
	CHECK_EQ(st.st_mode & 0777, 0600);

	conn_open(&c, sock);
	j = rpc(&c, "info", NULL);
	CHECK_EQ(num(j, "pid"), p.pid);
	CHECK_EQ(num(j, "mem_bytes"), len);
	CHECK_EQ(num(j, "nvcpus"), 2);
	CHECK(!strcmp(cJSON_GetObjectItem(j, "region")->valuestring, SYNTH_REGION_NAME));
	CHECK(!strcmp(cJSON_GetObjectItem(j, "state")->valuestring, "created"));
	tids = cJSON_GetObjectItem(j, "vcpu_tids");
	CHECK(cJSON_IsArray(tids) && cJSON_GetArraySize(tids) == 2);
	CHECK(cJSON_GetArrayItem(tids, 0)->valuedouble > 0);
	CHECK(cJSON_GetArrayItem(tids, 0)->valuedouble != cJSON_GetArrayItem(tids, 1)->valuedouble);
	host = strtoull(cJSON_GetObjectItem(j, "host")->valuestring, NULL, 16);
	CHECK(host && host % 4096 == 0);
	cJSON_Delete(j);

	/* The userfaultfd: one the clone made and nobody has handshaken yet. */
	j = rpc(&c, "uffd", &uffd);
	CHECK(is_ok(j));
	cJSON_Delete(j);
	CHECK(uffd >= 0);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", uffd);
	CHECK(readlink(link, target, sizeof(target) - 1) > 0);
	CHECK(strstr(target, "userfaultfd"));
	j = rpc(&c, "uffd", &uffd2); /* again: the same one */
	CHECK(is_ok(j) && uffd2 >= 0);
	cJSON_Delete(j);
	CHECK(same_file(uffd, uffd2));
	close(uffd2);
	if (ioctl(uffd, UFFDIO_API, &api)) {
		/* The first handshake fails only for lack of the feature, never EBUSY-ish reuse. */
		CHECK_EQ(errno, EINVAL);
		fprintf(stderr, "SKIP part: no UFFD_FEATURE_MINOR_SHMEM; the clone runs unserved\n");
		srv.uffd = -1;
	} else {
		/* Serve the clone's memory from outside, as the engine will. */
		reg.range.start = host;
		reg.range.len = len;
		CHECK_OK(ioctl(uffd, UFFDIO_REGISTER, &reg));
		srv.uffd = uffd;
		CHECK_EQ(pthread_create(&srv.th, NULL, server_main, &srv), 0);
	}

	check_ok(&c, "start");
	check_error(&c, "start", "already started");
	check_ok(&c, "wait-done 15000");
	j = rpc(&c, "stats", NULL);
	CHECK_EQ(num(j, "accesses"), 2 * CLONE_ACCESSES);
	CHECK_EQ(num(j, "faults"), 0); /* every walk found the template's tables */
	CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "done")));
	vcpus = cJSON_GetObjectItem(j, "vcpus");
	CHECK(cJSON_GetArraySize(vcpus) == 2);
	CHECK_EQ(num(cJSON_GetArrayItem(vcpus, 1), "accesses"), CLONE_ACCESSES);
	CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(vcpus, 1), "done")));
	cJSON_Delete(j);
	if (srv.uffd >= 0)
		CHECK(__atomic_load_n(&srv.faults, __ATOMIC_RELAXED) > 0);

	j = rpc(&c, "digest", NULL);
	CHECK(!strcmp(cJSON_GetObjectItem(j, "xxh3")->valuestring, hex));
	cJSON_Delete(j);
	snprintf(cmd, sizeof(cmd), "dump %s", dump);
	j = rpc(&c, cmd, NULL);
	CHECK(is_ok(j));
	CHECK_EQ(num(j, "bytes"), len);
	cJSON_Delete(j);
	dumped = xmalloc(len);
	dfd = open(dump, O_RDONLY | O_CLOEXEC);
	CHECK(dfd >= 0);
	CHECK_EQ(read(dfd, dumped, len), len);
	CHECK_OK(fstat(dfd, &st));
	CHECK_EQ(st.st_size, len);
	close(dfd);
	CHECK(!memcmp(dumped, mem, len));
	free(dumped);

	/* Errors name the problem and the clone keeps serving. */
	check_error(&c, "bogus thing", "unknown command: bogus");
	check_error(&c, "wait-done", "missing MS");
	check_error(&c, "wait-done soon", "bad MS");
	check_error(&c, "dump /nonexistent-dir/x", "/nonexistent-dir/x");
	check_error(&c, "info please", "takes no argument");
	check_ok(&c, "pause");
	check_ok(&c, "resume");

	/* A new connection (a restarted daemon) is served as well. */
	close(c.fd);
	conn_open(&c, sock);
	j = rpc(&c, "info", NULL);
	CHECK(!strcmp(cJSON_GetObjectItem(j, "state")->valuestring, "running"));
	cJSON_Delete(j);
	check_ok(&c, "quit");
	CHECK_EQ(wait_exit(p.pid, 10000), 0);
	CHECK(stat(sock, &st) && errno == ENOENT);

	if (srv.uffd >= 0) {
		__atomic_store_n(&srv.stop, 1, __ATOMIC_RELEASE);
		pthread_join(srv.th, NULL);
		CHECK_EQ(srv.errors, 0);
		fprintf(stderr, "  %llu minor faults served\n", (unsigned long long)srv.faults);
	}
	close(uffd);
	close(c.fd);
	close(p.out);
	close(p.err);
	close(memfd);
	unlink(dump);
	free(words);
	free(mem);
}

static void check_tool_fails(char **argv, const char *what)
{
	char *out, *err;

	CHECK_EQ(run_tool(argv, &out, &err), 2);
	if (!strstr(err, what)) {
		fprintf(stderr, "stderr lacks '%s': %s\n", what, err);
		exit(1);
	}
	free(out);
	free(err);
}

static void test_clone_args(void)
{
	char shortf[512], sock[512];
	int fd;

	fprintf(stderr, "clone's argument errors\n");
	snprintf(shortf, sizeof(shortf), "%s/short", t_tmpdir());
	snprintf(sock, sizeof(sock), "%s/args.sock", t_tmpdir());
	fd = open(shortf, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	CHECK_OK(ftruncate(fd, 8 * MIB));
	close(fd);
	check_tool_fails((char *[]){ (char *)g_tool, "clone", "--control", sock, "--mem", "8",
				     NULL }, "missing --mem-file");
	check_tool_fails((char *[]){ (char *)g_tool, "clone", "--mem-file", shortf, "--mem", "8",
				     NULL }, "missing --control");
	check_tool_fails((char *[]){ (char *)g_tool, "clone", "--mem-file", shortf, "--control",
				     sock, "--mem", "8", "--mem-offset", "4096", NULL },
			 "too short");
	check_tool_fails((char *[]){ (char *)g_tool, "clone", "--mem-file", shortf, "--control",
				     sock, "--frobnicate", NULL }, "unknown option '--frobnicate'");
	check_tool_fails((char *[]){ (char *)g_tool, "clone", "--mem-file", shortf, "--control",
				     sock, "--seconds", "3", NULL }, "--seconds is not an option");
	check_tool_fails((char *[]){ (char *)g_tool, "save", "--mem", "8", NULL },
			 "missing --out");
	unlink(shortf);
}

int main(int argc, char **argv)
{
	struct halite_uffd_caps caps;
	char snap[512], *args;
	int ret;

	if (argc != 2) {
		fprintf(stderr, "usage: test_clone PATH-TO-halite-synth\n");
		return 1;
	}
	g_tool = argv[1];
	g_seed = t_seed("test_clone");
	snprintf(snap, sizeof(snap), "%s/tool.hal", t_tmpdir());

	/* The argument errors need no userfaultfd; the saves and the clone do. */
	test_clone_args();
	ret = halite_uffd_probe(&caps);
	if (ret) {
		fprintf(stderr, "no userfaultfd (%s; root, or vm.unprivileged_userfaultfd=1): "
			"saves and clone skipped\n", strerror(-ret));
		rmdir(t_tmpdir());
		return 77;
	}
	test_save_in_process();
	test_save_tool(snap, &args);
	test_clone(snap, args);
	free(args);
	unlink(snap);
	snprintf(snap, sizeof(snap), "%s/inproc.hal", t_tmpdir());
	unlink(snap);
	rmdir(t_tmpdir());
	fprintf(stderr, "ok\n");
	return 0;
}
