// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the template fast-clone service (issue 14). Options,
 * directories, the listening sockets, reloading the state directory, the
 * monitor loop and shutdown.
 *
 * The main thread is the monitor: with SIGTERM and SIGINT blocked in every
 * thread, it waits for them with sigtimedwait() and, in between, reaps
 * clones, moves their states on and saves learned hot sets. Stopping frees
 * sessions and templates and leaves every clone running (they are in their
 * own sessions; the systemd unit has KillMode=process): the next daemon
 * re-attaches them. A stop gives slow requests in flight a few seconds
 * (API_STOP_GRACE_MS), then exits whatever clients do.
 *
 * Who may call: the unix socket by its permissions (0660, its group
 * --socket-group, its directory 0750), the TCP listener by a bearer token
 * (--token-file, required with --listen; checked in api.c).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "cli.h"
#include "cloned.h"

/* In-flight slow requests at a stop: then the daemon exits anyway (the unit allows 10 s). */
#define API_STOP_GRACE_MS 5000

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [options]\n"
		"\n"
		"The template fast-clone service: many guests from one snapshot, over an\n"
		"HTTP/JSON API (see GET /healthz, /metrics, /templates, /clones).\n"
		"\n"
		"  --socket PATH        the API's unix socket (/run/halite-cloned/api.sock)\n"
		"  --socket-group GROUP the socket's group (name or number): its members may\n"
		"                       call the API (socket 0660, its directory 0750)\n"
		"  --listen ADDR:PORT   also TCP, loopback only (127.0.0.1:PORT, [::1]:PORT);\n"
		"                       needs --token-file\n"
		"  --token-file PATH    the bearer token TCP callers must send\n"
		"                       (Authorization: Bearer TOKEN): a file of this daemon's\n"
		"                       user, mode 0600 or stricter, at least 32 characters\n"
		"  --tls-cert PATH      TLS on the TCP listener: its certificate (PEM), with\n"
		"  --tls-key PATH       its key (a file of this daemon's user, mode 0600)\n"
		"  --tls-client-ca PATH and callers must show a certificate this CA signed\n"
		"                       (all three together)\n"
		"  --list-routes        print the API's routes (METHOD PATH fast|slow) and exit\n"
		"  --state-dir DIR      templates and clones, kept across restarts\n"
		"                       (/var/lib/halite-cloned)\n"
		"  --mem-dir DIR        template memory files, on tmpfs (/run/halite-cloned/mem);\n"
		"                       it and --state-dir must be this daemon's uid's, mode 0700\n"
		"  --snapshot-dir DIR   snapshots are taken from here only (repeatable; a\n"
		"                       directory of root's or this daemon's uid, writable by\n"
		"                       no one else); without one, POST /templates is refused\n"
		"  --s3-allow BUCKET[/PREFIX]  snapshots s3://BUCKET/KEY may be taken from\n"
		"                       this bucket, keys in the folder PREFIX (repeatable;\n"
		"                       none: every s3:// snapshot is refused); read with this\n"
		"                       daemon's AWS_* environment and ~/.aws\n"
		"  --cache-dir DIR      the host's cache of locality blocks read from the\n"
		"                       object store, shared with every restore on the host\n"
		"                       and kept across restarts (STATE-DIR/lbcache)\n"
		"  --cache-size SIZE    its bound, bytes or K/M/G; least recently used\n"
		"                       blocks are dropped beyond (8G)\n"
		"  --synth-bin PATH     halite-synth (next to this program, the build tree's,\n"
		"                       else from PATH)\n"
		"  --qemu-bin PATH      halite-qemu, for QEMU templates (the same way)\n"
		"  --qemu-system PATH   the QEMU that QEMU clones run (qemu-system-x86_64\n"
		"                       from PATH); never a template's choice\n"
		"  --clone-user USER    who QEMU clones' QEMU runs as, not root (nobody)\n"
		"  --qemu-dir DIR       a directory a QEMU template's -kernel, -initrd or\n"
		"                       -bios may come from (repeatable; none)\n"
		"  --readers N          locality-block reader threads per template, 1..64 (4)\n"
		"  --read-latency-us N  added to every locality-block read, 0 .. 10000000\n"
		"                       (tests, benchmarks; 0)\n"
		"  --prefetch-rate B/s  the prefetcher's least rate, bytes per second (64 MiB/s)\n"
		"  --hot-window-ms N    a clone's faults this long after its start are hot,\n"
		"                       0 .. 3600000 (2000); the hot set is saved to\n"
		"                       STATE/templates/ID.hot, a restore trace (version 2)\n"
		"  --cache-max SIZE     the most the templates' decoded blocks may take in\n"
		"                       --mem-dir, all templates together (bytes, or K/M/G);\n"
		"                       a template that would go beyond is refused (no limit)\n"
		"  --clone-memory-max SIZE  a clone's memory limit unless its request or its\n"
		"                       template says (bytes, or K/M/G; none): each clone\n"
		"                       runs in its own cgroup, HIER/halite-cloned/ID\n"
		"  --clone-cpu-max CPUS a clone's CPU limit the same way, e.g. 0.5 (none)\n"
		"  --log-level LEVEL    error, warn, info (default) or debug\n"
		"  -h, --help           this text; --version: the version\n"
		"\n"
		"Exit: 0 stopped by SIGTERM or SIGINT, 1 it could not start (a directory,\n"
		"the socket, another daemon on it), 2 usage (nothing bound or created).\n");
}

