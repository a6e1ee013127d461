// SPDX-License-Identifier: MIT
/*
 * halite-cloned: templates. A template is a snapshot file opened with
 * halite_template_open() on its memory file MEM/ID.mem, with its hot set
 * at STATE/templates/ID.hot. The snapshot is a file of a --snapshot-dir,
 * or an object s3://BUCKET/KEY of an --s3-allow location, read through the
 * host's LB cache (--cache-dir). What kind of guest a snapshot holds is read
 * from its metadata: `synth.args` (halite-synth save) is a synthetic guest
 * (clones: halite-synth clone), `qemu.*` (halite-qemu save) a QEMU guest
 * (clones: halite-qemu clone, given the snapshot as descriptor 3: for an
 * object, a memfd of what they read, s3clone.c, and its frozen disks from
 * the store in the host's cache, s3disks.c).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/format.h>

#include "cloned.h"
#include "s3.h"

void tmpl_destroy(struct tmpl *tp)
{
	if (!tp)
		return;
	halite_template_free(tp->t);
	if (tp->snap_fd > 0)
		close(tp->snap_fd);
	free(tp->snapshot);
	free(tp->synth_args);
	free(tp->hot_path);
	s3disks_free(tp);
	free(tp);
}

/*
 * The path the engine and the reader open: the descriptor the template holds,
 * so they get the very file checked at POST, whatever happens at its path.
 */
static void fd_path(const struct tmpl *tp, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d", tp->snap_fd);
}

/*
 * What the reader and the engine open: an object's URL as checked (the
 * object is pinned to its ETag by the reader, so it too stays the one
 * checked), else the descriptor's path in @buf.
 */
static const char *snap_path(const struct tmpl *tp, char *buf, size_t len)
{
	if (tp->s3)
		return tp->snapshot;
	fd_path(tp, buf, len);
	return buf;
}

/*
 * The engine's message @msg with the descriptor's path put back as the
 * snapshot's name (what the operator knows it by), into @out.
 */
void tmpl_engine_msg(const struct tmpl *tp, const char *msg, char *out, size_t len)
{
	char path[32];
	const char *at;
	size_t n;

	fd_path(tp, path, sizeof(path));
	n = strlen(path);
	at = tp->snap_fd > 0 ? strstr(msg, path) : NULL;
	if (!at || (at[n] >= '0' && at[n] <= '9')) {
		snprintf(out, len, "%s", msg);
		return;
	}
	snprintf(out, len, "%.*s%s%s", (int)(at - msg), msg, tp->snapshot, at + n);
}

struct tmpl *tmpl_find(struct cloned *d, const char *id)
{
	for (struct tmpl *tp = d->templates; tp; tp = tp->next)
		if (!strcmp(tp->id, id))
			return tp;
	return NULL;
}

/*
 * The HTTP status of a snapshot that did not open with @err: a file the
 * reader refused is the request's fault (400), and so is an object that is
 * not there; a store that failed to answer is 502, and the daemon's own
 * S3 configuration or credentials (none, or refused) are 500.
 */
static unsigned open_status(int err)
{
	switch (-err) {
	case HALITE_S3_E_URL:
	case HALITE_S3_E_NO_SUCH_KEY:
	case HALITE_S3_E_NO_SUCH_BUCKET:
	case HALITE_S3_E_CHANGED:
		return 400;
	case HALITE_S3_E_STORE:
	case HALITE_S3_E_NETWORK:
	case HALITE_S3_E_PROTOCOL:
		return 502;
	case HALITE_S3_E_CONFIG:
	case HALITE_S3_E_DENIED:
		return 500;
	}
	return err <= -HALITE_E_BASE && err > -HALITE_E_STATE ? 400 : 500;
}

/*
 * The HTTP status of an object's disks that did not come (s3disks_bring()):
 * none in the store, a record or manifest that does not fit the snapshot,
 * are the request's fault; the rest is the store's or the host's.
 */
static unsigned disks_status(int err)
{
	if (err == -HALITE_E_UNSUPPORTED || err == -EPROTO || err == -ENOENT || err == -E2BIG)
		return 400;
	return open_status(err);
}

