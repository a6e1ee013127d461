// SPDX-License-Identifier: MIT
/*
 * halite-qemu save: a lazy, copy-on-access snapshot of a running QEMU.
 *
 * 0. The output path is checked (halite_writer_check_path: its directory
 *    exists and is writable, it is no directory, no running restore reads
 *    it) before QEMU is touched: a save that cannot write its file must not
 *    have sent QEMU a single command.
 * 1. Before the pause: connect to QMP, find the vCPU threads and the guest
 *    RAM (shared backends opened through /proc/PID/map_files; private RAM
 *    reached with process_vm_readv) and the device RAM (video memory:
 *    hq_vm_device_ram()), create a userfaultfd inside QEMU (ptrace) and
 *    bring it here (pidfd_getfd), create the file.
 * 2. Pause (QMP stop): read the vCPUs' page-table roots (info registers -a),
 *    take the device state (xen-save-devices-state, a device-only stream),
 *    copy the device RAM (the pages QEMU has, process_vm_readv) into memory
 *    of ours that the engine saves as copies (HALITE_MEM_COPY), arm the
 *    engine (shared RAM: register MINOR on QEMU's RAM, then drop
 *    QEMU's page-table entries with an injected madvise; private RAM: move
 *    it aside inside QEMU with an injected mremap, written to the save's
 *    record first, and register MISSING), resume (cont). The pause
 *    is what the guest notices; it is timed.
 * 3. The guest runs; every first access to a block traps and is saved by
 *    the engine, attributed to the vCPU whose thread faulted. Roots keep
 *    being sampled for the background walk. Progress on stderr.
 * 4. Done: QEMU's copy of the userfaultfd is closed (the engine has
 *    unregistered its ranges), the report is printed.
 *
 * A guest that was paused before the save stays paused. Every way out after
 * the pause brings the guest back to the run state it had and confirms it
 * (hq_vm_settle: whatever became of a stop or cont that timed out), with
 * its memory as it would have been without the save (save.h); when that
 * cannot be confirmed, the error says the guest may be left paused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "disks.h"
#include "tool.h"
#include "devstate.h"
#include "fault.h"
#include "inside.h"
#include "runstate.h"
#include "vmconfig.h"

struct save_params {
	const char *qmp;
	const char *path;
	int codec;
	int level;
	uint32_t lb_size;
	unsigned workers;
	uint64_t bg_min_rate;
	unsigned root_ms;
	unsigned flags;
	bool recover;	/* --recover: a save of private RAM that died, finished */
	bool no_disks;	/* --no-disks: memory only, the disks not frozen */
	bool parsed;	/* the options were taken (a report may say what they chose) */
	const char *disk_dir; /* --disk-dir: where the overlays go (default: beside each image) */
	struct hq_out out;
};

struct save_run {
	struct save_params p;
	struct hq_vm vm;
	struct halite_save *s;
	int uffd;
	int remote_uffd; /* private RAM: QEMU's copy of the userfaultfd, closed at the end */
	struct hq_disks *disks; /* the guest's disks; the writable ones frozen in the pause */
	bool was_running, stop_sent;
	/* stop sent, cont answered (a paused guest: neither), start() done, file complete */
	uint64_t t_attach_ns, t_stop_ns, t_cont_ns, t_armed_ns, t_done_ns;
	uint64_t roots_sampled, root_samples;
	uint64_t devstate_bytes, mem_bytes;
	/* Device RAM (r->vm.devram): each copied here in the pause, the engine's COPY regions. */
	uint8_t *devcopy[HQ_MAX_DEVRAM];
	uint64_t devram_copied, devram_ns;
	struct halite_save_stats st;
	bool have_stats;	/* st was taken from the engine */
	bool devram_known;	/* vm.devram was looked for */
	bool devram_done;	/* device RAM copied in the pause */
	bool disks_known;	/* disks were queried */
	char status[32];
	char err[1280];
	char qemu_err[512];	/* QEMU's own words, when its answer was the failure */
};

