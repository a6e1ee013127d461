// SPDX-License-Identifier: MIT
/*
 * halite-cloned: clones. A clone is a `halite-synth clone` process (a
 * synthetic template's) or a `halite-qemu clone` process and its QEMU (a
 * QEMU template's) mapping the template memory file privately, in a
 * session of its own (it outlives the daemon), served by a halite_session
 * on the userfaultfd it hands over on its control socket. Both speak the
 * same protocol; a QEMU clone's `info` names the process whose memory is
 * served (QEMU's pid), its RAM pieces and where they sit in the template
 * file, checked here against the template's layout.
 *
 * Start, per request: every clone is spawned first (cheap), then each is
 * attached on a thread of its own (wait for "ready", `info`, `uffd`,
 * halite_session_start, `start`), so N clones cost about one clone's time to
 * ready. The attach threads work on their own copies and publish into the
 * registry under the lock once done; while they run, the clones are
 * "starting" (listed, not deletable). The template's clone count is taken
 * before the spawn, so it cannot be deleted under them.
 *
 * Processes: our children are reaped with waitpid by the monitor; after a
 * daemon restart they are not our children any more and are told alive by
 * their pid and start time (/proc/PID/stat field 22), never by the pid
 * alone. Nothing here kills a clone except DELETE and a clone that failed to
 * start: a daemon that stops or dies leaves them all, blocked at worst.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cloned.h"
#include "proc.h"

extern char **environ;

void clone_destroy(struct clone *c)
{
	if (!c)
		return;
	halite_session_free(c->s);
	free(c->vcpu_tids);
	free(c->info);
	free(c);
}

void clone_stats(struct clone *c, struct halite_session_stats *st)
{
	if (c->s)
		halite_session_stats(c->s, st);
	else
		*st = c->last;
}

/* running -> done or failed, from the session (lock held). */
static void clone_refresh(struct clone *c)
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

static void smaps_rollup(pid_t pid, uint64_t *rss, uint64_t *pss)
{
	char path[64], line[256];
	unsigned long long kb;
	FILE *f;

	*rss = *pss = 0;
	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Rss: %llu kB", &kb) == 1)
			*rss = kb << 10;
		else if (sscanf(line, "Pss: %llu kB", &kb) == 1)
			*pss = kb << 10;
	}
	fclose(f);
}

static cJSON *clone_json(struct cloned *d, struct clone *c)
{
	cJSON *j = cJSON_CreateObject();
	struct halite_session_stats st;
	uint64_t rss = 0, pss = 0;
	char *dir = state_clone_dir(d, c->id), *ctl = dir ? cl_path(dir, "control.sock", NULL) : NULL;
	char *cg = confine_path(d, c);

	clone_refresh(c);
	clone_stats(c, &st);
	if (c->state != CL_EXITED)
		smaps_rollup(c->vm_pid ? c->vm_pid : c->pid, &rss, &pss); /* a QEMU clone: QEMU's */
	cJSON_AddStringToObject(j, "id", c->id);
	cJSON_AddStringToObject(j, "template", c->tp->id);
	cJSON_AddNumberToObject(j, "pid", c->pid);
	cJSON_AddStringToObject(j, "state", clone_state_name(c->state));
	cJSON_AddNumberToObject(j, "created", (double)c->created);
	cJSON_AddNumberToObject(j, "ready_s", c->ready_s);
	cJSON_AddNumberToObject(j, "faults", (double)st.faults);
	cJSON_AddNumberToObject(j, "faults_cached", (double)st.faults_cached);
	cJSON_AddNumberToObject(j, "faults_read", (double)st.faults_read);
	cJSON_AddNumberToObject(j, "lb_read", (double)st.lb_read);
	cJSON_AddNumberToObject(j, "bytes_read", (double)st.bytes_read);
	cJSON_AddNumberToObject(j, "faults_zero", (double)st.faults_zero);
	cJSON_AddNumberToObject(j, "faults_vcpu", (double)st.faults_vcpu);
	cJSON_AddNumberToObject(j, "mb_premapped", (double)st.mb_premapped);
	cJSON_AddNumberToObject(j, "fault_p50_us", (double)st.fault_p50_ns / 1e3);
	cJSON_AddNumberToObject(j, "fault_p99_us", (double)st.fault_p99_ns / 1e3);
	cJSON_AddNumberToObject(j, "restore_s", (double)st.duration_ns / 1e9);
	cJSON_AddNumberToObject(j, "pss_bytes", (double)pss);
	cJSON_AddNumberToObject(j, "rss_bytes", (double)rss);
	cJSON_AddStringToObject(j, "control", ctl ? ctl : "");
	cJSON_AddStringToObject(j, "error", c->error);
	cJSON_AddNumberToObject(j, "memory_max", (double)c->memory_max);
	cJSON_AddNumberToObject(j, "cpu_max", c->cpu_max);
	cJSON_AddStringToObject(j, "cgroup", cg && !access(cg, F_OK) ? cg : ""); /* "": none (any more) */
	if (c->tp->kind == TMPL_QEMU) {
		cJSON *info = c->info ? cJSON_Parse(c->info) : NULL;
		static const char *const keep[] = { "forwards", "macs", "qmp", "serial", "disks",
						     NULL };

		cJSON_AddNumberToObject(j, "qemu_pid", c->vm_pid);
		for (int k = 0; info && keep[k]; k++) {
			cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(info, keep[k]);

			if (v)
				cJSON_AddItemToObject(j, keep[k], v);
		}
		cJSON_Delete(info);
	}
	free(cg);
	free(ctl);
	free(dir);
	return j;
}