/* @name next to this program, in the build tree's @tree_dir, else from PATH; NULL if none. */
static char *find_prog(const char *name, const char *tree_dir)
{
	char self[PATH_MAX], *slash, *p = NULL, *path, *save = NULL;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = 0;
		slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			if (asprintf(&p, "%s/%s", self, name) > 0 && !access(p, X_OK))
				return p;
			free(p);
			/* The build tree: build/tools/halite-cloned -> build/@tree_dir. */
			if (asprintf(&p, "%s/../../%s/%s", self, tree_dir, name) > 0 &&
			    !access(p, X_OK))
				return p;
			free(p);
			p = NULL;
		}
	}
	path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	for (char *dir = path ? strtok_r(path, ":", &save) : NULL; dir;
	     dir = strtok_r(NULL, ":", &save)) {
		if (asprintf(&p, "%s/%s", dir, name) > 0 && !access(p, X_OK))
			break;
		free(p);
		p = NULL;
	}
	free(path);
	return p;
}

/* *@bin given (@opt): made absolute, clones are spawned from wherever the daemon runs; else found. */
static int resolve_bin(char **bin, const char *name, const char *tree_dir, const char *opt)
{
	char *abs;

	if (!*bin) {
		*bin = find_prog(name, tree_dir);
		if (!*bin)
			return 0;
	}
	abs = realpath(*bin, NULL);
	if (!abs || access(abs, X_OK)) {
		fprintf(stderr, PROG ": %s %s: %s\n", opt, *bin, strerror(errno));
		free(abs);
		return -1;
	}
	free(*bin);
	*bin = abs;
	return 0;
}

/*
 * The socket's directory gets --socket-group and 0750 when it is this
 * daemon's own (our uid, nothing for others): a shared directory such as
 * /run or /tmp is left as it is, the socket's own mode guards it there.
 */
static int socket_dir_group(struct cloned *d, const char *dir, gid_t gid)
{
	struct stat st;

	if (lstat(dir, &st)) {
		cl_log(d, HALITE_LOG_ERROR, "--socket: %s: %s", dir, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		cl_log(d, HALITE_LOG_ERROR, "--socket: %s is not a directory", dir);
		return -1;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 07007)) {
		cl_log(d, HALITE_LOG_WARN, "--socket-group: %s is not the daemon's own directory "
		       "(owner uid %u, mode %04o): left as it is", dir, (unsigned)st.st_uid,
		       (unsigned)(st.st_mode & 07777));
		return 0;
	}
	if (chown(dir, (uid_t)-1, gid) || chmod(dir, 0750)) {
		cl_log(d, HALITE_LOG_ERROR, "--socket-group: %s: %s", dir, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * A secret file (--token-file, --tls-key): a regular file of this daemon's
 * user that nobody else may read or change. Anything looser is refused with
 * its fix: a secret others can read is none. Its text (NUL-terminated,
 * malloc'd) into *@out; 0 or -1 (said so).
 */
static int read_private(struct cloned *d, const char *opt, const char *path, char **out)
{
	char *buf = NULL;
	struct stat st;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

	if (fd < 0) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: %s%s", opt, path, strerror(errno),
		       errno == ELOOP ? " (a symbolic link: give the file itself)" : "");
		return -1;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: not a regular file", opt, path);
		goto fail;
	}
	if (st.st_uid != geteuid()) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: owned by uid %u, not by this daemon's uid %u: "
		       "chown %u %s", opt, path, (unsigned)st.st_uid, (unsigned)geteuid(),
		       (unsigned)geteuid(), path);
		goto fail;
	}
	if (st.st_mode & 077) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: mode %04o lets other users read or change "
		       "it: chmod 600 %s", opt, path, (unsigned)(st.st_mode & 07777), path);
		goto fail;
	}
	if (st.st_size > 65536) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: %lld bytes, more than a secret takes (64 KiB)",
		       opt, path, (long long)st.st_size);
		goto fail;
	}
	buf = calloc(1, (size_t)st.st_size + 1);
	n = buf ? read(fd, buf, (size_t)st.st_size) : -1;
	if (n < 0) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: %s", opt, path, strerror(errno));
		goto fail;
	}
	close(fd);
	*out = buf;
	return 0;
fail:
	free(buf);
	close(fd);
	return -1;
}

