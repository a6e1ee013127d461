// SPDX-License-Identifier: MIT
/*
 * What halite-qemu learns about a running QEMU from outside (vm.h): its
 * process and version, its vCPU threads and page-table roots, and its RAM:
 * shared backends, reached through the backing file, and private anonymous
 * RAM, reached through QEMU's address space. The QEMU behaviour relied on
 * was checked on QEMU 7.2. What is done inside QEMU is inside.c; its device
 * state, devstate.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "discard.h"
#include "vm.h"
#include "records.h"
#include "qemu_info.h"

void hq_vmsetf(struct hq_vm *vm, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(vm->err, sizeof(vm->err), fmt, ap);
	va_end(ap);
}

/* The oldest QEMU the facts were checked on; older ones are refused, not guessed at. */
#define QEMU_MIN_MAJOR 7
#define QEMU_MIN_MINOR 2

int hq_vm_attach(struct hq_vm *vm, const char *qmp_path, int timeout_ms,
		 const char *const *need)
{
	char err[512];
	cJSON *ret = NULL, *args;
	const char *type;
	size_t n;
	int r;

	memset(vm, 0, sizeof(*vm));
	vm->aside_fd = -1;
	for (unsigned i = 0; i < HQ_MAX_REGIONS; i++)
		vm->regions[i].fd = -1;
	r = hq_qmp_connect(&vm->qmp, qmp_path, timeout_ms, err, sizeof(err));
	if (r) {
		char rec[128];
		pid_t pid = hq_qmp_listener_pid(qmp_path);

		/* A vCPU waiting for memory a dead save moved aside may hold QEMU's lock. */
		if (pid > 0 && hq_aside_record_path(pid, rec, sizeof(rec)))
			hq_vmsetf(vm, "%s; a save of this VM's private RAM was interrupted (%s) and "
				  "the guest waits for its memory: run '" PROG " save --recover "
				  "--qmp SOCKET'", err, rec);
		else
			hq_vmsetf(vm, "%s", err);
		return r;
	}
	vm->pid = hq_qmp_peer_pid(vm->qmp);
	hq_qmp_version(vm->qmp, &vm->major, &vm->minor, &vm->micro);
	if (vm->major < QEMU_MIN_MAJOR ||
	    (vm->major == QEMU_MIN_MAJOR && vm->minor < QEMU_MIN_MINOR)) {
		hq_vmsetf(vm, "QEMU %d.%d.%d (pid %d) is too old: halite-qemu needs %d.%d or newer",
			  vm->major, vm->minor, vm->micro, (int)vm->pid, QEMU_MIN_MAJOR,
			  QEMU_MIN_MINOR);
		return -HALITE_E_UNSUPPORTED;
	}
	for (; need && *need; need++)
		if (!hq_qmp_has_command(vm->qmp, *need)) {
			hq_vmsetf(vm, "QEMU %d.%d.%d has no QMP command '%s'", vm->major,
				  vm->minor, vm->micro, *need);
			return -HALITE_E_UNSUPPORTED;
		}
	/* The machine type as migration names it: QOM type "pc-q35-7.2-machine". */
	args = cJSON_CreateObject();
	cJSON_AddStringToObject(args, "path", "/machine");
	cJSON_AddStringToObject(args, "property", "type");
	r = hq_qmp_call(vm->qmp, "qom-get", args, &ret, HQ_QMP_TIMEOUT_MS);
	if (r) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		return r;
	}
	type = cJSON_GetStringValue(ret);
	n = type ? strlen(type) : 0;
	if (n > 8 && strcmp(type + n - 8, "-machine") == 0)
		n -= 8;
	if (!n || n >= sizeof(vm->machine)) {
		hq_vmsetf(vm, "qom-get /machine type: unexpected answer");
		cJSON_Delete(ret);
		return -EPROTO;
	}
	memcpy(vm->machine, type, n);
	vm->machine[n] = '\0';
	cJSON_Delete(ret);
	return hq_vm_vcpus(vm);
}

