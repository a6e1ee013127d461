// SPDX-License-Identifier: MIT
/*
 * A lazy restore of one region into this process's memory: open the file,
 * start the engine, let the guest run at once, wait until every block is in.
 * Build: cc restore.c $(pkg-config --cflags --libs halite)
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#include <halite/halite.h>

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "snap.hlt";
	uint64_t len = 256ull << 20; /* must equal the region's length in the file */
	struct halite_restore_stats st;
	struct halite_restore *r;
	int err;

	/* Empty, never touched: the engine fills it as the guest faults. */
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return 1;

	struct halite_restore_region reg = {
		.name = "pc.ram", .host = (uintptr_t)mem, .length = len, .kind = HALITE_MEM_ANON,
	};
	HALITE_OPTS(halite_restore_opts, o); /* zero means default */

	err = halite_restore_open(&r, path, &reg, 1, &o); /* header, sections, index only */
	if (err < 0) {
		fprintf(stderr, "open %s: %s\n", path, halite_strerror(err));
		return 1;
	}
	err = halite_restore_start(r); /* registered: resume the guest now */
	if (err == 0)
		err = halite_restore_wait(r, -1); /* 0: every block in, ranges unregistered */
	if (err < 0)
		fprintf(stderr, "restore: %s: %s\n", halite_strerror(err), halite_restore_errmsg(r));
	halite_restore_stats(r, &st);
	printf("%llu faults, %llu LBs read on demand\n", (unsigned long long)st.faults,
	       (unsigned long long)st.lb_demand);
	halite_restore_free(r);
	return err < 0;
}
