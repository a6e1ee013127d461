// SPDX-License-Identifier: MIT
/*
 * What halite-qemu does inside a running QEMU through ptrace (inject.c): a
 * userfaultfd made there and brought here, or found after a dead handler;
 * descriptors closed; guest RAM moved aside, unmapped or dropped for a save
 * of private RAM, each move written first to the save's record so that
 * 'save --recover' can give it back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proc.h"
#include "inside.h"
#include "records.h"
#include "inject.h"

/*
 * Why the kernel refused QEMU @pid a userfaultfd: its user without
 * CAP_SYS_PTRACE while vm.unprivileged_userfaultfd is 0, or a seccomp
 * filter (QEMU's -sandbox). Into @why as " (...)".
 */
static void uffd_eperm(pid_t pid, char *why, size_t len)
{
	struct hq_proc_status st;
	int sysctl = -1;
	FILE *f;

	f = fopen("/proc/sys/vm/unprivileged_userfaultfd", "re");
	if (f) {
		if (fscanf(f, "%d", &sysctl) != 1)
			sysctl = -1;
		fclose(f);
	}
	if (hq_proc_status(pid, &st))
		return;
	/* CAP_SYS_PTRACE is 19: with it, userfaultfd() needs no sysctl. */
	if (sysctl == 0 && st.euid && !(st.cap_eff & (1ull << 19)))
		snprintf(why, len, " (QEMU runs as uid %u, and vm.unprivileged_userfaultfd is 0: "
			 "'sysctl vm.unprivileged_userfaultfd=1' lets it make one)", (unsigned)st.euid);
	else if (st.seccomp == 2)
		snprintf(why, len, " (QEMU runs under a seccomp filter, its -sandbox, that "
			 "refuses userfaultfd())");
}

int hq_vm_uffd(struct hq_vm *vm, int *remote)
{
	long args[6] = { O_CLOEXEC | O_NONBLOCK }, res = 0;
	char err[512];
	int ret, fd;

	ret = hq_inject_one(vm->pid, SYS_userfaultfd, args, &res, err, sizeof(err));
	if (ret) {
		hq_vmsetf(vm, "creating a userfaultfd inside QEMU: %s", err);
		return ret;
	}
	if (res < 0) {
		char why[256] = "";

		if (res == -EPERM)
			uffd_eperm(vm->pid, why, sizeof(why));
		hq_vmsetf(vm, "userfaultfd() inside QEMU (pid %d): %s%s", (int)vm->pid,
			  strerror((int)-res), why);
		return (int)res;
	}
	fd = hq_fd_from_process(vm->pid, (int)res, err, sizeof(err));
	if (fd < 0)
		hq_vmsetf(vm, "%s", err);
	if (fd < 0 || !remote)
		hq_vm_close_remote(vm, (int)res);
	else
		*remote = (int)res;
	return fd;
}

int hq_vm_find_uffd(struct hq_vm *vm, int *remote)
{
	char err[512];
	int found = -1, n, fd;

	n = hq_proc_fds_to(vm->pid, "anon_inode:[userfaultfd]", &found, 1);
	if (n < 0) {
		hq_vmsetf(vm, "/proc/%d/fd: %s", (int)vm->pid, strerror(-n));
		return n;
	}
	if (!n) {
		hq_vmsetf(vm, "QEMU (pid %d) holds no userfaultfd: not a halite-qemu restore, or "
			  "one that finished", (int)vm->pid);
		return -ENOENT;
	}
	if (n > 1) {
		hq_vmsetf(vm, "QEMU (pid %d) holds %d userfaultfds: which one is the restore's is "
			  "not known", (int)vm->pid, n);
		return -EEXIST;
	}
	fd = hq_fd_from_process(vm->pid, found, err, sizeof(err));
	if (fd < 0) {
		hq_vmsetf(vm, "%s", err);
		return fd;
	}
	*remote = found;
	return fd;
}

/* "KEY=VALUE" in a comma-separated option list, into @out. */
static bool opt_value(const char *opts, const char *key, char *out, size_t len)
{
	size_t kl = strlen(key);

	for (const char *p = opts; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, key, kl) && p[kl] == '=') {
			size_t n = strcspn(p + kl + 1, ",");

			snprintf(out, len, "%.*s", (int)n, p + kl + 1);
			return true;
		}
	return false;
}

int hq_qmp_sockets(pid_t pid, char (*paths)[108], int max)
{
	char *buf, *argv[4096];
	size_t used;
	int argc = 0, n = 0;

	buf = hq_read_proc(pid, "cmdline", &used);
	if (!buf)
		return 0;
	for (size_t i = 0; i < used && argc < 4096; i += strlen(buf + i) + 1)
		argv[argc++] = buf + i;
	/* Last first: a later socket is more likely ours and free. */
	for (int i = argc - 2; i >= 0 && n < max; i--) {
		const char *a = argv[i][0] == '-' && argv[i][1] == '-' ? argv[i] + 1 : argv[i];

		if (!strcmp(a, "-qmp") && !strncmp(argv[i + 1], "unix:", 5)) {
			snprintf(paths[n++], 108, "%.*s", (int)strcspn(argv[i + 1] + 5, ","),
				 argv[i + 1] + 5);
		} else if (!strcmp(a, "-mon")) {
			char id[64], mode[32], cid[64], sock[108];

			if (!opt_value(argv[i + 1], "chardev", id, sizeof(id)) ||
			    !opt_value(argv[i + 1], "mode", mode, sizeof(mode)) ||
			    strcmp(mode, "control"))
				continue;
			for (int j = 0; j + 1 < argc; j++)
				if (!strcmp(argv[j], "-chardev") &&
				    !strncmp(argv[j + 1], "socket,", 7) &&
				    opt_value(argv[j + 1], "id", cid, sizeof(cid)) && !strcmp(cid, id) &&
				    opt_value(argv[j + 1], "path", sock, sizeof(sock)) && n < max)
					snprintf(paths[n++], 108, "%s", sock);
		}
	}
	free(buf);
	return n;
}

