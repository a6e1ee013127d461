// SPDX-License-Identifier: MIT
/*
 * halite-clone: the command-line client of halite-cloned, over its unix
 * socket with libcurl. Human output is aligned tables; --json prints the
 * server's JSON as it came. Exit 0 on a 2xx reply, 1 with the server's
 * error on stderr otherwise (or when the daemon cannot be reached), 2 for a
 * usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#define PROG "halite-clone"

struct opts {
	const char *socket;
	bool json;
};

struct buf {
	char *p;
	size_t n;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " PROG " [--socket PATH] [--json] COMMAND\n"
		"\n"
		"  template create SNAPSHOT [--no-hotset]   a template from a snapshot file\n"
		"  template list | template show ID | template delete ID\n"
		"  clone TEMPLATE [-n COUNT] [--accesses N] [--write PCT] [--pattern seq|random]\n"
		"               [--no-premap]              start COUNT clones (1)\n"
		"  list | show ID | delete ID               clones\n"
		"  metrics | health\n"
		"\n"
		"  --socket PATH   the daemon's socket (/run/halite-cloned/api.sock)\n"
		"  --json          the server's JSON instead of tables\n");
}

static size_t on_data(char *p, size_t sz, size_t n, void *ctx)
{
	struct buf *b = ctx;
	char *q = realloc(b->p, b->n + sz * n + 1);

	if (!q)
		return 0;
	memcpy(q + b->n, p, sz * n);
	b->n += sz * n;
	q[b->n] = 0;
	b->p = q;
	return sz * n;
}

/* One request; the body in *out (NUL-terminated). The HTTP status, or -1. */
static long request(const struct opts *o, const char *method, const char *path,
		    const char *body, struct buf *out)
{
	char url[1024], err[CURL_ERROR_SIZE] = "";
	struct curl_slist *h = NULL;
	CURL *c = curl_easy_init();
	long status = -1;
	CURLcode rc;

	if (!c) {
		fprintf(stderr, PROG ": curl: out of memory\n");
		return -1;
	}
	snprintf(url, sizeof(url), "http://localhost%s", path);
	curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, o->socket);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (body) {
		h = curl_slist_append(h, "Content-Type: application/json");
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	}
	rc = curl_easy_perform(c);
	if (rc != CURLE_OK)
		fprintf(stderr, PROG ": %s: %s\n", o->socket, err[0] ? err : curl_easy_strerror(rc));
	else
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	return status;
}

static double num(const cJSON *j, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);

	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *j, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);

	return cJSON_IsString(v) ? v->valuestring : "";
}

static void mib(char *out, size_t n, double bytes)
{
	snprintf(out, n, "%.1f MiB", bytes / 1048576.0);
}

static void print_templates(const cJSON *arr)
{
	const cJSON *t;

	printf("%-10s  %-9s  %10s  %10s  %6s  %s\n", "ID", "KIND", "MEMORY", "STORED", "CLONES",
	       "SNAPSHOT");
	cJSON_ArrayForEach(t, arr) {
		char m[32], s[32];

		mib(m, sizeof(m), num(t, "memory_bytes"));
		mib(s, sizeof(s), num(t, "stored_bytes"));
		printf("%-10s  %-9s  %10s  %10s  %6.0f  %s\n", str(t, "id"), str(t, "kind"), m, s,
		       num(t, "clones"), str(t, "snapshot"));
	}
}

static void print_clones(const cJSON *arr)
{
	const cJSON *c;

	printf("%-10s  %-10s  %8s  %-8s  %9s  %8s  %8s  %10s  %s\n", "ID", "TEMPLATE", "PID",
	       "STATE", "READY", "FAULTS", "P99", "PSS", "ERROR");
	cJSON_ArrayForEach(c, arr) {
		char p[32];

		mib(p, sizeof(p), num(c, "pss_bytes"));
		printf("%-10s  %-10s  %8.0f  %-8s  %7.1fms  %8.0f  %6.0fus  %10s  %s\n",
		       str(c, "id"), str(c, "template"), num(c, "pid"), str(c, "state"),
		       num(c, "ready_s") * 1e3, num(c, "faults"), num(c, "fault_p99_us"), p,
		       str(c, "error"));
	}
}

