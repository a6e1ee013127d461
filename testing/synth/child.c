// SPDX-License-Identifier: MIT
/*
 * Child mode: the whole guest (memory, page tables, vCPU threads) lives in a
 * forked child, the way a QEMU process holds a VM, and the parent drives it
 * over a socketpair with the same API: guest.c forwards each call here, and
 * the child answers it from its guest in-process (local.c). The engine under
 * test works from outside: it gets a userfaultfd created in the child, the
 * memfd, and asks the child to drop its page-table entries.
 *
 * Protocol: one request, one reply, strictly alternating; a message is a
 * struct synth_msg followed by len payload bytes, and a descriptor may ride
 * on it (SCM_RIGHTS). Both ends are the same binary forked from one image,
 * so structs travel as they are; this is IPC, not a file format.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

struct synth_msg {
	uint32_t op;
	int32_t ret;
	uint32_t len;	/* payload bytes that follow */
	uint32_t pad;
	uint64_t a[3];
};

/* The largest reply payload: 8192 log entries, 4096 page pairs, 64 Ki kinds. */
#define MAX_PAYLOAD (64u << 10)
#define EXIT_WAIT_MS 10000

struct synth_remote {
	pid_t pid;
	int sock;
	pthread_mutex_t mu;	/* one request/reply at a time */
	bool dead;		/* transport failed: the child is gone */
	bool running;		/* started and not paused: copies refused */
	int memfd;
	void *local_map;
	int pagemap_fd;
};

struct hello {
	struct synth_info info;
	struct synth_vcpu_info vcpu[SYNTH_MAX_VCPUS];
};

static int send_msg(int sock, const struct synth_msg *m, const void *payload, int fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} c;
	struct iovec iov[2] = {
		{ .iov_base = (void *)m, .iov_len = sizeof(*m) },
		{ .iov_base = (void *)payload, .iov_len = m->len },
	};
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = m->len ? 2 : 1 };
	size_t total = sizeof(*m) + m->len, sent = 0;

	if (fd >= 0) {
		struct cmsghdr *ch;

		memset(&c, 0, sizeof(c));
		mh.msg_control = c.buf;
		mh.msg_controllen = sizeof(c.buf);
		ch = CMSG_FIRSTHDR(&mh);
		ch->cmsg_level = SOL_SOCKET;
		ch->cmsg_type = SCM_RIGHTS;
		ch->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(ch), &fd, sizeof(int));
	}
	while (sent < total) {
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		sent += (size_t)n;
		/* A stream socket may take part of it; the descriptor went with byte 0. */
		mh.msg_control = NULL;
		mh.msg_controllen = 0;
		while (n > 0 && mh.msg_iovlen) {
			size_t k = (size_t)n < mh.msg_iov->iov_len ? (size_t)n : mh.msg_iov->iov_len;

			mh.msg_iov->iov_base = (char *)mh.msg_iov->iov_base + k;
			mh.msg_iov->iov_len -= k;
			n -= (ssize_t)k;
			if (!mh.msg_iov->iov_len) {
				mh.msg_iov++;
				mh.msg_iovlen--;
			}
		}
	}
	return 0;
}

static int recv_all(int sock, void *buf, size_t len, int *fd)
{
	size_t got = 0;

	while (got < len) {
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} c;
		struct iovec iov = { .iov_base = (char *)buf + got, .iov_len = len - got };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = c.buf, .msg_controllen = sizeof(c.buf) };
		ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); ch; ch = CMSG_NXTHDR(&mh, ch)) {
			int f;

			if (ch->cmsg_level != SOL_SOCKET || ch->cmsg_type != SCM_RIGHTS)
				continue;
			memcpy(&f, CMSG_DATA(ch), sizeof(int));
			if (fd && *fd < 0)
				*fd = f;
			else
				close(f);
		}
		got += (size_t)n;
	}
	return 0;
}

/* Receive one message; a payload longer than @cap is a protocol error. */
static int recv_msg(int sock, struct synth_msg *m, void *payload, size_t cap, int *fd)
{
	int ret = recv_all(sock, m, sizeof(*m), fd);

	if (ret)
		return ret;
	if (m->len > cap)
		return -EPROTO;
	return m->len ? recv_all(sock, payload, m->len, NULL) : 0;
}

/* --- the child --- */

