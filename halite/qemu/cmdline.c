// SPDX-License-Identifier: MIT
/*
 * QEMU's command line as a restore needs it (vmconfig.h): read as QEMU 7.2
 * reads it, compared where it matters, made runnable again; and the device
 * list of "info qtree".
 *
 * QEMU takes the word after an option as its argument only for the options
 * its table (qemu-options.hx) marks HAS_ARG, so the table below lists every
 * option of Debian's qemu-system-x86_64 7.2 (checked one by one: QEMU says
 * "requires an argument" for those with one) with what it means for a
 * restore. The rule for "matters": the option changes the devices whose
 * state is in the file, their guest-visible configuration, the vCPUs or the
 * RAM layout. The guest's state is loaded into whatever QEMU builds, so a
 * device more, less or configured otherwise fails the load ("Unknown
 * savevm section") or, worse, loads into hardware the guest did not see.
 * Where a device's backend goes (files, sockets, host ports) does not.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "strbuf.h"
#include "vmconfig.h"

/* --- QEMU 7.2's options --- */

enum cls {
	C_IGNORE,    /* does not matter for a restore */
	C_HALITE,    /* halite-qemu's to give: -S, -incoming, -loadvm, -daemonize */
	C_VERBATIM,  /* matters, compared as written, one value (the last) */
	C_LIST,	     /* matters, compared as written, in order */
	C_SET,	     /* matters, compared as written, in any order */
	C_FLAG,	     /* matters: given or not */
	C_MACHINE, C_SMP, C_MEM, C_OBJECT, C_DEVICE, C_NIC, C_NETDEV, C_NET, C_DRIVE, C_DISK,
	C_SERIAL, C_PARALLEL, C_COUNT, C_VGA, C_VIRTFS, C_MACHINE_OFF,
};

struct optdef {
	const char *name;
	bool arg;
	enum cls cls;
};

