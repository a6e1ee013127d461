// SPDX-License-Identifier: MIT
/*
 * A new QEMU for a snapshot file (restore.c, clone.c): started paused
 * waiting for an incoming state (-S, -incoming defer, a QMP socket of
 * ours), attached once its QMP socket comes up, its device state fed as a
 * device-only incoming migration (header, CONFIGURATION, device sections,
 * EOF: no RAM section), and the file's device RAM, video memory, written
 * where the guest sees it once the state is loaded (its BAR is programmed).
 * Loading the state touches RAM: the caller's userfaultfd handler must
 * serve it by then.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "inside.h"
#include "incoming.h"

/* In the child, before exec: @fd from @path (a failure leaves @fd as it was). */
static void redirect(int fd, const char *path, int flags, int mode)
{
	int f = open(path, flags, mode);

	if (f >= 0 && f != fd) {
		dup2(f, fd);
		close(f);
	}
}

int hq_qemu_spawn(const struct hq_spawn *s, pid_t *pidp, char *err, size_t errlen)
{
	const struct hq_config *cfg = s->cfg;
	int argc = 0, pfd[2], e = 0, nenv = 0;
	char *qmp = NULL, **argv, **envp, *own_env;
	pid_t parent = getpid(), pid;
	extern char **environ;
	ssize_t n;

	while (environ[nenv])
		nenv++;
	argv = calloc((size_t)cfg->run.argc + 8, sizeof(*argv));
	envp = calloc((size_t)nenv + 2, sizeof(*envp));
	/* The user's command line rides in QEMU's environment: a save of it records it. */
	own_env = hq_config_env(cfg);
	if (!argv || !envp || !own_env || asprintf(&qmp, "unix:%s,server=on,wait=off", s->qmp) < 0) {
		free(argv);
		free(envp);
		free(own_env);
		return hq_fail(err, errlen, -ENOMEM, "out of memory", NULL);
	}
	for (int i = 0, k = 0; i <= nenv; i++) {
		size_t name = (size_t)(strchr(own_env, '=') - own_env) + 1;

		/* Ours replaces one inherited (halite-qemu run from a restored QEMU's child). */
		if (i == nenv)
			envp[k] = own_env;
		else if (strncmp(environ[i], own_env, name))
			envp[k++] = environ[i];
	}
	for (int i = 0; i < cfg->run.argc; i++)
		argv[argc++] = cfg->run.argv[i];
	argv[argc++] = "-S";
	argv[argc++] = "-incoming";
	argv[argc++] = "defer";
	argv[argc++] = "-qmp";
	argv[argc++] = qmp;
	argv[argc] = NULL;
	if (pipe2(pfd, O_CLOEXEC)) {
		e = errno;
		hq_fail(err, errlen, -e, "pipe", strerror(e));
		goto out;
	}
	pid = fork();
	if (pid < 0) {
		e = errno;
		close(pfd[0]);
		close(pfd[1]);
		hq_fail(err, errlen, -e, "fork", strerror(e));
		goto out;
	}
	if (pid == 0) {
		/* A clone's QEMU goes with it (a deleted clone is killed). */
		if (s->die_with_us) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(127);
		}
		/*
		 * Detached, QEMU outlives us: it takes no signals from our
		 * terminal and holds none of our output (a caller reading our
		 * stdout to its end would wait for QEMU too).
		 */
		if (s->detach)
			setsid();
		if (s->detach || s->die_with_us)
			redirect(STDIN_FILENO, "/dev/null", O_RDONLY, 0);
		if (s->log) {
			redirect(STDOUT_FILENO, s->log, O_WRONLY | O_CREAT | O_APPEND,
				 s->log_mode ? s->log_mode : 0644);
			dup2(STDOUT_FILENO, STDERR_FILENO);
		} else if (s->stdout_to_stderr) {
			/* Our stdout is the JSON report's alone (docs/cli.md). */
			dup2(STDERR_FILENO, STDOUT_FILENO);
		}
		/* A replayed command line's relative paths are relative to where it ran. */
		if (!cfg->cwd || !chdir(cfg->cwd))
			execvpe(argv[0], argv, envp);
		e = errno;
		if (write(pfd[1], &e, sizeof(e)) < 0)
			_exit(127);
		_exit(127);
	}
	close(pfd[1]);
	n = read(pfd[0], &e, sizeof(e));
	close(pfd[0]);
	if (n == sizeof(e)) {
		waitpid(pid, NULL, 0);
		snprintf(err, errlen, "cannot run %s%s%s: %s", argv[0], cfg->cwd ? " in " : "",
			 cfg->cwd ? cfg->cwd : "", strerror(e));
	} else {
		e = 0;
		*pidp = pid;
	}