int hq_vm_vcpus(struct hq_vm *vm)
{
	cJSON *ret = NULL, *cpu;
	int r;

	r = hq_qmp_call(vm->qmp, "query-cpus-fast", NULL, &ret, HQ_QMP_TIMEOUT_MS);
	if (r) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		return r;
	}
	vm->nvcpus = 0;
	cJSON_ArrayForEach(cpu, ret) {
		cJSON *idx = cJSON_GetObjectItem(cpu, "cpu-index");
		cJSON *tid = cJSON_GetObjectItem(cpu, "thread-id");

		if (!cJSON_IsNumber(idx) || !cJSON_IsNumber(tid) || idx->valuedouble < 0 ||
		    idx->valuedouble >= HQ_MAX_VCPUS) {
			hq_vmsetf(vm, "query-cpus-fast: a CPU without cpu-index/thread-id");
			cJSON_Delete(ret);
			return -EPROTO;
		}
		if ((uint32_t)idx->valuedouble >= vm->nvcpus)
			vm->nvcpus = (uint32_t)idx->valuedouble + 1;
		vm->vcpu_tids[(uint32_t)idx->valuedouble] = (pid_t)tid->valuedouble;
	}
	cJSON_Delete(ret);
	if (!vm->nvcpus) {
		hq_vmsetf(vm, "query-cpus-fast: no vCPUs");
		return -EPROTO;
	}
	return 0;
}

/* --- RAM --- */

struct vma {
	uint64_t start, end, pgoff;
	bool shared;
	char path[256];
};

/* The mapping of QEMU's holding @addr, from /proc/PID/maps. */
static int find_vma(pid_t pid, uint64_t addr, struct vma *v)
{
	char path[64], line[512];
	FILE *f;
	int ret = -ENOENT;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char perms[8] = "", file[256] = "";
		unsigned long long s, e, off;
		int n = 0;

		if (sscanf(line, "%llx-%llx %7s %llx %*s %*s%n", &s, &e, perms, &off, &n) < 4)
			continue;
		if (addr < s || addr >= e)
			continue;
		sscanf(line + n, " %255[^\n]", file);
		v->start = s;
		v->end = e;
		v->pgoff = off;
		v->shared = perms[3] == 's';
		snprintf(v->path, sizeof(v->path), "%s", file);
		ret = 0;
		break;
	}
	fclose(f);
	return ret;
}

static int add_region(struct hq_vm *vm, const struct hq_ramblock *b, uint64_t base,
		      uint64_t gpa, uint64_t offset, uint64_t length)
{
	struct hq_region *g;

	if (vm->nregions == HQ_MAX_REGIONS) {
		hq_vmsetf(vm, "more than %d pieces of guest RAM", HQ_MAX_REGIONS);
		return -E2BIG;
	}
	g = &vm->regions[vm->nregions++];
	if (offset)
		snprintf(g->name, sizeof(g->name), "%s@0x%" PRIx64, b->name, offset);
	else
		snprintf(g->name, sizeof(g->name), "%s", b->name);
	snprintf(g->block, sizeof(g->block), "%s", b->name);
	g->gpa = gpa;
	g->offset = offset;
	g->length = length;
	g->host = base + offset;
	g->page_size = b->page_size;
	g->fd = -1;
	return 0;
}

/* One RAM block as regions, split by where the guest sees it (hq_split_block()). */
static int split_block(struct hq_vm *vm, const struct hq_ramblock *b, const char *mtree)
{
	struct hq_piece pieces[HQ_MAX_REGIONS];
	struct hq_gpa_range *rg = NULL;
	char err[256], cmd[64], *text = NULL;
	uint64_t base = 0;
	int n, k, ret = 0;

	n = hq_parse_mtree(mtree, b->name, &rg, err, sizeof(err));
	if (n < 0) {
		hq_vmsetf(vm, "%s", err);
		return n;
	}
	if (n == 0) {
		hq_vmsetf(vm, "RAM block %s is not in the guest's address space", b->name);
		free(rg);
		return -EPROTO;
	}
	k = hq_split_block(rg, n, b->used, pieces, HQ_MAX_REGIONS);
	if (k < 0) {
		hq_vmsetf(vm, "RAM block %s: guest-physical layout not understood (info mtree -f)",
			  b->name);
		free(rg);
		return k;
	}
	/* Where QEMU maps the block: the host address of its first piece, less its offset. */
	snprintf(cmd, sizeof(cmd), "gpa2hva 0x%" PRIx64, rg[0].gpa);
	ret = hq_qmp_hmp(vm->qmp, cmd, &text, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
	} else {
		ret = hq_parse_gpa2hva(text, &base, err, sizeof(err));
		if (ret)
			hq_vmsetf(vm, "%s", err);
		base -= rg[0].offset;
	}
	for (int i = 0; i < k && !ret; i++)
		ret = add_region(vm, b, base, pieces[i].gpa, pieces[i].offset, pieces[i].length);
	free(text);
	free(rg);
	return ret;
}

