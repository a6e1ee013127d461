// SPDX-License-Identifier: MIT
/*
 * halite-bench clones: N clones of one synthetic guest's snapshot, started
 * at once, two ways in the same run:
 *
 *   independent  N ordinary lazy restores (restore.h), one per clone, each
 *                into the clone's private anonymous memory: every restore
 *                reads and decodes the whole file, every clone holds a copy.
 *   service      one template (template.h) and N sessions: each locality
 *                block read and decoded once into a tmpfs memory file that
 *                every clone maps privately.
 *
 * Each clone is a real process (halite-synth clone), its vCPUs walking its
 * page tables through the engine's faults. Per N and mode: time to ready
 * (from the request for all N to the clone's vCPUs running: process start,
 * engine attach, vCPUs started; all N started at once, a thread each), of
 * which the attach (from the clone's process listening to its vCPUs
 * running: what the engine adds), time to first
 * response (the clone's vCPUs finished their first --accesses accesses),
 * bytes read, LBs decoded, faults, and the memory the N clones cost once
 * done and idle: the sum of their PSS plus, for the service, the engine's
 * share of the template memory file (proportional set size: a page mapped
 * by k processes counts 1/k to each, so the sum is what the host holds).
 *
 * Then the hot set: a clone of a fresh template with no hot set, and one of
 * a fresh template that has the hot set the first clone taught: faults
 * before the first response, each.
 *
 * Exit: 0 measured, 1 error, 2 usage, 77 no userfaultfd.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <halite/halite.h>
#include <halite/restore.h>
#include <halite/template.h>

#include "bench_util.h"
#include "cli.h"
#include "clone_ctl.h"
#include "clones.h"
#include "stats.h"

#define PROG "halite-bench: clones"
#define CMD "halite-bench clones"
#define MAX_CLONES 64
#define CTL_MS 60000

extern char **environ;

struct params {
	uint64_t mem_mib, accesses, save_accesses;
	unsigned vcpus, runs;
	unsigned counts[8], ncounts;
	uint32_t latency_us;
	const char *dir, *mem_dir;
	bool json, quick, keep;
};

struct clone {
	pid_t pid;
	char sock[PATH_MAX];
	uint64_t host, mem_bytes;
	pid_t tids[16];
	unsigned ntids;
	int uffd;
	uint64_t spawned_ns, ready_ns, first_ns;
	uint64_t faults_first;	/* engine faults at the first response */
	struct halite_restore *r;
	struct halite_session *s;
};

struct result {
	const char *mode;
	unsigned n;
	double ready_p50, ready_p95, attach_p50, attach_p95, first_p50, first_p95, done_s;
	uint64_t bytes_read, lb_decoded, faults, pss, pss_clones, cache_bytes;
};

struct bench {
	struct params p;
	char snap[PATH_MAX], mem[PATH_MAX], hotpath[PATH_MAX], synth[PATH_MAX];
	char synth_args[1024];
	struct result res[32];
	unsigned nres;
	struct {
		uint64_t faults_without, faults_with, premapped, hot_mb;
		double first_without, first_with, premap_s;
	} hot;
};

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	halite_cli_verrorf(PROG, fmt, ap);
	va_end(ap);
	return -1;
}

/* halite-synth: $HALITE_SYNTH_BIN, the build tree's, or beside this binary. */
static int find_synth(struct bench *b)
{
	const char *env = getenv("HALITE_SYNTH_BIN");
	char self[PATH_MAX], *dir;
	ssize_t n;

	if (env) {
		snprintf(b->synth, sizeof(b->synth), "%s", env);
		return 0;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0)
		return fail("/proc/self/exe: %s", strerror(errno));
	self[n] = 0;
	dir = dirname(self);
	snprintf(b->synth, sizeof(b->synth), "%s/../testing/synth/halite-synth", dir);
	if (!access(b->synth, X_OK))
		return 0;
	snprintf(b->synth, sizeof(b->synth), "%s/halite-synth", dir);
	if (!access(b->synth, X_OK))
		return 0;
	return fail("no halite-synth beside %s (set HALITE_SYNTH_BIN)", dir);
}

