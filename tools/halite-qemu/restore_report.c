// SPDX-License-Identifier: MIT
/*
 * halite-qemu restore: what it reports (restore_run.h): the text summary or
 * --json's object (docs/cli.md), and QEMU's own words when it failed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "restore_run.h"

static double ms(uint64_t a, uint64_t b)
{
	return a && b >= a ? (double)(b - a) / 1e6 : -1;
}

/*
 * Where disk @i's frozen image came from: "local" (this host's, as the file
 * records it), "store" (fetched now into the host's cache) or "cache" (a
 * copy an earlier restore fetched); the bytes fetched and the seconds spent
 * fetching and checking the copy.
 */
static void report_disk_origin(cJSON *j, const struct restore_run *r, int i)
{
	static const char *const from[] = { "local", "store", "cache" };
	const struct hq_disk *d = &r->b.disks->d[i];

	cJSON_AddStringToObject(j, "source", d->local[0] ? from[r->fetch.d[i].from] : "local");
	if (d->local[0])
		cJSON_AddStringToObject(j, "cached_image", d->local);
	else
		cJSON_AddNullToObject(j, "cached_image");
	hq_json_u64(j, "bytes_fetched", true, d->local[0] ? r->fetch.d[i].bytes : 0);
	hq_json_fixed(j, "fetch_s", d->local[0], r->fetch.d[i].seconds, 3);
	cJSON_AddBoolToObject(j, "cache_damaged", d->local[0] && r->fetch.d[i].damaged);
}

/*
 * "disks": [{"qdev", "frozen_image", "overlay", "source", "cached_image",
 * "bytes_fetched", "fetch_s", "cache_damaged"}]: the overlays the guest runs
 * on and where each frozen image came from.
 */
static void report_disks_json(cJSON *o, const struct restore_run *r)
{
	cJSON *a;

	if (!r->file_known) {
		cJSON_AddNullToObject(o, "disks");
		return;
	}
	a = cJSON_AddArrayToObject(o, "disks");
	for (int i = 0; a && r->b.disks && r->b.ndisks && i < r->b.disks->n; i++) {
		const struct hq_disk *d = &r->b.disks->d[i];
		cJSON *j;

		if (!d->frozen)
			continue;
		j = cJSON_CreateObject();
		cJSON_AddStringToObject(j, "qdev", d->qdev);
		cJSON_AddStringToObject(j, "frozen_image", d->image);
		cJSON_AddStringToObject(j, "overlay", d->overlay);
		report_disk_origin(j, r, i);
		cJSON_AddItemToArray(a, j);
	}
}

/* @key: milliseconds from @a to @b, null unless both happened. */
/*
 * An s3:// snapshot: the store's requests and bytes and the host's LB
 * cache's part (null without --cache-dir); null for a local file.
 */
static void report_store_json(cJSON *o, const struct restore_run *r, bool stats)
{
	struct halite_store_stats ss;
	cJSON *j, *c;

	if (!stats || strncmp(r->p.path, "s3://", 5)) {
		cJSON_AddNullToObject(o, "store");
		return;
	}
	halite_reader_store_stats(halite_restore_reader(r->rs), &ss);
	j = cJSON_AddObjectToObject(o, "store");
	if (!j)
		return;
	hq_json_u64(j, "requests", true, ss.requests);
	hq_json_u64(j, "retries", true, ss.retries);
	hq_json_u64(j, "bytes", true, ss.bytes);
	hq_json_u64(j, "connects", true, ss.connects);
	if (!ss.cached) {
		cJSON_AddNullToObject(j, "cache");
		return;
	}
	c = cJSON_AddObjectToObject(j, "cache");
	if (!c)
		return;
	hq_json_u64(c, "hits", true, ss.cache_hits);
	hq_json_u64(c, "misses", true, ss.cache_misses);
	hq_json_u64(c, "bytes_hit", true, ss.cache_bytes_hit);
	hq_json_u64(c, "puts", true, ss.cache_puts);
	hq_json_u64(c, "put_errors", true, ss.cache_put_errors);
	hq_json_u64(c, "evictions", true, ss.cache_evictions);
}

static void json_ms(cJSON *o, const char *key, uint64_t a, uint64_t b)
{
	hq_json_fixed(o, key, a && b >= a, ms(a, b), 3);
}

/*
 * The report as one JSON object: on failure the keys a success has, with
 * what was learnt before it failed and null for the rest.
 */