int hq_region_open(struct hq_vm *vm, struct hq_region *g)
{
	char path[128];
	struct vma v;
	int ret;

	ret = find_vma(vm->pid, g->host, &v);
	if (ret) {
		hq_vmsetf(vm, "RAM %s at 0x%" PRIx64 ": no such mapping in QEMU (pid %d)", g->name,
			  g->host, (int)vm->pid);
		return ret;
	}
	g->hugetlb = g->page_size > 4096;
	if (g->anon) {
		/*
		 * Private anonymous memory (-m alone, memory-backend-ram): no file;
		 * reached through the userfaultfd alone. Every page of it must be
		 * in anonymous mappings of QEMU (THP or madvise may split them).
		 */
		for (uint64_t a = g->host; a < g->host + g->length; a = v.end) {
			if (a != g->host && find_vma(vm->pid, a, &v)) {
				hq_vmsetf(vm, "RAM %s: 0x%" PRIx64 " is not mapped in QEMU", g->name, a);
				return -EPROTO;
			}
			if (v.shared || (v.path[0] && strcmp(v.path, "[heap]"))) {
				/* The size as QEMU's size= takes it, for a line to paste. */
				uint64_t sz = g->length;
				bool gib = !(sz & ((1ull << 30) - 1));

				hq_vmsetf(vm, "guest RAM '%s' is a private mapping of the file %s "
					  "(memory-backend-file share=off), which a save cannot "
					  "trap: give it share=on (-object memory-backend-file,"
					  "id=%s,size=%" PRIu64 "%s,mem-path=...,share=on), or use "
					  "-object memory-backend-ram,id=%s,size=%" PRIu64 "%s",
					  g->block, v.path[0] ? v.path : "(shared anonymous)",
					  g->block, gib ? sz >> 30 : sz >> 20, gib ? "G" : "M",
					  g->block, gib ? sz >> 30 : sz >> 20, gib ? "G" : "M");
				return -EINVAL;
			}
		}
		return 0;
	}
	if (!v.shared) {
		hq_vmsetf(vm, "guest RAM '%s' is a private mapping in QEMU, but its backend says "
			  "shared", g->block);
		return -EPROTO;
	}
	if (g->host + g->length > v.end) {
		/* One mmap per RAM block; split VMAs of it map the same file in order. */
		struct vma last;

		if (find_vma(vm->pid, g->host + g->length - 1, &last) ||
		    last.pgoff + (g->host + g->length - last.start) !=
		    v.pgoff + (g->host + g->length - v.start)) {
			hq_vmsetf(vm, "RAM %s: not one contiguous file mapping in QEMU", g->name);
			return -EPROTO;
		}
	}
	snprintf(path, sizeof(path), "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)vm->pid,
		 v.start, v.end);
	g->fd = open(path, O_RDWR | O_CLOEXEC);
	if (g->fd < 0 && errno == EPERM) {
		/*
		 * An append-only file refuses O_RDWR: a halite save or restore
		 * refusing the guest's discards (halite/src/discard.h). One that
		 * died left the flag: taken back here. A live one: this memory is
		 * being saved or restored now.
		 */
		int ro = open(path, O_RDONLY | O_CLOEXEC);
		pid_t owner = 0;

		ret = ro < 0 ? -EPERM : halite_discard_reclaim(ro, &owner);
		if (ro >= 0)
			close(ro);
		if (ret == -EBUSY) {
			hq_vmsetf(vm, "guest RAM %s is being saved or restored by halite process %d "
				  "(its file refuses discards meanwhile)", g->name, (int)owner);
			return -EBUSY;
		}
		if (ret == -EPERM) {
			hq_vmsetf(vm, "guest RAM %s: its file is append-only, and not by halite "
				  "(chattr +a?): clear it (chattr -a /proc/%d/fd/N) to save or "
				  "restore this guest", g->name, (int)vm->pid);
			return -EPERM;
		}
		if (ret == 0)
			g->fd = open(path, O_RDWR | O_CLOEXEC);
		else
			errno = -ret;
	}
	if (g->fd < 0) {
		ret = -errno;
		hq_vmsetf(vm, "RAM %s: open %s: %s%s", g->name, path, strerror(errno),
			  errno == EPERM || errno == EACCES ? " (needs CAP_SYS_ADMIN: run as root)" :
			  "");
		return ret;
	}
	g->fd_offset = v.pgoff + (g->host - v.start);
	return 0;
}

