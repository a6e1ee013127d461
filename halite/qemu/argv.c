// SPDX-License-Identifier: MIT
/*
 * QEMU's words as halite-qemu handles them (vmconfig.h): argument vectors,
 * QemuOpts and JSON option arguments split into keys and values and joined
 * again, and QEMU's sizes.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "strbuf.h"
#include "vmconfig.h"

/* --- argument vectors --- */

static int argv_grow(struct hq_argv *a)
{
	char **v = realloc(a->argv, sizeof(*v) * ((size_t)a->argc + 2));

	if (!v)
		return -ENOMEM;
	a->argv = v;
	return 0;
}

int hq_argv_push_own(struct hq_argv *a, char *s)
{
	if (!s || argv_grow(a)) {
		free(s);
		return -ENOMEM;
	}
	a->argv[a->argc++] = s;
	a->argv[a->argc] = NULL;
	return 0;
}

int hq_argv_push(struct hq_argv *a, const char *s)
{
	return hq_argv_push_own(a, strdup(s));
}

int hq_argv_copy(struct hq_argv *a, char *const *argv, int argc)
{
	for (int i = 0; i < argc; i++)
		if (hq_argv_push(a, argv[i]))
			return -ENOMEM;
	return 0;
}

int hq_argv_from_nul(struct hq_argv *a, const void *buf, size_t len)
{
	const char *p = buf;

	if (!len || p[len - 1] != '\0')
		return -EINVAL;
	for (size_t i = 0; i < len; i += strlen(p + i) + 1)
		if (hq_argv_push(a, p + i))
			return -ENOMEM;
	return 0;
}

char *hq_argv_to_nul(const struct hq_argv *a, size_t *len)
{
	size_t n = 0, k = 0;
	char *buf;

	for (int i = 0; i < a->argc; i++)
		n += strlen(a->argv[i]) + 1;
	buf = malloc(n ? n : 1);
	if (!buf)
		return NULL;
	for (int i = 0; i < a->argc; i++) {
		size_t l = strlen(a->argv[i]) + 1;

		memcpy(buf + k, a->argv[i], l);
		k += l;
	}
	*len = n;
	return buf;
}

void hq_argv_free(struct hq_argv *a)
{
	for (int i = 0; i < a->argc; i++)
		free(a->argv[i]);
	free(a->argv);
	a->argc = 0;
	a->argv = NULL;
}

/* --- QemuOpts and JSON arguments --- */

static int kvs_add(struct hq_kvs *kv, const char *key, const char *val, bool raw)
{
	struct hq_kv *v = realloc(kv->v, sizeof(*v) * ((size_t)kv->n + 1));

	if (!v)
		return -ENOMEM;
	kv->v = v;
	v[kv->n].key = strdup(key);
	v[kv->n].val = val ? strdup(val) : NULL;
	v[kv->n].raw = raw;
	if (!v[kv->n].key || (val && !v[kv->n].val)) {
		free(v[kv->n].key);
		free(v[kv->n].val);
		return -ENOMEM;
	}
	kv->n++;
	return 0;
}

int hq_kvs_add(struct hq_kvs *kv, const char *key, const char *val)
{
	return kvs_add(kv, key, val, false);
}

void hq_kvs_free(struct hq_kvs *kv)
{
	for (int i = 0; i < kv->n; i++) {
		free(kv->v[i].key);
		free(kv->v[i].val);
	}
	free(kv->v);
	kv->v = NULL;
	kv->n = 0;
}

static int kvs_json(const char *arg, struct hq_kvs *out)
{
	cJSON *o = cJSON_Parse(arg), *m;
	int ret = 0;

	out->json = true;
	if (!cJSON_IsObject(o)) {
		cJSON_Delete(o);
		return -EINVAL;
	}
	cJSON_ArrayForEach(m, o) {
		char *s = cJSON_IsString(m) ? NULL : cJSON_PrintUnformatted(m);

		if (!s && !cJSON_IsString(m))
			ret = -ENOMEM;
		else
			ret = kvs_add(out, m->string, s ? s : m->valuestring, s != NULL);
		free(s);
		if (ret)
			break;
	}
	cJSON_Delete(o);
	return ret;
}