static int reply(int sock, const struct synth_msg *req, int ret, const void *payload,
		 uint32_t len, int fd)
{
	struct synth_msg m = { .op = req->op, .ret = ret, .len = len };

	return send_msg(sock, &m, payload, fd);
}

static void serve(struct synth_guest *g, int sock, uint8_t *buf)
{
	struct synth_msg req;
	uint64_t *w = (uint64_t *)buf;

	while (!recv_msg(sock, &req, NULL, 0, NULL)) {
		uint64_t a0 = req.a[0], a1 = req.a[1], a2 = req.a[2];
		uint32_t len = 0;
		int ret, fd = -1;

		switch (req.op) {
		case OP_START:
			ret = synth_local_run(g, true);
			break;
		case OP_PAUSE:
			ret = synth_local_pause(g, a0 == UINT64_MAX ? -1 :
						   a0 > UINT_MAX ? (long)UINT_MAX : (long)a0);
			break;
		case OP_RESUME:
			ret = synth_local_run(g, false);
			break;
		case OP_STOP:
			ret = synth_local_stop(g);
			break;
		case OP_WAIT_DONE:
			ret = synth_local_wait_done(g, a0 > UINT_MAX ? UINT_MAX : (unsigned)a0);
			break;
		case OP_STATS:
			ret = a0 < g->nvcpus ? 0 : -EINVAL;
			if (!ret)
				synth_local_vcpu_stats(g, (unsigned)a0, (struct synth_vcpu_stats *)buf);
			len = ret ? 0 : sizeof(struct synth_vcpu_stats);
			break;
		case OP_LOG_READ:
			ret = a0 < g->nvcpus ?
				synth_local_log_read(g, (unsigned)a0, a1, w,
						     a2 < MAX_PAYLOAD / 8 ? a2 : MAX_PAYLOAD / 8) :
				-EINVAL;
			len = ret > 0 ? (uint32_t)ret * 8 : 0;
			break;
		case OP_PAGES: {
			size_t n = a2 < MAX_PAYLOAD / 16 ? a2 : MAX_PAYLOAD / 16;
			uint64_t va[MAX_PAYLOAD / 16], gpa[MAX_PAYLOAD / 16];

			ret = a0 < g->nvcpus ?
				synth_local_vcpu_pages(g, (unsigned)a0, a1, va, gpa, n) : -EINVAL;
			for (int i = 0; i < ret; i++) {
				w[2 * i] = va[i];
				w[2 * i + 1] = gpa[i];
			}
			len = ret > 0 ? (uint32_t)ret * 16 : 0;
			break;
		}
		case OP_KINDS:
			ret = synth_local_frame_kinds(g, a0, buf, a1 < MAX_PAYLOAD ? a1 : MAX_PAYLOAD);
			len = ret > 0 ? (uint32_t)ret : 0;
			break;
		case OP_LOG_RESET:
			ret = synth_local_log_reset(g);
			break;
		case OP_TRACE_FLUSH:
			ret = synth_local_trace_flush(g);
			break;
		case OP_UFFD:
			fd = synth_local_get_uffd();
			ret = fd < 0 ? fd : 0;
			break;
		case OP_MADVISE:
			ret = synth_local_madvise_dontneed(g, a0, a1);
			break;
		case OP_EXIT:
			reply(sock, &req, 0, NULL, 0, -1);
			return;
		default:
			ret = -EINVAL;
			break;
		}
		if (reply(sock, &req, ret, buf, len, fd))
			return;
		/* Our copy of a passed descriptor: the parent holds it now. */
		if (fd >= 0)
			close(fd);
	}
}

static void __attribute__((noreturn)) child_main(const struct synth_opts *po, int sock)
{
	struct synth_guest *g = NULL;
	struct synth_opts o = *po;
	struct synth_msg m = { .op = OP_HELLO };
	struct hello h;
	uint8_t *buf;
	int ret;

	/*
	 * Hold nothing of the parent's but the socket and stdio: an inherited
	 * userfaultfd or socket end would outlive the parent's close of it.
	 */
	if (sock > 3)
		close_range(3, (unsigned)sock - 1, 0);
	close_range((unsigned)sock + 1, ~0u, 0);

	o.flags &= ~SYNTH_F_CHILD;
	buf = malloc(MAX_PAYLOAD);
	ret = buf ? synth_local_create(&g, &o) : -ENOMEM;
	m.ret = ret;
	if (ret) {
		send_msg(sock, &m, NULL, -1);
		_exit(1);
	}
	memset(&h, 0, sizeof(h));
	synth_info(g, &h.info);
	for (unsigned v = 0; v < g->nvcpus; v++)
		synth_vcpu_info(g, v, &h.vcpu[v]);
	m.len = sizeof(h);
	if (!send_msg(sock, &m, &h, g->memfd))
		serve(g, sock, buf);
	/* Parent gone or asked us to go: stop the vCPUs, flush the trace. */
	synth_local_free(g);
	free(buf);
	_exit(0);
}

