// SPDX-License-Identifier: MIT
/*
 * halite-cloned: strict JSON in, valid UTF-8 out.
 *
 * cJSON is lenient where a caller's mistake or an attack hides: it takes
 * the last of duplicate keys, ends a string at an escaped NUL (so
 * "/a\u0000/b" names /a), passes invalid UTF-8 through, and recurses as
 * deep as the text nests. json_check_strict() walks a request body by RFC
 * 8259 first and refuses all of that with the byte offset; cJSON parses
 * only what passed. Going out, every string of a reply (error messages echo
 * URLs, paths and fields) is made valid UTF-8: an invalid byte becomes
 * U+FFFD, and a character cut at the end of a string (a message truncated
 * by its buffer) is dropped, so the reply is always valid JSON.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cloned.h"

/*
 * The length of the UTF-8 character at @s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), 1..4; 0 if invalid; -1 if valid so
 * far but cut by the end @n.
 */
static int utf8_char(const unsigned char *s, size_t n)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xbf;
	int len;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4;
	else
		return 0;
	/* the second byte's range rules out overlongs, surrogates and > U+10FFFF */
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return -1;
		if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xbf))
			return 0;
	}
	return len;
}

bool utf8_valid(const char *s, size_t n, size_t *bad_at)
{
	const unsigned char *u = (const unsigned char *)s;

	for (size_t i = 0; i < n;) {
		int l = utf8_char(u + i, n - i);

		if (l <= 0) {
			if (bad_at)
				*bad_at = i;
			return false;
		}
		i += (size_t)l;
	}
	return true;
}

