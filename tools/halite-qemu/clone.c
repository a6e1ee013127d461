// SPDX-License-Identifier: MIT
/*
 * halite-qemu clone: one clone of a QEMU guest saved by halite-qemu save,
 * the process a clone service (halite-cloned, issue 14) starts per clone:
 * the QEMU counterpart of `halite-synth clone` (testing/synth/cmd_clone.c), same
 * control protocol.
 *
 * QEMU runs the snapshot's recorded command line, made a machine of its
 * own: its main RAM is the template memory file mapped privately
 * (memory-backend-file,mem-path=T.mem,share=off: pages no clone wrote exist
 * once on the host, a write copies; the RAM block maps the file from offset
 * 0, so each RAM piece sits at its block offset in the file, which `info`
 * reports for the service to check against the template's layout); its
 * sockets, serial files and pidfile in the clone's directory; a new MAC on
 * each NIC; new host ports for its forwards; guid=auto on a vmgenid device;
 * its disks on new overlays of the frozen images. QEMU starts paused
 * (-S, -incoming defer); whatever it wrote to RAM while starting is dropped
 * (an injected madvise: the private copies go, the file's pages stay), and
 * a userfaultfd is made inside it with no handshake: the service's session
 * does that, registers the RAM and serves it. QEMU keeps its copy of the
 * descriptor: if this process and the service die, its faults block, never
 * read zeros.
 *
 * Control protocol (unix stream socket, one connection at a time, one JSON
 * line per command, {"error": ...} for a failure):
 *   info     {"pid" (QEMU's), "host", "mem_bytes", "region", "offset",
 *             "nvcpus", "vcpu_tids", "state", "forwards": [{"rule",
 *             "host_port"}], "macs", "qmp", "serial", "disks"}, and with more
 *             than one RAM piece "regions": [{"name","host","length",
 *             "offset"}]
 *   uffd     {"ok":true}, the userfaultfd attached (SCM_RIGHTS)
 *   start    loads the device state (its RAM faults are served by the
 *            session, so the session must run first), writes the video
 *            memory, adds the host forwards, then cont: {"ok":true}
 *   pause | resume   QMP stop | cont
 *   stats    {"run_state", "state"}
 *   digest   an error: check the memory from inside the guest
 *   quit     {"ok":true}, QEMU quits, this process exits 0
 * QEMU exiting ends this process (status 0 when it quit, 1 otherwise).
 * QEMU dies with this process (PR_SET_PDEATHSIG): a clone deleted by
 * killing it takes its QEMU along.
 *
 * Not made its own: the MAC the guest uses. QEMU's NIC gets the new one,
 * but the loaded device state and the guest's driver carry the template's
 * until the guest reads it again (harmless with user networking: each
 * clone has its own slirp; on a shared bridge it is not).
 * Refused: a device that gives memory back (virtio-balloon, virtio-mem),
 * -numa, a second memory backend.
 *
 * Confinement (issue 24). The file's writer chose its command line, and a
 * service runs this as root: the recorded line is checked against what a
 * clone may use before anything of it runs (clone_policy.c), QEMU is
 * --qemu-binary's (the recorded argv[0] is never run), its boot files are
 * opened beneath --allow-dir and handed over as /proc/self/fd/N, and it runs
 * under -sandbox on and, with --run-as, as that user (-runas: it drops
 * root once its files are open). Its userfaultfd then comes from
 * /dev/userfaultfd (uffd_in_qemu()), and its read-write descriptor of the
 * template memory file is closed inside it once it is up (drop_qemu_fds()):
 * a QEMU taken over by its guest holds nothing that writes the memory
 * every clone maps. The snapshot may come as /proc/self/fd/N: it is read
 * through that path only, and QEMU does not inherit N.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "clone_srv.h"
#include "clone_state.h"
#include "inject.h"
#include "inside.h"
#include "proc.h"
#include "runstate.h"

void hq_help_clone(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " clone --mem-file MEM --control SOCK [OPTIONS] FILE\n\n"
		"One clone of the QEMU guest FILE (saved by '" PROG " save'), for a clone\n"
		"service (halite-cloned): QEMU runs FILE's recorded command line with its RAM\n"
		"the template memory file MEM mapped privately (memory-backend-file, share=off),\n"
		"paused; its own sockets, serial files and pidfile in DIR, new MACs, new host\n"
		"forward ports, guid=auto for a vmgenid device, its disks on new overlays of\n"
		"the frozen images. A userfaultfd made inside QEMU (no handshake) is handed to\n"
		"whoever asks on SOCK; 'start' there loads the device state and runs the guest.\n"
		"The protocol is described at the top of tools/halite-qemu/clone.c. Prints\n"
		"'ready' on stdout once SOCK serves.\n\n"
		"Options:\n"
		"  --mem-file MEM   the template memory file (its region 0 at offset 0)\n"
		"  --control SOCK   the control socket to serve\n"
		"  --dir DIR        the clone's files (default: SOCK's directory)\n"
		"  --qmp PATH       the QMP socket this process gives QEMU (default DIR/halite-qmp.sock)\n"
		"  --disk-dir DIR   the disks' overlays (default: --dir)\n"
		"  --disk-copies DIR  frozen disk N's image is DIR/N.qcow2 (a copy brought from an\n"
		"                   object store), not the saving host's path FILE records; DIR\n"
		"                   and its images must be this user's, writable by no one else\n"
		"  --qemu-binary PATH  run QEMU PATH (absolute), whatever FILE records\n"
		"  --run-as USER    QEMU runs as USER (a name or a uid; never root): -runas\n"
		"  --allow-dir DIR  -kernel, -initrd, -bios, -dtb and -L must lie beneath DIR\n"
		"                   (repeatable); QEMU gets each opened, as /proc/self/fd/N\n"
		"  -h, --help       this help\n"
		"  --version        the version\n"
		"FILE's recorded command line may use only what a clone makes its own or what\n"
		"touches nothing of the host's (clone_policy.c): no programs (script=, smb=,\n"
		"-plugin), host devices, host networks (user networking only), host files other\n"
		"than its frozen disks and, with --allow-dir, its boot files; the first option\n"
		"refused is named. FILE may be /proc/self/fd/N (read through it only). QEMU runs\n"
		"under -sandbox on (no exec, no privilege or scheduling calls) and, once up,\n"
		"holds no descriptor of MEM. Without --qemu-binary, QEMU is $HALITE_QEMU, else\n"
		"the recorded one if it is a qemu-system-* in $PATH or an absolute path.\n");
}

static int parse_args(int argc, char **argv, struct clone_params *p)
{
	static const struct option lo[] = {
		{ "mem-file", required_argument, NULL, 'm' },
		{ "control", required_argument, NULL, 'c' },
		{ "dir", required_argument, NULL, 'd' },
		{ "qmp", required_argument, NULL, 'Q' },
		{ "disk-dir", required_argument, NULL, 'K' },
		{ "disk-copies", required_argument, NULL, 'C' },
		{ "qemu-binary", required_argument, NULL, 'B' },
		{ "run-as", required_argument, NULL, 'U' },
		{ "allow-dir", required_argument, NULL, 'A' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, HQ_OPT_VERSION },
		{ 0 }
	};
	struct hq_out o;
	int c;

	*p = (struct clone_params){ 0 };
	hq_out_init(&o, "clone", argc, argv);
	optind = 1;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': p->mem_file = optarg; break;
		case 'c': p->control = optarg; break;
		case 'd': p->dir = optarg; break;
		case 'Q': p->qmp = optarg; break;
		case 'K': p->disk_dir = optarg; break;
		case 'C': p->disk_copies = optarg; break;
		case 'B': p->qemu_binary = optarg; break;
		case 'U': p->run_as = optarg; break;
		case 'A':
			if (p->nallow_dirs == MAX_ALLOW_DIRS || optarg[0] != '/') {
				hq_errorf("clone: --allow-dir %s: %s", optarg,
					  optarg[0] != '/' ? "an absolute path please" :
					  "too many (16 at most)");
				return -1;
			}
			p->allow_dirs[p->nallow_dirs++] = optarg;
			break;
		case 'h':
			hq_help_clone(stdout);
			exit(EXIT_OK);
		default:
			/* getopt's own codes (':', '?') and --version: clone has no -j, -q, -v. */
			if (hq_out_opt(c, &o, argc, argv) >= 0)
				hq_usage(&o, "option '%s' is not handled", argv[optind - 1]);
			hq_errorf("clone: %s", o.usage);
			return -1;
		}
	}
	if (optind != argc - 1 || !p->mem_file || !p->control) {
		hq_errorf("clone: %s (" PROG " clone --help)",
			  optind >= argc ? "FILE missing" : optind < argc - 1 ? "one FILE only" :
			  "--mem-file and --control are needed");
		return -1;
	}
	p->path = argv[optind];
	return 0;
}

