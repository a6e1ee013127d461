// SPDX-License-Identifier: MIT
/*
 * halite-qemu clone: one clone of a QEMU guest saved by halite-qemu save,
 * the process a clone service (halite-cloned, issue 14) starts per clone:
 * the QEMU counterpart of `halite-synth clone` (guest/cmd_clone.c), same
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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "disks.h"
#include "hq.h"
#include "vmconfig.h"

#define QEMU_DEFAULT "qemu-system-x86_64"
#define QMP_START_TIMEOUT_MS 60000
#define LOAD_TIMEOUT_MS 120000
#define LINE_MAX_BYTES 4096
#define MAX_NICS 16

struct clone_params {
	const char *path;     /* the snapshot */
	const char *mem_file; /* the template memory file */
	const char *control;
	const char *dir;      /* the clone's own files; default: the control socket's dir */
	const char *qmp;      /* our QMP socket to QEMU; default DIR/halite-qmp.sock */
	const char *disk_dir; /* overlays; default DIR */
};

enum qc_state { QC_CREATED, QC_RUNNING, QC_PAUSED };

struct qclone {
	struct clone_params p;
	char dir[PATH_MAX], qmp[PATH_MAX + 32], mem_file[PATH_MAX];
	struct hq_config cfg;
	struct hq_disks *disks;
	int ndisks;
	struct hq_vm vm;
	pid_t qemu;
	int qemu_pidfd;
	int uffd, remote_uffd, lfd;
	uint8_t *dev;
	uint64_t devlen;
	uint32_t file_vcpus;
	char file_machine[64];
	uint32_t file_nregions;
	struct halite_region_info file_regions[HQ_MAX_REGIONS];
	bool file_devram[HQ_MAX_REGIONS];
	uint32_t ndevram;
	struct {
		const char *name;
		uint64_t length;
		uint8_t *copy; /* decoded from the snapshot before QEMU starts */
	} devram[HQ_MAX_DEVRAM];
	char macs[MAX_NICS][18];
	int nmacs;
	char user_qmp[PATH_MAX];   /* the first QMP/monitor socket the recorded line had, rewritten */
	char serial[PATH_MAX];	   /* the first serial file, rewritten */
	enum qc_state state;
	bool quit;
	char err[1280];
};

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
		"QEMU is " QEMU_DEFAULT " unless the file records another ($HALITE_QEMU).\n");
}

static int parse_args(int argc, char **argv, struct clone_params *p)
{
	static const struct option lo[] = {
		{ "mem-file", required_argument, NULL, 'm' },
		{ "control", required_argument, NULL, 'c' },
		{ "dir", required_argument, NULL, 'd' },
		{ "qmp", required_argument, NULL, 'Q' },
		{ "disk-dir", required_argument, NULL, 'K' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	int c;

	*p = (struct clone_params){ 0 };
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'm': p->mem_file = optarg; break;
		case 'c': p->control = optarg; break;
		case 'd': p->dir = optarg; break;
		case 'Q': p->qmp = optarg; break;
		case 'K': p->disk_dir = optarg; break;
		case 'h':
			hq_help_clone(stdout);
			exit(EXIT_OK);
		default:
			return -1;
		}
	}
	if (optind != argc - 1 || !p->mem_file || !p->control) {
		hq_errorf("clone: %s; see '" PROG " clone --help'",
			  optind >= argc ? "FILE missing" : optind < argc - 1 ? "one FILE only" :
			  "--mem-file and --control are needed");
		return -1;
	}
	p->path = argv[optind];
	return 0;
}

static int fail(struct qclone *c, int ret, const char *what, const char *detail)
{
	return hq_fail(c->err, sizeof(c->err), ret, what, detail);
}

/* --- the snapshot ------------------------------------------------------- */

/* A region's memory as saved, decoded into @out (zeros where nothing is stored). */
static int decode_region(struct qclone *c, struct halite_reader *rd,
			 const struct halite_region_info *ri, uint8_t *out)
{
	const struct halite_file_info *fi = halite_reader_info(rd);
	void *lb = halite_reader_alloc_lb(rd);
	uint64_t have = UINT64_MAX;
	int ret = 0;

	if (!lb)
		return fail(c, -ENOMEM, "out of memory", NULL);
	for (uint64_t m = ri->first_mb; m < ri->first_mb + ri->mb_count && !ret; m++) {
		struct halite_mb_loc loc;

		ret = halite_reader_mb_lookup(rd, m, &loc);
		if (ret || loc.state != HALITE_MB_STORED)
			continue;
		/* A region's blocks mostly share LBs: read each once in a row. */
		if (loc.lb != have) {
			ret = halite_reader_read_lb(rd, loc.lb, lb);
			have = ret ? UINT64_MAX : loc.lb;
		}
		if (!ret)
			ret = halite_reader_decode_mb(rd, m, lb,
						      out + (m - ri->first_mb) * fi->mb_size);
	}
	halite_reader_free_lb(lb);
	if (ret)
		fail(c, ret, ri->name, halite_reader_errmsg(rd)[0] ? halite_reader_errmsg(rd) :
		     halite_strerror(ret));
	return ret;
}