/* --- start --------------------------------------------------------------- */

struct attach_job {
	struct cloned *d;
	struct clone *c;	 /* read-only here: results go below */
	char *ctl;		 /* control socket path */
	int out_fd;		 /* the clone's stdout (read end) */
	uint64_t t_request;
	/* results, published under the lock */
	int ret;
	struct halite_session *s;
	uint64_t host;
	uint32_t nvcpus;
	pid_t *tids;
	pid_t vm_pid;
	uint32_t nregs;
	struct halite_session_region regs[CLONED_MAX_REGIONS];
	char reg_names[CLONED_MAX_REGIONS][96];
	char *info;
	double ready_s;
	char err[512];
};

/* The last line of the clone's clone.log (beside its control socket @ctl), or "". */
static void clone_log_tail(const char *ctl, char *out, size_t len)
{
	char path[PATH_MAX], buf[1024];
	const char *slash = strrchr(ctl, '/');
	ssize_t n = 0;
	int fd;

	out[0] = '\0';
	if (!slash || snprintf(path, sizeof(path), "%.*s/clone.log", (int)(slash - ctl), ctl) >=
			      (int)sizeof(path))
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	off_t end = lseek(fd, 0, SEEK_END);

	if (end > 0)
		n = pread(fd, buf, sizeof(buf) - 1, end > (off_t)sizeof(buf) - 1 ?
			  end - (off_t)sizeof(buf) + 1 : 0);
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n <= 0)
		return;
	buf[n] = '\0';
	const char *last = strrchr(buf, '\n') ? strrchr(buf, '\n') + 1 : buf;
	size_t k = strlen(last) < len ? strlen(last) : len - 1;

	memcpy(out, last, k);
	out[k] = '\0';
}

static int wait_ready(struct attach_job *j)
{
	int ms = j->c->tp->kind == TMPL_QEMU ? CLONED_QEMU_READY_TIMEOUT_MS :
		 CLONED_READY_TIMEOUT_MS;
	uint64_t deadline = halite_now_ns() + (uint64_t)ms * 1000000u;
	char buf[256];
	size_t len = 0;

	for (;;) {
		struct pollfd p = { .fd = j->out_fd, .events = POLLIN };
		uint64_t now = halite_now_ns();
		ssize_t n;

		if (now >= deadline) {
			snprintf(j->err, sizeof(j->err), "no 'ready' from the clone within %d ms",
				 ms);
			return -ETIMEDOUT;
		}
		if (poll(&p, 1, (int)((deadline - now) / 1000000) + 1) < 0 && errno != EINTR)
			return -errno;
		n = read(j->out_fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0) {
			char why[384];

			/* Its own words: a refused command line names the option there. */
			clone_log_tail(j->ctl, why, sizeof(why));
			snprintf(j->err, sizeof(j->err), "the clone exited before it was ready%s%s",
				 why[0] ? ": " : " (see its clone.log)", why);
			return -ECHILD;
		}
		len += (size_t)n;
		buf[len] = 0;
		if (strstr(buf, "ready\n"))
			return 0;
		if (len == sizeof(buf) - 1) {
			snprintf(j->err, sizeof(j->err), "the clone printed '%.100s', not 'ready'",
				 buf);
			return -EPROTO;
		}
	}
}

/* What `info` says about a clone's memory, its owner and its vCPUs. */
struct clone_mem {
	uint64_t host;
	uint32_t nvcpus;
	pid_t *tids;
	pid_t vm_pid;
	uint32_t nregs; /* 0: the one region at host */
	struct halite_session_region *regs; /* CLONED_MAX_REGIONS of them */
	char (*names)[96];
	char *info;	/* a QEMU clone's whole answer */
};

static uint64_t hex_field(const cJSON *o, const char *k, bool *ok)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	*ok &= cJSON_IsString(v);
	return cJSON_IsString(v) ? strtoull(v->valuestring, NULL, 0) : 0;
}

static uint64_t num_field(const cJSON *o, const char *k, bool *ok)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);

	*ok &= cJSON_IsNumber(v) && v->valuedouble >= 0;
	return cJSON_IsNumber(v) && v->valuedouble >= 0 ? (uint64_t)v->valuedouble : 0;
}

/*
 * A QEMU clone's RAM pieces ("regions", or the one "region"): each a region
 * of the template, of its length, at its offset in the template file (the
 * clone's RAM block maps the file from 0, so its offset in the block must be
 * the template's).
 */