/* --- the snapshot ------------------------------------------------------- */

static int check_file(struct qclone *c)
{
	int ret = hq_bring_read(&c->b, true, NULL);

	if (!ret && !c->b.cfg.rec.argc)
		ret = clone_fail(c, -EINVAL, c->p.path, "records no QEMU command line to clone");
	/*
	 * The service hands the file over as /proc/self/fd/N, read through
	 * that path only: QEMU must not inherit N.
	 */
	if (!strncmp(c->p.path, "/proc/self/fd/", 14))
		fcntl(atoi(c->p.path + 14), F_SETFD, FD_CLOEXEC);
	return ret;
}

/* @st, of something in --disk-copies: this user's, and no one else may write it. */
static int copy_owned(struct qclone *c, const struct stat *st, const char *what)
{
	if (st->st_uid != geteuid() || (st->st_mode & 022))
		return clone_fail(c, -EPERM, what, "must be this user's and writable by no one "
				  "else (another user could swap a guest's disk)");
	return 0;
}

/*
 * --disk-copies DIR: frozen disk N runs on an overlay of DIR/N.qcow2, a
 * self-contained copy a service brought from an object store and checked
 * (diskfetch.h); the images FILE records are the saving host's and are
 * never looked at. Only indices name the copies: nothing FILE says picks a
 * path here. DIR is named by its real path, as QEMU names an overlay's
 * backing image (hq_disks_verify() compares the two).
 */