/* qemu.device-ram: which regions are device RAM, written by us, not served. */
static int read_device_ram(struct qclone *c, struct halite_reader *rd)
{
	const char *k, *p;
	const void *val = NULL;
	uint32_t len = 0, i;
	int ret;

	for (i = 0; i < halite_reader_meta_count(rd); i++)
		if (!halite_reader_meta(rd, i, &k, &val, &len) && !strcmp(k, "qemu.device-ram"))
			break;
	if (i == halite_reader_meta_count(rd))
		return 0;
	if (!len || ((const char *)val)[len - 1])
		return fail(c, -HALITE_E_CORRUPT, c->p.path, "qemu.device-ram is no region list");
	for (p = val; p < (const char *)val + len; p += strlen(p) + 1) {
		uint32_t x;

		for (x = 0; x < c->file_nregions && strcmp(c->file_regions[x].name, p); x++)
			;
		if (x == c->file_nregions || c->file_devram[x] || c->ndevram == HQ_MAX_DEVRAM)
			return fail(c, -HALITE_E_CORRUPT, c->p.path, "bad qemu.device-ram");
		c->file_devram[x] = true;
		c->devram[c->ndevram].name = c->file_regions[x].name;
		c->devram[c->ndevram].length = c->file_regions[x].length;
		/*
		 * Fresh pages, page-aligned: only what the file stores is written
		 * (the rest stays unpopulated, and hq_vm_write_pages() sees it so).
		 */
		void *m = mmap(NULL, c->file_regions[x].length, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (m == MAP_FAILED)
			return fail(c, -errno, "a copy of device RAM", strerror(errno));
		madvise(m, c->file_regions[x].length, MADV_NOHUGEPAGE);
		c->devram[c->ndevram].copy = m;
		ret = decode_region(c, rd, &c->file_regions[x], c->devram[c->ndevram].copy);
		if (ret)
			return ret;
		c->ndevram++;
	}
	return 0;
}

static int check_file(struct qclone *c)
{
	HALITE_OPTS(halite_reader_opts, o);
	struct halite_reader *rd = NULL;
	const struct halite_root *roots;
	uint32_t nroots;
	const void *dev;
	char err[512] = "";
	int ret;

	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	ret = halite_reader_open(&rd, c->p.path, &o);
	if (ret)
		return fail(c, ret, c->p.path, err[0] ? err : halite_strerror(ret));
	ret = halite_reader_device_state(rd, &dev, &c->devlen);
	if (ret) {
		fail(c, ret, c->p.path, "no device state: not saved by " PROG);
		goto out;
	}
	ret = hq_device_stream_check(dev, c->devlen, c->file_machine, sizeof(c->file_machine),
				     err, sizeof(err));
	if (ret) {
		fail(c, ret, c->p.path, err);
		goto out;
	}
	c->dev = malloc(c->devlen);
	if (!c->dev) {
		ret = fail(c, -ENOMEM, "out of memory", NULL);
		goto out;
	}
	memcpy(c->dev, dev, c->devlen);
	if (halite_reader_vcpus(rd, &c->file_vcpus, &roots, &nroots))
		c->file_vcpus = 0;
	c->file_nregions = halite_reader_info(rd)->region_count;
	if (c->file_nregions > HQ_MAX_REGIONS) {
		ret = fail(c, -HALITE_E_LIMIT, c->p.path, "more regions than halite-qemu handles");
		goto out;
	}
	for (uint32_t i = 0; i < c->file_nregions; i++)
		c->file_regions[i] = *halite_reader_region(rd, i);
	ret = read_device_ram(c, rd);
	if (!ret)
		ret = hq_config_read(&c->cfg, rd, c->p.path, c->err, sizeof(c->err));
	if (!ret && !c->cfg.rec.argc)
		ret = fail(c, -EINVAL, c->p.path, "records no QEMU command line to clone");
out:
	halite_reader_free(rd);
	return ret;
}

/* --- the command line: a machine of its own ------------------------------ */

static int set_arg(struct hq_argv *a, int i, char *s)
{
	if (!s)
		return -ENOMEM;
	free(a->argv[i]);
	a->argv[i] = s;
	return 0;
}

/* "DIR/NAME" (malloc'd). */
static char *in_dir(const struct qclone *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static char *in_dir(const struct qclone *c, const char *fmt, ...)
{
	char name[128], *s;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	return asprintf(&s, "%s/%s", c->dir, name) < 0 ? NULL : s;
}

static int new_mac(struct qclone *c, char *out)
{
	uint8_t b[3];

	if (getrandom(b, sizeof(b), 0) != sizeof(b))
		return fail(c, -errno, "getrandom", strerror(errno));
	/* QEMU's own prefix (52:54:00, locally administered). */
	snprintf(out, 18, "52:54:00:%02x:%02x:%02x", b[0], b[1], b[2]);
	if (c->nmacs < MAX_NICS)
		memcpy(c->macs[c->nmacs++], out, 18);
	return 0;
}

/* @kv gets mac=NEW (replacing any). */
static int kv_new_mac(struct qclone *c, struct hq_kvs *kv)
{
	char mac[18];
	int ret = new_mac(c, mac);

	if (ret)
		return ret;
	hq_kvs_del(kv, "mac");
	return hq_kvs_add(kv, "mac", mac);
}

/* "unix:PATH[,opts]" with PATH in the clone's dir; others unchanged (NULL). */
static char *unix_chardev(struct qclone *c, const char *arg, const char *name, char *first,
			  size_t flen)
{
	const char *opts;
	char *path, *s;

	if (strncmp(arg, "unix:", 5))
		return NULL;
	opts = strchr(arg, ',');
	path = in_dir(c, "%s", name);
	if (!path || asprintf(&s, "unix:%s%s", path, opts ? opts : "") < 0)
		s = NULL;
	if (s && first && !first[0])
		snprintf(first, flen, "%s", path);
	free(path);
	return s;
}

/* One -object: the RAM's backend becomes the template file, mapped privately. */
static int ram_backend(struct qclone *c, const char *id, const char *size, char **out)
{
	return asprintf(out, "memory-backend-file,id=%s,size=%s,mem-path=%s,share=off", id, size,
			c->mem_file) < 0 ? -ENOMEM : 0;
}

/*
 * The recorded line (replayed: no -S, -incoming, ...) in @a made this
 * clone's. Refuses what it cannot make its own: more than one memory
 * backend in use, NUMA.
 */
static int rewrite_cmdline(struct qclone *c, struct hq_argv *a)
{
	struct hq_opt *o = NULL;
	int n = 0, ret, nserial = 0, nmon = 0, nchar = 0;
	char ram_id[128] = "", msize[64] = "";
	bool ram_done = false;

	ret = hq_opts_parse(a->argv + 1, a->argc - 1, &o, &n, c->err, sizeof(c->err));
	if (ret)
		return ret;
	/* First pass: which backend is the RAM, and -m's size. */
	for (int i = 0; i < n; i++) {
		struct hq_kvs kv = { 0 };

		if (!o[i].arg)
			continue;
		if (!strcmp(o[i].name, "machine") || !strcmp(o[i].name, "M")) {
			if (hq_kvs_split(o[i].arg, "type", &kv))
				continue;
			if (hq_kvs_get(&kv, "memory-backend"))
				snprintf(ram_id, sizeof(ram_id), "%s", hq_kvs_get(&kv, "memory-backend"));
		} else if (!strcmp(o[i].name, "m")) {
			if (hq_kvs_split(o[i].arg, "size", &kv))
				continue;
			if (hq_kvs_get(&kv, "size"))
				snprintf(msize, sizeof(msize), "%s", hq_kvs_get(&kv, "size"));
		} else if (!strcmp(o[i].name, "numa")) {
			free(o);
			return fail(c, -HALITE_E_UNSUPPORTED, "cloning a NUMA guest (-numa)",
				    "one memory backend only");
		}
		hq_kvs_free(&kv);
	}
	for (int i = 0; i < n && !ret; i++) {
		int ai = 1 + o[i].index + 1; /* the argument's index in @a */
		const char *name = o[i].name;
		struct hq_kvs kv = { 0 };
		char *s = NULL;

		if (!o[i].arg)
			continue;
		if (!strcmp(name, "object")) {
			const char *t, *id;

			if (hq_kvs_split(o[i].arg, "qom-type", &kv))
				continue;
			t = hq_kvs_get(&kv, "qom-type");
			id = hq_kvs_get(&kv, "id");
			if (t && !strncmp(t, "memory-backend-", 15)) {
				if (!id || strcmp(id, ram_id)) {
					ret = fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest with a "
						   "second memory backend", id ? id : "(no id)");
				} else {
					const char *sz = hq_kvs_get(&kv, "size");

					ret = ram_backend(c, id, sz ? sz : msize, &s);
					if (!ret)
						ret = set_arg(a, ai, s);
					ram_done = true;
				}
			}
		} else if (!strcmp(name, "qmp") || !strcmp(name, "qmp-pretty") ||
			   !strcmp(name, "monitor")) {
			char nm[32];

			snprintf(nm, sizeof(nm), "%s%d.sock", name, nmon++);
			s = unix_chardev(c, o[i].arg, nm, name[0] == 'q' ? c->user_qmp : NULL,
					 sizeof(c->user_qmp));
			if (s)
				ret = set_arg(a, ai, s);
		} else if (!strcmp(name, "serial")) {
			char nm[32];

			if (!strncmp(o[i].arg, "file:", 5)) {
				s = in_dir(c, "serial%d.log", nserial);
				if (s && !c->serial[0])
					snprintf(c->serial, sizeof(c->serial), "%s", s);
				char *t = NULL;

				if (s && asprintf(&t, "file:%s", s) < 0)
					t = NULL;
				free(s);
				ret = set_arg(a, ai, t);
			} else {
				snprintf(nm, sizeof(nm), "serial%d.sock", nserial);
				s = unix_chardev(c, o[i].arg, nm, NULL, 0);
				if (s)
					ret = set_arg(a, ai, s);
			}
			nserial++;
		} else if (!strcmp(name, "chardev")) {
			const char *be, *id;

			if (hq_kvs_split(o[i].arg, "backend", &kv))
				continue;
			be = hq_kvs_get(&kv, "backend");
			id = hq_kvs_get(&kv, "id");
			if (be && hq_kvs_get(&kv, "path") && (!strcmp(be, "socket") ||
							      !strcmp(be, "file"))) {
				char *p = in_dir(c, "chardev%d-%.40s.%s", nchar++, id ? id : "",
						 be[0] == 's' ? "sock" : "log");

				hq_kvs_del(&kv, "path");
				ret = p ? hq_kvs_add(&kv, "path", p) : -ENOMEM;
				free(p);
				if (!ret)
					ret = set_arg(a, ai, hq_kvs_join(&kv, "backend"));
			}
		} else if (!strcmp(name, "pidfile")) {
			ret = set_arg(a, ai, in_dir(c, "qemu.pid"));
		} else if (!strcmp(name, "D")) {
			ret = set_arg(a, ai, in_dir(c, "qemu-debug.log"));
		} else if (!strcmp(name, "nic") || !strcmp(name, "net")) {
			if (hq_kvs_split(o[i].arg, "type", &kv))
				continue;
			if (!strcmp(name, "nic") || (hq_kvs_get(&kv, "type") &&
						     !strcmp(hq_kvs_get(&kv, "type"), "nic"))) {
				ret = kv_new_mac(c, &kv);
				if (!ret)
					ret = set_arg(a, ai, hq_kvs_join(&kv, "type"));
			}
		} else if (!strcmp(name, "device")) {
			const char *drv;

			if (hq_kvs_split(o[i].arg, "driver", &kv))
				continue;
			drv = hq_kvs_get(&kv, "driver");
			if (hq_kvs_has(&kv, "netdev")) {
				ret = kv_new_mac(c, &kv);
				if (!ret)
					ret = set_arg(a, ai, hq_kvs_join(&kv, "driver"));
			} else if (drv && !strcmp(drv, "vmgenid")) {
				/* A new generation id: the guest reseeds its RNG. */
				hq_kvs_del(&kv, "guid");
				ret = hq_kvs_add(&kv, "guid", "auto");
				if (!ret)
					ret = set_arg(a, ai, hq_kvs_join(&kv, "driver"));
			}
		}
		hq_kvs_free(&kv);
	}
	free(o);
	if (ret)
		return ret;
	if (!ram_done) {
		/* -m alone: QEMU's default RAM ("pc.ram") as the template file. */
		char *obj = NULL;

		if (!msize[0])
			return fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest without -m", NULL);
		if (ram_id[0])
			return fail(c, -EINVAL, "the recorded -machine memory-backend has no -object",
				    ram_id);
		ret = ram_backend(c, "pc.ram", msize, &obj);
		if (!ret)
			ret = hq_argv_push(a, "-object");
		if (!ret)
			ret = hq_argv_push_own(a, obj);
		else
			free(obj);
		if (!ret)
			ret = hq_argv_push(a, "-machine");
		if (!ret)
			ret = hq_argv_push(a, "memory-backend=pc.ram");
	}
	return ret;
}

/* A port the kernel gives now for @w's protocol and address. */
static int free_port(const struct hq_fwd *w, uint16_t *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = w->host_addr };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, (w->udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(fd, (struct sockaddr *)&sa, &len))
		ret = -errno;
	close(fd);
	*port = ntohs(sa.sin_port);
	return ret;
}

