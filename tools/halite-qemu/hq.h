/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: what the save and restore commands share about a
 * running QEMU (its process, vCPUs and guest RAM) and the command-line
 * plumbing.
 */
#ifndef HALITE_QEMU_HQ_H
#define HALITE_QEMU_HQ_H

#include <stdbool.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include <halite/halite.h>
#include <cjson/cJSON.h>

#include "proc.h"
#include "qmp.h"

#define PROG "halite-qemu"

/* Exit status: 0 ok, 1 the operation failed, 2 usage, 77 kernel/QEMU lacks a feature. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_UNSUPPORTED = 77 };

/* Timeouts of QMP calls; device state and HMP are fast, migration can take a while. */
#define HQ_QMP_TIMEOUT_MS 10000
#define HQ_MAX_VCPUS 1024
#define HQ_MAX_REGIONS 64
#define HQ_MAX_DEVRAM 8

/* One piece of guest RAM as a halite region: a contiguous run of a RAM block. */
struct hq_region {
	char name[96];	     /* "mem0", or "mem0@0x80000000" for a later piece */
	char block[64];	     /* the RAM block (QEMU's idstr: the memory backend's id) */
	uint64_t gpa;	     /* guest-physical base of the piece */
	uint64_t offset;     /* offset in the RAM block */
	uint64_t length;
	uint64_t host;	     /* address in QEMU */
	uint64_t page_size;  /* the block's page size (4 KiB, or huge) */
	int fd;		     /* the backing file, opened through /proc/PID/map_files */
	uint64_t fd_offset;
	bool hugetlb;
	bool anon;	     /* private anonymous memory of QEMU (-m alone, memory-backend-ram):
			      no file, fd -1 */
};

/*
 * Device RAM: a RAM block of QEMU's outside the memory backends that the
 * guest writes, video memory in practice (vga.vram). Saved as a copy taken
 * in the pause, restored by writing it into the new QEMU before it runs.
 */
struct hq_devram {
	char name[64];	 /* the RAM block, and its region in the file: "0000:00:01.0/vga.vram" */
	uint64_t gpa;	 /* where the guest sees it (the VGA's BAR) */
	uint64_t length;
	uint64_t host;	 /* its address in QEMU */
};

struct hq_vm {
	struct hq_qmp *qmp;
	pid_t pid;
	int major, minor, micro;
	char machine[64]; /* "pc-q35-7.2" */
	uint32_t nvcpus;
	pid_t vcpu_tids[HQ_MAX_VCPUS];
	uint32_t nregions;
	struct hq_region regions[HQ_MAX_REGIONS];
	uint32_t ndevram;
	struct hq_devram devram[HQ_MAX_DEVRAM];
	char devram_skipped[512]; /* device RAM that cannot be saved: "NAME: why; ..." */
	/*
	 * The run state QEMU's last answer to stop, cont or query-status gave:
	 * 1 running, -1 paused, 0 unknown (no answer, or another state).
	 */
	int run_seen;
	/* A save of private RAM: its record (hq_aside_record_*), or -1. */
	int aside_fd;
	/* hq_vm_ram() finds the RAM and opens nothing (a take-over has it open). */
	bool ram_find_only;
	char err[1024];
	/* QEMU's own words for a failure it reported outside a QMP error reply (a failed load). */
	char qemu_err[512];
};

/* --- vm.c --- */

/*
 * Connect to QEMU's QMP socket and learn the process, version, machine type
 * and vCPU threads. @need lists QMP commands that must exist (NULL-ended).
 * Returns 0, -HALITE_E_UNSUPPORTED when QEMU is too old or lacks a command,
 * or -errno; vm->err says what.
 */
int hq_vm_attach(struct hq_vm *vm, const char *qmp_path, int timeout_ms,
		 const char *const *need);
/* Refresh vm->vcpu_tids (query-cpus-fast). */
int hq_vm_vcpus(struct hq_vm *vm);
/*
 * Find the guest's RAM: every memory backend's RAM block, split by where
 * the guest sees it (info mtree -f), each piece checked to be a shared
 * mapping in QEMU and its file opened. -EINVAL when RAM is private (not a
 * shared backend), with the fix in vm->err.
 */