static int use_disk_copies(struct qclone *c)
{
	const char *arg = c->p.disk_copies;
	char dir[PATH_MAX], fdp[32], what[PATH_MAX + 320];
	struct stat st;
	int dfd, ret = 0;

	dfd = open(arg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return clone_fail(c, -errno, "--disk-copies", strerror(errno));
	snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", dfd);
	snprintf(what, sizeof(what), "--disk-copies %s", arg);
	if (fstat(dfd, &st) || !realpath(fdp, dir))
		ret = clone_fail(c, -errno, what, strerror(errno));
	if (!ret)
		ret = copy_owned(c, &st, what);
	for (int i = 0; !ret && i < c->b.disks->n; i++) {
		struct hq_disk *d = &c->b.disks->d[i];
		char name[24];
		int fd;

		if (!d->frozen)
			continue;
		snprintf(name, sizeof(name), "%d.qcow2", i);
		/* Cut, it still names the disk: it is only said. */
		if (snprintf(what, sizeof(what), "disk %s: its copy %s/%s", d->name, dir, name) < 0)
			what[0] = '\0';
		fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			ret = clone_fail(c, -errno, what, strerror(errno));
			break;
		}
		if (fstat(fd, &st))
			ret = clone_fail(c, -errno, what, strerror(errno));
		else if (!S_ISREG(st.st_mode))
			ret = clone_fail(c, -EINVAL, what, "not a regular file");
		else
			ret = copy_owned(c, &st, what);
		close(fd);
		/* QEMU's option syntax: a comma would split the overlay's backing name. */
		if (!ret && (strchr(dir, ',') || snprintf(d->local, sizeof(d->local), "%s/%s", dir,
							       name) >= (int)sizeof(d->local)))
			ret = clone_fail(c, -EINVAL, what, "a path under 1024 bytes without commas "
					 "please");
	}
	close(dfd);
	return ret;
}