out:
	free(qmp);
	free(argv);
	free(envp);
	free(own_env);
	return -e;
}

int hq_qemu_attach(struct hq_vm *vm, pid_t *pid, const char *sock, int timeout_ms,
		   unsigned retry_us, const char *see, int (*give_up)(void *), void *ctx,
		   char *err, size_t errlen)
{
	static const char *const need[] = { "query-cpus-fast", "human-monitor-command",
					    "migrate-incoming", "query-migrate", "cont", NULL };
	uint64_t end = hq_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int ret, st;

	for (;;) {
		ret = hq_vm_attach(vm, sock, 200, need);
		if (ret != -ETIMEDOUT && ret != -ENOENT && ret != -ECONNREFUSED)
			break;
		hq_vm_release(vm);
		if (waitpid(*pid, &st, WNOHANG) == *pid) {
			*pid = 0;
			snprintf(err, errlen, "QEMU exited (%s %d) before its QMP socket came up: "
				 "see %s", WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), see);
			return -ECHILD;
		}
		if (hq_now_ns() > end)
			return hq_fail(err, errlen, -ETIMEDOUT, "QEMU's QMP socket did not come up",
				       sock);
		if (give_up && give_up(ctx))
			return give_up(ctx);
		if (retry_us)
			usleep(retry_us);
	}
	if (ret)
		return hq_fail(err, errlen, ret, vm->err, NULL);
	if (vm->pid != *pid)
		return hq_fail(err, errlen, -EPROTO, "QMP socket answered by another process", sock);
	if (give_up)
		hq_qmp_set_abort(vm->qmp, give_up, ctx);
	return 0;
}

/*
 * All of @p to @fd (non-blocking), giving up with @give_up's reason, or
 * -ETIMEDOUT after @end (ns).
 */
static int write_all(int fd, const uint8_t *p, uint64_t len, uint64_t end,
		     int (*give_up)(void *), void *ctx)
{
	while (len) {
		struct pollfd pf = { fd, POLLOUT, 0 };
		ssize_t n;
		int ret = give_up ? give_up(ctx) : 0;

		if (ret)
			return ret;
		if (hq_now_ns() > end)
			return -ETIMEDOUT;
		ret = poll(&pf, 1, HQ_QMP_POLL_MS);
		if (ret < 0 && errno != EINTR)
			return -errno;
		if (ret <= 0)
			continue;
		/* QEMU may have closed it (a load that failed): EPIPE, not SIGPIPE. */
		n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (uint64_t)n;
	}
	return 0;
}

int hq_qemu_load_devices(struct hq_vm *vm, const char *dir, const uint8_t *dev, uint64_t len,
			 int timeout_ms, int (*give_up)(void *), void *ctx,
			 const char *no_reason, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t end;
	char uri[sizeof(sa.sun_path) + 8];
	cJSON *args, *ret_obj = NULL;
	int fd = -1, ret;

	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/in.sock", dir) >=
	    sizeof(sa.sun_path))
		return hq_fail(err, errlen, -ENAMETOOLONG, "the incoming socket's directory", dir);
	snprintf(uri, sizeof(uri), "unix:%s", sa.sun_path);
	args = cJSON_CreateObject();
	cJSON_AddStringToObject(args, "uri", uri);
	ret = hq_qmp_call(vm->qmp, "migrate-incoming", args, NULL, HQ_QMP_TIMEOUT_MS);
	if (ret)
		return hq_fail(err, errlen, ret, "migrate-incoming", hq_qmp_errmsg(vm->qmp));
	/* QEMU listens once migrate-incoming has returned. */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		ret = -errno;
		if (fd >= 0)
			close(fd);
		return hq_fail(err, errlen, ret, "connecting to QEMU's incoming socket",
			       strerror(-ret));
	}
	/* QEMU reads it as it loads: a load blocked on memory stops reading. */
	end = hq_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	ret = write_all(fd, dev, len, end, give_up, ctx);
	close(fd);
	if (ret)
		return hq_fail(err, errlen, ret, "sending the device state", ret == -ETIMEDOUT ?
			       "QEMU did not read it in time" : strerror(-ret));
	for (;;) {
		const char *st, *desc;

		ret = hq_qmp_call(vm->qmp, "query-migrate", NULL, &ret_obj, HQ_QMP_TIMEOUT_MS);
		if (ret)
			return hq_fail(err, errlen, ret, "query-migrate", hq_qmp_errmsg(vm->qmp));
		st = cJSON_GetStringValue(cJSON_GetObjectItem(ret_obj, "status"));
		if (st && !strcmp(st, "completed")) {
			cJSON_Delete(ret_obj);
			/*
			 * QEMU's answer says paused: with -S, migration.c's
			 * process_incoming_migration_bh sets the run state (paused:
			 * xen-save-devices-state stores "running" as the global state)
			 * before it marks the migration completed. So hq_vm_settle()
			 * sends cont at once and confirms after, the guest not waiting.
			 */
			vm->run_seen = -1;
			return 0;
		}
		if (st && !strcmp(st, "failed")) {
			desc = cJSON_GetStringValue(cJSON_GetObjectItem(ret_obj, "error-desc"));
			if (desc)
				snprintf(vm->qemu_err, sizeof(vm->qemu_err), "%s", desc);
			hq_fail(err, errlen, -EIO, "QEMU could not load the device state",
				desc ? desc : no_reason);
			cJSON_Delete(ret_obj);
			return -EIO;
		}
		cJSON_Delete(ret_obj);
		ret_obj = NULL;
		if (hq_now_ns() > end)
			return hq_fail(err, errlen, -ETIMEDOUT,
				       "QEMU did not finish loading the device state", NULL);
		ret = give_up ? give_up(ctx) : 0;
		if (ret)
			return ret;
		usleep(500);
	}
}

