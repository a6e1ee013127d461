/* SPDX-License-Identifier: MIT */
/* delayfs (delayfs.h): a FUSE low-level server for one read-only file. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "delayfs.h"
#include "stats.h"

#define DELAYFS_NAME "image"
#define FILE_INO 2
#define ALIGN 4096u
/* Concurrent requests served at most (the kernel keeps 12 reads in flight by default). */
#define MAX_THREADS 16

struct delayfs_shared { /* one shared page, written by the child */
	_Atomic uint64_t requests;
	_Atomic uint64_t bytes;
	_Atomic uint64_t holes; /* requests answered with zeros at once: wholly in a hole */
};

struct delayfs {
	char *dir, *file;
	pid_t child;
	struct delayfs_shared *sh;
};

/* The child's state. */
struct server {
	int fd;
	uint64_t size;
	uint32_t latency_us;
	struct delayfs_shared *sh;
};

static void fill_attr(const struct server *s, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)s->size;
		st->st_blksize = ALIGN;
		st->st_blocks = (blkcnt_t)((s->size + 511) / 512);
	}
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	const struct server *s = fuse_req_userdata(req);
	struct fuse_entry_param e = { .ino = FILE_INO, .attr_timeout = 3600,
				      .entry_timeout = 3600 };

	if (parent != FUSE_ROOT_ID || strcmp(name, DELAYFS_NAME)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_attr(s, FILE_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	if (ino != FUSE_ROOT_ID && ino != FILE_INO) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_attr(fuse_req_userdata(req), ino, &st);
	fuse_reply_attr(req, &st, 3600);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != FILE_INO)
		fuse_reply_err(req, EISDIR);
	else if ((fi->flags & O_ACCMODE) != O_RDONLY)
		fuse_reply_err(req, EACCES);
	else
		fuse_reply_open(req, fi); /* page cache on, no direct_io: mmap works */
}

