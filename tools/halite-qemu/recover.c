// SPDX-License-Identifier: MIT
/*
 * halite-qemu save --recover: finish the way out of a save of private RAM
 * whose halite-qemu died (SIGKILL, a crash).
 *
 * Such a save moves QEMU's pages aside inside QEMU (mremap, MREMAP_DONTUNMAP)
 * and gives each block back as the guest touches it or the background pass
 * reaches it. Until it has given back a block, the pages moved aside hold
 * its only copy, and QEMU keeps the userfaultfd, so a guest access to it
 * blocks instead of reading zeros. The save's record (hq_aside_record_*)
 * says where the pages went (written before they go: hq_remap). QEMU is
 * found by its QMP socket's listener, without QMP: a vCPU blocked on such
 * memory may hold QEMU's big lock, and QMP waits with the main loop until
 * the memory is back. Recovery, with the record:
 * 1. takes QEMU's userfaultfd out of QEMU (pidfd_getfd);
 * 2. gives back every page the guest does not have (not present and not
 *    swapped in QEMU's range, present in the range moved aside), copied with
 *    process_vm_readv and installed with UFFDIO_COPY (a page there already,
 *    EEXIST, is the guest's and kept);
 * 3. unregisters the ranges and wakes their threads;
 * 4. unmaps the pages moved aside and closes QEMU's copy of the userfaultfd
 *    (both injected, as the save does);
 * 5. over QMP now, puts the guest back in the run state the record says it
 *    had.
 * The snapshot the dead save was writing is not completed: save again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tool.h"
#include "inside.h"
#include "records.h"
#include "runstate.h"

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)
#define CHUNK 512u /* pages per pagemap read */

struct aside {
	uint64_t host, len, at;
};

/* The record of QEMU @pid's save: its ranges and run state. How many, or -errno. */
static int read_record(pid_t pid, struct aside *a, int max, bool *running, char *err,
		       size_t errlen)
{
	char path[128], line[256];
	unsigned long long h, l, t;
	int n = 0, version = 0;
	FILE *f;

	hq_aside_record_path(pid, path, sizeof(path));
	f = fopen(path, "re");
	if (!f) {
		int e = errno;

		if (e == ENOENT)
			snprintf(err, errlen, "QEMU (pid %d) has no save of private RAM to recover "
				 "(no %s)", (int)pid, path);
		else
			snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	*running = true;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "halite-qemu-aside %d", &version) == 1)
			continue;
		if (!strncmp(line, "run-state ", 10))
			*running = !strncmp(line + 10, "running", 7);
		else if (sscanf(line, "aside %llx %llx %llx", &h, &l, &t) == 3 && n < max)
			a[n++] = (struct aside){ h, l, t };
	}
	fclose(f);
	if (version != 1) {
		snprintf(err, errlen, "%s: not a record this halite-qemu reads", path);
		return -EPROTO;
	}
	return n;
}

static int read_pagemap(int fd, uint64_t addr, uint64_t *e, uint32_t n)
{
	ssize_t got = pread(fd, e, n * sizeof(*e), (off_t)(addr / 4096 * sizeof(*e)));

	return got == (ssize_t)(n * sizeof(*e)) ? 0 : got < 0 ? -errno : -EIO;
}

