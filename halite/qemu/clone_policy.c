// SPDX-License-Identifier: MIT
/*
 * What a clone's QEMU may be told by the snapshot it clones (see
 * clone_policy.h for why): the recorded command line checked against an
 * allow-list before `halite-qemu clone` makes it the clone's own
 * (clone.c rewrite_cmdline()), and the host files it may boot from opened
 * beneath the directories the service allows.
 *
 * The rule: an option stays if what it names on the host is something the
 * clone rewrites into its own directory (unix sockets, serial and chardev
 * files, pidfile, debug log, the RAM's memory backend, the frozen disks'
 * overlays), something opened beneath an allowed directory (kernel, initrd,
 * BIOS, DTB, data directory), or nothing at all. Whatever runs a program on
 * the host, reaches a host device, a host network or a host file the clone
 * does not rewrite is refused, and so is every option, key, device driver
 * family and object type not known here to be safe: a QEMU option added
 * later is refused until someone looks at it. The message names the option
 * as written and says why.
 *
 * QEMU reads its arguments as cmdline.c does (hq_opts_parse, hq_kvs_split):
 * QemuOpts strings and JSON objects alike, so "-netdev {"type":"tap"}" is
 * refused as "-netdev tap" is. -set is refused outright: it changes any
 * other option's keys after this check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clone_policy.h"
#include "disks.h"

static int refuse(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return -EPERM;
}

static bool in_list(const char *s, const char *const *list)
{
	for (; *list; list++)
		if (!strcmp(s, *list))
			return true;
	return false;
}

/* --- the binary ----------------------------------------------------------- */

static bool qemu_name(const char *path)
{
	const char *b = strrchr(path, '/');

	return !strncmp(b ? b + 1 : path, "qemu-system-", 12) && (b ? b[13] : path[12]);
}

static bool executable(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISREG(st.st_mode) && !access(path, X_OK);
}

