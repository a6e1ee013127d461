/* SPDX-License-Identifier: MIT */
/*
 * A save never destroys the snapshot already at its path (issue 12, item 1).
 *
 * Each case starts from a directory holding one older, valid snapshot at the
 * target path, fails the new save in one way, and then checks that the older
 * file is byte for byte what it was and that the directory holds exactly
 * what it held before (plus TARGET.incomplete when the partial file is
 * kept): an injected ENOSPC or EIO on a locality-block write (buffered and
 * O_DIRECT), a failure in finish's own writes, and a writer freed without
 * finish, with and without unlink. A successful save replaces the
 * file whole: a reader holding the older file reads it intact afterwards,
 * and a thread opening the path all along only ever finds a complete file.
 * Files are mode 0600 whatever the umask allows; the temporary file is
 * created O_EXCL and never clobbers a file already under its name. Targets
 * refused before anything is created: one a restore holds (flock LOCK_SH,
 * -EBUSY), one in a missing (-ENOENT) or read-only (-EROFS) directory, under
 * a regular file (-ENOTDIR), a directory (-EISDIR), and a symlink to a device
 * (-EINVAL): each its own code and a message naming the path.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <halite/errors.h>
#include <halite/format.h>

#include "test_util.h"
#include "writer_test.h"

#define LB_SIZE 16384u
#define MEM_LEN (1u << 20)
#define MB_SIZE (HALITE_DEFAULT_PAGE_SIZE * HALITE_DEFAULT_MB_PAGES)
#define NMB (MEM_LEN / MB_SIZE)
#define MAX_NAMES 16

static uint64_t g_seed;
static const struct halite_region g_region = { .name = "pc.ram", .gpa = 0, .length = MEM_LEN };

/* A case's directory, the target in it, and the older snapshot's bytes. */
struct scene {
	char *dir;
	char *target;
	uint8_t *old;
	size_t old_len;
	uint8_t *mem; /* what the new save writes */
};

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	assert_true(n > 0);
	return p;
}

static uint8_t *read_all(const char *path, size_t *len)
{
	struct stat st;
	uint8_t *buf;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		fail_msg("%s: %s", path, strerror(errno));
	assert_int_equal(fstat(fd, &st), 0);
	buf = malloc((size_t)st.st_size + 1);
	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

static void fill(uint8_t *mem, uint64_t seed)
{
	for (uint32_t m = 0; m < NMB; m++)
		t_fill(mem + (size_t)m * MB_SIZE, MB_SIZE, 30 + (unsigned)(m % 50), &seed);
}

static struct halite_writer *create(const char *path, unsigned flags, int *ret)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;

	o.lb_size = LB_SIZE;
	o.flags = HALITE_WRITER_NO_SYNC | flags;
	o.io_backend = HALITE_IO_BACKEND_PSYNC;
	*ret = halite_writer_create(&w, path, &g_region, 1, &o);
	return *ret ? NULL : w;
}

/* Put every MB; 0 or the first failure. */
static int put_all(struct halite_writer *w, const uint8_t *mem)
{
	for (uint32_t m = 0; m < NMB; m++) {
		int ret = halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, m % 2), m,
					    mem + (size_t)m * MB_SIZE);

		if (ret)
			return ret;
	}
	return 0;
}

static void write_file(const char *path, const uint8_t *mem)
{
	struct halite_writer *w;
	int ret;

	w = create(path, 0, &ret);
	assert_int_equal(ret, 0);
	assert_int_equal(put_all(w, mem), 0);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
}

/* The file at @path opens and holds @mem. */
static void check_holds(const char *path, const uint8_t *mem)
{
	struct halite_reader *r;
	uint8_t *out = malloc(MB_SIZE);
	int ret = halite_reader_open(&r, path, NULL);

	if (ret)
		fail_msg("%s: %s", path, halite_strerror(ret));
	for (uint32_t m = 0; m < NMB; m++) {
		assert_int_equal(halite_reader_read_mb(r, m, out), 0);
		assert_memory_equal(out, mem + (size_t)m * MB_SIZE, MB_SIZE);
	}
	halite_reader_free(r);
	free(out);
}

