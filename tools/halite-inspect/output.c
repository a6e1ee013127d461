// SPDX-License-Identifier: MIT
/* halite-inspect: aligned text tables and JSON output. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "io.h"

struct table {
	unsigned ncols;
	const char *const *heads;
	const char *align;	/* 'l' or 'r' per column */
	int *width;
	bool streaming;
	bool head_done;
	char **cells;		/* nrows * ncols, buffered mode only */
	size_t nrows, cap;
};

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n);
	if (!p) {
		errorf("out of memory");
		exit(EXIT_FAIL);
	}
	return p;
}

static char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;

	return memcpy(xrealloc(NULL, n), s, n);
}

struct table *table_new(unsigned ncols, const char *const *heads, const char *align)
{
	struct table *t = xrealloc(NULL, sizeof(*t));

	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
	t->heads = heads;
	t->align = align;
	t->width = xrealloc(NULL, ncols * sizeof(int));
	for (unsigned c = 0; c < ncols; c++)
		t->width[c] = (int)strlen(heads[c]);
	return t;
}

void table_stream(struct table *t, const int *widths)
{
	t->streaming = true;
	for (unsigned c = 0; c < t->ncols; c++)
		if (widths[c] > t->width[c])
			t->width[c] = widths[c];
}

static void print_cells(const struct table *t, const char *const *cells)
{
	for (unsigned c = 0; c < t->ncols; c++) {
		bool last = c + 1 == t->ncols;

		if (c)
			fputs("  ", stdout);
		if (t->align[c] == 'r')
			printf("%*s", t->width[c], cells[c]);
		else if (last)
			fputs(cells[c], stdout);	/* no trailing blanks */
		else
			printf("%-*s", t->width[c], cells[c]);
	}
	putchar('\n');
}

void table_row(struct table *t, ...)
{
	const char *cells[32];
	va_list ap;

	va_start(ap, t);
	for (unsigned c = 0; c < t->ncols && c < 32; c++)
		cells[c] = va_arg(ap, const char *);
	va_end(ap);

	if (t->streaming) {
		if (!t->head_done) {
			print_cells(t, (const char *const *)t->heads);
			t->head_done = true;
		}
		print_cells(t, cells);
		return;
	}
	if (t->nrows == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 16;
		t->cells = xrealloc(t->cells, t->cap * t->ncols * sizeof(char *));
	}
	for (unsigned c = 0; c < t->ncols; c++) {
		int w = (int)strlen(cells[c]);

		t->cells[t->nrows * t->ncols + c] = xstrdup(cells[c]);
		if (w > t->width[c])
			t->width[c] = w;
	}
	t->nrows++;
}

void table_print(struct table *t)
{
	if (!t->head_done)
		print_cells(t, (const char *const *)t->heads);
	t->head_done = true;
	for (size_t r = 0; r < t->nrows; r++)
		print_cells(t, (const char *const *)&t->cells[r * t->ncols]);
}

void table_free(struct table *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	free(t->width);
	free(t);
}

cJSON *json_u64(uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	return cJSON_CreateRaw(buf);
}

void json_add_u64(cJSON *obj, const char *key, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "%" PRIu64, v);
	cJSON_AddRawToObject(obj, key, buf);
}

void json_add_hex(cJSON *obj, const char *key, uint64_t v)
{
	char buf[24];

	snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
	cJSON_AddStringToObject(obj, key, buf);
}

static int flush_stdout(void)
{
	if (fflush(stdout) || ferror(stdout)) {
		errorf("writing to stdout: %s", strerror(errno));
		return EXIT_FAIL;
	}
	return EXIT_OK;
}

void json_add_pct(cJSON *obj, const char *key, uint64_t part, uint64_t whole)
{
	if (whole)
		cJSON_AddNumberToObject(obj, key, pct(part, whole));
	else
		cJSON_AddNullToObject(obj, key);
}

int json_emit(cJSON *root, int exit)
{
	char *s;
	int ret;

	json_add_status(root, exit);
	s = cJSON_Print(root);
	cJSON_Delete(root);
	run_stdout_taken();
	if (!s) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	puts(s);
	cJSON_free(s);
	ret = flush_stdout();
	return exit ? exit : ret;
}

void json_stream_begin(struct json_stream *js, cJSON *head, const char *array_key)
{
	char *s = cJSON_PrintUnformatted(head);
	cJSON *key;
	size_t n;

	cJSON_Delete(head);
	if (!s) {
		errorf("out of memory");
		exit(EXIT_FAIL);
	}
	run_stdout_taken();
	/* Reopen the object: drop its closing brace, then open the array. */
	n = strlen(s);
	s[n - 1] = '\0';
	fputs(s, stdout);
	if (n > 2)
		putchar(',');
	cJSON_free(s);
	/* Let cJSON quote the key: it escapes what needs escaping. */
	key = cJSON_CreateString(array_key);
	s = key ? cJSON_PrintUnformatted(key) : NULL;
	printf("%s:[\n", s ? s : "\"items\"");
	cJSON_free(s);
	cJSON_Delete(key);
	js->first = true;
}

void json_stream_item(struct json_stream *js, cJSON *item)
{
	char *s = cJSON_PrintUnformatted(item);

	cJSON_Delete(item);
	if (!s) {
		errorf("out of memory");
		exit(EXIT_FAIL);
	}
	if (!js->first)
		fputs(",\n", stdout);
	fputs(s, stdout);
	js->first = false;
	cJSON_free(s);
}

int json_stream_end(struct json_stream *js, int exit)
{
	cJSON *tail = cJSON_CreateObject();
	char *s;
	int ret;

	/* The status after the array: only now is it known. */
	json_add_status(tail, exit);
	s = cJSON_PrintUnformatted(tail);
	cJSON_Delete(tail);
	if (!s) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	printf("\n],%s\n", s + 1);
	cJSON_free(s);
	ret = flush_stdout();
	return exit ? exit : ret;
}

void json_add_store(cJSON *obj, const struct halite_reader *r, const char *path)
{
	struct halite_store_stats st;
	cJSON *o;

	if (!halite_io_is_s3_path(path)) {
		cJSON_AddNullToObject(obj, "store");
		return;
	}
	halite_reader_store_stats(r, &st);
	o = cJSON_AddObjectToObject(obj, "store");
	json_add_u64(o, "requests", st.requests);
	json_add_u64(o, "retries", st.retries);
	json_add_u64(o, "bytes", st.bytes);
	json_add_u64(o, "connects", st.connects);
	cJSON_AddBoolToObject(o, "cached", st.cached);
	json_add_u64(o, "cache_hits", st.cache_hits);
	json_add_u64(o, "cache_misses", st.cache_misses);
	json_add_u64(o, "cache_bytes_hit", st.cache_bytes_hit);
	json_add_u64(o, "cache_puts", st.cache_puts);
}