static int qemu_regions(const cJSON *info, struct tmpl *tp, struct clone_mem *m, char *err,
			size_t errlen)
{
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(info, "regions"), *e;
	cJSON *one = NULL;
	int ret = 0;

	if (!a) {
		one = cJSON_CreateArray();
		if (!one)
			return -ENOMEM;
		cJSON_AddItemToArray(one, cJSON_Duplicate(info, true));
		a = one;
	}
	m->nregs = 0;
	cJSON_ArrayForEach(e, a) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, one ? "region" : "name");
		uint64_t off, len, toff = 0, tlen = 0;
		bool ok = cJSON_IsString(nm);
		uint64_t host = hex_field(e, "host", &ok);

		off = num_field(e, "offset", &ok);
		len = num_field(e, one ? "mem_bytes" : "length", &ok);
		if (!ok || m->nregs == CLONED_MAX_REGIONS) {
			snprintf(err, errlen, "the clone's 'info' has %s", ok ? "too many regions" :
				 "a region without name, host, offset or length");
			ret = -EPROTO;
			break;
		}
		if (halite_template_region(tp->t, nm->valuestring, &toff, &tlen) ||
		    toff != off || tlen != len) {
			snprintf(err, errlen, "the clone's RAM '%.96s' (%" PRIu64 " bytes at offset %"
				 PRIu64 " of the memory file) is not the template's region (%" PRIu64
				 " bytes at %" PRIu64 ")", nm->valuestring, len, off, tlen, toff);
			ret = -EPROTO;
			break;
		}
		snprintf(m->names[m->nregs], sizeof(m->names[0]), "%s", nm->valuestring);
		m->regs[m->nregs] = (struct halite_session_region){
			.name = m->names[m->nregs], .host = host, .length = len };
		m->nregs++;
	}
	cJSON_Delete(one);
	return ret;
}

/* `info`: where the clone mapped the region(s), whose memory it is, its vCPU threads. */
static int clone_info(const char *ctl, struct tmpl *tp, struct clone_mem *m, char *err,
		      size_t errlen)
{
	const cJSON *h, *mem, *reg, *a, *t, *pid;
	cJSON *info;
	uint32_t n, i = 0;
	int ret;

	ret = ctl_command(ctl, "info", &info, NULL, CLONED_CTL_TIMEOUT_MS, err, errlen);
	if (ret)
		return ret;
	h = cJSON_GetObjectItemCaseSensitive(info, "host");
	mem = cJSON_GetObjectItemCaseSensitive(info, "mem_bytes");
	reg = cJSON_GetObjectItemCaseSensitive(info, "region");
	a = cJSON_GetObjectItemCaseSensitive(info, "vcpu_tids");
	pid = cJSON_GetObjectItemCaseSensitive(info, "pid");
	if (!cJSON_IsString(h) || !cJSON_IsNumber(mem) || !cJSON_IsArray(a)) {
		snprintf(err, errlen, "the clone's 'info' lacks host, mem_bytes or vcpu_tids");
		ret = -EPROTO;
		goto out;
	}
	if (tp->kind == TMPL_QEMU) {
		if (!cJSON_IsNumber(pid) || pid->valuedouble < 1) {
			snprintf(err, errlen, "the QEMU clone's 'info' lacks QEMU's pid");
			ret = -EPROTO;
			goto out;
		}
		ret = qemu_regions(info, tp, m, err, errlen);
		if (ret)
			goto out;
		m->vm_pid = (pid_t)pid->valuedouble;
		free(m->info);
		m->info = cJSON_PrintUnformatted(info);
	} else {
		if (cJSON_IsString(reg) && strcmp(reg->valuestring, tp->region)) {
			snprintf(err, errlen, "the clone maps region '%s', not %s", reg->valuestring,
				 tp->region);
			ret = -EPROTO;
			goto out;
		}
		if ((uint64_t)mem->valuedouble != tp->region_length) {
			snprintf(err, errlen,
				 "the clone maps %.0f bytes, the template's %s has %" PRIu64
				 " (wrong synth.args?)",
				 mem->valuedouble, tp->region, tp->region_length);
			ret = -EPROTO;
			goto out;
		}
		m->nregs = 0;
		m->vm_pid = 0; /* the clone's own process */
	}
	n = (uint32_t)cJSON_GetArraySize(a);
	free(m->tids);
	m->tids = n ? calloc(n, sizeof(pid_t)) : NULL;
	if (n && !m->tids) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	cJSON_ArrayForEach(t, a)
		m->tids[i++] = cJSON_IsNumber(t) ? (pid_t)t->valuedouble : 0;
	m->nvcpus = n;
	m->host = strtoull(h->valuestring, NULL, 0);
out:
	cJSON_Delete(info);
	return ret;
}

/*
 * The clone's userfaultfd without its help: found among its descriptors
 * and duplicated with pidfd_getfd(). For a re-attach when the control
 * socket does not answer: the clone serves one connection at a time, and a
 * command that touched memory nobody served (a dump while the daemon was
 * dead) holds its server until the memory comes: only a session can bring
 * it. Needs ptrace rights over the clone (the daemon runs as root).
 */