/*
 * What the snapshot is, from its metadata: synth.args (halite-synth save)
 * is a synthetic guest, *args set, region pc.ram; qemu.* (halite-qemu save)
 * a QEMU guest, whose guest RAM is every region but its device RAM
 * (qemu.device-ram, video memory the clone writes itself): tp->region is
 * the first. @uuid: the file's. Read through tp->snap_fd. 0, or an HTTP
 * status with @err: 400 for a file that is not a snapshot or not one this
 * daemon knows.
 */
static unsigned classify(struct tmpl *tp, char uuid[33], struct halite_reader **keep, char *err,
			 size_t errlen)
{
	const char *snapshot = tp->snapshot, *devram = NULL;
	HALITE_OPTS(halite_reader_opts, ro);
	const struct halite_file_info *fi;
	uint32_t devram_len = 0;
	char why[600];
	struct halite_reader *r;
	bool qemu = false;
	char path[64];
	int ret;

	ro.errbuf = why;
	ro.errbuf_len = sizeof(why);
	why[0] = 0;
	ret = halite_reader_open(&r, snap_path(tp, path, sizeof(path)), &ro);
	if (ret && tp->s3 && why[0]) {
		/* the store's own words (they name the URL): what failed and where */
		snprintf(err, errlen, "snapshot %s", why);
		return open_status(ret);
	}
	if (ret) {
		snprintf(err, errlen, "snapshot %s: %s", snapshot, cl_errstr(ret));
		return tp->s3 ? open_status(ret) : 400;
	}
	fi = halite_reader_info(r);
	for (int i = 0; i < 16; i++)
		snprintf(uuid + 2 * i, 3, "%02x", fi->uuid[i]);
	tp->cache_need = fi->mb_stored * fi->mb_size; /* known before the memory file is */
	free(tp->synth_args);
	tp->synth_args = NULL;
	for (uint32_t i = 0; i < halite_reader_meta_count(r); i++) {
		const char *key;
		const void *val;
		uint32_t len;

		if (halite_reader_meta(r, i, &key, &val, &len))
			continue;
		if (!strcmp(key, "synth.args") && !tp->synth_args)
			tp->synth_args = strndup(val, len);
		if (!strncmp(key, "qemu.", 5))
			qemu = true;
		if (!strcmp(key, "qemu.device-ram") && len && !((const char *)val)[len - 1]) {
			devram = val;
			devram_len = len;
		}
	}
	if (!tp->synth_args && qemu) {
		tp->kind = TMPL_QEMU;
		tp->region[0] = '\0';
		for (uint32_t i = 0; i < halite_reader_info(r)->region_count; i++) {
			const struct halite_region_info *ri = halite_reader_region(r, i);

			if (!cl_in_list(devram, devram_len, ri->name)) {
				snprintf(tp->region, sizeof(tp->region), "%s", ri->name);
				break;
			}
		}
		if (!tp->region[0]) {
			halite_reader_free(r);
			snprintf(err, errlen, "snapshot %s has no guest RAM region", snapshot);
			return 400;
		}
		*keep = r;
		return 0;
	}
	if (!tp->synth_args) {
		snprintf(err, errlen,
			 "snapshot %s has no synth.args metadata: not a synthetic guest's snapshot "
			 "(halite-synth save) nor a QEMU guest's (halite-qemu save)",
			 snapshot);
		halite_reader_free(r);
		return 400;
	}
	tp->kind = TMPL_SYNTHETIC;
	/* Words of a file the daemon did not write, on a root process's command line. */
	if (confine_synth_args_check(tp->synth_args, why, sizeof(why))) {
		snprintf(err, errlen, "snapshot %s: %s", snapshot, why);
		free(tp->synth_args);
		tp->synth_args = NULL;
		halite_reader_free(r);
		return 400;
	}
	snprintf(tp->region, sizeof(tp->region), "%s", CLONED_REGION);
	if (halite_reader_find_region(r, CLONED_REGION) < 0) {
		snprintf(err, errlen, "snapshot %s has no region %s", snapshot, CLONED_REGION);
		free(tp->synth_args);
		tp->synth_args = NULL;
		halite_reader_free(r);
		return 400;
	}
	*keep = r;
	return 0;
}

