// SPDX-License-Identifier: MIT
/*
 * halite-qemu clone: the command line a clone's QEMU runs (clone.h): the
 * snapshot's recorded one, checked against what a clone may use, made a
 * machine of its own and confined. clone.c's top comment says what a clone
 * gets and why.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>



#include "clone_policy.h"
#include "clone_state.h"

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
		return clone_fail(c, -errno, "getrandom", strerror(errno));
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
			return clone_fail(c, -HALITE_E_UNSUPPORTED, "cloning a NUMA guest (-numa)",
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
					ret = clone_fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest with a "
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
			return clone_fail(c, -HALITE_E_UNSUPPORTED, "cloning a guest without -m", NULL);
		if (ram_id[0])
			return clone_fail(c, -EINVAL, "the recorded -machine memory-backend has no -object",
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
	for (int i = 0; i < c->b.cfg.fwds.n; i++) {
		struct hq_fwd *w = &c->b.cfg.fwds.v[i];
		char *dash = strchr(w->rule, '-'), *colon, rule[sizeof(w->rule)];
		uint16_t port = 0;
		int ret;

		if (!dash)
			return clone_fail(c, -EINVAL, "hostfwd rule", w->rule);
		*dash = '\0';
		colon = strrchr(w->rule, ':');
		*dash = '-';
		if (!colon)
			return clone_fail(c, -EINVAL, "hostfwd rule", w->rule);
		ret = free_port(w, &port);
		if (ret)
			return clone_fail(c, ret, "a free host port", strerror(-ret));
		snprintf(rule, sizeof(rule), "%.*s:%u%s", (int)(colon - w->rule), w->rule, port,
			 dash);
		memcpy(w->rule, rule, sizeof(rule));
		w->host_port = port;
	}
	return 0;
}

/* --qemu-binary: absolute, an executable file (the service's configuration says which). */
int clone_check_qemu_binary(struct qclone *c)
{
	const char *b = c->p.qemu_binary;
	struct stat st;

	if (b[0] != '/')
		return clone_fail(c, -EINVAL, "--qemu-binary: an absolute path please", b);
	if (stat(b, &st) || !S_ISREG(st.st_mode) || access(b, X_OK))
		return clone_fail(c, -EINVAL, "--qemu-binary: not an executable file", b);
	return 0;
}

/* --run-as: a user name or uid that is not root, as "UID:GID" for QEMU's -runas. */
int clone_resolve_run_as(struct qclone *c)
{
	const char *u = c->p.run_as;
	struct passwd *pw = getpwnam(u);
	char *end;

	if (!pw) {
		unsigned long id;

		errno = 0;
		id = strtoul(u, &end, 10);
		if (*u < '0' || *u > '9' || *end || errno || id > (uid_t)-2)
			return clone_fail(c, -EINVAL, "--run-as: no such user", u);
		pw = getpwuid((uid_t)id);
		c->run_uid = (uid_t)id;
		c->run_gid = pw ? pw->pw_gid : (gid_t)id;
	} else {
		c->run_uid = pw->pw_uid;
		c->run_gid = pw->pw_gid;
	}
	if (!c->run_uid || !c->run_gid)
		return clone_fail(c, -EINVAL, "--run-as: QEMU would run as root (uid or gid 0); name an "
			    "unprivileged user", u);
	snprintf(c->runas, sizeof(c->runas), "%u:%u", (unsigned)c->run_uid, (unsigned)c->run_gid);
	return 0;
}

static void policy_of(const struct qclone *c, struct hq_clone_policy *pol)
{
	*pol = (struct hq_clone_policy){ .sz = sizeof(*pol), .allow_dirs = c->p.allow_dirs,
					 .nallow_dirs = c->p.nallow_dirs, .disks = c->b.disks,
					 .cwd = c->b.cfg.rec_cwd };
}

/*
 * The recorded line, as the file's writer gave it, against what a clone may
 * use (clone_policy.c), before anything of it runs: the binary (unless
 * --qemu-binary or $HALITE_QEMU says which), then every option. The frozen
 * disks are parsed here: they are the only images a -drive may name.
 */
