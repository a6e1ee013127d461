/* SPDX-License-Identifier: MIT */
/* userfaultfd feature probing and the UFFDIO_API handshake (uffd.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <halite/errors.h>

#include "endian_util.h"
#include "uffd.h"

static int uffd_create(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	return fd < 0 ? -errno : fd;
}

int halite_uffd_api(int fd, uint64_t features, uint64_t *missing)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };

	if (ioctl(fd, UFFDIO_API, &api)) {
		/*
		 * EINVAL here means a requested feature bit is unknown to the
		 * kernel: probe on a scratch descriptor to say which.
		 */
		int err = errno;
		struct halite_uffd_caps caps = { 0 };

		if (err == EINVAL && !halite_uffd_probe(&caps) && (features & ~caps.features)) {
			if (missing)
				*missing = features & ~caps.features;
			return -HALITE_E_UNSUPPORTED;
		}
		return -err;
	}
	if ((api.features & features) != features) {
		if (missing)
			*missing = features & ~api.features;
		return -HALITE_E_UNSUPPORTED;
	}
	return 0;
}

int halite_uffd_probe(struct halite_uffd_caps *caps)
{
	struct uffdio_api api = { .api = UFFD_API };
	int fd = uffd_create();
	int ret = 0;

	if (fd < 0)
		return fd;
	/* Asking for no feature makes the kernel report all it has. */
	if (ioctl(fd, UFFDIO_API, &api))
		ret = -errno;
	else
		*caps = (struct halite_uffd_caps){ api.features, api.ioctls };
	close(fd);
	return ret;
}

int halite_uffd_open(uint64_t features, uint64_t *missing)
{
	int fd = uffd_create();
	int ret;

	if (fd < 0)
		return fd;
	ret = halite_uffd_api(fd, features, missing);
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

const char *halite_uffd_feature_names(uint64_t features, char *buf, size_t len)
{
	static const struct {
		uint64_t bit;
		const char *name;
	} names[] = {
		{ UFFD_FEATURE_PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP" },
		{ UFFD_FEATURE_EVENT_FORK, "EVENT_FORK" },
		{ UFFD_FEATURE_EVENT_REMAP, "EVENT_REMAP" },
		{ UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE" },
		{ UFFD_FEATURE_MISSING_HUGETLBFS, "MISSING_HUGETLBFS" },
		{ UFFD_FEATURE_MISSING_SHMEM, "MISSING_SHMEM" },
		{ UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP" },
		{ UFFD_FEATURE_SIGBUS, "SIGBUS" },
		{ UFFD_FEATURE_THREAD_ID, "THREAD_ID" },
		{ UFFD_FEATURE_MINOR_HUGETLBFS, "MINOR_HUGETLBFS" },
		{ UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM" },
		{ UFFD_FEATURE_EXACT_ADDRESS, "EXACT_ADDRESS" },
		{ UFFD_FEATURE_WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM" },
		{ UFFD_FEATURE_WP_UNPOPULATED, "WP_UNPOPULATED" },
		{ UFFD_FEATURE_POISON, "POISON" },
		{ UFFD_FEATURE_WP_ASYNC, "WP_ASYNC" },
		{ UFFD_FEATURE_MOVE, "MOVE" },
	};
	size_t pos = 0;

	if (len)
		buf[0] = 0;
	for (size_t i = 0; i < HALITE_ARRAY_SIZE(names); i++) {
		if (!(features & names[i].bit))
			continue;
		int n = snprintf(buf + pos, len > pos ? len - pos : 0, "%s%s", pos ? "|" : "",
				 names[i].name);
		if (n > 0)
			pos += (size_t)n;
		features &= ~names[i].bit;
	}
	if (features)
		snprintf(buf + (pos < len ? pos : len ? len - 1 : 0), len > pos ? len - pos : 0,
			 "%s0x%llx", pos ? "|" : "", (unsigned long long)features);
	return buf;
}

#define UFFD_FEATURE_INITIALIZED_ (1ull << 31) /* fs/userfaultfd.c, not in the uapi */

int halite_uffd_handshaken(int fd, uint64_t *features)
{
	char path[64], line[256];
	unsigned long long api, feat;
	FILE *f;
	int ret = -EPROTO;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "API: %llx:%llx", &api, &feat) == 2) {
			ret = (feat & UFFD_FEATURE_INITIALIZED_) ? 1 : 0;
			if (ret)
				*features = feat & ~UFFD_FEATURE_INITIALIZED_;
			break;
		}
	fclose(f);
	return ret;
}

int halite_uffd_acquire(int owner_uffd, uint64_t features, unsigned flags, uint64_t *missing,
			const char **why)
{
	uint64_t have = 0;
	int fd, done, ret;

	if (why)
		*why = NULL;
	if (owner_uffd < 0)
		return halite_uffd_open(features, missing);
	fd = fcntl(owner_uffd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	done = (flags & (HALITE_UFFD_TAKEOVER | HALITE_UFFD_EXACT)) ?
		       halite_uffd_handshaken(fd, &have) : 0;
	if (done < 0) {
		if (why)
			*why = "is not a userfaultfd";
		ret = done;
	} else if ((flags & HALITE_UFFD_EXACT) && done != !!(flags & HALITE_UFFD_TAKEOVER)) {
		if (why)
			*why = done ? "was set up by another handler (take it over with ATTACH)" :
				      "was never set up: nothing to take over";
		ret = -HALITE_E_STATE;
	} else if (done) {
		/* The dead handler's handshake stands; it must have asked for ours. */
		if (missing)
			*missing = features & ~have;
		ret = (features & ~have) ? -HALITE_E_UNSUPPORTED : 0;
	} else {
		ret = halite_uffd_api(fd, features, missing);
		/* The handshake may only be done once, and is ours to do. */
		if (ret == -EINVAL && !(flags & HALITE_UFFD_EXACT))
			ret = -HALITE_E_STATE;
	}
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

int halite_uffd_register(int fd, uint64_t addr, uint64_t len, uint64_t mode, uint64_t need)
{
	struct uffdio_register reg = { .range = { addr, len }, .mode = mode };

	if (ioctl(fd, UFFDIO_REGISTER, &reg))
		return -errno;
	return (reg.ioctls & need) == need ? 0 : -HALITE_E_UNSUPPORTED;
}

int halite_uffd_unregister(int fd, uint64_t addr, uint64_t len)
{
	struct uffdio_range range = { addr, len };

	return ioctl(fd, UFFDIO_UNREGISTER, &range) ? -errno : 0;
}