/* The decoded blocks of the loaded templates but @skip (lock held). */
static uint64_t cache_used(struct cloned *d, const struct tmpl *skip, unsigned *n)
{
	uint64_t used = 0;

	*n = 0;
	for (struct tmpl *o = d->templates; o; o = o->next)
		if (o != skip && !o->unavailable) {
			used += o->cache_need;
			(*n)++;
		}
	return used;
}

/*
 * Opens the template: its snapshot through the snapshot directories (unless
 * tp->snap_fd is open already), what it is, then the engine on its memory
 * file. @reload (a recorded template, at start or the monitor's retry): the
 * file's uuid must be the recorded tp->uuid and the template must fit
 * --cache-max, both checked before the memory file is touched (its clones
 * may map it), and the engine is told never to start that file over.
 * Returns 0, or an HTTP status with @err; on failure the snapshot is closed.
 */
unsigned tmpl_open(struct cloned *d, struct tmpl *tp, bool reload, char *err, size_t errlen)
{
	char *mem = state_mem_file(d, tp->id);
	char *hot = tp->hotset ? state_template_file(d, tp->id, ".hot") : NULL;
	struct halite_template_opts o = {
		.sz = sizeof(o),
		.flags = reload ? HALITE_TEMPLATE_NO_RESET : 0,
		.readers = d->o.readers,
		.read_latency_us = d->o.read_latency_us,
		.prefetch_min_rate = d->o.prefetch_rate,
		.hotset_path = hot,
		.hot_window_ms = d->o.hot_window_ms,
		.log = cl_engine_log,
		.log_ctx = d,
		.log_level = d->o.log_level,
	};
	const struct halite_file_info *fi;
	struct halite_reader *checked = NULL; /* classify()'s, for the engine (same_as) */
	char uuid[33], path[64];
	unsigned status = 500;
	int ret;

	if (!mem || (tp->hotset && !hot)) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	tp->s3 = s3allow_is_url(tp->snapshot);
	if (tp->s3) {
		/* Checked at every open: a location the operator no longer allows is not read. */
		status = s3allow_check(d, tp->snapshot, err, errlen);
		if (status)
			goto out;
	} else if (tp->snap_fd <= 0) {
		status = snapdir_open(d, tp->snapshot, &tp->snap_fd, err, errlen);
		if (status)
			goto out;
	}
	status = classify(tp, uuid, &checked, err, errlen);
	if (status)
		goto out;
	if (reload && tp->uuid[0] && strcmp(uuid, tp->uuid)) {
		snprintf(err, errlen, "snapshot %s was replaced: uuid %s, the template's is %s "
			 "(put that file back, or delete the template)", tp->snapshot, uuid, tp->uuid);
		status = 409;
		goto out;
	}
	memcpy(tp->uuid, uuid, sizeof(tp->uuid));
	if (reload && d->o.cache_max) {
		unsigned n;
		uint64_t used;

		pthread_mutex_lock(&d->lock);
		used = cache_used(d, tp, &n);
		pthread_mutex_unlock(&d->lock);
		if (used + tp->cache_need > d->o.cache_max) {
			snprintf(err, errlen, "the template cache would exceed --cache-max: "
				 "%llu MiB held by %u template(s), this one needs %llu MiB of %llu MiB "
				 "(delete a template, or start the daemon with a larger --cache-max)",
				 (unsigned long long)(used >> 20), n,
				 (unsigned long long)(tp->cache_need >> 20),
				 (unsigned long long)(d->o.cache_max >> 20));
			status = 507;
			goto out;
		}
	}
	if (tp->s3 && tp->kind == TMPL_QEMU) {
		/*
		 * Its frozen disks into the host's cache (s3disks.c), checked at
		 * every open; before the engine, which may touch the memory file.
		 */
		ret = s3disks_bring(tp, checked, err, errlen);
		if (ret) {
			status = disks_status(ret);
			goto out;
		}
	}
	/* The version classify() read, without opening an object again. */
	o.same_as = checked;
	ret = halite_template_open(&tp->t, snap_path(tp, path, sizeof(path)), mem, &o);
	halite_reader_free(checked);
	checked = NULL;
	if (ret) {
		snprintf(err, errlen, "snapshot %s: %s", tp->snapshot, cl_errstr(ret));
		status = open_status(ret);
		goto out;
	}
	ret = halite_template_region(tp->t, tp->region, &tp->region_offset, &tp->region_length);
	if (ret) {
		snprintf(err, errlen, "snapshot %s has no region %s", tp->snapshot, tp->region);
		halite_template_free(tp->t);
		tp->t = NULL;
		status = 400;
		goto out;
	}
	fi = halite_reader_info(halite_template_reader(tp->t));
	for (int i = 0; i < 16; i++)
		snprintf(uuid + 2 * i, 3, "%02x", fi->uuid[i]);
	if (strcmp(uuid, tp->uuid)) {
		/* Not an object's (the engine reads classify()'s version): a file replaced since. */
		snprintf(err, errlen, "snapshot %s was replaced while it was opened: uuid %s, then "
			 "%s (try again)", tp->snapshot, tp->uuid, uuid);
		halite_template_free(tp->t);
		tp->t = NULL;
		status = 409;
		goto out;
	}
	if (tp->s3 && tp->kind == TMPL_QEMU) {
		/* What its clones read as descriptor 3 (s3clone.c): made again at every open. */
		if (tp->snap_fd > 0)
			close(tp->snap_fd);
		tp->snap_fd = 0;
		ret = s3clone_make(tp, &tp->snap_fd, err, errlen);
		if (ret) {
			halite_template_free(tp->t);
			tp->t = NULL;
			status = open_status(ret);
			goto out;
		}
	}
	free(tp->hot_path);
	tp->hot_path = hot; /* shown: the trace `halite-inspect relayout --trace` takes */
	hot = NULL;
	tp->memory_bytes = fi->memory_bytes;
	tp->stored_bytes = fi->stored_bytes;
	tp->cache_need = fi->mb_stored * fi->mb_size;
	status = 0;
out:
	if (status && tp->snap_fd > 0) {
		close(tp->snap_fd);
		tp->snap_fd = 0;
	}
	if (status)
		s3disks_free(tp); /* its clones run on nothing a failed open brought */
	halite_reader_free(checked);
	free(mem);
	free(hot);
	return status;
}

