// SPDX-License-Identifier: MIT
/*
 * A snapshot file brought into a new QEMU (bring.h): the steps restore and
 * clone share, in the order they run them. QEMU's own mechanics (spawning,
 * attaching, the incoming migration, device RAM) are incoming.c's; what the
 * file says is snapfile.c's; here they are strung into one pipeline with
 * the checks that make the new QEMU the file's machine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runstate.h"
#include "bring.h"

static int fail(struct hq_bring *b, int ret, const char *what, const char *detail)
{
	/* QEMU's own words when its error reply is the cause (the last QMP call's). */
	if (b->qemu_err && !b->err[0] && b->vm.qmp && hq_qmp_qemu_error(b->vm.qmp)[0])
		snprintf(b->qemu_err, b->qemu_errlen, "%s", hq_qmp_qemu_error(b->vm.qmp));
	return hq_fail(b->err, b->errlen, ret, what, detail);
}

int hq_bring_read(struct hq_bring *b, bool devram, struct halite_reader **rd)
{
	struct halite_reader *r = NULL;
	int ret;

	ret = hq_snapfile_read(&b->f, b->path, &r, b->err, b->errlen);
	if (ret)
		return ret;
	if (devram)
		ret = hq_snapfile_devram_decode(&b->f, r, b->err, b->errlen);
	if (!ret)
		ret = hq_config_read(&b->cfg, r, b->path, b->err, b->errlen);
	if (!ret && rd)
		*rd = r;
	else
		halite_reader_free(r);
	return ret;
}

int hq_bring_frozen(const struct hq_bring *b)
{
	int frozen = 0;

	for (int i = 0; b->disks && i < b->disks->n; i++)
		frozen += b->disks->d[i].frozen;
	return frozen;
}

int hq_bring_disks(struct hq_bring *b, const char *dir, const char *tag)
{
	int ret = hq_disks_check_frozen(b->disks, b->err, b->errlen);

	if (!ret)
		ret = hq_disks_make_overlays(b->disks, dir, tag, b->err, b->errlen);
	if (ret)
		return ret;
	b->ndisks = hq_bring_frozen(b);
	return hq_disks_rewrite(b->disks, &b->cfg.run, b->cfg.cwd, b->err, b->errlen);
}

int hq_bring_spawn(struct hq_bring *b, const struct hq_spawn *s)
{
	return hq_qemu_spawn(s, &b->qemu, b->err, b->errlen);
}

int hq_bring_attach(struct hq_bring *b, const char *sock, int timeout_ms, unsigned retry_us,
		    const char *see, int (*give_up)(void *), void *ctx)
{
	return hq_qemu_attach(&b->vm, &b->qemu, sock, timeout_ms, retry_us, see, give_up, ctx,
			      b->err, b->errlen);
}

int hq_bring_check_incoming(struct hq_bring *b)
{
	char st[32];
	int ret;

	ret = hq_config_check_devices(&b->cfg, b->vm.qmp, b->path, b->err, b->errlen);
	if (!ret && b->ndisks)
		ret = hq_disks_verify(&b->vm, b->disks, b->err, b->errlen);
	if (ret)
		return ret;
	ret = hq_vm_status(&b->vm, st, sizeof(st));
	if (ret)
		return fail(b, ret, b->vm.err, NULL);
	if (strcmp(st, "inmigrate"))
		return fail(b, -HALITE_E_STATE, "QEMU is not waiting for an incoming state", st);
	return 0;
}

int hq_bring_check_machine(struct hq_bring *b)
{
	if (strcmp(b->vm.machine, b->f.machine)) {
		snprintf(b->err, b->errlen, "the file was saved on machine type %s, this QEMU runs "
			 "%s: give the same -machine as at save", b->f.machine, b->vm.machine);
		return -EINVAL;
	}
	if (b->f.vcpus && b->f.vcpus != b->vm.nvcpus) {
		snprintf(b->err, b->errlen, "the file has %u vCPUs, this QEMU %u: give the same "
			 "-smp as at save", b->f.vcpus, b->vm.nvcpus);
		return -EINVAL;
	}
	return 0;
}