/*
 * What QEMU says of its memory: its RAM blocks (info ramblock, parsed into
 * *@b), where the guest sees them (info mtree -f, *@mtree) and its memory
 * backends (query-memdev, *@devs). How many blocks, or -errno with vm->err.
 */
static int memory_views(struct hq_vm *vm, struct hq_ramblock **b, char **mtree, cJSON **devs)
{
	char *text = NULL, err[256];
	int n;

	n = hq_qmp_hmp(vm->qmp, "info ramblock", &text, HQ_QMP_TIMEOUT_MS);
	if (!n)
		n = hq_qmp_hmp(vm->qmp, "info mtree -f", mtree, HQ_QMP_TIMEOUT_MS);
	if (!n)
		n = hq_qmp_call(vm->qmp, "query-memdev", NULL, devs, HQ_QMP_TIMEOUT_MS);
	if (n) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		free(text);
		return n;
	}
	n = hq_parse_ramblocks(text, b, err, sizeof(err));
	if (n < 0)
		hq_vmsetf(vm, "info ramblock: %s", err);
	free(text);
	return n;
}

int hq_vm_ram(struct hq_vm *vm)
{
	struct hq_ramblock *b = NULL;
	char *mtree = NULL;
	cJSON *devs = NULL, *d;
	int n, ret = 0;

	n = memory_views(vm, &b, &mtree, &devs);
	if (n < 0) {
		ret = n;
		goto out;
	}
	vm->nregions = 0;
	/*
	 * Guest RAM is the memory backends' blocks (idstr = backend id; -m
	 * alone makes one too, "pc.ram", private); the small ROM blocks
	 * (pc.bios, ACPI tables) are rebuilt by QEMU from the same command
	 * line and are not saved.
	 */
	cJSON_ArrayForEach(d, devs) {
		const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(d, "id"));
		uint32_t first = vm->nregions;
		int i;

		for (i = 0; id && i < n; i++)
			if (strcmp(b[i].name, id) == 0)
				break;
		if (!id || i == n)
			continue; /* a backend QEMU created but no RAM block uses */
		ret = split_block(vm, &b[i], mtree);
		if (ret)
			goto out;
		for (uint32_t k = first; k < vm->nregions; k++)
			vm->regions[k].anon = !cJSON_IsTrue(cJSON_GetObjectItem(d, "share"));
	}
	if (!vm->nregions) {
		hq_vmsetf(vm, "QEMU reports no memory backend holding guest RAM (query-memdev)");
		ret = -EPROTO;
		goto out;
	}
	for (uint32_t i = 0; i < vm->nregions && !ret && !vm->ram_find_only; i++)
		ret = hq_region_open(vm, &vm->regions[i]);
out:
	free(b);
	free(mtree);
	cJSON_Delete(devs);
	return ret;
}

/* --- device RAM --- */

/* Append "NAME: why" to vm->devram_skipped. */
static void devram_skip(struct hq_vm *vm, const char *name, const char *why)
{
	size_t n = strlen(vm->devram_skipped);

	snprintf(vm->devram_skipped + n, sizeof(vm->devram_skipped) - n, "%s%s: %s",
		 n ? "; " : "", name, why);
}