static const struct optdef optdefs[] = {
	/* Without an argument. */
	{ "S", false, C_HALITE },
	{ "daemonize", false, C_HALITE },
	{ "async-teardown", false, C_IGNORE },
	{ "audio-help", false, C_IGNORE },
	{ "enable-kvm", false, C_IGNORE },
	{ "enable-sync-profile", false, C_IGNORE },
	{ "full-screen", false, C_IGNORE },
	{ "h", false, C_IGNORE },
	{ "help", false, C_IGNORE },
	{ "mem-prealloc", false, C_IGNORE },
	{ "no-acpi", false, C_MACHINE_OFF },	/* machine acpi=off */
	{ "no-hpet", false, C_MACHINE_OFF },	/* machine hpet=off */
	{ "no-fd-bootchk", false, C_IGNORE },
	{ "no-reboot", false, C_IGNORE },
	{ "no-shutdown", false, C_IGNORE },
	{ "no-user-config", false, C_IGNORE },
	{ "nodefaults", false, C_FLAG },
	{ "nographic", false, C_IGNORE },
	{ "only-migratable", false, C_IGNORE },
	{ "portrait", false, C_IGNORE },
	{ "preconfig", false, C_IGNORE },
	{ "s", false, C_IGNORE },
	{ "semihosting", false, C_IGNORE },
	{ "singlestep", false, C_IGNORE },
	{ "snapshot", false, C_IGNORE },
	{ "usb", false, C_FLAG },
	{ "version", false, C_IGNORE },
	{ "win2k-hack", false, C_IGNORE },
	{ "xen-attach", false, C_IGNORE },
	{ "xen-domid-restrict", false, C_IGNORE },
	/* With one. */
	{ "incoming", true, C_HALITE },
	{ "loadvm", true, C_HALITE },
	{ "machine", true, C_MACHINE },
	{ "M", true, C_MACHINE },
	{ "smp", true, C_SMP },
	{ "m", true, C_MEM },
	{ "object", true, C_OBJECT },
	{ "device", true, C_DEVICE },
	{ "nic", true, C_NIC },
	{ "netdev", true, C_NETDEV },
	{ "net", true, C_NET },
	{ "drive", true, C_DRIVE },
	{ "hda", true, C_DISK },
	{ "hdb", true, C_DISK },
	{ "hdc", true, C_DISK },
	{ "hdd", true, C_DISK },
	{ "cdrom", true, C_DISK },
	{ "fda", true, C_DISK },
	{ "fdb", true, C_DISK },
	{ "serial", true, C_SERIAL },
	{ "parallel", true, C_PARALLEL },
	{ "debugcon", true, C_COUNT },	/* an isa-debugcon device each; where to, no */
	{ "pflash", true, C_COUNT },	/* a flash device each */
	{ "vga", true, C_VGA },
	{ "virtfs", true, C_VIRTFS },
	{ "cpu", true, C_VERBATIM },
	{ "icount", true, C_VERBATIM },
	{ "numa", true, C_LIST },
	{ "usbdevice", true, C_LIST },
	{ "audio", true, C_LIST },
	{ "set", true, C_LIST },
	{ "global", true, C_SET },
	{ "D", true, C_IGNORE },
	{ "L", true, C_IGNORE },
	{ "accel", true, C_IGNORE },
	{ "acpitable", true, C_IGNORE },
	{ "action", true, C_IGNORE },
	{ "add-fd", true, C_IGNORE },
	{ "append", true, C_IGNORE },
	{ "audiodev", true, C_IGNORE },
	{ "bios", true, C_IGNORE },
	{ "blockdev", true, C_IGNORE },
	{ "boot", true, C_IGNORE },
	{ "chardev", true, C_IGNORE },
	{ "chroot", true, C_IGNORE },
	{ "compat", true, C_IGNORE },
	{ "d", true, C_IGNORE },
	{ "dfilter", true, C_IGNORE },
	{ "display", true, C_IGNORE },
	{ "dtb", true, C_IGNORE },
	{ "dump-vmstate", true, C_IGNORE },
	{ "echr", true, C_IGNORE },
	{ "fsdev", true, C_IGNORE },
	{ "fw_cfg", true, C_IGNORE },
	{ "gdb", true, C_IGNORE },
	{ "initrd", true, C_IGNORE },
	{ "iscsi", true, C_IGNORE },
	{ "k", true, C_IGNORE },
	{ "kernel", true, C_IGNORE },
	{ "mem-path", true, C_IGNORE },
	{ "mon", true, C_IGNORE },
	{ "monitor", true, C_IGNORE },
	{ "msg", true, C_IGNORE },
	{ "mtdblock", true, C_IGNORE },
	{ "name", true, C_IGNORE },
	{ "option-rom", true, C_IGNORE },
	{ "overcommit", true, C_IGNORE },
	{ "pidfile", true, C_IGNORE },
	{ "plugin", true, C_IGNORE },
	{ "qmp", true, C_IGNORE },
	{ "qmp-pretty", true, C_IGNORE },
	/* Its devices are compared through the device list (info qtree). */
	{ "readconfig", true, C_IGNORE },
	{ "rotate", true, C_IGNORE },
	{ "rtc", true, C_IGNORE },
	{ "runas", true, C_IGNORE },
	{ "sandbox", true, C_IGNORE },
	{ "sd", true, C_IGNORE },
	{ "seed", true, C_IGNORE },
	{ "semihosting-config", true, C_IGNORE },
	{ "smbios", true, C_IGNORE },
	{ "spice", true, C_IGNORE },
	{ "tpmdev", true, C_IGNORE },
	{ "trace", true, C_IGNORE },
	{ "uuid", true, C_IGNORE },
	{ "vnc", true, C_IGNORE },
	{ "watchdog-action", true, C_IGNORE },
	{ "xen-domid", true, C_IGNORE },
};

static const struct optdef *optdef(const char *name)
{
	for (size_t i = 0; i < sizeof(optdefs) / sizeof(optdefs[0]); i++)
		if (!strcmp(optdefs[i].name, name))
			return &optdefs[i];
	return NULL;
}

int hq_opt_takes_arg(const char *name)
{
	const struct optdef *d = optdef(name);

	return d ? d->arg : -1;
}

int hq_opts_parse(char *const *argv, int argc, struct hq_opt **opts, int *n, char *err,
		  size_t errlen)
{
	struct hq_opt *v = calloc((size_t)argc + 1, sizeof(*v));
	int k = 0;

	if (!v)
		return -ENOMEM;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int has;

		if (a[0] != '-') {
			/* QEMU takes a word that is no option as the first disk's image. */
			v[k++] = (struct hq_opt){ "", a, i };
			continue;
		}
		a += a[1] == '-' ? 2 : 1;
		has = hq_opt_takes_arg(a);
		if (has < 0)
			has = i + 1 < argc && argv[i + 1][0] != '-';
		if (has && i + 1 >= argc) {
			snprintf(err, errlen, "QEMU option %s needs an argument", argv[i]);
			free(v);
			return -EINVAL;
		}
		v[k++] = (struct hq_opt){ a, has ? argv[i + 1] : NULL, i };
		if (has)
			i++;
	}
	*opts = v;
	*n = k;
	return 0;
}