static int uffd_from_proc(pid_t pid, char *err, size_t errlen)
{
	int pfd, fd = -ENOENT, num, n;

	n = hq_proc_fds_to(pid, "anon_inode:[userfaultfd]", &num, 1);
	if (n < 0) {
		snprintf(err + strlen(err), errlen - strlen(err), "; /proc/%d/fd: %s", (int)pid,
			 strerror(-n));
		return n;
	}
	pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0 && n > 0)
		fd = (int)syscall(SYS_pidfd_getfd, pfd, num, 0);
	if (pfd < 0 || fd < 0)
		snprintf(err + strlen(err), errlen - strlen(err),
			 "; its userfaultfd not taken from /proc: %s",
			 strerror(pfd < 0 ? errno : fd == -ENOENT ? ENOENT : errno));
	if (pfd >= 0)
		close(pfd);
	return fd >= 0 ? fd : -ENOENT;
}

/* `uffd`, then a session on it: @flags HALITE_SESSION_*. */
static int clone_session(struct cloned *d, struct clone *c, const char *ctl,
			 const struct clone_mem *m, unsigned flags, struct halite_session **s,
			 char *err, size_t errlen)
{
	struct halite_session_region one = { .name = c->tp->region, .host = m->host,
					     .length = c->tp->region_length };
	const struct halite_session_region *reg = m->nregs ? m->regs : &one;
	uint32_t nreg = m->nregs ? m->nregs : 1;
	struct halite_session_opts so = { .sz = sizeof(so),
					  .owner_pid = m->vm_pid ? m->vm_pid : c->pid,
					  .vcpu_tids = m->tids, .nvcpus = m->nvcpus };
	int fd = -1, ret;

	ret = ctl_command(ctl, "uffd", NULL, &fd,
			  flags & HALITE_SESSION_ATTACH ? 1000 : CLONED_CTL_TIMEOUT_MS, err, errlen);
	if (ret && (flags & HALITE_SESSION_ATTACH)) {
		fd = uffd_from_proc(c->pid, err, errlen);
		ret = fd < 0 ? fd : 0;
	}
	if (ret)
		return ret;
	/*
	 * No hot set file: nothing learned is kept, but a relayouted snapshot's
	 * hot prefix is a hot set still, premapped as a learned one.
	 */
	if (!c->tp->hotset)
		flags |= HALITE_SESSION_NO_HOT_RECORD;
	so.owner_uffd = fd;
	so.flags = flags;
	ret = halite_session_start(s, c->tp->t, reg, nreg, &so);
	if (ret == -HALITE_E_STATE && (flags & HALITE_SESSION_ATTACH)) {
		/* killed before the first handshake: a fresh start */
		so.flags &= ~HALITE_SESSION_ATTACH;
		ret = halite_session_start(s, c->tp->t, reg, nreg, &so);
	}
	close(fd);
	if (ret)
		snprintf(err, errlen, "session: %s", cl_errstr(ret));
	return ret;
}

static void *attach_thread(void *arg)
{
	struct attach_job *j = arg;
	struct clone *c = j->c;
	unsigned flags = c->premap_hot ? HALITE_SESSION_PREMAP_HOT : 0;

	struct clone_mem m = { .regs = j->regs, .names = j->reg_names };

	j->ret = wait_ready(j);
	close(j->out_fd);
	j->out_fd = -1;
	if (!j->ret)
		j->ret = clone_info(j->ctl, c->tp, &m, j->err, sizeof(j->err));
	j->host = m.host;
	j->nvcpus = m.nvcpus;
	j->tids = m.tids;
	j->vm_pid = m.vm_pid;
	j->nregs = m.nregs;
	j->info = m.info;
	/* QEMU, forked by halite-qemu: in the cgroup already, unless it was quicker than the move */
	if (!j->ret && m.vm_pid && (j->d->cg.mem || j->d->cg.cpu))
		j->ret = confine_attach(j->d, c, m.vm_pid, j->err, sizeof(j->err));
	if (!j->ret)
		j->ret = clone_session(j->d, c, j->ctl, &m, flags, &j->s, j->err, sizeof(j->err));
	/* A QEMU clone's start loads its device state, its faults served meanwhile. */
	if (!j->ret)
		j->ret = ctl_command(j->ctl, "start", NULL, NULL, c->tp->kind == TMPL_QEMU ?
				     CLONED_QEMU_START_TIMEOUT_MS : CLONED_CTL_TIMEOUT_MS, j->err,
				     sizeof(j->err));
	j->ready_s = (double)(halite_now_ns() - j->t_request) / 1e9;
	return NULL;
}

static int spawn_clone(struct cloned *d, struct clone *c, const char *dir, const char *ctl,
		       int *out_fd, char *err, size_t errlen)
{
	char *mem = state_mem_file(d, c->tp->id), *log = cl_path(dir, "clone.log", NULL);
	char *args = c->tp->synth_args ? strdup(c->tp->synth_args) : NULL, *bin = d->o.synth_bin;
	char off[32], wr[16], acc[32], *save = NULL;
	char *argv[96];
	int argc = 0, p[2] = { -1, -1 }, ret = -ENOMEM;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
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
	ret = -posix_spawn(&pid, bin, &fa, &at, argv, environ);
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
static void clone_abort(struct cloned *d, struct clone *c)
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

static int get_uint(const cJSON *body, const char *name, uint64_t lo, uint64_t hi, uint64_t *v,
		    struct http_reply *r)
{
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(body, name);

	if (!f)
		return 0;
	if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble)) {
		reply_error(r, 400, "field '%s' must be an integer", name);
		return -1;
	}
	if (f->valuedouble < (double)lo || f->valuedouble > (double)hi) {
		reply_error(r, 400, "field '%s' is %.0f: must be %" PRIu64 "..%" PRIu64, name,
			    f->valuedouble, lo, hi);
		return -1;
	}
	*v = (uint64_t)f->valuedouble;
	return 0;
}

