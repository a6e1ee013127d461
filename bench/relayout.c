/* SPDX-License-Identifier: MIT */
/*
 * One snapshot, re-laid out: see relayout.h for what is written and why.
 *
 * The source is decoded once, locality block by locality block, straight
 * into raw.img (sparse); every other file is then written from a read-only
 * mapping of raw.img, so memory use does not grow with the guest (the page
 * cache holds the image) and all files hold exactly the same bytes.
 */
#define _GNU_SOURCE
#include "relayout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/halite.h>

#include "cli.h"
#include "peers.h"

static const char *const org_names[ORG_COUNT] = { "random", "physical", "locality", "halite" };

const char *relayout_org_name(int org)
{
	return org >= 0 && org < ORG_COUNT ? org_names[org] : "?";
}

struct ctx {
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	struct relayout_out *out;
	struct relayout_opts opts;
	char *err;
	size_t errlen;
	uint64_t *mb_gpa;	/* per memory block */
	uint8_t *mb_state;	/* enum halite_mb_state */
	struct halite_region *regions;
	uint32_t nregions;
	const uint8_t *img;	/* raw.img, mapped read-only */
	/* Memory blocks of the vCPU streams in stream order (vCPU, then file order). */
	struct vmb { uint32_t vcpu; uint64_t order, mb; } *vmbs;
	size_t nvmbs, vmbs_cap;
};

static int fail(struct ctx *c, int ret, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct ctx *c, int ret, const char *fmt, ...)
{
	va_list ap;

	if (c->err && c->errlen && !c->err[0]) {
		va_start(ap, fmt);
		vsnprintf(c->err, c->errlen, fmt, ap);
		va_end(ap);
	}
	return ret;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return !n || (!p[0] && !memcmp(p, p + 1, n - 1));
}

/* splitmix64: a seeded order, the same on every machine. */
static uint64_t next_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* LB @i's table entry and the MBs it holds: 0 or the reader's error. */
static int lb_members(struct ctx *c, uint64_t i, struct halite_lb_info *li, const uint64_t **mbs,
		      uint32_t *n)
{
	int ret = halite_reader_lb_info(c->rd, i, li);

	return ret ? ret : halite_reader_lb_members(c->rd, i, mbs, n);
}

