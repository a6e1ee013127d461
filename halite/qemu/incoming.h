/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: a snapshot file brought into a new QEMU, the steps
 * restore (restore.c) and clone (clone.c) share. What the file says, read
 * before QEMU starts (snapfile.c); QEMU started paused for an incoming
 * state, its device state loaded, the file's device RAM written into it
 * (incoming.c). Each command keeps its own flow and its own checks of
 * QEMU's RAM.
 */
#ifndef HALITE_QEMU_INCOMING_H
#define HALITE_QEMU_INCOMING_H

#include "vm.h"
#include "vmconfig.h"

/* --- snapfile.c --- */

/* What a snapshot file says about the machine, read before QEMU starts. */
struct hq_snapfile {
	uint8_t *dev;	   /* the device state (malloc'd) */
	uint64_t devlen;
	uint32_t vcpus;	   /* 0: not recorded */
	char machine[64];  /* the device state's machine type */
	uint64_t mem_bytes; /* the file's memory, device RAM included */
	uint32_t nregions;
	struct halite_region_info regions[HQ_MAX_REGIONS];
	bool devram_of[HQ_MAX_REGIONS]; /* the region is device RAM (qemu.device-ram) */
	uint32_t ndevram;
	struct {
		const char *name; /* the file region's, the RAM block's */
		uint64_t length;
		uint8_t *copy;	  /* memory of ours (hq_snapfile_devram_map()), or NULL */
	} devram[HQ_MAX_DEVRAM];
};

/*
 * Open @path and read @f from it: device state (checked), vCPUs, regions,
 * which are device RAM. 0 with the reader in *rd (the caller reads its
 * records on, then frees it), or < 0 with @err said and *rd NULL.
 */
int hq_snapfile_read(struct hq_snapfile *f, const char *path, struct halite_reader **rd,
		     char *err, size_t errlen);
/* Device RAM @i's copy: fresh pages of ours (reading zeros), if it has none yet. */
int hq_snapfile_devram_map(struct hq_snapfile *f, uint32_t i, char *err, size_t errlen);
/* Every device RAM region decoded from @rd into its copy (mapped here). */
int hq_snapfile_devram_decode(struct hq_snapfile *f, struct halite_reader *rd, char *err,
			      size_t errlen);
/* The file's device RAM, in bytes. */
uint64_t hq_snapfile_devram_bytes(const struct hq_snapfile *f);
/* Free what @f holds (not @f); fine on a zeroed one. */
void hq_snapfile_free(struct hq_snapfile *f);

/* --- incoming.c --- */

/* How hq_qemu_spawn() starts QEMU. */
struct hq_spawn {
	const struct hq_config *cfg; /* cfg->run, run in cfg->cwd, with hq_config_env() */
	const char *qmp;	     /* our QMP socket, added with -S -incoming defer */
	const char *log;	     /* QEMU's stdout and stderr (appended); NULL: ours */
	int log_mode;		     /* the log's mode if created (0: 0644) */
	bool detach;		     /* a session of its own, stdin /dev/null */
	bool die_with_us;	     /* PR_SET_PDEATHSIG, stdin /dev/null */
	bool stdout_to_stderr;	     /* without a log: QEMU's stdout to our stderr (--json) */
};

/* QEMU as @s says, its pid in *pid: 0, or < 0 with @err ("cannot run ..."). */
int hq_qemu_spawn(const struct hq_spawn *s, pid_t *pid, char *err, size_t errlen);
/*
 * Attach @vm to the QMP socket @sock of QEMU *@pid (just spawned) once it
 * comes up, within @timeout_ms, trying again every @retry_us. QEMU exiting
 * first: -ECHILD, *pid 0, and @err says to see @see. @give_up (if given)
 * ends the wait with its value, and becomes the QMP client's abort function.
 */
int hq_qemu_attach(struct hq_vm *vm, pid_t *pid, const char *sock, int timeout_ms,
		   unsigned retry_us, const char *see, int (*give_up)(void *), void *ctx,
		   char *err, size_t errlen);
/*
 * The device state @dev through @dir/in.sock to QEMU (migrate-incoming),
 * and the load waited for, within @timeout_ms; @give_up as above. A load
 * QEMU gives no reason for failing says @no_reason.
 */
int hq_qemu_load_devices(struct hq_vm *vm, const char *dir, const uint8_t *dev, uint64_t len,
			 int timeout_ms, int (*give_up)(void *), void *ctx,
			 const char *no_reason, char *err, size_t errlen);
/*
 * Each device RAM block of @f has one of its name and length in QEMU: -EINVAL
 * with @err naming the display devices otherwise.
 */
int hq_qemu_check_devram(struct hq_vm *vm, const struct hq_snapfile *f, char *err,
			 size_t errlen);
/*
 * Once the device state is loaded: @f's device RAM copies written over
 * their blocks, found where the guest sees them now; *written: bytes.
 */
int hq_qemu_write_devram(struct hq_vm *vm, const struct hq_snapfile *f, uint64_t *written,
			 char *err, size_t errlen);
/* Private RAM piece @g dropped inside QEMU (an injected madvise). */
int hq_qemu_drop_region(struct hq_vm *vm, const struct hq_region *g, char *err, size_t errlen);

#endif