void restore_report_json(const struct restore_run *r, int code)
{
	struct halite_restore_stats st = r->st;
	bool stats = r->engine_running, file = r->file_known;
	cJSON *o = hq_json_head(code, r->p.path, r->err, r->qemu_err[0] ? r->qemu_err :
				r->b.vm.qemu_err, &r->b.vm);

	if (!o) {
		hq_json_print(NULL);
		return;
	}
	if (stats)
		halite_restore_stats(r->rs, &st);
	json_ms(o, "qmp_ready_ms", r->t0, r->t_qmp);
	json_ms(o, "engine_ready_ms", r->t0, r->t_ready);
	json_ms(o, "devices_loaded_ms", r->t0, r->t_loaded);
	json_ms(o, "resumed_ms", r->t0, r->t_resume);
	json_ms(o, "ready_to_resume_ms", r->t_qmp, r->t_resume);
	hq_json_fixed(o, "done_s", r->t_resume && r->t_done >= r->t_resume,
		      ms(r->t_resume, r->t_done) / 1e3, 3);
	hq_json_u64(o, "memory_bytes", file, r->b.f.mem_bytes - hq_snapfile_devram_bytes(&r->b.f));
	hq_json_u64(o, "faults", stats, st.faults);
	hq_json_u64(o, "faults_vcpu", stats, st.faults_vcpu);
	hq_json_u64(o, "faults_zero", stats, st.faults_zero);
	hq_json_u64(o, "faults_cached", stats, st.faults_cached);
	hq_json_fixed(o, "fault_p50_us", stats, (double)st.fault_p50_ns / 1e3, 1);
	hq_json_fixed(o, "fault_p99_us", stats, (double)st.fault_p99_ns / 1e3, 1);
	hq_json_u64(o, "lb_total", stats, st.lb_total);
	hq_json_u64(o, "lb_demand", stats, st.lb_demand);
	hq_json_u64(o, "lb_prefetch", stats, st.lb_prefetch);
	hq_json_u64(o, "lb_hot", stats, st.lb_hot);
	hq_json_u64(o, "lb_retries", stats, st.lb_retries);
	hq_json_u64(o, "bytes_read", stats, st.bytes_read);
	hq_json_u64(o, "mb_total", stats, st.mb_total);
	hq_json_u64(o, "mb_fault", stats, st.mb_fault);
	hq_json_u64(o, "mb_pool", stats, st.mb_pool);
	hq_json_u64(o, "mb_prefetch", stats, st.mb_prefetch);
	hq_json_u64(o, "mb_zero", stats, st.mb_zero);
	hq_json_u64(o, "mb_present", stats, st.mb_present);
	hq_json_bool(o, "attached", r->p.parsed, r->p.attach);
	/* Measured only with --track-access. */
	hq_json_fixed(o, "vm_access_pct", stats && st.vm_access_pct >= 0, st.vm_access_pct, 2);
	hq_json_bool(o, "paused", file, r->paused);
	hq_json_str(o, "run_state", !file ? NULL : r->paused ? "paused" : "running");
	hq_json_str(o, "saved_run_state", !file ? NULL : r->file_paused ? "paused" : "running");
	hq_json_bool(o, "detached", r->p.parsed, r->p.detach);
	hq_json_str(o, "cmdline", !r->p.parsed ? NULL : r->p.attach ? "attached" :
		    r->b.cfg.replayed || !r->p.qemu_argc ? "recorded" : "given");
	hq_json_u64(o, "forwards", r->t_forwarded, (uint64_t)r->nforwards);
	json_ms(o, "forwarded_ms", r->t0, r->t_forwarded);
	hq_json_u64(o, "device_ram_bytes", file, hq_snapfile_devram_bytes(&r->b.f));
	hq_json_u64(o, "device_ram_written_bytes", r->devram_done, r->devram_written);
	hq_json_fixed(o, "device_ram_ms", r->devram_done, (double)r->devram_ns / 1e6, 3);
	hq_json_bool(o, "bypass_cache", r->p.parsed, r->p.bypass_cache);
	/* --learn: the trace, once written (the engine writes it when the restore ends). */
	hq_json_str(o, "learn_trace", r->p.learn && r->t_done && !access(r->p.learn, F_OK) ?
		    r->p.learn : NULL);
	hq_json_u64(o, "learn_window_ms", r->p.parsed && r->p.learn, r->p.learn_window_ms);
	report_disks_json(o, r);
	report_store_json(o, r, stats);
	hq_json_print(o);
}