/* Any object: "key  value" lines, nested objects indented. */
static void print_object(const cJSON *j, int indent)
{
	const cJSON *f;

	cJSON_ArrayForEach(f, j) {
		if (cJSON_IsObject(f)) {
			printf("%*s%s:\n", indent, "", f->string);
			print_object(f, indent + 2);
			continue;
		}
		printf("%*s%-*s  ", indent, "", 20 - indent, f->string);
		if (cJSON_IsString(f))
			printf("%s\n", f->valuestring);
		else if (cJSON_IsNumber(f) && f->valuedouble == (double)(long long)f->valuedouble)
			printf("%lld\n", (long long)f->valuedouble);
		else {
			char *s = cJSON_PrintUnformatted(f);

			printf("%s\n", s ? s : "?");
			free(s);
		}
	}
}

/* Print a reply the way @what wants; 0 for a 2xx, 1 otherwise. */
static int show(const struct opts *o, const char *what, long status, const struct buf *b)
{
	cJSON *j;

	if (status < 0)
		return 1;
	j = b->p ? cJSON_Parse(b->p) : NULL;
	if (status < 200 || status > 299) {
		const char *e = j ? str(j, "error") : "";

		fprintf(stderr, PROG ": %ld: %s\n", status, e[0] ? e : (b->p ? b->p : ""));
		cJSON_Delete(j);
		return 1;
	}
	if (o->json || !strcmp(what, "text")) {
		fputs(b->p ? b->p : "", stdout);
	} else if (!j) {
		fprintf(stderr, PROG ": the daemon's reply is not JSON\n");
		return 1;
	} else if (!strcmp(what, "templates")) {
		print_templates(cJSON_GetObjectItemCaseSensitive(j, "templates"));
	} else if (!strcmp(what, "clones")) {
		print_clones(cJSON_GetObjectItemCaseSensitive(j, "clones"));
	} else if (!strcmp(what, "started")) {
		const cJSON *c, *arr = cJSON_GetObjectItemCaseSensitive(j, "clones");

		printf("%-10s  %8s  %10s\n", "ID", "PID", "READY");
		cJSON_ArrayForEach(c, arr)
			printf("%-10s  %8.0f  %8.1fms\n", str(c, "id"), num(c, "pid"),
			       num(c, "ready_s") * 1e3);
		if (str(j, "error")[0])
			fprintf(stderr, PROG ": %.0f clone(s) failed: %s\n", num(j, "failed"),
				str(j, "error"));
	} else {
		print_object(j, 0);
	}
	cJSON_Delete(j);
	return 0;
}

static int parse_uint(const char *s, unsigned long long max, unsigned long long *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || end == s || *end || *s == '-' || *v > max ? -1 : 0;
}

static char *path_of(const char *fmt, const char *id)
{
	char *p;

	/* ids are [a-z0-9-]: anything else would change the path */
	for (const char *c = id; *c; c++)
		if (!strchr("abcdefghijklmnopqrstuvwxyz0123456789-", *c))
			return NULL;
	return asprintf(&p, fmt, id) < 0 ? NULL : p;
}