/* Run argv, its stdout into @out (one line); 0 or -1. */
static int run_capture(char *const argv[], char *out, size_t outlen)
{
	posix_spawn_file_actions_t fa;
	int pfd[2], st;
	ssize_t n, len = 0;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC))
		return -1;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
	if (posix_spawn(&pid, argv[0], &fa, NULL, argv, environ)) {
		posix_spawn_file_actions_destroy(&fa);
		close(pfd[0]);
		close(pfd[1]);
		return fail("cannot run %s", argv[0]);
	}
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	while (len < (ssize_t)outlen - 1 && (n = read(pfd[0], out + len, outlen - 1 - (size_t)len)) > 0)
		len += n;
	out[len] = 0;
	close(pfd[0]);
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		return fail("%s %s failed", argv[0], argv[1]);
	return 0;
}

/* The template: a synthetic guest run a while and saved. */
static int make_snapshot(struct bench *b)
{
	char mem[32], vcpus[32], acc[32], out[4096];
	char *argv[] = { b->synth, "save", "--out", b->snap, "--mem", mem, "--vcpus", vcpus,
			 "--accesses", acc, "--compress", "50", "--zero", "10", "--untouched", "10",
			 "--seed", "1", NULL };
	struct halite_reader *rd;
	const void *v;
	uint32_t vlen;

	snprintf(mem, sizeof(mem), "%" PRIu64, b->p.mem_mib);
	snprintf(vcpus, sizeof(vcpus), "%u", b->p.vcpus);
	snprintf(acc, sizeof(acc), "%" PRIu64, b->p.save_accesses);
	if (run_capture(argv, out, sizeof(out)))
		return -1;
	if (halite_reader_open(&rd, b->snap, NULL))
		return fail("%s: cannot read what halite-synth save wrote", b->snap);
	b->synth_args[0] = 0;
	if (!halite_reader_meta_find(rd, "synth.args", &v, &vlen) && vlen < sizeof(b->synth_args)) {
		memcpy(b->synth_args, v, vlen);
		b->synth_args[vlen] = 0;
	}
	halite_reader_free(rd);
	return b->synth_args[0] ? 0 : fail("%s has no synth.args", b->snap);
}

/* Spawn a clone process; returns once it listens ("ready"). */
static int clone_spawn(struct bench *b, struct clone *c, unsigned i, bool anon, uint64_t off)
{
	char offs[32], acc[32], line[64], *argv[64], args[1024], *save = NULL;
	posix_spawn_file_actions_t fa;
	unsigned n = 0;
	int pfd[2];
	ssize_t r;

	snprintf(c->sock, sizeof(c->sock), "%s/halite-bench-clone-%d-%u.sock", b->p.mem_dir,
		 (int)getpid(), i);
	snprintf(offs, sizeof(offs), "%" PRIu64, off);
	snprintf(acc, sizeof(acc), "%" PRIu64, b->p.accesses);
	argv[n++] = b->synth;
	argv[n++] = "clone";
	if (anon) {
		argv[n++] = "--anon";
	} else {
		argv[n++] = "--mem-file";
		argv[n++] = b->mem;
		argv[n++] = "--mem-offset";
		argv[n++] = offs;
	}
	argv[n++] = "--control";
	argv[n++] = c->sock;
	snprintf(args, sizeof(args), "%s", b->synth_args);
	for (char *tok = strtok_r(args, " ", &save); tok && n < 56; tok = strtok_r(NULL, " ", &save))
		argv[n++] = tok;
	argv[n++] = "--write";
	argv[n++] = "0";
	argv[n++] = "--accesses";
	argv[n++] = acc;
	argv[n] = NULL;
	if (pipe2(pfd, O_CLOEXEC))
		return fail("pipe: %s", strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
	r = posix_spawn(&c->pid, b->synth, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	if (r) {
		close(pfd[0]);
		return fail("cannot run %s: %s", b->synth, strerror((int)r));
	}
	r = read(pfd[0], line, sizeof(line) - 1);
	close(pfd[0]);
	if (r < 5 || strncmp(line, "ready", 5))
		return fail("clone %u did not start", i);
	return 0;
}

/* info + uffd: where its memory is, its vCPUs, its userfaultfd. */
static int clone_attach_info(struct clone *c)
{
	char err[512];
	cJSON *j, *tids;
	int ret = ctl_command(c->sock, "info", &j, NULL, CTL_MS, err, sizeof(err));

	if (ret)
		return fail("%s", err);
	c->host = strtoull(cJSON_GetStringValue(cJSON_GetObjectItem(j, "host")) ?: "0", NULL, 16);
	c->mem_bytes = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "mem_bytes"));
	tids = cJSON_GetObjectItem(j, "vcpu_tids");
	c->ntids = 0;
	for (cJSON *t = tids ? tids->child : NULL; t && c->ntids < 16; t = t->next)
		c->tids[c->ntids++] = (pid_t)t->valuedouble;
	cJSON_Delete(j);
	ret = ctl_command(c->sock, "uffd", NULL, &c->uffd, CTL_MS, err, sizeof(err));
	return ret ? fail("%s", err) : 0;
}