/* --token-file: the bearer token TCP callers send. */
static int read_token(struct cloned *d, const char *path)
{
	char *buf;
	size_t n;

	if (read_private(d, "--token-file", path, &buf))
		return -1;
	n = strlen(buf);
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	for (size_t i = 0; i < n; i++)
		if (buf[i] <= ' ' || buf[i] > '~') {
			cl_log(d, HALITE_LOG_ERROR, "--token-file %s: the token has a blank, control "
			       "or non-ASCII byte at %zu: it must be printable ASCII (e.g. "
			       "openssl rand -hex 32 > %s)", path, i, path);
			goto fail;
		}
	if (n < 32) {
		cl_log(d, HALITE_LOG_ERROR, "--token-file %s: the token has %zu characters, at least "
		       "32 are needed (e.g. openssl rand -hex 32 > %s)", path, n, path);
		goto fail;
	}
	d->o.token = buf;
	return 0;
fail:
	explicit_bzero(buf, n);
	free(buf);
	return -1;
}

/* A certificate file (PEM) for TLS: public, any mode. */
static int read_cert(struct cloned *d, const char *opt, const char *path, char **out)
{
	FILE *f = fopen(path, "re");
	char *buf;

	if (!f) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: %s", opt, path, strerror(errno));
		return -1;
	}
	buf = calloc(1, 65537);
	if (buf)
		fread(buf, 1, 65536, f);
	if (!buf || ferror(f) || !feof(f) || !strstr(buf, "-----BEGIN CERTIFICATE-----")) {
		cl_log(d, HALITE_LOG_ERROR, "%s %s: not a PEM certificate file of at most 64 KiB",
		       opt, path);
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	*out = buf;
	return 0;
}

/*
 * The API socket: a stale socket file (no daemon answers on it) is
 * replaced; a live one means another daemon: refused.
 */
static int bind_unix(struct cloned *d, const char *path, gid_t gid)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char dir[sizeof(a.sun_path)], *slash;
	int fd, probe, err;
	mode_t old;

	if (strlen(path) >= sizeof(a.sun_path)) {
		cl_log(d, HALITE_LOG_ERROR, "--socket %s: path too long (at most %zu bytes)", path,
		       sizeof(a.sun_path) - 1);
		return -1;
	}
	strcpy(a.sun_path, path);
	strcpy(dir, path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (cl_mkdir_p(dir, 0750)) {
			cl_log(d, HALITE_LOG_ERROR, "--socket: creating %s: %s", dir,
			       strerror(errno));
			return -1;
		}
		if (d->o.socket_group && socket_dir_group(d, dir, gid))
			return -1;
	}
	probe = ctl_connect(path, 1000);
	if (probe >= 0) {
		close(probe);
		cl_log(d, HALITE_LOG_ERROR, "--socket %s: another daemon is listening on it", path);
		return -1;
	}
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	/* born 0660: no moment when it is wider (no other thread runs yet) */
	old = umask(0117);
	err = fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ? errno : 0;
	umask(old);
	if (!err && ((d->o.socket_group && lchown(path, (uid_t)-1, gid)) || chmod(path, 0660) ||
		     listen(fd, 128)))
		err = errno;
	if (err) {
		cl_log(d, HALITE_LOG_ERROR, "--socket %s: %s", path, strerror(err));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/*
 * --listen ADDR:PORT into *ss: a loopback address only (the API has no
 * authentication). 0, or -1 with the sentence in @err. Checked when the
 * options are parsed, so a bad one is refused before anything is made.
 */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
			char *err, size_t errlen)
{
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	char host[64];
	const char *colon = strrchr(spec, ':');
	uint64_t port;
	size_t hl;

	memset(ss, 0, sizeof(*ss));
	if (!colon || halite_parse_u64(colon + 1, &port) || port == 0 || port > 65535 ||
	    (hl = (size_t)(colon - spec)) >= sizeof(host)) {
		snprintf(err, errlen, "--listen %s: want ADDR:PORT, PORT 1 .. 65535", spec);
		return -1;
	}
	memcpy(host, spec, hl);
	host[hl] = 0;
	if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = 0;
		memmove(host, host + 1, hl - 1);
	}
	if (!strcmp(host, "localhost"))
		strcpy(host, "127.0.0.1");
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		*len = sizeof(*in4);
		if ((ntohl(in4->sin_addr.s_addr) >> 24) != 127)
			goto not_loopback;
	} else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
			goto not_loopback;
	} else {
		snprintf(err, errlen, "--listen %s: '%s' is not an IP address", spec, host);
		return -1;
	}
	return 0;
not_loopback:
	snprintf(err, errlen, "--listen %s: loopback addresses only", spec);
	return -1;
}