int hq_vm_device_ram(struct hq_vm *vm)
{
	struct hq_devram_loc loc[HQ_MAX_DEVRAM];
	const char *ids[HQ_MAX_REGIONS];
	struct hq_ramblock *b = NULL;
	char *mtree = NULL, err[256];
	cJSON *devs = NULL, *d;
	int n, nids = 0, ret = 0;

	vm->ndevram = 0;
	vm->devram_skipped[0] = '\0';
	n = memory_views(vm, &b, &mtree, &devs);
	if (n < 0) {
		ret = n;
		goto out;
	}
	cJSON_ArrayForEach(d, devs) {
		const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(d, "id"));

		if (id && nids < HQ_MAX_REGIONS)
			ids[nids++] = id;
	}
	n = hq_find_device_ram(mtree, b, n, ids, nids, loc, HQ_MAX_DEVRAM, err, sizeof(err));
	if (n < 0) {
		hq_vmsetf(vm, "%s", err);
		ret = n;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		struct hq_devram *g = &vm->devram[vm->ndevram];
		char cmd[64], *hva_text = NULL;
		uint64_t hva = 0;
		struct vma v;

		if (loc[i].skip[0]) {
			devram_skip(vm, loc[i].name, loc[i].skip);
			continue;
		}
		/* The engine's memory blocks are whole (save.h). */
		if (!loc[i].length || loc[i].length % (HALITE_DEFAULT_MB_PAGES * 4096u)) {
			devram_skip(vm, loc[i].name, "its length is no multiple of the memory-block "
				    "size");
			continue;
		}
		snprintf(cmd, sizeof(cmd), "gpa2hva 0x%" PRIx64, loc[i].probe_gpa);
		ret = hq_qmp_hmp(vm->qmp, cmd, &hva_text, HQ_QMP_TIMEOUT_MS);
		if (ret) {
			hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
			goto out;
		}
		ret = hq_parse_gpa2hva(hva_text, &hva, err, sizeof(err));
		free(hva_text);
		if (ret) {
			hq_vmsetf(vm, "%s", err);
			goto out;
		}
		*g = (struct hq_devram){ .gpa = loc[i].gpa, .length = loc[i].length,
					 .host = hva - loc[i].probe_offset };
		_Static_assert(sizeof(g->name) == sizeof(loc[i].name), "block names");
		memcpy(g->name, loc[i].name, sizeof(g->name));
		/* One mapping of QEMU's holds a RAM block (QEMU maps each whole). */
		if (g->host % 4096 || find_vma(vm->pid, g->host, &v) ||
		    v.end - g->host < g->length) {
			devram_skip(vm, g->name, "not one mapping in QEMU");
			continue;
		}
		vm->ndevram++;
	}
out:
	free(b);
	free(mtree);
	cJSON_Delete(devs);
	return ret;
}

int hq_vm_ramblock(struct hq_vm *vm, const char *name, uint64_t *length)
{
	struct hq_ramblock *b = NULL;
	char *text = NULL, err[256];
	int n, ret;

	ret = hq_qmp_hmp(vm->qmp, "info ramblock", &text, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		return ret;
	}
	n = hq_parse_ramblocks(text, &b, err, sizeof(err));
	free(text);
	if (n < 0) {
		hq_vmsetf(vm, "info ramblock: %s", err);
		return n;
	}
	ret = -ENOENT;
	for (int i = 0; i < n; i++)
		if (!strcmp(b[i].name, name)) {
			*length = b[i].used;
			ret = 0;
		}
	free(b);
	return ret;
}

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)

/*
 * Pages of QEMU's [@host, @host + @len) that it has (pagemap: present or
 * swapped), one bit each into @bits; with @local, also those @local has
 * here (mincore). 0 or -errno.
 */
static int wanted_pages(struct hq_vm *vm, uint64_t host, uint64_t len, const uint8_t *local,
			uint64_t *bits)
{
	uint64_t npages = len / 4096, e[512];
	unsigned char vec[512];
	char path[64];
	int fd, ret = 0;

	snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)vm->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (uint64_t p = 0; p < npages && !ret;) {
		uint64_t n = npages - p < 512 ? npages - p : 512;
		ssize_t got = pread(fd, e, n * sizeof(e[0]), (off_t)((host / 4096 + p) * sizeof(e[0])));

		if (got != (ssize_t)(n * sizeof(e[0]))) {
			ret = got < 0 ? -errno : -EIO;
			break;
		}
		if (local && mincore((void *)(local + p * 4096), n * 4096, vec)) {
			ret = -errno;
			break;
		}
		for (uint64_t i = 0; i < n; i++, p++)
			if ((e[i] & (PM_PRESENT | PM_SWAPPED)) || (local && (vec[i] & 1)))
				bits[p / 64] |= 1ull << (p % 64);
	}
	close(fd);
	return ret;
}