/* Every region of the file has one in this QEMU, of the same length, and no more. */
static int match_regions(struct hq_bring *b)
{
	uint32_t file_ram = 0;
	char x[32], y[32];

	for (uint32_t i = 0; i < b->f.nregions; i++) {
		const struct halite_region_info *f = &b->f.regions[i];
		uint32_t k;

		/* Device RAM is not guest RAM: hq_qemu_check_devram(). */
		if (b->f.devram_of[i])
			continue;
		file_ram++;
		for (k = 0; k < b->vm.nregions; k++)
			if (!strcmp(b->vm.regions[k].name, f->name))
				break;
		/*
		 * Another backend, another name (mem0 at save, pc.ram for a plain
		 * -m now): the same piece of guest-physical memory is the same RAM.
		 */
		for (uint32_t j = 0; k == b->vm.nregions && j < b->vm.nregions; j++) {
			struct hq_region *g = &b->vm.regions[j];
			bool taken = false;

			for (uint32_t n = 0; n < b->f.nregions && !taken; n++)
				taken = !b->f.devram_of[n] && !strcmp(b->f.regions[n].name, g->name);
			size_t n = strlen(f->name);

			/* a name longer than ours is not one QEMU gave a RAM block */
			if (!taken && g->gpa == f->gpa && g->length == f->length &&
			    n < sizeof(g->name)) {
				memcpy(g->name, f->name, n + 1);
				k = j;
			}
		}
		if (k == b->vm.nregions) {
			snprintf(b->err, b->errlen, "the file's guest RAM '%s' (%s) has no "
				 "counterpart in this QEMU: give the same -m and memory backends as "
				 "at save", f->name, hq_bytes(f->length, x, sizeof(x)));
			return -EINVAL;
		}
		if (b->vm.regions[k].length != f->length) {
			snprintf(b->err, b->errlen, "the file's guest RAM '%s' is %s, this QEMU's "
				 "is %s: give the same -m and memory backends as at save", f->name,
				 hq_bytes(f->length, x, sizeof(x)),
				 hq_bytes(b->vm.regions[k].length, y, sizeof(y)));
			return -EINVAL;
		}
	}
	if (b->vm.nregions != file_ram) {
		snprintf(b->err, b->errlen, "this QEMU has %u pieces of guest RAM, the file %u: "
			 "give the same -m and memory backends as at save", b->vm.nregions,
			 file_ram);
		return -EINVAL;
	}
	return 0;
}

int hq_bring_find_ram(struct hq_bring *b)
{
	int ret = hq_vm_ram(&b->vm);

	if (ret)
		return fail(b, ret, b->vm.err, NULL);
	ret = match_regions(b);
	return ret ? ret : hq_qemu_check_devram(&b->vm, &b->f, b->err, b->errlen);
}

int hq_bring_empty_ram(struct hq_bring *b)
{
	for (uint32_t i = 0; i < b->vm.nregions; i++) {
		struct hq_region *g = &b->vm.regions[i];
		int ret;

		if (g->anon || g->fd < 0) {
			ret = hq_qemu_drop_region(&b->vm, g, b->err, b->errlen);
			if (ret)
				return ret;
			continue;
		}
		if (fallocate(g->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)g->fd_offset, (off_t)g->length)) {
			snprintf(b->err, b->errlen, "emptying guest RAM %s: fallocate: %s", g->name,
				 strerror(errno));
			return -errno;
		}
	}
	return 0;
}

int hq_bring_load_devices(struct hq_bring *b, const char *dir, int timeout_ms,
			  int (*give_up)(void *), void *ctx, const char *no_reason)
{
	return hq_qemu_load_devices(&b->vm, dir, b->f.dev, b->f.devlen, timeout_ms, give_up, ctx,
				    no_reason, b->err, b->errlen);
}

int hq_bring_write_devram(struct hq_bring *b, uint64_t *written)
{
	*written = 0;
	if (!b->f.ndevram)
		return 0;
	return hq_qemu_write_devram(&b->vm, &b->f, written, b->err, b->errlen);
}

void hq_bring_free(struct hq_bring *b)
{
	free(b->disks);
	b->disks = NULL;
	hq_snapfile_free(&b->f);
	hq_config_free(&b->cfg);
}