static void scene_init(struct scene *s, const char *name)
{
	uint8_t *mem = malloc(MEM_LEN);

	s->dir = xasprintf("%s/%s", t_tmpdir(), name);
	assert_int_equal(mkdir(s->dir, 0700), 0);
	s->target = xasprintf("%s/snap.hlt", s->dir);
	assert_non_null(mem);
	fill(mem, g_seed ^ 0x01d);
	write_file(s->target, mem);
	/* Whatever mode a save would give it: the older file must keep its own. */
	assert_int_equal(chmod(s->target, 0644), 0);
	s->old = read_all(s->target, &s->old_len);
	assert_true(s->old_len > 4 * LB_SIZE);
	free(mem);
	s->mem = malloc(MEM_LEN);
	assert_non_null(s->mem);
	fill(s->mem, g_seed ^ 0x2e3);
}

/* Every name in the directory but . and .., sorted, joined by spaces. */
static char *listing(const char *dir)
{
	char *names[MAX_NAMES], *out;
	size_t n = 0, len = 1;
	struct dirent *e;
	DIR *d = opendir(dir);

	assert_non_null(d);
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		assert_true(n < MAX_NAMES);
		names[n] = strdup(e->d_name);
		len += strlen(e->d_name) + 1;
		n++;
	}
	closedir(d);
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char *t = names[j];

			names[j] = names[j - 1];
			names[j - 1] = t;
		}
	out = calloc(1, len);
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(out, " ");
		strcat(out, names[i]);
		free(names[i]);
	}
	return out;
}

static void expect_listing(const char *dir, const char *want)
{
	char *got = listing(dir);

	if (strcmp(got, want))
		fail_msg("%s holds '%s', expected '%s'", dir, got, want);
	free(got);
}

/* The older snapshot is at the target, byte for byte, and still opens. */
static void expect_old(const struct scene *s)
{
	size_t len;
	uint8_t *now = read_all(s->target, &len);

	assert_int_equal(len, s->old_len);
	assert_memory_equal(now, s->old, len);
	free(now);
}