int clone_check_policy(struct qclone *c)
{
	struct hq_clone_policy pol;
	const char *env = getenv("HALITE_QEMU");
	int ret;

	if (c->b.cfg.rec_disks) {
		c->b.disks = calloc(1, sizeof(*c->b.disks));
		if (!c->b.disks)
			return clone_fail(c, -ENOMEM, "out of memory", NULL);
		ret = hq_disks_parse(c->b.cfg.rec_disks, c->b.disks, c->err, sizeof(c->err));
		if (ret)
			return ret;
	}
	if (!c->p.qemu_binary && !(env && *env)) {
		ret = hq_clone_check_binary(c->b.cfg.rec.argv[0], c->err, sizeof(c->err));
		if (ret)
			return ret;
	}
	policy_of(c, &pol);
	ret = hq_clone_policy_check(c->b.cfg.rec.argv, c->b.cfg.rec.argc, &pol, c->err,
				    sizeof(c->err));
	if (ret && !c->err[0])
		clone_fail(c, ret, "checking the recorded command line", strerror(-ret));
	return ret;
}

/*
 * QEMU's own confinement, added last: the seccomp sandbox always, -runas
 * with --run-as. QEMU 7.2 installs its filter before -runas's setgid and
 * setuid (os_setup_post), so elevateprivileges=deny kills it there
 * (SIGSYS, checked by hand): with --run-as it stays allowed. Once every uid
 * and gid is the user's, with no_new_privs set and exec denied, there is no
 * privilege left to take back.
 */
static int add_confinement(struct qclone *c)
{
	struct hq_argv *a = &c->b.cfg.run;
	int ret;

	ret = hq_argv_push(a, "-sandbox");
	if (!ret)
		ret = hq_argv_push(a, c->runas[0] ?
				   "on,obsolete=deny,elevateprivileges=allow,spawn=deny,"
				   "resourcecontrol=deny" :
				   "on,obsolete=deny,elevateprivileges=deny,spawn=deny,"
				   "resourcecontrol=deny");
	if (!ret && c->runas[0])
		ret = hq_argv_push(a, "-runas");
	if (!ret && c->runas[0])
		ret = hq_argv_push(a, c->runas);
	return ret;
}

int clone_prepare_cmdline(struct qclone *c)
{
	struct hq_clone_policy pol;
	int ret;

	ret = clone_check_policy(c);
	if (ret)
		return ret;
	ret = hq_cmdline_replay(c->b.cfg.rec.argv, c->b.cfg.rec.argc, &c->b.cfg.user,
				&c->b.cfg.replay_flags);
	if (ret)
		return clone_fail(c, ret, "replaying the recorded command line", strerror(-ret));
	c->b.cfg.replayed = true;
	c->b.cfg.cwd = c->b.cfg.rec_cwd;
	if (c->p.qemu_binary)
		ret = set_arg(&c->b.cfg.user, 0, strdup(c->p.qemu_binary));
	else if (getenv("HALITE_QEMU") && *getenv("HALITE_QEMU"))
		ret = set_arg(&c->b.cfg.user, 0, strdup(getenv("HALITE_QEMU")));
	if (!ret)
		ret = rewrite_cmdline(c, &c->b.cfg.user);
	if (!ret) {
		policy_of(c, &pol);
		ret = hq_clone_open_paths(&c->b.cfg.user, &pol, c->host_fds, MAX_HOST_FILES,
					  &c->nhost_fds, c->err, sizeof(c->err));
	}
	if (!ret)
		ret = hq_argv_copy(&c->b.cfg.run, c->b.cfg.user.argv, c->b.cfg.user.argc);
	if (!ret)
		ret = hq_fwd_take_out(&c->b.cfg.run, &c->b.cfg.fwds, c->err, sizeof(c->err));
	if (!ret)
		ret = new_ports(c);
	if (!ret)
		ret = add_confinement(c);
	/*
	 * Not hq_cmdline_check_host(): its sockets are in the clone's own
	 * directory, and its memory file is the template's, which the service
	 * and every other clone map by design.
	 */
	if (ret && !c->err[0])
		clone_fail(c, ret, "QEMU's command line", strerror(-ret));
	return ret;
}