/* The frozen disks, each on a new overlay in --disk-dir (or the clone's dir). */
static int prepare_disks(struct qclone *c)
{
	const char *base = strrchr(c->dir, '/') ? strrchr(c->dir, '/') + 1 : c->dir;
	char tag[128];

	if (!c->b.cfg.rec_disks || !c->b.disks) {
		if (c->p.disk_copies)
			return clone_fail(c, -EINVAL, "--disk-copies", "the snapshot records no disk");
		return 0; /* parsed by check_policy() */
	}
	if (!hq_bring_frozen(&c->b)) {
		if (c->p.disk_copies)
			return clone_fail(c, -EINVAL, "--disk-copies", "the snapshot froze no disk");
		if (hq_disks_writable(c->b.disks))
			return clone_fail(c, -HALITE_E_UNSUPPORTED, "the snapshot was saved with "
				    "--no-disks", "clones would share its writable disks");
		return 0;
	}
	if (c->p.disk_copies) {
		int ret = use_disk_copies(c);

		if (ret)
			return ret;
	}
	snprintf(tag, sizeof(tag), "clone-%.100s", base);
	return hq_bring_disks(&c->b, c->p.disk_dir ? c->p.disk_dir : c->dir, tag);
}

/* --- QEMU ----------------------------------------------------------------- */

static int spawn_qemu(struct qclone *c)
{
	struct hq_spawn s = { .cfg = &c->b.cfg, .qmp = c->qmp, .log_mode = 0640,
			      .die_with_us = true };
	char log[PATH_MAX + 16];
	int ret;

	snprintf(log, sizeof(log), "%s/qemu.log", c->dir);
	s.log = log;
	/*
	 * QEMU as another user may not call userfaultfd() (without
	 * vm.unprivileged_userfaultfd, only CAP_SYS_PTRACE may): it inherits
	 * /dev/userfaultfd opened here, whose USERFAULTFD_IOC_NEW needs no
	 * privilege once open (uffd_in_qemu()).
	 */
	if (c->runas[0]) {
		c->devuffd = open("/dev/userfaultfd", O_RDWR);
		if (c->devuffd < 0 && errno != ENOENT)
			return clone_fail(c, -errno, "/dev/userfaultfd", strerror(errno));
	}
	ret = hq_bring_spawn(&c->b, &s);
	/* QEMU has its copies (same numbers); ours are done. */
	for (int i = 0; i < c->nhost_fds; i++)
		close(c->host_fds[i]);
	if (c->devuffd >= 0)
		close(c->devuffd);
	if (ret)
		return ret;
	/* Watched while serving: QEMU's exit ends this process. */
	c->qemu_pidfd = (int)syscall(SYS_pidfd_open, c->b.qemu, 0);
	if (c->qemu_pidfd < 0)
		return clone_fail(c, -errno, "pidfd_open", strerror(errno));
	return 0;
}

static int attach_qemu(struct qclone *c)
{
	char see[PATH_MAX + 16];

	snprintf(see, sizeof(see), "%.1000s/qemu.log", c->dir);
	return hq_bring_attach(&c->b, c->qmp, QMP_START_TIMEOUT_MS, 20000, see, NULL, NULL);
}

/*
 * QEMU is the file's machine, its RAM the file's guest RAM (same pieces,
 * names as the file has them), device RAM blocks of the same sizes.
 * QEMU punches a discarded range out of a memory-backend-file's file even
 * when it maps it privately (ram_block_discard_range): one clone's balloon
 * would wipe the template every clone maps.
 */