static int clone_cmd(struct clone *c, const char *cmd)
{
	char err[512];

	return ctl_command(c->sock, cmd, NULL, NULL, CTL_MS, err, sizeof(err)) ? fail("%s", err) : 0;
}

static bool clone_done(struct clone *c)
{
	char err[512];
	cJSON *j;
	bool done;

	if (ctl_command(c->sock, "stats", &j, NULL, CTL_MS, err, sizeof(err)))
		return false;
	done = cJSON_IsTrue(cJSON_GetObjectItem(j, "done"));
	cJSON_Delete(j);
	return done;
}

/* Sum of "Pss:" in /proc/PID/smaps_rollup, bytes. */
static uint64_t pss_of(pid_t pid)
{
	char path[64], line[256];
	unsigned long long kb;
	uint64_t v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Pss: %llu kB", &kb) == 1)
			v = kb * 1024;
	fclose(f);
	return v;
}

/* PSS of process @pid's mappings of @file (a clone's share of the template memory file). */
static uint64_t pss_of_file(pid_t pid, const char *file)
{
	char line[PATH_MAX + 128], path[64];
	unsigned long long kb;
	bool in = false;
	uint64_t v = 0;
	size_t fl = strlen(file);
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		size_t l = strlen(line);

		if (l && line[l - 1] == '\n')
			line[--l] = 0;
		unsigned long lo, hi;

		/* A mapping's header: "lo-hi perms offset dev inode path". */
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in = l >= fl && !strcmp(line + l - fl, file);
			continue;
		}
		if (!strncmp(line, "VmFlags", 7))
			continue;
		if (in && sscanf(line, "Pss: %llu kB", &kb) == 1)
			v += kb * 1024;
	}
	fclose(f);
	return v;
}

static double pct(uint64_t *v, unsigned n, double q)
{
	uint64_t s[MAX_CLONES];
	unsigned k;

	memcpy(s, v, n * sizeof(*s));
	for (unsigned i = 1; i < n; i++)
		for (unsigned j = i; j > 0 && s[j - 1] > s[j]; j--) {
			uint64_t t = s[j];

			s[j] = s[j - 1];
			s[j - 1] = t;
		}
	k = (unsigned)(q * (n - 1) + 0.5);
	return (double)s[k] / 1e9;
}

static void remove_mem(struct bench *b)
{
	char fill[PATH_MAX + 8];

	snprintf(fill, sizeof(fill), "%s.fill", b->mem);
	unlink(b->mem);
	unlink(fill);
}

static void clones_end(struct clone *c, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (c[i].pid > 0) {
			kill(c[i].pid, SIGKILL);
			waitpid(c[i].pid, NULL, 0);
		}
		halite_session_free(c[i].s);
		halite_restore_free(c[i].r);
		if (c[i].uffd >= 0)
			close(c[i].uffd);
		unlink(c[i].sock);
	}
}

static int start_engine(struct bench *b, struct clone *c, struct halite_template *t,
			unsigned sflags)
{
	int ret;

	if (t) {
		const struct halite_session_region reg = { "pc.ram", c->host, c->mem_bytes };
		HALITE_OPTS(halite_session_opts, so);

		so.flags = sflags;
		so.owner_pid = c->pid;
		so.owner_uffd = c->uffd;
		so.vcpu_tids = c->tids;
		so.nvcpus = c->ntids;
		ret = halite_session_start(&c->s, t, &reg, 1, &so);
		return ret ? fail("session: %s", halite_strerror(ret)) : 0;
	} else {
		const struct halite_restore_region reg = { "pc.ram", c->host, c->mem_bytes,
							   HALITE_MEM_ANON, -1, 0 };
		HALITE_OPTS(halite_restore_opts, ro);

		ro.owner_pid = c->pid;
		ro.owner_uffd = c->uffd;
		ro.vcpu_tids = c->tids;
		ro.nvcpus = c->ntids;
		ro.read_latency_us = b->p.latency_us;
		ret = halite_restore_open(&c->r, b->snap, &reg, 1, &ro);
		if (!ret)
			ret = halite_restore_start(c->r);
		return ret ? fail("restore: %s", halite_strerror(ret)) : 0;
	}
}