void hq_help_save(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " save --qmp SOCKET [OPTIONS] FILE\n\n"
		"Save a running QEMU guest lazily to FILE. The guest is paused only to arm\n"
		"copy-on-access (milliseconds) and keeps running while its memory is saved:\n"
		"each block is saved at its first access after the pause (attributed to the\n"
		"vCPU that touched it) or by a throttled background pass in guest-virtual\n"
		"order. Guest RAM may be QEMU's default (-m alone, memory-backend-ram) or a\n"
		"shared backend (memory-backend-memfd or -file share=on, on tmpfs or\n"
		"hugetlbfs); not a private mapping of a file (share=off). Needs ptrace rights\n"
		"over QEMU (root). FILE is checked before QEMU is touched: its directory must\n"
		"exist and be writable, and no running restore may be reading it.\n\n"
		"Disks: in the pause every writable disk is frozen at the snapshot instant\n"
		"(a QEMU external snapshot: the guest writes to a new qcow2 overlay from then\n"
		"on, IMAGE-STEM.FILE-STEM-TIME.qcow2 beside the image; the image itself is never\n"
		"written again), and FILE records the frozen images; each restore runs on a\n"
		"fresh overlay of them. Disks that cannot be frozen (not an image file, shared,\n"
		"encrypted) are refused before the guest is touched. A save that fails commits\n"
		"the overlays back into their images. When libvirt runs QEMU, its disks are\n"
		"frozen through libvirt (virsh snapshot-create-as --disk-only\n"
		"--reuse-external), so libvirt knows the overlay; $HALITE_LIBVIRT_URI names the\n"
		"connection (default qemu:///system).\n\n"
		"Options:\n"
		"  --qmp SOCKET       QEMU's QMP unix socket (-qmp unix:SOCKET,server=on,wait=off)\n"
		"  --codec NAME       none, lz4 (default), zlib, zstd\n"
		"  --level N          compression level: zstd -128..22, zlib 0..9, lz4 -128..12\n"
		"                     (0: the codec's default)\n"
		"  --lb-size SIZE     locality block size, a power of two, 8K..4M (default 64K)\n"
		"  --workers N        compression threads, 1..256 (default: online CPUs)\n"
		"  --bg-rate SIZE     background save never slower than SIZE per second, at\n"
		"                     least 1M (default 64M)\n"
		"  --root-interval MS sample the vCPUs' page-table roots every MS ms, 1..60000\n"
		"                     (default 100)\n"
		"  --bypass-cache     write the file with O_DIRECT, around the host's page cache\n"
		"                     (as virsh save --bypass-cache)\n"
		"  --keep-incomplete  keep the partial file of a failed save as FILE.incomplete\n"
		"  --no-realtime      the fault thread stays an ordinary thread (by default it\n"
		"                     runs SCHED_FIFO where allowed, so that the vCPUs it wakes\n"
		"                     do not preempt it mid-service)\n"
		"  --disk-dir DIR     put the disks' overlays in DIR (default: beside each image)\n"
		"  --no-disks         memory only, disks not frozen: restorable only with the\n"
		"                     disks as they were at the snapshot (unsafe once they moved on)\n"
		"  --recover          no FILE: give back to QEMU the private RAM a save that\n"
		"                     died (killed) had moved aside, let QEMU go on (its guest\n"
		"                     waits for that memory meanwhile); then save again\n"
		HQ_HELP_OUT_OPTS("save")
		"Exit status: 0 saved, 1 failed (the guest is back in the run state it had,\n"
		"its memory unchanged, unless the error says it may be left paused), 2 usage,\n"
		"77 the kernel or QEMU lacks a needed feature.\n");
}

/* --level: a signed number (zstd and lz4 take negative levels). */
static int parse_level(const char *s, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (!*s || *end || errno || v < INT8_MIN || v > INT8_MAX)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

/*
 * The writer's options checked as the writer checks them (the ranges are
 * its own: halite_writer_opts_check()), each one named.
 */
static int check_writer_opts(struct save_params *p)
{
	HALITE_OPTS(halite_writer_opts, wo);
	char err[256];

	wo.lb_size = p->lb_size;
	if (halite_writer_opts_check(&wo, err, sizeof(err)))
		return hq_usage(&p->out, "--lb-size: %s", err);
	wo.codec = p->codec;
	wo.level = p->level;
	if (halite_writer_opts_check(&wo, err, sizeof(err)))
		return hq_usage(&p->out, "--level: %s", err);
	return 0;
}

static int parse_args(int argc, char **argv, struct save_params *p)
{
	static const struct option lo[] = {
		{ "qmp", required_argument, NULL, 'Q' },
		{ "codec", required_argument, NULL, 'c' },
		{ "level", required_argument, NULL, 'l' },
		{ "lb-size", required_argument, NULL, 'b' },
		{ "workers", required_argument, NULL, 'w' },
		{ "bg-rate", required_argument, NULL, 'r' },
		{ "root-interval", required_argument, NULL, 'i' },
		{ "keep-incomplete", no_argument, NULL, 'k' },
		{ "no-realtime", no_argument, NULL, 'T' },
		{ "recover", no_argument, NULL, 'R' },
		{ "no-disks", no_argument, NULL, 'D' },
		{ "disk-dir", required_argument, NULL, 'd' },
		HQ_OUT_LONGOPTS,
		{ 0 }
	};
	struct hq_out *o = &p->out;
	uint64_t v;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":qvh", lo, NULL)) != -1) {
		switch (c) {
		case 'Q':
			p->qmp = optarg;
			break;
		case 'c':
			p->codec = halite_codec_parse(optarg);
			if (p->codec < 0)
				return hq_usage(o, "--codec '%s': none, lz4, zlib or zstd", optarg);
			break;
		case 'l':
			if (parse_level(optarg, &p->level))
				return hq_usage(o, "--level '%s': a number: zstd -128..22, zlib 0..9, "
						"lz4 -128..12", optarg);
			break;
		case 'b':
			if (halite_parse_size(optarg, &v) || v > UINT32_MAX)
				return hq_usage(o, "--lb-size '%s': a size, a power of two from 8K to "
						"4M", optarg);
			p->lb_size = (uint32_t)v;
			break;
		case 'w':
			if (halite_parse_size(optarg, &v) || v < 1 || v > 256)
				return hq_usage(o, "--workers '%s': 1..256", optarg);
			p->workers = (unsigned)v;
			break;
		case 'r':
			if (halite_parse_size(optarg, &v) || v < (1u << 20))
				return hq_usage(o, "--bg-rate '%s': at least 1M (bytes per second)",
						optarg);
			p->bg_min_rate = v;
			break;
		case 'i':
			if (halite_parse_size(optarg, &v) || v < 1 || v > 60000)
				return hq_usage(o, "--root-interval '%s': 1..60000 ms", optarg);
			p->root_ms = (unsigned)v;
			break;
		case 'k':
			p->flags |= HALITE_SAVE_KEEP_INCOMPLETE;
			break;
		case 'T':
			p->flags |= HALITE_SAVE_NO_REALTIME;
			break;
		case HQ_OPT_BYPASS_CACHE:
			p->flags |= HALITE_SAVE_DIRECT;
			break;
		case 'R':
			p->recover = true;
			break;
		case 'D':
			p->no_disks = true;
			break;
		case 'd':
			p->disk_dir = optarg;
			break;
		case 'h':
			hq_help_save(stdout);
			exit(EXIT_OK);
		default:
			r = hq_out_opt(c, o, argc, argv);
			if (r <= 0)
				return r ? r : hq_usage(o, "option '%s' is not handled", argv[optind - 1]);
		}
	}
	if (p->recover && optind == argc && p->qmp)
		return 0;
	if (p->recover)
		return hq_usage(o, "--recover takes --qmp SOCKET and no FILE (" PROG " save --help)");
	if (optind != argc - 1)
		return hq_usage(o, "%s (" PROG " save --help)", optind >= argc ? "FILE missing" :
				"one FILE only");
	p->path = argv[optind];
	if (!p->qmp)
		return hq_usage(o, "--qmp SOCKET is required (" PROG " save --help)");
	if (check_writer_opts(p))
		return -1;
	p->parsed = true;
	return 0;
}