/* --- what matters --- */

enum fkind { F_SCALAR, F_LIST, F_SET };

/* One thing that matters, as a key, a normal form and what to show of it. */
struct fact {
	char *key;
	enum fkind kind;
	char *norm;  /* compared */
	char *shown; /* in messages */
};

struct facts {
	int n;
	struct fact *v;
	bool oom;
};

static void fact_add(struct facts *f, const char *key, enum fkind kind, char *norm, char *shown)
{
	struct fact *v;

	if (f->oom || !norm || !shown)
		goto oom;
	if (kind == F_SCALAR) {
		for (int i = 0; i < f->n; i++)
			if (!strcmp(f->v[i].key, key)) {
				free(f->v[i].norm);
				free(f->v[i].shown);
				f->v[i].norm = norm;
				f->v[i].shown = shown;
				return;
			}
	}
	v = realloc(f->v, sizeof(*v) * ((size_t)f->n + 1));
	if (!v)
		goto oom;
	f->v = v;
	v[f->n] = (struct fact){ strdup(key), kind, norm, shown };
	if (!v[f->n].key)
		goto oom;
	f->n++;
	return;
oom:
	f->oom = true;
	free(norm);
	free(shown);
}

static void facts_free(struct facts *f)
{
	for (int i = 0; i < f->n; i++) {
		free(f->v[i].key);
		free(f->v[i].norm);
		free(f->v[i].shown);
	}
	free(f->v);
}

static void facts_del(struct facts *f, const char *key)
{
	int k = 0;

	for (int i = 0; i < f->n; i++) {
		if (!strcmp(f->v[i].key, key)) {
			free(f->v[i].key);
			free(f->v[i].norm);
			free(f->v[i].shown);
			continue;
		}
		f->v[k++] = f->v[i];
	}
	f->n = k;
}

static int cmp_kv(const void *a, const void *b)
{
	const struct hq_kv *x = a, *y = b;

	return strcmp(x->key, y->key);
}

/*
 * @kv without @drop keys, sorted by key (later values of a key win), as
 * "k=v,k2" (a key alone: "k"). malloc'd.
 */
static char *kvs_norm(const struct hq_kvs *kv, const char *const *drop)
{
	struct hq_kv *v = calloc((size_t)kv->n + 1, sizeof(*v));
	struct hq_buf b = { 0 };
	int n = 0;

	if (!v)
		return NULL;
	for (int i = 0; i < kv->n; i++) {
		bool skip = false;

		for (const char *const *d = drop; d && *d && !skip; d++)
			skip = !strcmp(*d, kv->v[i].key);
		for (int k = 0; k < n && !skip; k++)
			if (!strcmp(v[k].key, kv->v[i].key)) {
				v[k] = kv->v[i];
				skip = true;
			}
		if (!skip)
			v[n++] = kv->v[i];
	}
	qsort(v, (size_t)n, sizeof(*v), cmp_kv);
	for (int i = 0; i < n; i++)
		hq_buf_printf(&b, "%s%s%s%s", i ? "," : "", v[i].key, v[i].val ? "=" : "",
			v[i].val ? v[i].val : "");
	free(v);
	return hq_buf_done(&b);
}

static const char *const device_backends[] = { "drive", "chardev", "netdev", "audiodev",
					       "fsdev", "bootindex", NULL };

/* What the options of one command line say that matters (see hq_cmdline_compare()). */
struct scan {
	struct facts f;
	struct hq_kvs machine; /* every -machine, merged in order */
	const char *smp, *mem, *vga;
	int serials, parallels, ndebugcon, npflash;
	struct hq_buf serial_args, parallel_args, debugcon_args, pflash_args;
	bool nodefaults, any_serial, any_parallel, any_net;
};