/* Each forward on a host port of its own: "tcp:ADDR:OLD-..." -> "tcp:ADDR:NEW-...". */
static int new_ports(struct qclone *c)
{
	for (int i = 0; i < c->cfg.fwds.n; i++) {
		struct hq_fwd *w = &c->cfg.fwds.v[i];
		char *dash = strchr(w->rule, '-'), *colon, rule[sizeof(w->rule)];
		uint16_t port = 0;
		int ret;

		if (!dash)
			return fail(c, -EINVAL, "hostfwd rule", w->rule);
		*dash = '\0';
		colon = strrchr(w->rule, ':');
		*dash = '-';
		if (!colon)
			return fail(c, -EINVAL, "hostfwd rule", w->rule);
		ret = free_port(w, &port);
		if (ret)
			return fail(c, ret, "a free host port", strerror(-ret));
		snprintf(rule, sizeof(rule), "%.*s:%u%s", (int)(colon - w->rule), w->rule, port,
			 dash);
		memcpy(w->rule, rule, sizeof(rule));
		w->host_port = port;
	}
	return 0;
}

static int prepare_cmdline(struct qclone *c)
{
	int ret;

	ret = hq_cmdline_replay(c->cfg.rec.argv, c->cfg.rec.argc, &c->cfg.user,
				&c->cfg.replay_flags);
	if (ret)
		return fail(c, ret, "replaying the recorded command line", strerror(-ret));
	c->cfg.replayed = true;
	c->cfg.cwd = c->cfg.rec_cwd;
	if (getenv("HALITE_QEMU") && *getenv("HALITE_QEMU"))
		ret = set_arg(&c->cfg.user, 0, strdup(getenv("HALITE_QEMU")));
	if (!ret)
		ret = rewrite_cmdline(c, &c->cfg.user);
	if (!ret)
		ret = hq_argv_copy(&c->cfg.run, c->cfg.user.argv, c->cfg.user.argc);
	if (!ret)
		ret = hq_fwd_take_out(&c->cfg.run, &c->cfg.fwds, c->err, sizeof(c->err));
	if (!ret)
		ret = new_ports(c);
	/*
	 * Not hq_cmdline_check_host(): its sockets are in the clone's own
	 * directory, and its memory file is the template's, which the service
	 * and every other clone map by design.
	 */
	if (ret && !c->err[0])
		fail(c, ret, "QEMU's command line", strerror(-ret));
	return ret;
}