static int fail(struct save_run *r, int ret, const char *what, const char *detail)
{
	/* QEMU's own words when its error reply is the cause (the last QMP call's). */
	if (!r->err[0] && r->vm.qmp && hq_qmp_qemu_error(r->vm.qmp)[0])
		snprintf(r->qemu_err, sizeof(r->qemu_err), "%s", hq_qmp_qemu_error(r->vm.qmp));
	return hq_fail(r->err, sizeof(r->err), ret, what, detail);
}

/* Sample the roots now; new ones go to the engine (it drops repeats). */
static int sample_roots(struct save_run *r)
{
	struct halite_root roots[HQ_MAX_VCPUS];
	int n = hq_vm_roots(&r->vm, roots, HQ_MAX_VCPUS);

	if (n < 0)
		return n;
	r->root_samples++;
	for (int i = 0; i < n; i++) {
		int ret = halite_save_add_root(r->s, &roots[i]);

		if (ret)
			return ret;
		r->roots_sampled++;
	}
	return 0;
}

/*
 * Every way out of start() once stop was sent: the guest back in the run
 * state it had, confirmed by query-status (runstate.c: a stop that timed
 * out may take effect later, a cont that timed out may not have). If that
 * cannot be confirmed, that is the error, whatever failed before.
 */
static int leave_run_state(struct save_run *r, int ret)
{
	char before[sizeof(r->err)];
	int st;

	if (!r->stop_sent)
		return ret;
	st = hq_vm_settle(&r->vm, r->was_running, HQ_QMP_TIMEOUT_MS, &r->t_cont_ns);
	if (!r->t_cont_ns)
		r->t_cont_ns = hq_now_ns();
	if (!st)
		return ret;
	snprintf(before, sizeof(before), "%s", r->err);
	/* A QEMU that has exited has no guest left to be paused (-ESRCH). */
	if (snprintf(r->err, sizeof(r->err), "%s%s%s%s", st == -ESRCH ? "" :
		     "the guest may be left paused: ", r->vm.err,
		     before[0] ? "; before that the save had failed: " : "", before) >=
	    (int)sizeof(r->err))
		memcpy(r->err + sizeof(r->err) - 4, "...", 4);
	return st;
}

/* The guest's run state at the save: the file records it. */
static const char *run_state(const struct save_run *r)
{
	return r->was_running ? "running" : "paused";
}

static int set_meta(struct save_run *r)
{
	char v[64];
	int ret;

	snprintf(v, sizeof(v), "%d.%d.%d", r->vm.major, r->vm.minor, r->vm.micro);
	ret = halite_save_set_meta(r->s, "qemu.version", v, (uint32_t)strlen(v));
	if (!ret)
		ret = halite_save_set_meta(r->s, "qemu.machine", r->vm.machine,
					   (uint32_t)strlen(r->vm.machine));
	if (!ret)
		ret = halite_save_set_meta(r->s, "creator", PROG, sizeof(PROG) - 1);
	/* What a restore brings the guest back to by default (as virsh restore does). */
	if (!ret)
		ret = halite_save_set_meta(r->s, "qemu.run-state", run_state(r),
					   (uint32_t)strlen(run_state(r)));
	/* Which of the file's regions are device RAM, not guest RAM: names, each NUL-ended. */
	if (!ret && r->vm.ndevram) {
		char list[HQ_MAX_DEVRAM * sizeof(r->vm.devram[0].name)];
		uint32_t n = 0;

		for (uint32_t i = 0; i < r->vm.ndevram; i++) {
			size_t l = strlen(r->vm.devram[i].name) + 1;

			memcpy(list + n, r->vm.devram[i].name, l);
			n += (uint32_t)l;
		}
		ret = halite_save_set_meta(r->s, "qemu.device-ram", list, n);
	}
	/* What a restore needs to start the same VM again: its command line, devices (config.c). */
	if (!ret)
		ret = hq_config_record(&r->vm, r->s, r->err, sizeof(r->err));
	return ret;
}

