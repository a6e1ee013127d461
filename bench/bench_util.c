// SPDX-License-Identifier: MIT
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench_util.h"
#include "cli.h"
#include "uffd.h"

int bench_fail(const char *prog, bool json, int code, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s: %s\n", prog, msg);
	if (json)
		halite_cli_json_fail(stdout, msg, code);
	return code;
}

int bench_opt_error(const char *prog, bool json, int c, int argc, char **argv, const char *cmd)
{
	char msg[512];

	halite_cli_opt_error(msg, sizeof(msg), c, argc, argv, cmd);
	return bench_fail(prog, json, 2, "%s", msg);
}

int bench_preflight(const char *prog, bool json, const char *dir)
{
	struct halite_uffd_caps caps;
	struct stat sb;
	int ret;

	if (stat(dir, &sb) || !S_ISDIR(sb.st_mode) || access(dir, W_OK))
		return bench_fail(prog, json, 2, "--dir %s: not a writable directory", dir);
	ret = halite_uffd_probe(&caps);
	if (ret)
		return bench_fail(prog, json, 77, "userfaultfd unavailable: %s: skipped",
				  strerror(-ret));
	return 0;
}

ssize_t bench_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

int bench_drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (fdatasync(fd) && errno != EINVAL)
		ret = -errno;
	if (!ret)
		ret = -posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	return ret;
}

int bench_warm_file(const char *path)
{
	const size_t chunk = 1 << 20;
	char *buf = malloc(chunk);
	int fd, ret = 0;
	ssize_t n;

	if (!buf)
		return -ENOMEM;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	while ((n = read(fd, buf, chunk)) > 0)
		;
	if (n < 0)
		ret = -errno;
	close(fd);
out:
	free(buf);
	return ret;
}

bool bench_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	return halite_parse_u64_range(s, min, max, out) == 0;
}

int bench_bad_arg(const char *prog, bool json, const char *opt, const char *val,
		  const char *want)
{
	return bench_fail(prog, json, 2, "%s '%s': want %s", opt, val, want);
}

int bench_parse_caches(const char *s, bool cache[2], bool *cold_first)
{
	char *copy = strdup(s), *save = NULL;
	bool first = true;
	int ret = 0;

	if (!copy)
		return -1;
	cache[0] = cache[1] = false;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int k = !strcmp(t, "warm") ? 0 : !strcmp(t, "cold") ? 1 : -1;

		if (k < 0) {
			ret = -1;
			break;
		}
		if (first)
			*cold_first = k == 1;
		first = false;
		cache[k] = true;
	}
	free(copy);
	return ret || (!cache[0] && !cache[1]) ? -1 : 0;
}

int bench_parse_latencies(const char *s, uint32_t *lat, unsigned max, unsigned *n)
{
	char *copy = strdup(s), *save = NULL;
	int ret = 0;

	if (!copy)
		return -1;
	*n = 0;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (*n == max || !bench_parse_u64(t, 0, 1000000, &v)) {
			ret = -1;
			break;
		}
		lat[(*n)++] = (uint32_t)v;
	}
	free(copy);
	return ret || !*n ? -1 : 0;
}

void bench_json_str(const char *s)
{
	halite_json_str(stdout, s);
}

void bench_json_num(double v, int prec)
{
	if (isfinite(v))
		printf("%.*f", prec, v);
	else
		printf("null");
}

/* The first line of @path (with @prefix: the value after "prefix...:"), trimmed; "" if none. */
static void read_line(const char *path, const char *prefix, char *out, size_t len)
{
	char line[512];
	FILE *f = fopen(path, "re");

	out[0] = '\0';
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *p;

		if (prefix && strncmp(line, prefix, strlen(prefix)))
			continue;
		p = prefix ? strchr(line, ':') : line;
		if (!p)
			continue;
		p += prefix ? 1 : 0;
		while (*p == ' ' || *p == '\t')
			p++;
		p[strcspn(p, "\n")] = '\0';
		while (*p && p[strlen(p) - 1] == ' ')
			p[strlen(p) - 1] = '\0';
		snprintf(out, len, "%s", p);
		break;
	}
	fclose(f);
}

/* The block device under @dir: name, model, rotational; "" when not a block device. */
static void storage_of(const char *dir, char *dev, size_t dlen, char *model, size_t mlen, int *rot)
{
	char path[PATH_MAX], real[PATH_MAX], buf[64];
	struct stat st;
	char *name;

	dev[0] = model[0] = '\0';
	*rot = -1;
	if (stat(dir, &st) || !major(st.st_dev))
		return;
	snprintf(path, sizeof(path), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
	if (!realpath(path, real))
		return;
	/* A partition's directory sits inside its disk's: use the disk. */
	if (snprintf(path, sizeof(path), "%s/partition", real) >= (int)sizeof(path))
		return;
	if (!access(path, F_OK))
		*strrchr(real, '/') = '\0';
	name = strrchr(real, '/');
	name = name ? name + 1 : real;
	if (strlen(name) >= dlen)
		return;
	memcpy(dev, name, strlen(name) + 1);
	if (snprintf(path, sizeof(path), "%s/device/model", real) < (int)sizeof(path))
		read_line(path, NULL, model, mlen);
	if (snprintf(path, sizeof(path), "%s/queue/rotational", real) >= (int)sizeof(path))
		return;
	read_line(path, NULL, buf, sizeof(buf));
	if (buf[0])
		*rot = atoi(buf);
}

static void str_or_null(const char *s)
{
	if (s[0])
		bench_json_str(s);
	else
		printf("null");
}

void bench_machine_json(const char *dir)
{
	char cpu[256], dev[64], model[128];
	struct utsname u;
	struct sysinfo si;
	int rot;

	uname(&u);
	sysinfo(&si);
	read_line("/proc/cpuinfo", "model name", cpu, sizeof(cpu));
	storage_of(dir, dev, sizeof(dev), model, sizeof(model), &rot);
	printf("{\"cpu\": ");
	bench_json_str(cpu);
	printf(", \"cores\": %ld, \"memory_bytes\": %llu, \"kernel\": ",
	       sysconf(_SC_NPROCESSORS_ONLN), (unsigned long long)si.totalram * si.mem_unit);
	bench_json_str(u.release);
	printf(", \"storage\": {\"dir\": ");
	bench_json_str(dir);
	printf(", \"device\": ");
	str_or_null(dev);
	printf(", \"model\": ");
	str_or_null(model);
	printf(", \"rotational\": %s}}", rot < 0 ? "null" : rot ? "true" : "false");
}