static int run(const struct opts *o, int argc, char **argv)
{
	struct buf b = { 0 };
	const char *cmd = argv[0], *method = "GET", *what = "object";
	char *path = NULL, *body = NULL;
	long status;
	int ret;

	if (!strcmp(cmd, "template") && argc >= 2) {
		const char *sub = argv[1];

		if (!strcmp(sub, "list") && argc == 2) {
			path = strdup("/templates");
			what = "templates";
		} else if (!strcmp(sub, "create") && (argc == 3 || argc == 4)) {
			char real[PATH_MAX];
			cJSON *j = cJSON_CreateObject();

			if (argc == 4 && strcmp(argv[3], "--no-hotset"))
				goto usage;
			/* the daemon wants an absolute path; a missing file is its to report */
			cJSON_AddStringToObject(j, "snapshot",
						realpath(argv[2], real) ? real : argv[2]);
			cJSON_AddBoolToObject(j, "hotset", argc == 3);
			body = cJSON_PrintUnformatted(j);
			cJSON_Delete(j);
			method = "POST";
			path = strdup("/templates");
		} else if (!strcmp(sub, "show") && argc == 3) {
			path = path_of("/templates/%s", argv[2]);
		} else if (!strcmp(sub, "delete") && argc == 3) {
			path = path_of("/templates/%s", argv[2]);
			method = "DELETE";
		} else {
			goto usage;
		}
	} else if (!strcmp(cmd, "clone") && argc >= 2) {
		cJSON *j = cJSON_CreateObject();
		unsigned long long v;

		for (int i = 2; i < argc; i++) {
			const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

			if (!strcmp(a, "--no-premap")) {
				cJSON_AddBoolToObject(j, "premap_hot", false);
				continue;
			}
			if (!val) {
				cJSON_Delete(j);
				goto usage;
			}
			i++;
			if ((!strcmp(a, "-n") || !strcmp(a, "--count")) && !parse_uint(val, 1000, &v))
				cJSON_AddNumberToObject(j, "count", (double)v);
			else if (!strcmp(a, "--accesses") && !parse_uint(val, 1ull << 50, &v))
				cJSON_AddNumberToObject(j, "accesses", (double)v);
			else if (!strcmp(a, "--write") && !parse_uint(val, 1000, &v))
				cJSON_AddNumberToObject(j, "write_pct", (double)v);
			else if (!strcmp(a, "--pattern"))
				cJSON_AddStringToObject(j, "pattern", val);
			else {
				cJSON_Delete(j);
				goto usage;
			}
		}
		body = cJSON_PrintUnformatted(j);
		cJSON_Delete(j);
		method = "POST";
		path = path_of("/templates/%s/clones", argv[1]);
		what = "started";
	} else if (!strcmp(cmd, "list") && argc == 1) {
		path = strdup("/clones");
		what = "clones";
	} else if (!strcmp(cmd, "show") && argc == 2) {
		path = path_of("/clones/%s", argv[1]);
	} else if (!strcmp(cmd, "delete") && argc == 2) {
		path = path_of("/clones/%s", argv[1]);
		method = "DELETE";
	} else if (!strcmp(cmd, "metrics") && argc == 1) {
		path = strdup("/metrics");
		what = "text";
	} else if (!strcmp(cmd, "health") && argc == 1) {
		path = strdup("/healthz");
	} else {
		goto usage;
	}
	if (!path) {
		fprintf(stderr, PROG ": not an id: '%s'\n", argv[argc - 1]);
		free(body);
		return 2;
	}
	status = request(o, method, path, body, &b);
	/* metrics with --json: there is no JSON of it; the text as it is */
	ret = show(o, what, status, &b);
	free(b.p);
	free(path);
	free(body);
	return ret;
usage:
	free(body);
	free(path);
	usage(stderr);
	return 2;
}

int main(int argc, char **argv)
{
	struct opts o = { .socket = "/run/halite-cloned/api.sock" };
	int i = 1, ret;

	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--json")) {
			o.json = true;
		} else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
			o.socket = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (i == argc) {
		usage(stderr);
		return 2;
	}
	if (curl_global_init(CURL_GLOBAL_NOTHING)) {
		fprintf(stderr, PROG ": curl did not initialise\n");
		return 1;
	}
	ret = run(&o, argc - i, argv + i);
	curl_global_cleanup();
	return ret;
}
