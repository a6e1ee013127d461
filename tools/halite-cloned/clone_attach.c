// SPDX-License-Identifier: MIT
/*
 * halite-cloned: attaching a clone. Wait for its "ready", ask its `info`
 * (a QEMU clone's names the process whose memory is served, QEMU's pid,
 * its RAM pieces and where they sit in the template file, checked here
 * against the template's layout), take its userfaultfd (`uffd`), start a
 * halite_session on it, then `start` it. The same after a daemon restart,
 * with the session attaching to what the dead daemon left.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cloned.h"
#include "proc.h"

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
	char why[512] = "";
	int fd = -1, ret;

	so.errbuf = why;
	so.errbuf_len = sizeof(why);
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
		snprintf(err, errlen, "session: %s", why[0] ? why : cl_errstr(ret));
	return ret;
}

void *clone_attach_thread(void *arg)
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