void restore_report(const struct restore_run *r, int ret)
{
	const struct halite_restore_stats *st = &r->st;
	char a[32];

	if (r->p.out.json) {
		restore_report_json(r, hq_exit_code(ret));
		return;
	}
	if (ret)
		return;
	printf("restored %s into QEMU %d.%d.%d pid %d, %s, %u vCPUs\n", r->p.path, r->b.vm.major,
	       r->b.vm.minor, r->b.vm.micro, (int)r->b.vm.pid, r->b.vm.machine, r->b.vm.nvcpus);
	printf("  QEMU ready     %.0f ms after start (QMP up)\n", ms(r->t0, r->t_qmp));
	printf("  guest %s  %.1f ms after QEMU was ready (devices loaded in %.1f ms)%s\n",
	       r->paused ? "loaded " : "resumed", ms(r->t_qmp, r->t_resume),
	       ms(r->t_ready, r->t_loaded), !r->paused ? "" : r->p.run == RUN_AS_SAVED ?
	       "; left paused, as it was saved (cont, or --running, runs it)" :
	       "; left paused (cont runs it)");
	printf("  all memory in  %.2f s after resume: %s, %" PRIu64 " LBs (%" PRIu64 " demand, %"
	       PRIu64 " prefetch), %s read\n", ms(r->t_resume, r->t_done) / 1e3,
	       hq_bytes(r->b.f.mem_bytes, a, sizeof(a)), st->lb_total, st->lb_demand, st->lb_prefetch,
	       hq_bytes(st->bytes_read, (char[32]){ 0 }, 32));
	if (st->lb_hot)
		printf("  hot prefix     %" PRIu64 " LBs (what earlier guests touched first) read "
		       "first\n", st->lb_hot);
	if (r->b.cfg.replayed)
		printf("  command line   the one the file records, run in %s\n",
		       r->b.cfg.cwd ? r->b.cfg.cwd : "this directory");
	if (r->nforwards)
		printf("  host forwards  %d added %.1f ms after QEMU was ready, once the guest's "
		       "state was loaded\n", r->nforwards, ms(r->t_qmp, r->t_forwarded));
	for (uint32_t i = 0; i < r->b.f.ndevram; i++)
		printf("  device RAM     %s, %s: in before the guest ran\n", r->b.f.devram[i].name,
		       hq_bytes(r->b.f.devram[i].length, a, sizeof(a)));
	if (r->b.f.ndevram)
		printf("  device write   %s written into QEMU in %.2f ms, once the device state was "
		       "loaded\n", hq_bytes(r->devram_written, a, sizeof(a)),
		       (double)r->devram_ns / 1e6);
	if (r->p.attach)
		printf("  taken over     %" PRIu64 " memory blocks were in already and kept\n",
		       st->mb_present);
	if (r->p.learn)
		printf("  learnt         the guest's first touches %s, in %s\n",
		       r->p.learn_window_ms ? "in its first window" : "until all memory was in",
		       r->p.learn);
	for (int i = 0; r->b.disks && r->b.ndisks && i < r->b.disks->n; i++)
		if (r->b.disks->d[i].frozen)
			printf("  disk           %s: runs on %s, a new overlay of %s (the disk as "
			       "at the snapshot)\n", r->b.disks->d[i].name, r->b.disks->d[i].overlay,
			       r->b.disks->d[i].image);
	printf("  faults         %" PRIu64 " (vCPUs %" PRIu64 ", zero %" PRIu64 ", from an LB in "
	       "memory %" PRIu64 "), service p50 %.0f us, p99 %.0f us\n", st->faults,
	       st->faults_vcpu, st->faults_zero, st->faults_cached,
	       (double)st->fault_p50_ns / 1e3, (double)st->fault_p99_ns / 1e3);
	if (st->vm_access_pct >= 0)
		printf("  VM access      %.1f%% of the other blocks of demand-read LBs were used\n",
		       st->vm_access_pct);
	fflush(stdout);
}

/* The last lines QEMU wrote to our log, on stderr. */
void restore_show_qemu_log(const struct restore_run *r)
{
	char path[96], buf[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/qemu.log", r->dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n > 0) {
		buf[n] = '\0';
		fprintf(stderr, PROG ": QEMU said:\n%s%s", buf, buf[n - 1] == '\n' ? "" : "\n");
	}
	close(fd);
}

/*
 * QEMU's last words when it exited on us (its refusal of the command line,
 * say): the last lines of its log, when the log is a file (ours with
 * --detach, or --qemu-log); without one QEMU wrote to our stderr itself.
 */
void restore_qemu_last_words(struct restore_run *r)
{
	char path[PATH_MAX], buf[1024], *p, *e;
	ssize_t n;
	off_t size, from;
	int fd, lines = 0;

	if (r->p.qemu_log)
		snprintf(path, sizeof(path), "%s", r->p.qemu_log);
	else if (r->p.detach && r->dir[0])
		snprintf(path, sizeof(path), "%s/qemu.log", r->dir);
	else
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	from = size > (off_t)sizeof(buf) - 1 ? size - (off_t)sizeof(buf) + 1 : 0;
	/* An appended log: only what this QEMU wrote. */
	if (from < r->log_start)
		from = r->log_start;
	n = size < 0 ? -1 : pread(fd, buf, (size_t)(size - from), from);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	for (e = buf + n; e > buf && (e[-1] == '\n' || e[-1] == ' '); )
		*--e = '\0';
	/* The last three lines: QEMU says why in its last one or two. */
	for (p = e; p > buf; p--)
		if (p[-1] == '\n' && ++lines == 3)
			break;
	snprintf(r->qemu_err, sizeof(r->qemu_err), "%s", p);
}