static int bind_tcp(struct cloned *d, const char *spec)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	char err[256];
	int fd, one = 1;

	if (parse_listen(spec, &ss, &len, err, sizeof(err))) {
		cl_log(d, HALITE_LOG_ERROR, "%s", err);
		return -1;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 128)) {
		cl_log(d, HALITE_LOG_ERROR, "--listen %s: %s", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/*
 * One daemon per state directory: two would each reload the same templates
 * and re-attach the same clones. The lock is the kernel's, so it dies with
 * the daemon; the pid inside is for the message only.
 */
static int lock_state(struct cloned *d)
{
	char *path = cl_path(d->o.state_dir, "daemon.lock", NULL), buf[32];
	ssize_t n;
	int fd;

	fd = path ? open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
	if (fd < 0) {
		cl_log(d, HALITE_LOG_ERROR, "--state-dir %s: %s: %s", d->o.state_dir,
		       path ? path : "daemon.lock", strerror(path ? errno : ENOMEM));
		free(path);
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		int err = errno;

		n = err == EWOULDBLOCK ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
		buf[n > 0 ? n : 0] = 0;
		buf[strcspn(buf, "\n")] = 0;
		if (err == EWOULDBLOCK)
			cl_log(d, HALITE_LOG_ERROR, "--state-dir %s: another " PROG " (pid %s) runs "
			       "on it (it holds %s): stop it first, or give this one another "
			       "--state-dir", d->o.state_dir, buf[0] ? buf : "unknown", path);
		else
			cl_log(d, HALITE_LOG_ERROR, "--state-dir %s: locking %s: %s",
			       d->o.state_dir, path, strerror(err));
		close(fd);
		free(path);
		return -1;
	}
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) || pwrite(fd, buf, (size_t)n, 0) != n)
		cl_log(d, HALITE_LOG_WARN, "%s: writing the pid: %s", path, strerror(errno));
	free(path);
	d->lock_fd = fd;
	return 0;
}

static int prepare_dirs(struct cloned *d)
{
	const char *sub[] = { "templates", "clones" };
	struct statfs fs;
	char err[1024];

	if (cl_own_dir(d->o.state_dir, "--state-dir", err, sizeof(err))) {
		cl_log(d, HALITE_LOG_ERROR, "%s", err);
		return -1;
	}
	if (lock_state(d))
		return -1;
	for (int i = 0; i < 2; i++) {
		char *p = cl_path(d->o.state_dir, sub[i], NULL);
		int ret = p ? cl_own_dir(p, "--state-dir", err, sizeof(err)) : -1;

		if (ret) {
			cl_log(d, HALITE_LOG_ERROR, "%s", p ? err : "out of memory");
			free(p);
			return -1;
		}
		free(p);
	}
	if (cl_own_dir(d->o.mem_dir, "--mem-dir", err, sizeof(err))) {
		cl_log(d, HALITE_LOG_ERROR, "%s", err);
		return -1;
	}
	/*
	 * The host's LB cache: the engine opens it where it opens an s3://
	 * object, from the environment (io_s3.c), so it is set here, before
	 * any thread. Clones inherit it, as every reader on the host may share it.
	 */
	if (cl_own_dir(d->o.lbcache_dir, "--cache-dir", err, sizeof(err))) {
		cl_log(d, HALITE_LOG_ERROR, "%s", err);
		return -1;
	}
	if (setenv("HALITE_CACHE_DIR", d->o.lbcache_dir, 1) ||
	    (d->o.lbcache_size && setenv("HALITE_CACHE_SIZE", d->o.lbcache_size, 1)) ||
	    (!d->o.lbcache_size && unsetenv("HALITE_CACHE_SIZE"))) {
		cl_log(d, HALITE_LOG_ERROR, "--cache-dir: %s", strerror(errno));
		return -1;
	}
	if (statfs(d->o.mem_dir, &fs)) {
		cl_log(d, HALITE_LOG_ERROR, "--mem-dir %s: %s", d->o.mem_dir, strerror(errno));
		return -1;
	}
	if (fs.f_type != TMPFS_MAGIC) {
		cl_log(d, HALITE_LOG_ERROR,
		       "--mem-dir %s is not on tmpfs: template memory files must be (their page "
		       "cache is the clones' shared memory); use e.g. /run/halite-cloned/mem",
		       d->o.mem_dir);
		return -1;
	}
	return 0;
}

static void shutdown_registry(struct cloned *d)
{
	tmpl_save_hotsets(d, true);
	pthread_mutex_lock(&d->lock);
	while (d->clones) {
		struct clone *c = d->clones;

		d->clones = c->next;
		clone_destroy(c); /* its session only: the clone runs on */
	}
	while (d->templates) {
		struct tmpl *tp = d->templates;

		d->templates = tp->next;
		tmpl_destroy(tp);
	}
	pthread_mutex_unlock(&d->lock);
}

/*
 * What QEMU clones run and as whom, from the daemon's options alone: the
 * QEMU binary (given: an executable, made absolute; else
 * qemu-system-x86_64 from PATH), the user (given: one that exists and is
 * not root; else nobody, when it exists), the directories a recorded
 * -kernel/-initrd/-bios may come from (absolute, existing). 0, or -1 with
 * the sentence in @msg. What is missing leaves QEMU clones refused.
 */
