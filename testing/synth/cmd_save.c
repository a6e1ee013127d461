// SPDX-License-Identifier: MIT
/*
 * halite-synth save: run a synthetic guest, then save it with the lazy save
 * engine while it runs on, as a VMM would (tools/halite-cycle/cycle.c does the same for
 * the demo). The file records the guest's layout options (synth.args), so
 * that `halite-synth clone` and the tests can build the guest that fits
 * the memory again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/save.h>

#include "cli.h"
#include "endian_util.h"
#include "stats.h"
#include "tool.h"

static int fail(struct hs_save_res *res, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(res->err, sizeof(res->err), fmt, ap);
	va_end(ap);
	return ret;
}

/* Where each vCPU is in its workload, as a VMM saves registers: u64 LE per vCPU. */
static int set_vcpu_state(struct synth_guest *g, unsigned nvcpus, struct halite_save *s,
			  struct hs_save_res *res)
{
	uint8_t buf[8 * SYNTH_MAX_VCPUS];
	int ret;

	for (unsigned v = 0; v < nvcpus; v++) {
		struct synth_vcpu_stats vs;

		ret = synth_vcpu_stats(g, v, &vs);
		if (ret)
			return fail(res, ret, "synth_vcpu_stats: %s", strerror(-ret));
		halite_put_le64(buf + 8 * v, vs.accesses);
	}
	ret = halite_save_set_device_state(s, buf, 8ull * nvcpus);
	if (ret)
		return fail(res, ret, "halite_save_set_device_state: %s", halite_strerror(ret));
	return 0;
}

static int create_engine(struct synth_guest *g, const struct hs_save_req *req,
			 const struct synth_info *info, struct halite_save **sp,
			 struct hs_save_res *res)
{
	HALITE_OPTS(halite_save_opts, o);
	pid_t tids[SYNTH_MAX_VCPUS];
	struct halite_save_region reg = {
		.name = SYNTH_REGION_NAME, .gpa = info->gpa_base, .length = info->mem_bytes,
		.host = (uintptr_t)info->host_addr, .kind = HALITE_MEM_ANON, .fd = -1,
	};
	struct halite_root roots[SYNTH_MAX_VCPUS];
	struct halite_save *s;
	int ret;

	if (info->backing == SYNTH_MEM_SHARED) {
		reg.kind = HALITE_MEM_SHARED;
		reg.fd = info->memfd;
	}
	for (unsigned v = 0; v < info->nvcpus; v++) {
		struct synth_vcpu_info vi;

		ret = synth_vcpu_info(g, v, &vi);
		if (ret)
			return fail(res, ret, "synth_vcpu_info: %s", strerror(-ret));
		tids[v] = vi.tid;
		roots[v] = (struct halite_root){ v, vi.paging_levels, vi.cr3 };
	}
	o.codec = req->codec;
	o.vcpu_tids = tids;
	o.nvcpus = info->nvcpus;
	o.log = halite_log_stderr;
	o.log_level = HALITE_LOG_WARN;
	ret = halite_save_create(&s, req->path, &reg, 1, &o);
	if (ret)
		return fail(res, ret, "cannot save to %s: %s", req->path, halite_strerror(ret));
	/* The roots let the background pass save in guest-virtual order. */
	for (unsigned v = 0; !ret && v < info->nvcpus; v++)
		ret = halite_save_add_root(s, &roots[v]);
	if (!ret)
		ret = halite_save_set_meta(s, "creator", HS_PROG, sizeof(HS_PROG) - 1);
	if (!ret && req->synth_args)
		ret = halite_save_set_meta(s, HS_META_ARGS, req->synth_args,
					   (uint32_t)strlen(req->synth_args));
	if (ret) {
		fail(res, ret, "preparing the save: %s (%s)", halite_strerror(ret),
		     halite_save_errmsg(s));
		halite_save_free(s);
		return ret;
	}
	*sp = s;
	return 0;
}