static int smp_norm(const char *arg, char **norm)
{
	static const char *const topo[] = { "sockets", "dies", "clusters", "cores", "threads" };
	struct hq_kvs kv = { 0 };
	struct hq_buf b = { 0 };
	unsigned long cpus = 1, prod = 1;
	bool any = false;
	int ret;

	if (!arg) {
		*norm = strdup("cpus=1,maxcpus=1");
		return *norm ? 0 : -ENOMEM;
	}
	ret = hq_kvs_split(arg, "cpus", &kv);
	if (ret)
		return ret;
	for (size_t i = 0; i < 5; i++)
		if (hq_kvs_get(&kv, topo[i])) {
			prod *= strtoul(hq_kvs_get(&kv, topo[i]), NULL, 10);
			any = true;
		}
	if (hq_kvs_get(&kv, "cpus"))
		cpus = strtoul(hq_kvs_get(&kv, "cpus"), NULL, 10);
	else if (any)
		cpus = prod;
	hq_buf_printf(&b, "cpus=%lu,maxcpus=%lu", cpus, hq_kvs_get(&kv, "maxcpus") ?
		strtoul(hq_kvs_get(&kv, "maxcpus"), NULL, 10) : cpus);
	for (size_t i = 0; i < 5; i++)
		if (hq_kvs_get(&kv, topo[i]))
			hq_buf_printf(&b, ",%s=%s", topo[i], hq_kvs_get(&kv, topo[i]));
	hq_kvs_free(&kv);
	*norm = hq_buf_done(&b);
	return *norm ? 0 : -ENOMEM;
}

static int mem_norm(const char *arg, char **norm)
{
	struct hq_kvs kv = { 0 };
	uint64_t size = 128ull << 20, maxmem = 0;
	const char *v;
	int ret;

	if (arg) {
		ret = hq_kvs_split(arg, "size", &kv);
		if (ret)
			return ret;
		v = hq_kvs_get(&kv, "size");
		if (v && hq_parse_qemu_size(v, 1ull << 20, &size))
			size = 0;
		v = hq_kvs_get(&kv, "maxmem");
		if (v && hq_parse_qemu_size(v, 1ull << 20, &maxmem))
			maxmem = 0;
	}
	*norm = hq_xasprintf("size=%" PRIu64 ",slots=%s,maxmem=%" PRIu64, size,
			  hq_kvs_get(&kv, "slots") ? hq_kvs_get(&kv, "slots") : "0", maxmem);
	hq_kvs_free(&kv);
	return *norm ? 0 : -ENOMEM;
}

/* -smp, -m and -vga as they are when given (at their place), or QEMU's defaults. */
static void smp_fact(struct scan *s)
{
	char *norm;

	if (!smp_norm(s->smp, &norm))
		fact_add(&s->f, "-smp", F_SCALAR, norm, s->smp ? hq_xasprintf("-smp %s", s->smp) :
			 strdup("no -smp (1 vCPU)"));
	else
		s->f.oom = true;
}

static void mem_fact(struct scan *s)
{
	char *norm;

	if (!mem_norm(s->mem, &norm))
		fact_add(&s->f, "-m", F_SCALAR, norm, s->mem ? hq_xasprintf("-m %s", s->mem) :
			 strdup("no -m (128 MiB)"));
	else
		s->f.oom = true;
}

/* pc and q35 add one VGA (std) unless told otherwise (-vga, -nodefaults). */
static void vga_fact(struct scan *s)
{
	const char *v = s->vga ? (!strcmp(s->vga, "std") ? "" : s->vga) :
			s->nodefaults ? "none" : "";

	fact_add(&s->f, "-vga", F_SCALAR, strdup(v), s->vga ? hq_xasprintf("-vga %s", s->vga) :
		 strdup("no -vga (QEMU's default)"));
}