bool tmpl_store_stats(const struct tmpl *tp, struct halite_store_stats *st)
{
	if (!tp->s3 || !tp->t)
		return false;
	halite_reader_store_stats(halite_template_reader(tp->t), st);
	return true;
}

/* "store": what the template's reader asked of the object store and the host's LB cache. */
static void store_json(cJSON *j, const struct tmpl *tp)
{
	struct halite_store_stats st;
	cJSON *s;

	if (!tmpl_store_stats(tp, &st)) {
		cJSON_AddNullToObject(j, "store"); /* a local file, or not open */
		return;
	}
	s = cJSON_AddObjectToObject(j, "store");
	cJSON_AddNumberToObject(s, "requests", (double)st.requests);
	cJSON_AddNumberToObject(s, "retries", (double)st.retries);
	cJSON_AddNumberToObject(s, "bytes", (double)st.bytes);
	cJSON_AddNumberToObject(s, "connects", (double)st.connects);
	cJSON_AddBoolToObject(s, "cached", st.cached);
	cJSON_AddNumberToObject(s, "cache_hits", (double)st.cache_hits);
	cJSON_AddNumberToObject(s, "cache_misses", (double)st.cache_misses);
	cJSON_AddNumberToObject(s, "cache_bytes_hit", (double)st.cache_bytes_hit);
	cJSON_AddNumberToObject(s, "cache_puts", (double)st.cache_puts);
	cJSON_AddNumberToObject(s, "cache_put_errors", (double)st.cache_put_errors);
	cJSON_AddNumberToObject(s, "cache_evictions", (double)st.cache_evictions);
}