static uint64_t engine_faults(struct clone *c)
{
	if (c->s) {
		struct halite_session_stats st;

		halite_session_stats(c->s, &st);
		return st.faults;
	} else {
		struct halite_restore_stats st;

		halite_restore_stats(c->r, &st);
		return st.faults;
	}
}

static struct halite_template *open_template(struct bench *b, const char *hot, unsigned flags)
{
	HALITE_OPTS(halite_template_opts, o);
	struct halite_template *t;
	int ret;

	remove_mem(b);
	o.read_latency_us = b->p.latency_us;
	o.hotset_path = hot;
	o.flags = flags;
	ret = halite_template_open(&t, b->snap, b->mem, &o);
	if (ret) {
		fail("template: %s", halite_strerror(ret));
		return NULL;
	}
	return t;
}

struct starter {
	struct bench *b;
	struct clone *c;
	struct halite_template *t;
	unsigned sflags, i;
	uint64_t off;
	int ret;
};

/* One clone from nothing to running: its process, its engine, its vCPUs. */
static void *start_clone(void *arg)
{
	struct starter *s = arg;

	s->ret = clone_spawn(s->b, s->c, s->i, !s->t, s->off);
	s->c->spawned_ns = halite_now_ns();
	if (!s->ret)
		s->ret = clone_attach_info(s->c) || start_engine(s->b, s->c, s->t, s->sflags) ||
			 clone_cmd(s->c, "start") ? -1 : 0;
	s->c->ready_ns = halite_now_ns();
	return NULL;
}

/*
 * One run: N clones requested at once. @t NULL: independent restores.
 * Fills *r (and c[] for the caller's look at the first clone).
 */
static int run_once(struct bench *b, unsigned n, struct halite_template *t, unsigned sflags,
		    struct result *r, struct clone *c)
{
	uint64_t off = 0, t0, ready[MAX_CLONES], attach[MAX_CLONES], first[MAX_CLONES];
	struct starter st[MAX_CLONES];
	pthread_t th[MAX_CLONES];
	unsigned left = n, n_started;
	int ret = -1;

	memset(c, 0, n * sizeof(*c));
	for (unsigned i = 0; i < n; i++)
		c[i].uffd = -1;
	if (t && halite_template_region(t, "pc.ram", &off, NULL))
		return fail("template has no pc.ram");
	if (bench_drop_cache(b->snap))
		return fail("%s: cannot drop its page cache", b->snap);

