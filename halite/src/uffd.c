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
