/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu clone, private: one clone's state, shared by the clone's run
 * and control socket (clone.c) and its command line (clone_cmdline.c).
 */
#ifndef HALITE_QEMU_CLONE_STATE_H
#define HALITE_QEMU_CLONE_STATE_H

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#include "bring.h"
#include "tool.h"

#define QEMU_DEFAULT "qemu-system-x86_64"
#define QMP_START_TIMEOUT_MS 60000
#define LOAD_TIMEOUT_MS 120000
#define MAX_NICS 16
#define MAX_ALLOW_DIRS 16
#define MAX_HOST_FILES 16

struct clone_params {
	const char *path;     /* the snapshot */
	const char *mem_file; /* the template memory file */
	const char *control;
	const char *dir;      /* the clone's own files; default: the control socket's dir */
	const char *qmp;      /* our QMP socket to QEMU; default DIR/halite-qmp.sock */
	const char *disk_dir; /* overlays; default DIR */
	const char *disk_copies; /* --disk-copies: DIR/N.qcow2, frozen disk N's local copy */
	const char *qemu_binary; /* --qemu-binary: QEMU, whatever the file records */
	const char *run_as;   /* --run-as: QEMU's user (-runas), never root */
	const char *allow_dirs[MAX_ALLOW_DIRS]; /* --allow-dir: where -kernel & co. may be */
	int nallow_dirs;
};

enum qc_state { QC_CREATED, QC_RUNNING, QC_PAUSED };

struct qclone {
	struct clone_params p;
	char dir[PATH_MAX], qmp[PATH_MAX + 32], mem_file[PATH_MAX];
	struct hq_bring b; /* the file (its device RAM decoded before QEMU starts), QEMU */
	int qemu_pidfd;
	int uffd, remote_uffd, lfd;
	char macs[MAX_NICS][18];
	int nmacs;
	char user_qmp[PATH_MAX];   /* the first QMP/monitor socket the recorded line had, rewritten */
	char serial[PATH_MAX];	   /* the first serial file, rewritten */
	enum qc_state state;
	bool quit;
	uid_t run_uid;
	gid_t run_gid;
	char runas[32];		   /* "UID:GID" for -runas; "" without --run-as */
	int host_fds[MAX_HOST_FILES]; /* -kernel & co. opened beneath --allow-dir, QEMU's too */
	int nhost_fds;
	int devuffd;		   /* /dev/userfaultfd, inherited by QEMU under the same number */
	char err[1280];
};

/* Record the first failure in c->err; returns @ret. */
static inline int clone_fail(struct qclone *c, int ret, const char *what, const char *detail)
{
	return hq_fail(c->err, sizeof(c->err), ret, what, detail);
}
/* --qemu-binary: an executable file QEMU can be run from. */
int clone_check_qemu_binary(struct qclone *c);
/* --run-as: the user QEMU runs as (-runas), never root. */
int clone_resolve_run_as(struct qclone *c);
/* The recorded command line checked against what a clone may use (clone_policy.c). */
int clone_check_policy(struct qclone *c);
/*
 * The command line QEMU runs: the recorded one replayed, made a machine of
 * its own (files in the clone's directory, new MACs and host ports, the
 * template memory file), its boot files opened beneath --allow-dir, and
 * confined (-sandbox, -runas).
 */
int clone_prepare_cmdline(struct qclone *c);

#endif
