// SPDX-License-Identifier: MIT
/*
 * What earlier runs learned about a guest's memory order (learned.h): the
 * restore trace's shared writing and the template's reading of its touch
 * lines (docs/restore-trace.md).
 *
 * The reader here is the template's, not a validator: halite-inspect's
 * parser (tools/halite-inspect/trace.c) checks every rule of the format;
 * this one checks what a hot set depends on (the file, each touch line's
 * fields against the file's map, each block once, order) and only skips
 * the stat and lb lines before the learn line, which a template has no
 * use for.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <halite/errors.h>

#include "learned.h"
#include "zalloc.h"

#define ULL(x) ((unsigned long long)(x))
#define LINE_MAX_LEN 4096 /* as halite-inspect's parser: room for later stats */

static const char *const kind_names[] = {
	[HALITE_MB_UNTOUCHED] = "untouched",
	[HALITE_MB_ZERO] = "zero",
	[HALITE_MB_STORED] = "stored",
};

int trace_out_begin(struct trace_out *o, const char *path, unsigned version,
		    const uint8_t uuid[16])
{
	size_t len = strlen(path) + 8;
	int fd, ret;

	o->f = NULL;
	o->path = path;
	o->tmp = malloc(len);
	if (!o->tmp)
		return -ENOMEM;
	snprintf(o->tmp, len, "%s.XXXXXX", path);
	fd = mkostemp(o->tmp, O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		free(o->tmp);
		o->tmp = NULL;
		return ret;
	}
	/* mkostemp() created it O_EXCL (no symlink followed); 0600: traces are not for others. */
	if (fchmod(fd, 0600) || !(o->f = fdopen(fd, "w"))) {
		ret = -errno;
		close(fd);
		unlink(o->tmp);
		free(o->tmp);
		o->tmp = NULL;
		return ret;
	}
	fprintf(o->f, "halite-restore-trace %u\nfile-uuid ", version);
	for (int i = 0; i < 16; i++)
		fprintf(o->f, "%02x", uuid[i]);
	fprintf(o->f, "\n");
	return 0;
}

int trace_out_end(struct trace_out *o, int err)
{
	int ret = err;

	if (!ret && (fflush(o->f) || fsync(fileno(o->f))))
		ret = -errno;
	if (fclose(o->f) && !ret)
		ret = -errno;
	if (!ret && rename(o->tmp, o->path))
		ret = -errno;
	if (ret)
		unlink(o->tmp);
	free(o->tmp);
	o->tmp = NULL;
	o->f = NULL;
	return ret;
}

void trace_write_learn(FILE *f, uint32_t window_ms, bool complete,
		       const struct learn_touch *t, size_t n)
{
	fprintf(f, "learn %u %d\n", window_ms, complete ? 1 : 0);
	for (size_t i = 0; i < n; i++) {
		char v[16] = "-";

		if (t[i].vcpu)
			snprintf(v, sizeof(v), "%u", t[i].vcpu - 1);
		fprintf(f, "touch %llu %s %llu %s\n", ULL(t[i].t_ns), v, ULL(t[i].mb),
			t[i].kind <= HALITE_MB_STORED ? kind_names[t[i].kind] : "stored");
	}
}

/* Unsigned decimal as the trace writes it: no leading zeros, no sign, within uint64. */
static bool dec(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s || (s[0] == '0' && s[1]))
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

/* The next line without its '\n' in @buf: 1, 0 at the end, -EINVAL (bad bytes) or -errno. */
static int get_line(FILE *f, char *buf, size_t cap, size_t *len)
{
	int c;

	*len = 0;
	while ((c = getc_unlocked(f)) != '\n') {
		if (c == EOF) {
			if (ferror(f))
				return -EIO;
			return *len ? -EINVAL : 0;
		}
		if (c < 0x20 || c > 0x7e || *len + 1 >= cap)
			return -EINVAL;
		buf[(*len)++] = (char)c;
	}
	buf[*len] = 0;
	return 1;
}