int hq_vm_ram(struct hq_vm *vm);
/*
 * Find the device RAM (hq_devram) where the guest sees it now: QEMU's RAM
 * blocks outside the memory backends that are writable RAM in its
 * guest-physical map (info mtree -f), each with its host address (gpa2hva).
 * A block found but not usable is named in vm->devram_skipped; memory the
 * guest cannot reach now (a BAR it switched off, or not yet programmed
 * before the device state is loaded) is not found.
 */
int hq_vm_device_ram(struct hq_vm *vm);
/* The used length of QEMU's RAM block @name (info ramblock); -ENOENT if none. */
int hq_vm_ramblock(struct hq_vm *vm, const char *name, uint64_t *length);
/*
 * QEMU's [@host, @host + @len) into @dst (ours, fresh: reads as zeros),
 * page-aligned: only the pages QEMU has (present or swapped: its pagemap),
 * so the pages it never touched stay holes in @dst. *copied: bytes read.
 */
int hq_vm_read_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst,
		     uint64_t *copied);
/*
 * Before hq_vm_read_pages() into @dst: populate the pages of @dst that QEMU
 * has now, so that the read, in the pause, only copies (faulting fresh
 * pages of ours in would double its time). Best effort: 0 or -errno.
 */
int hq_vm_prefault_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst);
/*
 * @src over QEMU's [@host, @host + @len): the pages @src has (mincore) and
 * those QEMU has (pagemap), so that QEMU's range then reads exactly as
 * @src, pages neither has left alone. *written: bytes written.
 */
int hq_vm_write_pages(struct hq_vm *vm, uint64_t host, uint64_t len, const uint8_t *src,
		      uint64_t *written);
/*
 * Before a save touches QEMU: -EBUSY when a userfaultfd already has some of
 * the guest's RAM (a save or restore of it running: /proc/PID/smaps), and
 * -HALITE_E_UNSUPPORTED when RAM on hugetlbfs meets a device that gives
 * memory back (virtio-balloon, virtio-mem): hugetlbfs can neither refuse
 * the holes they punch nor tell them. vm->err says which.
 */
int hq_vm_check_saveable(struct hq_vm *vm);
/*
 * A device of this QEMU that gives guest memory back by punching holes in
 * the RAM's file ("virtio-balloon", "virtio-mem"), or NULL.
 */
const char *hq_vm_discard_device(struct hq_vm *vm);
/* Close what hq_vm_ram() and hq_vm_attach() opened. */
void hq_vm_release(struct hq_vm *vm);
/* --- runstate.c --- */

/* "running", "paused", "inmigrate", ... into buf. */
int hq_vm_status(struct hq_vm *vm, char *buf, size_t len);
/* QMP stop, once (the pause of a save). 0, or < 0 with vm->err. */
int hq_vm_stop(struct hq_vm *vm, int timeout_ms);
/*
 * Bring the guest to @running ("running") or not ("paused") and confirm it
 * with query-status, within @timeout_ms, whatever became of earlier stop
 * and cont commands: query-status, then cont or stop if needed, then
 * query-status again, until it says so; a connection QEMU closed is opened
 * again. *t_changed (if given) gets when a cont or stop sent here was
 * answered. 0, or < 0 with vm->err saying what was seen last (the QMP
 * client's abort function's value ends it at once).
 */
int hq_vm_settle(struct hq_vm *vm, bool running, int timeout_ms, uint64_t *t_changed);

/* --- fault.c: test fault points, off unless HALITE_QEMU_TEST_FAULT names one --- */