static int cmp_vmb(const void *a, const void *b)
{
	const struct vmb *x = a, *y = b;

	if (x->vcpu != y->vcpu)
		return x->vcpu < y->vcpu ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

/* Where every memory block lives, and its state in the source. */
static int index_source(struct ctx *c)
{
	const struct halite_file_info *fi = c->fi;
	struct relayout_out *o = c->out;

	c->nregions = fi->region_count;
	c->regions = calloc(c->nregions, sizeof(*c->regions));
	c->mb_gpa = calloc(fi->mb_count ? fi->mb_count : 1, sizeof(*c->mb_gpa));
	c->mb_state = calloc(fi->mb_count ? fi->mb_count : 1, 1);
	if (!c->regions || !c->mb_gpa || !c->mb_state)
		return fail(c, -ENOMEM, "out of memory for %llu memory blocks",
			    (unsigned long long)fi->mb_count);
	for (uint32_t i = 0; i < c->nregions; i++) {
		const struct halite_region_info *ri = halite_reader_region(c->rd, i);

		c->regions[i] = (struct halite_region){ ri->name, ri->gpa, ri->length };
		if (ri->gpa + ri->length > o->mem_bytes)
			o->mem_bytes = ri->gpa + ri->length;
		for (uint64_t k = 0; k < ri->mb_count; k++)
			c->mb_gpa[ri->first_mb + k] = ri->gpa + k * fi->mb_size;
	}
	snprintf(o->region, sizeof(o->region), "%s", halite_reader_region(c->rd, 0)->name);
	o->page_size = fi->page_size;
	o->mb_size = fi->mb_size;
	o->lb_size = fi->lb_size;
	o->mb_total = fi->mb_count;
	for (uint64_t mb = 0; mb < fi->mb_count; mb++) {
		struct halite_mb_loc loc;
		int ret = halite_reader_mb_lookup(c->rd, mb, &loc);

		if (ret)
			return fail(c, ret, "memory block %llu: %s", (unsigned long long)mb,
				    halite_strerror(ret));
		c->mb_state[mb] = (uint8_t)loc.state;
		o->mb_stored += loc.state == HALITE_MB_STORED;
		o->mb_zero += loc.state == HALITE_MB_ZERO;
		o->mb_untouched += loc.state == HALITE_MB_UNTOUCHED;
	}
	return 0;
}

/* Write the non-zero pages of one decoded memory block (holes stay holes). */
static int write_sparse(struct ctx *c, int fd, const uint8_t *data, uint32_t len, uint64_t gpa)
{
	uint32_t ps = c->fi->page_size;

	for (uint32_t off = 0; off < len;) {
		uint32_t end;

		if (all_zero(data + off, len - off < ps ? len - off : ps)) {
			off += ps;
			continue;
		}
		for (end = off + ps; end < len && !all_zero(data + end, len - end < ps ? len - end : ps);
		     end += ps)
			;
		if (end > len)
			end = len;
		int ret = halite_pwrite_all(fd, data + off, end - off, gpa + off);

		if (ret)
			return ret;
		off = end;
	}
	return 0;
}

/* Decode every stored block into raw.img; note the vCPU streams' blocks on the way. */
static int write_raw(struct ctx *c)
{
	const struct halite_file_info *fi = c->fi;
	struct relayout_out *o = c->out;
	uint8_t *lb = halite_reader_alloc_lb(c->rd), *mbuf = malloc(fi->mb_size);
	uint64_t order = 0;
	struct stat st;
	int fd, ret = 0;

	fd = open(o->raw_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || !lb || !mbuf) {
		ret = fd < 0 ? fail(c, -errno, "%s: %s", o->raw_path, strerror(errno))
			     : fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	if (ftruncate(fd, (off_t)o->mem_bytes)) {
		ret = fail(c, -errno, "%s: ftruncate: %s", o->raw_path, strerror(errno));
		goto out;
	}
	for (uint64_t i = 0; i < fi->lb_count; i++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n;

		ret = lb_members(c, i, &li, &mbs, &n);
		if (!ret)
			ret = halite_reader_read_lb(c->rd, i, lb);
		if (ret) {
			fail(c, ret, "locality block %llu: %s (%s)", (unsigned long long)i,
			     halite_strerror(ret), halite_reader_errmsg(c->rd));
			goto out;
		}
		switch (HALITE_STREAM_KIND(li.stream)) {
		case HALITE_STREAM_VCPU: o->mb_vcpu += n; break;
		case HALITE_STREAM_VIRTUAL: o->mb_virtual += n; break;
		case HALITE_STREAM_PHYSICAL: o->mb_physical += n; break;
		default: o->mb_other += n; break;
		}
		for (uint32_t k = 0; k < n; k++) {
			uint32_t len = halite_reader_mb_bytes(c->rd, mbs[k]);

			ret = halite_reader_decode_mb(c->rd, mbs[k], lb, mbuf);
			if (ret) {
				fail(c, ret, "memory block %llu: %s (%s)", (unsigned long long)mbs[k],
				     halite_strerror(ret), halite_reader_errmsg(c->rd));
				goto out;
			}
			ret = write_sparse(c, fd, mbuf, len, c->mb_gpa[mbs[k]]);
			if (ret) {
				fail(c, ret, "%s: %s", o->raw_path, strerror(-ret));
				goto out;
			}
			if (HALITE_STREAM_KIND(li.stream) != HALITE_STREAM_VCPU)
				continue;
			if (c->nvmbs == c->vmbs_cap) {
				size_t cap = c->vmbs_cap ? 2 * c->vmbs_cap : 4096;
				struct vmb *v = realloc(c->vmbs, cap * sizeof(*v));

				if (!v) {
					ret = fail(c, -ENOMEM, "out of memory");
					goto out;
				}
				c->vmbs = v;
				c->vmbs_cap = cap;
			}
			c->vmbs[c->nvmbs++] = (struct vmb){ HALITE_STREAM_INDEX(li.stream), order++,
							    mbs[k] };
		}
	}
	if (fsync(fd)) {
		ret = fail(c, -errno, "%s: fsync: %s", o->raw_path, strerror(errno));
		goto out;
	}
	if (!fstat(fd, &st))
		o->raw_alloc_bytes = (uint64_t)st.st_blocks * 512;
	if (o->mem_bytes) {
		void *m = mmap(NULL, o->mem_bytes, PROT_READ, MAP_SHARED, fd, 0);

		if (m == MAP_FAILED) {
			ret = fail(c, -errno, "%s: mmap: %s", o->raw_path, strerror(errno));
			goto out;
		}
		c->img = m;
	}
	/* Stable by construction: order breaks ties within a vCPU. */
	qsort(c->vmbs, c->nvmbs, sizeof(*c->vmbs), cmp_vmb);
out:
	if (fd >= 0)
		close(fd);
	halite_reader_free_lb(lb);
	free(mbuf);
	return ret;
}

/* ws.bin: the pages of the vCPU streams' blocks, in stream order, zero pages left out. */
static int write_ws(struct ctx *c)
{
	struct relayout_out *o = c->out;
	uint32_t ps = c->fi->page_size;
	uint8_t rec[WS_REC];
	FILE *f;
	int fd, ret = 0;

	if (ps != WS_PAGE)
		return fail(c, -EINVAL, "ws.bin needs %u-byte pages, the file has %u", WS_PAGE, ps);
	/* Guest memory: 0600, as every file holding it. */
	fd = open(o->ws_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	f = fd < 0 ? NULL : fdopen(fd, "w");
	if (!f) {
		ret = fail(c, -errno, "%s: %s", o->ws_path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	for (size_t i = 0; i < c->nvmbs && !ret; i++) {
		uint64_t mb = c->vmbs[i].mb, gpa0 = c->mb_gpa[mb];
		uint32_t len = halite_reader_mb_bytes(c->rd, mb);

		for (uint32_t off = 0; off + ps <= len; off += ps) {
			uint64_t gpa = gpa0 + off;

			if (all_zero(c->img + gpa, ps))
				continue;
			for (int b = 0; b < 8; b++)
				rec[b] = (uint8_t)(gpa >> (8 * b));
			memcpy(rec + 8, c->img + gpa, ps);
			if (fwrite(rec, 1, WS_REC, f) != WS_REC) {
				ret = fail(c, -EIO, "%s: write: %s", o->ws_path, strerror(errno));
				break;
			}
			o->ws_pages++;
		}
	}
	if (!ret && (fflush(f) || fsync(fileno(f))))
		ret = fail(c, -errno, "%s: %s", o->ws_path, strerror(errno));
	if (fclose(f) && !ret)
		ret = fail(c, -errno, "%s: close: %s", o->ws_path, strerror(errno));
	return ret;
}

static int put_raw(struct ctx *c, struct halite_writer *w, uint32_t stream, uint64_t mb)
{
	int ret = halite_writer_put_encoded(w, stream, mb, c->img + c->mb_gpa[mb],
					    halite_reader_mb_bytes(c->rd, mb), false);

	if (ret)
		return fail(c, ret, "memory block %llu: %s (%s)", (unsigned long long)mb,
			    halite_strerror(ret), halite_writer_errmsg(w));
	return 0;
}

static int put_random(struct ctx *c, struct halite_writer *w, uint64_t seed)
{
	uint64_t n = 0, *perm = malloc((c->fi->mb_count ? c->fi->mb_count : 1) * sizeof(*perm));
	uint64_t s = seed;
	int ret = 0;

	if (!perm)
		return fail(c, -ENOMEM, "out of memory");
	for (uint64_t mb = 0; mb < c->fi->mb_count; mb++)
		if (c->mb_state[mb] != HALITE_MB_UNTOUCHED)
			perm[n++] = mb;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = next_rand(&s) % i, t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	/* "other" is the stream kind of an import in random order (docs/format.md). */
	for (uint64_t i = 0; i < n && !ret; i++)
		ret = put_raw(c, w, HALITE_STREAM(HALITE_STREAM_OTHER, 0), perm[i]);
	free(perm);
	return ret;
}

/* The writer compresses and records all-zero blocks as zero, as a save does. */
static int put_compressed(struct ctx *c, struct halite_writer *w, uint32_t stream, uint64_t mb)
{
	int ret = halite_writer_put(w, stream, mb, c->img + c->mb_gpa[mb]);

	if (ret)
		return fail(c, ret, "memory block %llu: %s (%s)", (unsigned long long)mb,
			    halite_strerror(ret), halite_writer_errmsg(w));
	return 0;
}

static int put_physical(struct ctx *c, struct halite_writer *w)
{
	uint32_t stream = HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0);
	int ret = 0;

	for (uint64_t mb = 0; mb < c->fi->mb_count && !ret; mb++) {
		if (c->mb_state[mb] == HALITE_MB_UNTOUCHED)
			continue;
		ret = c->opts.physical_compressed ? put_compressed(c, w, stream, mb)
						  : put_raw(c, w, stream, mb);
	}
	return ret;
}

/* The source's metadata (a QEMU save's machine), but for this tool's own keys. */
static int copy_meta(struct ctx *c, struct halite_writer *w)
{
	uint32_t n = halite_reader_meta_count(c->rd);

	for (uint32_t i = 0; i < n; i++) {
		const char *key;
		const void *val;
		uint32_t len;
		int ret = halite_reader_meta(c->rd, i, &key, &val, &len);

		if (!ret && !strncmp(key, "halite-bench.", 13))
			continue;
		if (!ret)
			ret = halite_writer_set_meta(w, key, val, len);
		if (ret)
			return fail(c, ret, "metadata %u of the source: %s", i, halite_strerror(ret));
	}
	return 0;
}

static int put_locality(struct ctx *c, struct halite_writer *w)
{
	int ret = 0;

	for (uint64_t i = 0; i < c->fi->lb_count && !ret; i++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n;

		ret = lb_members(c, i, &li, &mbs, &n);
		if (ret)
			return fail(c, ret, "locality block %llu: %s", (unsigned long long)i,
				    halite_strerror(ret));
		for (uint32_t k = 0; k < n && !ret; k++)
			ret = put_raw(c, w, li.stream, mbs[k]);
	}
	/* Zero blocks had no place in any stream: physical order, after everything. */
	for (uint64_t mb = 0; mb < c->fi->mb_count && !ret; mb++)
		if (c->mb_state[mb] == HALITE_MB_ZERO)
			ret = put_raw(c, w, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0), mb);
	return ret;
}

static int write_org(struct ctx *c, int org, const char *src, uint64_t seed)
{
	const struct halite_file_info *fi = c->fi;
	struct relayout_out *o = c->out;
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_writer *w = NULL;
	struct halite_reader *chk = NULL;
	const struct halite_root *roots = NULL;
	uint32_t vcount = 0, nroots = 0;
	const void *dev;
	uint64_t devlen;
	char meta[64];
	struct stat st;
	int ret;

	if (!halite_reader_vcpus(c->rd, &vcount, &roots, &nroots))
		wo.vcpu_count = vcount;
	wo.page_size = fi->page_size;
	wo.mb_pages = fi->mb_pages;
	wo.lb_size = fi->lb_size;
	wo.codec = HALITE_CODEC_NONE;
	if (org == ORG_PHYSICAL) {
		if (c->opts.physical_lb_size)
			wo.lb_size = c->opts.physical_lb_size;
		if (c->opts.physical_compressed) {
			wo.codec = fi->codec;
			wo.level = fi->codec_level;
		}
	}
	ret = halite_writer_create(&w, o->hlt_path[org], c->regions, c->nregions, &wo);
	if (ret)
		return fail(c, ret, "%s: %s", o->hlt_path[org], halite_strerror(ret));
	if (halite_writer_mb_count(w) != fi->mb_count) {
		ret = fail(c, -HALITE_E_INTERNAL, "%s: %llu memory blocks, the source has %llu",
			   o->hlt_path[org], (unsigned long long)halite_writer_mb_count(w),
			   (unsigned long long)fi->mb_count);
		goto out;
	}
	switch (org) {
	case ORG_RANDOM: ret = put_random(c, w, seed); break;
	case ORG_PHYSICAL: ret = put_physical(c, w); break;
	default: ret = put_locality(c, w); break;
	}
	for (uint32_t i = 0; !ret && i < nroots; i++)
		ret = halite_writer_add_root(w, &roots[i]);
	if (!ret && !halite_reader_device_state(c->rd, &dev, &devlen))
		ret = halite_writer_set_device_state(w, dev, devlen);
	if (!ret)
		ret = copy_meta(c, w);
	if (org == ORG_PHYSICAL && c->opts.physical_compressed)
		snprintf(meta, sizeof(meta), "%s, %u-byte LBs, %s", org_names[org], wo.lb_size,
			 halite_codec_name(wo.codec));
	else
		snprintf(meta, sizeof(meta), "%s, zero blocks stored", org_names[org]);
	if (!ret)
		ret = halite_writer_set_meta(w, "halite-bench.relayout", meta, (uint32_t)strlen(meta));
	if (!ret)
		ret = halite_writer_set_meta(w, "halite-bench.source", src, (uint32_t)strlen(src));
	if (!ret)
		ret = halite_writer_finish(w);
	if (ret) {
		fail(c, ret, "%s: %s (%s)", o->hlt_path[org], halite_strerror(ret),
		     halite_writer_errmsg(w));
		goto out;
	}
	/* Read back: the file opens, and holds as many blocks of each kind as the source. */
	ret = halite_reader_open(&chk, o->hlt_path[org], NULL);
	if (ret) {
		fail(c, ret, "%s: written but unreadable: %s", o->hlt_path[org], halite_strerror(ret));
		goto out;
	}
	if (halite_reader_info(chk)->mb_untouched != fi->mb_untouched ||
	    halite_reader_info(chk)->mb_stored + halite_reader_info(chk)->mb_zero !=
		    fi->mb_stored + fi->mb_zero ||
	    (wo.codec == HALITE_CODEC_NONE && halite_reader_info(chk)->mb_zero)) {
		ret = fail(c, -HALITE_E_INTERNAL, "%s: block counts differ from the source",
			   o->hlt_path[org]);
		goto out;
	}
	o->lb_count[org] = halite_reader_info(chk)->lb_count;
	o->file_bytes[org] = stat(o->hlt_path[org], &st) ? 0 : (uint64_t)st.st_size;
out:
	halite_reader_free(chk);
	halite_writer_free(w, true);
	return ret;
}

void relayout_out_free(struct relayout_out *out)
{
	if (!out)
		return;
	for (int i = 0; i < ORG_COUNT; i++) {
		free(out->hlt_path[i]);
		out->hlt_path[i] = NULL;
	}
	free(out->raw_path);
	free(out->ws_path);
	out->raw_path = out->ws_path = NULL;
}

int relayout(const char *src, const char *dir, uint64_t seed, struct relayout_out *out,
	     char *err, size_t errlen)
{
	return relayout_ext(src, dir, seed, NULL, out, err, errlen);
}

int relayout_ext(const char *src, const char *dir, uint64_t seed, const struct relayout_opts *opts,
		 struct relayout_out *out, char *err, size_t errlen)
{
	struct relayout_out o = { 0 };
	struct ctx c = { .out = &o, .err = err, .errlen = errlen };
	char rerr[256] = "";
	HALITE_OPTS(halite_reader_opts, ro);
	double t0 = halite_now_s();
	struct stat st;
	int ret;

	if (err && errlen)
		err[0] = '\0';
	ro.errbuf = rerr;
	ro.errbuf_len = sizeof(rerr);
	ret = halite_reader_open(&c.rd, src, &ro);
	if (ret)
		return fail(&c, ret, "%s: %s%s%s", src, halite_strerror(ret), rerr[0] ? ": " : "",
			    rerr);
	c.fi = halite_reader_info(c.rd);
	if (!c.fi->region_count) {
		ret = fail(&c, -EINVAL, "%s: no regions", src);
		goto out;
	}
	for (int i = 0; i < ORG_COUNT; i++) {
		if (i == ORG_HALITE ? !(o.hlt_path[i] = strdup(src))
				    : asprintf(&o.hlt_path[i], "%s/%s.hlt", dir, org_names[i]) < 0) {
			o.hlt_path[i] = NULL;
			ret = fail(&c, -ENOMEM, "out of memory");
			goto out;
		}
	}
	if (asprintf(&o.raw_path, "%s/raw.img", dir) < 0 || asprintf(&o.ws_path, "%s/ws.bin", dir) < 0) {
		ret = fail(&c, -ENOMEM, "out of memory");
		goto out;
	}
	if (opts)
		c.opts = *opts;
	ret = index_source(&c);
	if (!ret)
		ret = write_raw(&c);
	if (!ret && !c.opts.physical_only)
		ret = write_ws(&c);
	for (int i = 0; !ret && i < ORG_HALITE; i++)
		if (!c.opts.physical_only || i == ORG_PHYSICAL)
			ret = write_org(&c, i, src, seed);
	if (!ret) {
		o.lb_count[ORG_HALITE] = c.fi->lb_count;
		o.file_bytes[ORG_HALITE] = stat(src, &st) ? 0 : (uint64_t)st.st_size;
	}
out:
	if (c.img)
		munmap((void *)c.img, o.mem_bytes);
	if (ret) {
		for (int i = 0; i < ORG_HALITE; i++)
			if (o.hlt_path[i])
				unlink(o.hlt_path[i]);
		if (o.raw_path)
			unlink(o.raw_path);
		if (o.ws_path)
			unlink(o.ws_path);
		relayout_out_free(&o);
	} else {
		o.seconds = halite_now_s() - t0;
		*out = o;
	}
	free(c.vmbs);
	free(c.regions);
	free(c.mb_gpa);
	free(c.mb_state);
	halite_reader_free(c.rd);
	return ret;
}