/* --- the parent --- */

int synth_remote_call(struct synth_guest *g, unsigned op, uint64_t a0, uint64_t a1,
		      uint64_t a2, void *out, size_t out_len, int *fd_out)
{
	struct synth_remote *r = g->rem;
	struct synth_msg m = { .op = op, .a = { a0, a1, a2 } };
	int ret, fd = -1;

	pthread_mutex_lock(&r->mu);
	if (r->dead) {
		ret = -EPIPE;
		goto out;
	}
	ret = send_msg(r->sock, &m, NULL, -1);
	if (!ret)
		ret = recv_msg(r->sock, &m, out, out_len, &fd);
	if (!ret && m.op != op)
		ret = -EPROTO;
	if (ret) {
		/* Out of step or gone: never trust this socket again. */
		r->dead = true;
		synth_err(g, "child %d: lost the control socket: %s", (int)r->pid, strerror(-ret));
		goto out;
	}
	ret = m.ret;
	if (ret >= 0 && (op == OP_START || op == OP_RESUME))
		r->running = true;
	if ((ret >= 0 && op == OP_PAUSE) || op == OP_STOP)
		r->running = false;
	if (fd_out && ret >= 0) {
		if (fd < 0)
			ret = -EPROTO;
		*fd_out = fd;
		fd = -1;
	}
out:
	pthread_mutex_unlock(&r->mu);
	if (fd >= 0)
		close(fd);
	return ret;
}

int synth_remote_create(struct synth_guest *g)
{
	struct synth_remote *r = calloc(1, sizeof(*r));
	struct synth_msg m;
	struct hello *h = NULL;
	int sv[2], ret, fd = -1;
	pid_t pid;

	if (!r)
		return -ENOMEM;
	r->memfd = -1;
	r->pagemap_fd = -1;
	pthread_mutex_init(&r->mu, NULL);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		ret = -errno;
		goto fail_r;
	}
	pid = fork();
	if (pid < 0) {
		ret = -errno;
		close(sv[0]);
		close(sv[1]);
		goto fail_r;
	}
	if (pid == 0) {
		close(sv[0]);
		child_main(&g->o, sv[1]);
	}
	close(sv[1]);
	r->pid = pid;
	r->sock = sv[0];
	g->rem = r;

	h = malloc(sizeof(*h));
	ret = h ? recv_msg(r->sock, &m, h, sizeof(*h), &fd) : -ENOMEM;
	if (!ret && m.op != OP_HELLO)
		ret = -EPROTO;
	if (!ret)
		ret = m.ret;
	if (!ret && m.len != sizeof(*h))
		ret = -EPROTO;
	if (!ret && g->o.backing == SYNTH_MEM_SHARED && fd < 0)
		ret = -EPROTO;
	if (ret)
		goto fail;

	g->info = h->info;
	g->info.memfd = fd;
	g->info.local_addr = NULL;
	r->memfd = fd;
	fd = -1;
	if (r->memfd >= 0) {
		/* Read-only: the parent looks; writing is the engine's business. */
		r->local_map = mmap(NULL, (size_t)g->info.mem_bytes, PROT_READ, MAP_SHARED,
				    r->memfd, 0);
		if (r->local_map == MAP_FAILED) {
			ret = -errno;
			r->local_map = NULL;
			goto fail;
		}
		g->info.local_addr = r->local_map;
	}
	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		vc->g = g;
		vc->idx = v;
		vc->tid = h->vcpu[v].tid;
		vc->cr3 = h->vcpu[v].cr3;
		vc->vbase = h->vcpu[v].vbase;
		vc->vspan = h->vcpu[v].vspan;
		vc->map_units = h->vcpu[v].map_units;
		vc->ws_units = h->vcpu[v].ws_units;
	}
	free(h);
	return 0;