/* A kept partial file: at TARGET.incomplete, mode 0600, and refused. */
static void expect_kept(const struct scene *s)
{
	char *kept = xasprintf("%s.incomplete", s->target);
	struct halite_reader *r = NULL;
	struct stat st;

	assert_int_equal(stat(kept, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(halite_reader_open(&r, kept, NULL), -HALITE_E_INCOMPLETE);
	assert_null(r);
	free(kept);
}

static void scene_free(struct scene *s)
{
	char *cmd = xasprintf("rm -rf '%s'", s->dir);

	assert_int_equal(system(cmd), 0);
	free(cmd);
	free(s->dir);
	free(s->target);
	free(s->old);
	free(s->mem);
}

/* The writer's temporary file while it runs: one new ".snap.hlt.XXXXXX", mode 0600. */
static void expect_temp(const struct scene *s)
{
	char *names = listing(s->dir), *tmp, *path;
	struct stat st;

	/* Sorted: the dot file comes first, then the target. */
	if (strncmp(names, ".snap.hlt.", 10) || strlen(names) != 16 + 9 ||
	    strcmp(names + 16, " snap.hlt"))
		fail_msg("while writing, %s holds '%s'", s->dir, names);
	tmp = strndup(names, 16);
	for (int i = 10; i < 16; i++)
		assert_non_null(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
				       "0123456789", tmp[i]));
	path = xasprintf("%s/%s", s->dir, tmp);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	free(path);
	free(tmp);
	free(names);
}

/*
 * An injected ENOSPC or EIO on a locality-block write, buffered and O_DIRECT,
 * the partial file removed or kept: the older file is untouched throughout.
 */
static void test_write_failure(void **state)
{
	static const int errs[] = { ENOSPC, EIO };

	for (int direct = 0; direct < 2; direct++) {
		for (size_t e = 0; e < 2; e++) {
			for (int keep = 0; keep < 2; keep++) {
				struct scene s;
				struct halite_writer *w;
				int ret;

				scene_init(&s, "wfail");
				w = create(s.target, direct ? HALITE_WRITER_DIRECT : 0, &ret);
				if (direct && ret == -HALITE_E_UNSUPPORTED) {
					fprintf(stderr, "# O_DIRECT refused here: skipped\n");
					expect_listing(s.dir, "snap.hlt");
					scene_free(&s);
					return;
				}
				assert_int_equal(ret, 0);
				/* Before anything more: the older file is still there, whole. */
				expect_old(&s);
				expect_temp(&s);
				halite_writer_test_fail_writes(w, 3 * LB_SIZE + LB_SIZE / 2,
							       errs[e]);
				ret = put_all(w, s.mem);
				if (!ret)
					ret = halite_writer_finish(w);
				assert_int_equal(ret, -errs[e]);
				expect_old(&s);
				assert_int_equal(halite_writer_finish(w), -HALITE_E_STATE);
				halite_writer_free(w, !keep);
				expect_old(&s);
				if (keep) {
					expect_listing(s.dir, "snap.hlt snap.hlt.incomplete");
					expect_kept(&s);
				} else {
					expect_listing(s.dir, "snap.hlt");
				}
				fprintf(stderr, "%s%s, partial file %s: older file intact\n",
					strerror(errs[e]), direct ? " (O_DIRECT)" : "",
					keep ? "kept" : "removed");
				scene_free(&s);
			}
		}
	}
}

/*
 * Scene @name set up in @s, and a writer on its target with every MB put and
 * vCPU 0's stream flushed: a save half done.
 */
static struct halite_writer *create_half_done(struct scene *s, const char *name)
{
	struct halite_writer *w;
	int ret;

	scene_init(s, name);
	w = create(s->target, 0, &ret);
	assert_int_equal(ret, 0);
	assert_int_equal(put_all(w, s->mem), 0);
	assert_int_equal(halite_writer_flush_stream(w, HALITE_STREAM(HALITE_STREAM_VCPU, 0)), 0);
	return w;
}

/*
 * The unfinished writer @w freed, @keep-ing its partial file or not: the
 * older snapshot stays as it was either way, the partial file only if kept.
 * @s freed.
 */
static void free_unfinished(struct scene *s, struct halite_writer *w, int keep)
{
	expect_old(s);
	halite_writer_free(w, !keep);
	expect_old(s);
	expect_listing(s->dir, keep ? "snap.hlt snap.hlt.incomplete" : "snap.hlt");
	if (keep)
		expect_kept(s);
	scene_free(s);
}

/* Freed without finish, as a save that dies or is cancelled: with and without unlink. */
static void test_free_without_finish(void **state)
{
	for (int keep = 0; keep < 2; keep++) {
		struct scene s;
		struct halite_writer *w;

		w = create_half_done(&s, "nofinish");
		free_unfinished(&s, w, keep);
	}
	/* A kept partial file replaces an older one, and no partial file is ever the target. */
	{
		static const char older[] = "an older partial file";
		struct scene s;
		struct halite_writer *w;
		char *kept;
		size_t len;
		uint8_t *b;
		int ret, fd;

		scene_init(&s, "nofinish2");
		kept = xasprintf("%s.incomplete", s.target);
		fd = open(kept, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, older, sizeof(older)), sizeof(older));
		close(fd);
		w = create(s.target, 0, &ret);
		assert_int_equal(ret, 0);
		assert_int_equal(put_all(w, s.mem), 0);
		halite_writer_free(w, false);
		expect_old(&s);
		expect_listing(s.dir, "snap.hlt snap.hlt.incomplete");
		expect_kept(&s);
		b = read_all(kept, &len);
		assert_true(len > 4 * LB_SIZE); /* the new partial file, not the older one */
		free(b);
		free(kept);
		scene_free(&s);
	}
}

/*
 * Finish itself fails: its section writes (every LB written, then the
 * budget runs out), and a restore that opened the target after create.
 */
static void test_finish_failure(void **state)
{
	for (int keep = 0; keep < 2; keep++) {
		struct scene s;
		struct halite_writer *w;

		w = create_half_done(&s, "finfail");
		assert_int_equal(halite_writer_flush_stream(w, HALITE_STREAM(HALITE_STREAM_VCPU, 1)),
				 0);
		/* Nothing more may be written: the sections fail. */
		halite_writer_test_fail_writes(w, 0, EIO);
		assert_int_equal(halite_writer_finish(w), -EIO);
		assert_non_null(strstr(halite_writer_errmsg(w), "writing sections"));
		free_unfinished(&s, w, keep);
	}
}

struct watcher {
	const char *path;
	atomic_bool stop;
	atomic_uint opens, bad;
	atomic_int first_bad;
	pthread_t th;
	bool running;
};

/* Not on test_replace's stack: a failed assertion leaves that frame, not the thread. */
static struct watcher g_watch;