/*
 * Before the guest is touched: the disks to freeze, each able to be, and
 * their overlays made. Overlays are named after the file and the time.
 */
static int prepare_disks(struct save_run *r)
{
	const char *base = strrchr(r->p.path, '/') ? strrchr(r->p.path, '/') + 1 : r->p.path;
	char tag[128], when[32];
	time_t now = time(NULL);
	int ret;

	ret = hq_disks_query(&r->vm, r->disks, r->err, sizeof(r->err));
	r->disks_known = !ret;
	if (ret || r->p.no_disks || !hq_disks_writable(r->disks))
		return ret;
	strftime(when, sizeof(when), "%Y%m%d-%H%M%S", localtime(&now));
	snprintf(tag, sizeof(tag), "%.*s-%s", (int)strcspn(base, "."), base, when);
	return hq_disks_prepare(&r->vm, r->disks, r->p.disk_dir, tag, r->err, sizeof(r->err));
}

/* In the pause: the disks frozen at the snapshot instant, and recorded. */
static int freeze_disks(struct save_run *r)
{
	char *rec;
	int ret = 0;

	if (!r->p.no_disks && hq_disks_writable(r->disks)) {
		ret = hq_disks_freeze(&r->vm, r->disks, r->err, sizeof(r->err));
		if (ret)
			return ret;
	}
	rec = hq_disks_record(r->disks);
	ret = rec ? halite_save_set_meta(r->s, "qemu.disks", rec, (uint32_t)strlen(rec)) : -ENOMEM;
	if (!ret)
		ret = halite_save_set_meta(r->s, "qemu.disks-frozen", r->p.no_disks ? "no" : "yes",
					   r->p.no_disks ? 2 : 3);
	free(rec);
	if (ret)
		return fail(r, ret, "file metadata", halite_strerror(ret));
	return 0;
}

/* In the pause: the device RAM as it is at the snapshot instant, into the engine's copies. */
static int copy_device_ram(struct save_run *r)
{
	uint64_t t0 = hq_now_ns();

	for (uint32_t i = 0; i < r->vm.ndevram; i++) {
		const struct hq_devram *d = &r->vm.devram[i];
		uint64_t n = 0;
		int ret = hq_vm_read_pages(&r->vm, d->host, d->length, r->devcopy[i], &n);

		if (ret)
			return fail(r, ret, "copying device RAM", r->vm.err);
		r->devram_copied += n;
	}
	r->devram_ns = hq_now_ns() - t0;
	r->devram_done = true;
	return 0;
}