fail:
	free(h);
	if (fd >= 0)
		close(fd);
	synth_remote_free(g);
	return ret;
fail_r:
	pthread_mutex_destroy(&r->mu);
	free(r);
	return ret;
}

void synth_remote_free(struct synth_guest *g)
{
	struct synth_remote *r = g->rem;
	struct synth_msg m = { .op = OP_EXIT };
	int status;

	if (!r)
		return;
	/* No wait for the reply: a child stuck in a fault must not hang us. */
	if (!r->dead)
		send_msg(r->sock, &m, NULL, -1);
	close(r->sock);
	for (int ms = 0;; ms++) {
		pid_t p = waitpid(r->pid, &status, WNOHANG);

		if (p == r->pid || (p < 0 && errno != EINTR))
			break;
		if (ms == EXIT_WAIT_MS) {
			synth_err(g, "child %d did not exit in %d ms: killing it", (int)r->pid,
				  EXIT_WAIT_MS);
			kill(r->pid, SIGKILL);
			waitpid(r->pid, &status, 0);
			break;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
	if (r->local_map)
		munmap(r->local_map, (size_t)g->info.mem_bytes);
	if (r->memfd >= 0)
		close(r->memfd);
	if (r->pagemap_fd >= 0)
		close(r->pagemap_fd);
	pthread_mutex_destroy(&r->mu);
	free(r);
	g->rem = NULL;
}

/* process_vm_readv of a run of pages, looping over partial transfers. */
static int vm_read(pid_t pid, uint8_t *dst, uint64_t src, uint64_t len)
{
	while (len) {
		struct iovec l = { .iov_base = dst, .iov_len = (size_t)len };
		struct iovec rm = { .iov_base = (void *)(uintptr_t)src, .iov_len = (size_t)len };
		ssize_t n = process_vm_readv(pid, &l, 1, &rm, 1, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		dst += n;
		src += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/*
 * Anon memory of the child: the child's pagemap says which pages exist
 * (present or swapped); only those are read, so a never-touched page stays
 * unpopulated in the child, as with mincore in-process. Without the pagemap
 * everything is read.
 */
static int anon_copy_remote(struct synth_guest *g, uint64_t gpa, uint64_t len, uint8_t *buf)
{
	struct synth_remote *r = g->rem;
	uint64_t base = (uint64_t)(uintptr_t)g->info.host_addr;
	enum { CHUNK = 512 };
	uint64_t pm[CHUNK];
	char path[64];

	if (r->pagemap_fd < 0) {
		snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)r->pid);
		r->pagemap_fd = open(path, O_RDONLY | O_CLOEXEC);
		if (r->pagemap_fd < 0)
			return vm_read(r->pid, buf, base + gpa, len);
	}
	for (uint64_t done = 0; done < len;) {
		uint64_t n = (len - done) / PG_SIZE < CHUNK ? (len - done) / PG_SIZE : CHUNK;
		uint64_t first = (base + gpa + done) / PG_SIZE, i = 0;
		ssize_t got = pread(r->pagemap_fd, pm, n * 8, (off_t)(first * 8));

		if (got != (ssize_t)(n * 8))
			return got < 0 ? -errno : -EIO;
		while (i < n) {
			bool there = pm[i] & (3ull << 62); /* present or swapped */
			uint64_t j = i + 1;
			int ret;

			while (j < n && !!(pm[j] & (3ull << 62)) == there)
				j++;
			if (there) {
				ret = vm_read(r->pid, buf + done + i * PG_SIZE,
					      base + gpa + done + i * PG_SIZE, (j - i) * PG_SIZE);
				if (ret)
					return ret;
			} else {
				memset(buf + done + i * PG_SIZE, 0, (size_t)((j - i) * PG_SIZE));
			}
			i = j;
		}
		done += n * PG_SIZE;
	}
	return 0;
}

int synth_remote_copy(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf)
{
	struct synth_remote *r = g->rem;
	int ret;

	/* Under the call mutex: nobody resumes the guest while we copy. */
	pthread_mutex_lock(&r->mu);
	if (r->running)
		ret = -EBUSY;
	else if (r->memfd >= 0)
		ret = synth_memfd_copy(r->memfd, gpa, len, buf);
	else
		ret = anon_copy_remote(g, gpa, len, buf);
	pthread_mutex_unlock(&r->mu);
	return ret;
}