/* The pages of @bits between here and QEMU, runs at a time: *moved counts the bytes. */
static int move_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *here, bool write,
		      const uint64_t *bits, uint64_t *moved)
{
	struct iovec l[64], rm[64];
	uint64_t npages = len / 4096, p = 0, want;
	int n;

	*moved = 0;
	while (p < npages) {
		want = 0;
		for (n = 0; n < 64 && p < npages;) {
			uint64_t q;

			if (!(bits[p / 64] & (1ull << (p % 64)))) {
				p++;
				continue;
			}
			for (q = p; q < npages && (bits[q / 64] & (1ull << (q % 64))); q++)
				;
			l[n] = (struct iovec){ here + p * 4096, (q - p) * 4096 };
			rm[n] = (struct iovec){ (void *)(uintptr_t)(host + p * 4096), (q - p) * 4096 };
			want += (q - p) * 4096;
			n++;
			p = q;
		}
		if (!n)
			break;
		ssize_t got = write ? process_vm_writev(vm->pid, l, (unsigned long)n, rm,
							(unsigned long)n, 0)
				    : process_vm_readv(vm->pid, l, (unsigned long)n, rm,
						       (unsigned long)n, 0);

		if (got != (ssize_t)want) {
			int e = got < 0 ? errno : EIO;

			hq_vmsetf(vm, "%s QEMU's memory at 0x%" PRIx64 ": %s", write ? "writing" :
				  "reading", host, got < 0 ? strerror(e) : "cut short");
			return -e;
		}
		*moved += want;
	}
	return 0;
}

int hq_vm_read_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst,
		     uint64_t *copied)
{
	uint64_t *bits = calloc(len / 4096 / 64 + 1, sizeof(*bits));
	int ret;

	if (!bits)
		return -ENOMEM;
	ret = wanted_pages(vm, host, len, NULL, bits);
	if (ret)
		hq_vmsetf(vm, "/proc/%d/pagemap: %s", (int)vm->pid, strerror(-ret));
	else
		ret = move_pages(vm, host, len, dst, false, bits, copied);
	free(bits);
	return ret;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

int hq_vm_prefault_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst)
{
	uint64_t *bits = calloc(len / 4096 / 64 + 1, sizeof(*bits)), npages = len / 4096;
	int ret;

	if (!bits)
		return -ENOMEM;
	ret = wanted_pages(vm, host, len, NULL, bits);
	for (uint64_t p = 0, q; !ret && p < npages; p = q) {
		for (; p < npages && !(bits[p / 64] & (1ull << (p % 64))); p++)
			;
		for (q = p; q < npages && (bits[q / 64] & (1ull << (q % 64))); q++)
			;
		if (q > p && madvise(dst + p * 4096, (q - p) * 4096, MADV_POPULATE_WRITE))
			for (uint64_t k = p; k < q; k++) /* an older kernel: by hand */
				((volatile uint8_t *)dst)[k * 4096] = 0;
	}
	free(bits);
	return ret;
}

int hq_vm_write_pages(struct hq_vm *vm, uint64_t host, uint64_t len, const uint8_t *src,
		      uint64_t *written)
{
	uint64_t *bits = calloc(len / 4096 / 64 + 1, sizeof(*bits));
	int ret;

	if (!bits)
		return -ENOMEM;
	ret = wanted_pages(vm, host, len, src, bits);
	if (ret)
		hq_vmsetf(vm, "which pages to write (pagemap, mincore): %s", strerror(-ret));
	else
		ret = move_pages(vm, host, len, (uint8_t *)src, true, bits, written);
	free(bits);
	return ret;
}

/* Is the VMA of QEMU's holding @addr registered with a userfaultfd? 1, 0 or -errno. */
static int vma_uffd(pid_t pid, uint64_t addr)
{
	char path[64], line[512];
	bool in = false;
	int ret = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s, e;

		if (sscanf(line, "%llx-%llx ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = addr >= s && addr < e;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			/* "um": missing-page mode, "ui": minor faults, "uw": write-protect. */
			ret = strstr(line, " um") || strstr(line, " ui") || strstr(line, " uw");
			break;
		}
	}
	fclose(f);
	return ret;
}