/* Everything up to and including the resume after arm. */
static int start(struct save_run *r)
{
	static const char *const need[] = { "query-cpus-fast", "human-monitor-command",
					    "xen-save-devices-state", "stop", "cont", NULL };
	struct halite_save_region reg[HQ_MAX_REGIONS + HQ_MAX_DEVRAM];
	HALITE_OPTS(halite_save_opts, o);
	uint8_t *dev = NULL;
	uint64_t devlen = 0;
	bool anon = false;
	int ret;

	ret = hq_vm_attach(&r->vm, r->p.qmp, 0, need);
	if (!ret)
		ret = hq_vm_ram(&r->vm);
	if (!ret)
		ret = hq_vm_check_saveable(&r->vm);
	/* Its host address never changes: found now, copied in the pause. */
	if (!ret)
		ret = hq_vm_device_ram(&r->vm);
	r->devram_known = !ret;

	if (!ret)
		ret = hq_vm_status(&r->vm, r->status, sizeof(r->status));
	if (ret)
		return fail(r, ret, r->vm.err, NULL);
	r->t_attach_ns = hq_now_ns();
	if (strcmp(r->status, "running") && strcmp(r->status, "paused"))
		return fail(r, -HALITE_E_STATE, "QEMU is not running a guest", r->status);
	r->was_running = strcmp(r->status, "running") == 0;
	ret = prepare_disks(r);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < r->vm.nregions; i++) {
		const struct hq_region *g = &r->vm.regions[i];

		reg[i] = (struct halite_save_region){
			.name = g->name, .gpa = g->gpa, .length = g->length, .host = g->host,
			.kind = g->anon ? HALITE_MEM_ANON : HALITE_MEM_SHARED, .fd = g->fd,
			.fd_offset = g->fd_offset,
		};
		anon |= g->anon;
	}
	for (uint32_t i = 0; i < r->vm.nregions; i++)
		r->mem_bytes += r->vm.regions[i].length;
	/*
	 * Device RAM, copied here in the pause: fresh memory, so the pages
	 * QEMU never touched stay holes (never-touched blocks); small pages,
	 * so that one page copied populates one; those QEMU has populated now,
	 * which takes the page faults out of the pause (a third of the copy's
	 * time for 16 MiB).
	 */
	for (uint32_t i = 0; i < r->vm.ndevram; i++) {
		const struct hq_devram *d = &r->vm.devram[i];
		void *p = mmap(NULL, d->length, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (p == MAP_FAILED)
			return fail(r, -errno, "a copy of device RAM", strerror(errno));
		r->devcopy[i] = p;
		madvise(p, d->length, MADV_NOHUGEPAGE);
		hq_vm_prefault_pages(&r->vm, d->host, d->length, p);
		reg[r->vm.nregions + i] = (struct halite_save_region){
			.name = d->name, .gpa = d->gpa, .length = d->length, .host = (uintptr_t)p,
			.kind = HALITE_MEM_COPY, .fd = -1,
		};
	}
	if (r->vm.devram_skipped[0] && !r->p.out.quiet)
		hq_errorf("save: warning: device RAM not saved (it starts blank after a restore): "
			  "%s", r->vm.devram_skipped);
	/*
	 * Shared RAM: QEMU keeps no copy of the descriptor: if this process
	 * dies, the ranges lose their registration and QEMU's accesses find the
	 * unchanged data in the file again (the engine never writes it), so the
	 * guest runs on as if there had been no save. Private RAM moves aside
	 * inside QEMU while it is saved, and only there is what the guest has
	 * not touched yet: QEMU keeps its copy, so that if this process dies
	 * its accesses block rather than read zeros (docs/failure-model.md);
	 * it is closed at the end.
	 */
	if (anon) {
		ret = hq_aside_record_create(&r->vm, r->was_running);
		if (ret)
			return fail(r, ret, "the record of a save of private RAM", r->vm.err);
	}
	r->uffd = hq_vm_uffd(&r->vm, anon ? &r->remote_uffd : NULL);
	if (r->uffd < 0)
		return fail(r, r->uffd, r->vm.err, NULL);
	o.codec = r->p.codec;
	o.level = r->p.level;
	o.lb_size = r->p.lb_size;
	o.flags = r->p.flags;
	o.vcpu_tids = r->vm.vcpu_tids;
	o.nvcpus = r->vm.nvcpus;
	o.workers = r->p.workers;
	o.owner_pid = r->vm.pid;
	o.owner_uffd = r->uffd;
	o.drop_ptes = hq_drop_ptes;
	o.remap = hq_remap;
	o.unmap = hq_unmap;
	o.drop_ctx = &r->vm;
	o.bg_min_rate = r->p.bg_min_rate;
	o.log = hq_log;
	o.log_ctx = &r->p.out;
	o.log_level = r->p.out.verbose ? HALITE_LOG_DEBUG : HALITE_LOG_WARN;
	ret = halite_save_create(&r->s, r->p.path, reg, r->vm.nregions + r->vm.ndevram, &o);
	if (ret)
		return fail(r, ret, "creating the save", halite_strerror(ret));
	ret = set_meta(r);
	if (ret)
		return fail(r, ret, "file metadata", halite_strerror(ret));

	/* The snapshot instant: from stop to cont. */
	if (r->was_running) {
		r->t_stop_ns = hq_now_ns();
		/* Sent is enough to undo: without an answer it may still take effect. */
		r->stop_sent = true;
		ret = hq_vm_stop(&r->vm, HQ_QMP_TIMEOUT_MS);
		if (ret) {
			fail(r, ret, "pausing the guest (stop)", r->vm.err);
			goto out;
		}
	}
	ret = sample_roots(r);
	if (ret) {
		fail(r, ret, "page-table roots", ret < 0 && r->vm.err[0] ? r->vm.err :
		     halite_strerror(ret));
		goto out;
	}
	ret = hq_vm_device_state(&r->vm, &dev, &devlen);
	if (ret) {
		fail(r, ret, "device state", r->vm.err);
		goto out;
	}
	r->devstate_bytes = devlen;
	ret = halite_save_set_device_state(r->s, dev, devlen);
	free(dev);
	if (ret) {
		fail(r, ret, "device state", halite_strerror(ret));
		goto out;
	}
	ret = copy_device_ram(r);
	if (ret)
		goto out;
	ret = freeze_disks(r);
	if (ret)
		goto out;
	if (hq_fault("fail-before-arm")) {
		ret = fail(r, -EIO, "test fault fail-before-arm", "a failure before arming");
		goto out;
	}
	ret = halite_save_arm(r->s);
	if (ret)
		fail(r, ret, "arming copy-on-access", halite_save_errmsg(r->s)[0] ?
		     halite_save_errmsg(r->s) : halite_strerror(ret));
out:
	return leave_run_state(r, ret);
}

