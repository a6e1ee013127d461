/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: a growing string for building command lines and
 * messages (argv.c, cmdline.c, qtree.c).
 */
#ifndef HALITE_QEMU_STRBUF_H
#define HALITE_QEMU_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

/* A growing string; every append keeps it terminated. Out of memory: NULL from then on. */
struct hq_buf {
	char *s;
	size_t len, cap;
	bool oom;
};

void hq_buf_put(struct hq_buf *b, const char *s, size_t n);
void hq_buf_puts(struct hq_buf *b, const char *s);
void hq_buf_printf(struct hq_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* @b's string, or NULL if it ran out of memory; @b is left empty. */
char *hq_buf_done(struct hq_buf *b);
/* vasprintf's string, or NULL. */
char *hq_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
