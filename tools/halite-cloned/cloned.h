/* SPDX-License-Identifier: MIT */
/*
 * Private to halite-cloned: the daemon's registry of templates and clones,
 * and what its files share. One mutex (struct cloned.lock) guards both
 * lists and every field of their entries that changes after creation; the
 * engine handles (halite_template, halite_session) are thread-safe on their
 * own and are used outside it. Slow work (opening a template, spawning and
 * attaching clones) runs without the lock: an entry becomes visible in the
 * registry only once it is usable, or, for a clone, as "starting".
 */
#ifndef HALITE_CLONED_H
#define HALITE_CLONED_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "clone_ctl.h"
#include "stats.h" /* halite_now_ns(), the monotonic clock */
#include <halite/template.h>

#define PROG "halite-cloned"
#define CLONED_ID_LEN 10	     /* "t-" or "c-" and 8 hex digits */
#define CLONED_MAX_BODY (64 << 10)   /* request bodies above this: 413 */
#define CLONED_MAX_COUNT 64	     /* clones per request */
#define CLONED_REGION "pc.ram"	     /* the synthetic guest's one region */
#define CLONED_READY_TIMEOUT_MS 10000 /* a clone's "ready" on stdout */
#define CLONED_CTL_TIMEOUT_MS 5000   /* one control-socket command */
/* A QEMU clone: QEMU starts (TCG: seconds on a loaded host); start loads its devices. */
#define CLONED_QEMU_READY_TIMEOUT_MS 60000
#define CLONED_QEMU_START_TIMEOUT_MS 120000
#define CLONED_MAX_REGIONS 8	     /* guest RAM pieces of a QEMU clone */
#define CLONED_MAX_QEMU_DIRS 32	     /* --qemu-dir: with the rest, within clone_spawn's argv */

/* A --snapshot-dir: snapshots are opened beneath it only (snapdir.c). */
struct snapdir {
	struct snapdir *next;
	char *path;		 /* as given, no trailing '/' */
	int fd;			 /* O_PATH|O_DIRECTORY, opened at start */
};

/* An --s3-allow: objects s3://BUCKET/KEY whose KEY starts with @prefix (s3allow.c). */
struct s3allow {
	struct s3allow *next;
	char *bucket;
	char *prefix;		 /* "" allows the whole bucket */
};

struct cloned_opts {
	const char *socket_path;
	const char *listen;	 /* "127.0.0.1:PORT" or NULL */
	const char *token_file;	 /* --token-file: the TCP listener's bearer token */
	char *token;		 /* its token, read at start (NULL: no TCP) */
	const char *socket_group; /* --socket-group: the socket's group, or NULL */
	const char *tls_cert_file, *tls_key_file, *tls_ca_file; /* TLS on TCP, or NULL */
	char *tls_cert, *tls_key, *tls_ca; /* their PEM text, read at start */
	const char *state_dir;
	const char *mem_dir;
	char *synth_bin;	 /* resolved at start */
	char *qemu_bin;		 /* halite-qemu, for QEMU templates; resolved at start */
	unsigned readers;
	uint32_t read_latency_us;
	uint64_t prefetch_rate;
	uint32_t hot_window_ms;
	uint64_t cache_max;	 /* --cache-max: 0 = no limit */
	char *lbcache_dir;	 /* --cache-dir: the host's LB cache (STATE/lbcache) */
	const char *lbcache_size; /* --cache-size, as given (checked); NULL: 8G */
	int log_level;
	/* clone confinement (confine.c) */
	uint64_t clone_memory_max; /* --clone-memory-max: bytes, 0 none */
	double clone_cpu_max;	   /* --clone-cpu-max: CPUs, 0 none */
	char *qemu_system;	   /* --qemu-system: QEMU, absolute; NULL: none found */
	const char *clone_user;	   /* --clone-user: who QEMU runs as */
	const char **qemu_dirs;	   /* --qemu-dir, repeatable */
	unsigned nqemu_dirs;
};

/* Where clones' cgroups go (confine.c): HIER/halite-cloned, found at start. */
struct confine {
	int version;		 /* 1 or 2; 0: none */
	char *mem;		 /* the memory controller's halite-cloned dir (v2: the one) */
	char *cpu;		 /* the cpu controller's (v2: the same) */
	char why[512];		 /* why one is missing */
};

enum tmpl_kind { TMPL_SYNTHETIC, TMPL_QEMU };

struct hq_diskfetch;