/* Progress on stderr (--progress): what the blocks saved so far cover of guest and device RAM. */
static void progress(struct save_run *r, bool final)
{
	struct halite_save_stats st;
	uint64_t total = r->mem_bytes, done;
	int mode = hq_progress_mode(&r->p.out);
	double elapsed = (double)(hq_now_ns() - r->t_armed_ns) / 1e9;
	char a[32], b[32];

	if (mode == HALITE_PROGRESS_NONE || !r->s)
		return;
	/* Guest RAM and device RAM: the blocks cover both. */
	for (uint32_t i = 0; i < r->vm.ndevram; i++)
		total += r->vm.devram[i].length;
	halite_save_stats(r->s, &st);
	done = st.mb_total ? total / st.mb_total * st.mb_saved : 0;
	if (mode == HALITE_PROGRESS_JSON) {
		struct halite_cli_progress pr = {
			.op = "save", .phase = "memory", .elapsed_s = elapsed,
			.bytes = (int64_t)done, .total = (int64_t)total,
			.faults = (int64_t)st.faults, .done = final,
		};

		halite_cli_progress_json(stderr, &pr);
		return;
	}
	hq_progressf(false, "save: %3" PRIu64 "%%  %s of %s  %" PRIu64 " faults, %" PRIu64
		     " blocks by vCPUs  %.1f s%s", st.mb_total ? 100 * st.mb_saved / st.mb_total : 0,
		     hq_bytes(done, a, sizeof(a)), hq_bytes(total, b, sizeof(b)), st.faults,
		     st.faults_vcpu, elapsed, final ? "\n" : "");
}

static int run(struct save_run *r)
{
	uint64_t last_root, last_prog;
	sigset_t stopset, old;
	int ret;

	/* Ctrl-C cancels cleanly (the guest keeps every byte); not in mid-pause. */
	sigemptyset(&stopset);
	sigaddset(&stopset, SIGINT);
	sigaddset(&stopset, SIGTERM);
	hq_catch_stop_signals();
	sigprocmask(SIG_BLOCK, &stopset, &old);
	ret = start(r);
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (ret)
		return ret;
	/* Test fault hold-after-arm: the registration is held this long (fault.c). */
	for (uint64_t end = hq_now_ns() + hq_fault_ms("hold-after-arm") * 1000000ull;
	     hq_now_ns() < end && !hq_stop_signal;)
		usleep(10000);
	r->t_armed_ns = last_root = last_prog = hq_now_ns();
	for (;;) {
		unsigned slice = r->p.root_ms < 250 ? r->p.root_ms : 250;
		uint64_t now;

		if (hq_stop_signal) {
			halite_save_cancel(r->s);
			halite_save_stats(r->s, &r->st);
			r->have_stats = true;
			progress(r, true);
			return fail(r, -ECANCELED, "save cancelled", strsignal(hq_stop_signal));
		}
		ret = halite_save_wait(r->s, (int)slice);
		if (ret != -ETIMEDOUT)
			break;
		now = hq_now_ns();
		if (now - last_root >= (uint64_t)r->p.root_ms * 1000000) {
			last_root = now;
			/* A failed sample costs the walk some roots, not the save. */
			if (sample_roots(r) && r->p.out.verbose)
				hq_errorf("save: sampling roots: %s", r->vm.err);
		}
		if (hq_progress_due(&r->p.out, &last_prog, now))
			progress(r, false);
	}
	r->t_done_ns = hq_now_ns();
	halite_save_stats(r->s, &r->st);
	r->have_stats = true;
	progress(r, true);
	/* The engine's sentence names the file and what failed: said once, as it is. */
	if (ret)
		return fail(r, ret, halite_save_errmsg(r->s)[0] ? halite_save_errmsg(r->s) :
			    halite_strerror(ret), NULL);
	return 0;
}

/*
 * Device RAM, beside memory_bytes (guest RAM): "device_ram": [{"name", "gpa",
 * "bytes"}], their total, the bytes copied and how long that took (in the
 * pause), "device_ram_skipped" (what could not be saved, and why; null: none).
 */
static void report_devram_json(cJSON *o, const struct save_run *r)
{
	cJSON *a = r->devram_known ? cJSON_AddArrayToObject(o, "device_ram") :
		   cJSON_AddNullToObject(o, "device_ram");
	uint64_t total = 0;

	for (uint32_t i = 0; r->devram_known && a && i < r->vm.ndevram; i++) {
		cJSON *d = cJSON_CreateObject();

		cJSON_AddStringToObject(d, "name", r->vm.devram[i].name);
		hq_json_u64(d, "gpa", true, r->vm.devram[i].gpa);
		hq_json_u64(d, "bytes", true, r->vm.devram[i].length);
		cJSON_AddItemToArray(a, d);
		total += r->vm.devram[i].length;
	}
	hq_json_u64(o, "device_ram_bytes", r->devram_known, total);
	hq_json_u64(o, "device_ram_copied_bytes", r->devram_done, r->devram_copied);
	hq_json_fixed(o, "device_ram_ms", r->devram_done, (double)r->devram_ns / 1e6, 3);
	hq_json_str(o, "device_ram_skipped", r->vm.devram_skipped);
}