int hq_vm_close_remote(struct hq_vm *vm, int remote)
{
	long args[6] = { remote }, res = 0;
	char err[512];
	int ret;

	ret = hq_inject_one(vm->pid, SYS_close, args, &res, err, sizeof(err));
	if (ret) {
		hq_vmsetf(vm, "closing descriptor %d inside QEMU: %s", remote, err);
		return ret;
	}
	return (int)res;
}

int hq_aside_record_create(struct hq_vm *vm, bool running)
{
	char path[128], head[64];
	int n;

	hq_aside_record_path(vm->pid, path, sizeof(path));
	if (mkdir(HQ_ASIDE_DIR, 0700) && errno != EEXIST) {
		hq_vmsetf(vm, "%s: %s", HQ_ASIDE_DIR, strerror(errno));
		return -errno;
	}
	hq_records_prune();
	vm->aside_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (vm->aside_fd < 0) {
		hq_vmsetf(vm, "%s: %s", path, strerror(errno));
		return -errno;
	}
	n = snprintf(head, sizeof(head), "halite-qemu-aside 1\nrun-state %s\n",
		     running ? "running" : "paused");
	if (write(vm->aside_fd, head, (size_t)n) != n || fsync(vm->aside_fd)) {
		hq_vmsetf(vm, "%s: %s", path, strerror(errno));
		return -EIO;
	}
	return 0;
}

void hq_aside_record_remove(struct hq_vm *vm)
{
	char path[128];

	if (vm->aside_fd < 0)
		return;
	close(vm->aside_fd);
	vm->aside_fd = -1;
	hq_aside_record_path(vm->pid, path, sizeof(path));
	unlink(path);
}

/* mmap, mremap or munmap inside QEMU: its result (an address, or -errno) in *@res. */
static int inject(struct hq_vm *vm, long nr, const char *what, const long args[6], long *res)
{
	char err[512];
	int ret = hq_inject_one(vm->pid, nr, args, res, err, sizeof(err));

	if (ret)
		hq_vmsetf(vm, "%s inside QEMU: %s", what, err);
	else if (*res < 0 && *res > -4096)
		ret = (int)*res;
	return ret;
}

int hq_remap(void *ctx, uint64_t addr, uint64_t len, uint64_t to, uint64_t *res)
{
	struct hq_vm *vm = ctx;
	long reserve[6] = { 0, (long)len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			    -1, 0 };
	long move[6] = { (long)addr, (long)len, (long)len,
			 MREMAP_MAYMOVE | (to ? MREMAP_FIXED : MREMAP_DONTUNMAP), (long)to };
	long r = 0, at;
	char line[128];
	off_t end;
	int ret, n;

	if (to || vm->aside_fd < 0) {
		ret = inject(vm, SYS_mremap, "mremap", move, &r);
		*res = (uint64_t)r;
		return ret;
	}
	/*
	 * Aside, for a save with a record: the pages there are the only copy
	 * of what the guest has not touched yet, so where they go is chosen
	 * first (a reservation, no memory), recorded and synced, and only then
	 * are they moved. Dead at any point, the save leaves either nothing
	 * moved or a record that finds them ('save --recover').
	 */
	ret = inject(vm, SYS_mmap, "mmap", reserve, &at);
	if (ret)
		return ret;
	errno = 0;
	end = lseek(vm->aside_fd, 0, SEEK_END);
	n = snprintf(line, sizeof(line), "aside 0x%" PRIx64 " 0x%" PRIx64 " 0x%" PRIx64 "\n", addr,
		     len, (uint64_t)at);
	if (end < 0 || write(vm->aside_fd, line, (size_t)n) != n || fsync(vm->aside_fd)) {
		ret = errno ? -errno : -EIO;
		hq_vmsetf(vm, "the save's record (" HQ_ASIDE_DIR "): %s", strerror(-ret));
		goto unreserve;
	}
	move[3] |= MREMAP_FIXED;
	move[4] = at;
	ret = inject(vm, SYS_mremap, "mremap", move, &r);
	if (!ret) {
		*res = (uint64_t)r;
		return 0;
	}
unreserve:
	/* Out of the record before the reservation goes: its address may be reused. */
	if (end >= 0 && (ftruncate(vm->aside_fd, end) || fsync(vm->aside_fd)))
		return ret;	/* the reservation stays, harmless, where the record says */
	hq_unmap(vm, (uint64_t)at, len);
	return ret;
}

int hq_unmap(void *ctx, uint64_t addr, uint64_t len)
{
	long args[6] = { (long)addr, (long)len }, r = 0;

	return inject(ctx, SYS_munmap, "munmap", args, &r);
}

int hq_drop_ptes(void *ctx, uint64_t addr, uint64_t len)
{
	struct hq_vm *vm = ctx;
	long args[6] = { (long)addr, (long)len, MADV_DONTNEED }, res = 0;
	char err[512];
	int ret;

	ret = hq_inject_one(vm->pid, SYS_madvise, args, &res, err, sizeof(err));
	if (ret) {
		hq_vmsetf(vm, "madvise inside QEMU: %s", err);
		return ret;
	}
	return (int)res;
}