/* The frozen disks, each on a new overlay in --disk-dir (or the clone's dir). */
static int prepare_disks(struct qclone *c)
{
	const char *base = strrchr(c->dir, '/') ? strrchr(c->dir, '/') + 1 : c->dir;
	char tag[128];
	int ret, frozen = 0;

	if (!c->cfg.rec_disks)
		return 0;
	c->disks = calloc(1, sizeof(*c->disks));
	if (!c->disks)
		return fail(c, -ENOMEM, "out of memory", NULL);
	ret = hq_disks_parse(c->cfg.rec_disks, c->disks, c->err, sizeof(c->err));
	if (ret)
		return ret;
	for (int i = 0; i < c->disks->n; i++)
		frozen += c->disks->d[i].frozen;
	if (!frozen) {
		if (hq_disks_writable(c->disks))
			return fail(c, -HALITE_E_UNSUPPORTED, "the snapshot was saved with "
				    "--no-disks", "clones would share its writable disks");
		return 0;
	}
	ret = hq_disks_check_frozen(c->disks, c->err, sizeof(c->err));
	if (ret)
		return ret;
	snprintf(tag, sizeof(tag), "clone-%.100s", base);
	ret = hq_disks_make_overlays(c->disks, c->p.disk_dir ? c->p.disk_dir : c->dir, tag,
				     c->err, sizeof(c->err));
	if (ret)
		return ret;
	c->ndisks = frozen;
	return hq_disks_rewrite(c->disks, &c->cfg.run, c->cfg.cwd, c->err, sizeof(c->err));
}

/* --- QEMU ----------------------------------------------------------------- */