static int check_vm(struct qclone *c)
{
	int ret = hq_bring_check_incoming(&c->b);

	if (!ret)
		ret = hq_bring_check_machine(&c->b);
	if (ret)
		return ret;
	if (hq_vm_discard_device(&c->b.vm))
		return clone_fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest with a device that gives "
			    "memory back (its discards would punch the shared template file)",
			    hq_vm_discard_device(&c->b.vm));
	c->b.vm.ram_find_only = true; /* a private file mapping: nothing to open */
	return hq_bring_find_ram(&c->b);
}

/* A system call inside QEMU (ptrace); its result, or < 0 with c->err. */
static long in_qemu(struct qclone *c, long nr, long a0, long a1, long a2, const char *what)
{
	long args[6] = { a0, a1, a2 }, res = 0;
	char err[512];
	int ret = hq_inject_one(c->b.vm.pid, nr, args, &res, err, sizeof(err));

	if (ret)
		return clone_fail(c, ret, what, err);
	if (res < 0)
		return clone_fail(c, (int)res, what, strerror((int)-res));
	return res;
}

/*
 * The session's userfaultfd, made inside QEMU. As root, userfaultfd();
 * as --run-as's user, USERFAULTFD_IOC_NEW on the /dev/userfaultfd QEMU
 * inherited, which is then closed there (it would make more). QEMU keeps
 * its userfaultfd, as hq_vm_uffd() leaves it.
 */
static int uffd_in_qemu(struct qclone *c)
{
	long fd;

	if (!c->runas[0] || c->devuffd < 0) {
		c->uffd = hq_vm_uffd(&c->b.vm, &c->remote_uffd);
		return c->uffd < 0 ? clone_fail(c, c->uffd, c->b.vm.err, NULL) : 0;
	}
	fd = in_qemu(c, SYS_ioctl, c->devuffd, (long)USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK,
		     "USERFAULTFD_IOC_NEW inside QEMU");
	if (fd < 0)
		return (int)fd;
	if (in_qemu(c, SYS_close, c->devuffd, 0, 0, "closing /dev/userfaultfd inside QEMU") < 0)
		return -EIO;
	c->devuffd = -1;
	c->remote_uffd = (int)fd;
	c->uffd = hq_fd_from_process(c->b.vm.pid, (int)fd, c->err, sizeof(c->err));
	return c->uffd < 0 ? c->uffd : 0;
}

/*
 * QEMU opened the template memory file read-write (as root, before -runas)
 * and keeps the descriptor: a QEMU taken over by its guest could write or
 * punch the memory every clone maps. Its mapping is private and stays; the
 * descriptors go (found by their target in /proc/PID/fd), and so do the
 * boot files it inherited.
 */
static int drop_qemu_fds(struct qclone *c)
{
	int fds[64], n;

	n = hq_proc_fds_to(c->b.vm.pid, c->mem_file, fds, 64);
	if (n < 0) {
		char dir[64];

		snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)c->b.vm.pid);
		return clone_fail(c, n, dir, strerror(-n));
	}
	n = n < 64 ? n : 64;
	for (int i = 0; i < c->nhost_fds && n < 64; i++)
		fds[n++] = c->host_fds[i];
	for (int i = 0; i < n; i++) {
		long r = in_qemu(c, SYS_close, fds[i], 0, 0, "closing a descriptor inside QEMU");

		/* EBADF: QEMU closed that boot file itself */
		if (r < 0 && r != -EBADF)
			return (int)r;
		c->err[0] = '\0';
	}
	return 0;
}

/* The device state to QEMU (its RAM faults served by the session); wait for the load. */
static int load_devices(struct qclone *c)
{
	char sock[PATH_MAX + 16], tmp[] = "/tmp/halite-qemu-in.XXXXXX";
	const char *dir = c->dir;
	int ret;

	/*
	 * QEMU listens on DIR/in.sock once it runs as --run-as's user, who
	 * may not write the clone's directory: a directory of that user's
	 * own, for this once.
	 */
	if (c->runas[0]) {
		if (!mkdtemp(tmp))
			return clone_fail(c, -errno, "a directory for the incoming socket", strerror(errno));
		if (chown(tmp, c->run_uid, c->run_gid)) {
			ret = clone_fail(c, -errno, tmp, strerror(errno));
			rmdir(tmp);
			return ret;
		}
		dir = tmp;
	}
	ret = hq_bring_load_devices(&c->b, dir, LOAD_TIMEOUT_MS, NULL, NULL, "(see its qemu.log)");
	snprintf(sock, sizeof(sock), "%s/in.sock", dir);
	unlink(sock);
	if (dir != c->dir)
		rmdir(dir);
	return ret;
}

