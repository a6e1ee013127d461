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
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "proc.h"
#include "vmconfig.h"

/* --- argument vectors --- */

static int argv_grow(struct hq_argv *a)
{
	char **v = realloc(a->argv, sizeof(*v) * ((size_t)a->argc + 2));

	if (!v)
		return -ENOMEM;
	a->argv = v;
	return 0;
}

int hq_argv_push_own(struct hq_argv *a, char *s)
{
	if (!s || argv_grow(a)) {
		free(s);
		return -ENOMEM;
	}
	a->argv[a->argc++] = s;
	a->argv[a->argc] = NULL;
	return 0;
}

int hq_argv_push(struct hq_argv *a, const char *s)
{
	return hq_argv_push_own(a, strdup(s));
}

int hq_argv_copy(struct hq_argv *a, char *const *argv, int argc)
{
	for (int i = 0; i < argc; i++)
		if (hq_argv_push(a, argv[i]))
			return -ENOMEM;
	return 0;
}

int hq_argv_from_nul(struct hq_argv *a, const void *buf, size_t len)
{
	const char *p = buf;

	if (!len || p[len - 1] != '\0')
		return -EINVAL;
	for (size_t i = 0; i < len; i += strlen(p + i) + 1)
		if (hq_argv_push(a, p + i))
			return -ENOMEM;
	return 0;
}

char *hq_argv_to_nul(const struct hq_argv *a, size_t *len)
{
	size_t n = 0, k = 0;
	char *buf;

	for (int i = 0; i < a->argc; i++)
		n += strlen(a->argv[i]) + 1;
	buf = malloc(n ? n : 1);
	if (!buf)
		return NULL;
	for (int i = 0; i < a->argc; i++) {
		size_t l = strlen(a->argv[i]) + 1;

		memcpy(buf + k, a->argv[i], l);
		k += l;
	}
	*len = n;
	return buf;
}

void hq_argv_free(struct hq_argv *a)
{
	for (int i = 0; i < a->argc; i++)
		free(a->argv[i]);
	free(a->argv);
	a->argc = 0;
	a->argv = NULL;
}

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

/* --- QemuOpts and JSON arguments --- */

static int kvs_add(struct hq_kvs *kv, const char *key, const char *val, bool raw)
{
	struct hq_kv *v = realloc(kv->v, sizeof(*v) * ((size_t)kv->n + 1));

	if (!v)
		return -ENOMEM;
	kv->v = v;
	v[kv->n].key = strdup(key);
	v[kv->n].val = val ? strdup(val) : NULL;
	v[kv->n].raw = raw;
	if (!v[kv->n].key || (val && !v[kv->n].val)) {
		free(v[kv->n].key);
		free(v[kv->n].val);
		return -ENOMEM;
	}
	kv->n++;
	return 0;
}

int hq_kvs_add(struct hq_kvs *kv, const char *key, const char *val)
{
	return kvs_add(kv, key, val, false);
}

void hq_kvs_free(struct hq_kvs *kv)
{
	for (int i = 0; i < kv->n; i++) {
		free(kv->v[i].key);
		free(kv->v[i].val);
	}
	free(kv->v);
	kv->v = NULL;
	kv->n = 0;
}

static int kvs_json(const char *arg, struct hq_kvs *out)
{
	cJSON *o = cJSON_Parse(arg), *m;
	int ret = 0;

	out->json = true;
	if (!cJSON_IsObject(o)) {
		cJSON_Delete(o);
		return -EINVAL;
	}
	cJSON_ArrayForEach(m, o) {
		char *s = cJSON_IsString(m) ? NULL : cJSON_PrintUnformatted(m);

		if (!s && !cJSON_IsString(m))
			ret = -ENOMEM;
		else
			ret = kvs_add(out, m->string, s ? s : m->valuestring, s != NULL);
		free(s);
		if (ret)
			break;
	}
	cJSON_Delete(o);
	return ret;
}