static int spawn_qemu(struct qclone *c)
{
	int argc = 0, pfd[2], e = 0, nenv = 0;
	char qmp[PATH_MAX + 64], log[PATH_MAX + 16], **argv, **envp, *own_env;
	pid_t parent = getpid();
	extern char **environ;
	ssize_t n;

	while (environ[nenv])
		nenv++;
	argv = calloc((size_t)c->cfg.run.argc + 8, sizeof(*argv));
	envp = calloc((size_t)nenv + 2, sizeof(*envp));
	own_env = hq_config_env(&c->cfg);
	if (!argv || !envp || !own_env || pipe2(pfd, O_CLOEXEC)) {
		free(argv);
		free(envp);
		free(own_env);
		return fail(c, -ENOMEM, "out of memory", NULL);
	}
	for (int i = 0, k = 0; i <= nenv; i++) {
		size_t name = (size_t)(strchr(own_env, '=') - own_env) + 1;

		if (i == nenv)
			envp[k] = own_env;
		else if (strncmp(environ[i], own_env, name))
			envp[k++] = environ[i];
	}
	for (int i = 0; i < c->cfg.run.argc; i++)
		argv[argc++] = c->cfg.run.argv[i];
	snprintf(qmp, sizeof(qmp), "unix:%s,server=on,wait=off", c->qmp);
	snprintf(log, sizeof(log), "%s/qemu.log", c->dir);
	argv[argc++] = "-S";
	argv[argc++] = "-incoming";
	argv[argc++] = "defer";
	argv[argc++] = "-qmp";
	argv[argc++] = qmp;
	argv[argc] = NULL;
	c->qemu = fork();
	if (c->qemu == 0) {
		int f;

		/* This process is the clone: QEMU goes with it (a deleted clone is killed). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		f = open("/dev/null", O_RDONLY);
		if (f >= 0)
			dup2(f, STDIN_FILENO);
		f = open(log, O_WRONLY | O_CREAT | O_APPEND, 0640);
		if (f >= 0) {
			dup2(f, STDOUT_FILENO);
			dup2(f, STDERR_FILENO);
		}
		if (!c->cfg.cwd || !chdir(c->cfg.cwd))
			execvpe(argv[0], argv, envp);
		e = errno;
		if (write(pfd[1], &e, sizeof(e)) < 0)
			_exit(127);
		_exit(127);
	}
	close(pfd[1]);
	if (c->qemu < 0) {
		close(pfd[0]);
		free(argv);
		free(envp);
		free(own_env);
		return fail(c, -errno, "fork", strerror(errno));
	}
	n = read(pfd[0], &e, sizeof(e));
	close(pfd[0]);
	if (n == sizeof(e)) {
		waitpid(c->qemu, NULL, 0);
		c->qemu = 0;
		snprintf(c->err, sizeof(c->err), "cannot run %s: %s", argv[0], strerror(e));
	}
	free(argv);
	free(envp);
	free(own_env);
	if (e)
		return -e;
	c->qemu_pidfd = (int)syscall(SYS_pidfd_open, c->qemu, 0);
	return 0;
}

static int attach_qemu(struct qclone *c)
{
	static const char *const need[] = { "query-cpus-fast", "human-monitor-command",
					    "migrate-incoming", "query-migrate", "cont", NULL };
	uint64_t end = hq_now_ns() + QMP_START_TIMEOUT_MS * 1000000ull;
	int ret, st;

	for (;;) {
		ret = hq_vm_attach(&c->vm, c->qmp, 200, need);
		if (ret != -ETIMEDOUT && ret != -ENOENT && ret != -ECONNREFUSED)
			break;
		hq_vm_release(&c->vm);
		if (waitpid(c->qemu, &st, WNOHANG) == c->qemu) {
			c->qemu = 0;
			snprintf(c->err, sizeof(c->err), "QEMU exited (%s %d) before its QMP socket "
				 "came up: see %.1000s/qemu.log", WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), c->dir);
			return -ECHILD;
		}
		if (hq_now_ns() > end)
			return fail(c, -ETIMEDOUT, "QEMU's QMP socket did not come up", c->qmp);
		usleep(20000);
	}
	if (ret)
		return fail(c, ret, c->vm.err, NULL);
	if (c->vm.pid != c->qemu)
		return fail(c, -EPROTO, "QMP socket answered by another process", c->qmp);
	return 0;
}

/*
 * QEMU is the file's machine, its RAM the file's guest RAM (same pieces,
 * names as the file has them), device RAM blocks of the same sizes.
 */
static int check_vm(struct qclone *c)
{
	uint32_t file_ram = 0;
	char st[32];
	int ret;

	ret = hq_vm_status(&c->vm, st, sizeof(st));
	if (ret)
		return fail(c, ret, c->vm.err, NULL);
	if (strcmp(st, "inmigrate"))
		return fail(c, -HALITE_E_STATE, "QEMU is not waiting for an incoming state", st);
	if (strcmp(c->vm.machine, c->file_machine))
		return fail(c, -EINVAL, "QEMU's machine type is not the file's", c->vm.machine);
	if (c->file_vcpus && c->file_vcpus != c->vm.nvcpus)
		return fail(c, -EINVAL, "QEMU's vCPU count is not the file's", NULL);
	ret = hq_config_check_devices(&c->cfg, c->vm.qmp, c->p.path, c->err, sizeof(c->err));
	if (ret)
		return ret;
	if (c->ndisks) {
		ret = hq_disks_verify(&c->vm, c->disks, c->err, sizeof(c->err));
		if (ret)
			return ret;
	}
	/*
	 * QEMU punches a discarded range out of a memory-backend-file's file even
	 * when it maps it privately (ram_block_discard_range): one clone's
	 * balloon would wipe the template every clone maps.
	 */
	if (hq_vm_discard_device(&c->vm))
		return fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest with a device that gives "
			    "memory back (its discards would punch the shared template file)",
			    hq_vm_discard_device(&c->vm));
	c->vm.ram_find_only = true; /* a private file mapping: nothing to open */
	ret = hq_vm_ram(&c->vm);
	if (ret)
		return fail(c, ret, c->vm.err, NULL);
	for (uint32_t i = 0; i < c->file_nregions; i++) {
		const struct halite_region_info *f = &c->file_regions[i];
		uint32_t k;

		if (c->file_devram[i])
			continue;
		file_ram++;
		for (k = 0; k < c->vm.nregions; k++)
			if (!strcmp(c->vm.regions[k].name, f->name) ||
			    (c->vm.regions[k].gpa == f->gpa && c->vm.regions[k].length == f->length))
				break;
		if (k == c->vm.nregions || c->vm.regions[k].length != f->length)
			return fail(c, -EINVAL, "the file's guest RAM has no counterpart of its "
				    "size in the clone's QEMU", f->name);
		/* the name the template knows it by (a backend renamed: pc.ram for mem0) */
		if (strlen(f->name) >= sizeof(c->vm.regions[k].name))
			return fail(c, -EINVAL, "the file's RAM region name is too long", f->name);
		memcpy(c->vm.regions[k].name, f->name, strlen(f->name) + 1);
	}
	if (file_ram != c->vm.nregions)
		return fail(c, -EINVAL, "the clone's QEMU has other guest RAM than the file", NULL);
	for (uint32_t i = 0; i < c->ndevram; i++) {
		uint64_t len = 0;

		ret = hq_vm_ramblock(&c->vm, c->devram[i].name, &len);
		if (ret || len != c->devram[i].length)
			return fail(c, ret ? ret : -EINVAL, "the file's device RAM has no "
				    "counterpart of its size in the clone's QEMU", c->devram[i].name);
	}
	return 0;
}

/* Nothing QEMU wrote or mapped while starting stays: the file's pages come through the session. */
static int empty_ram(struct qclone *c)
{
	for (uint32_t i = 0; i < c->vm.nregions; i++) {
		const struct hq_region *g = &c->vm.regions[i];
		int ret = hq_drop_ptes(&c->vm, g->host, g->length);

		if (ret) {
			snprintf(c->err, sizeof(c->err), "emptying guest RAM %.90s: madvise inside "
				 "QEMU: %.900s", g->name, ret < 0 && c->vm.err[0] ? c->vm.err : strerror(-ret));
			return ret < 0 ? ret : -EIO;
		}
	}
	return 0;
}

/* The device state through a unix socket QEMU listens on; wait for the load. */
static int load_devices(struct qclone *c)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t end = hq_now_ns() + LOAD_TIMEOUT_MS * 1000000ull;
	cJSON *args, *ret_obj = NULL;
	char uri[sizeof(sa.sun_path) + 8];
	const uint8_t *p = c->dev;
	uint64_t left = c->devlen;
	int fd, ret;

	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/in.sock", c->dir) >=
	    sizeof(sa.sun_path))
		return fail(c, -ENAMETOOLONG, "the clone's directory", c->dir);
	snprintf(uri, sizeof(uri), "unix:%s", sa.sun_path);
	args = cJSON_CreateObject();
	cJSON_AddStringToObject(args, "uri", uri);
	ret = hq_qmp_call(c->vm.qmp, "migrate-incoming", args, NULL, HQ_QMP_TIMEOUT_MS);
	if (ret)
		return fail(c, ret, "migrate-incoming", hq_qmp_errmsg(c->vm.qmp));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
		return fail(c, ret, "connecting to QEMU's incoming socket", strerror(-ret));
	}
	/* Blocking: QEMU reads it as it loads, its faults served by the session. */
	while (left) {
		ssize_t w = send(fd, p, left, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			ret = w < 0 ? -errno : -EIO;
			close(fd);
			return fail(c, ret, "sending the device state", strerror(-ret));
		}
		p += w;
		left -= (uint64_t)w;
	}
	close(fd);
	unlink(sa.sun_path);
	for (;;) {
		const char *st, *desc;

		ret = hq_qmp_call(c->vm.qmp, "query-migrate", NULL, &ret_obj, HQ_QMP_TIMEOUT_MS);
		if (ret)
			return fail(c, ret, "query-migrate", hq_qmp_errmsg(c->vm.qmp));
		st = cJSON_GetStringValue(cJSON_GetObjectItem(ret_obj, "status"));
		if (st && !strcmp(st, "completed")) {
			cJSON_Delete(ret_obj);
			c->vm.run_seen = -1; /* as restore.c's load_devices() says */
			return 0;
		}
		if (st && !strcmp(st, "failed")) {
			desc = cJSON_GetStringValue(cJSON_GetObjectItem(ret_obj, "error-desc"));
			fail(c, -EIO, "QEMU could not load the device state",
			     desc ? desc : "(see its qemu.log)");
			cJSON_Delete(ret_obj);
			return -EIO;
		}
		cJSON_Delete(ret_obj);
		ret_obj = NULL;
		if (hq_now_ns() > end)
			return fail(c, -ETIMEDOUT, "QEMU did not finish loading the device state",
				    NULL);
		usleep(500);
	}
}

