// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the state directory, what a restarted daemon finds.
 *
 *   STATE/daemon.lock         flock()ed by the running daemon, its pid inside
 *   STATE/templates/ID.json   {id, kind, snapshot, uuid, hotset, created}
 *   STATE/templates/ID.hot    the template's learned hot set (the engine's: a restore
 *                             trace v2, docs/restore-trace.md)
 *   STATE/clones/CID/clone.json {id, template, pid, starttime, created, ready_s,
 *                              started, host, vcpu_tids, options}
 *   STATE/clones/CID/control.sock, clone.log (the clone's stderr)
 *   MEM/ID.mem, ID.mem.fill  the template memory file (tmpfs) and its fill map
 *
 * Every JSON file is written to a temporary name and renamed: a daemon
 * killed mid-write leaves the old file or the new one. Everything the daemon
 * writes is its own: files 0600 and directories 0700 (main.c checks the
 * directories at start), temporaries made with O_EXCL|O_NOFOLLOW under a
 * random name, so no link planted there is ever followed. Records are written
 * under the registry's lock (they read the entry). At start, templates
 * are loaded first, then each clone whose process is still the one
 * recorded (pid and start time) is re-attached; the rest are dropped.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cloned.h"

static const char *const state_names[CL_NSTATES] = { "starting", "running", "done", "failed",
						     "exited", "orphaned" };

const char *clone_state_name(enum clone_state s)
{
	return state_names[s];
}

char *state_clone_dir(const struct cloned *d, const char *cid)
{
	char *p;

	if (asprintf(&p, "%s/clones/%s", d->o.state_dir, cid) < 0)
		return NULL;
	return p;
}

char *state_template_file(const struct cloned *d, const char *tid, const char *ext)
{
	char *p;

	if (asprintf(&p, "%s/templates/%s%s", d->o.state_dir, tid, ext) < 0)
		return NULL;
	return p;
}

char *state_mem_file(const struct cloned *d, const char *tid)
{
	return cl_path(d->o.mem_dir, tid, ".mem");
}

int state_write_json(const char *path, const cJSON *j)
{
	char *text = cJSON_Print(j), *tmp = NULL;
	uint64_t rnd;
	size_t n;
	int fd, ret = 0;

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) {
		free(text);
		return -EIO;
	}
	if (!text || asprintf(&tmp, "%s.%016" PRIx64 ".tmp", path, rnd) < 0) {
		free(text);
		return -ENOMEM;
	}
	n = strlen(text);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
	} else {
		/*
		 * No fsync: the rename is atomic against the daemon's death, which
		 * is what the records are for; a host crash ends the clones too.
		 */
		if (write(fd, text, n) != (ssize_t)n || write(fd, "\n", 1) != 1)
			ret = errno ? -errno : -EIO;
		close(fd);
		if (!ret && rename(tmp, path))
			ret = -errno;
		if (ret)
			unlink(tmp);
	}
	free(tmp);
	free(text);
	return ret;
}

cJSON *state_read_json(const char *path, char *err, size_t errlen)
{
	char buf[CLONED_MAX_BODY];
	ssize_t n;
	cJSON *j;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 0 || n == (ssize_t)sizeof(buf)) {
		snprintf(err, errlen, "%s: %s", path, n < 0 ? strerror(errno) : "too large");
		return NULL;
	}
	j = cJSON_ParseWithLength(buf, (size_t)n);
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		snprintf(err, errlen, "%s: not a JSON object", path);
		return NULL;
	}
	return j;
}

int state_save_template(struct cloned *d, const struct tmpl *tp)
{
	cJSON *j = cJSON_CreateObject();
	char *path = state_template_file(d, tp->id, ".json");
	int ret = -ENOMEM;

	if (j && path && cJSON_AddStringToObject(j, "id", tp->id) &&
	    cJSON_AddStringToObject(j, "kind", tp->kind == TMPL_QEMU ? "qemu" : "synthetic") &&
	    cJSON_AddStringToObject(j, "snapshot", tp->snapshot) &&
	    cJSON_AddStringToObject(j, "uuid", tp->uuid) &&
	    cJSON_AddBoolToObject(j, "hotset", tp->hotset) &&
	    cJSON_AddNumberToObject(j, "created", (double)tp->created) &&
	    cJSON_AddNumberToObject(j, "memory_max", (double)tp->memory_max) &&
	    cJSON_AddNumberToObject(j, "cpu_max", tp->cpu_max))
		ret = state_write_json(path, j);
	cJSON_Delete(j);
	free(path);
	return ret;
}

int state_save_clone(struct cloned *d, const struct clone *c)
{
	cJSON *j = cJSON_CreateObject(), *tids = cJSON_AddArrayToObject(j, "vcpu_tids");
	char *dir = state_clone_dir(d, c->id), *path = dir ? cl_path(dir, "clone.json", NULL) : NULL;
	char host[32], st[32];
	int ret = -ENOMEM;

	snprintf(host, sizeof(host), "0x%" PRIx64, c->host);
	snprintf(st, sizeof(st), "%" PRIu64, c->starttime);
	for (uint32_t i = 0; tids && i < c->nvcpus; i++)
		cJSON_AddItemToArray(tids, cJSON_CreateNumber(c->vcpu_tids[i]));
	if (j && tids && path && cJSON_AddStringToObject(j, "id", c->id) &&
	    cJSON_AddStringToObject(j, "template", c->tp->id) &&
	    cJSON_AddNumberToObject(j, "pid", c->pid) &&
	    /* a string: a 64-bit count of clock ticks is more than a double holds exactly */
	    cJSON_AddStringToObject(j, "starttime", st) &&
	    cJSON_AddNumberToObject(j, "created", (double)c->created) &&
	    cJSON_AddNumberToObject(j, "ready_s", c->ready_s) &&
	    cJSON_AddBoolToObject(j, "started", c->started) &&
	    cJSON_AddStringToObject(j, "host", host) &&
	    cJSON_AddNumberToObject(j, "accesses", (double)c->accesses) &&
	    cJSON_AddNumberToObject(j, "write_pct", c->write_pct) &&
	    cJSON_AddStringToObject(j, "pattern", c->pattern) &&
	    cJSON_AddBoolToObject(j, "premap_hot", c->premap_hot) &&
	    /* what a human reads: the loader takes neither (a restart asks the session again) */
	    cJSON_AddStringToObject(j, "state", clone_state_name(c->state)) &&
	    cJSON_AddStringToObject(j, "error", c->error) &&
	    cJSON_AddNumberToObject(j, "memory_max", (double)c->memory_max) &&
	    cJSON_AddNumberToObject(j, "cpu_max", c->cpu_max))
		ret = state_write_json(path, j);
	cJSON_Delete(j);
	free(path);
	free(dir);
	return ret;
}

/* Fields of a record: NULL, or the default, when missing or of another type. */
const char *state_jstr(const cJSON *j, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);

	return cJSON_IsString(v) ? v->valuestring : NULL;
}

double state_jnum(const cJSON *j, const char *k, double def)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);

	return cJSON_IsNumber(v) ? v->valuedouble : def;
}