const char *hq_vm_discard_device(struct hq_vm *vm)
{
	cJSON *mem = NULL, *d;
	const char *mdev = NULL;

	/* query-balloon answers only when a balloon device exists. */
	if (!hq_qmp_call(vm->qmp, "query-balloon", NULL, NULL, HQ_QMP_TIMEOUT_MS))
		return "virtio-balloon";
	if (!hq_qmp_call(vm->qmp, "query-memory-devices", NULL, &mem, HQ_QMP_TIMEOUT_MS))
		cJSON_ArrayForEach(d, mem) {
			const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(d, "type"));

			if (type && !strcmp(type, "virtio-mem"))
				mdev = "virtio-mem";
		}
	cJSON_Delete(mem);
	return mdev;
}

int hq_vm_check_saveable(struct hq_vm *vm)
{
	bool hugetlb = false;
	const char *dev;
	int ret;

	for (uint32_t i = 0; i < vm->nregions; i++) {
		const struct hq_region *g = &vm->regions[i];

		ret = vma_uffd(vm->pid, g->host);
		if (ret < 0) {
			hq_vmsetf(vm, "/proc/%d/smaps: %s", (int)vm->pid, strerror(-ret));
			return ret;
		}
		if (ret) {
			char rec[128];

			if (hq_aside_record_path(vm->pid, rec, sizeof(rec)))
				hq_vmsetf(vm, "a save of this VM's private RAM was interrupted (%s): "
					  "run '" PROG " save --recover --qmp SOCKET' first", rec);
			else
				hq_vmsetf(vm, "guest RAM %s is already registered with a userfaultfd: a "
					  "save or restore of this VM (or another tool) is working on it",
					  g->name);
			return -EBUSY;
		}
		hugetlb |= g->hugetlb;
	}
	dev = hugetlb ? hq_vm_discard_device(vm) : NULL;
	if (dev) {
		hq_vmsetf(vm, "guest RAM on hugetlbfs and a %s device: a hole it punches in the RAM's "
			  "file during the save can be neither refused nor seen on hugetlbfs, and a "
			  "block not yet saved would be saved as zeros; remove the device, or give "
			  "the guest a memfd or tmpfs backend", dev);
		return -HALITE_E_UNSUPPORTED;
	}
	return 0;
}

void hq_vm_release(struct hq_vm *vm)
{
	for (uint32_t i = 0; i < vm->nregions; i++)
		if (vm->regions[i].fd >= 0) {
			close(vm->regions[i].fd);
			vm->regions[i].fd = -1;
		}
	hq_qmp_close(vm->qmp);
	vm->qmp = NULL;
}

/* --- CPU state --- */

#define CR0_PG (1ull << 31)
#define CR4_LA57 (1ull << 12)
#define EFER_LMA (1ull << 10)

int hq_vm_roots(struct hq_vm *vm, struct halite_root *roots, uint32_t max)
{
	struct hq_cpu_regs *regs = NULL;
	char *text = NULL, err[256];
	uint32_t k = 0;
	int n, ret;

	ret = hq_qmp_hmp(vm->qmp, "info registers -a", &text, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		return ret;
	}
	n = hq_parse_registers(text, &regs, err, sizeof(err));
	free(text);
	if (n < 0) {
		hq_vmsetf(vm, "info registers -a: %s", err);
		return n;
	}
	/* Only 64-bit paging has the tables the walker knows (4- or 5-level). */
	for (int i = 0; i < n && k < max; i++) {
		if (!(regs[i].cr0 & CR0_PG) || !(regs[i].efer & EFER_LMA))
			continue;
		roots[k].vcpu = regs[i].cpu >= 0 && (uint32_t)regs[i].cpu < vm->nvcpus ?
				(uint32_t)regs[i].cpu : HALITE_VCPU_UNKNOWN;
		roots[k].mode = regs[i].cr4 & CR4_LA57 ? HALITE_PAGING_5LEVEL :
			       HALITE_PAGING_4LEVEL;
		roots[k].cr3 = regs[i].cr3;
		k++;
	}
	free(regs);
	return (int)k;
}
