/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library (the save and restore
 * engines) and by the benchmarks (halite_common): userfaultfd.
 *
 * The one compat header: Debian 12's uapi headers (Linux 6.1) predate
 * UFFDIO_MOVE and a few feature bits that the running kernel (6.8+) has, so
 * what is missing is defined here with the kernel's values, and every feature
 * is probed at run time before use: a build on old headers still runs a new
 * kernel's features, and a new build on an old kernel refuses cleanly.
 */
#ifndef HALITE_UFFD_H
#define HALITE_UFFD_H

#include <stdint.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif

#ifndef UFFDIO_MOVE
/* Linux 6.8, include/uapi/linux/userfaultfd.h */
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
	__u64 mode;
	__s64 move; /* written by the kernel: bytes moved, or -errno */
};
#define _UFFDIO_MOVE (0x05)
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

/* What the running kernel offers (one UFFDIO_API handshake on a scratch fd). */
struct halite_uffd_caps {
	uint64_t features; /* UFFD_FEATURE_* */
	uint64_t ioctls;   /* 1 << _UFFDIO_* available after UFFDIO_API */
};

/*
 * Probe the kernel: 0, or -errno when userfaultfd is unavailable (-ENOSYS:
 * not built in; -EPERM: vm.unprivileged_userfaultfd=0 for a non-root caller).
 */
int halite_uffd_probe(struct halite_uffd_caps *caps);

/*
 * Create a userfaultfd in this process (O_CLOEXEC | O_NONBLOCK) and do the
 * UFFDIO_API handshake asking for @features. Returns the descriptor, or
 * -HALITE_E_UNSUPPORTED when the kernel lacks one of @features (then
 * *missing, if given, says which), or -errno.
 */
int halite_uffd_open(uint64_t features, uint64_t *missing);

/*
 * The UFFDIO_API handshake on a descriptor created elsewhere (inside another
 * process, brought here by pidfd_getfd or SCM_RIGHTS). Same returns, 0 on
 * success. A descriptor allows only one handshake.
 */
int halite_uffd_api(int fd, uint64_t features, uint64_t *missing);

/*
 * Has @fd had its UFFDIO_API handshake (a descriptor taken over from a dead
 * handler)? From /proc/self/fdinfo ("API:\t<api>:<features>:<ioctls>"; bit
 * 31 of the features is the kernel's own mark of a handshake done): 1 and
 * *features (without that bit) when done, 0 when not, or -errno.
 */
int halite_uffd_handshaken(int fd, uint64_t *features);

/* "THREAD_ID|MINOR_SHMEM|..." for @features into buf; returns buf. */
const char *halite_uffd_feature_names(uint64_t features, char *buf, size_t len);

/*
 * Our descriptor for @features: a new userfaultfd when @owner_uffd < 0, else
 * our dup (close-on-exec) of @owner_uffd, a descriptor another process
 * created and passed us. Ours means the owner keeps its copy, so if we die
 * its faults block rather than its ranges losing their registration.
 * The UFFDIO_API handshake is ours to do, except with HALITE_UFFD_TAKEOVER:
 * a handshake a dead handler did stands if it asked for @features.
 * HALITE_UFFD_EXACT (with or without TAKEOVER): the handshake must be done
 * exactly when TAKEOVER says so.
 *
 * Returns the descriptor, or -errno with *why (if @why) a phrase to follow
 * "owner_uffd N" in a message, or NULL where the error says it all:
 *   -HALITE_E_UNSUPPORTED  the kernel or the handshake lacks *missing
 *   -HALITE_E_STATE        the handshake was done by another handler, or
 *                          (EXACT with TAKEOVER) never done
 *   -EBADF, -EPROTO, ...   @owner_uffd is no descriptor, or no userfaultfd
 */
#define HALITE_UFFD_TAKEOVER (1u << 0)
#define HALITE_UFFD_EXACT (1u << 1)
int halite_uffd_acquire(int owner_uffd, uint64_t features, unsigned flags, uint64_t *missing,
			const char **why);

/*
 * Register [@addr, @addr + @len) on @fd with @mode (UFFDIO_REGISTER_MODE_*).
 * Registering a range again with the same descriptor is allowed. Returns 0;
 * -errno of UFFDIO_REGISTER (-EBUSY: another userfaultfd has the range); or
 * -HALITE_E_UNSUPPORTED when the range is registered but lacks an ioctl of
 * @need (1 << _UFFDIO_*): the caller unregisters it like any other.
 */
int halite_uffd_register(int fd, uint64_t addr, uint64_t len, uint64_t mode, uint64_t need);

/* Unregister [@addr, @addr + @len) on @fd: 0 or -errno. */
int halite_uffd_unregister(int fd, uint64_t addr, uint64_t len);

#endif