static void unregister(struct cloned *d, struct clone *c)
{
	for (struct clone **pp = &d->clones; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			c->tp->nclones--;
			return;
		}
}

/* The time-to-ready histogram (GET /metrics): lock held. */
static void observe_ready(struct cloned *d, double s)
{
	static const double le[] = CLONED_READY_LE;

	for (size_t i = 0; i < sizeof(le) / sizeof(le[0]); i++)
		if (s <= le[i])
			d->ready.bucket[i]++;
	d->ready.count++;
	d->ready.sum += s;
}

void clones_create(struct cloned *d, const char *tid, const cJSON *body, uint64_t t_request,
		   struct http_reply *r)
{
	static const char *const known[] = { "count", "accesses", "write_pct", "pattern",
					     "premap_hot", "memory_max", "cpu_max", NULL };
	const cJSON *pat = cJSON_GetObjectItemCaseSensitive(body, "pattern");
	const cJSON *pm = cJSON_GetObjectItemCaseSensitive(body, "premap_hot"), *f;
	uint64_t count = 1, accesses = 0, write_pct = 0, memory_max = UINT64_MAX;
	double cpu_max = -1;
	struct attach_job *jobs = NULL;
	struct tmpl *tp;
	unsigned ok = 0;
	cJSON *out, *arr;
	char first_err[600] = "";

	cJSON_ArrayForEach(f, body) {
		const char *const *k = known;

		while (*k && strcmp(*k, f->string))
			k++;
		if (!*k)
			return reply_error(r, 400,
					   "unknown field '%s' (known: count, accesses, write_pct, "
					   "pattern, premap_hot, memory_max, cpu_max)",
					   f->string);
	}
	if (get_uint(body, "count", 1, CLONED_MAX_COUNT, &count, r) ||
	    get_uint(body, "accesses", 0, UINT32_MAX * 1024ull, &accesses, r) ||
	    get_uint(body, "write_pct", 0, 100, &write_pct, r))
		return;
	if (pat && (!cJSON_IsString(pat) ||
		    (strcmp(pat->valuestring, "seq") && strcmp(pat->valuestring, "random"))))
		return reply_error(r, 400, "field 'pattern' must be \"seq\" or \"random\"");
	if (pm && !cJSON_IsBool(pm))
		return reply_error(r, 400, "field 'premap_hot' must be true or false");
	if (confine_parse_limits(body, &memory_max, &cpu_max, first_err, sizeof(first_err)))
		return reply_error(r, 400, "%s", first_err);
	jobs = calloc(count, sizeof(*jobs));
	if (!jobs)
		return reply_error(r, 500, "out of memory");