/* Read HALITE_QEMU_TEST_FAULT; -EINVAL with @err for a name that is none. */
int hq_fault_init(char *err, size_t len);
/* Whether the fault point @name is set and has not fired yet; it fires now. */
bool hq_fault(const char *name);
/* As hq_fault() for a point with a time (NAME:MS): its MS when it fires now, else 0. */
unsigned hq_fault_ms(const char *name);
/* stop or cont as a fault point has it: true when it took over (*ret, vm->err). */
bool hq_fault_runstate(struct hq_vm *vm, const char *cmd, int *ret);
/* Before exit: a QEMU stopped by a fault point has been let go. */
void hq_fault_end(void);
/*
 * The vCPUs' page-table roots now (info registers -a): those in 64-bit
 * long mode with paging. Returns how many were written to roots (at most
 * max), or < 0.
 */
int hq_vm_roots(struct hq_vm *vm, struct halite_root *roots, uint32_t max);
/*
 * The device state as a device-only incoming migration stream: header,
 * CONFIGURATION (machine type), every non-RAM device section, EOF and a
 * minimal VMDESCRIPTION. Taken with xen-save-devices-state, which works
 * without Xen; call with the guest paused. *buf is malloc'd.
 */
int hq_vm_device_state(struct hq_vm *vm, uint8_t **buf, uint64_t *len);
/*
 * Check a stored device stream before loading it: the header and the
 * machine type it names. Writes the machine type to @machine.
 */
int hq_device_stream_check(const uint8_t *buf, uint64_t len, char *machine, size_t mlen,
			   char *err, size_t errlen);

/*
 * A userfaultfd created inside QEMU (ptrace), brought here; returns it (or
 * < 0). With @remote, QEMU keeps its copy and *remote gets its number;
 * without, QEMU's copy is closed at once.
 */
int hq_vm_uffd(struct hq_vm *vm, int *remote);
/*
 * The userfaultfd QEMU holds (a restore's, whose handler died), brought
 * here; returns it (or < 0) and its number in QEMU in *remote. -ENOENT when
 * QEMU holds none, -EEXIST when it holds more than one (vm->err says).
 */
int hq_vm_find_uffd(struct hq_vm *vm, int *remote);
/*
 * The QMP unix sockets on QEMU's command line (-qmp unix:PATH, or -chardev
 * socket,path=PATH with -mon mode=control), last first (halite-qemu
 * restore adds its own last). Up to @max paths of @len bytes; how many.
 */
int hq_qmp_sockets(pid_t pid, char (*paths)[108], int max);
/* Close QEMU's copy of a descriptor injected earlier. */
int hq_vm_close_remote(struct hq_vm *vm, int remote);
/* halite_drop_ptes_fn for QEMU: madvise(MADV_DONTNEED) injected into it. */
int hq_drop_ptes(void *vm, uint64_t addr, uint64_t len);
/*
 * halite_remap_fn and halite_unmap_fn for QEMU: mremap and munmap injected
 * into it. A move aside is written to the save's record first thing (see
 * below).
 */
int hq_remap(void *vm, uint64_t addr, uint64_t len, uint64_t to, uint64_t *res);
int hq_unmap(void *vm, uint64_t addr, uint64_t len);

/*
 * The record of a save of private RAM, HQ_ASIDE_DIR/qemu-PID.save: the run
 * state the guest had, and where each range's pages went inside QEMU, so
 * that 'save --recover' can give them back should the save die halfway
 * (QEMU's threads block meanwhile: it keeps the userfaultfd). Created before
 * the pause, removed once the save has let go of QEMU.
 */
#define HQ_ASIDE_DIR "/run/halite-qemu"
int hq_aside_record_create(struct hq_vm *vm, bool running);
void hq_aside_record_remove(struct hq_vm *vm);
/* Its path for QEMU @pid in @buf; whether it exists. */
bool hq_aside_record_path(pid_t pid, char *buf, size_t len);

/*
 * Open RAM piece @g of QEMU (@vm->pid; g->name, block, host, length,
 * page_size, anon set): check its mapping and open its file
 * (/proc/PID/map_files) into g->fd, g->fd_offset; nothing to open for
 * private RAM. 0 or -errno with vm->err.
 */
int hq_region_open(struct hq_vm *vm, struct hq_region *g);

