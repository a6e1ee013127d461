// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the clones API, POST (start), GET (list, show) and DELETE,
 * and a clone as the API shows it. A clone is a `halite-synth clone`
 * process (a synthetic template's) or a `halite-qemu clone` process and its
 * QEMU (a QEMU template's) mapping the template memory file privately, in a
 * session of its own (it outlives the daemon), served by a halite_session
 * on the userfaultfd it hands over on its control socket.
 *
 * Start, per request: every clone is spawned first (cheap, clone_process.c),
 * then each is attached on a thread of its own (clone_attach.c), so N clones
 * cost about one clone's time to ready. The attach threads work on their
 * own copies and publish into the registry under the lock once done; while
 * they run, the clones are "starting" (listed, not deletable). The
 * template's clone count is taken before the spawn, so it cannot be deleted
 * under them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>

#include "cloned.h"
#include "proc.h"

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
			j->ret = clone_spawn(d, j->c, dir, j->ctl, &j->out_fd, j->err,
					     sizeof(j->err));
		}
		free(dir);
	}

	pthread_t *th = calloc(count, sizeof(*th));
	bool *run = calloc(count, sizeof(*run));

	for (uint64_t i = 0; th && run && i < count; i++)
		if (!jobs[i].ret && jobs[i].out_fd >= 0)
			run[i] = !pthread_create(&th[i], NULL, clone_attach_thread, &jobs[i]);
	for (uint64_t i = 0; i < count; i++) {
		if (run && run[i])
			pthread_join(th[i], NULL);
		else if (jobs[i].out_fd >= 0)
			clone_attach_thread(&jobs[i]); /* no thread: one at a time */
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