	t0 = halite_now_ns();
	/* All N at once, as one request for N clones: a thread each. */
	for (unsigned i = 0; i < n; i++) {
		st[i] = (struct starter){ b, &c[i], t, sflags, i, off, -1 };
		if (pthread_create(&th[i], NULL, start_clone, &st[i])) {
			n_started = i;
			goto joined;
		}
	}
	n_started = n;
joined:
	for (unsigned i = 0; i < n_started; i++)
		pthread_join(th[i], NULL);
	for (unsigned i = 0; i < n; i++) {
		if (i >= n_started || st[i].ret)
			goto out;
		ready[i] = c[i].ready_ns - t0;
		attach[i] = c[i].ready_ns - c[i].spawned_ns;
	}
	/* First response: every vCPU of the clone finished its accesses. */
	while (left) {
		for (unsigned i = 0; i < n; i++)
			if (!c[i].first_ns && clone_done(&c[i])) {
				c[i].first_ns = halite_now_ns();
				c[i].faults_first = engine_faults(&c[i]);
				first[i] = c[i].first_ns - t0;
				left--;
			}
		if (halite_now_ns() - t0 > 600ull * 1000000000)
			return fail("clones not done after 600 s");
		usleep(1000);
	}
	/* Then every restore to its end: the clones idle, all of memory in. */
	for (unsigned i = 0; i < n; i++) {
		ret = c[i].s ? halite_session_wait(c[i].s, 600000) : halite_restore_wait(c[i].r, 600000);
		if (ret) {
			fail("restore of clone %u: %s", i, halite_strerror(ret));
			goto out;
		}
	}
	r->done_s = (double)(halite_now_ns() - t0) / 1e9;
	r->mode = t ? "service" : "independent";
	r->n = n;
	r->ready_p50 = pct(ready, n, 0.50);
	r->ready_p95 = pct(ready, n, 0.95);
	r->attach_p50 = pct(attach, n, 0.50);
	r->attach_p95 = pct(attach, n, 0.95);
	r->first_p50 = pct(first, n, 0.50);
	r->first_p95 = pct(first, n, 0.95);
	r->pss_clones = 0;
	r->faults = 0;
	for (unsigned i = 0; i < n; i++) {
		r->pss_clones += pss_of(c[i].pid);
		r->faults += engine_faults(&c[i]);
	}
	if (t) {
		struct halite_template_stats ts;

		halite_template_stats(t, &ts);
		r->bytes_read = ts.bytes_read;
		r->lb_decoded = ts.lb_demand + ts.lb_prefetch;
		r->cache_bytes = ts.mem_bytes;
		/*
		 * The host's memory: each clone's private pages, plus the template
		 * memory file's resident pages once (the clones' PSS holds their
		 * shares of the file's pages they map: taken out, the file counted
		 * whole). Not the engine's own mapping: it writes with pwrite().
		 */
		uint64_t shared = 0;

		for (unsigned i = 0; i < n; i++)
			shared += pss_of_file(c[i].pid, b->mem);
		r->pss = r->pss_clones - (shared < r->pss_clones ? shared : r->pss_clones) +
			 r->cache_bytes;
	} else {
		r->bytes_read = r->lb_decoded = r->cache_bytes = 0;
		for (unsigned i = 0; i < n; i++) {
			struct halite_restore_stats rs;

			halite_restore_stats(c[i].r, &rs);
			r->bytes_read += rs.bytes_read;
			r->lb_decoded += rs.lb_demand + rs.lb_prefetch;
		}
		r->pss = r->pss_clones;
	}
	ret = 0;
out:
	return ret;
}

