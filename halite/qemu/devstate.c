// SPDX-License-Identifier: MIT
/*
 * A running QEMU's device state as a device-only migration stream (header,
 * CONFIGURATION, the device sections, EOF, a minimal VMDESCRIPTION), taken
 * for a save, and a stored one checked before a restore loads it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devstate.h"

/* QEMU stream (migration/savevm.c): magic, version, section types. */
#define QEVM_MAGIC 0x5145564du
#define QEVM_VERSION 3u
#define QEVM_EOF 0x00
#define QEVM_VMDESCRIPTION 0x06
#define QEVM_CONFIGURATION 0x07
/*
 * What QEMU expects after EOF (migration/savevm.c): a description of the
 * devices, for stream-dumping tools; the loader reads and drops it, and
 * complains when it is missing.
 */
static const char vmdesc[] = "{\"page_size\": 4096, \"devices\": []}";

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static int read_whole(const char *path, uint8_t **buf, uint64_t *len)
{
	struct stat st;
	uint8_t *p;
	size_t got = 0;
	int fd, ret = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		ret = -errno;
		goto out;
	}
	if (st.st_size <= 0 || st.st_size > (256 << 20)) {
		ret = -EFBIG;
		goto out;
	}
	p = malloc((size_t)st.st_size);
	if (!p) {
		ret = -ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, p + got, (size_t)st.st_size - got);

		if (r <= 0) {
			ret = r < 0 ? -errno : -EIO;
			free(p);
			goto out;
		}
		got += (size_t)r;
	}
	*buf = p;
	*len = got;
out:
	close(fd);
	return ret;
}

int hq_vm_device_state(struct hq_vm *vm, uint8_t **bufp, uint64_t *lenp)
{
	char dir[] = "/tmp/halite-qemu.XXXXXX", path[64];
	uint8_t *raw = NULL, *out;
	uint64_t len = 0, n;
	size_t mlen = strlen(vm->machine);
	struct stat st;
	cJSON *args;
	int ret;

	if (!mkdtemp(dir)) {
		ret = -errno;
		hq_vmsetf(vm, "mkdtemp %s: %s", dir, strerror(errno));
		return ret;
	}
	/* QEMU may run as another user: the directory is its to write. */
	snprintf(path, sizeof(path), "/proc/%d", (int)vm->pid);
	if (!stat(path, &st) && st.st_uid != geteuid() && chown(dir, st.st_uid, st.st_gid)) {
		/* Then QEMU's write fails, and says so. */
	}
	snprintf(path, sizeof(path), "%s/devices", dir);
	args = cJSON_CreateObject();
	cJSON_AddStringToObject(args, "filename", path);
	/* Also "live": false is what savevm does; the guest is paused. */
	ret = hq_qmp_call(vm->qmp, "xen-save-devices-state", args, NULL, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		goto out;
	}
	ret = read_whole(path, &raw, &len);
	if (ret) {
		hq_vmsetf(vm, "device state %s: %s", path, strerror(-ret));
		goto out;
	}
	/* QEVM v3 header, FULL sections, EOF; no CONFIGURATION section. */
	if (len < 9 || be32(raw) != QEVM_MAGIC || be32(raw + 4) != QEVM_VERSION ||
	    raw[len - 1] != QEVM_EOF || raw[8] == QEVM_CONFIGURATION) {
		hq_vmsetf(vm, "device state from xen-save-devices-state: not the stream "
			  "expected (QEVM v3, device sections, EOF; %" PRIu64 " bytes)", len);
		ret = -EPROTO;
		goto out;
	}
	/*
	 * What a migration stream carries around the device sections:
	 * CONFIGURATION (the machine type) first, VMDESCRIPTION after EOF.
	 */
	out = malloc(len + 5 + mlen + 5 + sizeof(vmdesc) - 1);
	if (!out) {
		ret = -ENOMEM;
		goto out;
	}
	memcpy(out, raw, 8);
	out[8] = QEVM_CONFIGURATION;
	put_be32(out + 9, (uint32_t)mlen);
	memcpy(out + 13, vm->machine, mlen);
	memcpy(out + 13 + mlen, raw + 8, len - 8);
	n = 13 + mlen + len - 8;
	out[n] = QEVM_VMDESCRIPTION;
	put_be32(out + n + 1, sizeof(vmdesc) - 1);
	memcpy(out + n + 5, vmdesc, sizeof(vmdesc) - 1);
	*bufp = out;
	*lenp = n + 5 + sizeof(vmdesc) - 1;
out:
	free(raw);
	unlink(path);
	rmdir(dir);
	return ret;
}

int hq_device_stream_check(const uint8_t *buf, uint64_t len, char *machine, size_t mlen,
			   char *err, size_t errlen)
{
	uint32_t n;

	if (len < 14 || be32(buf) != QEVM_MAGIC || buf[8] != QEVM_CONFIGURATION) {
		snprintf(err, errlen, "the file's device state is not a QEMU device stream "
			 "(not saved by halite-qemu?)");
		return -HALITE_E_CORRUPT;
	}
	if (be32(buf + 4) != QEVM_VERSION) {
		snprintf(err, errlen, "the file's device state is QEMU stream version %u, "
			 "not %u", be32(buf + 4), QEVM_VERSION);
		return -HALITE_E_UNSUPPORTED;
	}
	n = be32(buf + 9);
	if (n == 0 || n >= mlen || 13 + (uint64_t)n >= len) {
		snprintf(err, errlen, "the file's device state is cut short or malformed");
		return -HALITE_E_CORRUPT;
	}
	memcpy(machine, buf + 13, n);
	machine[n] = '\0';
	return 0;
}