	/* Registered as starting, the template held, before anything slow. */
	pthread_mutex_lock(&d->lock);
	tp = tmpl_find(d, tid);
	if (!tp) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 404, "no template '%s'", tid);
	}
	if (tp->unavailable) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 409, "template %s is unavailable: %s", tid, tp->error);
	}
	if (tp->kind == TMPL_QEMU && (accesses || write_pct || pat)) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 400, "template %s is a QEMU guest's: its clones run the "
				   "guest, not synthetic accesses (no accesses, write_pct, pattern)",
				   tid);
	}
	if (tp->kind == TMPL_QEMU && (!d->o.qemu_system || !d->o.clone_user)) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 500, !d->o.qemu_system ?
				   "qemu-system-x86_64 not found: start " PROG " with --qemu-system PATH" :
				   "no user for QEMU clones (no user nobody): start " PROG
				   " with --clone-user USER");
	}
	if (!(tp->kind == TMPL_QEMU ? d->o.qemu_bin : d->o.synth_bin)) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 500, tp->kind == TMPL_QEMU ?
				   "halite-qemu not found: start " PROG " with --qemu-bin PATH" :
				   "halite-synth not found: start " PROG " with --synth-bin PATH");
	}
	/* The limits: the request's, else the template's, else the daemon's. */
	if (memory_max == UINT64_MAX)
		memory_max = tp->memory_max ? tp->memory_max : d->o.clone_memory_max;
	if (cpu_max < 0)
		cpu_max = tp->cpu_max > 0 ? tp->cpu_max : d->o.clone_cpu_max;
	if (confine_check(d, memory_max, cpu_max, first_err, sizeof(first_err))) {
		pthread_mutex_unlock(&d->lock);
		free(jobs);
		return reply_error(r, 400, "%s", first_err);
	}
	for (uint64_t i = 0; i < count; i++) {
		struct clone *c = calloc(1, sizeof(*c));

		if (!c || cl_random_id(c->id, 'c')) {
			free(c);
			break;
		}
		c->tp = tp;
		c->state = CL_STARTING;
		c->created = time(NULL);
		c->accesses = accesses;
		c->write_pct = (unsigned)write_pct;
		snprintf(c->pattern, sizeof(c->pattern), "%s", pat ? pat->valuestring : "seq");
		c->premap_hot = !pm || cJSON_IsTrue(pm);
		c->memory_max = memory_max;
		c->cpu_max = cpu_max;
		c->next = d->clones;
		d->clones = c;
		tp->nclones++;
		jobs[i].c = c;
	}
	pthread_mutex_unlock(&d->lock);

	for (uint64_t i = 0; i < count; i++) {
		struct attach_job *j = &jobs[i];
		char *dir;

		j->d = d;
		j->out_fd = -1;
		j->t_request = t_request;
		if (!j->c) {
			j->ret = -ENOMEM;
			snprintf(j->err, sizeof(j->err), "out of memory");
			continue;
		}
		dir = state_clone_dir(d, j->c->id);
		j->ctl = dir ? cl_path(dir, "control.sock", NULL) : NULL;
		if (!j->ctl) {
			j->ret = -ENOMEM;
			snprintf(j->err, sizeof(j->err), "out of memory");
		} else if ((j->ret = cl_mkdir_p(dir, 0750))) {
			snprintf(j->err, sizeof(j->err), "%s: %s", dir, strerror(-j->ret));
		} else {
			j->ret = spawn_clone(d, j->c, dir, j->ctl, &j->out_fd, j->err,
					     sizeof(j->err));
		}
		free(dir);
	}

	pthread_t *th = calloc(count, sizeof(*th));
	bool *run = calloc(count, sizeof(*run));

	for (uint64_t i = 0; th && run && i < count; i++)
		if (!jobs[i].ret && jobs[i].out_fd >= 0)
			run[i] = !pthread_create(&th[i], NULL, attach_thread, &jobs[i]);
	for (uint64_t i = 0; i < count; i++) {
		if (run && run[i])
			pthread_join(th[i], NULL);
		else if (jobs[i].out_fd >= 0)
			attach_thread(&jobs[i]); /* no thread: one at a time */
	}
	free(th);
	free(run);

	/* Published: states, sessions, ready times; failures ended. */
	out = cJSON_CreateObject();
	arr = cJSON_AddArrayToObject(out, "clones");
	for (uint64_t i = 0; i < count; i++) {
		struct attach_job *j = &jobs[i];
		struct clone *c = j->c;

		pthread_mutex_lock(&d->lock);
		if (!c) {
			pthread_mutex_unlock(&d->lock);
		} else if (j->ret) {
			unregister(d, c);
			pthread_mutex_unlock(&d->lock);
			c->s = j->s;
			j->s = NULL;
			cl_log(d, HALITE_LOG_ERROR, "clone %s of %s did not start: %s", c->id, tid,
			       j->err);
			clone_abort(d, c);
			clone_destroy(c);
		} else {
			c->s = j->s;
			c->host = j->host;
			c->nvcpus = j->nvcpus;
			c->vcpu_tids = j->tids;
			j->tids = NULL;
			c->vm_pid = j->vm_pid;
			c->nregs = j->nregs;
			for (uint32_t k = 0; k < j->nregs; k++) {
				memcpy(c->reg_names[k], j->reg_names[k], sizeof(c->reg_names[k]));
				c->regs[k] = j->regs[k];
				c->regs[k].name = c->reg_names[k];
			}
			c->info = j->info;
			j->info = NULL;
			c->ready_s = j->ready_s;
			c->state = CL_RUNNING;
			c->started = true;
			state_save_clone(d, c);
			observe_ready(d, c->ready_s);
			tp->hot_due_ns = halite_now_ns() + (d->o.hot_window_ms ? d->o.hot_window_ms : 2000) *
								1000000ull + 500000000ull;
			cJSON *o = cJSON_CreateObject();

			cJSON_AddStringToObject(o, "id", c->id);
			cJSON_AddNumberToObject(o, "pid", c->pid);
			cJSON_AddNumberToObject(o, "ready_s", c->ready_s);
			cJSON_AddItemToArray(arr, o);
			pthread_mutex_unlock(&d->lock);
			ok++;
			cl_log(d, HALITE_LOG_INFO, "clone %s of %s: pid %d, ready in %.1f ms", c->id,
			       tid, (int)c->pid, c->ready_s * 1e3);
		}
		if (j->ret && !first_err[0])
			snprintf(first_err, sizeof(first_err), "%s", j->err);
		free(j->tids);
		free(j->info);
		free(j->ctl);
	}
	free(jobs);
	if (!ok) {
		cJSON_Delete(out);
		return reply_error(r, 500, "no clone started: %s", first_err);
	}
	if (ok < count) {
		cJSON_AddStringToObject(out, "error", first_err);
		cJSON_AddNumberToObject(out, "failed", (double)(count - ok));
	}
	reply_json(r, 201, out);
}

/* --- re-attach after a daemon restart ------------------------------------- */