int hq_kvs_split(const char *arg, const char *implied, struct hq_kvs *out)
{
	size_t len = strlen(arg);
	char *buf = malloc(len + 1);
	int ret = 0;

	*out = (struct hq_kvs){ 0 };
	if (!buf)
		return -ENOMEM;
	if (arg[0] == '{') {
		free(buf);
		ret = kvs_json(arg, out);
		if (ret)
			hq_kvs_free(out);
		return ret;
	}
	for (const char *p = arg; !ret;) {
		size_t k = 0;
		char *eq;

		/* One item up to a single comma; ",," is a comma in it. */
		while (*p && !(p[0] == ',' && p[1] != ',')) {
			if (p[0] == ',')
				p++;
			buf[k++] = *p++;
		}
		buf[k] = '\0';
		eq = strchr(buf, '=');
		if (eq) {
			*eq = '\0';
			ret = hq_kvs_add(out, buf, eq + 1);
		} else if (!out->n && implied) {
			ret = hq_kvs_add(out, implied, buf);
		} else if (k) {
			ret = hq_kvs_add(out, buf, NULL);
		}
		if (!*p)
			break;
		p++;
	}
	free(buf);
	if (ret)
		hq_kvs_free(out);
	return ret;
}

bool hq_kvs_has(const struct hq_kvs *kv, const char *key)
{
	for (int i = 0; i < kv->n; i++)
		if (!strcmp(kv->v[i].key, key))
			return true;
	return false;
}

const char *hq_kvs_get(const struct hq_kvs *kv, const char *key)
{
	const char *v = NULL;

	for (int i = 0; i < kv->n; i++)
		if (!strcmp(kv->v[i].key, key))
			v = kv->v[i].val;
	return v;
}

int hq_kvs_del(struct hq_kvs *kv, const char *key)
{
	int k = 0, gone = 0;

	for (int i = 0; i < kv->n; i++) {
		if (!strcmp(kv->v[i].key, key)) {
			free(kv->v[i].key);
			free(kv->v[i].val);
			gone++;
			continue;
		}
		kv->v[k++] = kv->v[i];
	}
	kv->n = k;
	return gone;
}

/* A growing string; every append keeps it terminated. Out of memory: NULL from then on. */
struct buf {
	char *s;
	size_t len, cap;
	bool oom;
};

static void bput(struct buf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->s, cap);

		if (!p) {
			b->oom = true;
			return;
		}
		b->s = p;
		b->cap = cap;
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

static void bputs(struct buf *b, const char *s)
{
	bput(b, s, strlen(s));
}