/*
 * The record of a running restore, HQ_ASIDE_DIR/qemu-PID.restore
 * (handoff.c): the file, QEMU's vCPU threads and its RAM pieces as the
 * engine serves them. 'restore --attach' starts serving faults from it
 * before it asks QEMU anything: a thread of QEMU's waiting for memory may
 * hold the lock QMP needs. Written once the engine runs, removed when the
 * restore ends.
 */
int hq_handoff_write(const struct hq_vm *vm, const char *file, char *err, size_t errlen);
/*
 * QEMU @pid's record into @vm (pid, vCPU threads, regions, each opened):
 * 0; -ENOENT without one; -ESTALE if it is another file's than @file;
 * other -errno with @err.
 */
int hq_handoff_read(pid_t pid, const char *file, struct hq_vm *vm, char *err, size_t errlen);
void hq_handoff_remove(pid_t pid);
/* Remove the records (.save, .restore) of QEMUs that are gone. */
void hq_records_prune(void);
/*
 * Remove the work directories (/tmp/halite-qemu.XXXXXX) a halite-qemu left
 * behind when it was killed: those untouched for HQ_TMPDIR_STALE_S whose
 * QEMU no longer listens on their qmp.sock (or that never had one).
 */
#define HQ_TMPDIR_STALE_S 300
void hq_tmpdirs_prune(void);

/* --- recover.c --- */
struct hq_out;
/* save --recover: QEMU at @qmp given back the memory a dead save moved aside. An exit code. */
int hq_cmd_recover(const char *qmp, const struct hq_out *o);