/* "disks": [{"qdev", "image", "frozen", "overlay"}]: where the guest writes now. */
static void report_disks_json(cJSON *o, const struct save_run *r)
{
	cJSON *a;

	hq_json_bool(o, "disks_frozen", r->p.parsed, !r->p.no_disks);
	hq_json_str(o, "libvirt_domain", r->disks ? r->disks->libvirt : NULL);
	if (!r->disks_known) {
		cJSON_AddNullToObject(o, "disks");
		return;
	}
	a = cJSON_AddArrayToObject(o, "disks");
	for (int i = 0; a && i < r->disks->n; i++) {
		const struct hq_disk *d = &r->disks->d[i];
		cJSON *j = cJSON_CreateObject();

		cJSON_AddStringToObject(j, "qdev", d->qdev);
		cJSON_AddStringToObject(j, "image", d->image);
		cJSON_AddBoolToObject(j, "read_only", d->ro);
		cJSON_AddBoolToObject(j, "frozen", d->frozen);
		hq_json_str(j, "overlay", d->frozen ? d->overlay : NULL);
		cJSON_AddItemToArray(a, j);
	}
}

/*
 * The report as one JSON object: on failure the keys a success has, with
 * what was learnt before it failed and null for the rest.
 */
static void report_json(const struct save_run *r, int code)
{
	const struct halite_save_stats *st = &r->st;
	bool stats = r->have_stats, ok = code == EXIT_OK;
	/* A guest that was paused already was not paused by the save: no pause. */
	bool paused_before = r->status[0] && !r->was_running;
	bool pause_known = paused_before || (r->t_stop_ns && r->t_cont_ns > r->t_stop_ns);
	double pause_ms = paused_before ? 0 : (double)(r->t_cont_ns - r->t_stop_ns) / 1e6;
	cJSON *o = hq_json_head(code, r->p.path, r->err, r->qemu_err, &r->vm);

	if (!o) {
		hq_json_print(NULL);
		return;
	}
	/* As query-status said before the save. */
	hq_json_str(o, "run_state", r->status);
	hq_json_fixed(o, "pause_ms", pause_known, pause_ms, 3);
	hq_json_fixed(o, "arm_ms", stats && r->t_armed_ns, (double)st->arm_ns / 1e6, 3);
	hq_json_fixed(o, "save_s", stats, (double)st->duration_ns / 1e9, 3);
	hq_json_u64(o, "memory_bytes", r->vm.nregions, r->mem_bytes);
	hq_json_u64(o, "file_bytes", ok && stats, st->file_bytes);
	hq_json_fixed(o, "ratio", ok && stats && st->mb_total,
		      st->mb_total ? (double)st->file_bytes / ((double)st->mb_total * 8192) : 0, 4);
	hq_json_u64(o, "device_state_bytes", r->devstate_bytes, r->devstate_bytes);
	hq_json_u64(o, "faults", stats, st->faults);
	hq_json_u64(o, "faults_vcpu", stats, st->faults_vcpu);
	hq_json_u64(o, "faults_other", stats, st->faults_other);
	hq_json_fixed(o, "fault_p50_us", stats, (double)st->fault_p50_ns / 1e3, 1);
	hq_json_fixed(o, "fault_p99_us", stats, (double)st->fault_p99_ns / 1e3, 1);
	hq_json_fixed(o, "fault_max_us", stats, (double)st->fault_max_ns / 1e3, 1);
	hq_json_bool(o, "fault_realtime", stats, st->fault_realtime);
	hq_json_u64(o, "mb_total", stats, st->mb_total);
	hq_json_u64(o, "mb_stored", stats, st->mb_stored);
	hq_json_u64(o, "mb_zero", stats, st->mb_zero);
	hq_json_u64(o, "mb_untouched", stats, st->mb_untouched);
	hq_json_u64(o, "mb_background", stats, st->mb_background);
	hq_json_u64(o, "root_samples", r->have_stats || r->root_samples, r->root_samples);
	hq_json_bool(o, "bypass_cache", r->p.parsed, r->p.flags & HALITE_SAVE_DIRECT);
	report_devram_json(o, r);
	report_disks_json(o, r);
	hq_json_print(o);
}

static void report_disks(const struct save_run *r)
{
	for (int i = 0; i < r->disks->n; i++) {
		const struct hq_disk *d = &r->disks->d[i];

		if (d->frozen)
			printf("  disk           %s: %s frozen; the guest writes to %s now%s\n",
			       d->target[0] ? d->target : d->name, d->image, d->overlay,
			       d->target[0] ? " (through libvirt, which knows it)" : "");
		else
			printf("  disk           %s: %s %s\n", d->name,
			       d->image, d->ro ? "read-only, not frozen" :
			       "NOT frozen (--no-disks): restorable only with the disk as it "
			       "was at the snapshot");
	}
}