static int scan_opt(struct scan *s, const struct hq_opt *o)
{
	const struct optdef *d = optdef(o->name);
	struct hq_kvs kv = { 0 };
	enum cls cls;
	int ret = 0;

	if (!o->name[0]) {
		fact_add(&s->f, "disk", F_LIST, strdup("hda"), hq_xasprintf("%s (disk image)", o->arg));
		return 0;
	}
	cls = d ? d->cls : C_LIST;
	switch (cls) {
	case C_IGNORE:
	case C_HALITE:
		return 0;
	case C_MACHINE:
		ret = hq_kvs_split(o->arg, "type", &kv);
		for (int i = 0; !ret && i < kv.n; i++)
			ret = hq_kvs_add(&s->machine, kv.v[i].key, kv.v[i].val);
		break;
	case C_MACHINE_OFF:
		ret = hq_kvs_add(&s->machine, !strcmp(o->name, "no-acpi") ? "acpi" : "hpet", "off");
		break;
	case C_SMP:
		s->smp = o->arg;
		smp_fact(s);
		break;
	case C_MEM:
		s->mem = o->arg;
		mem_fact(s);
		break;
	case C_VGA:
		s->vga = o->arg;
		vga_fact(s);
		break;
	case C_FLAG:
		if (!strcmp(o->name, "nodefaults"))
			s->nodefaults = true;
		fact_add(&s->f, o->name, F_SCALAR, strdup("on"), hq_xasprintf("-%s", o->name));
		break;
	case C_VERBATIM:
	case C_LIST:
	case C_SET: {
		char key[64];

		snprintf(key, sizeof(key), "-%s", o->name);
		fact_add(&s->f, d ? key : "option", cls == C_VERBATIM ? F_SCALAR :
			 cls == C_SET ? F_SET : F_LIST,
			 d ? strdup(o->arg) : hq_xasprintf("-%s %s", o->name, o->arg ? o->arg : ""),
			 hq_xasprintf("-%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : ""));
		break;
	}
	case C_OBJECT: {
		const char *type, *id, *size;
		uint64_t bytes = 0;
		char key[96];

		ret = hq_kvs_split(o->arg, "qom-type", &kv);
		if (ret)
			break;
		type = hq_kvs_get(&kv, "qom-type");
		if (!type || strncmp(type, "memory-backend-", 15))
			break;
		/* Its id and size; not its kind or file (a restore needs its own). */
		id = hq_kvs_get(&kv, "id");
		size = hq_kvs_get(&kv, "size");
		if (size && hq_parse_qemu_size(size, 1, &bytes))
			bytes = 0;
		snprintf(key, sizeof(key), "memory backend %s", id ? id : "?");
		fact_add(&s->f, key, F_SCALAR, hq_xasprintf("%" PRIu64, bytes),
			 hq_xasprintf("memory backend %s (size=%s)", id ? id : "?", size ? size : "?"));
		break;
	}
	case C_DEVICE: {
		char *props;

		/* "DRIVER|props": the driver is what a device list names. */
		ret = hq_kvs_split(o->arg, "driver", &kv);
		props = ret ? NULL : kvs_norm(&kv, device_backends);
		if (!ret)
			fact_add(&s->f, "-device", F_LIST, props ? hq_xasprintf("%s|%s",
				 hq_kvs_get(&kv, "driver") ? hq_kvs_get(&kv, "driver") : "", props) :
				 NULL, hq_xasprintf("-device %s", o->arg));
		free(props);
		break;
	}
	case C_NIC: {
		const char *type;

		s->any_net = true;
		ret = hq_kvs_split(o->arg, "type", &kv);
		type = ret ? NULL : hq_kvs_get(&kv, "type");
		if (ret || (type && !strcmp(type, "none")))
			break;
		/* The NIC (model, MAC) and whether its backend is user networking
		 * (whose state is in the file), not the backend's options. */
		fact_add(&s->f, "NIC", F_LIST,
			 hq_xasprintf("%s,model=%s,mac=%s", type ? type : "user",
				   hq_kvs_get(&kv, "model") ? hq_kvs_get(&kv, "model") : "",
				   hq_kvs_get(&kv, "mac") ? hq_kvs_get(&kv, "mac") : ""),
			 hq_xasprintf("-nic %s", o->arg));
		break;
	}
	case C_NETDEV: {
		const char *type;

		s->any_net = true;
		ret = hq_kvs_split(o->arg, "type", &kv);
		type = ret ? NULL : hq_kvs_get(&kv, "type");
		if (!ret)
			fact_add(&s->f, "-netdev", F_LIST, strdup(type ? type : ""),
				 hq_xasprintf("-netdev %s", o->arg));
		break;
	}
	case C_NET: {
		const char *type;

		s->any_net = true;
		ret = hq_kvs_split(o->arg, "type", &kv);
		type = ret ? NULL : hq_kvs_get(&kv, "type");
		if (ret || !type || !strcmp(type, "none"))
			break;
		fact_add(&s->f, "-net", F_LIST, !strcmp(type, "nic") ?
			 hq_xasprintf("nic,model=%s,macaddr=%s", hq_kvs_get(&kv, "model") ?
				   hq_kvs_get(&kv, "model") : "", hq_kvs_get(&kv, "macaddr") ?
				   hq_kvs_get(&kv, "macaddr") : "") : strdup(type),
			 hq_xasprintf("-net %s", o->arg));
		break;
	}
	case C_DRIVE: {
		const char *itf;

		ret = hq_kvs_split(o->arg, NULL, &kv);
		itf = ret ? NULL : hq_kvs_get(&kv, "if");
		if (ret || (itf && !strcmp(itf, "none")))
			break;
		/* The device it makes; not the file or how it is opened. */
		fact_add(&s->f, "-drive", F_LIST,
			 hq_xasprintf("if=%s,index=%s,bus=%s,unit=%s,media=%s", itf ? itf : "",
				   hq_kvs_get(&kv, "index") ? hq_kvs_get(&kv, "index") : "",
				   hq_kvs_get(&kv, "bus") ? hq_kvs_get(&kv, "bus") : "",
				   hq_kvs_get(&kv, "unit") ? hq_kvs_get(&kv, "unit") : "",
				   hq_kvs_get(&kv, "media") ? hq_kvs_get(&kv, "media") : ""),
			 hq_xasprintf("-drive %s", o->arg));
		break;
	}
	case C_DISK:
		fact_add(&s->f, "disk", F_LIST, strdup(o->name), hq_xasprintf("-%s %s", o->name, o->arg));
		break;
	case C_SERIAL:
		s->any_serial = true;
		hq_buf_printf(&s->serial_args, " -serial %s", o->arg);
		s->serials += strcmp(o->arg, "none") != 0;
		break;
	case C_PARALLEL:
		s->any_parallel = true;
		hq_buf_printf(&s->parallel_args, " -parallel %s", o->arg);
		s->parallels += strcmp(o->arg, "none") != 0;
		break;
	case C_COUNT:
		if (!strcmp(o->name, "debugcon")) {
			s->ndebugcon++;
			hq_buf_printf(&s->debugcon_args, " -debugcon %s", o->arg);
		} else {
			s->npflash++;
			hq_buf_printf(&s->pflash_args, " -pflash %s", o->arg);
		}
		break;
	case C_VIRTFS: {
		static const char *const drop[] = { "path", "security_model", "writeout",
						    "readonly", "socket", "sock_fd", NULL };

		ret = hq_kvs_split(o->arg, "fsdriver", &kv);
		if (!ret)
			fact_add(&s->f, "-virtfs", F_LIST, kvs_norm(&kv, drop),
				 hq_xasprintf("-virtfs %s", o->arg));
		break;
	}
	}
	hq_kvs_free(&kv);
	return ret == -EINVAL ? 0 : ret; /* an argument QEMU would refuse: QEMU will say */
}

/* "N ports (-serial a -serial b)" */
static void count_fact(struct scan *s, const char *key, int n, struct hq_buf *args, bool any,
		       int dflt)
{
	char *a = hq_buf_done(args);

	if (!any)
		n = s->nodefaults ? 0 : dflt;
	fact_add(&s->f, key, F_SCALAR, hq_xasprintf("%d", n),
		 hq_xasprintf("%s: %d%s%s%s", key, n, any ? " (" : "", any && a ? a + 1 : "",
			   any ? ")" : dflt && !s->nodefaults ? " (QEMU's default)" : ""));
	free(a);
}

static int scan(char *const *argv, int argc, struct scan *s, char *err, size_t errlen)
{
	static const char *const machine_drop[] = { "type", "accel", "dump-guest-core",
						    "mem-merge", NULL };
	struct hq_opt *opts = NULL;
	char *norm = NULL;
	const char *type, *mb;
	int n = 0, ret;

	memset(s, 0, sizeof(*s));
	/* The binary does not matter: the QEMU version is checked once it runs. */
	ret = hq_opts_parse(argv + 1, argc - 1, &opts, &n, err, errlen);
	if (ret)
		return ret;
	for (int i = 0; i < n && !ret; i++)
		ret = scan_opt(s, &opts[i]);
	free(opts);
	if (ret)
		return ret;
	/*
	 * -machine memory-backend=ID is the guest's main RAM, as -m alone
	 * makes it (QEMU checks -m against the backend's size): which of the
	 * two a line uses does not matter, the size -m says does.
	 */
	mb = hq_kvs_get(&s->machine, "memory-backend");
	if (mb) {
		char key[96];

		snprintf(key, sizeof(key), "memory backend %s", mb);
		facts_del(&s->f, key);
		hq_kvs_del(&s->machine, "memory-backend");
	}
	type = hq_kvs_get(&s->machine, "type");
	fact_add(&s->f, "machine type", F_SCALAR, strdup(type ? type : ""),
		 type ? hq_xasprintf("-machine %s", type) : strdup("no -machine type (QEMU's default)"));
	norm = kvs_norm(&s->machine, machine_drop);
	fact_add(&s->f, "machine options", F_SCALAR, norm,
		 norm && *norm ? hq_xasprintf("-machine %s", norm) : strdup("no -machine options"));
	if (!s->smp)
		smp_fact(s);
	if (!s->mem)
		mem_fact(s);
	if (!s->vga)
		vga_fact(s);
	/* Without -nic, -net or -netdev, QEMU adds a NIC on user networking. */
	if (!s->any_net && !s->nodefaults)
		fact_add(&s->f, "NIC", F_LIST, strdup("user,model=,mac="),
			 strdup("QEMU's default NIC (no -nic, -net or -netdev)"));
	count_fact(s, "serial ports", s->serials, &s->serial_args, s->any_serial, 1);
	count_fact(s, "parallel ports", s->parallels, &s->parallel_args, s->any_parallel, 1);
	count_fact(s, "debug consoles", s->ndebugcon, &s->debugcon_args, s->ndebugcon > 0, 0);
	count_fact(s, "flash devices", s->npflash, &s->pflash_args, s->npflash > 0, 0);
	return s->f.oom ? -ENOMEM : 0;
}

static void scan_free(struct scan *s)
{
	facts_free(&s->f);
	hq_kvs_free(&s->machine);
	free(hq_buf_done(&s->serial_args));
	free(hq_buf_done(&s->parallel_args));
	free(hq_buf_done(&s->debugcon_args));
	free(hq_buf_done(&s->pflash_args));
}

/* The facts of @f with @key, in order, into @out (at most @max). */
static int with_key(const struct facts *f, const char *key, const struct fact **out, int max)
{
	int n = 0;

	for (int i = 0; i < f->n && n < max; i++)
		if (!strcmp(f->v[i].key, key))
			out[n++] = &f->v[i];
	return n;
}

static int cmp_fact(const void *a, const void *b)
{
	return strcmp((*(const struct fact *const *)a)->norm, (*(const struct fact *const *)b)->norm);
}

#define MAX_SAME_KEY 256

static void differ(struct hq_buf *m, const char *a, const char *b)
{
	hq_buf_printf(m, "%s%s at save, %s now", m->len ? "; " : "", a, b);
}

/* Whether @devices (qemu.devices: "TYPE[ id=..][ addr=..]") has a device of -device @f's driver. */
static bool listed(const struct hq_argv *devices, const struct fact *f)
{
	size_t n = strcspn(f->norm, "|");

	for (int i = 0; i < devices->argc; i++)
		if (!strncmp(devices->argv[i], f->norm, n) &&
		    (devices->argv[i][n] == ' ' || !devices->argv[i][n]))
			return true;
	return false;
}

static void compare_key(struct hq_buf *m, const struct facts *fa, const struct facts *fb,
			const char *key, enum fkind kind, const struct hq_argv *devices)
{
	const struct fact **a = calloc(2 * MAX_SAME_KEY, sizeof(*a)), **b;
	int na, nb;

	if (!a) {
		m->oom = true;
		return;
	}
	b = a + MAX_SAME_KEY;
	na = with_key(fa, key, a, MAX_SAME_KEY);
	nb = with_key(fb, key, b, MAX_SAME_KEY);
	/*
	 * Devices hot-plugged at the source are in its device list, not on its
	 * command line, and a restore needs them on its own; devices unplugged
	 * are the other way round. With the list, -device options are compared
	 * as a set, and such a difference passes.
	 */
	if (devices && !strcmp(key, "-device"))
		kind = F_SET;
	if (kind == F_SET) {
		qsort(a, (size_t)na, sizeof(*a), cmp_fact);
		qsort(b, (size_t)nb, sizeof(*b), cmp_fact);
		for (int i = 0, k = 0; i < na || k < nb;) {
			int c = i == na ? 1 : k == nb ? -1 : strcmp(a[i]->norm, b[k]->norm);

			if (c < 0) {
				if (!devices || listed(devices, a[i]))
					differ(m, a[i]->shown, "not");
				i++;
			} else if (c > 0) {
				if (!devices || !listed(devices, b[k]))
					hq_buf_printf(m, "%s%s now, not at save", m->len ? "; " : "",
						b[k]->shown);
				k++;
			} else {
				i++, k++;
			}
		}
	} else {
		for (int i = 0; i < na || i < nb; i++) {
			if (i < na && i < nb) {
				if (strcmp(a[i]->norm, b[i]->norm))
					differ(m, a[i]->shown, b[i]->shown);
			} else if (i < na) {
				if (kind == F_SCALAR)
					differ(m, a[i]->shown, "none");
				else
					differ(m, a[i]->shown, "not");
			} else {
				hq_buf_printf(m, "%s%s now, %s at save", m->len ? "; " : "", b[i]->shown,
					kind == F_SCALAR ? "none" : "not");
			}
		}
	}
	free(a);
}

/* The machine type as written on both sides; if they differ, as resolved. */
static void compare_machine(struct hq_buf *m, const struct facts *fa, const struct facts *fb,
			    hq_machine_resolve_fn resolve, void *ctx)
{
	const struct fact *a = NULL, *b = NULL;
	char ra[96] = "", rb[96] = "";

	with_key(fa, "machine type", &a, 1);
	with_key(fb, "machine type", &b, 1);
	if (!a || !b || !strcmp(a->norm, b->norm))
		return;
	if (resolve && !resolve(ctx, a->norm, ra, sizeof(ra)) &&
	    !resolve(ctx, b->norm, rb, sizeof(rb))) {
		if (!strcmp(ra, rb))
			return;
		hq_buf_printf(m, "%s%s (%s) at save, %s (%s) now", m->len ? "; " : "", a->shown, ra,
			b->shown, rb);
		return;
	}
	differ(m, a->shown, b->shown);
}

int hq_cmdline_compare(char *const *saved, int nsaved, char *const *now, int nnow,
		       const struct hq_argv *devices, hq_machine_resolve_fn resolve, void *ctx,
		       char *msg, size_t len)
{
	struct scan a, b;
	struct hq_buf m = { 0 };
	char *s;
	int ret;

	if (nsaved < 1 || nnow < 1)
		return -EINVAL;
	ret = scan(saved, nsaved, &a, msg, len);
	if (ret) {
		scan_free(&a);
		return ret;
	}
	ret = scan(now, nnow, &b, msg, len);
	if (ret)
		goto out;
	compare_machine(&m, &a.f, &b.f, resolve, ctx);
	/* Each key once: in the order the saved line has them, then the new line's others. */
	for (int i = 0; i < a.f.n + b.f.n; i++) {
		const struct fact *f = i < a.f.n ? &a.f.v[i] : &b.f.v[i - a.f.n], *first = NULL;

		if (!strcmp(f->key, "machine type"))
			continue;
		if (with_key(&a.f, f->key, &first, 1) && first != f)
			continue;
		if (i >= a.f.n && (first || (with_key(&b.f, f->key, &first, 1) && first != f)))
			continue;
		compare_key(&m, &a.f, &b.f, f->key, f->kind, devices);
	}
	s = hq_buf_done(&m);
	if (!s) {
		ret = -ENOMEM;
	} else if (*s) {
		snprintf(msg, len, "%s", s);
		ret = -EINVAL;
	}
	free(s);
out:
	scan_free(&a);
	scan_free(&b);
	return ret;
}

int hq_cmdline_replay(char *const *rec, int n, struct hq_argv *out, unsigned *flags)
{
	struct hq_opt *opts = NULL;
	char err[128];
	int k = 0, ret;

	*flags = 0;
	if (n < 1)
		return -EINVAL;
	ret = hq_opts_parse(rec + 1, n - 1, &opts, &k, err, sizeof(err));
	if (ret)
		return ret;
	ret = hq_argv_push(out, rec[0]);
	for (int i = 0; i < k && !ret; i++) {
		const struct optdef *d = optdef(opts[i].name);

		if (d && d->cls == C_HALITE) {
			if (!strcmp(d->name, "daemonize"))
				*flags |= HQ_REPLAY_DAEMONIZE;
			continue;
		}
		ret = hq_argv_push(out, rec[1 + opts[i].index]);
		if (!ret && opts[i].arg && opts[i].name[0])
			ret = hq_argv_push(out, opts[i].arg);
	}
	free(opts);
	return ret;
}