static __attribute__((format(printf, 2, 3))) void bprintf(struct buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n > 0)
		bput(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* @b's string, or NULL if it ran out of memory; @b is left empty. */
static char *bdone(struct buf *b)
{
	char *s = b->oom ? NULL : b->s ? b->s : strdup("");

	if (b->oom)
		free(b->s);
	*b = (struct buf){ 0 };
	return s;
}

/* A QemuOpts key or value: a comma in it is written twice. */
static void put_escaped(struct buf *b, const char *s)
{
	for (; *s; s++)
		bputs(b, *s == ',' ? ",," : (char[2]){ *s, 0 });
}

char *hq_kvs_join(const struct hq_kvs *kv, const char *implied)
{
	struct buf b = { 0 };

	if (kv->json) {
		cJSON *o = cJSON_CreateObject();
		char *s;

		for (int i = 0; o && i < kv->n; i++) {
			const char *v = kv->v[i].val ? kv->v[i].val : "";
			cJSON *m = kv->v[i].raw ? cJSON_Parse(v) : cJSON_CreateString(v);

			if (m)
				cJSON_AddItemToObject(o, kv->v[i].key, m);
		}
		s = o ? cJSON_PrintUnformatted(o) : NULL;
		cJSON_Delete(o);
		return s;
	}
	for (int i = 0; i < kv->n; i++) {
		if (i)
			bputs(&b, ",");
		if (!i && implied && !strcmp(kv->v[i].key, implied) && kv->v[i].val) {
			put_escaped(&b, kv->v[i].val);
			continue;
		}
		put_escaped(&b, kv->v[i].key);
		if (kv->v[i].val) {
			bputs(&b, "=");
			put_escaped(&b, kv->v[i].val);
		}
	}
	return bdone(&b);
}

int hq_parse_qemu_size(const char *s, uint64_t unit, uint64_t *out)
{
	static const char sfx[] = "BKMGTPE";
	const char *p;
	char *end;
	double d;
	uint64_t mul = unit;

	if (!s || !*s || (!isdigit((unsigned char)s[0]) && s[0] != '.'))
		return -EINVAL;
	errno = 0;
	d = strtod(s, &end);
	if (errno || end == s || d < 0)
		return -EINVAL;
	if (*end) {
		p = strchr(sfx, toupper((unsigned char)*end));
		if (!p || end[1])
			return -EINVAL;
		mul = 1ull << (10 * (p - sfx));
	}
	if (d * (double)mul >= 18446744073709551616.0)
		return -ERANGE;
	*out = (uint64_t)(d * (double)mul);
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

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
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
	struct buf b = { 0 };
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
		bprintf(&b, "%s%s%s%s", i ? "," : "", v[i].key, v[i].val ? "=" : "",
			v[i].val ? v[i].val : "");
	free(v);
	return bdone(&b);
}

static const char *const device_backends[] = { "drive", "chardev", "netdev", "audiodev",
					       "fsdev", "bootindex", NULL };

/* What the options of one command line say that matters (see hq_cmdline_compare()). */
struct scan {
	struct facts f;
	struct hq_kvs machine; /* every -machine, merged in order */
	const char *smp, *mem, *vga;
	int serials, parallels, ndebugcon, npflash;
	struct buf serial_args, parallel_args, debugcon_args, pflash_args;
	bool nodefaults, any_serial, any_parallel, any_net;
};

static int smp_norm(const char *arg, char **norm)
{
	static const char *const topo[] = { "sockets", "dies", "clusters", "cores", "threads" };
	struct hq_kvs kv = { 0 };
	struct buf b = { 0 };
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
	bprintf(&b, "cpus=%lu,maxcpus=%lu", cpus, hq_kvs_get(&kv, "maxcpus") ?
		strtoul(hq_kvs_get(&kv, "maxcpus"), NULL, 10) : cpus);
	for (size_t i = 0; i < 5; i++)
		if (hq_kvs_get(&kv, topo[i]))
			bprintf(&b, ",%s=%s", topo[i], hq_kvs_get(&kv, topo[i]));
	hq_kvs_free(&kv);
	*norm = bdone(&b);
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
	*norm = xasprintf("size=%" PRIu64 ",slots=%s,maxmem=%" PRIu64, size,
			  hq_kvs_get(&kv, "slots") ? hq_kvs_get(&kv, "slots") : "0", maxmem);
	hq_kvs_free(&kv);
	return *norm ? 0 : -ENOMEM;
}

/* -smp, -m and -vga as they are when given (at their place), or QEMU's defaults. */
static void smp_fact(struct scan *s)
{
	char *norm;

	if (!smp_norm(s->smp, &norm))
		fact_add(&s->f, "-smp", F_SCALAR, norm, s->smp ? xasprintf("-smp %s", s->smp) :
			 strdup("no -smp (1 vCPU)"));
	else
		s->f.oom = true;
}

static void mem_fact(struct scan *s)
{
	char *norm;

	if (!mem_norm(s->mem, &norm))
		fact_add(&s->f, "-m", F_SCALAR, norm, s->mem ? xasprintf("-m %s", s->mem) :
			 strdup("no -m (128 MiB)"));
	else
		s->f.oom = true;
}

/* pc and q35 add one VGA (std) unless told otherwise (-vga, -nodefaults). */
static void vga_fact(struct scan *s)
{
	const char *v = s->vga ? (!strcmp(s->vga, "std") ? "" : s->vga) :
			s->nodefaults ? "none" : "";

	fact_add(&s->f, "-vga", F_SCALAR, strdup(v), s->vga ? xasprintf("-vga %s", s->vga) :
		 strdup("no -vga (QEMU's default)"));
}

static int scan_opt(struct scan *s, const struct hq_opt *o)
{
	const struct optdef *d = optdef(o->name);
	struct hq_kvs kv = { 0 };
	enum cls cls;
	int ret = 0;

	if (!o->name[0]) {
		fact_add(&s->f, "disk", F_LIST, strdup("hda"), xasprintf("%s (disk image)", o->arg));
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
		fact_add(&s->f, o->name, F_SCALAR, strdup("on"), xasprintf("-%s", o->name));
		break;
	case C_VERBATIM:
	case C_LIST:
	case C_SET: {
		char key[64];

		snprintf(key, sizeof(key), "-%s", o->name);
		fact_add(&s->f, d ? key : "option", cls == C_VERBATIM ? F_SCALAR :
			 cls == C_SET ? F_SET : F_LIST,
			 d ? strdup(o->arg) : xasprintf("-%s %s", o->name, o->arg ? o->arg : ""),
			 xasprintf("-%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : ""));
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
		fact_add(&s->f, key, F_SCALAR, xasprintf("%" PRIu64, bytes),
			 xasprintf("memory backend %s (size=%s)", id ? id : "?", size ? size : "?"));
		break;
	}
	case C_DEVICE: {
		char *props;

		/* "DRIVER|props": the driver is what a device list names. */
		ret = hq_kvs_split(o->arg, "driver", &kv);
		props = ret ? NULL : kvs_norm(&kv, device_backends);
		if (!ret)
			fact_add(&s->f, "-device", F_LIST, props ? xasprintf("%s|%s",
				 hq_kvs_get(&kv, "driver") ? hq_kvs_get(&kv, "driver") : "", props) :
				 NULL, xasprintf("-device %s", o->arg));
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
			 xasprintf("%s,model=%s,mac=%s", type ? type : "user",
				   hq_kvs_get(&kv, "model") ? hq_kvs_get(&kv, "model") : "",
				   hq_kvs_get(&kv, "mac") ? hq_kvs_get(&kv, "mac") : ""),
			 xasprintf("-nic %s", o->arg));
		break;
	}
	case C_NETDEV: {
		const char *type;

		s->any_net = true;
		ret = hq_kvs_split(o->arg, "type", &kv);
		type = ret ? NULL : hq_kvs_get(&kv, "type");
		if (!ret)
			fact_add(&s->f, "-netdev", F_LIST, strdup(type ? type : ""),
				 xasprintf("-netdev %s", o->arg));
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
			 xasprintf("nic,model=%s,macaddr=%s", hq_kvs_get(&kv, "model") ?
				   hq_kvs_get(&kv, "model") : "", hq_kvs_get(&kv, "macaddr") ?
				   hq_kvs_get(&kv, "macaddr") : "") : strdup(type),
			 xasprintf("-net %s", o->arg));
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
			 xasprintf("if=%s,index=%s,bus=%s,unit=%s,media=%s", itf ? itf : "",
				   hq_kvs_get(&kv, "index") ? hq_kvs_get(&kv, "index") : "",
				   hq_kvs_get(&kv, "bus") ? hq_kvs_get(&kv, "bus") : "",
				   hq_kvs_get(&kv, "unit") ? hq_kvs_get(&kv, "unit") : "",
				   hq_kvs_get(&kv, "media") ? hq_kvs_get(&kv, "media") : ""),
			 xasprintf("-drive %s", o->arg));
		break;
	}
	case C_DISK:
		fact_add(&s->f, "disk", F_LIST, strdup(o->name), xasprintf("-%s %s", o->name, o->arg));
		break;
	case C_SERIAL:
		s->any_serial = true;
		bprintf(&s->serial_args, " -serial %s", o->arg);
		s->serials += strcmp(o->arg, "none") != 0;
		break;
	case C_PARALLEL:
		s->any_parallel = true;
		bprintf(&s->parallel_args, " -parallel %s", o->arg);
		s->parallels += strcmp(o->arg, "none") != 0;
		break;
	case C_COUNT:
		if (!strcmp(o->name, "debugcon")) {
			s->ndebugcon++;
			bprintf(&s->debugcon_args, " -debugcon %s", o->arg);
		} else {
			s->npflash++;
			bprintf(&s->pflash_args, " -pflash %s", o->arg);
		}
		break;
	case C_VIRTFS: {
		static const char *const drop[] = { "path", "security_model", "writeout",
						    "readonly", "socket", "sock_fd", NULL };

		ret = hq_kvs_split(o->arg, "fsdriver", &kv);
		if (!ret)
			fact_add(&s->f, "-virtfs", F_LIST, kvs_norm(&kv, drop),
				 xasprintf("-virtfs %s", o->arg));
		break;
	}
	}
	hq_kvs_free(&kv);
	return ret == -EINVAL ? 0 : ret; /* an argument QEMU would refuse: QEMU will say */
}