cJSON *tmpl_json(struct tmpl *tp, bool detail)
{
	cJSON *j = cJSON_CreateObject();
	struct halite_template_stats st;

	cJSON_AddStringToObject(j, "id", tp->id);
	cJSON_AddStringToObject(j, "kind", tp->kind == TMPL_QEMU ? "qemu" : "synthetic");
	cJSON_AddStringToObject(j, "snapshot", tp->snapshot);
	cJSON_AddStringToObject(j, "uuid", tp->uuid);
	cJSON_AddStringToObject(j, "state", tp->unavailable ? "unavailable" : "ready");
	if (tp->unavailable)
		cJSON_AddStringToObject(j, "error", tp->error);
	cJSON_AddNumberToObject(j, "memory_bytes", (double)tp->memory_bytes);
	cJSON_AddNumberToObject(j, "stored_bytes", (double)tp->stored_bytes);
	cJSON_AddBoolToObject(j, "hotset", tp->hotset);
	if (tp->hot_path)
		cJSON_AddStringToObject(j, "hotset_path", tp->hot_path);
	else
		cJSON_AddNullToObject(j, "hotset_path");
	cJSON_AddNumberToObject(j, "created", (double)tp->created);
	cJSON_AddNumberToObject(j, "clones", tp->nclones);
	if (tp->synth_args)
		cJSON_AddStringToObject(j, "synth_args", tp->synth_args);
	cJSON_AddStringToObject(j, "region", tp->region);
	cJSON_AddNumberToObject(j, "memory_max", (double)tp->memory_max);
	cJSON_AddNumberToObject(j, "cpu_max", tp->cpu_max);
	if (!detail)
		return j;
	store_json(j, tp);
	s3disks_json(j, tp);
	halite_template_stats(tp->t, &st);
	cJSON *s = cJSON_AddObjectToObject(j, "stats");
	cJSON_AddNumberToObject(s, "mb_total", (double)st.mb_total);
	cJSON_AddNumberToObject(s, "mb_stored", (double)st.mb_stored);
	cJSON_AddNumberToObject(s, "mb_in", (double)st.mb_in);
	cJSON_AddNumberToObject(s, "mb_in_at_open", (double)st.mb_in_at_open);
	cJSON_AddNumberToObject(s, "lb_total", (double)st.lb_total);
	cJSON_AddNumberToObject(s, "lb_demand", (double)st.lb_demand);
	cJSON_AddNumberToObject(s, "lb_prefetch", (double)st.lb_prefetch);
	cJSON_AddNumberToObject(s, "lb_failed", (double)st.lb_failed);
	cJSON_AddNumberToObject(s, "lb_retries", (double)st.lb_retries);
	cJSON_AddNumberToObject(s, "bytes_read", (double)st.bytes_read);
	cJSON_AddNumberToObject(s, "mb_decoded", (double)st.mb_decoded);
	cJSON_AddNumberToObject(s, "requests", (double)st.requests);
	cJSON_AddNumberToObject(s, "hits", (double)st.hits);
	cJSON_AddNumberToObject(s, "joined", (double)st.joined);
	cJSON_AddNumberToObject(s, "mem_bytes", (double)st.mem_bytes);
	cJSON_AddNumberToObject(s, "hot_mb", (double)st.hot_mb);
	cJSON_AddNumberToObject(s, "hot_mb_prefix", (double)st.hot_mb_prefix);
	cJSON_AddBoolToObject(s, "complete", st.complete);
	if (st.error) {
		char msg[1024];

		tmpl_engine_msg(tp, halite_template_errmsg(tp->t), msg, sizeof(msg));
		cJSON_AddStringToObject(s, "error", msg);
	} else {
		cJSON_AddStringToObject(s, "error", "");
	}
	return j;
}

static bool field_known(const char *k, const char *const *known)
{
	for (; *known; known++)
		if (!strcmp(k, *known))
			return true;
	return false;
}

/* A template that will not be: its engine, its files (memory, fill map, record), its entry. */
static void tmpl_drop(struct cloned *d, struct tmpl *tp)
{
	char *mem = state_mem_file(d, tp->id), *fill = NULL, *rec;

	if (mem && asprintf(&fill, "%s.fill", mem) < 0)
		fill = NULL;
	halite_template_free(tp->t);
	tp->t = NULL;
	if (fill) {
		unlink(mem);
		unlink(fill);
	}
	rec = state_template_file(d, tp->id, ".json");
	if (rec)
		unlink(rec);
	free(rec);
	free(fill);
	free(mem);
	tmpl_destroy(tp);
}