static int qemu_confinement(struct cloned *d, char *msg, size_t len)
{
	struct cloned_opts *o = &d->o;
	struct passwd *pw;
	char *abs;

	if (o->qemu_system) {
		struct stat st;

		abs = realpath(o->qemu_system, NULL);
		if (!abs) {
			snprintf(msg, len, "--qemu-system %s: %s", o->qemu_system, strerror(errno));
			return -1;
		}
		if (stat(abs, &st) || !S_ISREG(st.st_mode) || access(abs, X_OK)) {
			snprintf(msg, len, "--qemu-system %s: not an executable file", o->qemu_system);
			free(abs);
			return -1;
		}
		o->qemu_system = abs;
	} else {
		char *path = getenv("PATH") ? strdup(getenv("PATH")) : NULL, *save = NULL;

		for (char *dir = path ? strtok_r(path, ":", &save) : NULL; dir && !o->qemu_system;
		     dir = strtok_r(NULL, ":", &save)) {
			char *p = NULL;

			if (dir[0] == '/' && asprintf(&p, "%s/qemu-system-x86_64", dir) > 0 &&
			    !access(p, X_OK))
				o->qemu_system = realpath(p, NULL);
			free(p);
		}
		free(path);
	}
	if (o->clone_user) {
		errno = 0;
		pw = getpwnam(o->clone_user);
		if (!pw) {
			snprintf(msg, len, "--clone-user %s: no such user", o->clone_user);
			return -1;
		}
		if (pw->pw_uid == 0) {
			snprintf(msg, len, "--clone-user %s: uid 0 is refused: QEMU clones run as an "
				 "unprivileged user (e.g. nobody)", o->clone_user);
			return -1;
		}
	} else if ((pw = getpwnam("nobody")) && pw->pw_uid) {
		o->clone_user = "nobody";
	}
	if (o->nqemu_dirs > CLONED_MAX_QEMU_DIRS) {
		snprintf(msg, len, "--qemu-dir: at most %d", CLONED_MAX_QEMU_DIRS);
		return -1;
	}
	for (unsigned i = 0; i < o->nqemu_dirs; i++) {
		struct stat st;

		const char *why = NULL;

		if (o->qemu_dirs[i][0] != '/')
			why = "not an absolute path";
		else if (stat(o->qemu_dirs[i], &st))
			why = strerror(errno);
		else if (!S_ISDIR(st.st_mode))
			why = "not a directory";
		if (why) {
			snprintf(msg, len, "--qemu-dir %s: %s", o->qemu_dirs[i], why);
			return -1;
		}
	}
	return 0;
}

enum { O_SOCKET = 256, O_LISTEN, O_STATE, O_MEM, O_SYNTH, O_QEMU, O_READERS, O_LAT,
       O_RATE, O_HOT, O_LOG, O_CACHE, O_CLONE_MEM, O_CLONE_CPU,
       O_QEMU_SYSTEM, O_CLONE_USER, O_QEMU_DIR, O_SNAPDIR, O_TOKEN, O_SOCKGROUP, O_ROUTES,
       O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_S3_ALLOW, O_LBCACHE_DIR, O_LBCACHE_SIZE };

/* What each option with a range takes, as the help says it. */
static const char *want_of(int c)
{
	switch (c) {
	case O_READERS: return "1 .. 64";
	case O_LAT: return "microseconds, 0 .. 10000000";
	case O_RATE: return "bytes per second";
	case O_CACHE: return "bytes, or a number with K, M or G";
	case O_LBCACHE_SIZE: return "bytes, or a number with K, M or G; above 0";
	case O_CLONE_MEM: return "bytes, or a number with K, M or G; at least 1M";
	case O_CLONE_CPU: return "CPUs, 0.01 .. 1024";
	case O_HOT: return "milliseconds, 0 .. 3600000";
	case O_LOG: return "error, warn, info or debug";
	default: return "a value";
	}
}