int hq_kvs_split(const char *arg, const char *implied, struct hq_kvs *out)
{
	size_t len = strlen(arg);
	char *buf = malloc(len + 1);
	int ret = 0;

	*out = (struct hq_kvs){ 0 };
	if (!buf)
		return -ENOMEM;
	if (arg[0] == '{') {
		free(buf);
		ret = kvs_json(arg, out);
		if (ret)
			hq_kvs_free(out);
		return ret;
	}
	for (const char *p = arg; !ret;) {
		size_t k = 0;
		char *eq;

		/* One item up to a single comma; ",," is a comma in it. */
		while (*p && !(p[0] == ',' && p[1] != ',')) {
			if (p[0] == ',')
				p++;
			buf[k++] = *p++;
		}
		buf[k] = '\0';
		eq = strchr(buf, '=');
		if (eq) {
			*eq = '\0';
			ret = hq_kvs_add(out, buf, eq + 1);
		} else if (!out->n && implied) {
			ret = hq_kvs_add(out, implied, buf);
		} else if (k) {
			ret = hq_kvs_add(out, buf, NULL);
		}
		if (!*p)
			break;
		p++;
	}
	free(buf);
	if (ret)
		hq_kvs_free(out);
	return ret;
}

bool hq_kvs_has(const struct hq_kvs *kv, const char *key)
{
	for (int i = 0; i < kv->n; i++)
		if (!strcmp(kv->v[i].key, key))
			return true;
	return false;
}

const char *hq_kvs_get(const struct hq_kvs *kv, const char *key)
{
	const char *v = NULL;

	for (int i = 0; i < kv->n; i++)
		if (!strcmp(kv->v[i].key, key))
			v = kv->v[i].val;
	return v;
}

int hq_kvs_del(struct hq_kvs *kv, const char *key)
{
	int k = 0, gone = 0;

	for (int i = 0; i < kv->n; i++) {
		if (!strcmp(kv->v[i].key, key)) {
			free(kv->v[i].key);
			free(kv->v[i].val);
			gone++;
			continue;
		}
		kv->v[k++] = kv->v[i];
	}
	kv->n = k;
	return gone;
}

/* A QemuOpts key or value: a comma in it is written twice. */
static void put_escaped(struct hq_buf *b, const char *s)
{
	for (; *s; s++)
		hq_buf_puts(b, *s == ',' ? ",," : (char[2]){ *s, 0 });
}

char *hq_kvs_join(const struct hq_kvs *kv, const char *implied)
{
	struct hq_buf b = { 0 };

	if (kv->json) {
		cJSON *o = cJSON_CreateObject();
		char *s;

		for (int i = 0; o && i < kv->n; i++) {
			const char *v = kv->v[i].val ? kv->v[i].val : "";
			cJSON *m = kv->v[i].raw ? cJSON_Parse(v) : cJSON_CreateString(v);

			if (m)
				cJSON_AddItemToObject(o, kv->v[i].key, m);
		}
		s = o ? cJSON_PrintUnformatted(o) : NULL;
		cJSON_Delete(o);
		return s;
	}
	for (int i = 0; i < kv->n; i++) {
		if (i)
			hq_buf_puts(&b, ",");
		if (!i && implied && !strcmp(kv->v[i].key, implied) && kv->v[i].val) {
			put_escaped(&b, kv->v[i].val);
			continue;
		}
		put_escaped(&b, kv->v[i].key);
		if (kv->v[i].val) {
			hq_buf_puts(&b, "=");
			put_escaped(&b, kv->v[i].val);
		}
	}
	return hq_buf_done(&b);
}

int hq_parse_qemu_size(const char *s, uint64_t unit, uint64_t *out)
{
	static const char sfx[] = "BKMGTPE";
	const char *p;
	char *end;
	double d;
	uint64_t mul = unit;

	if (!s || !*s || (!isdigit((unsigned char)s[0]) && s[0] != '.'))
		return -EINVAL;
	errno = 0;
	d = strtod(s, &end);
	if (errno || end == s || d < 0)
		return -EINVAL;
	if (*end) {
		p = strchr(sfx, toupper((unsigned char)*end));
		if (!p || end[1])
			return -EINVAL;
		mul = 1ull << (10 * (p - sfx));
	}
	if (d * (double)mul >= 18446744073709551616.0)
		return -ERANGE;
	*out = (uint64_t)(d * (double)mul);
	return 0;
}