void hq_vmsetf(struct hq_vm *vm, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --- util --- */

/*
 * getopt_long codes of the options every command takes beyond -j/-q/-v
 * (above any character, so they collide with no command's own).
 */
enum { HQ_OPT_PROGRESS = 0x100, HQ_OPT_VERSION, HQ_OPT_BYPASS_CACHE };
/*
 * The long options of save and restore that hq_out_opt() takes (and
 * --bypass-cache, which both pass to their engine), for their getopt tables.
 */
#define HQ_OUT_LONGOPTS							\
	{ "bypass-cache", no_argument, NULL, HQ_OPT_BYPASS_CACHE },	\
	{ "json", no_argument, NULL, 'j' },				\
	{ "progress", optional_argument, NULL, HQ_OPT_PROGRESS },	\
	{ "quiet", no_argument, NULL, 'q' },				\
	{ "verbose", no_argument, NULL, 'v' },				\
	{ "help", no_argument, NULL, 'h' },				\
	{ "version", no_argument, NULL, HQ_OPT_VERSION }

/* What a command prints and how (--json, -q, -v, --progress), and its name. */
struct hq_out {
	bool json, quiet, verbose;
	int progress;	   /* HALITE_PROGRESS_*: --progress, else none with -q, else text */
	bool progress_set; /* --progress given */
	const char *cmd;   /* "save", "restore", "clone": the messages' prefix */
	char usage[512];   /* the usage error parsing found (exit 2) */
};
/* Start parsing for @cmd: *o cleared, --json looked for before any "--" (a usage error reports in JSON too). */
void hq_out_init(struct hq_out *o, const char *cmd, int argc, char **argv);
/*
 * getopt_long's code @c if it is one every command shares: 'j', 'q', 'v',
 * HQ_OPT_PROGRESS, HQ_OPT_VERSION (prints the version and exits 0), and
 * getopt's own ':' and '?' (a missing value, an unknown option: o->usage
 * says which). 1 when taken, 0 when @c is the command's own, -1 on a usage
 * error (o->usage). getopt's own messages are off (opterr = 0): call
 * getopt_long with an optstring starting with ':'.
 */
int hq_out_opt(int c, struct hq_out *o, int argc, char **argv);
/* The option getopt_long just refused, as the user wrote it ("--foo", "-m"), into @buf. */
void hq_bad_option(int argc, char **argv, char *buf, size_t len);
/* A usage error in o->usage; returns -1. */
int hq_usage(struct hq_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * A usage error parsing found, on stderr ("CMD: what"); with --json also
 * into @err for the command's JSON report, which it then prints: true.
 */
bool hq_usage_report(const struct hq_out *o, char *err, size_t len);
/* The progress mode in effect: --progress, else none with -q, else text. */
int hq_progress_mode(const struct hq_out *o);
/*
 * Whether a progress report is due at @now (the last at *@last, updated
 * when due): JSON lines every 0.5 s, a text line every second.
 */
bool hq_progress_due(const struct hq_out *o, uint64_t *last, uint64_t now);
/* Record the first failure as "what: detail" in @err; returns @ret. */
int hq_fail(char *err, size_t len, int ret, const char *what, const char *detail);
/* The exit code of a command that ended with @ret: 0, 77 for -HALITE_E_UNSUPPORTED, else 1. */
int hq_exit_code(int ret);

/*
 * JSON reports (docs/cli.md): one object, "ok", "error" and "exit" on
 * failure, "qemu_error" (QEMU's own words when it caused the failure),
 * null for what is not known. The head: {"ok", "file", "error", "exit" (on
 * failure), "qemu_error", "qemu": {"pid", "version", "machine", "vcpus"}}.
 * @vm may be NULL (nothing known of QEMU); @code is the exit code.
 */
cJSON *hq_json_head(int code, const char *file, const char *err, const char *qemu_err,
		    const struct hq_vm *vm);
/* @key: @v exact (no double rounding), or null when not @known. */
void hq_json_u64(cJSON *o, const char *key, bool known, uint64_t v);
/* @key: @v with @decimals digits after the point, or null when not @known. */
void hq_json_fixed(cJSON *o, const char *key, bool known, double v, int decimals);
/* @key: @s, or null for NULL or "". */
void hq_json_str(cJSON *o, const char *key, const char *s);
/* @key: @v, or null when not @known. */
void hq_json_bool(cJSON *o, const char *key, bool known, bool v);
/* @o on stdout, one line, and deleted. */
void hq_json_print(cJSON *o);
/* A usage error's report for a command without one of its own: the head alone. */
void hq_json_usage(const struct hq_out *o);

/* SIGINT and SIGTERM set hq_stop_signal instead of killing us. */
extern volatile sig_atomic_t hq_stop_signal;
void hq_catch_stop_signals(void);
uint64_t hq_now_ns(void);
void hq_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hq_progressf(bool quiet, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *hq_bytes(uint64_t b, char *buf, size_t len); /* "512 MiB", "1.4 GiB" */
int hq_parse_size(const char *s, uint64_t *out);
/*
 * The engines' log (ctx: the command's struct hq_out): warnings always,
 * the rest with --verbose. Errors only with --verbose: the engine returns
 * them too, and the command reports them once.
 */
void hq_log(void *ctx, int level, const char *msg);

/*
 * The lines of a command's --help about the options hq_out_opt() takes:
 * @cmd ("save", "restore") names what --json reports the failure of.
 */
#define HQ_HELP_OUT_OPTS(cmd)								\
	"  --json             print the report as one JSON object on stdout, also when\n"	\
	"                     the " cmd " fails (\"ok\": false, \"error\", \"exit\",\n"	\
	"                     \"qemu_error\": QEMU's own message when it is the cause)\n"	\
	"  --progress[=MODE]  progress on stderr: text (default), json (a JSON object\n"	\
	"                     per line, twice a second) or none\n"				\
	"  -q, --quiet        no progress on stderr (--progress=none)\n"			\
	"  -v, --verbose      the engine's log on stderr\n"					\
	"  -h, --help         this help\n"							\
	"  --version          the version\n\n"

/* --- commands --- */
int hq_cmd_save(int argc, char **argv);
int hq_cmd_restore(int argc, char **argv);
int hq_cmd_clone(int argc, char **argv);
void hq_help_save(FILE *f);
void hq_help_restore(FILE *f);
void hq_help_clone(FILE *f);

#endif