/* "N ports (-serial a -serial b)" */
static void count_fact(struct scan *s, const char *key, int n, struct buf *args, bool any,
		       int dflt)
{
	char *a = bdone(args);

	if (!any)
		n = s->nodefaults ? 0 : dflt;
	fact_add(&s->f, key, F_SCALAR, xasprintf("%d", n),
		 xasprintf("%s: %d%s%s%s", key, n, any ? " (" : "", any && a ? a + 1 : "",
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
		 type ? xasprintf("-machine %s", type) : strdup("no -machine type (QEMU's default)"));
	norm = kvs_norm(&s->machine, machine_drop);
	fact_add(&s->f, "machine options", F_SCALAR, norm,
		 norm && *norm ? xasprintf("-machine %s", norm) : strdup("no -machine options"));
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
	free(bdone(&s->serial_args));
	free(bdone(&s->parallel_args));
	free(bdone(&s->debugcon_args));
	free(bdone(&s->pflash_args));
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

static void differ(struct buf *m, const char *a, const char *b)
{
	bprintf(m, "%s%s at save, %s now", m->len ? "; " : "", a, b);
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

static void compare_key(struct buf *m, const struct facts *fa, const struct facts *fb,
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
					bprintf(m, "%s%s now, not at save", m->len ? "; " : "",
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
				bprintf(m, "%s%s now, %s at save", m->len ? "; " : "", b[i]->shown,
					kind == F_SCALAR ? "none" : "not");
			}
		}
	}
	free(a);
}

/* The machine type as written on both sides; if they differ, as resolved. */
static void compare_machine(struct buf *m, const struct facts *fa, const struct facts *fb,
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
		bprintf(m, "%s%s (%s) at save, %s (%s) now", m->len ? "; " : "", a->shown, ra,
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
	struct buf m = { 0 };
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
	s = bdone(&m);
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

/* --- the host: sockets and memory files in use --- */

/* @path relative to @cwd unless absolute, into @out; false if it does not fit. */
static bool at_cwd(const char *cwd, const char *path, char *out, size_t len)
{
	int n = path[0] == '/' || !cwd ? snprintf(out, len, "%s", path) :
		snprintf(out, len, "%s/%s", cwd, path);

	return n > 0 && (size_t)n < len;
}

static pid_t unix_listener_now(const char *path);

/* Whether @pid is exiting: its main thread a zombie, others maybe still tearing down. */
static bool exiting(pid_t pid)
{
	char st = hq_proc_state(pid);

	return !st || st == '?' || st == 'Z' || st == 'X';
}

/*
 * Someone listens on the unix socket @path: its pid (or 0 if unknown); -1
 * if nobody. A QEMU killed a moment ago still listens while its last
 * threads exit: it is waited for (up to 2 s), then taken as gone.
 */
static pid_t unix_listener(const char *path)
{
	pid_t pid = -1;

	for (int i = 0; i < 100; i++) {
		pid = unix_listener_now(path);
		if (pid <= 0 || !exiting(pid))
			return pid;
		usleep(20000);
	}
	return -1;
}

static pid_t unix_listener_now(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred = { 0 };
	socklen_t cl = sizeof(cred);
	pid_t pid = -1;
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		pid = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) ? 0 : cred.pid;
	close(fd);
	return pid;
}

/* A process (not us) that maps @path: its pid, or 0. */
static pid_t mapper(const char *path)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	size_t plen = strlen(path);
	pid_t found = 0;
	char line[4096];

	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		char maps[300];
		FILE *f;

		if (!isdigit((unsigned char)e->d_name[0]) || atoi(e->d_name) == getpid() ||
		    exiting(atoi(e->d_name)))
			continue;
		snprintf(maps, sizeof(maps), "/proc/%s/maps", e->d_name);
		f = fopen(maps, "re");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			size_t l = strlen(line);
			char *p;

			if (l && line[l - 1] == '\n')
				line[--l] = '\0';
			p = strchr(line, '/');
			if (p && (size_t)(line + l - p) == plen && !strcmp(p, path)) {
				found = atoi(e->d_name);
				break;
			}
		}
		fclose(f);
	}
	closedir(d);
	return found;
}