/*
 * Reads go through an aligned bounce buffer covering whole 4 KiB blocks, so
 * O_DIRECT works whatever the request's offset and size (the kernel's are
 * page-aligned anyway).
 */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct server *s = fuse_req_userdata(req);
	uint64_t t = halite_now_ns(), a_off, a_end, got = 0;
	uint8_t *buf = NULL;
	size_t out = 0;

	if ((uint64_t)off >= s->size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if ((uint64_t)off + size > s->size)
		size = (size_t)(s->size - (uint64_t)off);
	/*
	 * A request wholly inside a hole of the file: on the file's own file
	 * system the kernel would answer it with zeros and no I/O, so no
	 * latency and no count here either.
	 */
	{
		off_t d = lseek(s->fd, off, SEEK_DATA);

		if ((d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= (uint64_t)off + size)) {
			buf = calloc(1, size);
			if (!buf) {
				fuse_reply_err(req, ENOMEM);
				return;
			}
			atomic_fetch_add(&s->sh->holes, 1);
			fuse_reply_buf(req, (const char *)buf, size);
			free(buf);
			return;
		}
	}
	a_off = (uint64_t)off & ~(uint64_t)(ALIGN - 1);
	a_end = ((uint64_t)off + size + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
	if (posix_memalign((void **)&buf, ALIGN, a_end - a_off)) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	while (got < a_end - a_off) {
		ssize_t n = pread(s->fd, buf + got, a_end - a_off - got, (off_t)(a_off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int err = errno;

			free(buf);
			fuse_reply_err(req, err);
			return;
		}
		if (n == 0)
			break;
		got += (uint64_t)n;
	}
	if (got > (uint64_t)off - a_off)
		out = (size_t)(got - ((uint64_t)off - a_off));
	if (out > size)
		out = size;
	if (s->latency_us) {
		uint64_t due = t + (uint64_t)s->latency_us * 1000u;
		struct timespec ts = { (time_t)(due / 1000000000u), (long)(due % 1000000000u) };

		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	atomic_fetch_add(&s->sh->requests, 1);
	atomic_fetch_add(&s->sh->bytes, out);
	fuse_reply_buf(req, (const char *)buf + ((uint64_t)off - a_off), out);
	free(buf);
}

static const struct fuse_lowlevel_ops ops = {
	.lookup = op_lookup,
	.getattr = op_getattr,
	.open = op_open,
	.read = op_read,
};

/* The child: never returns. Reports readiness (one byte) on @ready. */
static void serve(const char *dir, const char *path, uint32_t latency_us, bool direct,
		  struct delayfs_shared *sh, int ready, pid_t parent)
{
	char *argv[] = { "delayfs", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(1, argv);
	struct server s = { .latency_us = latency_us, .sh = sh };
	struct fuse_session *se;
	struct fuse_loop_config *lc;
	struct stat st;
	int ret;

	if (prctl(PR_SET_PDEATHSIG, SIGTERM) || getppid() != parent)
		_exit(1);
	s.fd = open(path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
	if (s.fd < 0 || fstat(s.fd, &st)) {
		fprintf(stderr, "delayfs: open %s: %s\n", path, strerror(errno));
		_exit(1);
	}
	s.size = (uint64_t)st.st_size;
	se = fuse_session_new(&args, &ops, sizeof(ops), &s);
	if (!se)
		_exit(1);
	if (fuse_set_signal_handlers(se) || fuse_session_mount(se, dir)) {
		fprintf(stderr, "delayfs: cannot mount on %s\n", dir);
		_exit(1);
	}
	if (write(ready, "1", 1) != 1)
		_exit(1);
	close(ready);
	lc = fuse_loop_cfg_create();
	if (!lc)
		_exit(1);
	fuse_loop_cfg_set_clone_fd(lc, 0);
	fuse_loop_cfg_set_max_threads(lc, MAX_THREADS);
	fuse_loop_cfg_set_idle_threads(lc, MAX_THREADS);
	ret = fuse_session_loop_mt(se, lc);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	_exit(ret < 0 ? 1 : 0);
}

static void reap(pid_t pid)
{
	/* The loop ends once the mount is gone; give it a moment, then insist. */
	for (int i = 0; i < 300; i++) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };

		if (waitpid(pid, NULL, WNOHANG) != 0)
			return;
		if (i == 100)
			kill(pid, SIGTERM);
		if (i == 200)
			kill(pid, SIGKILL);
		nanosleep(&ts, NULL);
	}
	waitpid(pid, NULL, 0);
}

int delayfs_mount(struct delayfs **dp, const char *dir, const char *path, uint32_t latency_us,
		  bool direct)
{
	struct delayfs *d = calloc(1, sizeof(*d));
	int pfd[2] = { -1, -1 }, ret = 0;
	pid_t parent = getpid();
	char c;

	if (!d)
		return -ENOMEM;
	d->child = -1;
	d->dir = strdup(dir);
	if (!d->dir || asprintf(&d->file, "%s/" DELAYFS_NAME, dir) < 0) {
		d->file = NULL;
		ret = -ENOMEM;
		goto fail;
	}
	d->sh = mmap(NULL, sizeof(*d->sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		     -1, 0);
	if (d->sh == MAP_FAILED) {
		d->sh = NULL;
		ret = -errno;
		goto fail;
	}
	if (pipe2(pfd, O_CLOEXEC)) {
		ret = -errno;
		goto fail;
	}
	fflush(NULL);
	d->child = fork();
	if (d->child < 0) {
		ret = -errno;
		fprintf(stderr, "delayfs: fork: %s\n", strerror(errno));
		goto fail;
	}
	if (d->child == 0) {
		close(pfd[0]);
		serve(dir, path, latency_us, direct, d->sh, pfd[1], parent);
	}
	close(pfd[1]);
	pfd[1] = -1;
	{
		struct pollfd p = { pfd[0], POLLIN, 0 };

		if (poll(&p, 1, 10000) != 1 || read(pfd[0], &c, 1) != 1) {
			fprintf(stderr, "delayfs: the file system on %s did not come up\n", dir);
			ret = -EIO;
			goto fail;
		}
	}
	close(pfd[0]);
	*dp = d;
	return 0;
fail:
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	delayfs_unmount(d);
	return ret;
}

const char *delayfs_file(const struct delayfs *d)
{
	return d->file;
}

void delayfs_counts(const struct delayfs *d, uint64_t *requests, uint64_t *bytes)
{
	*requests = atomic_load(&d->sh->requests);
	*bytes = atomic_load(&d->sh->bytes);
}

void delayfs_unmount(struct delayfs *d)
{
	if (!d)
		return;
	if (d->child > 0) {
		/*
		 * We are root: unmount directly (what fusermount3 -u does).
		 * EINVAL: not mounted (the child failed, or died and unmounted).
		 */
		if (umount2(d->dir, 0) && errno == EBUSY)
			umount2(d->dir, MNT_DETACH);
		reap(d->child);
	}
	if (d->sh)
		munmap(d->sh, sizeof(*d->sh));
	free(d->dir);
	free(d->file);
	free(d);
}
