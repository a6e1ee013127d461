// SPDX-License-Identifier: MIT
/*
 * halite-cloned: what confines a clone. Two jobs, both about what a clone
 * process may do to the host:
 *
 * - A synthetic template's `synth.args` (metadata of a file the daemon did
 *   not write) is checked against the layout options hs_synth_args() writes,
 *   each with a value of its shape. Anything else (--control, --mem-file, a
 *   path) is refused: a root halite-synth given another socket's path would
 *   unlink it and listen in its place.
 *
 * - Each clone runs in a cgroup of its own, HIER/halite-cloned/CID, with the
 *   memory and CPU limits its request, its template or the daemon asked for.
 *   cgroup v2 where the unified hierarchy offers the memory controller, else
 *   the v1 memory and cpu hierarchies. The hierarchy is found once at start
 *   (confine_init); a clone's cgroup paths follow from its id, so a restarted
 *   daemon finds them without a record. A clone the kernel killed for its
 *   memory limit is told by the cgroup's oom_kill counter, read before the
 *   cgroup is removed.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cloned.h"

#define CG_DIR "halite-cloned"
#define CG_PERIOD_US 100000

/* --- synth.args ------------------------------------------------------------ */

enum arg_shape { A_FLAG, A_UINT, A_SIZE };

static const struct {
	const char *name;
	enum arg_shape shape;
} synth_allowed[] = {
	{ "--mem", A_SIZE },	  { "--vcpus", A_UINT },    { "--levels", A_UINT },
	{ "--stride", A_UINT },	  { "--shared-as", A_FLAG }, { "--huge2m", A_UINT },
	{ "--huge1g", A_UINT },	  { "--holes", A_UINT },    { "--junk", A_FLAG },
	{ "--ad-bits", A_FLAG },  { "--compress", A_UINT }, { "--zero", A_UINT },
	{ "--untouched", A_UINT }, { "--map", A_SIZE },	    { "--ws", A_SIZE },
	{ "--seed", A_UINT },
};

/* Decimal digits, at most 20 (a uint64); SIZE: then K, M or G (hs_synth_args writes K). */
static bool shape_ok(const char *v, enum arg_shape shape)
{
	size_t n = 0;

	while (isdigit((unsigned char)v[n]))
		n++;
	if (!n || n > 20)
		return false;
	if (shape == A_SIZE && v[n] && strchr("KMG", v[n]))
		n++;
	return !v[n];
}

int confine_synth_args_check(const char *args, char *err, size_t errlen)
{
	char *copy = strdup(args), *save = NULL;
	int ret = 0, words = 0;

	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (char *w = strtok_r(copy, " \t\n", &save); w && !ret;
	     w = strtok_r(NULL, " \t\n", &save)) {
		size_t k = 0;
		char *v;

		if (++words > 64) {
			snprintf(err, errlen, "its synth.args has more than 64 words");
			ret = -E2BIG;
			break;
		}
		while (k < sizeof(synth_allowed) / sizeof(synth_allowed[0]) &&
		       strcmp(w, synth_allowed[k].name))
			k++;
		if (k == sizeof(synth_allowed) / sizeof(synth_allowed[0])) {
			snprintf(err, errlen,
				 "its synth.args has '%.200s', which is not a layout option of "
				 "halite-synth (only what halite-synth save records: --mem, --vcpus, "
				 "--levels, --stride, --shared-as, --huge2m, --huge1g, --holes, "
				 "--junk, --ad-bits, --compress, --zero, --untouched, --map, --ws, "
				 "--seed)", w);
			ret = -EPERM;
			break;
		}
		if (synth_allowed[k].shape == A_FLAG)
			continue;
		v = strtok_r(NULL, " \t\n", &save);
		if (!v || !shape_ok(v, synth_allowed[k].shape)) {
			const char *want = synth_allowed[k].shape == A_SIZE ?
				"a size (MiB, or a number with K, M or G)" : "a non-negative integer";

			if (v)
				snprintf(err, errlen, "its synth.args has %s '%.100s': want %s", w, v,
					 want);
			else
				snprintf(err, errlen, "its synth.args has %s without a value: want %s",
					 w, want);
			ret = -EINVAL;
		}
	}
	free(copy);
	return ret;
}