static void comm(pid_t pid, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	snprintf(buf, len, "?");
	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n > 0) {
		buf[n] = '\0';
		buf[strcspn(buf, "\n")] = '\0';
	}
}

/* A unix socket QEMU would listen on for this option: its path into @out. */
static bool server_socket(const struct hq_opt *o, char *out, size_t len)
{
	struct hq_kvs kv = { 0 };
	const char *path = NULL, *srv;
	bool yes = false;

	if (!o->arg)
		return false;
	if (!strcmp(o->name, "chardev")) {
		if (hq_kvs_split(o->arg, "backend", &kv))
			return false;
		if (hq_kvs_get(&kv, "backend") && !strcmp(hq_kvs_get(&kv, "backend"), "socket"))
			path = hq_kvs_get(&kv, "path");
	} else if (!strcmp(o->name, "qmp") || !strcmp(o->name, "qmp-pretty") ||
		   !strcmp(o->name, "monitor") || !strcmp(o->name, "serial") ||
		   !strcmp(o->name, "parallel") || !strcmp(o->name, "gdb")) {
		/* The legacy syntax: "unix:PATH,server=on,wait=off". */
		if (strncmp(o->arg, "unix:", 5) || hq_kvs_split(o->arg + 5, "path", &kv))
			return false;
		path = hq_kvs_get(&kv, "path");
	}
	if (path) {
		srv = hq_kvs_has(&kv, "server") ? hq_kvs_get(&kv, "server") : "off";
		yes = !srv || !strcmp(srv, "on") || !strcmp(srv, "yes") || !strcmp(srv, "true");
		if (yes)
			snprintf(out, len, "%s", path);
	}
	hq_kvs_free(&kv);
	return yes;
}