int hq_qemu_check_devram(struct hq_vm *vm, const struct hq_snapfile *f, char *err,
			 size_t errlen)
{
	char a[32], b[48];

	for (uint32_t i = 0; i < f->ndevram; i++) {
		uint64_t len = 0;
		int ret = hq_vm_ramblock(vm, f->devram[i].name, &len);

		if (ret == -ENOENT || (!ret && len != f->devram[i].length)) {
			if (ret)
				snprintf(b, sizeof(b), "has no counterpart");
			else
				snprintf(b, sizeof(b), "is %s", hq_bytes(len, a, sizeof(a)));
			snprintf(err, errlen, "the file's device RAM '%s' (%s, video memory) %s in "
				 "this QEMU: give the same display devices (-vga, -device) and their "
				 "options as at save", f->devram[i].name,
				 hq_bytes(f->devram[i].length, a, sizeof(a)), b);
			return -EINVAL;
		}
		if (ret)
			return hq_fail(err, errlen, ret, vm->err, NULL);
	}
	return 0;
}

int hq_qemu_write_devram(struct hq_vm *vm, const struct hq_snapfile *f, uint64_t *written,
			 char *err, size_t errlen)
{
	int ret;

	*written = 0;
	if (!f->ndevram)
		return 0;
	ret = hq_vm_device_ram(vm);
	if (ret)
		return hq_fail(err, errlen, ret, "finding device RAM", vm->err);
	for (uint32_t i = 0; i < f->ndevram; i++) {
		const struct hq_devram *d = NULL;
		uint64_t n = 0;

		for (uint32_t k = 0; k < vm->ndevram && !d; k++)
			if (!strcmp(vm->devram[k].name, f->devram[i].name))
				d = &vm->devram[k];
		if (!d || d->length != f->devram[i].length) {
			snprintf(err, errlen, "the file's device RAM '%s' is not where the guest can "
				 "reach it in this QEMU once the device state is loaded%s%s",
				 f->devram[i].name, vm->devram_skipped[0] ? ": " : "",
				 vm->devram_skipped);
			return -EINVAL;
		}
		ret = hq_vm_write_pages(vm, d->host, d->length, f->devram[i].copy, &n);
		if (ret)
			return hq_fail(err, errlen, ret, "writing device RAM", vm->err);
		*written += n;
	}
	return 0;
}

int hq_qemu_drop_region(struct hq_vm *vm, const struct hq_region *g, char *err, size_t errlen)
{
	int ret = hq_drop_ptes(vm, g->host, g->length);

	if (!ret)
		return 0;
	snprintf(err, errlen, "emptying guest RAM %s: madvise inside QEMU: %s", g->name,
		 ret < 0 && vm->err[0] ? vm->err : strerror(-ret));
	return ret < 0 ? ret : -EIO;
}
