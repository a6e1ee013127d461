// SPDX-License-Identifier: MIT
/*
 * The record a restore leaves for a take-over (handoff.h).
 *
 * 'restore --attach' used to learn QEMU's RAM through QMP before it served
 * a fault. But once the handler is dead, any thread of QEMU's may be
 * waiting for a page: QEMU's main loop (a NIC's packet written into guest
 * memory), or a vCPU that holds the big lock while a device reads guest
 * memory, and then QMP answers nothing until the memory comes. So the
 * restore writes down what the engine needs, and the take-over serves
 * faults from it first, then talks to QEMU.
 *
 *   halite-qemu-restore 1
 *   file /abs/path.hlt
 *   vcpus TID TID ...
 *   region NAME BLOCK HOST LENGTH GPA OFFSET PAGE-SIZE ANON     (hex, ANON 0|1)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handoff.h"
#include "io.h"
#include "records.h"

#define MAGIC "halite-qemu-restore 1"

/*
 * The snapshot's name in the record: a file's absolute path, or an
 * s3:// URL as given (it names one object wherever it is run from). The
 * record is line-based: a name with a newline has no place in it.
 */
static int handoff_name(const char *file, char abs[PATH_MAX])
{
	if (strchr(file, '\n'))
		return -EINVAL;
	if (halite_io_is_s3_path(file)) {
		if (strlen(file) >= PATH_MAX)
			return -ENAMETOOLONG;
		snprintf(abs, PATH_MAX, "%s", file);
		return 0;
	}
	return realpath(file, abs) ? 0 : -errno;
}

static void handoff_path(pid_t pid, char *buf, size_t len)
{
	snprintf(buf, len, HQ_ASIDE_DIR "/qemu-%d.restore", (int)pid);
}

int hq_handoff_write(const struct hq_vm *vm, const char *file, char *err, size_t errlen)
{
	char path[128], tmp[160], abs[PATH_MAX];
	FILE *f;
	int ret = 0;

	ret = handoff_name(file, abs);
	if (ret)
		return ret;
	if (mkdir(HQ_ASIDE_DIR, 0700) && errno != EEXIST) {
		snprintf(err, errlen, "%s: %s", HQ_ASIDE_DIR, strerror(errno));
		return -errno;
	}
	hq_records_prune();
	handoff_path(vm->pid, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "we");
	if (!f) {
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		return -errno;
	}
	fprintf(f, MAGIC "\nfile %s\nvcpus", abs);
	for (uint32_t i = 0; i < vm->nvcpus; i++)
		fprintf(f, " %d", (int)vm->vcpu_tids[i]);
	fputc('\n', f);
	for (uint32_t i = 0; i < vm->nregions; i++) {
		const struct hq_region *g = &vm->regions[i];

		fprintf(f, "region %s %s %" PRIx64 " %" PRIx64 " %" PRIx64 " %" PRIx64 " %" PRIx64
			" %d\n", g->name, g->block, g->host, g->length, g->gpa, g->offset,
			g->page_size, g->anon);
	}
	if (fflush(f) || fsync(fileno(f)))
		ret = -errno;
	if (fclose(f) && !ret)
		ret = -errno;
	if (!ret && rename(tmp, path))
		ret = -errno;
	if (ret) {
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
		unlink(tmp);
	}
	return ret;
}

int hq_handoff_read(pid_t pid, const char *file, struct hq_vm *vm, char *err, size_t errlen)
{
	char path[128], abs[PATH_MAX], *line = NULL;
	bool magic = false, same = false;
	size_t cap = 0;
	FILE *f;
	int ret = 0;

	handoff_path(pid, path, sizeof(path));
	f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? -ENOENT : -errno;
	if (handoff_name(file, abs))
		abs[0] = '\0';
	memset(vm, 0, sizeof(*vm));
	vm->pid = pid;
	vm->aside_fd = -1;
	for (unsigned i = 0; i < HQ_MAX_REGIONS; i++)
		vm->regions[i].fd = -1;
	while (!ret && getline(&line, &cap, f) > 0) {
		line[strcspn(line, "\n")] = '\0';
		if (!strcmp(line, MAGIC)) {
			magic = true;
		} else if (!strncmp(line, "file ", 5)) {
			same = !strcmp(line + 5, abs);
		} else if (!strncmp(line, "vcpus", 5)) {
			char *p = line + 5, *end;

			for (long t; vm->nvcpus < HQ_MAX_VCPUS && (t = strtol(p, &end, 10)) > 0;
			     p = end)
				vm->vcpu_tids[vm->nvcpus++] = (pid_t)t;
		} else if (!strncmp(line, "region ", 7) && vm->nregions < HQ_MAX_REGIONS) {
			struct hq_region *g = &vm->regions[vm->nregions];
			int anon;

			if (sscanf(line + 7, "%95s %63s %" SCNx64 " %" SCNx64 " %" SCNx64 " %" SCNx64
				   " %" SCNx64 " %d", g->name, g->block, &g->host, &g->length, &g->gpa,
				   &g->offset, &g->page_size, &anon) != 8) {
				ret = -EPROTO;
				break;
			}
			g->anon = anon;
			vm->nregions++;
		}
	}
	free(line);
	fclose(f);
	if (!ret && (!magic || !vm->nregions))
		ret = -EPROTO;
	if (ret) {
		snprintf(err, errlen, "%s: not a restore's record", path);
		return ret;
	}
	if (!same) {
		snprintf(err, errlen, "QEMU (pid %d) is restoring another file than %s (%s)",
			 (int)pid, file, path);
		return -ESTALE;
	}
	for (uint32_t i = 0; i < vm->nregions && !ret; i++)
		ret = hq_region_open(vm, &vm->regions[i]);
	if (ret) {
		snprintf(err, errlen, "%s", vm->err);
		hq_vm_release(vm);
	}
	return ret;
}

void hq_handoff_remove(pid_t pid)
{
	char path[128];

	handoff_path(pid, path, sizeof(path));
	unlink(path);
}