struct tmpl {
	struct tmpl *next;
	char id[CLONED_ID_LEN + 1];
	enum tmpl_kind kind;
	char *snapshot;		 /* an absolute path, or s3://BUCKET/KEY (@s3) */
	bool s3;		 /* read from the object store */
	int snap_fd;		 /* the snapshot, opened once; QEMU clones get this descriptor
				    (0: not open); for @s3, a QEMU template's clones' view of
				    the object (s3clone.c), else 0 */
	char uuid[33];		 /* the snapshot's file uuid, 32 hex digits ("" unknown) */
	char *synth_args;	 /* the snapshot's synth.args (synthetic) */
	/*
	 * Unavailable: recorded, but its snapshot is missing, refused, replaced
	 * (another uuid) or over --cache-max at a reload: t is NULL, its memory
	 * file is left as it is, @error says why; the monitor retries it.
	 */
	bool unavailable;
	char error[512];
	char region[HALITE_MAX_REGION_NAME + 1]; /* its (first) guest RAM region: pc.ram, or a QEMU backend's id */
	bool hotset;
	char *hot_path;		 /* STATE/templates/ID.hot (a restore trace v2), NULL without */
	int64_t created;	 /* unix seconds */
	uint64_t memory_bytes, stored_bytes;
	uint64_t cache_need;	 /* its decoded blocks: stored blocks x block size */
	uint64_t region_offset, region_length;
	struct halite_template *t;
	unsigned nclones;	 /* clones in the registry that use it */
	uint64_t hot_due_ns;	 /* save the hot set then: a session's hot window is over */
	uint64_t memory_max;	 /* its clones' limits unless a request says (0: none) */
	double cpu_max;
	/*
	 * An object's frozen disks, brought into the host's cache at open
	 * (s3disks.c): CACHE/disks/UUID, its clones' --disk-copies, and what
	 * the open fetched or found; NULL without.
	 */
	char *disk_copies;
	struct hq_diskfetch *disks;
};

/* CL_ORPHANED: alive, its template unavailable, nobody serves it (a daemon restart). */
enum clone_state { CL_STARTING, CL_RUNNING, CL_DONE, CL_FAILED, CL_EXITED, CL_ORPHANED,
		   CL_NSTATES };

struct clone {
	struct clone *next;
	char id[CLONED_ID_LEN + 1];
	struct tmpl *tp;
	pid_t pid;
	uint64_t starttime;	 /* field 22 of /proc/PID/stat: tells pid reuse */
	bool child;		 /* our child: reap it with waitpid */
	bool started;		 /* "start" acknowledged */
	enum clone_state state;
	int64_t created;
	double ready_s;		 /* request received -> start acknowledged */
	uint64_t host;		 /* the clone's mapping of the region */
	pid_t vm_pid;		 /* the process whose memory the session serves (QEMU's) */
	uint32_t nregs;		 /* a QEMU clone's guest RAM pieces (info "regions"); 0: one */
	struct halite_session_region regs[CLONED_MAX_REGIONS];
	char reg_names[CLONED_MAX_REGIONS][96];
	char *info;		 /* a QEMU clone's `info` (forwards, MACs, sockets), JSON */
	uint32_t nvcpus;
	pid_t *vcpu_tids;
	/* the request's options, recorded for clone.json */
	uint64_t accesses;
	unsigned write_pct;
	char pattern[8];
	bool premap_hot;
	uint64_t memory_max;	 /* its cgroup's limits: bytes, CPUs (0: none) */
	double cpu_max;
	struct halite_session *s;
	struct halite_session_stats last; /* kept when the session is freed */
	char error[512];
};

/* Upper bounds of the time-to-ready buckets, seconds; +Inf is the count. */
#define CLONED_READY_LE { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }

struct ready_hist {
	uint64_t bucket[16];	 /* cumulative counts per upper bound below */
	uint64_t count;
	double sum;
};

struct cloned {
	struct cloned_opts o;
	pthread_mutex_t lock;
	struct tmpl *templates;
	struct clone *clones;
	struct snapdir *snapdirs; /* --snapshot-dir, in the order given */
	struct s3allow *s3allow; /* --s3-allow */
	int lock_fd;		 /* STATE/daemon.lock, flock()ed for the daemon's life */
	uint64_t retry_due_ns;	 /* the monitor's next retry of unavailable templates */
	struct ready_hist ready;
	struct confine cg;
	/* faults of clones deleted: the counters stay monotonic */
	uint64_t retired_cached, retired_read, retired_zero;
};

