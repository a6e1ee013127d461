// SPDX-License-Identifier: MIT
/*
 * halite-clone: the command-line client of halite-cloned, over its unix
 * socket with libcurl, or its TCP listener (--tcp) with the bearer token of
 * --token-file (or $HALITE_CLONED_TOKEN_FILE). Human output is aligned tables; --json prints the
 * server's JSON as it came, and on a failure one object of ours ({"ok":
 * false, "error", "exit", "http_status"}). Exit 0 on a 2xx reply, 1 with the
 * server's error on stderr otherwise (or when the daemon cannot be
 * reached), 2 for a usage error (docs/cli.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "cli.h"

#define PROG "halite-clone"

struct opts {
	const char *socket;
	const char *tcp;	/* --tcp ADDR:PORT, or NULL: the socket */
	const char *token_file;
	const char *tls_ca, *tls_cert, *tls_key; /* --tcp over TLS: https */
	char *auth;		/* "Authorization: Bearer TOKEN" (TCP) */
	bool json;
	const char *cmd;	/* the command, for the messages' prefix */
};

struct buf {
	char *p;
	size_t n;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " PROG " [--socket PATH | --tcp ADDR:PORT --token-file PATH] [--json]\n"
		"       COMMAND [ARGS]\n"
		"\n"
		"  template create SNAPSHOT [--no-hotset]   a template from a snapshot file\n"
		"  template list | template show ID | template delete ID\n"
		"                  (show: hotset_path, the learned hot set: a restore trace\n"
		"                  that 'halite-inspect relayout SNAPSHOT --trace' takes)\n"
		"  clone TEMPLATE [-n COUNT] [--accesses N] [--write PCT] [--pattern seq|random]\n"
		"               [--no-premap]              start COUNT clones (1)\n"
		"  list | show ID | delete ID               clones\n"
		"  metrics | health\n"
		"\n"
		"  --socket PATH   the daemon's socket (/run/halite-cloned/api.sock)\n"
		"  --tcp ADDR:PORT the daemon's --listen instead (127.0.0.1:PORT, [::1]:PORT)\n"
		"  --token-file PATH  the daemon's bearer token, for --tcp\n"
		"                  (default $HALITE_CLONED_TOKEN_FILE)\n"
		"  --tls-ca PATH --tls-cert PATH --tls-key PATH\n"
		"                  --tcp over TLS: the CA that signed the daemon's\n"
		"                  certificate, and this client's certificate and key\n"
		"  --json          the server's JSON instead of tables; on a failure\n"
		"                  {\"ok\": false, \"error\", \"exit\", \"http_status\"}\n"
		"  -h, --help      this text (also after COMMAND); --version: the version\n"
		"\n"
		"  -n COUNT 1 .. 64, --accesses N 0 .. 2^50 per vCPU (0: forever),\n"
		"  --write PCT 0 .. 100\n"
		"\n"
		"Exit: 0 the daemon said yes (2xx), 1 it said no or cannot be reached, 2 usage.\n");
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

/*
 * The one JSON object of a failure: {"ok": false, "error", "exit",
 * "http_status": the server's status, or null when there was no reply}.
 */
static void fail_json(const char *msg, int code, long http_status)
{
	fputs("{\"ok\": false, \"error\": ", stdout);
	halite_json_str(stdout, msg);
	printf(", \"exit\": %d, \"http_status\": ", code);
	if (http_status < 0)
		fputs("null", stdout);
	else
		printf("%ld", http_status);
	fputs("}\n", stdout);
	fflush(stdout);
}

/* "halite-clone: CMD: message" on stderr, with --json the object too; returns @code. */
static int fail(const struct opts *o, int code, long http_status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int fail(const struct opts *o, int code, long http_status, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, PROG ": %s%s%s\n", o->cmd ? o->cmd : "", o->cmd ? ": " : "", msg);
	if (o->json)
		fail_json(msg, code, http_status);
	return code;
}

/* Why the daemon's socket did not answer, in words a user acts on. */
static void unreachable(const struct opts *o, CURLcode rc, const char *err, char *out,
			size_t len)
{
	struct stat st;

	if (stat(o->socket, &st) && errno == ENOENT)
		snprintf(out, len, "%s does not exist: is halite-cloned running? (systemctl start "
			 "halite-cloned, or --socket PATH)", o->socket);
	else if (rc == CURLE_COULDNT_CONNECT && !S_ISSOCK(st.st_mode))
		snprintf(out, len, "%s is not a socket (--socket PATH: the daemon's API socket)",
			 o->socket);
	else if (rc == CURLE_COULDNT_CONNECT)
		snprintf(out, len, "nothing listens on %s: is halite-cloned running? (systemctl "
			 "start halite-cloned)", o->socket);
	else
		snprintf(out, len, "%s: %s", o->socket, err[0] ? err : curl_easy_strerror(rc));
}