static int setup(struct qclone *c)
{
	char *slash;
	int ret;

	if (!realpath(c->p.mem_file, c->mem_file))
		return clone_fail(c, -errno, c->p.mem_file, strerror(errno));
	/* QEMU's mem-path and its option syntax: a comma would split it. */
	if (strchr(c->mem_file, ','))
		return clone_fail(c, -EINVAL, "--mem-file: a path without commas please", c->mem_file);
	if (c->p.dir) {
		snprintf(c->dir, sizeof(c->dir), "%s", c->p.dir);
	} else {
		snprintf(c->dir, sizeof(c->dir), "%s", c->p.control);
		slash = strrchr(c->dir, '/');
		if (slash)
			*slash = '\0';
		else
			snprintf(c->dir, sizeof(c->dir), ".");
	}
	{
		char abs[PATH_MAX];

		if (!realpath(c->dir, abs))
			return clone_fail(c, -errno, c->dir, strerror(errno));
		snprintf(c->dir, sizeof(c->dir), "%s", abs);
	}
	if (c->p.qmp)
		snprintf(c->qmp, sizeof(c->qmp), "%s", c->p.qmp);
	else
		snprintf(c->qmp, sizeof(c->qmp), "%s/halite-qmp.sock", c->dir);
	ret = c->p.qemu_binary ? clone_check_qemu_binary(c) : 0;
	if (!ret && c->p.run_as)
		ret = clone_resolve_run_as(c);
	if (!ret)
		ret = check_file(c);
	if (!ret)
		ret = clone_prepare_cmdline(c);
	if (!ret)
		ret = prepare_disks(c);
	if (!ret)
		ret = spawn_qemu(c);
	if (!ret)
		ret = attach_qemu(c);
	if (!ret)
		ret = check_vm(c);
	if (!ret)
		ret = hq_bring_empty_ram(&c->b);
	if (!ret)
		ret = uffd_in_qemu(c);
	if (!ret)
		ret = drop_qemu_fds(c);
	return ret;
}

/* --- the control socket --------------------------------------------------- */

static const char *const state_names[] = { "created", "running", "paused" };

static cJSON *cmd_info(struct qclone *c)
{
	cJSON *r = cJSON_CreateObject(), *a;
	char host[32];
	const struct hq_region *g = &c->b.vm.regions[0];

	if (!r)
		return NULL;
	snprintf(host, sizeof(host), "0x%" PRIx64, g->host);
	cJSON_AddNumberToObject(r, "pid", (double)c->b.vm.pid);
	cJSON_AddStringToObject(r, "host", host);
	cJSON_AddNumberToObject(r, "mem_bytes", (double)g->length);
	cJSON_AddStringToObject(r, "region", g->name);
	cJSON_AddNumberToObject(r, "offset", (double)g->offset);
	cJSON_AddNumberToObject(r, "nvcpus", c->b.vm.nvcpus);
	a = cJSON_AddArrayToObject(r, "vcpu_tids");
	for (uint32_t v = 0; a && v < c->b.vm.nvcpus; v++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(c->b.vm.vcpu_tids[v]));
	if (c->b.vm.nregions > 1) {
		a = cJSON_AddArrayToObject(r, "regions");
		for (uint32_t i = 0; a && i < c->b.vm.nregions; i++) {
			cJSON *o = cJSON_CreateObject();

			g = &c->b.vm.regions[i];
			snprintf(host, sizeof(host), "0x%" PRIx64, g->host);
			cJSON_AddStringToObject(o, "name", g->name);
			cJSON_AddStringToObject(o, "host", host);
			cJSON_AddNumberToObject(o, "length", (double)g->length);
			cJSON_AddNumberToObject(o, "offset", (double)g->offset);
			cJSON_AddItemToArray(a, o);
		}
	}
	cJSON_AddStringToObject(r, "state", state_names[c->state]);
	a = cJSON_AddArrayToObject(r, "forwards");
	for (int i = 0; a && i < c->b.cfg.fwds.n; i++) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddStringToObject(o, "rule", c->b.cfg.fwds.v[i].rule);
		cJSON_AddNumberToObject(o, "host_port", c->b.cfg.fwds.v[i].host_port);
		cJSON_AddItemToArray(a, o);
	}
	a = cJSON_AddArrayToObject(r, "macs");
	for (int i = 0; a && i < c->nmacs; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(c->macs[i]));
	cJSON_AddStringToObject(r, "qmp", c->user_qmp);
	cJSON_AddStringToObject(r, "serial", c->serial);
	a = cJSON_AddArrayToObject(r, "disks");
	for (int i = 0; a && c->b.disks && i < c->b.disks->n; i++)
		if (c->b.disks->d[i].frozen)
			cJSON_AddItemToArray(a, cJSON_CreateString(c->b.disks->d[i].overlay));
	return r;
}

