/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: the VM's configuration as a restore needs it.
 *
 * cmdline.c  QEMU's command line read as QEMU 7.2 reads it: options and
 *            their arguments, QemuOpts strings ("a,b=c,,d") and JSON ones;
 *            what in it matters for a restore and how two lines differ
 *            there; the recorded line made runnable again; the device list
 *            (info qtree) and how two differ. Pure functions, unit-tested
 *            (tests/qemu/test_cmdline.c), except the checks that look at
 *            the host (sockets and memory files in use).
 * hostfwd.c  user networking's host forwards: taken out of the command line
 *            QEMU starts with and added (HMP hostfwd_add) once the guest's
 *            state is loaded, before it runs (why: hostfwd.c).
 * config.c   what a save records (qemu.cmdline, qemu.cwd, qemu.devices) and
 *            what a restore does with it.
 *
 * Every function that can fail returns 0 (or a count) or -errno, with a
 * sentence in the caller's @err where it says so.
 */
#ifndef HALITE_QEMU_VMCONFIG_H
#define HALITE_QEMU_VMCONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct hq_qmp;

/* --- argument vectors (cmdline.c) --- */

/* A NULL-terminated vector of malloc'd strings. */
struct hq_argv {
	int argc;
	char **argv;
};
int hq_argv_push(struct hq_argv *a, const char *s);
/* Push @s, taking it over (freed on failure too). */
int hq_argv_push_own(struct hq_argv *a, char *s);
int hq_argv_copy(struct hq_argv *a, char *const *argv, int argc);
/* Each string ends with a NUL, as in /proc/PID/cmdline; -EINVAL if the last does not. */
int hq_argv_from_nul(struct hq_argv *a, const void *buf, size_t len);
/* The strings, each followed by its NUL; *len its size. malloc'd. */
char *hq_argv_to_nul(const struct hq_argv *a, size_t *len);
void hq_argv_free(struct hq_argv *a);

/* --- QEMU options (cmdline.c) --- */

/* One option of a command line, as QEMU parses it. */
struct hq_opt {
	const char *name; /* "smp" (no dashes; "--smp" too); "" for a disk image */
	const char *arg;  /* its argument, NULL if it takes none */
	int index;	  /* of the option in the argv parsed */
};

/*
 * Options of @argv (the binary not included) in order. An option QEMU 7.2
 * does not know is taken to have an argument unless the next word starts
 * with '-'. -EINVAL for an option whose argument is missing, with @err.
 * *opts is malloc'd; it points into @argv.
 */
int hq_opts_parse(char *const *argv, int argc, struct hq_opt **opts, int *n, char *err,
		  size_t errlen);
/* Whether QEMU 7.2's option @name (no dashes) takes an argument; -1 for one it does not know. */
int hq_opt_takes_arg(const char *name);

/* One key=value of a QemuOpts string or a JSON object: */
struct hq_kv {
	char *key; /* the implied key (e.g. "type") for a first value without one */
	char *val; /* NULL for "key" alone (on) */
	bool raw;  /* @val is JSON text: a member of a JSON object that was no string */
};
struct hq_kvs {
	int n;
	struct hq_kv *v;
	bool json; /* it was a JSON object: hq_kvs_join() writes one back */
};
/*
 * Split an option's argument: "q35,accel=tcg" with @implied "type" gives
 * type=q35, accel=tcg; ",," is a comma inside a value. An argument that
 * starts with '{' is a JSON object: its members (strings as they are, other
 * values as JSON). -EINVAL for JSON that is not an object.
 */
int hq_kvs_split(const char *arg, const char *implied, struct hq_kvs *out);
/* The value of @key (the last one given), NULL if absent or given alone. */
const char *hq_kvs_get(const struct hq_kvs *kv, const char *key);
bool hq_kvs_has(const struct hq_kvs *kv, const char *key);
/* Drop every @key; returns how many went. */
int hq_kvs_del(struct hq_kvs *kv, const char *key);
int hq_kvs_add(struct hq_kvs *kv, const char *key, const char *val);
/*
 * Back to an argument: commas in values doubled, the implied key left out
 * if it comes first (@implied). A JSON object stays one. malloc'd.
 */
char *hq_kvs_join(const struct hq_kvs *kv, const char *implied);
void hq_kvs_free(struct hq_kvs *kv);