/* Opens the target over and over: it must always be a complete file. */
static void *watch(void *arg)
{
	struct watcher *wt = arg;

	while (!atomic_load(&wt->stop)) {
		struct halite_reader *r;
		int ret = halite_reader_open(&r, wt->path, NULL);

		if (ret) {
			int zero = 0;

			atomic_compare_exchange_strong(&wt->first_bad, &zero, ret);
			atomic_fetch_add(&wt->bad, 1);
		} else {
			halite_reader_free(r);
		}
		atomic_fetch_add(&wt->opens, 1);
	}
	return NULL;
}

/* Also test_replace's teardown, so that a failed case does not leave it running. */
static int stop_watch(void **state)
{
	if (g_watch.running) {
		atomic_store(&g_watch.stop, true);
		pthread_join(g_watch.th, NULL);
		g_watch.running = false;
	}
	return 0;
}

/*
 * A successful save over the older file: a reader that had it open reads
 * it intact afterwards, and anyone opening the path meanwhile finds a
 * complete file, the older or the new one.
 */
static void test_replace(void **state)
{
	struct scene s;
	struct watcher *wt = &g_watch;
	struct halite_reader *old_r;
	struct halite_writer *w;
	uint8_t *oldmem = malloc(MEM_LEN), *buf;
	size_t len;
	struct stat st;
	int fd, ret;

	scene_init(&s, "replace");
	fill(oldmem, g_seed ^ 0x01d);
	fd = open(s.target, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(halite_reader_open(&old_r, s.target, NULL), 0);
	wt->path = s.target;
	assert_int_equal(pthread_create(&wt->th, NULL, watch, wt), 0);
	wt->running = true;
	while (atomic_load(&wt->opens) < 3)
		sched_yield();

	w = create(s.target, 0, &ret);
	assert_int_equal(ret, 0);
	for (uint32_t m = 0; m < NMB; m++) {
		assert_int_equal(halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, 0), m,
						   s.mem + (size_t)m * MB_SIZE), 0);
		if (m % 64 == 0)
			expect_old(&s);
	}
	expect_old(&s);
	assert_int_equal(halite_writer_finish(w), 0);
	halite_writer_free(w, true);
	{
		unsigned at = atomic_load(&wt->opens);

		while (atomic_load(&wt->opens) < at + 3)
			sched_yield();
	}
	stop_watch(NULL);
	fprintf(stderr, "the path opened %u times during the save, %u not a complete file\n",
		atomic_load(&wt->opens), atomic_load(&wt->bad));
	if (atomic_load(&wt->bad))
		fail_msg("%u opens of %s failed, the first with %s", atomic_load(&wt->bad),
			 s.target, halite_strerror(atomic_load(&wt->first_bad)));

	/* The older file, through the descriptor and the reader opened before. */
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal((size_t)st.st_size, s.old_len);
	buf = malloc(s.old_len);
	assert_int_equal(pread(fd, buf, s.old_len, 0), (ssize_t)s.old_len);
	assert_memory_equal(buf, s.old, s.old_len);
	free(buf);
	close(fd);
	{
		uint8_t *out = malloc(MB_SIZE);

		for (uint32_t m = 0; m < NMB; m++) {
			assert_int_equal(halite_reader_read_mb(old_r, m, out), 0);
			assert_memory_equal(out, oldmem + (size_t)m * MB_SIZE, MB_SIZE);
		}
		free(out);
	}
	halite_reader_free(old_r);

	/* And the path holds the new one, mode 0600 (the older was 0644), nothing else. */
	check_holds(s.target, s.mem);
	assert_int_equal(stat(s.target, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	buf = read_all(s.target, &len);
	assert_true(len != s.old_len || memcmp(buf, s.old, len));
	free(buf);
	expect_listing(s.dir, "snap.hlt");
	free(oldmem);
	scene_free(&s);
}

/* 0600 whatever the umask allows; the umask may take more away, never add. */
static void test_mode(void **state)
{
	static const mode_t masks[] = { 0, 022, 077, 0277 };
	mode_t saved = umask(0);

	for (size_t i = 0; i < sizeof(masks) / sizeof(masks[0]); i++) {
		mode_t want = 0600 & ~masks[i];
		struct scene s;
		struct halite_writer *w;
		struct stat st;
		char *kept;
		int ret;

		scene_init(&s, "mode");
		umask(masks[i]);
		write_file(s.target, s.mem);
		assert_int_equal(stat(s.target, &st), 0);
		if ((st.st_mode & 07777) != want)
			fail_msg("umask %03o: snapshot mode %03o, expected %03o", masks[i],
				 st.st_mode & 07777, want);
		/* A kept partial file too. */
		w = create(s.target, 0, &ret);
		assert_int_equal(ret, 0);
		halite_writer_free(w, false);
		kept = xasprintf("%s.incomplete", s.target);
		assert_int_equal(stat(kept, &st), 0);
		assert_int_equal(st.st_mode & 07777, want);
		free(kept);
		umask(0);
		scene_free(&s);
	}
	umask(saved);
}

/* The temporary file is created O_EXCL: a file under its name is never touched. */
static void test_excl(void **state)
{
	static const char decoy[] = "not the writer's";
	struct scene s;
	char *first, *second, *names, *want;
	uint8_t *b;
	size_t len;
	int fd;

	scene_init(&s, "excl");
	/* The first name tried for a seed, taken by someone else. */
	fd = halite_writer_test_open_temp(s.target, 42, &first);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, decoy, sizeof(decoy)), sizeof(decoy));
	close(fd);
	fd = halite_writer_test_open_temp(s.target, 42, &second);
	assert_true(fd >= 0);
	close(fd);
	assert_string_not_equal(first, second);
	b = read_all(first, &len);
	assert_int_equal(len, sizeof(decoy));
	assert_memory_equal(b, decoy, sizeof(decoy));
	free(b);
	assert_int_equal(unlink(second), 0);
	assert_int_equal(strncmp(first, s.dir, strlen(s.dir)), 0);
	assert_int_equal(strncmp(first + strlen(s.dir), "/.snap.hlt.", 11), 0);
	assert_int_equal(strlen(first + strlen(s.dir)), 17);

	/* A real save beside it leaves it alone, and the listing shows nothing else. */
	write_file(s.target, s.mem);
	b = read_all(first, &len);
	assert_int_equal(len, sizeof(decoy));
	assert_memory_equal(b, decoy, sizeof(decoy));
	free(b);
	names = listing(s.dir);
	want = xasprintf("%s snap.hlt", first + strlen(s.dir) + 1);
	assert_string_equal(names, want);
	free(names);
	free(want);
	free(first);
	free(second);
	scene_free(&s);

	/* A name of NAME_MAX bytes: the temporary name is cut to fit, and it works. */
	{
		char base[NAME_MAX + 1], *dir = xasprintf("%s/long", t_tmpdir()), *path;
		struct halite_writer *w;
		int ret;

		memset(base, 'n', NAME_MAX);
		base[NAME_MAX] = '\0';
		assert_int_equal(mkdir(dir, 0700), 0);
		path = xasprintf("%s/%s", dir, base);
		w = create(path, 0, &ret);
		assert_int_equal(ret, 0);
		names = listing(dir);
		assert_int_equal(strlen(names), NAME_MAX);
		assert_int_equal(names[0], '.');
		free(names);
		assert_int_equal(halite_writer_finish(w), 0);
		halite_writer_free(w, true);
		expect_listing(dir, base);
		assert_int_equal(unlink(path), 0);
		assert_int_equal(rmdir(dir), 0);
		free(path);
		free(dir);
	}
}