/* The file's video memory over its block, where the guest sees it once loaded. */
static int write_device_ram(struct qclone *c)
{
	int ret;

	if (!c->ndevram)
		return 0;
	ret = hq_vm_device_ram(&c->vm);
	if (ret)
		return fail(c, ret, "finding device RAM", c->vm.err);
	for (uint32_t i = 0; i < c->ndevram; i++) {
		const struct hq_devram *d = NULL;
		uint64_t n = 0;

		for (uint32_t k = 0; k < c->vm.ndevram && !d; k++)
			if (!strcmp(c->vm.devram[k].name, c->devram[i].name))
				d = &c->vm.devram[k];
		if (!d || d->length != c->devram[i].length)
			return fail(c, -EINVAL, "the file's device RAM is not where the guest can "
				    "reach it once the device state is loaded", c->devram[i].name);
		ret = hq_vm_write_pages(&c->vm, d->host, d->length, c->devram[i].copy, &n);
		if (ret)
			return fail(c, ret, "writing device RAM", c->vm.err);
	}
	return 0;
}

static int setup(struct qclone *c)
{
	char *slash;
	int ret;

	if (!realpath(c->p.mem_file, c->mem_file))
		return fail(c, -errno, c->p.mem_file, strerror(errno));
	/* QEMU's mem-path and its option syntax: a comma would split it. */
	if (strchr(c->mem_file, ','))
		return fail(c, -EINVAL, "--mem-file: a path without commas please", c->mem_file);
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
			return fail(c, -errno, c->dir, strerror(errno));
		snprintf(c->dir, sizeof(c->dir), "%s", abs);
	}
	if (c->p.qmp)
		snprintf(c->qmp, sizeof(c->qmp), "%s", c->p.qmp);
	else
		snprintf(c->qmp, sizeof(c->qmp), "%s/halite-qmp.sock", c->dir);
	ret = check_file(c);
	if (!ret)
		ret = prepare_cmdline(c);
	if (!ret)
		ret = prepare_disks(c);
	if (!ret)
		ret = spawn_qemu(c);
	if (!ret)
		ret = attach_qemu(c);
	if (!ret)
		ret = check_vm(c);
	if (!ret)
		ret = empty_ram(c);
	if (!ret) {
		c->uffd = hq_vm_uffd(&c->vm, &c->remote_uffd);
		if (c->uffd < 0)
			ret = fail(c, c->uffd, c->vm.err, NULL);
	}
	return ret;
}