/* One request; the body in *out (NUL-terminated). The HTTP status, or -1 (said so). */
static long request(const struct opts *o, const char *method, const char *path,
		    const char *body, struct buf *out)
{
	char url[1024], err[CURL_ERROR_SIZE] = "";
	struct curl_slist *h = NULL;
	CURL *c = curl_easy_init();
	long status = -1;
	CURLcode rc;

	if (!c) {
		fail(o, 1, -1, "curl: out of memory");
		return -1;
	}
	if (o->tcp) {
		snprintf(url, sizeof(url), "%s://%s%s", o->tls_ca ? "https" : "http", o->tcp, path);
		h = curl_slist_append(h, o->auth);
		if (o->tls_ca) {
			curl_easy_setopt(c, CURLOPT_CAINFO, o->tls_ca);
			curl_easy_setopt(c, CURLOPT_SSLCERT, o->tls_cert);
			curl_easy_setopt(c, CURLOPT_SSLKEY, o->tls_key);
		}
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	} else {
		snprintf(url, sizeof(url), "http://localhost%s", path);
		curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, o->socket);
	}
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
	if (rc != CURLE_OK && o->tcp) {
		fail(o, 1, -1, "%s: %s", o->tcp, err[0] ? err : curl_easy_strerror(rc));
	} else if (rc != CURLE_OK) {
		char why[PATH_MAX + 128];

		unreachable(o, rc, err, why, sizeof(why));
		fail(o, 1, -1, "%s", why);
	} else
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
		return 1; /* said so by request() */
	j = b->p ? cJSON_Parse(b->p) : NULL;
	if (status < 200 || status > 299) {
		const char *e = j ? str(j, "error") : "";

		if (!e[0] && b->p && b->p[0])
			e = b->p;
		fail(o, 1, status, "%s (HTTP %ld)", e[0] ? e : "the daemon refused", status);
		cJSON_Delete(j);
		return 1;
	}
	if (o->json && !strcmp(what, "text")) {
		/* metrics: no JSON of their own; the text in the one object */
		fputs("{\"ok\": true, \"metrics\": ", stdout);
		halite_json_str(stdout, b->p ? b->p : "");
		fputs("}\n", stdout);
	} else if (o->json) {
		/* the server's object as it came */
		fputs(b->p ? b->p : "", stdout);
	} else if (!strcmp(what, "text")) {
		fputs(b->p ? b->p : "", stdout);
	} else if (!j) {
		return fail(o, 1, status, "the daemon's reply is not JSON");
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
			fprintf(stderr, PROG ": clone: %.0f clone(s) failed: %s\n",
				num(j, "failed"), str(j, "error"));
	} else {
		print_object(j, 0);
	}
	cJSON_Delete(j);
	return 0;
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

/* A usage error of @sub (NULL: none yet): named, pointed at --help, exit 2. */
static int usage_error(const struct opts *o, const char *sub, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int usage_error(const struct opts *o, const char *sub, const char *fmt, ...)
{
	char msg[512];
	size_t n;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n = strlen(msg);
	snprintf(msg + n, sizeof(msg) - n, " (" PROG "%s%s --help)", sub ? " " : "",
		 sub ? sub : "");
	fprintf(stderr, PROG ": %s%s%s\n", sub ? sub : "", sub ? ": " : "", msg);
	if (o->json)
		fail_json(msg, 2, -1);
	return 2;
}

/* clone TEMPLATE's options into the request body @j; 0 or a usage error's exit code. */
static int clone_opts(const struct opts *o, int argc, char **argv, cJSON *j)
{
	uint64_t v;

	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--no-premap")) {
			cJSON_AddBoolToObject(j, "premap_hot", false);
			continue;
		}
		if (strcmp(a, "-n") && strcmp(a, "--count") && strcmp(a, "--accesses") &&
		    strcmp(a, "--write") && strcmp(a, "--pattern")) {
			if (a[0] == '-')
				return usage_error(o, "clone", "unknown option '%.*s'",
						   (int)strcspn(a, "="), a);
			return usage_error(o, "clone", "unexpected argument '%s'", a);
		}
		if (!val)
			return usage_error(o, "clone", "option '%s' needs a value", a);
		i++;
		if (!strcmp(a, "-n") || !strcmp(a, "--count")) {
			/* The daemon's most per request (CLONED_MAX_COUNT). */
			if (halite_parse_u64_range(val, 1, 64, &v))
				return usage_error(o, "clone", "%s '%s': want 1 .. 64", a, val);
			cJSON_AddNumberToObject(j, "count", (double)v);
		} else if (!strcmp(a, "--accesses")) {
			if (halite_parse_u64_range(val, 0, 1ull << 50, &v))
				return usage_error(o, "clone", "--accesses '%s': want 0 .. 2^50",
						   val);
			cJSON_AddNumberToObject(j, "accesses", (double)v);
		} else if (!strcmp(a, "--write")) {
			if (halite_parse_u64_range(val, 0, 100, &v))
				return usage_error(o, "clone",
						   "--write '%s': want percent, 0 .. 100", val);
			cJSON_AddNumberToObject(j, "write_pct", (double)v);
		} else {
			if (strcmp(val, "seq") && strcmp(val, "random"))
				return usage_error(o, "clone", "--pattern '%s': want seq or random",
						   val);
			cJSON_AddStringToObject(j, "pattern", val);
		}
	}
	return 0;
}