int hq_cmdline_check_host(char *const *argv, int argc, const char *cwd, char *err,
			  size_t errlen)
{
	struct hq_opt *opts = NULL;
	char path[4096], name[32];
	int n = 0, ret;

	if (argc < 1)
		return 0;
	ret = hq_opts_parse(argv + 1, argc - 1, &opts, &n, err, errlen);
	if (ret)
		return ret;
	for (int i = 0; i < n && !ret; i++) {
		const struct hq_opt *o = &opts[i];
		char sock[4096];
		struct stat st;
		pid_t pid;

		if (server_socket(o, sock, sizeof(sock)) && at_cwd(cwd, sock, path, sizeof(path)) &&
		    (pid = unix_listener(path)) >= 0) {
			comm(pid, name, sizeof(name));
			snprintf(err, errlen, "-%s %s: the socket %s is in use (process %d, %s, "
				 "listens on it; the source QEMU still running?): QEMU would take "
				 "its path over", o->name, o->arg, path, (int)pid, name);
			ret = -EADDRINUSE;
		} else if (o->arg && (!strcmp(o->name, "object") || !strcmp(o->name, "mem-path"))) {
			struct hq_kvs kv = { 0 };
			const char *mp = NULL;

			if (!strcmp(o->name, "mem-path"))
				mp = o->arg;
			else if (!hq_kvs_split(o->arg, "qom-type", &kv) && hq_kvs_get(&kv, "qom-type") &&
				 !strcmp(hq_kvs_get(&kv, "qom-type"), "memory-backend-file"))
				mp = hq_kvs_get(&kv, "mem-path");
			/* A directory gets a new file of QEMU's; a file is shared with whoever maps it. */
			if (mp && at_cwd(cwd, mp, path, sizeof(path)) && !stat(path, &st) &&
			    S_ISREG(st.st_mode) && (pid = mapper(path)) > 0) {
				comm(pid, name, sizeof(name));
				snprintf(err, errlen, "-%s %s: the memory file %s is mapped by process "
					 "%d (%s; the source QEMU still running?): a restore empties its "
					 "guest RAM's file, which would punch that process's memory: give "
					 "another mem-path", o->name, o->arg, path, (int)pid, name);
				ret = -EBUSY;
			}
			hq_kvs_free(&kv);
		}
	}
	free(opts);
	return ret;
}