/* util.c */
void cl_log(const struct cloned *d, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void cl_engine_log(void *ctx, int level, const char *msg);
int cl_random_id(char *out, char prefix);
bool cl_valid_id(const char *s, char prefix);
int cl_mkdir_p(const char *path, mode_t mode);
int cl_own_dir(const char *path, const char *opt, char *err, size_t errlen); /* 0, -1 @err */
int cl_rm_rf(const char *path);
char *cl_path(const char *dir, const char *a, const char *b); /* dir/a[b]; NULL: ENOMEM */
int cl_proc_starttime(pid_t pid, uint64_t *st);	/* 0, -ESRCH */
char *cl_errstr(int err); /* halite_strerror or strerror, static */

/* state.c: the state directory */
int state_write_json(const char *path, const cJSON *j);
cJSON *state_read_json(const char *path, char *err, size_t errlen);
int state_save_template(struct cloned *d, const struct tmpl *tp);
int state_save_clone(struct cloned *d, const struct clone *c);
char *state_clone_dir(const struct cloned *d, const char *cid);
char *state_template_file(const struct cloned *d, const char *tid, const char *ext);
char *state_mem_file(const struct cloned *d, const char *tid);
const char *state_jstr(const cJSON *j, const char *k);
double state_jnum(const cJSON *j, const char *k, double def);
/* A clone state as clone.json, the API and the metrics name it: "running", ... */
const char *clone_state_name(enum clone_state s);

/* snapdir.c: snapshots from the operator's directories only */
int snapdir_add(struct cloned *d, const char *path, char *err, size_t errlen);
void snapdir_free_all(struct cloned *d);
/* 0 and *@fd, or an HTTP status (403 outside every directory, 400 refused) with @err */
unsigned snapdir_open(struct cloned *d, const char *path, int *fd, char *err, size_t errlen);

/*
 * s3clone.c: a QEMU template's object as its clones read it, a sealed memfd
 * without the guest RAM's LBs, into *@out. 0, or a negative code with @err.
 */
int s3clone_make(const struct tmpl *tp, int *out, char *err, size_t errlen);
/*
 * s3disks.c: a QEMU template object's frozen disks into the host's cache,
 * tp->disk_copies and tp->disks set when it records disks. 0, or a negative
 * code with @err (-HALITE_E_UNSUPPORTED: the store holds no disks for it).
 */
struct halite_reader;
int s3disks_bring(struct tmpl *tp, struct halite_reader *r, char *err, size_t errlen);
void s3disks_free(struct tmpl *tp);
/* "disks" of GET /templates/ID: null, or what the last open fetched or found. */
void s3disks_json(cJSON *j, const struct tmpl *tp);
/* Whether @name is listed in the NUL-separated @list (qemu.device-ram; util.c). */
bool cl_in_list(const char *list, uint32_t len, const char *name);

/* s3allow.c: s3:// snapshots from the operator's --s3-allow locations only */
bool s3allow_is_url(const char *snapshot); /* s3://... */
int s3allow_add(struct cloned *d, const char *spec, char *err, size_t errlen);
void s3allow_free_all(struct cloned *d);
/* 0, or an HTTP status (403 not allowed, 400 a bad URL) with @err */
unsigned s3allow_check(const struct cloned *d, const char *url, char *err, size_t errlen);

/* templates.c */
struct http_reply;
void tmpl_create(struct cloned *d, const cJSON *body, struct http_reply *r);
unsigned tmpl_open(struct cloned *d, struct tmpl *tp, bool reload, char *err, size_t errlen);
void tmpl_destroy(struct tmpl *tp);
struct tmpl *tmpl_find(struct cloned *d, const char *id); /* lock held */
/* An engine message naming the snapshot, not the descriptor's /proc path. */
void tmpl_engine_msg(const struct tmpl *tp, const char *msg, char *out, size_t len);
cJSON *tmpl_json(struct tmpl *tp, bool detail);		  /* lock held */
/* An s3:// template's store counters: false for a local file or one not open. */
struct halite_store_stats;
bool tmpl_store_stats(const struct tmpl *tp, struct halite_store_stats *st);
void tmpl_list(struct cloned *d, struct http_reply *r);
void tmpl_show(struct cloned *d, const char *id, struct http_reply *r);
void tmpl_delete(struct cloned *d, const char *id, struct http_reply *r);
void tmpl_save_hotsets(struct cloned *d, bool all);
void tmpl_load_all(struct cloned *d);
/*
 * The monitor (lock not held): unavailable templates opened again; @loaded is
 * called, lock held, for each that opens (clones_adopt: re-attach its clones),
 * so that templates never call up into the clones' files.
 */
void tmpl_retry_unavailable(struct cloned *d,
			    void (*loaded)(struct cloned *d, struct tmpl *tp));

/* clones.c: the clones API */
void clones_create(struct cloned *d, const char *tid, const cJSON *body, uint64_t t_request,
		   struct http_reply *r);
void clones_list(struct cloned *d, struct http_reply *r);
void clones_show(struct cloned *d, const char *id, struct http_reply *r);
void clones_delete(struct cloned *d, const char *id, struct http_reply *r);
void clone_stats(struct clone *c, struct halite_session_stats *st); /* lock held */
void clone_destroy(struct clone *c);

/* clone_process.c: a clone's process */
void clones_poll(struct cloned *d);		 /* reap, states; lock held */
void clone_refresh(struct clone *c);	 /* running -> done or failed; lock held */
/* @c's process started, its control socket @ctl in @dir, its stdout's read end in *out_fd. */
int clone_spawn(struct cloned *d, struct clone *c, const char *dir, const char *ctl,
		int *out_fd, char *err, size_t errlen);
void clone_abort(struct cloned *d, struct clone *c); /* did not start: ended, files removed */

/* clone_attach.c: a clone attached, at its start or after a daemon restart */
/* One clone's start after its spawn, on a thread of its own: results its own until published. */
struct attach_job {
	struct cloned *d;
	struct clone *c;	 /* read-only here: results go below */
	char *ctl;		 /* control socket path */
	int out_fd;		 /* the clone's stdout (read end) */
	uint64_t t_request;
	/* results, published under the lock */
	int ret;
	struct halite_session *s;
	uint64_t host;
	uint32_t nvcpus;
	pid_t *tids;
	pid_t vm_pid;
	uint32_t nregs;
	struct halite_session_region regs[CLONED_MAX_REGIONS];
	char reg_names[CLONED_MAX_REGIONS][96];
	char *info;
	double ready_s;
	char err[512];
};
void *clone_attach_thread(void *arg); /* a struct attach_job: its results filled in */
int clone_reattach(struct cloned *d, struct clone *c, char *err, size_t errlen);

/* clone_restart.c: the clones a daemon restart finds */
void clones_load_all(struct cloned *d); /* after tmpl_load_all() */
void clones_adopt(struct cloned *d, struct tmpl *tp); /* tp loaded again; lock held */

/* a clone's control socket: halite/clone/clone_ctl.h */

/* confine.c */
int confine_synth_args_check(const char *args, char *err, size_t errlen);
int confine_parse_limits(const cJSON *body, uint64_t *memory_max, double *cpu_max, char *err,
			 size_t errlen);
void confine_init(struct cloned *d);
void confine_fini(struct cloned *d);
int confine_check(const struct cloned *d, uint64_t memory_max, double cpu_max, char *err,
		  size_t errlen);
char *confine_path(const struct cloned *d, const struct clone *c); /* NULL: none */
int confine_create(struct cloned *d, struct clone *c, char *err, size_t errlen);
int confine_attach(struct cloned *d, const struct clone *c, pid_t pid, char *err, size_t errlen);
void confine_remove(struct cloned *d, const struct clone *c);
void confine_exited(struct cloned *d, struct clone *c); /* lock held */
void confine_sweep(struct cloned *d); /* at start, after clones_load_all() */

/* metrics.c */
char *metrics_render(struct cloned *d);

/* api.c */
struct http_reply {
	unsigned status;
	cJSON *json;	/* body, or NULL with text */
	char *text;	/* a text body (metrics) */
	const char *allow; /* for 405 */
};
void reply_json(struct http_reply *r, unsigned status, cJSON *j);
void reply_error(struct http_reply *r, unsigned status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
struct api;
int api_start(struct cloned *d, int unix_fd, int tcp_fd, struct api **out);
/* Stops listening and gives slow requests @grace_ms to end: true if none is left. */
bool api_stop(struct api *a, unsigned grace_ms);
void api_print_routes(FILE *f);

/* json_strict.c: strict JSON in (RFC 8259), valid UTF-8 out */
#define JSON_MAX_DEPTH 32
/* 0, or -EINVAL with "invalid JSON in the body at byte N: what" in @err. */
int json_check_strict(const char *buf, size_t len, char *err, size_t errlen);
bool utf8_valid(const char *s, size_t n, size_t *bad_at);
/* @s as valid UTF-8 (invalid bytes: U+FFFD) of at most @max bytes, cut between
 * characters; malloc'd, NULL: ENOMEM. */
char *utf8_sanitize(const char *s, size_t n, size_t max);
/* Every key and string of @j made valid UTF-8 the same way: 0 or -ENOMEM. */
int json_sanitize_tree(cJSON *j);

#endif