/* A size as QEMU reads it: "512M", "0.5G", "1024" (in @unit bytes). -EINVAL if not one. */
int hq_parse_qemu_size(const char *s, uint64_t unit, uint64_t *out);

/* --- what matters for a restore (cmdline.c) --- */

/*
 * Compare two command lines in what matters for a restore: machine type
 * and options (not accel), -cpu, -smp, -m, memory backends (id, size; not
 * their files), -numa, -device (not the backends they name), NICs (model,
 * MAC, backend type; not hostfwd or other backend options), -netdev types,
 * serial and parallel ports (how many, not where), -vga, -nodefaults, -usb,
 * drives that make devices (if=, index; not their files), -global, -set,
 * -icount and options QEMU 7.2 does not know. What does not matter:
 * display, monitors, QMP, chardevs, serial paths, pidfile, logs, tracing,
 * -accel, kernel, initrd, append, BIOS, firmware config, SMBIOS, -name,
 * -uuid, -rtc, -boot, -blockdev, objects other than memory backends, and
 * halite-qemu's own (-S, -incoming, -loadvm, -daemonize).
 * With @devices (the recorded device list, or NULL), -device options are
 * compared in any order, and one only @now has passes if @devices lists a
 * device of its driver (hot-plugged at the source), one only @saved has if
 * it lists none (unplugged).
 * @saved and @now start with the binary. Machine types that differ as
 * written are compared as resolved by @resolve(@ctx, type, out, len)
 * (aliases such as q35; "" for QEMU's default), when given; it returns 0
 * or < 0. Returns 0 when nothing that matters differs, -EINVAL with every
 * difference in @msg ("-smp 2 at save, -smp 4 now; ..."), or -errno.
 */
typedef int (*hq_machine_resolve_fn)(void *ctx, const char *type, char *out, size_t len);
int hq_cmdline_compare(char *const *saved, int nsaved, char *const *now, int nnow,
		       const struct hq_argv *devices, hq_machine_resolve_fn resolve, void *ctx,
		       char *msg, size_t len);

/* What hq_cmdline_replay() took out that the restore must honour. */
#define HQ_REPLAY_DAEMONIZE 0x1u /* -daemonize: the restore detaches */

/*
 * The recorded command line @rec (binary first) as a restore runs it:
 * without -S, -incoming, -loadvm and -daemonize (*flags says), which are
 * halite-qemu's to give. Everything else stays (QMP sockets, pidfile,
 * logs: the restored QEMU is the same VM). 0, or -ENOMEM.
 */
int hq_cmdline_replay(char *const *rec, int n, struct hq_argv *out, unsigned *flags);

/*
 * Before a QEMU starts with @argv (binary first) in @cwd: each unix socket
 * it would listen on (-qmp, -monitor, -serial unix:...,server; -chardev
 * socket,path=...,server=on) must not be one something listens on now
 * (QEMU would take the path from it without a word), and each file a memory
 * backend maps (memory-backend-file mem-path=FILE) must be mapped by no
 * process (a restore empties its RAM: it would punch another VM's). 0, or
 * -EADDRINUSE / -EBUSY with @err naming the option and the holder.
 */
int hq_cmdline_check_host(char *const *argv, int argc, const char *cwd, char *err,
			  size_t errlen);

/* --- devices (cmdline.c) --- */

/*
 * The devices of QEMU's "info qtree" text, in its order, each as
 * "TYPE[ id=ID][ addr=SLOT.FN]" (PCI devices have an address). -EINVAL for
 * text that names none.
 */
int hq_parse_qtree(const char *text, struct hq_argv *out, char *err, size_t errlen);
/*
 * 0 when @saved and @now list the same devices in the same order; else
 * -EINVAL with the first differences in @msg ("device e1000 addr=02.0 at
 * save, not now; ...").
 */
int hq_devices_compare(const struct hq_argv *saved, const struct hq_argv *now, char *msg,
		       size_t len);

/* --- host forwards (hostfwd.c) --- */

struct hq_fwd {
	char netdev[64];  /* the user netdev's id */
	char rule[160];	  /* "tcp:127.0.0.1:8080-:80", as given */
	bool udp;
	uint32_t host_addr; /* network order; 0: any */
	uint16_t host_port;
};
struct hq_fwds {
	int n;
	struct hq_fwd *v;
};

