// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the clones a daemon restart finds. Each is read back from
 * its clone.json, then re-attached when its process is still the clone
 * (pid and start time), kept as failed when it cannot be, or dropped; the
 * clones of a template that is unavailable wait, orphaned, until it loads.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/errors.h>

#include "cloned.h"
#include "proc.h"

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