static int bad(char *why, size_t len, uint64_t line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int bad(char *why, size_t len, uint64_t line, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(why, len, "line %llu: ", ULL(line));

	if (n >= 0 && (size_t)n < len) {
		va_start(ap, fmt);
		vsnprintf(why + n, len - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* "touch <t_ns> <vcpu> <mb> <kind>" into @t; false if it is not that. */
static bool parse_touch(char *s, struct learn_touch *t)
{
	char *f[5];
	uint64_t v = 0;
	int n = 0;

	for (char *p = s;;) {
		if (n == 5)
			return false; /* a sixth field */
		f[n++] = p;
		p = strchr(p, ' ');
		if (!p)
			break;
		*p++ = 0;
	}
	if (n != 5 || strcmp(f[0], "touch") || !dec(f[1], &t->t_ns) || !dec(f[3], &t->mb))
		return false;
	if (strcmp(f[2], "-") == 0)
		t->vcpu = 0;
	else if (dec(f[2], &v) && v <= 0xffffffu)
		t->vcpu = (uint32_t)v + 1;
	else
		return false;
	for (uint8_t k = 0; k <= HALITE_MB_STORED; k++)
		if (!strcmp(f[4], kind_names[k])) {
			t->kind = k;
			return true;
		}
	return false;
}

int trace_read_touches(FILE *f, struct halite_reader *rd,
		       int (*fn)(void *ctx, const struct learn_touch *t), void *ctx,
		       char *why, size_t whylen)
{
	const struct halite_file_info *fi = halite_reader_info(rd);
	char buf[LINE_MAX_LEN + 2], want[48] = "file-uuid ";
	uint8_t *seen = NULL;
	uint64_t line = 0, prev_t = 0;
	bool learning = false;
	size_t len;
	int ret;

	for (int i = 0; i < 16; i++)
		snprintf(want + 10 + 2 * i, 3, "%02x", fi->uuid[i]);
	for (;;) {
		struct learn_touch t;
		struct halite_mb_loc loc;

		line++;
		ret = get_line(f, buf, sizeof(buf), &len);
		if (ret == -EINVAL) {
			ret = bad(why, whylen, line, "not a line of printable ASCII ending in a "
				  "newline");
			break;
		}
		if (ret <= 0) {
			if (!ret && !learning)
				ret = bad(why, whylen, line, "the file ends before the learn line");
			break;
		}
		if (line == 1) {
			if (!strcmp(buf, "halite-restore-trace 2"))
				continue;
			ret = bad(why, whylen, line, !strcmp(buf, "halite-restore-trace 1") ?
				  "a version 1 restore trace records no touches" :
				  "not a restore trace of version 2");
			break;
		}
		if (line == 2) {
			if (!strcmp(buf, want))
				continue;
			ret = bad(why, whylen, line, "%s", strncmp(buf, "file-uuid ", 10) ?
				  "no file-uuid line" : "a trace of another snapshot (uuid)");
			break;
		}
		if (!learning) {
			uint64_t w, c;
			char *sp;

			if (!strncmp(buf, "stat ", 5) || !strncmp(buf, "lb ", 3))
				continue;
			sp = strncmp(buf, "learn ", 6) ? NULL : strchr(buf + 6, ' ');
			if (sp)
				*sp = 0;
			if (!sp || !dec(buf + 6, &w) || !dec(sp + 1, &c) || c > 1) {
				ret = bad(why, whylen, line, "expected a stat, lb or learn line");
				break;
			}
			learning = true;
			seen = halite_zalloc(fi->mb_count ? fi->mb_count : 1);
			if (!seen) {
				ret = -ENOMEM;
				break;
			}
			continue;
		}
		if (!parse_touch(buf, &t)) {
			ret = bad(why, whylen, line, "not a touch line");
			break;
		}
		if (t.mb >= fi->mb_count || halite_reader_mb_lookup(rd, t.mb, &loc)) {
			ret = bad(why, whylen, line, "memory block %llu out of range (%llu blocks)",
				  ULL(t.mb), ULL(fi->mb_count));
			break;
		}
		if (loc.state != t.kind) {
			ret = bad(why, whylen, line, "memory block %llu is %s in the snapshot, "
				  "not %s", ULL(t.mb), kind_names[loc.state % 3], kind_names[t.kind]);
			break;
		}
		if (seen[t.mb]) {
			ret = bad(why, whylen, line, "memory block %llu touched twice", ULL(t.mb));
			break;
		}
		if (t.t_ns < prev_t) {
			ret = bad(why, whylen, line, "t_ns before the previous line's");
			break;
		}
		seen[t.mb] = 1;
		prev_t = t.t_ns;
		ret = fn(ctx, &t);
		if (ret)
			break;
	}
	halite_zfree(seen);
	return ret;
}