/* --- the control socket --------------------------------------------------- */

static cJSON *reply_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cJSON *reply_error(const char *fmt, ...)
{
	char msg[1400];
	va_list ap;
	cJSON *r = cJSON_CreateObject();

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r)
		cJSON_AddStringToObject(r, "error", msg);
	return r;
}

static cJSON *reply_ok(void)
{
	cJSON *r = cJSON_CreateObject();

	if (r)
		cJSON_AddTrueToObject(r, "ok");
	return r;
}

static int send_reply(int fd, cJSON *r, int pass_fd)
{
	char *s = r ? cJSON_PrintUnformatted(r) : strdup("{\"error\":\"out of memory\"}");
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t n, off = 0;
	int ret = 0;

	if (!s)
		return -ENOMEM;
	n = strlen(s);
	s[n++] = '\n'; /* over the NUL: the length is known */
	if (pass_fd >= 0) {
		struct cmsghdr *cm;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
	}
	while (!ret && off < n) {
		ssize_t w;

		iov.iov_base = s + off;
		iov.iov_len = n - off;
		w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			ret = -errno;
		else
			off += (size_t)w;
		mh.msg_control = NULL; /* the descriptor goes with the first bytes only */
		mh.msg_controllen = 0;
	}
	free(s);
	return ret;
}

static const char *const state_names[] = { "created", "running", "paused" };