static double dmed(double *v, unsigned n)
{
	for (unsigned i = 1; i < n; i++)
		for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

/* Each field the median over the runs (counts of bytes and LBs are the same in every run). */
static void combine(struct result *out, const struct result *runs, unsigned n)
{
	double v[16];

#define MED(f)                                  \
	do {                                    \
		for (unsigned i = 0; i < n; i++) \
			v[i] = (double)runs[i].f; \
		out->f = dmed(v, n);            \
	} while (0)
	*out = runs[0];
	MED(ready_p50);
	MED(ready_p95);
	MED(attach_p50);
	MED(attach_p95);
	MED(first_p50);
	MED(first_p95);
	MED(done_s);
	MED(faults);
	MED(pss);
	MED(pss_clones);
	MED(cache_bytes);
#undef MED
}

static int measure_counts(struct bench *b)
{
	struct clone c[MAX_CLONES];
	struct result runs[16];

	for (unsigned k = 0; k < b->p.ncounts; k++) {
		unsigned n = b->p.counts[k];

		for (int mode = 0; mode < 2; mode++) {
			for (unsigned run = 0; run < b->p.runs; run++) {
				struct halite_template *t = NULL;
				int ret;

				if (mode == 1 && !(t = open_template(b, NULL, 0)))
					return -1;
				if (!b->p.json)
					fprintf(stderr, "%-11s %2u clones, run %u of %u ...\n",
						mode ? "service" : "independent", n, run + 1, b->p.runs);
				ret = run_once(b, n, t, 0, &runs[run], c);
				clones_end(c, n);
				halite_template_free(t);
				remove_mem(b);
				if (ret)
					return -1;
			}
			combine(&b->res[b->nres++], runs, b->p.runs);
		}
	}
	return 0;
}

/* A clone without a hot set, then (fresh memory file) one with the hot set it taught. */
static int measure_hot(struct bench *b)
{
	struct halite_template *t;
	struct halite_template_stats ts;
	struct halite_session_stats ss;
	struct result r;
	struct clone c[1];
	int ret;

	unlink(b->hotpath);
	t = open_template(b, b->hotpath, 0);
	if (!t)
		return -1;
	ret = run_once(b, 1, t, 0, &r, c);
	if (!ret) {
		b->hot.faults_without = c[0].faults_first;
		b->hot.first_without = r.first_p50;
		ret = halite_template_hotset_save(t);
		if (ret)
			fail("saving the hot set: %s", halite_strerror(ret));
	}
	clones_end(c, 1);
	halite_template_free(t);
	if (ret)
		return -1;
	t = open_template(b, b->hotpath, 0);
	if (!t)
		return -1;
	halite_template_stats(t, &ts);
	b->hot.hot_mb = ts.hot_mb;
	ret = run_once(b, 1, t, HALITE_SESSION_PREMAP_HOT | HALITE_SESSION_NO_HOT_RECORD, &r, c);
	if (!ret) {
		b->hot.faults_with = c[0].faults_first;
		b->hot.first_with = r.first_p50;
		halite_session_stats(c[0].s, &ss);
		b->hot.premapped = ss.mb_premapped;
		b->hot.premap_s = (double)ss.ready_ns / 1e9;
	}
	clones_end(c, 1);
	halite_template_free(t);
	remove_mem(b);
	unlink(b->hotpath);
	return ret;
}

static const struct result *find(const struct bench *b, const char *mode, unsigned n)
{
	for (unsigned i = 0; i < b->nres; i++)
		if (!strcmp(b->res[i].mode, mode) && b->res[i].n == n)
			return &b->res[i];
	return NULL;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static void print_json(const struct bench *b)
{
	const struct result *one = find(b, "service", 1);
	const struct result *many = find(b, "service", b->p.counts[b->p.ncounts - 1]);

	printf("{\"ok\": true, \"machine\": ");
	bench_machine_json(b->p.dir);
	printf(",\n \"params\": {\"mem_bytes\": %" PRIu64 ", \"vcpus\": %u, \"accesses\": %" PRIu64
	       ", \"runs\": %u, \"read_latency_us\": %u, \"synth_args\": ",
	       b->p.mem_mib << 20, b->p.vcpus, b->p.accesses, b->p.runs, b->p.latency_us);
	bench_json_str(b->synth_args);
	printf("},\n \"results\": [\n");
	for (unsigned i = 0; i < b->nres; i++) {
		const struct result *r = &b->res[i];

		printf("  {\"mode\": \"%s\", \"clones\": %u, \"ready_p50_s\": ", r->mode, r->n);
		bench_json_num(r->ready_p50, 6);
		printf(", \"ready_p95_s\": ");
		bench_json_num(r->ready_p95, 6);
		printf(", \"attach_p50_s\": ");
		bench_json_num(r->attach_p50, 6);
		printf(", \"attach_p95_s\": ");
		bench_json_num(r->attach_p95, 6);
		printf(", \"first_response_p50_s\": ");
		bench_json_num(r->first_p50, 6);
		printf(", \"first_response_p95_s\": ");
		bench_json_num(r->first_p95, 6);
		printf(", \"all_in_s\": ");
		bench_json_num(r->done_s, 6);
		printf(", \"bytes_read\": %" PRIu64 ", \"lb_decoded\": %" PRIu64 ", \"faults\": %" PRIu64
		       ", \"pss_bytes\": %" PRIu64 ", \"pss_clones_bytes\": %" PRIu64
		       ", \"template_cache_bytes\": %" PRIu64 "}%s\n",
		       r->bytes_read, r->lb_decoded, r->faults, r->pss, r->pss_clones, r->cache_bytes,
		       i + 1 < b->nres ? "," : "");
	}
	printf(" ],\n \"hotset\": {\"hot_blocks\": %" PRIu64 ", \"premapped_blocks\": %" PRIu64
	       ", \"faults_before_first_response_without\": %" PRIu64
	       ", \"faults_before_first_response_with\": %" PRIu64 ", \"first_response_without_s\": ",
	       b->hot.hot_mb, b->hot.premapped, b->hot.faults_without, b->hot.faults_with);
	bench_json_num(b->hot.first_without, 6);
	printf(", \"first_response_with_s\": ");
	bench_json_num(b->hot.first_with, 6);
	printf(", \"premap_s\": ");
	bench_json_num(b->hot.premap_s, 6);
	printf("},\n \"goals\": {\"clones\": %u", many ? many->n : 0);
	if (one && many) {
		printf(", \"ready_p95_ratio\": ");
		bench_json_num(ratio(many->ready_p95, one->ready_p95), 3);
		printf(", \"ready_p95_ratio_max\": 1.5, \"attach_p95_ratio\": ");
		bench_json_num(ratio(many->attach_p95, one->attach_p95), 3);
		printf(", \"bytes_read_ratio\": ");
		bench_json_num(ratio((double)many->bytes_read, (double)one->bytes_read), 3);
		printf(", \"bytes_read_ratio_max\": 1.2, \"pss_ratio\": ");
		bench_json_num(ratio((double)many->pss, (double)one->pss), 3);
		printf(", \"pss_ratio_max\": 2.0");
	}
	printf(", \"hot_fault_ratio\": ");
	bench_json_num(ratio((double)b->hot.faults_with, (double)b->hot.faults_without), 3);
	printf(", \"hot_fault_ratio_max\": 0.5}}\n");
}

static void print_table(const struct bench *b)
{
	printf("%-11s %6s %10s %10s %10s %10s %10s %12s %8s %10s\n", "mode", "clones", "ready p50",
	       "ready p95", "attach p95", "1st p50", "1st p95", "bytes read", "LBs", "memory");
	for (unsigned i = 0; i < b->nres; i++) {
		const struct result *r = &b->res[i];

		printf("%-11s %6u %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %10.1fMi %8" PRIu64
		       " %8.1fMi\n",
		       r->mode, r->n, r->ready_p50 * 1e3, r->ready_p95 * 1e3, r->attach_p95 * 1e3,
		       r->first_p50 * 1e3,
		       r->first_p95 * 1e3, (double)r->bytes_read / 1048576.0, r->lb_decoded,
		       (double)r->pss / 1048576.0);
	}
	printf("\nhot set: %" PRIu64 " blocks; faults before the first response: %" PRIu64
	       " without, %" PRIu64 " with (%.1f ms -> %.1f ms)\n",
	       b->hot.hot_mb, b->hot.faults_without, b->hot.faults_with,
	       b->hot.first_without * 1e3, b->hot.first_with * 1e3);
}

static void usage(FILE *f)
{
	fprintf(f,
"Usage: " CMD " [options]\n"
"\n"
"N clones of one synthetic guest's snapshot started at once, as N independent\n"
"lazy restores and as the clone service's engine (one template, N sessions), in\n"
"the same run; then a clone with and without the learned hot set.\n"
"\n"
"  --quick            64 MiB guest, 1,2,4,8,16 clones, fewer accesses\n"
"  --mem-mib N        guest memory (256; --quick 64), 16..65536, even\n"
"  --vcpus N          1..16 (2)\n"
"  --counts LIST      clone counts, ascending, comma-separated, at most 8, each 1..%d\n"
"                     (1,2,4,8,16)\n"
"  --accesses N       per vCPU before a clone's first response (20000; --quick 5000)\n"
"  --runs N           runs of each count and mode, each figure their median\n"
"                     (3; --quick 1)\n"
"  --latency US       added to every LB read (0)\n"
"  --dir DIR          where the snapshot goes (/var/tmp)\n"
"  --mem-dir DIR      tmpfs for the template memory file and sockets (/dev/shm)\n"
"  --json             one JSON object on stdout instead of the table\n"
"  --keep             keep the snapshot (its path is printed)\n"
"  --version          the version\n"
"Exit: 0 measured, 1 error, 2 usage, 77 userfaultfd unavailable.\n", MAX_CLONES);
}

static int parse_counts(const char *s, struct params *p)
{
	char buf[128], *save = NULL;
	unsigned prev = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	p->ncounts = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (p->ncounts == 8 || !bench_parse_u64(tok, 1, MAX_CLONES, &v) || v <= prev)
			return -1;
		p->counts[p->ncounts++] = (unsigned)v;
		prev = (unsigned)v;
	}
	return p->ncounts ? 0 : -1;
}

static bool takes_value(const char *a)
{
	static const char *const valued[] = { "--mem-mib", "--vcpus", "--counts", "--accesses",
					      "--runs", "--latency", "--dir", "--mem-dir" };

	for (size_t i = 0; i < sizeof(valued) / sizeof(valued[0]); i++)
		if (!strcmp(a, valued[i]))
			return true;
	return false;
}

static int parse(int argc, char **argv, struct params *p)
{
	bool mem_set = false, acc_set = false, json = halite_cli_has_json(argc, argv);

	*p = (struct params){ .mem_mib = 256, .vcpus = 2, .accesses = 20000, .dir = "/var/tmp",
			      .mem_dir = "/dev/shm", .counts = { 1, 2, 4, 8, 16 }, .ncounts = 5 };
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t x;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 1;
		} else if (!strcmp(a, "--version")) {
			halite_cli_version("halite-bench");
			return 1;
		} else if (!strcmp(a, "--quick")) {
			p->quick = true;
		} else if (!strcmp(a, "--json")) {
			p->json = true;
		} else if (!strcmp(a, "--keep")) {
			p->keep = true;
		} else if (!v && takes_value(a)) {
			return bench_fail(PROG, json, 2,
					  "option '%s' needs a value (" CMD " --help)", a);
		} else if (!strcmp(a, "--mem-mib")) {
			if (!bench_parse_u64(v, 16, 65536, &x) || x % 2)
				return bench_bad_arg(PROG, json, a, v,
						     "an even number of MiB, 16..65536");
			p->mem_mib = x;
			mem_set = true;
			i++;
		} else if (!strcmp(a, "--vcpus")) {
			if (!bench_parse_u64(v, 1, 16, &x))
				return bench_bad_arg(PROG, json, a, v, "1..16");
			p->vcpus = (unsigned)x;
			i++;
		} else if (!strcmp(a, "--counts")) {
			if (parse_counts(v, p))
				return bench_bad_arg(PROG, json, a, v,
						     "ascending counts 1..64, at most 8");
			i++;
		} else if (!strcmp(a, "--accesses")) {
			if (!bench_parse_u64(v, 1, 1000000000, &x))
				return bench_bad_arg(PROG, json, a, v, "1..1000000000");
			p->accesses = x;
			acc_set = true;
			i++;
		} else if (!strcmp(a, "--runs")) {
			if (!bench_parse_u64(v, 1, 15, &x))
				return bench_bad_arg(PROG, json, a, v, "1..15");
			p->runs = (unsigned)x;
			i++;
		} else if (!strcmp(a, "--latency")) {
			if (!bench_parse_u64(v, 0, 1000000, &x))
				return bench_bad_arg(PROG, json, a, v, "0..1000000 microseconds");
			p->latency_us = (uint32_t)x;
			i++;
		} else if (!strcmp(a, "--dir")) {
			p->dir = v;
			i++;
		} else if (!strcmp(a, "--mem-dir")) {
			p->mem_dir = v;
			i++;
		} else {
			return bench_fail(PROG, json, 2, "unknown option '%.*s' (" CMD " --help)",
					  (int)strcspn(a, "="), a);
		}
	}
	if (p->quick && !mem_set)
		p->mem_mib = 64;
	if (p->quick && !acc_set)
		p->accesses = 5000;
	if (!p->runs)
		p->runs = p->quick ? 1 : 3;
	p->save_accesses = p->accesses;
	return 0;
}