/* What the daemon holds besides its registry: its confinement, lists, lock and options. */
static void daemon_free(struct cloned *d)
{
	confine_fini(d);
	snapdir_free_all(d);
	s3allow_free_all(d);
	free(d->o.lbcache_dir);
	if (d->lock_fd >= 0)
		close(d->lock_fd);
	free(d->o.token);
	free(d->o.tls_cert);
	free(d->o.tls_ca);
	if (d->o.tls_key)
		explicit_bzero(d->o.tls_key, strlen(d->o.tls_key));
	free(d->o.tls_key);
	free(d->o.synth_bin);
	free(d->o.qemu_bin);
	free(d->o.qemu_system);
	free(d->o.qemu_dirs);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", 1, 0, O_SOCKET },	   { "listen", 1, 0, O_LISTEN },
		{ "state-dir", 1, 0, O_STATE },	   { "mem-dir", 1, 0, O_MEM },
		{ "synth-bin", 1, 0, O_SYNTH },	   { "readers", 1, 0, O_READERS },
		{ "read-latency-us", 1, 0, O_LAT }, { "prefetch-rate", 1, 0, O_RATE },
		{ "hot-window-ms", 1, 0, O_HOT },  { "log-level", 1, 0, O_LOG },
		{ "cache-max", 1, 0, O_CACHE },	   { "qemu-bin", 1, 0, O_QEMU },
		{ "clone-memory-max", 1, 0, O_CLONE_MEM },
		{ "clone-cpu-max", 1, 0, O_CLONE_CPU },
		{ "qemu-system", 1, 0, O_QEMU_SYSTEM },
		{ "clone-user", 1, 0, O_CLONE_USER },
		{ "qemu-dir", 1, 0, O_QEMU_DIR },
		{ "snapshot-dir", 1, 0, O_SNAPDIR },
		{ "s3-allow", 1, 0, O_S3_ALLOW },
		{ "cache-dir", 1, 0, O_LBCACHE_DIR }, { "cache-size", 1, 0, O_LBCACHE_SIZE },
		{ "token-file", 1, 0, O_TOKEN },   { "socket-group", 1, 0, O_SOCKGROUP },
		{ "list-routes", 0, 0, O_ROUTES }, { "tls-cert", 1, 0, O_TLS_CERT },
		{ "tls-key", 1, 0, O_TLS_KEY },	   { "tls-client-ca", 1, 0, O_TLS_CA },
		{ "help", 0, 0, 'h' },		   { "version", 0, 0, 'V' },
		{ 0 },
	};
	static struct cloned d = {
		.o = { .socket_path = "/run/halite-cloned/api.sock",
		       .state_dir = "/var/lib/halite-cloned",
		       /* not under world-writable /dev/shm: another user could make it first */
		       .mem_dir = "/run/halite-cloned/mem",
		       .log_level = HALITE_LOG_INFO },
		.lock = PTHREAD_MUTEX_INITIALIZER,
		.lock_fd = -1,
	};
	const char *snapdirs[16], *s3allows[16], *lbcache_dir = NULL;
	unsigned nsnapdirs = 0, ns3allows = 0;
	struct api *api = NULL;
	struct sockaddr_storage ss;
	struct rlimit rl;
	gid_t gid = (gid_t)-1;
	bool clean;
	socklen_t sslen;
	char msg[512];
	int c, ufd, tfd = -1, sig;
	uint64_t v;
	sigset_t set;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case O_SOCKET: d.o.socket_path = optarg; break;
		case O_LISTEN: d.o.listen = optarg; break;
		case O_TOKEN: d.o.token_file = optarg; break;
		case O_SOCKGROUP: d.o.socket_group = optarg; break;
		case O_TLS_CERT: d.o.tls_cert_file = optarg; break;
		case O_TLS_KEY: d.o.tls_key_file = optarg; break;
		case O_TLS_CA: d.o.tls_ca_file = optarg; break;
		case O_ROUTES:
			api_print_routes(stdout);
			return 0;
		case O_STATE: d.o.state_dir = optarg; break;
		case O_MEM: d.o.mem_dir = optarg; break;
		case O_SNAPDIR:
			if (nsnapdirs == sizeof(snapdirs) / sizeof(snapdirs[0])) {
				snprintf(msg, sizeof(msg), "--snapshot-dir: at most %zu of them",
					 sizeof(snapdirs) / sizeof(snapdirs[0]));
				goto usage_err;
			}
			snapdirs[nsnapdirs++] = optarg;
			break;
		case O_S3_ALLOW:
			if (ns3allows == sizeof(s3allows) / sizeof(s3allows[0])) {
				snprintf(msg, sizeof(msg), "--s3-allow: at most %zu of them",
					 sizeof(s3allows) / sizeof(s3allows[0]));
				goto usage_err;
			}
			s3allows[ns3allows++] = optarg;
			break;
		case O_LBCACHE_DIR: lbcache_dir = optarg; break;
		case O_LBCACHE_SIZE:
			if (halite_parse_size(optarg, &v) || !v)
				goto bad;
			d.o.lbcache_size = optarg;
			break;
		case O_SYNTH: d.o.synth_bin = strdup(optarg); break;
		case O_QEMU: d.o.qemu_bin = strdup(optarg); break;
		case O_READERS:
			if (halite_parse_u64(optarg, &v) || v < 1 || v > 64)
				goto bad;
			d.o.readers = (unsigned)v;
			break;
		case O_LAT:
			if (halite_parse_u64(optarg, &v) || v > 10000000)
				goto bad;
			d.o.read_latency_us = (uint32_t)v;
			break;
		case O_RATE:
			if (halite_parse_u64(optarg, &v))
				goto bad;
			d.o.prefetch_rate = v;
			break;
		case O_CACHE:
			if (halite_parse_size(optarg, &v))
				goto bad;
			d.o.cache_max = v;
			break;
		case O_QEMU_SYSTEM: d.o.qemu_system = optarg; break;
		case O_CLONE_USER: d.o.clone_user = optarg; break;
		case O_QEMU_DIR: {
			const char **dirs = realloc(d.o.qemu_dirs,
						    (d.o.nqemu_dirs + 1) * sizeof(*dirs));

			if (!dirs) {
				snprintf(msg, sizeof(msg), "out of memory");
				goto usage_err;
			}
			d.o.qemu_dirs = dirs;
			dirs[d.o.nqemu_dirs++] = optarg;
			break;
		}
		case O_CLONE_MEM:
			if (halite_parse_size(optarg, &v) || v < (1 << 20))
				goto bad;
			d.o.clone_memory_max = v;
			break;
		case O_CLONE_CPU: {
			char *end;

			errno = 0;
			d.o.clone_cpu_max = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(d.o.clone_cpu_max >= 0.01) ||
			    d.o.clone_cpu_max > 1024)
				goto bad;
			break;
		}
		case O_HOT:
			if (halite_parse_u64(optarg, &v) || v > 3600000)
				goto bad;
			d.o.hot_window_ms = (uint32_t)v;
			break;
		case O_LOG:
			if (!strcmp(optarg, "error"))
				d.o.log_level = HALITE_LOG_ERROR;
			else if (!strcmp(optarg, "warn"))
				d.o.log_level = HALITE_LOG_WARN;
			else if (!strcmp(optarg, "info"))
				d.o.log_level = HALITE_LOG_INFO;
			else if (!strcmp(optarg, "debug"))
				d.o.log_level = HALITE_LOG_DEBUG;
			else
				goto bad;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			return halite_cli_version(PROG);
		default:
			halite_cli_opt_error(msg, sizeof(msg), c, argc, argv, PROG);
			goto usage_err;
		}
	}
	/* Everything the options say is checked here: a mistake binds and creates nothing. */
	if (optind != argc) {
		snprintf(msg, sizeof(msg), "unexpected argument '%s' (" PROG " --help)",
			 argv[optind]);
		goto usage_err;
	}
	if (d.o.mem_dir[0] != '/' || d.o.state_dir[0] != '/' ||
	    (lbcache_dir && lbcache_dir[0] != '/')) {
		snprintf(msg, sizeof(msg), "--state-dir, --mem-dir and --cache-dir must be "
			 "absolute paths");
		goto usage_err;
	}
	for (unsigned i = 0; i < ns3allows; i++)
		if (s3allow_add(&d, s3allows[i], msg, sizeof(msg)))
			goto usage_err;
	d.o.lbcache_dir = lbcache_dir ? strdup(lbcache_dir) :
			  cl_path(d.o.state_dir, "lbcache", NULL);
	if (!d.o.lbcache_dir) {
		snprintf(msg, sizeof(msg), "out of memory");
		goto usage_err;
	}
	if (strlen(d.o.socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		snprintf(msg, sizeof(msg), "--socket %s: path too long (at most %zu bytes)",
			 d.o.socket_path, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		goto usage_err;
	}
	if (d.o.listen && parse_listen(d.o.listen, &ss, &sslen, msg, sizeof(msg)))
		goto usage_err;
	if (d.o.listen && !d.o.token_file) {
		snprintf(msg, sizeof(msg), "--listen needs --token-file PATH: TCP callers must "
			 "authenticate (e.g. openssl rand -hex 32 > PATH; chmod 600 PATH)");
		goto usage_err;
	}
	if (d.o.token_file && !d.o.listen) {
		snprintf(msg, sizeof(msg), "--token-file is for --listen (the unix socket is "
			 "guarded by its permissions: --socket-group)");
		goto usage_err;
	}
	if ((d.o.tls_cert_file || d.o.tls_key_file || d.o.tls_ca_file) &&
	    (!d.o.tls_cert_file || !d.o.tls_key_file || !d.o.tls_ca_file || !d.o.listen)) {
		snprintf(msg, sizeof(msg), "--tls-cert, --tls-key and --tls-client-ca go together, "
			 "with --listen");
		goto usage_err;
	}
	if (d.o.socket_group) {
		struct group *g = getgrnam(d.o.socket_group);

		if (g) {
			gid = g->gr_gid;
		} else if (!halite_parse_u64(d.o.socket_group, &v) && v < (gid_t)-1) {
			gid = (gid_t)v;
		} else {
			snprintf(msg, sizeof(msg), "--socket-group %s: no such group",
				 d.o.socket_group);
			goto usage_err;
		}
	}
	if (resolve_bin(&d.o.synth_bin, "halite-synth", "guest", "--synth-bin") ||
	    resolve_bin(&d.o.qemu_bin, "halite-qemu", "tools/halite-qemu", "--qemu-bin")) {
		free(d.o.synth_bin);
		free(d.o.qemu_bin);
		return 2;
	}
	if (qemu_confinement(&d, msg, sizeof(msg)))
		goto usage_err;
	if (!d.o.synth_bin)
		cl_log(&d, HALITE_LOG_WARN,
		       "halite-synth is neither next to " PROG " nor in PATH: synthetic clones "
		       "cannot start (give --synth-bin)");
	if (!d.o.qemu_bin)
		cl_log(&d, HALITE_LOG_WARN,
		       "halite-qemu is neither next to " PROG " nor in PATH: QEMU clones "
		       "cannot start (give --qemu-bin)");

	/* Before any thread: every thread inherits the mask; the monitor waits for them. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	/* a connection is a descriptor: room for API's limit and the clones' */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (d.o.token_file && read_token(&d, d.o.token_file))
		goto start_err;
	if (d.o.tls_cert_file &&
	    (read_cert(&d, "--tls-cert", d.o.tls_cert_file, &d.o.tls_cert) ||
	     read_cert(&d, "--tls-client-ca", d.o.tls_ca_file, &d.o.tls_ca) ||
	     read_private(&d, "--tls-key", d.o.tls_key_file, &d.o.tls_key)))
		goto start_err;
	for (unsigned i = 0; i < nsnapdirs; i++) {
		if (snapdir_add(&d, snapdirs[i], msg, sizeof(msg))) {
			cl_log(&d, HALITE_LOG_ERROR, "%s", msg);
			goto start_err;
		}
	}
	if (!nsnapdirs)
		cl_log(&d, HALITE_LOG_WARN, "no --snapshot-dir: templates cannot be made "
		       "(POST /templates is refused)");
	if (prepare_dirs(&d))
		goto start_err;
	/* Where clones' cgroups go; a default limit that cannot be applied is refused. */
	confine_init(&d);
	if (confine_check(&d, d.o.clone_memory_max, d.o.clone_cpu_max, msg, sizeof(msg))) {
		cl_log(&d, HALITE_LOG_ERROR, "%s (--clone-memory-max, --clone-cpu-max)", msg);
		goto start_err;
	}
	ufd = bind_unix(&d, d.o.socket_path, gid);
	if (ufd < 0)
		goto start_err;
	if (d.o.listen && (tfd = bind_tcp(&d, d.o.listen)) < 0) {
		close(ufd);
		unlink(d.o.socket_path);
		goto start_err;
	}
	/*
	 * From here on, files and directories the daemon and its clones make are
	 * theirs only (the engine's memory files, clones' logs and sockets); the
	 * API socket's mode is set on its own.
	 */
	umask(077);
	tmpl_load_all(&d);
	clones_load_all(&d);
	confine_sweep(&d);
	if (api_start(&d, ufd, tfd, &api)) {
		cl_log(&d, HALITE_LOG_ERROR, "the HTTP server did not start");
		shutdown_registry(&d);
		close(ufd);
		if (tfd >= 0)
			close(tfd);
		unlink(d.o.socket_path);
		goto start_err;
	}
	cl_log(&d, HALITE_LOG_INFO, "listening on %s%s%s (state %s, memory %s, synth %s)",
	       d.o.socket_path, d.o.listen ? " and " : "", d.o.listen ? d.o.listen : "",
	       d.o.state_dir, d.o.mem_dir, d.o.synth_bin ? d.o.synth_bin : "none");
	cl_log(&d, HALITE_LOG_INFO, "halite-qemu: %s; QEMU %s as %s", d.o.qemu_bin ? d.o.qemu_bin :
	       "none", d.o.qemu_system ? d.o.qemu_system : "none",
	       d.o.clone_user ? d.o.clone_user : "nobody (none)");

	for (;;) {
		struct timespec tick = { 0, 250 * 1000000 };

		sig = sigtimedwait(&set, NULL, &tick);
		if (sig == SIGTERM || sig == SIGINT)
			break;
		pthread_mutex_lock(&d.lock);
		clones_poll(&d);
		pthread_mutex_unlock(&d.lock);
		tmpl_save_hotsets(&d, false);
		tmpl_retry_unavailable(&d, clones_adopt);
	}
	cl_log(&d, HALITE_LOG_INFO, "%s: stopping; clones run on for the next daemon",
	       strsignal(sig));
	clean = api_stop(api, API_STOP_GRACE_MS);
	close(ufd);
	if (tfd >= 0)
		close(tfd);
	unlink(d.o.socket_path);
	/* a slow request still running uses the registry and options: the exit frees them */
	if (!clean)
		return 0;
	shutdown_registry(&d);
	daemon_free(&d);
	return 0;
start_err:
	daemon_free(&d);
	return 1;
bad:
	/* The table is not in the enum's order: its name by its value. */
	for (v = 0; lo[v].name && lo[v].val != c; v++)
		;
	snprintf(msg, sizeof(msg), "--%s '%s': want %s (" PROG " --help)", lo[v].name, optarg,
		 want_of(c));
usage_err:
	fprintf(stderr, PROG ": %s\n", msg);
	s3allow_free_all(&d);
	free(d.o.lbcache_dir);
	free(d.o.synth_bin);
	free(d.o.qemu_bin);
	return 2;
}