/* A refused target: @code, a message naming @name and saying @why, nothing created. */
static void expect_refused(const char *path, int code, const char *name, const char *why,
			   const char *dir, const char *listing_want)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = (void *)0x1;
	char err[512] = "";
	int ret;

	ret = halite_writer_check_path(path, err, sizeof(err));
	if (ret != code)
		fail_msg("%s: check_path %s, expected %s", path, halite_strerror(ret),
			 halite_strerror(code));
	if (!strstr(err, name) || !strstr(err, why))
		fail_msg("%s: message '%s' lacks '%s' or '%s'", path, err, name, why);
	o.flags = HALITE_WRITER_NO_SYNC;
	ret = halite_writer_create(&w, path, &g_region, 1, &o);
	if (ret != code)
		fail_msg("%s: create %s, expected %s", path, halite_strerror(ret),
			 halite_strerror(code));
	assert_ptr_equal(w, (void *)0x1);
	if (dir)
		expect_listing(dir, listing_want);
	fprintf(stderr, "refused, %s: %s\n", halite_strerror(code), err);
}

static void test_refused_targets(void **state)
{
	struct scene s;
	char *p, *q;
	struct stat st;
	int fd;

	scene_init(&s, "refused");
	/* A restore reads it (HALITE_LOCK_PROTOCOL). */
	fd = open(s.target, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_SH), 0);
	expect_refused(s.target, -EBUSY, s.target, "being restored", s.dir, "snap.hlt");
	close(fd);
	expect_old(&s);

	p = xasprintf("%s/missing/x.hlt", s.dir);
	q = xasprintf("%s/missing", s.dir);
	expect_refused(p, -ENOENT, q, "No such file", s.dir, "snap.hlt");
	free(p);
	free(q);

	p = xasprintf("%s/x.hlt", s.target); /* under a regular file */
	expect_refused(p, -ENOTDIR, s.target, "not a directory", s.dir, "snap.hlt");
	free(p);

	p = xasprintf("%s/sub", s.dir);
	assert_int_equal(mkdir(p, 0700), 0);
	expect_refused(p, -EISDIR, p, "is a directory", s.dir, "snap.hlt sub");
	q = xasprintf("%s/sub/", s.dir);
	expect_refused(q, -EISDIR, q, "directory", s.dir, "snap.hlt sub");
	expect_listing(p, "");
	assert_int_equal(rmdir(p), 0);
	free(p);
	free(q);
	q = xasprintf("%s/gone/", s.dir);
	expect_refused(q, -EISDIR, q, "directory", s.dir, "snap.hlt");
	free(q);

	/* Replacing a device would delete it: /dev/null behind a symlink stays. */
	p = xasprintf("%s/null.hlt", s.dir);
	assert_int_equal(symlink("/dev/null", p), 0);
	expect_refused(p, -EINVAL, p, "not a regular file", s.dir, "null.hlt snap.hlt");
	assert_int_equal(lstat(p, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(stat("/dev/null", &st), 0);
	assert_true(S_ISCHR(st.st_mode));
	free(p);
	expect_old(&s);
	scene_free(&s);
}

/*
 * A read-only directory. Root writes through permission bits, so the
 * directory is made read-only by a read-only bind mount of itself, in a child
 * with a mount namespace of its own (nothing is left mounted): skipped where
 * the child may not mount.
 */
static int readonly_child(const struct scene *s)
{
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w = NULL;
	char err[512] = "", *names;
	int ret;

	if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount(s->dir, s->dir, NULL, MS_BIND, NULL) ||
	    mount(NULL, s->dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL)) {
		fprintf(stderr, "# a read-only bind mount: %s: skipped\n", strerror(errno));
		return 77;
	}
	ret = halite_writer_check_path(s->target, err, sizeof(err));
	if (ret != -EROFS || !strstr(err, s->dir) || !strstr(err, "cannot create files in")) {
		fprintf(stderr, "check_path: %s, '%s'\n", halite_strerror(ret), err);
		return 1;
	}
	o.flags = HALITE_WRITER_NO_SYNC;
	ret = halite_writer_create(&w, s->target, &g_region, 1, &o);
	if (ret != -EROFS || w) {
		fprintf(stderr, "create: %s\n", halite_strerror(ret));
		return 1;
	}
	names = listing(s->dir);
	ret = strcmp(names, "snap.hlt") != 0;
	free(names);
	fprintf(stderr, "refused, %s: %s\n", halite_strerror(-EROFS), err);
	return ret;
}

static void test_readonly_dir(void **state)
{
	struct scene s;
	pid_t pid;
	int status;

	scene_init(&s, "rodir");
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(readonly_child(&s));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	expect_old(&s);
	expect_listing(s.dir, "snap.hlt");
	scene_free(&s);
	if (WEXITSTATUS(status) == 77)
		skip();
	assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_failure),
		cmocka_unit_test(test_free_without_finish),
		cmocka_unit_test(test_finish_failure),
		cmocka_unit_test_teardown(test_replace, stop_watch),
		cmocka_unit_test(test_mode),
		cmocka_unit_test(test_excl),
		cmocka_unit_test(test_refused_targets),
		cmocka_unit_test(test_readonly_dir),
	};
	int ret;

	g_seed = t_seed("test_atomic");
	ret = cmocka_run_group_tests(tests, NULL, NULL);
	if (!ret) {
		char *cmd = xasprintf("rm -rf '%s'", t_tmpdir());

		ret = system(cmd) ? 1 : 0;
		free(cmd);
	}
	return ret ? 1 : 0;
}