void tmpl_create(struct cloned *d, const cJSON *body, struct http_reply *r)
{
	static const char *const known[] = { "snapshot", "hotset", "memory_max", "cpu_max", NULL };
	const cJSON *snap = cJSON_GetObjectItemCaseSensitive(body, "snapshot");
	const cJSON *hot = cJSON_GetObjectItemCaseSensitive(body, "hotset"), *f;
	char err[1024] = "";
	uint64_t memory_max = 0;
	double cpu_max = 0;
	struct tmpl *tp;
	unsigned status;
	int ret;

	cJSON_ArrayForEach(f, body)
		if (!field_known(f->string, known))
			return reply_error(r, 400, "unknown field '%s' (known: snapshot, hotset, "
					   "memory_max, cpu_max)", f->string);
	if (!snap)
		return reply_error(r, 400, "missing field 'snapshot' (an absolute path)");
	if (!cJSON_IsString(snap) ||
	    (snap->valuestring[0] != '/' && !s3allow_is_url(snap->valuestring)))
		return reply_error(r, 400, "field 'snapshot' must be an absolute path or an "
				   "s3://BUCKET/KEY URL (a string)");
	if (hot && !cJSON_IsBool(hot))
		return reply_error(r, 400, "field 'hotset' must be true or false");
	/* its clones' limits unless their request says: applicable, or refused now */
	if (confine_parse_limits(body, &memory_max, &cpu_max, err, sizeof(err)) ||
	    confine_check(d, memory_max, cpu_max, err, sizeof(err)))
		return reply_error(r, 400, "%s", err);
	tp = calloc(1, sizeof(*tp));
	if (!tp || !(tp->snapshot = strdup(snap->valuestring))) {
		tmpl_destroy(tp);
		return reply_error(r, 500, "out of memory");
	}
	tp->hotset = !hot || cJSON_IsTrue(hot);
	tp->created = time(NULL);
	tp->memory_max = memory_max;
	tp->cpu_max = cpu_max;
	/* Opened once, here: the checks below and the engine see this file only. */
	tp->s3 = s3allow_is_url(tp->snapshot);
	status = tp->s3 ? s3allow_check(d, tp->snapshot, err, sizeof(err)) :
		 snapdir_open(d, tp->snapshot, &tp->snap_fd, err, sizeof(err));
	if (status) {
		tmpl_destroy(tp);
		return reply_error(r, status, "%s", err);
	}
	ret = cl_random_id(tp->id, 't');
	if (ret) {
		tmpl_destroy(tp);
		return reply_error(r, 500, "%s", strerror(-ret));
	}
	status = tmpl_open(d, tp, false, err, sizeof(err));
	if (!status) {
		ret = state_save_template(d, tp);
		if (ret) {
			snprintf(err, sizeof(err), "writing the template's record: %s",
				 strerror(-ret));
			status = 500;
		}
	}
	if (status) {
		cl_log(d, HALITE_LOG_ERROR, "template from %s: %s", tp->snapshot, err);
		tmpl_drop(d, tp);
		return reply_error(r, status, "%s", err);
	}
	pthread_mutex_lock(&d->lock);
	if (d->o.cache_max) {
		unsigned n;
		uint64_t used = cache_used(d, NULL, &n);

		if (used + tp->cache_need > d->o.cache_max) {
			pthread_mutex_unlock(&d->lock);
			snprintf(err, sizeof(err), "the template cache would exceed --cache-max: "
				 "%llu MiB held by %u template(s), this one needs %llu MiB of %llu MiB "
				 "(delete a template, or start the daemon with a larger --cache-max)",
				 (unsigned long long)(used >> 20), n,
				 (unsigned long long)(tp->cache_need >> 20),
				 (unsigned long long)(d->o.cache_max >> 20));
			tmpl_drop(d, tp);
			return reply_error(r, 507, "%s", err);
		}
	}
	tp->next = d->templates;
	d->templates = tp;
	reply_json(r, 201, tmpl_json(tp, false));
	pthread_mutex_unlock(&d->lock);
	cl_log(d, HALITE_LOG_INFO, "template %s created from %s (%llu MiB)", tp->id, tp->snapshot,
	       (unsigned long long)(tp->memory_bytes >> 20));
}

void tmpl_list(struct cloned *d, struct http_reply *r)
{
	cJSON *j = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(j, "templates");

	pthread_mutex_lock(&d->lock);
	for (struct tmpl *tp = d->templates; tp; tp = tp->next)
		cJSON_AddItemToArray(a, tmpl_json(tp, false));
	pthread_mutex_unlock(&d->lock);
	reply_json(r, 200, j);
}

