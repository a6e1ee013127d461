/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: what a clone's QEMU may be told by the snapshot it
 * clones (clone_policy.c). A clone service runs `halite-qemu clone` as root
 * on snapshot files its callers wrote, so the recorded command line is the
 * caller's words: it may name only what the clone makes its own or what
 * touches nothing of the host's.
 */
#ifndef HALITE_QEMU_CLONE_POLICY_H
#define HALITE_QEMU_CLONE_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#include "vmconfig.h"

struct hq_disks;

struct hq_clone_policy {
	size_t sz;		       /* sizeof(struct hq_clone_policy) */
	const char *const *allow_dirs; /* where -kernel, -initrd, -bios, -dtb, -L may point */
	int nallow_dirs;	       /* 0: those paths are taken as recorded (the CLI) */
	const struct hq_disks *disks;  /* the recorded frozen disks (qemu.disks), or NULL */
	const char *cwd;	       /* the recorded working directory (qemu.cwd), or NULL */
};

/*
 * Without --qemu-binary: the recorded argv[0] @bin may be a plain name of
 * an executable in $PATH or an absolute path to an executable, named
 * qemu-system-* either way. 0, or -EPERM with @err naming it.
 */
int hq_clone_check_binary(const char *bin, char *err, size_t errlen);

/*
 * The recorded command line @argv (@argc words, the binary first, as
 * recorded: before replay takes -S, -incoming, -loadvm and -daemonize out)
 * against what a clone may use: an allow-list of options and, for each,
 * the keys and values it may have. 0, or -EPERM with @err naming the first
 * option refused and why ("-netdev user,smb=...: smb= runs smbd on the
 * host; a clone may not"); -ENOMEM.
 */
int hq_clone_policy_check(char *const *argv, int argc, const struct hq_clone_policy *p,
			  char *err, size_t errlen);

/*
 * With p->allow_dirs: each host path of -kernel, -initrd, -bios, -dtb and
 * -L in @a (binary first; relative ones from p->cwd) opened beneath one of
 * them (openat2 RESOLVE_BENEATH: no "..", no symlink out of it) and the
 * argument replaced with "/proc/self/fd/N", N the descriptor opened here,
 * inheritable (QEMU opens it again through /proc/self/fd). Up to @max
 * descriptors go to @fds, their count to *nfds (closed by the caller once
 * QEMU runs). 0, or -EPERM (outside every directory) / -errno with @err.
 */
int hq_clone_open_paths(struct hq_argv *a, const struct hq_clone_policy *p, int *fds, int max,
			int *nfds, char *err, size_t errlen);

#endif
