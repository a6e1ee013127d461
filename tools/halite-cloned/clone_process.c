// SPDX-License-Identifier: MIT
/*
 * halite-cloned: a clone's process. Spawned (`halite-synth clone` or
 * `halite-qemu clone`, in its own session and cgroup), watched (reaped,
 * its session's end read) and, when it did not start, ended.
 *
 * Our children are reaped with waitpid by the monitor; after a daemon
 * restart they are not our children any more and are told alive by their
 * pid and start time (/proc/PID/stat field 22), never by the pid alone.
 * Nothing here kills a clone except DELETE and a clone that failed to
 * start: a daemon that stops or dies leaves them all, blocked at worst.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cloned.h"
#include "proc.h"

extern char **environ;

/* running -> done or failed, from the session (lock held). */
void clone_refresh(struct clone *c)
{
	struct halite_session_stats st;

	if (!c->s || c->state != CL_RUNNING)
		return;
	halite_session_stats(c->s, &st);
	if (st.error) {
		c->state = CL_FAILED;
		tmpl_engine_msg(c->tp, halite_session_errmsg(c->s), c->error, sizeof(c->error));
	} else if (st.done) {
		c->state = CL_DONE;
	}
}

/* Is the process still the clone we started? Reaps our own children. */

/*
 * The daemon's environment for a clone, without what is the daemon's only:
 * the object store's credentials and settings (AWS_*, HALITE_S3_*) and the
 * host's LB cache (HALITE_CACHE_*). A clone reads no snapshot: it gets its
 * memory from the daemon. NULL on ENOMEM; the strings are environ's.
 */
static char **clone_environ(void)
{
	static const char *const drop[] = { "AWS_", "HALITE_S3_", "HALITE_CACHE_" };
	size_t n = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	env = calloc(n + 1, sizeof(*env));
	if (!env)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		bool keep = true;

		for (size_t j = 0; j < sizeof(drop) / sizeof(drop[0]) && keep; j++)
			keep = strncmp(environ[i], drop[j], strlen(drop[j])) != 0;
		if (keep)
			env[k++] = environ[i];
	}
	return env;
}
static bool clone_alive(struct cloned *d, struct clone *c)
{
	uint64_t st;

	if (c->child) {
		int status;
		pid_t r = waitpid(c->pid, &status, WNOHANG);

		if (r == 0)
			return true;
		c->child = false; /* reaped (or not ours after all): never waited on again */
		if (r == c->pid && !c->error[0]) {
			if (WIFSIGNALED(status))
				snprintf(c->error, sizeof(c->error), "the clone was killed by signal %d",
					 WTERMSIG(status));
			else if (WEXITSTATUS(status))
				snprintf(c->error, sizeof(c->error), "the clone exited with status %d",
					 WEXITSTATUS(status));
		}
		confine_exited(d, c);
		return false;
	}
	if (!cl_proc_starttime(c->pid, &st) && st == c->starttime)
		return true;
	confine_exited(d, c);
	return false;
}

void clones_poll(struct cloned *d)
{
	for (struct clone *c = d->clones; c; c = c->next) {
		if (c->state == CL_STARTING || c->state == CL_EXITED)
			continue;
		clone_refresh(c);
		if (clone_alive(d, c))
			continue;
		if (c->state != CL_FAILED)
			c->state = CL_EXITED;
		if (c->s) {
			halite_session_stats(c->s, &c->last);
			halite_session_free(c->s);
			c->s = NULL;
		}
		cl_log(d, HALITE_LOG_INFO, "clone %s (pid %d) exited", c->id, (int)c->pid);
	}
}