void tmpl_show(struct cloned *d, const char *id, struct http_reply *r)
{
	struct tmpl *tp;

	pthread_mutex_lock(&d->lock);
	tp = tmpl_find(d, id);
	if (tp)
		reply_json(r, 200, tmpl_json(tp, true));
	else
		reply_error(r, 404, "no template '%s'", id);
	pthread_mutex_unlock(&d->lock);
}

void tmpl_delete(struct cloned *d, const char *id, struct http_reply *r)
{
	struct tmpl **pp, *tp = NULL;
	char *files[4];

	pthread_mutex_lock(&d->lock);
	for (pp = &d->templates; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->id, id)) {
			tp = *pp;
			break;
		}
	if (!tp) {
		pthread_mutex_unlock(&d->lock);
		return reply_error(r, 404, "no template '%s'", id);
	}
	if (tp->nclones) {
		pthread_mutex_unlock(&d->lock);
		return reply_error(r, 409, "template %s has %u clone(s): delete them first", id,
				   tp->nclones);
	}
	*pp = tp->next;
	pthread_mutex_unlock(&d->lock);

	files[0] = state_template_file(d, id, ".json");
	files[1] = state_template_file(d, id, ".hot");
	files[2] = state_mem_file(d, id);
	if (!files[2] || asprintf(&files[3], "%s.fill", files[2]) < 0)
		files[3] = NULL;
	tmpl_destroy(tp);
	for (int i = 0; i < 4; i++) {
		if (files[i])
			unlink(files[i]);
		free(files[i]);
	}
	cl_log(d, HALITE_LOG_INFO, "template %s deleted", id);
	cJSON *j = cJSON_CreateObject();

	cJSON_AddStringToObject(j, "deleted", id);
	reply_json(r, 200, j);
}

/*
 * The hot set, written by the monitor once the hot window of the last session
 * started is over (@all: every template, at shutdown). The engine copies what it
 * learned under its own lock; the registry's lock only keeps the template.
 */
void tmpl_save_hotsets(struct cloned *d, bool all)
{
	pthread_mutex_lock(&d->lock);
	for (struct tmpl *tp = d->templates; tp; tp = tp->next) {
		int ret;

		if (!tp->t || !tp->hotset ||
		    (!all && (!tp->hot_due_ns || halite_now_ns() < tp->hot_due_ns)))
			continue;
		tp->hot_due_ns = 0;
		ret = halite_template_hotset_save(tp->t); /* 0600, the engine's rule */
		if (ret)
			cl_log(d, HALITE_LOG_WARN, "template %s: saving its hot set: %s", tp->id,
			       cl_errstr(ret));
	}
	pthread_mutex_unlock(&d->lock);
}

/* A recorded uuid: 32 hex digits, else "" (a record from before uuids: not compared). */
static void record_uuid(struct tmpl *tp, const char *u)
{
	if (u && strlen(u) == 32 && strspn(u, "0123456789abcdef") == 32)
		memcpy(tp->uuid, u, 33);
}

/*
 * At start: every template the state directory records, opened again
 * through the snapshot directories. One that does not open stays listed,
 * unavailable with the reason, so that its clones stay visible and its
 * memory file stays as it is; the monitor retries it.
 */