int hs_save_guest(struct synth_guest *g, const struct hs_save_req *req, struct hs_save_res *res)
{
	struct synth_info info;
	struct halite_save *s = NULL;
	unsigned timeout_s = req->timeout_s ? req->timeout_s : 120;
	uint64_t t0, deadline;
	int ret;

	memset(res, 0, sizeof(*res));
	ret = synth_info(g, &info);
	if (ret)
		return fail(res, ret, "synth_info: %s", strerror(-ret));
	/* Created before the pause: making the file is not part of the snapshot instant. */
	ret = create_engine(g, req, &info, &s, res);
	if (ret)
		return ret;

	t0 = halite_now_ns();
	ret = synth_pause(g); /* 0 if it was paused already */
	if (ret) {
		fail(res, ret, "synth_pause: %s", strerror(-ret));
		goto out;
	}
	ret = req->at_pause ? req->at_pause(req->ctx, g) : 0;
	if (ret) {
		fail(res, ret, "at the snapshot instant: %s", strerror(-ret));
		goto out;
	}
	ret = set_vcpu_state(g, info.nvcpus, s, res);
	if (ret)
		goto out;
	ret = halite_save_arm(s);
	if (ret) {
		fail(res, ret, "halite_save_arm: %s (%s)", halite_strerror(ret),
		     halite_save_errmsg(s));
		goto out;
	}
	if (req->resume) {
		ret = synth_resume(g);
		if (ret) {
			fail(res, ret, "synth_resume: %s", strerror(-ret));
			goto out;
		}
	}
	res->pause_ns = halite_now_ns() - t0;

	deadline = halite_now_ns() + (uint64_t)timeout_s * 1000000000ull;
	for (;;) {
		ret = halite_save_wait(s, 500);
		if (ret != -ETIMEDOUT)
			break;
		if (halite_now_ns() >= deadline) {
			halite_save_stats(s, &res->st);
			fail(res, ret, "the save did not finish in %u s (%llu of %llu memory blocks "
			     "saved)", timeout_s, (unsigned long long)res->st.mb_saved,
			     (unsigned long long)res->st.mb_total);
			halite_save_cancel(s);
			goto out;
		}
	}
	res->save_ns = halite_now_ns() - t0;
	halite_save_stats(s, &res->st);
	if (ret)
		fail(res, ret, "the save failed: %s (%s)", halite_strerror(ret),
		     halite_save_errmsg(s));
out:
	halite_save_free(s);
	return ret;
}

int hs_cmd_save(int argc, char **argv)
{
	struct hs_args a;
	struct hs_save_res res;
	struct synth_guest *g = NULL;
	struct synth_info info;
	char synth_args[512];
	int ret;

	ret = hs_parse(argc, argv, HS_CMD_SAVE, &a);
	if (ret)
		return ret > 0 ? 0 : 2;
	if (!a.out) {
		fprintf(stderr, HS_PROG ": save: missing --out FILE (" HS_PROG " save --help)\n");
		return 2;
	}
	/* hs_parse() checked the options: only a record too long for the buffer is left. */
	ret = hs_synth_args(&a.o, synth_args, sizeof(synth_args));
	if (ret) {
		fprintf(stderr, HS_PROG ": save: recording the guest options: %s\n",
			strerror(-ret));
		return 1;
	}
	ret = synth_create(&g, &a.o);
	if (ret) {
		fprintf(stderr, HS_PROG ": save: creating the guest: %s\n", strerror(-ret));
		return 1;
	}
	synth_info(g, &info);
	ret = synth_start(g);
	if (!ret && a.o.max_accesses)
		ret = synth_wait_done(g, 0);
	else if (!ret)
		sleep((unsigned)a.seconds);
	if (ret) {
		fprintf(stderr, HS_PROG ": save: running the guest: %s\n", strerror(-ret));
		goto out;
	}

	ret = hs_save_guest(g, &(struct hs_save_req){ .path = a.out, .codec = a.codec,
						       .synth_args = synth_args, .resume = true },
			    &res);
	if (ret) {
		fprintf(stderr, HS_PROG ": save: %s\n", res.err);
		goto out;
	}
	fputs("{\"file\":", stdout);
	halite_json_str(stdout, a.out);
	printf(",\"mem_bytes\":%llu,\"file_bytes\":%llu,\"synth_args\":",
	       (unsigned long long)info.mem_bytes, (unsigned long long)res.st.file_bytes);
	halite_json_str(stdout, synth_args);
	printf(",\"pause_ms\":%.3f,\"save_ms\":%.3f}\n", (double)res.pause_ns / 1e6,
	       (double)res.save_ns / 1e6);
	fflush(stdout);
out:
	synth_stop(g);
	synth_free(g);
	return ret ? 1 : 0;
}