/* --- cgroups --------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const char *val)
{
	char path[PATH_MAX];
	int fd, ret = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, val, strlen(val)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* The first line of DIR/NAME, or, with @key, the number after "KEY " in it (-1: none). */
static int64_t read_key(const char *dir, const char *name, const char *key)
{
	char path[PATH_MAX], line[256];
	size_t kl = key ? strlen(key) : 0;
	int64_t v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!key) {
			v = strtoll(line, NULL, 10);
			break;
		}
		if (!strncmp(line, key, kl) && line[kl] == ' ') {
			v = strtoll(line + kl + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

static bool has_file(const char *dir, const char *name)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return !access(path, F_OK);
}

/* Whether the comma- or space-separated @list names @word. */
static bool list_has(const char *list, const char *word, const char *seps)
{
	size_t n = strlen(word);

	for (const char *p = list; *p; p += strcspn(p, seps), p += *p != 0) {
		if (!strncmp(p, word, n) && (!p[n] || strchr(seps, p[n])))
			return true;
	}
	return false;
}

/* ROOT/halite-cloned made (v2: with @ctrls enabled for its children); its path, or NULL. */
static char *make_parent(const char *root, const char *ctrls, char *why, size_t whylen)
{
	char *p = NULL;

	if (asprintf(&p, "%s/" CG_DIR, root) < 0)
		return NULL;
	/* made by an earlier daemon, perhaps: it must take clones' cgroups now */
	if ((mkdir(p, 0755) && errno != EEXIST) || access(p, W_OK)) {
		snprintf(why, whylen, "%s: %s", p, strerror(errno));
		free(p);
		return NULL;
	}
	if (ctrls) {
		int r1 = write_file(root, "cgroup.subtree_control", ctrls);
		int r2 = r1 ? r1 : write_file(p, "cgroup.subtree_control", ctrls);

		if (r2) {
			snprintf(why, whylen, "enabling %s in %s: %s", ctrls, p, strerror(-r2));
			rmdir(p);
			free(p);
			return NULL;
		}
	}
	return p;
}

void confine_init(struct cloned *d)
{
	char line[4096], v2[PATH_MAX] = "", mem1[PATH_MAX] = "", cpu1[PATH_MAX] = "";
	char why[512] = "no cgroup hierarchy is mounted";
	struct confine *cg = &d->cg;
	FILE *f = fopen("/proc/self/mountinfo", "re");

	/* mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS] - FSTYPE SOURCE SUPEROPTS */
	while (f && fgets(line, sizeof(line), f)) {
		char root[PATH_MAX], mnt[PATH_MAX], fstype[64], src[256], sopts[1024];
		const char *dash = strstr(line, " - ");

		if (!dash || sscanf(line, "%*s %*s %*s %4095s %4095s", root, mnt) != 2 ||
		    sscanf(dash + 3, "%63s %255s %1023s", fstype, src, sopts) != 3 ||
		    strcmp(root, "/"))
			continue;
		if (!strcmp(fstype, "cgroup2") && !v2[0])
			snprintf(v2, sizeof(v2), "%s", mnt);
		else if (!strcmp(fstype, "cgroup") && list_has(sopts, "memory", ",") && !mem1[0])
			snprintf(mem1, sizeof(mem1), "%s", mnt);
		else if (!strcmp(fstype, "cgroup") && list_has(sopts, "cpu", ",") && !cpu1[0])
			snprintf(cpu1, sizeof(cpu1), "%s", mnt);
	}
	if (f)
		fclose(f);
	if (v2[0]) {
		char ctl[PATH_MAX + 32], avail[256] = "";
		FILE *c;

		snprintf(ctl, sizeof(ctl), "%s/cgroup.controllers", v2);
		c = fopen(ctl, "re");
		if (c) {
			if (!fgets(avail, sizeof(avail), c))
				avail[0] = 0;
			avail[strcspn(avail, "\n")] = 0;
			fclose(c);
		}
		if (list_has(avail, "memory", " ")) {
			bool cpu = list_has(avail, "cpu", " ");

			cg->version = 2;
			cg->mem = make_parent(v2, cpu ? "+memory +cpu" : "+memory", why,
					      sizeof(why));
			cg->cpu = cg->mem && cpu ? strdup(cg->mem) : NULL;
			goto out;
		}
	}
	if (mem1[0] || cpu1[0]) {
		cg->version = 1;
		cg->mem = mem1[0] ? make_parent(mem1, NULL, why, sizeof(why)) : NULL;
		cg->cpu = cpu1[0] ? make_parent(cpu1, NULL, why, sizeof(why)) : NULL;
		if (!mem1[0])
			snprintf(why, sizeof(why), "no cgroup v1 memory hierarchy is mounted");
		else if (!cpu1[0] && cg->mem)
			snprintf(why, sizeof(why), "no cgroup v1 cpu hierarchy is mounted");
	}
out:
	snprintf(cg->why, sizeof(cg->why), "%s", why);
	if (cg->mem || cg->cpu)
		cl_log(d, HALITE_LOG_INFO, "clones run in cgroups (v%d): memory %s, cpu %s",
		       cg->version, cg->mem ? cg->mem : "none", cg->cpu ? cg->cpu : "none");
	else
		cl_log(d, HALITE_LOG_WARN, "clones run in no cgroup (%s): memory_max and cpu_max "
		       "cannot be applied", why);
}

void confine_fini(struct cloned *d)
{
	free(d->cg.mem);
	free(d->cg.cpu);
	d->cg.mem = d->cg.cpu = NULL;
}

int confine_check(const struct cloned *d, uint64_t memory_max, double cpu_max, char *err,
		  size_t errlen)
{
	if (memory_max && !d->cg.mem) {
		snprintf(err, errlen, "memory_max cannot be applied: no writable cgroup with the "
			 "memory controller (%s)", d->cg.why);
		return -ENOTSUP;
	}
	if (cpu_max > 0 && !d->cg.cpu) {
		snprintf(err, errlen, "cpu_max cannot be applied: no writable cgroup with the cpu "
			 "controller (%s)", d->cg.why);
		return -ENOTSUP;
	}
	return 0;
}

/* HIER/halite-cloned/CID of @base (d->cg.mem or .cpu), or NULL. */
static char *cg_path(const char *base, const char *cid)
{
	char *p;

	if (!base || asprintf(&p, "%s/%s", base, cid) < 0)
		return NULL;
	return p;
}

char *confine_path(const struct cloned *d, const struct clone *c)
{
	return cg_path(d->cg.mem ? d->cg.mem : d->cg.cpu, c->id);
}

/*
 * @c's v1 cpu cgroup, only when it has a CPU limit: under CFS group
 * scheduling a cgroup weighs as one task against every task outside it, so
 * a clone's vCPU threads in a cgroup of their own would get far less CPU on
 * a busy host than they do unconfined. NULL without.
 */
static char *cpu_path(const struct cloned *d, const struct clone *c)
{
	return d->cg.version == 1 && c->cpu_max > 0 ? cg_path(d->cg.cpu, c->id) : NULL;
}

/* The cgroup(s) of @c made and limited: 0, or -errno with @err. */
int confine_create(struct cloned *d, struct clone *c, char *err, size_t errlen)
{
	char *mem = cg_path(d->cg.mem, c->id), *cpu = cpu_path(d, c);
	char v[64];
	int ret = 0;

	if (mem && mkdir(mem, 0755) && errno != EEXIST) {
		ret = -errno;
		snprintf(err, errlen, "cgroup %s: %s", mem, strerror(errno));
		goto out;
	}
	if (cpu && mkdir(cpu, 0755) && errno != EEXIST) {
		ret = -errno;
		snprintf(err, errlen, "cgroup %s: %s", cpu, strerror(errno));
		goto out;
	}
	if (c->memory_max) {
		snprintf(v, sizeof(v), "%" PRIu64, c->memory_max);
		if (d->cg.version == 2) {
			ret = write_file(mem, "memory.max", v);
			/* no swap: the limit is the memory it may use */
			if (!ret && has_file(mem, "memory.swap.max"))
				ret = write_file(mem, "memory.swap.max", "0");
		} else {
			ret = write_file(mem, "memory.limit_in_bytes", v);
			if (!ret && has_file(mem, "memory.memsw.limit_in_bytes"))
				ret = write_file(mem, "memory.memsw.limit_in_bytes", v);
		}
		if (ret) {
			snprintf(err, errlen, "setting memory_max %s in cgroup %s: %s", v, mem,
				 strerror(-ret));
			goto out;
		}
	}
	if (c->cpu_max > 0) {
		uint64_t quota = (uint64_t)llround(c->cpu_max * CG_PERIOD_US);
		const char *dir = d->cg.version == 2 ? mem : cpu;

		if (d->cg.version == 2) {
			snprintf(v, sizeof(v), "%" PRIu64 " %u", quota, CG_PERIOD_US);
			ret = write_file(dir, "cpu.max", v);
		} else {
			snprintf(v, sizeof(v), "%u", CG_PERIOD_US);
			ret = write_file(dir, "cpu.cfs_period_us", v);
			snprintf(v, sizeof(v), "%" PRIu64, quota);
			if (!ret)
				ret = write_file(dir, "cpu.cfs_quota_us", v);
		}
		if (ret) {
			snprintf(err, errlen, "setting cpu_max %g in cgroup %s: %s", c->cpu_max,
				 dir ? dir : "(none)", strerror(-ret));
			goto out;
		}
	}
out:
	free(mem);
	free(cpu);
	return ret;
}

/* @pid moved into @c's cgroup(s); its children to come follow it. */
int confine_attach(struct cloned *d, const struct clone *c, pid_t pid, char *err, size_t errlen)
{
	char *dirs[2] = { cg_path(d->cg.mem, c->id), cpu_path(d, c) };
	char v[32];
	int ret = 0;

	snprintf(v, sizeof(v), "%d", (int)pid);
	for (int i = 0; i < 2 && !ret; i++) {
		if (dirs[i] && (ret = write_file(dirs[i], "cgroup.procs", v)))
			snprintf(err, errlen, "moving the clone (pid %d) into cgroup %s: %s",
				 (int)pid, dirs[i], strerror(-ret));
	}
	free(dirs[0]);
	free(dirs[1]);
	return ret;
}

/* How many processes of @c the kernel's OOM killer ended for its memory limit. */
static int64_t oom_kills(const struct cloned *d, const struct clone *c)
{
	char *mem = cg_path(d->cg.mem, c->id);
	int64_t n;

	if (!mem)
		return 0;
	n = d->cg.version == 2 ? read_key(mem, "memory.events", "oom_kill") :
				 read_key(mem, "memory.oom_control", "oom_kill");
	free(mem);
	return n > 0 ? n : 0;
}

/* Every process left in @dir killed, then @dir removed (it may take the kernel a moment). */
static void remove_dir(const char *dir)
{
	for (int tries = 0; tries < 100; tries++) {
		char path[PATH_MAX], line[32];
		FILE *f;

		if (!rmdir(dir) || errno == ENOENT)
			return;
		if (errno != EBUSY)
			break;
		snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
		f = fopen(path, "re");
		while (f && fgets(line, sizeof(line), f))
			kill((pid_t)atoi(line), SIGKILL);
		if (f)
			fclose(f);
		nanosleep(&(struct timespec){ 0, 10 * 1000000 }, NULL);
	}
}

void confine_remove(struct cloned *d, const struct clone *c)
{
	char *mem = cg_path(d->cg.mem, c->id), *cpu = d->cg.version == 1 ? cg_path(d->cg.cpu, c->id) : NULL;

	if (mem)
		remove_dir(mem);
	if (cpu)
		remove_dir(cpu);
	free(mem);
	free(cpu);
}

/*
 * @c's process is gone: whether its memory limit killed it (then it is
 * failed, with the limit named, and its record says so), then its cgroup
 * removed. Lock held.
 */
void confine_exited(struct cloned *d, struct clone *c)
{
	if (oom_kills(d, c) > 0) {
		uint64_t limit = c->memory_max;

		if (!limit) { /* a restarted daemon's clone: the limit from its cgroup */
			char *mem = cg_path(d->cg.mem, c->id);
			int64_t v = mem ? read_key(mem, d->cg.version == 2 ? "memory.max" :
						   "memory.limit_in_bytes", NULL) : -1;

			limit = v > 0 ? (uint64_t)v : 0;
			free(mem);
		}
		c->state = CL_FAILED;
		snprintf(c->error, sizeof(c->error),
			 "out of memory: the clone exceeded its memory limit of %" PRIu64
			 " MiB (memory_max)", limit >> 20);
		cl_log(d, HALITE_LOG_ERROR, "clone %s (pid %d): %s", c->id, (int)c->pid, c->error);
		state_save_clone(d, c);
	}
	confine_remove(d, c);
}

/*
 * A request's "memory_max" (bytes, an integer, 1 MiB at least) and "cpu_max"
 * (CPUs, 0.01 .. 1024): each written only when present. 0, or -EINVAL with
 * the sentence in @err.
 */
int confine_parse_limits(const cJSON *body, uint64_t *memory_max, double *cpu_max, char *err,
			 size_t errlen)
{
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "memory_max");
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(body, "cpu_max");

	if (m && (!cJSON_IsNumber(m) || m->valuedouble != floor(m->valuedouble) ||
		  m->valuedouble < (double)(1 << 20) || m->valuedouble > 0x1p50)) {
		snprintf(err, errlen, "field 'memory_max' must be an integer number of bytes, "
			 "1048576 (1 MiB) .. 2^50");
		return -EINVAL;
	}
	if (c && (!cJSON_IsNumber(c) || !(c->valuedouble >= 0.01 && c->valuedouble <= 1024))) {
		snprintf(err, errlen, "field 'cpu_max' must be a number of CPUs, 0.01 .. 1024 "
			 "(e.g. 0.5)");
		return -EINVAL;
	}
	if (m)
		*memory_max = (uint64_t)m->valuedouble;
	if (c)
		*cpu_max = c->valuedouble;
	return 0;
}