/* Step 2 for one range: how many pages were given back, or -errno. */
static long give_back(struct hq_vm *vm, int uffd, int pm, const struct aside *a, char *err,
		      size_t errlen)
{
	uint64_t have[CHUNK], aside[CHUNK];
	uint8_t page[4096];
	long given = 0;

	for (uint64_t off = 0; off < a->len; off += CHUNK * 4096ull) {
		uint64_t left = (a->len - off) / 4096;
		uint32_t n = left < CHUNK ? (uint32_t)left : CHUNK;
		int ret = read_pagemap(pm, a->host + off, have, n);

		if (!ret)
			ret = read_pagemap(pm, a->at + off, aside, n);
		if (ret) {
			snprintf(err, errlen, "QEMU's pagemap: %s", strerror(-ret));
			return ret;
		}
		for (uint32_t i = 0; i < n; i++) {
			uint64_t o = off + i * 4096ull;
			struct iovec l = { page, sizeof(page) };
			struct iovec r = { (void *)(uintptr_t)(a->at + o), sizeof(page) };
			struct uffdio_copy c = { .dst = a->host + o, .src = (uintptr_t)page,
						 .len = sizeof(page) };

			if ((have[i] & (PM_PRESENT | PM_SWAPPED)) ||
			    !(aside[i] & (PM_PRESENT | PM_SWAPPED)))
				continue; /* the guest's own, or never touched: nothing to give */
			if (process_vm_readv(vm->pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(page)) {
				snprintf(err, errlen, "reading QEMU's page at 0x%" PRIx64 ": %s",
					 a->at + o, strerror(errno));
				return -errno;
			}
			while (ioctl(uffd, UFFDIO_COPY, &c) && errno == EAGAIN)
				c.copy = 0;
			if (c.copy < 0 && c.copy != -EEXIST) {
				snprintf(err, errlen, "giving back the page at 0x%" PRIx64 ": %s",
					 a->host + o, strerror((int)-c.copy));
				return (long)c.copy;
			}
			given += c.copy == sizeof(page);
		}
	}
	return given;
}

/* Steps 1-4: QEMU @vm->pid's memory whole and its own again. */
static int give_all_back(struct hq_vm *vm, const struct aside *a, int n, long *given, char *err,
			 size_t errlen)
{
	char path[64];
	int uffd, remote = -1, pm = -1, ret = 0;

	uffd = hq_vm_find_uffd(vm, &remote);
	if (uffd == -ENOENT)
		return 0; /* dead before it made QEMU's userfaultfd: it never paused, nothing moved */
	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)vm->pid);
	pm = uffd < 0 ? -1 : open(path, O_RDONLY | O_CLOEXEC);
	if (uffd < 0 || pm < 0) {
		ret = uffd < 0 ? uffd : -errno;
		snprintf(err, errlen, "%s", uffd < 0 ? vm->err : strerror(errno));
		goto out;
	}
	for (int i = 0; i < n; i++) {
		struct uffdio_range rg = { a[i].host, a[i].len };
		long g = give_back(vm, uffd, pm, &a[i], err, errlen);

		if (g < 0) {
			ret = (int)g;
			goto out;
		}
		*given += g;
		if (ioctl(uffd, UFFDIO_UNREGISTER, &rg) && errno != EINVAL && errno != ENOENT) {
			ret = -errno;
			snprintf(err, errlen, "UFFDIO_UNREGISTER: %s", strerror(errno));
			goto out;
		}
		ioctl(uffd, UFFDIO_WAKE, &rg);
		ret = hq_unmap(vm, a[i].at, a[i].len);
		if (ret) {
			snprintf(err, errlen, "unmapping the pages moved aside in QEMU: %s",
				 vm->err[0] ? vm->err : strerror(-ret));
			goto out;
		}
	}
	ret = hq_vm_close_remote(vm, remote);
	if (ret)
		snprintf(err, errlen, "closing QEMU's userfaultfd: %s", vm->err);
out:
	if (pm >= 0)
		close(pm);
	if (uffd >= 0)
		close(uffd);
	return ret;
}

int hq_cmd_recover(const char *qmp, const struct hq_out *o)
{
	static const char *const need[] = { "query-status", "cont", "stop", NULL };
	struct hq_vm vm = { .aside_fd = -1 };
	struct aside a[HQ_MAX_REGIONS];
	char err[1280] = "", path[128];
	long given = 0;
	int n = -1, ret;
	bool running = true;

	/*
	 * QEMU is found by its socket alone: a vCPU waiting for memory may hold
	 * QEMU's big lock, and its main loop, QMP with it, waits until the
	 * memory is back.
	 */
	vm.pid = hq_qmp_listener_pid(qmp);
	if (vm.pid < 0) {
		ret = vm.pid;
		snprintf(err, sizeof(err), "QMP socket %s: %s", qmp, strerror(-ret));
		goto out;
	}
	n = read_record(vm.pid, a, HQ_MAX_REGIONS, &running, err, sizeof(err));
	ret = n < 0 ? n : give_all_back(&vm, a, n, &given, err, sizeof(err));
	if (ret)
		goto out;
	ret = hq_vm_attach(&vm, qmp, 0, need);
	if (!ret)
		ret = hq_vm_settle(&vm, running, HQ_QMP_TIMEOUT_MS, NULL);
	if (ret) {
		snprintf(err, sizeof(err), "the memory is back, but the run state: %s", vm.err);
		goto out;
	}
	/* QEMU's memory is whole and its own again: the record has served. */
	hq_aside_record_path(vm.pid, path, sizeof(path));
	unlink(path);
out:
	if (ret)
		hq_errorf("save: %s", err);
	if (o->json) {
		cJSON *j = hq_json_head(hq_exit_code(ret), NULL, err,
					vm.qmp ? hq_qmp_qemu_error(vm.qmp) : NULL, &vm);

		if (j) {
			/* Pages given back before a failure are back all the same. */
			hq_json_u64(j, "pages_given_back", true, (uint64_t)given);
			hq_json_str(j, "run_state", n >= 0 ? (running ? "running" : "paused") :
				    NULL);
		}
		hq_json_print(j);
	} else if (!ret && !o->quiet) {
		printf("recovered QEMU pid %d: %ld pages given back, the guest %s\n", (int)vm.pid,
		       given, running ? "running" : "paused");
	}
	hq_vm_release(&vm);
	return hq_exit_code(ret);
}