static cJSON *cmd_start(struct qclone *c)
{
	uint64_t written;
	int ret;

	if (c->state != QC_CREATED)
		return clone_srv_error("start: already started (resume to run a paused guest)");
	c->err[0] = '\0';
	ret = load_devices(c);
	/* The file's video memory over its block, where the guest sees it once loaded. */
	if (!ret)
		ret = hq_bring_write_devram(&c->b, &written);
	if (!ret) {
		ret = hq_config_forward(&c->b.cfg, c->b.vm.qmp, c->err, sizeof(c->err));
		ret = ret > 0 ? 0 : ret;
	}
	if (!ret) {
		ret = hq_vm_settle(&c->b.vm, true, HQ_QMP_TIMEOUT_MS, NULL);
		if (ret)
			clone_fail(c, ret, "resuming the guest", c->b.vm.err);
	}
	if (ret)
		return clone_srv_error("start: %s", c->err[0] ? c->err : halite_strerror(ret));
	c->state = QC_RUNNING;
	return clone_srv_ok();
}

static cJSON *cmd_runstate(struct qclone *c, bool run)
{
	int ret;

	if (c->state == QC_CREATED)
		return clone_srv_error("%s: not started", run ? "resume" : "pause");
	ret = hq_vm_settle(&c->b.vm, run, HQ_QMP_TIMEOUT_MS, NULL);
	if (ret)
		return clone_srv_error("%s: %s", run ? "resume" : "pause", c->b.vm.err);
	c->state = run ? QC_RUNNING : QC_PAUSED;
	return clone_srv_ok();
}

static cJSON *cmd_stats(struct qclone *c)
{
	cJSON *r = cJSON_CreateObject();
	char st[32] = "";

	if (hq_vm_status(&c->b.vm, st, sizeof(st)))
		snprintf(st, sizeof(st), "unknown");
	cJSON_AddStringToObject(r, "run_state", st);
	cJSON_AddStringToObject(r, "state", state_names[c->state]);
	return r;
}

static cJSON *handle(void *ctx, char *line, int *pass_fd, bool *quit)
{
	struct qclone *c = ctx;
	size_t n = strlen(line);

	while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
		line[--n] = '\0';
	if (!strcmp(line, "info"))
		return cmd_info(c);
	if (!strcmp(line, "uffd")) {
		*pass_fd = c->uffd;
		return clone_srv_ok();
	}
	if (!strcmp(line, "start"))
		return cmd_start(c);
	if (!strcmp(line, "pause") || !strcmp(line, "resume"))
		return cmd_runstate(c, line[0] == 'r');
	if (!strcmp(line, "stats"))
		return cmd_stats(c);
	if (!strcmp(line, "digest") || !strncmp(line, "dump", 4) || !strncmp(line, "wait-done", 9))
		return clone_srv_error("%s: not for a QEMU clone (check its memory from inside the "
				   "guest)", line);
	if (!strcmp(line, "quit")) {
		*quit = c->quit = true;
		return clone_srv_ok();
	}
	return clone_srv_error("unknown command: %s", line);
}