/*
 * Take the hostfwd rules out of the user-networking options of @a (binary
 * first): -netdev user (QemuOpts or JSON), -nic user, -net user. A -nic or
 * -net that had rules and no id gets one ("halite.nicN", "halite.netN":
 * hostfwd_add needs it). Each argument changed is replaced in @a. Rules go
 * to @f in order. Deterministic: the same @a gives the same ids. -EINVAL
 * for a rule that does not parse, with @err.
 */
int hq_fwd_take_out(struct hq_argv *a, struct hq_fwds *f, char *err, size_t errlen);
/*
 * Before QEMU starts: each rule's host port can be bound (as slirp binds
 * it). -EADDRINUSE with @err naming the rule when another process has it.
 */
int hq_fwd_check_ports(const struct hq_fwds *f, char *err, size_t errlen);
/*
 * Add the rules with HMP hostfwd_add, skipping those QEMU forwards already
 * (info usernet: a restore taken over after some were added). How many
 * were added, or < 0 with @err naming the rule and QEMU's words.
 */
int hq_fwd_add(struct hq_qmp *q, const struct hq_fwds *f, char *err, size_t errlen);
void hq_fwds_free(struct hq_fwds *f);

/* --- the file's record of the configuration, at save and at restore (config.c) --- */

struct hq_vm;
struct halite_save;
struct halite_reader;

struct hq_config {
	struct hq_argv rec;	    /* qemu.cmdline (empty: the file records none) */
	char *rec_cwd;		    /* qemu.cwd */
	struct hq_argv rec_devices; /* qemu.devices */
	char *rec_disks;	    /* qemu.disks (JSON, disks.h); NULL: none recorded */
	bool rec_disks_unfrozen;    /* qemu.disks-frozen "no": saved with --no-disks */
	struct hq_argv user;	    /* the user's command line now: given, or replayed */
	struct hq_argv run;	    /* what QEMU starts with: @user without its forwards */
	const char *cwd;	    /* where QEMU runs (replayed: qemu.cwd); NULL: here */
	struct hq_fwds fwds;	    /* taken out of @run, added once the state is loaded */
	bool replayed;
	unsigned replay_flags;	    /* HQ_REPLAY_* */
	char *machines;		    /* "-machine help", once asked */
};

/*
 * The user's command line of QEMU @pid (binary first): the one halite-qemu
 * restore was given, from QEMU's environment (*from_env), for a QEMU it
 * started; else /proc/PID/cmdline.
 */
int hq_config_user_cmdline(pid_t pid, struct hq_argv *out, bool *from_env);
/* At save: qemu.cmdline, qemu.cwd and qemu.devices into the file's metadata. */
int hq_config_record(struct hq_vm *vm, struct halite_save *s, char *err, size_t errlen);
/* At restore: the file's record (@path for messages); a file without one is fine. */
int hq_config_read(struct hq_config *c, const struct halite_reader *rd, const char *path,
		   char *err, size_t errlen);
/*
 * Before QEMU starts: the command line to run, @given (@ngiven words; the
 * binary first unless it starts with an option, then @bin is) or, with
 * none, the recorded one replayed in its directory. A given one is
 * compared with the recorded one (unless !@check) and refused where it
 * differs in what matters; the forwards are taken out and their ports
 * checked; sockets and memory files are checked (hq_cmdline_check_host()).
 */
int hq_config_prepare(struct hq_config *c, char *const *given, int ngiven, const char *bin,
		      bool check, const char *path, char *err, size_t errlen);
/* "NAME=VALUE" for QEMU's environment: the user's command line, for the next save. */
char *hq_config_env(const struct hq_config *c);
/* Once QEMU runs, before its RAM is touched: its devices against qemu.devices. */
int hq_config_check_devices(struct hq_config *c, struct hq_qmp *q, const char *path, char *err,
			    size_t errlen);
/* Once the device state is loaded, before the guest runs: the forwards taken out; how many. */
int hq_config_forward(struct hq_config *c, struct hq_qmp *q, char *err, size_t errlen);
/*
 * The same for QEMU @pid whose restore is taken over (--attach): the
 * forwards its user's command line has that QEMU lacks; how many were added.
 */
int hq_config_forward_pid(pid_t pid, struct hq_qmp *q, char *err, size_t errlen);
void hq_config_free(struct hq_config *c);

#endif