/*
 * At start, after the clones are loaded: the cgroups of clones that are gone
 * (a daemon killed, its clones ended by someone else) removed, when empty.
 * Only those older than a minute: another daemon on the host may have made
 * one a moment ago for a clone it is about to move in.
 */
void confine_sweep(struct cloned *d)
{
	const char *bases[2] = { d->cg.mem, d->cg.version == 1 ? d->cg.cpu : NULL };
	time_t old = time(NULL) - 60;

	for (int i = 0; i < 2; i++) {
		DIR *dh = bases[i] ? opendir(bases[i]) : NULL;
		struct dirent *e;

		while (dh && (e = readdir(dh))) {
			char path[PATH_MAX];
			bool ours = false;
			struct stat st;

			if (!cl_valid_id(e->d_name, 'c'))
				continue;
			pthread_mutex_lock(&d->lock);
			for (struct clone *c = d->clones; c && !ours; c = c->next)
				ours = !strcmp(c->id, e->d_name);
			pthread_mutex_unlock(&d->lock);
			snprintf(path, sizeof(path), "%s/%s", bases[i], e->d_name);
			if (!ours && !stat(path, &st) && st.st_mtime < old && !rmdir(path))
				cl_log(d, HALITE_LOG_INFO, "cgroup %s of a clone that is gone: removed",
				       path);
		}
		if (dh)
			closedir(dh);
	}
}