/* QEMU asked to quit, then waited for (killed if it will not). 0 when it quit. */
static int stop_qemu(struct qclone *c)
{
	int st = 0;

	if (c->b.qemu <= 0)
		return 0;
	if (c->b.vm.qmp && hq_qmp_usable(c->b.vm.qmp))
		hq_qmp_call(c->b.vm.qmp, "quit", NULL, NULL, 2000);
	for (int i = 0; i < 200; i++) {
		if (waitpid(c->b.qemu, &st, WNOHANG) == c->b.qemu) {
			c->b.qemu = 0;
			return 0;
		}
		usleep(10000);
	}
	kill(c->b.qemu, SIGKILL);
	waitpid(c->b.qemu, NULL, 0);
	c->b.qemu = 0;
	return -ETIMEDOUT;
}

int hq_cmd_clone(int argc, char **argv)
{
	struct qclone *c = calloc(1, sizeof(*c));
	int ret, code = EXIT_OK, st;

	if (!c) {
		hq_errorf("clone: out of memory");
		return EXIT_FAIL;
	}
	if (parse_args(argc, argv, &c->p)) {
		free(c);
		return EXIT_USAGE;
	}
	c->b = (struct hq_bring){ .path = c->p.path, .err = c->err, .errlen = sizeof(c->err) };
	c->uffd = c->remote_uffd = c->lfd = c->qemu_pidfd = c->devuffd = -1;
	for (unsigned i = 0; i < HQ_MAX_REGIONS; i++)
		c->b.vm.regions[i].fd = -1;
	/* The service that started us may go: we live on (and may lose our stdout). */
	signal(SIGPIPE, SIG_IGN);
	setsid();
	ret = setup(c);
	if (!ret) {
		c->lfd = clone_srv_listen(c->p.control, c->err, sizeof(c->err));
		ret = c->lfd < 0 ? c->lfd : 0;
	}
	if (ret) {
		hq_errorf("clone: %s", c->err[0] ? c->err : halite_strerror(ret));
		code = ret == -HALITE_E_UNSUPPORTED ? EXIT_UNSUPPORTED : EXIT_FAIL;
		goto out;
	}
	printf("ready\n");
	fflush(stdout);
	/* Until quit, or QEMU's exit (its pidfd readable), or accept() fails. */
	ret = clone_srv_run(c->lfd, c->qemu_pidfd, handle, c);
	if (ret < 0)
		hq_errorf("clone: accept: %s", strerror(-ret));
	if (!c->quit) {
		if (c->b.qemu > 0 && waitpid(c->b.qemu, &st, WNOHANG) == c->b.qemu)
			c->b.qemu = 0;
		if (ret > 0)
			hq_errorf("clone: QEMU (pid %d) exited; see %s/qemu.log", (int)c->b.vm.pid,
				  c->dir);
		code = EXIT_FAIL;
	}
out:
	if (stop_qemu(c) && code == EXIT_OK)
		code = EXIT_FAIL;
	/* Overlays of a clone that never ran hold nothing; one that ran is the caller's. */
	if (c->b.disks && c->b.ndisks && c->state == QC_CREATED)
		hq_disks_remove_overlays(c->b.disks);
	if (c->lfd >= 0) {
		close(c->lfd);
		unlink(c->p.control);
	}
	if (c->uffd >= 0)
		close(c->uffd);
	if (c->qemu_pidfd >= 0)
		close(c->qemu_pidfd);
	hq_bring_free(&c->b);
	hq_vm_release(&c->b.vm);
	unlink(c->qmp);
	free(c);
	return code;
}
