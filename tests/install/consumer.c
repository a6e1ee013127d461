/* SPDX-License-Identifier: MIT */
/*
 * Built against an installed Halite (pkg-config or CMake package): writes a
 * one-region snapshot and reads it back through libhalite.so's public API.
 */
#include <stdio.h>
#include <string.h>

#include <halite/halite.h>

int main(int argc, char **argv)
{
	struct halite_region reg = { .name = "pc.ram", .gpa = 0, .length = 1 << 20 };
	HALITE_OPTS(halite_writer_opts, o);
	struct halite_writer *w;
	struct halite_reader *r;
	static unsigned char page[8192], out[8192];
	int ret;

	if (argc != 2)
		return 2;
	for (size_t i = 0; i < sizeof(page); i++)
		page[i] = (unsigned char)(i * 7);
	o.flags = HALITE_WRITER_NO_SYNC;
	ret = halite_writer_create(&w, argv[1], &reg, 1, &o);
	if (!ret)
		ret = halite_writer_put(w, HALITE_STREAM(HALITE_STREAM_VCPU, 0), 3, page);
	if (!ret)
		ret = halite_writer_finish(w);
	halite_writer_free(w, true);
	if (!ret)
		ret = halite_reader_open(&r, argv[1], NULL);
	if (ret) {
		fprintf(stderr, "consumer: %s\n", halite_strerror(ret));
		return 1;
	}
	ret = halite_reader_read_mb(r, 3, out);
	if (ret || memcmp(page, out, sizeof(page)) || halite_reader_info(r)->mb_stored != 1) {
		fprintf(stderr, "consumer: read back failed: %s\n", halite_strerror(ret));
		return 1;
	}
	halite_reader_free(r);
	puts("consumer: ok");
	return 0;
}