static void report(const struct save_run *r, int ret)
{
	const struct halite_save_stats *st = &r->st;
	/* A guest that was paused already was not paused by the save: no pause. */
	double pause_ms = r->t_stop_ns && r->t_cont_ns > r->t_stop_ns ?
			  (double)(r->t_cont_ns - r->t_stop_ns) / 1e6 : 0;
	double ratio = st->mb_total ? (double)st->file_bytes / ((double)st->mb_total * 8192) : 0;
	char a[32], b[32];


	if (r->p.out.json) {
		report_json(r, hq_exit_code(ret));
		return;
	}
	if (ret)
		return;
	printf("saved %s: QEMU %d.%d.%d pid %d, %s, %u vCPUs\n", r->p.path, r->vm.major,
	       r->vm.minor, r->vm.micro, (int)r->vm.pid, r->vm.machine, r->vm.nvcpus);
	if (r->was_running)
		printf("  pause          %.1f ms (arm %.1f ms)\n", pause_ms, (double)st->arm_ns / 1e6);
	else
		printf("  pause          none: not paused by the save, the guest was already paused "
		       "and stays paused (arm %.1f ms)\n", (double)st->arm_ns / 1e6);
	printf("  save           %.2f s while the guest %s\n", (double)st->duration_ns / 1e9,
	       r->was_running ? "ran" : "stayed paused");
	printf("  file           %s for %s of memory (%.1f%%), device state %" PRIu64 " bytes\n",
	       hq_bytes(st->file_bytes, a, sizeof(a)), hq_bytes(st->mb_total * 8192, b, sizeof(b)),
	       100 * ratio, r->devstate_bytes);
	printf("  blocks         %" PRIu64 " stored, %" PRIu64 " zero, %" PRIu64
	       " never touched; %" PRIu64 " by the background pass\n", st->mb_stored, st->mb_zero,
	       st->mb_untouched, st->mb_background);
	printf("  faults         %" PRIu64 ", service p50 %.0f us, p99 %.0f us; the blocks they saved:"
	       " %" PRIu64 " by vCPUs, %" PRIu64 " by other threads\n", st->faults,
	       (double)st->fault_p50_ns / 1e3, (double)st->fault_p99_ns / 1e3, st->faults_vcpu,
	       st->faults_other);
	for (uint32_t i = 0; i < r->vm.ndevram; i++)
		printf("  device RAM     %s, %s at 0x%" PRIx64 "\n", r->vm.devram[i].name,
		       hq_bytes(r->vm.devram[i].length, a, sizeof(a)), r->vm.devram[i].gpa);
	if (r->vm.ndevram)
		printf("  device copy    %s of the pages QEMU has, copied in the pause in %.2f ms\n",
		       hq_bytes(r->devram_copied, a, sizeof(a)), (double)r->devram_ns / 1e6);
	if (r->vm.devram_skipped[0])
		printf("  not saved      %s (starts blank after a restore)\n", r->vm.devram_skipped);
	report_disks(r);
}

int hq_cmd_save(int argc, char **argv)
{
	struct save_run *r = calloc(1, sizeof(*r));
	int ret;

	if (!r) {
		hq_errorf("save: out of memory");
		return EXIT_FAIL;
	}
	r->p = (struct save_params){ .codec = HALITE_CODEC_LZ4, .root_ms = 100 };
	hq_out_init(&r->p.out, "save", argc, argv);
	if (parse_args(argc, argv, &r->p)) {
		if (hq_usage_report(&r->p.out, r->err, sizeof(r->err)))
			report_json(r, EXIT_USAGE);
		free(r);
		return EXIT_USAGE;
	}
	if (r->p.recover) {
		ret = hq_cmd_recover(r->p.qmp, &r->p.out);
		free(r);
		return ret;
	}
	r->uffd = r->remote_uffd = r->vm.aside_fd = -1;
	r->disks = calloc(1, sizeof(*r->disks));
	if (!r->disks) {
		hq_errorf("save: out of memory");
		free(r);
		return EXIT_FAIL;
	}
	ret = halite_writer_check_path(r->p.path, r->err, sizeof(r->err));
	if (ret == -EINVAL) {
		/* No file name at all ("" on the command line): usage. */
		hq_usage(&r->p.out, "%s (" PROG " save --help)", r->err);
		if (hq_usage_report(&r->p.out, r->err, sizeof(r->err)))
			report_json(r, EXIT_USAGE);
		free(r->disks);
		free(r);
		return EXIT_USAGE;
	}
	if (!ret)
		ret = run(r);
	/* Every block given back, the ranges unregistered, the pages moved aside unmapped. */
	halite_save_free(r->s);
	r->s = NULL;
	/* The engine is gone: the copies of device RAM are ours again. */
	for (uint32_t i = 0; i < r->vm.ndevram; i++)
		if (r->devcopy[i])
			munmap(r->devcopy[i], r->vm.devram[i].length);
	if (r->uffd >= 0)
		close(r->uffd);
	if (r->remote_uffd >= 0 && hq_vm_close_remote(&r->vm, r->remote_uffd)) {
		/* QEMU keeps a descriptor it does not use: worth a word, not a failure. */
		hq_errorf("save: warning: closing QEMU's copy of the userfaultfd: %s", r->vm.err);
	}
	/* QEMU's memory is whole and its own again: nothing left to recover. */
	hq_aside_record_remove(&r->vm);
	if (ret && r->disks_known) {
		char err[1024];

		if (hq_disks_thaw(&r->vm, r->disks, err, sizeof(err))) {
			size_t n = strlen(r->err);

			snprintf(r->err + n, sizeof(r->err) - n, "; and the disks could not be "
				 "thawed: %s", err);
		}
	}
	if (ret)
		hq_errorf("save: %s", r->err);
	report(r, ret);
	hq_vm_release(&r->vm);
	free(r->disks);
	free(r);
	return hq_exit_code(ret);
}