static cJSON *cmd_info(struct qclone *c)
{
	cJSON *r = cJSON_CreateObject(), *a;
	char host[32];
	const struct hq_region *g = &c->vm.regions[0];

	if (!r)
		return NULL;
	snprintf(host, sizeof(host), "0x%" PRIx64, g->host);
	cJSON_AddNumberToObject(r, "pid", (double)c->vm.pid);
	cJSON_AddStringToObject(r, "host", host);
	cJSON_AddNumberToObject(r, "mem_bytes", (double)g->length);
	cJSON_AddStringToObject(r, "region", g->name);
	cJSON_AddNumberToObject(r, "offset", (double)g->offset);
	cJSON_AddNumberToObject(r, "nvcpus", c->vm.nvcpus);
	a = cJSON_AddArrayToObject(r, "vcpu_tids");
	for (uint32_t v = 0; a && v < c->vm.nvcpus; v++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(c->vm.vcpu_tids[v]));
	if (c->vm.nregions > 1) {
		a = cJSON_AddArrayToObject(r, "regions");
		for (uint32_t i = 0; a && i < c->vm.nregions; i++) {
			cJSON *o = cJSON_CreateObject();

			g = &c->vm.regions[i];
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
	for (int i = 0; a && i < c->cfg.fwds.n; i++) {
		cJSON *o = cJSON_CreateObject();

		cJSON_AddStringToObject(o, "rule", c->cfg.fwds.v[i].rule);
		cJSON_AddNumberToObject(o, "host_port", c->cfg.fwds.v[i].host_port);
		cJSON_AddItemToArray(a, o);
	}
	a = cJSON_AddArrayToObject(r, "macs");
	for (int i = 0; a && i < c->nmacs; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(c->macs[i]));
	cJSON_AddStringToObject(r, "qmp", c->user_qmp);
	cJSON_AddStringToObject(r, "serial", c->serial);
	a = cJSON_AddArrayToObject(r, "disks");
	for (int i = 0; a && c->disks && i < c->disks->n; i++)
		if (c->disks->d[i].frozen)
			cJSON_AddItemToArray(a, cJSON_CreateString(c->disks->d[i].overlay));
	return r;
}

static cJSON *cmd_start(struct qclone *c)
{
	int ret;

	if (c->state != QC_CREATED)
		return reply_error("start: already started (resume to run a paused guest)");
	c->err[0] = '\0';
	ret = load_devices(c);
	if (!ret)
		ret = write_device_ram(c);
	if (!ret) {
		ret = hq_config_forward(&c->cfg, c->vm.qmp, c->err, sizeof(c->err));
		ret = ret > 0 ? 0 : ret;
	}
	if (!ret) {
		ret = hq_vm_settle(&c->vm, true, HQ_QMP_TIMEOUT_MS, NULL);
		if (ret)
			fail(c, ret, "resuming the guest", c->vm.err);
	}
	if (ret)
		return reply_error("start: %s", c->err[0] ? c->err : halite_strerror(ret));
	c->state = QC_RUNNING;
	return reply_ok();
}

static cJSON *cmd_runstate(struct qclone *c, bool run)
{
	int ret;

	if (c->state == QC_CREATED)
		return reply_error("%s: not started", run ? "resume" : "pause");
	ret = hq_vm_settle(&c->vm, run, HQ_QMP_TIMEOUT_MS, NULL);
	if (ret)
		return reply_error("%s: %s", run ? "resume" : "pause", c->vm.err);
	c->state = run ? QC_RUNNING : QC_PAUSED;
	return reply_ok();
}

static cJSON *cmd_stats(struct qclone *c)
{
	cJSON *r = cJSON_CreateObject();
	char st[32] = "";

	if (hq_vm_status(&c->vm, st, sizeof(st)))
		snprintf(st, sizeof(st), "unknown");
	cJSON_AddStringToObject(r, "run_state", st);
	cJSON_AddStringToObject(r, "state", state_names[c->state]);
	return r;
}

static cJSON *handle(struct qclone *c, char *line, int *pass_fd)
{
	size_t n = strlen(line);

	while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
		line[--n] = '\0';
	if (!strcmp(line, "info"))
		return cmd_info(c);
	if (!strcmp(line, "uffd")) {
		*pass_fd = c->uffd;
		return reply_ok();
	}
	if (!strcmp(line, "start"))
		return cmd_start(c);
	if (!strcmp(line, "pause") || !strcmp(line, "resume"))
		return cmd_runstate(c, line[0] == 'r');
	if (!strcmp(line, "stats"))
		return cmd_stats(c);
	if (!strcmp(line, "digest") || !strncmp(line, "dump", 4) || !strncmp(line, "wait-done", 9))
		return reply_error("%s: not for a QEMU clone (check its memory from inside the "
				   "guest)", line);
	if (!strcmp(line, "quit")) {
		c->quit = true;
		return reply_ok();
	}
	return reply_error("unknown command: %s", line);
}

/* Serve one connection until EOF, quit, or QEMU's exit. */
static void serve(struct qclone *c, int cfd)
{
	char buf[LINE_MAX_BYTES + 1];
	size_t have = 0;

	while (!c->quit) {
		struct pollfd p[2] = { { cfd, POLLIN, 0 }, { c->qemu_pidfd, POLLIN, 0 } };
		ssize_t rd;
		char *nl;

		if (poll(p, c->qemu_pidfd >= 0 ? 2 : 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		if (p[1].revents)
			return; /* QEMU is gone */
		rd = recv(cfd, buf + have, LINE_MAX_BYTES - have, 0);
		if (rd < 0 && errno == EINTR)
			continue;
		if (rd <= 0)
			return;
		have += (size_t)rd;
		while (!c->quit && (nl = memchr(buf, '\n', have))) {
			size_t len = (size_t)(nl - buf);
			int pass_fd = -1;
			cJSON *r;

			*nl = '\0';
			r = memchr(buf, '\0', len) ? reply_error("a NUL byte in the command") :
			    handle(c, buf, &pass_fd);
			if (send_reply(cfd, r, pass_fd)) {
				cJSON_Delete(r);
				return;
			}
			cJSON_Delete(r);
			memmove(buf, nl + 1, have - len - 1);
			have -= len + 1;
		}
		if (have == LINE_MAX_BYTES)
			have = 0; /* a line too long: dropped */
	}
}

static int listen_on(struct qclone *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old;
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path))
		return fail(c, -ENAMETOOLONG, "--control", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode))
			return fail(c, -EEXIST, "--control exists and is not a socket", path);
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(c, -errno, "socket", strerror(errno));
	old = umask(077);
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
	umask(old);
	if (!ret && listen(fd, 4))
		ret = -errno;
	if (ret) {
		close(fd);
		return fail(c, ret, path, strerror(-ret));
	}
	return fd;
}

/* QEMU asked to quit, then waited for (killed if it will not). 0 when it quit. */
static int stop_qemu(struct qclone *c)
{
	int st = 0;

	if (c->qemu <= 0)
		return 0;
	if (c->vm.qmp && hq_qmp_usable(c->vm.qmp))
		hq_qmp_call(c->vm.qmp, "quit", NULL, NULL, 2000);
	for (int i = 0; i < 200; i++) {
		if (waitpid(c->qemu, &st, WNOHANG) == c->qemu) {
			c->qemu = 0;
			return 0;
		}
		usleep(10000);
	}
	kill(c->qemu, SIGKILL);
	waitpid(c->qemu, NULL, 0);
	c->qemu = 0;
	return -ETIMEDOUT;
}

int hq_cmd_clone(int argc, char **argv)
{
	struct qclone *c = calloc(1, sizeof(*c));
	int ret, code = EXIT_OK, st;

	if (!c) {
		hq_errorf("out of memory");
		return EXIT_FAIL;
	}
	if (parse_args(argc, argv, &c->p)) {
		free(c);
		return EXIT_USAGE;
	}
	c->uffd = c->remote_uffd = c->lfd = c->qemu_pidfd = -1;
	for (unsigned i = 0; i < HQ_MAX_REGIONS; i++)
		c->vm.regions[i].fd = -1;
	/* The service that started us may go: we live on (and may lose our stdout). */
	signal(SIGPIPE, SIG_IGN);
	setsid();
	ret = setup(c);
	if (!ret) {
		c->lfd = listen_on(c, c->p.control);
		ret = c->lfd < 0 ? c->lfd : 0;
	}
	if (ret) {
		hq_errorf("clone: %s", c->err[0] ? c->err : halite_strerror(ret));
		code = ret == -HALITE_E_UNSUPPORTED ? EXIT_UNSUPPORTED : EXIT_FAIL;
		goto out;
	}
	printf("ready\n");
	fflush(stdout);
	while (!c->quit) {
		struct pollfd p[2] = { { c->lfd, POLLIN, 0 }, { c->qemu_pidfd, POLLIN, 0 } };
		int cfd;

		if (poll(p, c->qemu_pidfd >= 0 ? 2 : 1, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		cfd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			continue;
		serve(c, cfd);
		close(cfd);
		if (c->qemu > 0 && waitpid(c->qemu, &st, WNOHANG) == c->qemu) {
			c->qemu = 0;
			break;
		}
	}
	if (!c->quit) {
		hq_errorf("clone: QEMU (pid %d) exited; see %s/qemu.log", (int)c->vm.pid, c->dir);
		code = EXIT_FAIL;
	}
out:
	if (stop_qemu(c) && code == EXIT_OK)
		code = EXIT_FAIL;
	/* Overlays of a clone that never ran hold nothing; one that ran is the caller's. */
	if (c->disks && c->ndisks && c->state == QC_CREATED)
		hq_disks_remove_overlays(c->disks);
	free(c->disks);
	if (c->lfd >= 0) {
		close(c->lfd);
		unlink(c->p.control);
	}
	if (c->uffd >= 0)
		close(c->uffd);
	if (c->qemu_pidfd >= 0)
		close(c->qemu_pidfd);
	for (uint32_t i = 0; i < c->ndevram; i++)
		munmap(c->devram[i].copy, c->devram[i].length);
	hq_config_free(&c->cfg);
	hq_vm_release(&c->vm);
	unlink(c->qmp);
	free(c->dev);
	free(c);
	return code;
}