static int run(struct opts *o, int argc, char **argv)
{
	struct buf b = { 0 };
	const char *cmd = argv[0], *method = "GET", *what = "object";
	char *path = NULL, *body = NULL;
	long status;
	int ret;

	o->cmd = cmd;
	/* clone's options are clone_opts()'; template create's one is --no-hotset */
	for (int i = 1; strcmp(cmd, "clone") && i < argc; i++) {
		const char *a = argv[i];

		if (a[0] == '-' && a[1] && !(i == 3 && !strcmp(a, "--no-hotset") &&
					     !strcmp(argv[1], "create")))
			return usage_error(o, cmd, "unknown option '%.*s'",
					   (int)strcspn(a, "="), a);
	}
	if (!strcmp(cmd, "template")) {
		const char *sub = argc >= 2 ? argv[1] : "";

		if (!strcmp(sub, "list") && argc == 2) {
			path = strdup("/templates");
			what = "templates";
		} else if (!strcmp(sub, "create") && (argc == 3 || argc == 4)) {
			char real[PATH_MAX];
			cJSON *j;

			if (argc == 4 && strcmp(argv[3], "--no-hotset"))
				return usage_error(o, cmd, "create: unknown option '%s'", argv[3]);
			j = cJSON_CreateObject();
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
		} else if (!strcmp(sub, "create") || !strcmp(sub, "show") ||
			   !strcmp(sub, "delete")) {
			return usage_error(o, cmd, "%s takes %s", sub,
					   !strcmp(sub, "create") ? "SNAPSHOT [--no-hotset]" :
								    "one ID");
		} else if (!strcmp(sub, "list")) {
			return usage_error(o, cmd, "list takes no argument");
		} else {
			return usage_error(o, cmd, "%s%s%s: want create, list, show or delete",
					   sub[0] ? "unknown command '" : "missing command", sub,
					   sub[0] ? "'" : "");
		}
	} else if (!strcmp(cmd, "clone")) {
		cJSON *j;

		if (argc >= 2 && argv[1][0] == '-')
			return usage_error(o, cmd, "unknown option '%.*s' (before TEMPLATE)",
					   (int)strcspn(argv[1], "="), argv[1]);
		if (argc < 2)
			return usage_error(o, cmd, "missing TEMPLATE");
		j = cJSON_CreateObject();
		ret = clone_opts(o, argc, argv, j);
		if (ret) {
			cJSON_Delete(j);
			return ret;
		}
		body = cJSON_PrintUnformatted(j);
		cJSON_Delete(j);
		method = "POST";
		path = path_of("/templates/%s/clones", argv[1]);
		what = "started";
	} else if ((!strcmp(cmd, "list") || !strcmp(cmd, "metrics") || !strcmp(cmd, "health")) &&
		   argc != 1) {
		return usage_error(o, cmd, "unexpected argument '%s'", argv[1]);
	} else if ((!strcmp(cmd, "show") || !strcmp(cmd, "delete")) && argc < 2) {
		return usage_error(o, cmd, "missing ID");
	} else if ((!strcmp(cmd, "show") || !strcmp(cmd, "delete")) && argc > 2) {
		return usage_error(o, cmd, "unexpected argument '%s'", argv[2]);
	} else if (!strcmp(cmd, "list")) {
		path = strdup("/clones");
		what = "clones";
	} else if (!strcmp(cmd, "show")) {
		path = path_of("/clones/%s", argv[1]);
	} else if (!strcmp(cmd, "delete")) {
		path = path_of("/clones/%s", argv[1]);
		method = "DELETE";
	} else if (!strcmp(cmd, "metrics")) {
		path = strdup("/metrics");
		what = "text";
	} else if (!strcmp(cmd, "health")) {
		path = strdup("/healthz");
	} else {
		return usage_error(o, NULL, "unknown command '%s'", cmd);
	}
	if (!path) {
		free(body);
		return usage_error(o, cmd, "not an id: '%s' (ids are a-z, 0-9 and -)",
				   strcmp(cmd, "clone") ? argv[argc - 1] : argv[1]);
	}
	status = request(o, method, path, body, &b);
	ret = show(o, what, status, &b);
	free(b.p);
	free(path);
	free(body);
	return ret;
}