int cmd_clones(int argc, char **argv)
{
	struct bench *b = calloc(1, sizeof(*b));
	int ret;

	if (!b)
		return 1;
	ret = parse(argc, argv, &b->p);
	if (ret) {
		free(b);
		return ret == 1 ? 0 : ret;
	}
	ret = bench_preflight(PROG, b->p.json, b->p.dir);
	if (ret) {
		free(b);
		return ret;
	}
	snprintf(b->snap, sizeof(b->snap), "%s/halite-bench-clones-%d.hlt", b->p.dir, (int)getpid());
	snprintf(b->mem, sizeof(b->mem), "%s/halite-bench-clones-%d.mem", b->p.mem_dir,
		 (int)getpid());
	snprintf(b->hotpath, sizeof(b->hotpath), "%s/halite-bench-clones-%d.hot", b->p.dir, (int)getpid());
	ret = find_synth(b) || make_snapshot(b) || measure_counts(b) || measure_hot(b) ? 1 : 0;
	if (!ret) {
		if (b->p.json)
			print_json(b);
		else
			print_table(b);
	} else if (b->p.json) {
		/* What failed is on stderr already (fail()). */
		halite_cli_json_fail(stdout, "the benchmark failed; what failed is on stderr", 1);
	}
	if (b->p.keep)
		fprintf(stderr, PROG ": snapshot kept: %s\n", b->snap);
	else
		unlink(b->snap);
	remove_mem(b);
	unlink(b->hotpath);
	free(b);
	return ret;
}