char *utf8_sanitize(const char *s, size_t n, size_t max)
{
	const unsigned char *u = (const unsigned char *)s;
	char *out = malloc(n * 3 + 1), *o = out;

	if (!out)
		return NULL;
	for (size_t i = 0; i < n;) {
		int l = utf8_char(u + i, n - i);

		if (l < 0)
			break; /* cut inside its last character: drop the piece */
		if (l == 0) {
			if ((size_t)(o - out) + 3 > max)
				break;
			memcpy(o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		if ((size_t)(o - out) + (size_t)l > max)
			break;
		memcpy(o, s + i, (size_t)l);
		o += l;
		i += (size_t)l;
	}
	*o = 0;
	return out;
}

static int fix_string(char **p)
{
	size_t n = strlen(*p);
	char *clean;

	if (utf8_valid(*p, n, NULL))
		return 0;
	clean = utf8_sanitize(*p, n, n * 3);
	if (!clean)
		return -ENOMEM;
	free(*p);
	*p = clean;
	return 0;
}

int json_sanitize_tree(cJSON *j)
{
	for (; j; j = j->next) {
		if (j->string && !(j->type & cJSON_StringIsConst) && fix_string(&j->string))
			return -ENOMEM;
		if ((cJSON_IsString(j) || cJSON_IsRaw(j)) && j->valuestring &&
		    !(j->type & cJSON_IsReference) && fix_string(&j->valuestring))
			return -ENOMEM;
		if (j->child && !(j->type & cJSON_IsReference) && json_sanitize_tree(j->child))
			return -ENOMEM;
	}
	return 0;
}

/* --- the strict reader ------------------------------------------------------ */

struct jr {
	const unsigned char *s;
	size_t n, i;
	char *err;
	size_t errlen;
};

/* One object's keys, decoded: duplicates are compared as the values they name. */
struct keys {
	char **k;
	size_t *len;
	size_t n, cap;
};

static int jr_fail(struct jr *r, size_t at, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int jr_fail(struct jr *r, size_t at, const char *fmt, ...)
{
	char what[192];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	snprintf(r->err, r->errlen, "invalid JSON in the body at byte %zu: %s", at, what);
	return -EINVAL;
}

static void skip_ws(struct jr *r)
{
	while (r->i < r->n && strchr(" \t\r\n", r->s[r->i]) && r->s[r->i])
		r->i++;
}

static int hex4(struct jr *r, size_t at, unsigned *v)
{
	*v = 0;
	if (at + 4 > r->n)
		return jr_fail(r, at, "a \\u escape needs 4 hex digits");
	for (int k = 0; k < 4; k++) {
		unsigned char c = r->s[at + k];
		unsigned d;

		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return jr_fail(r, at + k, "a \\u escape needs 4 hex digits");
		*v = *v << 4 | d;
	}
	return 0;
}

static void put_utf8(char *o, size_t *on, unsigned cp)
{
	if (cp < 0x80) {
		o[(*on)++] = (char)cp;
	} else if (cp < 0x800) {
		o[(*on)++] = (char)(0xc0 | cp >> 6);
		o[(*on)++] = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		o[(*on)++] = (char)(0xe0 | cp >> 12);
		o[(*on)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[(*on)++] = (char)(0x80 | (cp & 0x3f));
	} else {
		o[(*on)++] = (char)(0xf0 | cp >> 18);
		o[(*on)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
		o[(*on)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[(*on)++] = (char)(0x80 | (cp & 0x3f));
	}
}

/* A string at r->i (the quote); decoded into *@out (malloc'd) if @out. */
static int read_string(struct jr *r, char **out, size_t *outlen)
{
	size_t start = r->i, on = 0;
	char *o = NULL;
	int ret;

	if (out) {
		/* decoding never grows the text */
		o = malloc(r->n - start + 1);
		if (!o)
			return jr_fail(r, start, "out of memory");
	}
	r->i++;
	for (;;) {
		unsigned char c;
		int l;

		if (r->i >= r->n) {
			ret = jr_fail(r, start, "a string without its closing quote");
			goto fail;
		}
		c = r->s[r->i];
		if (c == '"') {
			r->i++;
			break;
		}
		if (c < 0x20) {
			ret = jr_fail(r, r->i, "raw control character 0x%02x in a string (escape it)",
				      c);
			goto fail;
		}
		if (c == '\\') {
			unsigned cp, lo;
			size_t at = r->i;

			if (r->i + 1 >= r->n) {
				ret = jr_fail(r, at, "a string without its closing quote");
				goto fail;
			}
			c = r->s[r->i + 1];
			r->i += 2;
			switch (c) {
			case '"': cp = '"'; break;
			case '\\': cp = '\\'; break;
			case '/': cp = '/'; break;
			case 'b': cp = '\b'; break;
			case 'f': cp = '\f'; break;
			case 'n': cp = '\n'; break;
			case 'r': cp = '\r'; break;
			case 't': cp = '\t'; break;
			case 'u':
				if ((ret = hex4(r, r->i, &cp)))
					goto fail;
				r->i += 4;
				if (cp == 0) {
					ret = jr_fail(r, at, "\\u0000 (a NUL character) in a string");
					goto fail;
				}
				if (cp >= 0xdc00 && cp <= 0xdfff) {
					ret = jr_fail(r, at, "lone surrogate \\u%04x (a low surrogate "
						      "without a high one)", cp);
					goto fail;
				}
				if (cp >= 0xd800 && cp <= 0xdbff) {
					if (r->i + 6 > r->n || r->s[r->i] != '\\' ||
					    r->s[r->i + 1] != 'u' || hex4(r, r->i + 2, &lo) ||
					    lo < 0xdc00 || lo > 0xdfff) {
						ret = jr_fail(r, at, "lone surrogate \\u%04x (a high "
							      "surrogate without a low one)", cp);
						goto fail;
					}
					r->i += 6;
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				}
				break;
			default:
				ret = jr_fail(r, at, "unknown escape \\%c",
					      c >= 0x20 && c < 0x7f ? c : '?');
				goto fail;
			}
			if (o)
				put_utf8(o, &on, cp);
			continue;
		}
		l = utf8_char(r->s + r->i, r->n - r->i);
		if (l <= 0) {
			ret = jr_fail(r, r->i, "invalid UTF-8 (byte 0x%02x)", c);
			goto fail;
		}
		if (o)
			memcpy(o + on, r->s + r->i, (size_t)l);
		on += (size_t)l;
		r->i += (size_t)l;
	}
	if (out) {
		o[on] = 0;
		*out = o;
		*outlen = on;
	}
	return 0;
fail:
	free(o);
	return ret;
}

static int read_number(struct jr *r)
{
	size_t start = r->i;
	const unsigned char *s = r->s;
	size_t n = r->n;

#define DIGIT(k) ((k) < n && s[k] >= '0' && s[k] <= '9')
	if (r->i < n && s[r->i] == '-')
		r->i++;
	if (r->i < n && s[r->i] == '0') {
		r->i++;
	} else if (DIGIT(r->i)) {
		while (DIGIT(r->i))
			r->i++;
	} else {
		return jr_fail(r, start, "not a JSON value");
	}
	if (r->i < n && s[r->i] == '.') {
		r->i++;
		if (!DIGIT(r->i))
			return jr_fail(r, r->i, "a digit must follow the decimal point");
		while (DIGIT(r->i))
			r->i++;
	}
	if (r->i < n && (s[r->i] == 'e' || s[r->i] == 'E')) {
		r->i++;
		if (r->i < n && (s[r->i] == '+' || s[r->i] == '-'))
			r->i++;
		if (!DIGIT(r->i))
			return jr_fail(r, r->i, "a digit must follow the exponent");
		while (DIGIT(r->i))
			r->i++;
	}
#undef DIGIT
	return 0;
}

static void keys_free(struct keys *ks)
{
	for (size_t i = 0; i < ks->n; i++)
		free(ks->k[i]);
	free(ks->k);
	free(ks->len);
}

static int read_value(struct jr *r, unsigned depth);

static int read_object(struct jr *r, unsigned depth)
{
	struct keys ks = { 0 };
	int ret = 0;

	r->i++;
	skip_ws(r);
	if (r->i < r->n && r->s[r->i] == '}') {
		r->i++;
		return 0;
	}
	for (;;) {
		size_t at, klen;
		char *key;

		skip_ws(r);
		at = r->i;
		if (r->i >= r->n || r->s[r->i] != '"') {
			ret = jr_fail(r, r->i, "an object key (a string) expected");
			break;
		}
		if ((ret = read_string(r, &key, &klen)))
			break;
		for (size_t k = 0; k < ks.n; k++)
			if (ks.len[k] == klen && !memcmp(ks.k[k], key, klen)) {
				if (klen <= 64 && strlen(key) == klen)
					ret = jr_fail(r, at, "duplicate key \"%s\"", key);
				else
					ret = jr_fail(r, at, "duplicate key");
				free(key);
				goto out;
			}
		if (ks.n == ks.cap) {
			size_t cap = ks.cap ? ks.cap * 2 : 8;
			char **k = realloc(ks.k, cap * sizeof(*k));
			size_t *len = k ? realloc(ks.len, cap * sizeof(*len)) : NULL;

			if (k)
				ks.k = k;
			if (!len) {
				free(key);
				ret = jr_fail(r, at, "out of memory");
				break;
			}
			ks.len = len;
			ks.cap = cap;
		}
		ks.k[ks.n] = key;
		ks.len[ks.n++] = klen;
		skip_ws(r);
		if (r->i >= r->n || r->s[r->i] != ':') {
			ret = jr_fail(r, r->i, "':' expected after an object key");
			break;
		}
		r->i++;
		if ((ret = read_value(r, depth)))
			break;
		skip_ws(r);
		if (r->i < r->n && r->s[r->i] == ',') {
			r->i++;
			continue;
		}
		if (r->i < r->n && r->s[r->i] == '}') {
			r->i++;
			break;
		}
		ret = jr_fail(r, r->i, "',' or '}' expected in an object");
		break;
	}
out:
	keys_free(&ks);
	return ret;
}

static int read_array(struct jr *r, unsigned depth)
{
	int ret;

	r->i++;
	skip_ws(r);
	if (r->i < r->n && r->s[r->i] == ']') {
		r->i++;
		return 0;
	}
	for (;;) {
		if ((ret = read_value(r, depth)))
			return ret;
		skip_ws(r);
		if (r->i < r->n && r->s[r->i] == ',') {
			r->i++;
			continue;
		}
		if (r->i < r->n && r->s[r->i] == ']') {
			r->i++;
			return 0;
		}
		return jr_fail(r, r->i, "',' or ']' expected in an array");
	}
}

static int read_value(struct jr *r, unsigned depth)
{
	static const char *const words[] = { "true", "false", "null" };
	unsigned char c;

	skip_ws(r);
	if (r->i >= r->n)
		return jr_fail(r, r->i, "a value expected, the body ended");
	c = r->s[r->i];
	if (c == '{' || c == '[') {
		if (depth >= JSON_MAX_DEPTH)
			return jr_fail(r, r->i, "nesting deeper than %d levels", JSON_MAX_DEPTH);
		return c == '{' ? read_object(r, depth + 1) : read_array(r, depth + 1);
	}
	if (c == '"')
		return read_string(r, NULL, NULL);
	if (c == '-' || (c >= '0' && c <= '9'))
		return read_number(r);
	for (int k = 0; k < 3; k++) {
		size_t l = strlen(words[k]);

		if (r->n - r->i >= l && !memcmp(r->s + r->i, words[k], l)) {
			r->i += l;
			return 0;
		}
	}
	if (c >= 0x80 && utf8_char(r->s + r->i, r->n - r->i) <= 0)
		return jr_fail(r, r->i, "invalid UTF-8 (byte 0x%02x)", c);
	return jr_fail(r, r->i, "not a JSON value");
}

int json_check_strict(const char *buf, size_t len, char *err, size_t errlen)
{
	struct jr r = { .s = (const unsigned char *)buf, .n = len, .err = err,
			.errlen = errlen };
	int ret = read_value(&r, 0);

	if (ret)
		return ret;
	skip_ws(&r);
	if (r.i < r.n)
		return jr_fail(&r, r.i, "text after the value");
	return 0;
}