int clone_reattach(struct cloned *d, struct clone *c, char *err, size_t errlen)
{
	char *dir = state_clone_dir(d, c->id), *ctl = dir ? cl_path(dir, "control.sock", NULL) : NULL;
	int ret = -ENOMEM;

	if (!ctl) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	struct clone_mem m = { .host = c->host, .nvcpus = c->nvcpus, .tids = c->vcpu_tids,
			       .regs = c->regs, .names = c->reg_names };

	/* A QEMU clone's pid and RAM pieces are not in clone.json: asked again. */
	if (!c->host || c->tp->kind == TMPL_QEMU) {
		ret = clone_info(ctl, c->tp, &m, err, errlen);
		c->vcpu_tids = m.tids;
		if (!m.tids)
			c->nvcpus = 0;
		if (ret)
			goto out;
		c->host = m.host;
		c->nvcpus = m.nvcpus;
		c->vm_pid = m.vm_pid;
		c->nregs = m.nregs;
		free(c->info);
		c->info = m.info;
	}
	ret = clone_session(d, c, ctl, &m, HALITE_SESSION_ATTACH, &c->s, err, errlen);
	if (!ret && !c->started) {
		ret = ctl_command(ctl, "start", NULL, NULL, CLONED_CTL_TIMEOUT_MS, err, errlen);
		c->started = !ret;
	}
	if (!ret) {
		c->state = CL_RUNNING;
		state_save_clone(d, c);
	}
out:
	free(ctl);
	free(dir);
	return ret;
}

/* --- list, show, delete ---------------------------------------------------- */

void clones_list(struct cloned *d, struct http_reply *r)
{
	cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "clones");

	pthread_mutex_lock(&d->lock);
	clones_poll(d);
	for (struct clone *c = d->clones; c; c = c->next)
		cJSON_AddItemToArray(a, clone_json(d, c));
	pthread_mutex_unlock(&d->lock);
	reply_json(r, 200, j);
}

static struct clone *clone_find(struct cloned *d, const char *id)
{
	for (struct clone *c = d->clones; c; c = c->next)
		if (!strcmp(c->id, id))
			return c;
	return NULL;
}

void clones_show(struct cloned *d, const char *id, struct http_reply *r)
{
	struct clone *c;

	pthread_mutex_lock(&d->lock);
	clones_poll(d);
	c = clone_find(d, id);
	if (c)
		reply_json(r, 200, clone_json(d, c));
	else
		reply_error(r, 404, "no clone '%s'", id);
	pthread_mutex_unlock(&d->lock);
}

void clones_delete(struct cloned *d, const char *id, struct http_reply *r)
{
	struct halite_session_stats st;
	struct clone *c;
	uint64_t t;
	char *dir;

	pthread_mutex_lock(&d->lock);
	c = clone_find(d, id);
	if (!c) {
		pthread_mutex_unlock(&d->lock);
		return reply_error(r, 404, "no clone '%s'", id);
	}
	if (c->state == CL_STARTING) {
		pthread_mutex_unlock(&d->lock);
		return reply_error(r, 409, "clone %s is starting: delete it once it runs", id);
	}
	clone_stats(c, &st);
	d->retired_cached += st.faults_cached;
	d->retired_read += st.faults_read;
	d->retired_zero += st.faults_zero;
	unregister(d, c);
	pthread_mutex_unlock(&d->lock);

	/* Not ours any more: the session first, so nothing serves a dying clone. */
	halite_session_free(c->s);
	c->s = NULL;
	if (c->child) {
		kill(c->pid, SIGKILL);
		waitpid(c->pid, NULL, 0);
	} else if (!cl_proc_starttime(c->pid, &t) && t == c->starttime) {
		kill(c->pid, SIGKILL); /* not our child (a restart): init reaps it */
	}
	confine_remove(d, c); /* what is left in it (QEMU) killed first */
	dir = state_clone_dir(d, c->id);
	if (dir)
		cl_rm_rf(dir);
	free(dir);
	cl_log(d, HALITE_LOG_INFO, "clone %s (pid %d) deleted", c->id, (int)c->pid);
	clone_destroy(c);
	cJSON *j = cJSON_CreateObject();

	cJSON_AddStringToObject(j, "deleted", id);
	reply_json(r, 200, j);
}