void tmpl_load_all(struct cloned *d)
{
	char *dir = cl_path(d->o.state_dir, "templates", NULL);
	DIR *dh = dir ? opendir(dir) : NULL;
	struct dirent *e;

	while (dh && (e = readdir(dh))) {
		char id[CLONED_ID_LEN + 1], err[1024] = "", *path;
		size_t n = strlen(e->d_name);
		struct tmpl *tp;
		const char *snap, *kind;
		cJSON *j;

		if (n != CLONED_ID_LEN + 5 || strcmp(e->d_name + CLONED_ID_LEN, ".json"))
			continue;
		memcpy(id, e->d_name, CLONED_ID_LEN);
		id[CLONED_ID_LEN] = 0;
		if (!cl_valid_id(id, 't'))
			continue;
		path = cl_path(dir, e->d_name, NULL);
		j = path ? state_read_json(path, err, sizeof(err)) : NULL;
		free(path);
		snap = j ? state_jstr(j, "snapshot") : NULL;
		tp = calloc(1, sizeof(*tp));
		if (!j || !snap || !tp || !(tp->snapshot = strdup(snap))) {
			cl_log(d, HALITE_LOG_ERROR, "template %s not loaded: %s", id,
			       err[0] ? err : "no snapshot in its record");
			cJSON_Delete(j);
			tmpl_destroy(tp);
			continue;
		}
		memcpy(tp->id, id, sizeof(tp->id));
		tp->hotset = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "hotset"));
		tp->created = (int64_t)state_jnum(j, "created", 0);
		tp->memory_max = (uint64_t)state_jnum(j, "memory_max", 0);
		tp->cpu_max = state_jnum(j, "cpu_max", 0);
		kind = state_jstr(j, "kind");
		tp->kind = kind && !strcmp(kind, "qemu") ? TMPL_QEMU : TMPL_SYNTHETIC;
		record_uuid(tp, state_jstr(j, "uuid"));
		cJSON_Delete(j);
		if (tmpl_open(d, tp, true, err, sizeof(err))) {
			cl_log(d, HALITE_LOG_ERROR, "template %s (%s) unavailable: %s", id,
			       tp->snapshot, err);
			tp->unavailable = true;
			snprintf(tp->error, sizeof(tp->error), "%.500s", err);
		} else {
			cl_log(d, HALITE_LOG_INFO, "template %s loaded: %s", id, tp->snapshot);
		}
		pthread_mutex_lock(&d->lock);
		tp->next = d->templates;
		d->templates = tp;
		pthread_mutex_unlock(&d->lock);
	}
	if (dh)
		closedir(dh);
	free(dir);
}

/* How often the monitor tries unavailable templates again. */
#define RETRY_NS (2 * 1000000000ull)

/*
 * The monitor: each unavailable template opened again on a copy, without
 * the lock (it reads the snapshot); one that opens takes the copy's engine
 * and descriptor, and its orphaned clones are re-attached.
 */
void tmpl_retry_unavailable(struct cloned *d,
			    void (*loaded)(struct cloned *d, struct tmpl *tp))
{
	struct tmpl *todo = NULL;
	uint64_t now = halite_now_ns();

	if (now < d->retry_due_ns)
		return;
	d->retry_due_ns = now + RETRY_NS;
	pthread_mutex_lock(&d->lock);
	for (struct tmpl *tp = d->templates; tp; tp = tp->next) {
		struct tmpl *n;

		if (!tp->unavailable)
			continue;
		n = calloc(1, sizeof(*n));
		if (!n || !(n->snapshot = strdup(tp->snapshot))) {
			tmpl_destroy(n);
			break;
		}
		memcpy(n->id, tp->id, sizeof(n->id));
		memcpy(n->uuid, tp->uuid, sizeof(n->uuid));
		n->hotset = tp->hotset;
		n->next = todo;
		todo = n;
	}
	pthread_mutex_unlock(&d->lock);

	while (todo) {
		struct tmpl *n = todo, *tp;
		char err[512] = "";
		unsigned status;

		todo = n->next;
		status = tmpl_open(d, n, true, err, sizeof(err));
		pthread_mutex_lock(&d->lock);
		tp = tmpl_find(d, n->id);
		if (tp && tp->unavailable && status) {
			if (strcmp(tp->error, err)) {
				cl_log(d, HALITE_LOG_WARN, "template %s still unavailable: %s", tp->id,
				       err);
				snprintf(tp->error, sizeof(tp->error), "%.500s", err);
			}
		} else if (tp && tp->unavailable) {
			struct tmpl keep = *tp;

			/* n's loaded state, tp's place in the registry and its clones */
			free(tp->synth_args);
			free(tp->hot_path);
			free(tp->snapshot);
			s3disks_free(tp);
			*tp = *n;
			tp->next = keep.next;
			tp->nclones = keep.nclones;
			tp->created = keep.created;
			tp->unavailable = false;
			tp->error[0] = 0;
			memset(n, 0, sizeof(*n));
			cl_log(d, HALITE_LOG_INFO, "template %s loaded again: %s", tp->id,
			       tp->snapshot);
			loaded(d, tp);
		}
		pthread_mutex_unlock(&d->lock);
		tmpl_destroy(n);
	}
}