/* --- devices: info qtree --- */

int hq_parse_qtree(const char *text, struct hq_argv *out, char *err, size_t errlen)
{
	const char *p = text;
	char *last = NULL;
	int lastind = -1, ret = 0;

	while (*p && !ret) {
		const char *nl = strchr(p, '\n'), *q;
		size_t len = nl ? (size_t)(nl - p) : strlen(p), next = len + (nl != NULL);
		int ind = 0;

		/* HMP answers through QMP end their lines with "\r\n". */
		while (len && (p[len - 1] == '\r' || p[len - 1] == ' '))
			len--;

		for (q = p; q < p + len && *q == ' '; q++)
			ind++;
		if ((size_t)(q - p) + 5 <= len && !strncmp(q, "dev: ", 5)) {
			/* "dev: TYPE, id "ID"" */
			const char *t = q + 5, *c = memchr(t, ',', len - (size_t)(t - p));
			const char *id = c ? strstr(c, "id \"") : NULL;
			size_t idlen = 0;

			if (last)
				ret = hq_argv_push_own(out, last);
			last = NULL;
			if (!c)
				break;
			if (id && id < p + len) {
				id += 4;
				idlen = strcspn(id, "\"\n");
			}
			last = idlen ? xasprintf("%.*s id=%.*s", (int)(c - t), t, (int)idlen, id) :
				       xasprintf("%.*s", (int)(c - t), t);
			if (!last)
				ret = -ENOMEM;
			lastind = ind;
		} else if (last && ind == lastind + 2 && len - (size_t)(q - p) > 7 &&
			   !strncmp(q, "addr = ", 7)) {
			/* A PCI device's own property "addr = 02.0" (its children are deeper). */
			char *s = xasprintf("%s addr=%.*s", last, (int)(len - (size_t)(q - p) - 7), q + 7);

			free(last);
			last = s;
			if (!s)
				ret = -ENOMEM;
		}
		p += next;
	}
	if (!ret && last)
		ret = hq_argv_push_own(out, last);
	else
		free(last);
	if (!ret && !out->argc) {
		snprintf(err, errlen, "info qtree: no device in QEMU's answer");
		ret = -EINVAL;
	}
	return ret;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int hq_devices_compare(const struct hq_argv *saved, const struct hq_argv *now, char *msg,
		       size_t len)
{
	struct buf m = { 0 };
	char **a, **b;
	int shown = 0, ret = 0;
	char *s;

	if (saved->argc == now->argc) {
		int i;

		for (i = 0; i < saved->argc && !strcmp(saved->argv[i], now->argv[i]); i++)
			;
		if (i == saved->argc)
			return 0;
	}
	a = calloc((size_t)saved->argc + (size_t)now->argc + 1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	b = a + saved->argc;
	memcpy(a, saved->argv, sizeof(*a) * (size_t)saved->argc);
	memcpy(b, now->argv, sizeof(*b) * (size_t)now->argc);
	qsort(a, (size_t)saved->argc, sizeof(*a), cmp_str);
	qsort(b, (size_t)now->argc, sizeof(*b), cmp_str);
	/* What one has that the other has not: the first few, then how many more. */
	for (int i = 0, k = 0; i < saved->argc || k < now->argc;) {
		int c = i == saved->argc ? 1 : k == now->argc ? -1 : strcmp(a[i], b[k]);

		if (c && shown++ < 4)
			bprintf(&m, "%sdevice %s %s", m.len ? "; " : "", c < 0 ? a[i] : b[k],
				c < 0 ? "at save, not now" : "now, not at save");
		if (c <= 0)
			i++;
		if (c >= 0)
			k++;
	}
	if (shown > 4)
		bprintf(&m, "; %d more", shown - 4);
	if (!shown)
		bprintf(&m, "the same devices in another order");
	free(a);
	s = bdone(&m);
	if (!s)
		return -ENOMEM;
	snprintf(msg, len, "%s", s);
	free(s);
	return ret ? ret : -EINVAL;
}