static struct clone *clone_from_json(struct cloned *d, const char *cid, const cJSON *j, char *err,
				     size_t errlen)
{
	const char *tid = state_jstr(j, "template"), *st = state_jstr(j, "starttime"), *host = state_jstr(j, "host");
	const char *pat = state_jstr(j, "pattern");
	const cJSON *tids = cJSON_GetObjectItemCaseSensitive(j, "vcpu_tids"), *t;
	struct clone *c;
	struct tmpl *tp;

	tp = tid ? tmpl_find(d, tid) : NULL;
	if (!tp) {
		snprintf(err, errlen, "its template %s is not loaded", tid ? tid : "(none)");
		return NULL;
	}
	if (!st || !host || state_jnum(j, "pid", 0) < 1) {
		snprintf(err, errlen, "clone.json lacks pid, starttime or host");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	memcpy(c->id, cid, sizeof(c->id));
	c->tp = tp;
	c->pid = (pid_t)state_jnum(j, "pid", 0);
	c->starttime = strtoull(st, NULL, 10);
	c->host = strtoull(host, NULL, 0);
	c->created = (int64_t)state_jnum(j, "created", 0);
	c->ready_s = state_jnum(j, "ready_s", 0);
	c->started = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "started"));
	c->accesses = (uint64_t)state_jnum(j, "accesses", 0);
	c->write_pct = (unsigned)state_jnum(j, "write_pct", 0);
	snprintf(c->pattern, sizeof(c->pattern), "%s", pat ? pat : "seq");
	c->premap_hot = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "premap_hot"));
	c->state = CL_STARTING;
	c->nvcpus = (uint32_t)cJSON_GetArraySize(tids);
	c->vcpu_tids = c->nvcpus ? calloc(c->nvcpus, sizeof(pid_t)) : NULL;
	if (c->nvcpus && !c->vcpu_tids) {
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	uint32_t i = 0;
	cJSON_ArrayForEach(t, tids)
		c->vcpu_tids[i++] = cJSON_IsNumber(t) ? (pid_t)t->valuedouble : 0;
	return c;
}

/* At start, after the templates: every clone still alive, re-attached; the rest dropped. */
void clones_load_all(struct cloned *d)
{
	char *dir = cl_path(d->o.state_dir, "clones", NULL);
	DIR *dh = dir ? opendir(dir) : NULL;
	struct dirent *e;

	while (dh && (e = readdir(dh))) {
		char err[1024] = "", *cdir, *path;
		struct clone *c = NULL;
		uint64_t st;
		cJSON *j;

		if (!cl_valid_id(e->d_name, 'c'))
			continue;
		cdir = cl_path(dir, e->d_name, NULL);
		path = cdir ? cl_path(cdir, "clone.json", NULL) : NULL;
		j = path ? state_read_json(path, err, sizeof(err)) : NULL;
		if (j)
			c = clone_from_json(d, e->d_name, j, err, sizeof(err));
		cJSON_Delete(j);
		free(path);
		if (c && c->tp->unavailable) {
			/*
			 * Nobody can serve it: listed with the reason, its record kept,
			 * re-attached once the template loads again (clones_adopt).
			 */
			bool alive = !cl_proc_starttime(c->pid, &st) && st == c->starttime;

			c->state = alive ? CL_ORPHANED : CL_EXITED;
			snprintf(c->error, sizeof(c->error), "%stemplate %s is unavailable: %.400s",
				 alive ? "" : "its process is gone; its ", c->tp->id, c->tp->error);
			cl_log(d, HALITE_LOG_WARN, "clone %s (pid %d) %s: %s", c->id, (int)c->pid,
			       clone_state_name(c->state), c->error);
		} else if (c && (cl_proc_starttime(c->pid, &st) || st != c->starttime)) {
			snprintf(err, sizeof(err), "its process %d is gone", (int)c->pid);
			clone_destroy(c);
			c = NULL;
		} else if (c && clone_reattach(d, c, err, sizeof(err))) {
			/*
			 * Alive but not attachable: kept as failed, so that its
			 * process (blocked, never reading zeros) is visible and
			 * DELETE ends it.
			 */
			c->state = CL_FAILED;
			snprintf(c->error, sizeof(c->error), "re-attach: %.480s", err);
			cl_log(d, HALITE_LOG_ERROR, "clone %s (pid %d) not re-attached: %s",
			       c->id, (int)c->pid, err);
		} else if (c) {
			cl_log(d, HALITE_LOG_INFO, "clone %s (pid %d) re-attached", c->id,
			       (int)c->pid);
		}
		if (!c) {
			cl_log(d, HALITE_LOG_WARN, "clone %s dropped: %s", e->d_name, err);
			if (cdir)
				cl_rm_rf(cdir);
		} else {
			c->tp->nclones++;
			c->next = d->clones;
			d->clones = c;
		}
		free(cdir);
	}
	if (dh)
		closedir(dh);
	free(dir);
}

/*
 * @tp loaded again (the monitor's retry, lock held): its orphaned clones
 * re-attached. Under the lock like the rest of the registry's changes: a
 * rare event, each bounded by the control socket's timeouts.
 */
void clones_adopt(struct cloned *d, struct tmpl *tp)
{
	for (struct clone *c = d->clones; c; c = c->next) {
		char err[512] = "";
		uint64_t st;

		if (c->tp != tp || c->state != CL_ORPHANED)
			continue;
		if (cl_proc_starttime(c->pid, &st) || st != c->starttime) {
			c->state = CL_EXITED;
			continue;
		}
		c->error[0] = 0;
		if (clone_reattach(d, c, err, sizeof(err))) {
			c->state = CL_FAILED;
			snprintf(c->error, sizeof(c->error), "re-attach: %.480s", err);
			cl_log(d, HALITE_LOG_ERROR, "clone %s (pid %d) not re-attached: %s", c->id,
			       (int)c->pid, err);
		} else {
			cl_log(d, HALITE_LOG_INFO, "clone %s (pid %d) re-attached", c->id,
			       (int)c->pid);
		}
	}
}