int hq_clone_check_binary(const char *bin, char *err, size_t errlen)
{
	const char *path = getenv("PATH");
	char *dup, *save = NULL;
	bool found = false;

	if (!qemu_name(bin))
		return refuse(err, errlen, "the recorded QEMU binary %s is not named qemu-system-*; "
			      "a clone runs QEMU only (--qemu-binary names the one to run)", bin);
	if (bin[0] == '/') {
		if (!executable(bin))
			return refuse(err, errlen, "the recorded QEMU binary %s is not an executable "
				      "file (--qemu-binary names the one to run)", bin);
		return 0;
	}
	if (strchr(bin, '/'))
		return refuse(err, errlen, "the recorded QEMU binary %s is a relative path; a clone "
			      "takes a plain name found in $PATH or an absolute path", bin);
	dup = strdup(path ? path : "/usr/local/bin:/usr/bin:/bin");
	if (!dup)
		return -ENOMEM;
	for (char *d = strtok_r(dup, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
		char full[PATH_MAX];

		if (d[0] == '/' && (size_t)snprintf(full, sizeof(full), "%s/%s", d, bin) < sizeof(full))
			found = executable(full);
	}
	free(dup);
	if (!found)
		return refuse(err, errlen, "the recorded QEMU binary %s is not in $PATH", bin);
	return 0;
}

/* --- the options ---------------------------------------------------------- */

enum kind {
	K_OK,	     /* touches nothing of the host's, or the clone rewrites it */
	K_REFUSE,    /* never: @why says why */
	K_MACHINE, K_ACCEL, K_NETDEV, K_NIC, K_NET, K_CHARDEV, K_CHR_LEGACY, K_DEVICE,
	K_OBJECT, K_DRIVE, K_BLOCKDEV, K_DISK, K_HOSTPATH, K_DISPLAY, K_BOOT, K_GLOBAL,
	K_USBDEVICE, K_AUDIO, K_MON, K_TRACE, K_FILE_KEY, K_ICOUNT,
};

struct rule {
	const char *name;
	enum kind kind;
	const char *why; /* K_REFUSE */
};

static const struct rule rules[] = {
	/* halite-qemu's own: replay takes them out and the clone gives its own */
	{ "S", K_OK, NULL }, { "incoming", K_OK, NULL },
	{ "loadvm", K_REFUSE, "loads a state the clone does not give; a clone may not" },
	{ "daemonize", K_REFUSE, "the clone runs QEMU itself; a clone may not" },
	{ "runas", K_REFUSE, "the clone sets its own (--run-as)" },
	{ "chroot", K_REFUSE, "the clone sets its own confinement" },
	{ "sandbox", K_REFUSE, "the clone sets its own (-sandbox on,...)" },
	/* nothing of the host's */
	{ "enable-kvm", K_OK, NULL }, { "no-reboot", K_OK, NULL }, { "no-shutdown", K_OK, NULL },
	{ "nodefaults", K_OK, NULL }, { "nographic", K_OK, NULL }, { "no-user-config", K_OK, NULL },
	{ "no-acpi", K_OK, NULL }, { "no-hpet", K_OK, NULL }, { "no-fd-bootchk", K_OK, NULL }, { "usb", K_OK, NULL },
	{ "only-migratable", K_OK, NULL }, { "mem-prealloc", K_OK, NULL }, { "snapshot", K_OK, NULL },
	{ "singlestep", K_OK, NULL }, { "win2k-hack", K_OK, NULL }, { "full-screen", K_OK, NULL },
	{ "portrait", K_OK, NULL }, { "rotate", K_OK, NULL }, { "enable-sync-profile", K_OK, NULL },
	{ "smp", K_OK, NULL }, { "m", K_OK, NULL }, { "cpu", K_OK, NULL }, { "name", K_OK, NULL }, { "uuid", K_OK, NULL },
	{ "rtc", K_OK, NULL }, { "action", K_OK, NULL }, { "msg", K_OK, NULL }, { "compat", K_OK, NULL },
	{ "overcommit", K_OK, NULL }, { "watchdog-action", K_OK, NULL }, { "seed", K_OK, NULL }, { "echr", K_OK, NULL },
	{ "d", K_OK, NULL }, { "dfilter", K_OK, NULL }, { "k", K_OK, NULL }, { "vga", K_OK, NULL }, { "append", K_OK, NULL },
	{ "numa", K_OK, NULL }, /* refused by the rewrite, which says why */
	/* rewritten into the clone's directory */
	{ "pidfile", K_OK, NULL }, { "D", K_OK, NULL },
	{ "machine", K_MACHINE, NULL }, { "M", K_MACHINE, NULL }, { "accel", K_ACCEL, NULL },
	{ "netdev", K_NETDEV, NULL }, { "nic", K_NIC, NULL }, { "net", K_NET, NULL },
	{ "chardev", K_CHARDEV, NULL }, { "serial", K_CHR_LEGACY, NULL }, { "monitor", K_CHR_LEGACY, NULL },
	{ "qmp", K_CHR_LEGACY, NULL }, { "qmp-pretty", K_CHR_LEGACY, NULL }, { "debugcon", K_CHR_LEGACY, NULL },
	{ "parallel", K_CHR_LEGACY, NULL }, { "mon", K_MON, NULL },
	{ "device", K_DEVICE, NULL }, { "object", K_OBJECT, NULL }, { "global", K_GLOBAL, NULL },
	{ "drive", K_DRIVE, NULL }, { "blockdev", K_BLOCKDEV, NULL },
	{ "", K_DISK, NULL }, { "hda", K_DISK, NULL }, { "hdb", K_DISK, NULL }, { "hdc", K_DISK, NULL }, { "hdd", K_DISK, NULL },
	{ "cdrom", K_DISK, NULL }, { "fda", K_DISK, NULL }, { "fdb", K_DISK, NULL },
	{ "kernel", K_HOSTPATH, NULL }, { "initrd", K_HOSTPATH, NULL }, { "bios", K_HOSTPATH, NULL },
	{ "dtb", K_HOSTPATH, NULL }, { "L", K_HOSTPATH, NULL },
	{ "display", K_DISPLAY, NULL }, { "boot", K_BOOT, NULL }, { "usbdevice", K_USBDEVICE, NULL },
	{ "audiodev", K_AUDIO, NULL }, { "audio", K_AUDIO, NULL }, { "trace", K_TRACE, NULL },
	{ "smbios", K_FILE_KEY, NULL }, { "fw_cfg", K_FILE_KEY, NULL }, { "icount", K_ICOUNT, NULL },
	/* never */
	{ "plugin", K_REFUSE, "loads a host shared library into QEMU; a clone may not" },
	{ "add-fd", K_REFUSE, "hands QEMU a descriptor of the host's; a clone may not" },
	{ "readconfig", K_REFUSE, "reads more options from a host file; a clone may not" },
	{ "mem-path", K_REFUSE, "puts guest RAM in a host path; a clone's RAM is the template's" },
	{ "fsdev", K_REFUSE, "shares a host directory with the guest; a clone may not" },
	{ "virtfs", K_REFUSE, "shares a host directory with the guest; a clone may not" },
	{ "set", K_REFUSE, "changes other options' keys after the clone checked them; a clone may not" },
	{ "gdb", K_REFUSE, "serves a debugger on the host; a clone may not" },
	{ "s", K_REFUSE, "serves a debugger on a host port; a clone may not" },
	{ "vnc", K_REFUSE, "listens on the host; a clone may not" },
	{ "spice", K_REFUSE, "listens on the host; a clone may not" },
	{ "tpmdev", K_REFUSE, "passes a host TPM through; a clone may not" },
	{ "option-rom", K_REFUSE, "loads a host file into the guest; a clone may not" },
	{ "acpitable", K_REFUSE, "loads host files into the guest; a clone may not" },
	{ "pflash", K_REFUSE, "gives the guest a host file as flash; a clone may not" },
	{ "mtdblock", K_REFUSE, "gives the guest a host file; a clone may not" },
	{ "sd", K_REFUSE, "gives the guest a host file; a clone may not" },
	{ "dump-vmstate", K_REFUSE, "writes a host file; a clone may not" },
	{ "iscsi", K_REFUSE, "reaches host storage; a clone may not" },
	{ "semihosting", K_REFUSE, "lets the guest open host files; a clone may not" },
	{ "semihosting-config", K_REFUSE, "lets the guest open host files; a clone may not" },
	{ "async-teardown", K_REFUSE, "spawns a process; a clone's QEMU may not" },
	{ "xen-domid", K_REFUSE, "attaches to Xen; a clone may not" },
	{ "xen-attach", K_REFUSE, "attaches to Xen; a clone may not" },
	{ "xen-domid-restrict", K_REFUSE, "attaches to Xen; a clone may not" },
};

static const struct rule *rule_of(const char *name)
{
	for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
		if (!strcmp(rules[i].name, name))
			return &rules[i];
	return NULL;
}

/* Every key of @kv in @allowed, or -EPERM naming the first other one. */
static int keys_only(const struct hq_kvs *kv, const char *opt, const char *what,
		     const char *const *allowed, char *err, size_t len)
{
	for (int i = 0; i < kv->n; i++)
		if (!in_list(kv->v[i].key, allowed))
			return refuse(err, len, "-%s %s%s%s=...: %s= is not a key a clone may use",
				      opt, what, what[0] ? "," : "", kv->v[i].key, kv->v[i].key);
	return 0;
}

/* --- networks --- */

static const char *const user_keys[] = {
	"type", "id", "name", "net", "ipv4", "ipv6", "ipv6-net", "ipv6-prefix", "ipv6-prefixlen",
	"host", "ipv6-host", "restrict", "hostname", "dhcpstart", "dns", "ipv6-dns", "dnssearch",
	"domainname", "hostfwd", "tftp-server-name", NULL
};

/* The keys that reach the host whatever the type, each with why. */
static int net_host_keys(const struct hq_kvs *kv, const char *opt, const char *type, char *err,
			 size_t len)
{
	static const struct {
		const char *key, *why;
	} bad[] = {
		{ "script", "runs a program on the host" },
		{ "downscript", "runs a program on the host" },
		{ "helper", "runs a program on the host" },
		{ "smb", "runs smbd on the host" },
		{ "smbserver", "runs smbd on the host" },
		{ "tftp", "serves a host directory to the guest" },
		{ "bootfile", "serves a host file to the guest" },
		{ "guestfwd", "connects the guest to host addresses or runs a host command" },
		{ "ifname", "names a host network interface" },
		{ "fd", "hands QEMU a host descriptor" },
		{ "fds", "hands QEMU a host descriptor" },
		{ "vhostfd", "hands QEMU a host descriptor" },
		{ "vhostfds", "hands QEMU a host descriptor" },
		{ "sock", "connects to a host socket" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *v = hq_kvs_get(kv, bad[i].key);

		if (!hq_kvs_has(kv, bad[i].key))
			continue;
		/* script=no is how one says "none" */
		if (strstr(bad[i].key, "script") && v && !strcmp(v, "no"))
			continue;
		return refuse(err, len, "-%s %s,%s=...: %s= %s; a clone may not", opt, type,
			      bad[i].key, bad[i].key, bad[i].why);
	}
	return 0;
}

static int check_net(const char *opt, enum kind k, const char *arg, char *err, size_t len)
{
	static const char *const nic_keys[] = { "type", "model", "macaddr", "mac", "netdev", "vlan",
						"name", "addr", "vectors", "id", NULL };
	struct hq_kvs kv;
	const char *type;
	int ret;

	ret = hq_kvs_split(arg, "type", &kv);
	if (ret)
		return refuse(err, len, "-%s %s: does not parse", opt, arg);
	type = hq_kvs_get(&kv, "type");
	if (!type)
		type = "";
	ret = net_host_keys(&kv, opt, type, err, len);
	if (ret)
		goto out;
	if (!strcmp(type, "none") && kv.n == 1)
		goto out;
	if (k == K_NET && !strcmp(type, "nic")) {
		ret = keys_only(&kv, opt, type, nic_keys, err, len);
		goto out;
	}
	if (strcmp(type, "user")) {
		ret = refuse(err, len, "-%s %s: %s networking reaches the host's network or "
			     "programs; a clone may use user networking only", opt, type, type);
		goto out;
	}
	for (int i = 0; i < kv.n; i++) {
		const char *key = kv.v[i].key;

		if (in_list(key, user_keys) || (k == K_NIC && (!strcmp(key, "model") ||
							     !strcmp(key, "mac"))))
			continue;
		ret = refuse(err, len, "-%s user,%s=...: %s= is not a key a clone may use", opt, key,
			     key);
		break;
	}
out:
	hq_kvs_free(&kv);
	return ret;
}

/* --- character devices --- */

static int check_chardev(const char *arg, char *err, size_t len)
{
	static const char *const sock_keys[] = { "backend", "id", "path", "server", "wait",
						 "nowait", "reconnect", "mux", NULL };
	static const char *const file_keys[] = { "backend", "id", "path", "mux", "append", NULL };
	static const char *const null_keys[] = { "backend", "id", "mux", "size", NULL };
	struct hq_kvs kv;
	const char *be;
	int ret;

	ret = hq_kvs_split(arg, "backend", &kv);
	if (ret)
		return refuse(err, len, "-chardev %s: does not parse", arg);
	be = hq_kvs_get(&kv, "backend");
	if (!be)
		be = "";
	if (hq_kvs_has(&kv, "logfile")) {
		ret = refuse(err, len, "-chardev %s,logfile=...: logfile= writes a host file the "
			     "clone does not make its own; a clone may not", be);
	} else if (!strcmp(be, "socket")) {
		if (!hq_kvs_get(&kv, "path"))
			ret = refuse(err, len, "-chardev socket without path= (tcp: host=, port=) "
				     "listens on or connects to a host port; a clone may use unix "
				     "sockets only");
		else
			ret = keys_only(&kv, "chardev", be, sock_keys, err, len);
	} else if (!strcmp(be, "file")) {
		ret = keys_only(&kv, "chardev", be, file_keys, err, len);
	} else if (!strcmp(be, "null") || !strcmp(be, "ringbuf") || !strcmp(be, "memory")) {
		ret = keys_only(&kv, "chardev", be, null_keys, err, len);
	} else {
		ret = refuse(err, len, "-chardev %s: reaches a host device, port or program; a "
			     "clone may use unix sockets, files, null and ring buffers", be);
	}
	hq_kvs_free(&kv);
	return ret;
}

/* "-serial file:PATH", "-qmp unix:PATH,server=on,wait=off", "none", "chardev:ID". */
static int check_chr_legacy(const char *opt, const char *arg, char *err, size_t len)
{
	static const char *const unix_keys[] = { "path", "server", "wait", "nowait", "reconnect",
						 NULL };
	bool is_serial = !strcmp(opt, "serial");
	bool rewritten = is_serial || !strcmp(opt, "monitor") || !strncmp(opt, "qmp", 3);
	struct hq_kvs kv;
	int ret;

	if (!strcmp(arg, "none") || !strcmp(arg, "null") || !strncmp(arg, "chardev:", 8))
		return 0;
	if (is_serial && !strncmp(arg, "file:", 5))
		return 0;
	if (!rewritten || strncmp(arg, "unix:", 5))
		return refuse(err, len, "-%s %s: reaches a host device, port or file the clone does "
			      "not make its own; a clone may use %s", opt, arg,
			      is_serial ? "none, null, file:, unix: and chardev:" :
			      rewritten ? "none, null, unix: and chardev:" : "none, null and chardev:");
	ret = hq_kvs_split(arg, "path", &kv);
	if (ret)
		return refuse(err, len, "-%s %s: does not parse", opt, arg);
	ret = keys_only(&kv, opt, "unix:...", unix_keys, err, len);
	hq_kvs_free(&kv);
	return ret;
}

/* --- devices and objects --- */

static int check_device_driver(const char *opt, const char *drv, char *err, size_t len)
{
	static const struct {
		const char *prefix, *why;
	} bad[] = {
		{ "vfio", "passes a host device through" },
		{ "usb-host", "passes a host device through" },
		{ "u2f-passthru", "passes a host device through" },
		{ "pci-assign", "passes a host device through" },
		{ "kvm-pci-assign", "passes a host device through" },
		{ "scsi-generic", "passes a host device through" },
		{ "scsi-block", "passes a host device through" },
		{ "vhost", "connects to a host vhost backend" },
		{ "virtio-9p", "shares a host directory" },
		{ "loader", "loads a host file into the guest" },
		{ "guest-loader", "loads a host file into the guest" },
		{ "ivshmem", "shares memory with the host" },
		{ "ccid-card-emulated", "uses the host's certificates" },
		{ "tpm", "reaches a host TPM" },
		{ "xen", "attaches to Xen" },
		{ "x-remote", "runs devices in another process" },
		{ "virtio-balloon", "gives memory back by punching the template file every clone maps" },
		{ "virtio-mem", "gives memory back by punching the template file every clone maps" },
		{ "virtio-pmem", "maps a second memory backend" },
		{ "nvdimm", "maps a second memory backend" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (!strncmp(drv, bad[i].prefix, strlen(bad[i].prefix)) ||
		    (!strcmp(bad[i].prefix, "vhost") && strstr(drv, "vhost")))
			return refuse(err, len, "-%s %s: %s; a clone may not", opt, drv, bad[i].why);
	return 0;
}

static int check_device_key(const char *opt, const char *drv, const char *key, const char *val,
			    char *err, size_t len)
{
	static const char *const bad[] = { "host", "sysfsdev", "fd", "vhostfd", "vhostfds",
					   "file", "filename", "path", "hostdevice", NULL };

	if (!strcmp(key, "romfile") && val && *val)
		return refuse(err, len, "-%s %s,romfile=%s: romfile= loads a host file as the "
			      "device's option ROM; a clone may not", opt, drv, val);
	if (in_list(key, bad))
		return refuse(err, len, "-%s %s,%s=...: %s= names something of the host's; a clone "
			      "may not", opt, drv, key, key);
	return 0;
}

static int check_device(const char *arg, char *err, size_t len)
{
	struct hq_kvs kv;
	const char *drv;
	int ret;

	ret = hq_kvs_split(arg, "driver", &kv);
	if (ret)
		return refuse(err, len, "-device %s: does not parse", arg);
	drv = hq_kvs_get(&kv, "driver");
	ret = check_device_driver("device", drv ? drv : "", err, len);
	for (int i = 0; !ret && i < kv.n; i++)
		ret = check_device_key("device", drv ? drv : "", kv.v[i].key, kv.v[i].val, err, len);
	hq_kvs_free(&kv);
	return ret;
}

/* -global DRIVER.PROP=VALUE or driver=,property=,value=: a device's key. */
static int check_global(const char *arg, char *err, size_t len)
{
	char drv[128] = "", prop[128] = "";
	const char *val = NULL, *dot = strchr(arg, '.'), *eq = strchr(arg, '=');
	struct hq_kvs kv = { 0 };
	int ret;

	if (dot && eq && dot < eq && strncmp(arg, "driver=", 7)) {
		snprintf(drv, sizeof(drv), "%.*s", (int)(dot - arg), arg);
		snprintf(prop, sizeof(prop), "%.*s", (int)(eq - dot - 1), dot + 1);
		val = eq + 1;
	} else {
		if (hq_kvs_split(arg, NULL, &kv))
			return refuse(err, len, "-global %s: does not parse", arg);
		snprintf(drv, sizeof(drv), "%s", hq_kvs_get(&kv, "driver") ? hq_kvs_get(&kv, "driver") : "");
		snprintf(prop, sizeof(prop), "%s",
			 hq_kvs_get(&kv, "property") ? hq_kvs_get(&kv, "property") : "");
		val = hq_kvs_get(&kv, "value");
	}
	ret = check_device_driver("global", drv, err, len);
	if (!ret)
		ret = check_device_key("global", drv, prop, val, err, len);
	hq_kvs_free(&kv);
	return ret;
}

static int check_object(const char *arg, char *err, size_t len)
{
	static const char *const ok_types[] = {
		"memory-backend-ram", "memory-backend-memfd", "memory-backend-file", "rng-builtin",
		"rng-egd", "rng-random", "iothread", "throttle-group", "authz-simple", "main-loop",
		"filter-buffer", "filter-mirror", "filter-redirector", "filter-rewriter",
		"cryptodev-backend-builtin", "can-bus", "secret", "tls-creds-anon", "tls-creds-psk",
		"tls-creds-x509", NULL
	};
	struct hq_kvs kv;
	const char *t;
	int ret = 0;

	if (hq_kvs_split(arg, "qom-type", &kv))
		return refuse(err, len, "-object %s: does not parse", arg);
	t = hq_kvs_get(&kv, "qom-type");
	if (!t)
		t = "";
	if (!strcmp(t, "filter-dump")) {
		ret = refuse(err, len, "-object filter-dump: writes the guest's traffic to a host "
			     "file; a clone may not");
	} else if (!in_list(t, ok_types)) {
		ret = refuse(err, len, "-object %s: not a type a clone may use (one that names host "
			     "files, devices or programs, or that the clone does not know)", t);
	} else if (!strcmp(t, "rng-random") && hq_kvs_get(&kv, "filename") &&
		   strcmp(hq_kvs_get(&kv, "filename"), "/dev/urandom")) {
		ret = refuse(err, len, "-object rng-random,filename=%s: a host file other than "
			     "/dev/urandom; a clone may not", hq_kvs_get(&kv, "filename"));
	} else if (!strcmp(t, "secret") && hq_kvs_has(&kv, "file")) {
		ret = refuse(err, len, "-object secret,file=...: file= reads a host file; a clone "
			     "may not (data= is fine)");
	} else if (!strncmp(t, "tls-creds", 9) && hq_kvs_has(&kv, "dir")) {
		ret = refuse(err, len, "-object %s,dir=...: dir= reads a host directory of "
			     "credentials; a clone may not", t);
	}
	/* A memory backend's keys (mem-path, host-nodes, ...) go: the clone writes the RAM's. */
	hq_kvs_free(&kv);
	return ret;
}

/* --- disks --- */

/* @path (relative: from @cwd) as an absolute path without "." and ".." into @out. */
static void absolute(const char *cwd, const char *path, char *out, size_t len)
{
	char tmp[PATH_MAX * 2], *save = NULL;
	size_t k = 0;

	snprintf(tmp, sizeof(tmp), "%s%s%s", path[0] == '/' || !cwd ? "" : cwd,
		 path[0] == '/' || !cwd ? "" : "/", path);
	out[0] = '\0';
	for (char *w = strtok_r(tmp, "/", &save); w; w = strtok_r(NULL, "/", &save)) {
		if (!strcmp(w, "."))
			continue;
		if (!strcmp(w, "..")) {
			char *s = strrchr(out, '/');

			k = s ? (size_t)(s - out) : 0;
			out[k] = '\0';
			continue;
		}
		k += (size_t)snprintf(out + k, len - k, "/%s", w);
		if (k >= len)
			k = len - 1;
	}
	if (!out[0])
		snprintf(out, len, "/");
}

static bool frozen_image(const struct hq_clone_policy *p, const char *path)
{
	char abs[PATH_MAX];

	if (!p->disks)
		return false;
	absolute(p->cwd, path, abs, sizeof(abs));
	for (int i = 0; i < p->disks->n; i++)
		if (p->disks->d[i].frozen && hq_disk_level(&p->disks->d[i], abs) >= 0)
			return true;
	return false;
}

static int not_frozen(const char *opt, const char *key, const char *path, char *err, size_t len)
{
	return refuse(err, len, "-%s %s%s: not a frozen disk of the snapshot; a clone runs only "
		      "on overlays of the disks its snapshot froze", opt, key, path);
}

static int check_blockdev_kvs(const struct hq_clone_policy *p, const struct hq_kvs *kv, char *err,
			      size_t len, int depth);

/* A nested node: "file": {...} (JSON) or file.KEY=... (QemuOpts). */
static int check_child(const struct hq_clone_policy *p, const struct hq_kvs *kv, char *err,
		       size_t len, int depth)
{
	struct hq_kvs sub = { 0 };
	int ret = 0;

	for (int i = 0; i < kv->n && !ret; i++) {
		if (!strcmp(kv->v[i].key, "file") && kv->v[i].raw && kv->v[i].val &&
		    kv->v[i].val[0] == '{') {
			struct hq_kvs j;

			if (hq_kvs_split(kv->v[i].val, NULL, &j))
				return refuse(err, len, "-blockdev file: does not parse");
			ret = check_blockdev_kvs(p, &j, err, len, depth + 1);
			hq_kvs_free(&j);
		} else if (!strncmp(kv->v[i].key, "file.", 5)) {
			ret = hq_kvs_add(&sub, kv->v[i].key + 5, kv->v[i].val);
		}
	}
	if (!ret && sub.n)
		ret = check_blockdev_kvs(p, &sub, err, len, depth + 1);
	hq_kvs_free(&sub);
	return ret;
}

static int check_blockdev_kvs(const struct hq_clone_policy *p, const struct hq_kvs *kv, char *err,
			      size_t len, int depth)
{
	static const char *const common[] = { "driver", "node-name", "read-only", "auto-read-only",
					      "force-share", "discard", "detect-zeroes",
					      "cache.direct", "cache.no-flush", NULL };
	static const char *const file_keys[] = { "filename", "aio", "locking", NULL };
	static const char *const fmt_keys[] = {
		"file", "backing", "lazy-refcounts", "pass-discard-request", "pass-discard-snapshot",
		"pass-discard-other", "overlap-check", "cache-size", "l2-cache-size",
		"l2-cache-entry-size", "refcount-cache-size", "cache-clean-interval", "offset",
		"size", NULL
	};
	const char *drv = hq_kvs_get(kv, "driver");

	if (depth > 4)
		return refuse(err, len, "-blockdev: nested too deep");
	if (!drv || (strcmp(drv, "file") && strcmp(drv, "qcow2") && strcmp(drv, "raw")))
		return refuse(err, len, "-blockdev driver=%s: reaches host storage other than the "
			      "frozen disks' files; a clone may use file, qcow2 and raw",
			      drv ? drv : "(none)");
	for (int i = 0; i < kv->n; i++) {
		const char *key = kv->v[i].key;
		bool ok = in_list(key, common) ||
			  (!strcmp(drv, "file") ? in_list(key, file_keys) :
			   in_list(key, fmt_keys) || !strncmp(key, "file.", 5));

		if (!ok)
			return refuse(err, len, "-blockdev %s,%s=...: %s= is not a key a clone may "
				      "use", drv, key, key);
		/* backing=NODE or null: a node name, never a path */
		if (!strcmp(key, "backing") && kv->v[i].val &&
		    (strchr(kv->v[i].val, '/') || strchr(kv->v[i].val, '{')))
			return refuse(err, len, "-blockdev %s,backing=%s: a clone's backing image is "
				      "the frozen one", drv, kv->v[i].val);
	}
	if (!strcmp(drv, "file")) {
		const char *f = hq_kvs_get(kv, "filename");

		if (!f || !frozen_image(p, f))
			return not_frozen("blockdev", "driver=file,filename=", f ? f : "(none)", err,
					  len);
		return 0;
	}
	return check_child(p, kv, err, len, depth);
}

static int check_blockdev(const struct hq_clone_policy *p, const char *arg, char *err, size_t len)
{
	struct hq_kvs kv;
	int ret;

	if (hq_kvs_split(arg, "driver", &kv))
		return refuse(err, len, "-blockdev %s: does not parse", arg);
	ret = check_blockdev_kvs(p, &kv, err, len, 0);
	hq_kvs_free(&kv);
	return ret;
}

static int check_drive(const struct hq_clone_policy *p, const char *arg, char *err, size_t len)
{
	static const char *const ok[] = {
		"file", "if", "id", "index", "media", "format", "cache", "cache.direct",
		"cache.no-flush", "aio", "discard", "detect-zeroes", "readonly", "read-only",
		"serial", "werror", "rerror", "copy-on-read", "bus", "unit", "node-name",
		"auto-read-only", "force-share", "file.filename", "file.driver", "file.aio",
		"file.locking", NULL
	};
	struct hq_kvs kv;
	const char *f, *fmt;
	int ret = 0;

	if (hq_kvs_split(arg, NULL, &kv))
		return refuse(err, len, "-drive %s: does not parse", arg);
	for (int i = 0; i < kv.n && !ret; i++)
		if (!in_list(kv.v[i].key, ok) && strncmp(kv.v[i].key, "throttling.", 11))
			ret = refuse(err, len, "-drive %s=...: %s= is not a key a clone may use",
				     kv.v[i].key, kv.v[i].key);
	fmt = hq_kvs_get(&kv, "format");
	if (!ret && fmt && strcmp(fmt, "qcow2") && strcmp(fmt, "raw"))
		ret = refuse(err, len, "-drive format=%s: a clone's disks are qcow2 or raw", fmt);
	fmt = hq_kvs_get(&kv, "file.driver");
	if (!ret && fmt && strcmp(fmt, "file"))
		ret = refuse(err, len, "-drive file.driver=%s: reaches host storage other than the "
			     "frozen disks' files; a clone may not", fmt);
	f = hq_kvs_get(&kv, "file") ? hq_kvs_get(&kv, "file") : hq_kvs_get(&kv, "file.filename");
	if (!ret && f && !frozen_image(p, f))
		ret = not_frozen("drive", "file=", f, err, len);
	hq_kvs_free(&kv);
	return ret;
}

/* --- the rest --- */

static int check_machine(const char *opt, const char *arg, char *err, size_t len)
{
	static const char *const ok[] = {
		"type", "accel", "memory-backend", "usb", "vmport", "smm", "kernel-irqchip",
		"kernel_irqchip", "dump-guest-core", "mem-merge", "graphics", "suppress-vmdesc",
		"hpet", "acpi", "sata", "pit", "pic", "i8042", "smbus", "nvdimm", "hmat",
		"max-ram-below-4g", "pflash0", "pflash1", "default-bus-bypass-iommu",
		"nvdimm-persistence", "x-oem-id", "x-oem-table-id", "bus-lock-ratelimit",
		"confidential-guest-support", "phandle-start", NULL
	};
	static const char *const paths[] = { "kernel", "initrd", "dtb", "firmware", "dumpdtb",
					      "append", NULL };
	struct hq_kvs kv;
	int ret = 0;

	if (hq_kvs_split(arg, "type", &kv))
		return refuse(err, len, "-%s %s: does not parse", opt, arg);
	for (int i = 0; i < kv.n && !ret; i++) {
		const char *key = kv.v[i].key;

		if (in_list(key, paths) && strcmp(key, "append"))
			ret = refuse(err, len, "-%s %s=...: %s= names a host file; a clone takes "
				     "-kernel, -initrd, -dtb and -bios (from the directories it "
				     "allows) instead", opt, key, key);
		else if (!in_list(key, ok) && strcmp(key, "append"))
			ret = refuse(err, len, "-%s %s=...: %s= is not a key a clone may use", opt,
				     key, key);
	}
	hq_kvs_free(&kv);
	return ret;
}

static int check_keys_arg(const char *opt, const char *arg, const char *implied,
			  const char *const *ok, const char *const *ok_vals, char *err, size_t len)
{
	struct hq_kvs kv;
	int ret;

	if (hq_kvs_split(arg, implied, &kv))
		return refuse(err, len, "-%s %s: does not parse", opt, arg);
	ret = 0;
	if (ok_vals) {
		const char *v = hq_kvs_get(&kv, implied);

		if (!v || !in_list(v, ok_vals))
			ret = refuse(err, len, "-%s %s: reaches the host (a display, a sound device, "
				     "a file or a device); a clone may use %s only", opt, v ? v : "",
				     ok_vals[0]);
	}
	if (!ret)
		ret = keys_only(&kv, opt, implied && hq_kvs_get(&kv, implied) ?
				hq_kvs_get(&kv, implied) : "", ok, err, len);
	hq_kvs_free(&kv);
	return ret;
}

static int check_one(const struct hq_clone_policy *p, const struct hq_opt *o, const char *word,
		     char *err, size_t len)
{
	static const char *const accel_keys[] = { "accel", "thread", "tb-size", "kernel-irqchip",
						  "kvm-shadow-mem", "dirty-ring-size", "split-wx",
						  NULL };
	static const char *const none[] = { "none", NULL };
	static const char *const display_keys[] = { "type", NULL };
	static const char *const audio_keys[] = { "driver", "id", "model", NULL };
	static const char *const boot_keys[] = { "order", "once", "menu", "splash-time",
						 "reboot-timeout", "strict", NULL };
	static const char *const mon_keys[] = { "chardev", "mode", "pretty", "id", NULL };
	static const char *const trace_keys[] = { "enable", NULL };
	static const char *const usbdev[] = { "tablet", "mouse", "keyboard", "wacom-tablet", NULL };
	const struct rule *r = rule_of(o->name);
	const char *arg = o->arg;

	if (!r)
		return refuse(err, len, "%s: not an option a clone may use", word);
	if (r->kind == K_REFUSE)
		return refuse(err, len, "%s: %s", word, r->why);
	if (!arg)
		return 0;
	switch (r->kind) {
	case K_MACHINE:
		return check_machine(o->name, arg, err, len);
	case K_ACCEL:
		return check_keys_arg(o->name, arg, "accel", accel_keys, NULL, err, len);
	case K_NETDEV:
	case K_NIC:
	case K_NET:
		return check_net(o->name, r->kind, arg, err, len);
	case K_CHARDEV:
		return check_chardev(arg, err, len);
	case K_CHR_LEGACY:
		return check_chr_legacy(o->name, arg, err, len);
	case K_MON:
		return check_keys_arg(o->name, arg, "chardev", mon_keys, NULL, err, len);
	case K_DEVICE:
		return check_device(arg, err, len);
	case K_GLOBAL:
		return check_global(arg, err, len);
	case K_OBJECT:
		return check_object(arg, err, len);
	case K_DRIVE:
		return check_drive(p, arg, err, len);
	case K_BLOCKDEV:
		return check_blockdev(p, arg, err, len);
	case K_DISK:
		return frozen_image(p, arg) ? 0 : not_frozen(o->name[0] ? o->name : "(image)", "",
							      arg, err, len);
	case K_DISPLAY:
		return check_keys_arg(o->name, arg, "type", display_keys, none, err, len);
	case K_AUDIO:
		return check_keys_arg(o->name, arg, "driver", audio_keys, none, err, len);
	case K_BOOT:
		if (strstr(arg, "splash="))
			return refuse(err, len, "-boot splash=...: splash= reads a host file; a clone "
				      "may not");
		return check_keys_arg(o->name, arg, "order", boot_keys, NULL, err, len);
	case K_TRACE:
		return check_keys_arg(o->name, arg, "enable", trace_keys, NULL, err, len);
	case K_USBDEVICE:
		return in_list(arg, usbdev) ? 0 :
		       refuse(err, len, "-usbdevice %s: a clone may use tablet, mouse and keyboard "
			      "only (others reach host devices)", arg);
	case K_FILE_KEY:
		if (strstr(arg, "file="))
			return refuse(err, len, "-%s file=...: file= reads a host file; a clone may "
				      "not", o->name);
		return 0;
	case K_ICOUNT:
		if (strstr(arg, "rr=") || strstr(arg, "rrfile="))
			return refuse(err, len, "-icount rr=...: record/replay reads or writes a host "
				      "file; a clone may not");
		return 0;
	default:
		return 0; /* K_OK, K_HOSTPATH (hq_clone_open_paths) */
	}
}

int hq_clone_policy_check(char *const *argv, int argc, const struct hq_clone_policy *p,
			  char *err, size_t errlen)
{
	struct hq_opt *o = NULL;
	int n = 0, ret;

	if (!p || p->sz < sizeof(*p) || argc < 1)
		return -EINVAL;
	ret = hq_opts_parse(argv + 1, argc - 1, &o, &n, err, errlen);
	if (ret)
		return ret;
	for (int i = 0; i < n && !ret; i++)
		ret = check_one(p, &o[i], argv[1 + o[i].index], err, errlen);
	free(o);
	return ret;
}

/* --- the host files a clone boots from ------------------------------------ */

/* @path's remainder below @dir (both absolute, normalized), or NULL. */
static const char *below(const char *dir, const char *path)
{
	size_t n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		n--;
	if (n == 1 && dir[0] == '/')
		return path[1] ? path + 1 : NULL;
	if (strncmp(dir, path, n) || path[n] != '/' || !path[n + 1])
		return NULL;
	return path + n + 1;
}

static int open_beneath(const struct hq_clone_policy *p, const char *opt, const char *path,
			char *err, size_t len)
{
	struct open_how how = { .flags = O_RDONLY | O_NOCTTY,
				.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS };
	char abs[PATH_MAX], real[PATH_MAX], file_real[PATH_MAX];
	bool resolved;
	int saw = 0;

	absolute(p->cwd, path, abs, sizeof(abs));
	/*
	 * The path as recorded, or as it resolves now: a name through a
	 * symlink to the allowed directory is fine, since what is opened is
	 * the remainder, beneath the directory, whatever the links say then.
	 */
	resolved = realpath(abs, file_real) != NULL;
	if (!strcmp(opt, "L"))
		how.flags |= O_DIRECTORY;
	for (int i = 0; i < p->nallow_dirs; i++) {
		const char *rest = below(p->allow_dirs[i], abs);
		bool dir_real = realpath(p->allow_dirs[i], real) != NULL;
		int dfd, fd;

		/* the directory as the operator wrote it, or as it resolves */
		if (!rest && dir_real)
			rest = below(real, abs);
		if (!rest && resolved)
			rest = below(p->allow_dirs[i], file_real);
		if (!rest && resolved && dir_real)
			rest = below(real, file_real);
		if (!rest)
			continue;
		saw = 1;
		dfd = open(p->allow_dirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			return refuse(err, len, "--allow-dir %s: %s", p->allow_dirs[i],
				      strerror(errno));
		fd = (int)syscall(SYS_openat2, dfd, rest, &how, sizeof(how));
		close(dfd);
		if (fd >= 0)
			return fd;
		if (errno != EXDEV && errno != ELOOP && errno != ENOENT) {
			int e = errno;

			snprintf(err, len, "-%s %s: %s", opt, path, strerror(e));
			return -e;
		}
	}
	return refuse(err, len, "-%s %s: %s; a clone boots only from files beneath the "
		      "directories it allows (--allow-dir)", opt, path,
		      saw ? "not found beneath its allowed directory (a link out of it, or gone)" :
		      "outside the allowed directories");
}

int hq_clone_open_paths(struct hq_argv *a, const struct hq_clone_policy *p, int *fds, int max,
			int *nfds, char *err, size_t errlen)
{
	struct hq_opt *o = NULL;
	int n = 0, ret;

	*nfds = 0;
	if (!p->nallow_dirs)
		return 0;
	ret = hq_opts_parse(a->argv + 1, a->argc - 1, &o, &n, err, errlen);
	if (ret)
		return ret;
	for (int i = 0; i < n && !ret; i++) {
		const struct rule *r = rule_of(o[i].name);
		int ai = 1 + o[i].index + 1, fd;
		char *s;

		if (!r || r->kind != K_HOSTPATH || !o[i].arg)
			continue;
		if (*nfds >= max) {
			ret = refuse(err, errlen, "too many host files (-kernel, -initrd, ...)");
			break;
		}
		fd = open_beneath(p, o[i].name, o[i].arg, err, errlen);
		if (fd < 0) {
			ret = fd;
			break;
		}
		fds[(*nfds)++] = fd;
		if (asprintf(&s, "/proc/self/fd/%d", fd) < 0) {
			ret = -ENOMEM;
			break;
		}
		free(a->argv[ai]);
		a->argv[ai] = s;
	}
	free(o);
	if (ret) {
		while (*nfds)
			close(fds[--*nfds]);
	}
	return ret;
}