int clone_spawn(struct cloned *d, struct clone *c, const char *dir, const char *ctl,
		int *out_fd, char *err, size_t errlen)
{
	char *mem = state_mem_file(d, c->tp->id), *log = cl_path(dir, "clone.log", NULL);
	char *args = c->tp->synth_args ? strdup(c->tp->synth_args) : NULL, *bin = d->o.synth_bin;
	char off[32], wr[16], acc[32], *save = NULL;
	char *argv[96];
	int argc = 0, p[2] = { -1, -1 }, ret = -ENOMEM;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	char **env;
	sigset_t none;
	uint64_t st;
	pid_t pid;

	if (!mem || !log || (c->tp->kind == TMPL_SYNTHETIC && !args)) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	if (c->tp->kind == TMPL_QEMU) {
		/*
		 * QEMU's command line is the snapshot's, made the clone's own by
		 * halite-qemu; which QEMU runs, as whom, and where its kernel may
		 * come from are the daemon's configuration, never the file's.
		 */
		bin = d->o.qemu_bin;
		argv[argc++] = bin;
		argv[argc++] = "clone";
		argv[argc++] = "--qemu-binary";
		argv[argc++] = d->o.qemu_system;
		argv[argc++] = "--run-as";
		argv[argc++] = (char *)d->o.clone_user;
		for (unsigned i = 0; i < d->o.nqemu_dirs; i++) { /* CLONED_MAX_QEMU_DIRS */
			argv[argc++] = "--allow-dir";
			argv[argc++] = (char *)d->o.qemu_dirs[i];
		}
		argv[argc++] = "--mem-file";
		argv[argc++] = mem;
		argv[argc++] = "--control";
		argv[argc++] = (char *)ctl;
		argv[argc++] = "--dir";
		argv[argc++] = (char *)dir;
		/* an object's frozen disks: the daemon's copies, DIR/N.qcow2 (s3disks.c) */
		if (c->tp->disk_copies) {
			argv[argc++] = "--disk-copies";
			argv[argc++] = c->tp->disk_copies;
		}
		/* the template's own file, whatever lies at its path now: dup2'd to 3 below */
		argv[argc++] = "/proc/self/fd/3";
		argv[argc] = NULL;
		goto spawn;
	}
	snprintf(off, sizeof(off), "%" PRIu64, c->tp->region_offset);
	snprintf(wr, sizeof(wr), "%u", c->write_pct);
	snprintf(acc, sizeof(acc), "%" PRIu64, c->accesses);
	argv[argc++] = d->o.synth_bin;
	argv[argc++] = "clone";
	/*
	 * The file's layout words first (checked against an allow-list when the
	 * template was made), the daemon's own options after them: the last
	 * one given wins, so no word of a file can name the memory file or the
	 * control socket.
	 */
	for (char *w = strtok_r(args, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
		if (argc > 80) {
			snprintf(err, errlen, "the template's synth.args has too many words");
			ret = -E2BIG;
			goto out;
		}
		argv[argc++] = w;
	}
	argv[argc++] = "--mem-file";
	argv[argc++] = mem;
	argv[argc++] = "--mem-offset";
	argv[argc++] = off;
	argv[argc++] = "--control";
	argv[argc++] = (char *)ctl;
	argv[argc++] = "--write";
	argv[argc++] = wr;
	argv[argc++] = "--pattern";
	argv[argc++] = c->pattern;
	if (c->accesses) {
		argv[argc++] = "--accesses";
		argv[argc++] = acc;
	}
	argv[argc] = NULL;
spawn:
	/* Its cgroup with its limits, ready before the process is. */
	if ((d->cg.mem || d->cg.cpu) && (ret = confine_create(d, c, err, errlen)))
		goto out;
	if (pipe2(p, O_CLOEXEC)) {
		ret = -errno;
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		goto out;
	}
	/*
	 * stdin /dev/null, stdout our pipe (for "ready"; once we close it the
	 * clone's writes fail with EPIPE: SIGPIPE is ignored here, and ignored
	 * signals stay ignored across exec), stderr its log. Its own session:
	 * a terminal's or a service manager's signals to the daemon's group
	 * never reach it.
	 */
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_APPEND, 0640);
	if (c->tp->kind == TMPL_QEMU)
		posix_spawn_file_actions_adddup2(&fa, c->tp->snap_fd, 3);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
	env = clone_environ();
	ret = env ? -posix_spawn(&pid, bin, &fa, &at, argv, env) : -ENOMEM;
	free(env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	close(p[1]);
	if (ret) {
		close(p[0]);
		snprintf(err, errlen, "starting %s: %s", bin, strerror(-ret));
		goto out;
	}
	if (cl_proc_starttime(pid, &st))
		st = 0; /* died at once: wait_ready() reports it */
	pthread_mutex_lock(&d->lock);
	c->pid = pid;
	c->starttime = st;
	c->child = true;
	pthread_mutex_unlock(&d->lock);
	/*
	 * Into its cgroup before it is told to start (what it maps comes only
	 * then, through the session); the processes it forks follow it.
	 */
	if ((d->cg.mem || d->cg.cpu) && (ret = confine_attach(d, c, pid, err, errlen))) {
		close(p[0]);
		goto out; /* clone_abort() ends it */
	}
	pthread_mutex_lock(&d->lock);
	ret = state_save_clone(d, c);
	pthread_mutex_unlock(&d->lock);
	if (ret) /* it runs; only a restarted daemon would not find it */
		cl_log(d, HALITE_LOG_WARN, "clone %s: writing clone.json: %s", c->id,
		       strerror(-ret));
	*out_fd = p[0];
	ret = 0;
out:
	free(args);
	free(log);
	free(mem);
	return ret;
}

/* A clone that did not start: ended, its files removed. */
void clone_abort(struct cloned *d, struct clone *c)
{
	char *dir = state_clone_dir(d, c->id);

	halite_session_free(c->s);
	c->s = NULL;
	if (c->child) {
		kill(c->pid, SIGKILL);
		waitpid(c->pid, NULL, 0);
		c->child = false;
	}
	confine_remove(d, c);
	if (dir)
		cl_rm_rf(dir);
	free(dir);
}