/* The bearer token of @o->token_file into @o->auth; 0, or the exit code (said so). */
static int load_token(struct opts *o)
{
	char buf[4097];
	ssize_t n;
	int fd;

	if (!o->token_file)
		return usage_error(o, NULL, "--tcp needs --token-file PATH (or "
				   "HALITE_CLONED_TOKEN_FILE): the daemon's bearer token");
	fd = open(o->token_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(o, 1, -1, "--token-file %s: %s", o->token_file, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return fail(o, 1, -1, "--token-file %s: %s", o->token_file, strerror(errno));
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	if (!n || strcspn(buf, "\r\n") != (size_t)n)
		return fail(o, 1, -1, "--token-file %s: not a token (one line)", o->token_file);
	if (asprintf(&o->auth, "Authorization: Bearer %s", buf) < 0)
		return fail(o, 1, -1, "out of memory");
	return 0;
}

static const char *const commands[] = { "template", "clone", "list", "show", "delete",
					"metrics", "health" };

int main(int argc, char **argv)
{
	struct opts o = { .socket = "/run/halite-cloned/api.sock" };
	char **args = calloc((size_t)argc + 1, sizeof(char *));
	bool dashdash = false;
	int n = 0, ret;

	if (!args)
		return 1;
	/*
	 * --json, --socket, --help and --version anywhere (before a "--"):
	 * `halite-clone show ID --json` as well as `halite-clone --json show ID`.
	 */
	o.json = halite_cli_has_json(argc, argv);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (dashdash || strcmp(a, "--") == 0) {
			if (dashdash)
				args[n++] = argv[i];
			dashdash = true;
		} else if (!strcmp(a, "--json")) {
			continue;
		} else if (!strcmp(a, "--socket")) {
			if (i + 1 == argc) {
				ret = usage_error(&o, NULL, "option '--socket' needs a value");
				goto out;
			}
			o.socket = argv[++i];
		} else if (!strcmp(a, "--tcp") || !strcmp(a, "--token-file") ||
			   !strncmp(a, "--tls-", 6)) {
			const char **dst = !strcmp(a, "--tcp") ? &o.tcp :
					   !strcmp(a, "--token-file") ? &o.token_file :
					   !strcmp(a, "--tls-ca") ? &o.tls_ca :
					   !strcmp(a, "--tls-cert") ? &o.tls_cert :
					   !strcmp(a, "--tls-key") ? &o.tls_key : NULL;

			if (!dst) {
				ret = usage_error(&o, NULL, "unknown option '%.*s'",
						  (int)strcspn(a, "="), a);
				goto out;
			}
			if (i + 1 == argc) {
				ret = usage_error(&o, NULL, "option '%s' needs a value", a);
				goto out;
			}
			*dst = argv[++i];
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			ret = 0;
			goto out;
		} else if (!strcmp(a, "--version")) {
			ret = halite_cli_version(PROG);
			goto out;
		} else if (n == 0 && a[0] == '-') {
			ret = usage_error(&o, NULL, "unknown option '%.*s'",
					  (int)strcspn(a, "="), a);
			goto out;
		} else {
			args[n++] = argv[i];
		}
	}
	if (!n) {
		ret = usage_error(&o, NULL, "missing COMMAND: template, clone, list, show, delete, "
				  "metrics or health");
		goto out;
	}
	ret = -1;
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(args[0], commands[i]))
			ret = 0;
	if (ret) {
		ret = usage_error(&o, NULL, "unknown command '%s'", args[0]);
		goto out;
	}
	if (!o.token_file)
		o.token_file = getenv("HALITE_CLONED_TOKEN_FILE");
	if ((o.tls_ca || o.tls_cert || o.tls_key) &&
	    (!o.tls_ca || !o.tls_cert || !o.tls_key || !o.tcp)) {
		ret = usage_error(&o, NULL, "--tls-ca, --tls-cert and --tls-key go together, "
				  "with --tcp");
		goto out;
	}
	if (o.tcp && (ret = load_token(&o)))
		goto out;
	if (curl_global_init(CURL_GLOBAL_NOTHING)) {
		ret = fail(&o, 1, -1, "curl did not initialise");
		goto out;
	}
	ret = run(&o, n, args);
	curl_global_cleanup();
out:
	free(o.auth);
	free(args);
	return ret;
}
