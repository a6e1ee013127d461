/* SPDX-License-Identifier: MIT */
/*
 * Run a fuzz target once over every input of a committed corpus, as a plain
 * test (no libFuzzer needed): every crasher ever fixed stays fixed.
 *
 *   fuzz_reader_regress DIR|FILE...
 *
 * Exit 0 when every input ran (a crash or sanitizer report aborts), 1 when
 * there was nothing to run or an input could not be read.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "corrupt_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	size_t len;
	uint8_t *b = cu_read_file(path, &len);

	if (!b) {
		fprintf(stderr, "fuzz regress: cannot read %s\n", path);
		return -1;
	}
	LLVMFuzzerTestOneInput(b, len);
	free(b);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, int *count)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int ret = 0;

	if (!d) {
		perror(dir);
		return -1;
	}
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			names = realloc(names, cap * sizeof(*names));
			if (!names)
				abort();
		}
		if (asprintf(&names[n++], "%s/%s", dir, e->d_name) < 0)
			abort();
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_names); /* same order every run */
	for (size_t i = 0; i < n; i++) {
		struct stat st;

		if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
			if (run_file(names[i]))
				ret = -1;
			else
				(*count)++;
		}
		free(names[i]);
	}
	free(names);
	return ret;
}

int main(int argc, char **argv)
{
	int count = 0, ret = 0;

	for (int i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st)) {
			perror(argv[i]);
			ret = -1;
		} else if (S_ISDIR(st.st_mode)) {
			ret |= run_dir(argv[i], &count);
		} else if (run_file(argv[i]) == 0) {
			count++;
		} else {
			ret = -1;
		}
	}
	fprintf(stderr, "fuzz regress: %d inputs ran\n", count);
	return ret || count == 0 ? 1 : 0;
}
