// SPDX-License-Identifier: MIT
/*
 * A lazy save of one region of this process's memory: arm with the guest
 * paused, resume it at once, wait while the engine saves each block at its
 * first touch and the background saves the rest.
 * Build: cc save.c $(pkg-config --cflags --libs halite)
 */
#define _GNU_SOURCE /* gettid() */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <halite/halite.h>

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "snap.hlt";
	uint64_t len = 256ull << 20;
	pid_t vcpu = gettid(); /* a fault from this thread goes to stream vcpu0 */
	struct halite_save *s;
	int err;

	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return 1;
	((char *)mem)[0] = 1; /* the "guest" wrote something */

	struct halite_save_region reg = {
		.name = "pc.ram", .gpa = 0, .length = len, .host = (uintptr_t)mem,
		.kind = HALITE_MEM_ANON,
	};
	HALITE_OPTS(halite_save_opts, o);
	o.vcpu_tids = &vcpu;
	o.nvcpus = 1;

	err = halite_save_create(&s, path, &reg, 1, &o);
	if (err < 0) {
		fprintf(stderr, "create %s: %s\n", path, halite_strerror(err));
		return 1;
	}
	/* A guest's page-table root, for the guest-virtual walk (optional). */
	/* halite_save_add_root(s, &(struct halite_root){ 0, HALITE_PAGING_4LEVEL, cr3 }); */

	/* The guest is paused here: the snapshot instant. */
	err = halite_save_arm(s);
	/* Resume the guest now; it runs while its memory is saved. */
	if (err == 0)
		err = halite_save_wait(s, -1); /* 0: complete; < 0: failed, memory unchanged */
	if (err < 0)
		fprintf(stderr, "save: %s: %s\n", halite_strerror(err), halite_save_errmsg(s));
	halite_save_free(s);
	return err < 0;
}
