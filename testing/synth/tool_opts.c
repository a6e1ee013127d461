// SPDX-License-Identifier: MIT
/*
 * halite-synth's command line: one option table for every command, each
 * option marked with the commands it belongs to, and the synth.args record
 * (the layout options of a guest, written by save, given back to clone).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/codec.h>

#include "cli.h"
#include "internal.h"
#include "tool.h"

void hs_usage(FILE *f)
{
	fprintf(f,
		"Usage: halite-synth [run] [guest options] [workload options] [--seconds S]\n"
		"                    [--trace FILE] [--record FILE] [--loop] [--child]\n"
		"       halite-synth save --out FILE [guest options] [workload options]\n"
		"                    [--seconds S] [--codec lz4|zlib|zstd]\n"
		"       halite-synth clone (--mem-file PATH [--mem-offset BYTES] | --anon)\n"
		"                    --control SOCKPATH\n"
		"                    [guest options] [workload options]\n"
		"       halite-synth trace-dump FILE\n"
		"       halite-synth [COMMAND] --help | --version\n"
		"\n"
		"run: create a guest, run it, pause, print counters, stop.\n"
		"save: create a guest, run the workload, pause and save it with the lazy save\n"
		"  engine to FILE (it runs on while saved); the file's metadata synth.args holds\n"
		"  the guest options that re-create its layout; prints one JSON line.\n"
		"clone: a clone of a saved guest: map PATH (the template memory, at BYTES)\n"
		"  privately as guest memory, attach a guest with the same options to it and\n"
		"  serve its userfaultfd and controls on the unix socket SOCKPATH (one command a\n"
		"  line: info, uffd, start, pause, resume, stats, wait-done MS, dump PATH,\n"
		"  digest, quit); prints \"ready\" once listening. Runs until quit. --anon:\n"
		"  private anonymous memory instead of PATH (the target of an ordinary restore,\n"
		"  to compare with).\n"
		"\n"
		"guest options (synth.args):\n"
		"  --mem MIB          guest memory, a multiple of 2 MiB, 4 MiB .. 1 TiB (1024);\n"
		"                     MIB, or a size with K, M or G (so for --ws and --map)\n"
		"  --vcpus N          1..16 (4)\n"
		"  --ws MIB           working set per vCPU, a multiple of 4 KiB (mem / 4 / vcpus)\n"
		"  --map MIB          mapped per vCPU, ws .. mem / vcpus (ws)\n"
		"  --levels 4|5       paging levels (4)\n"
		"  --stride N         frame allocation stride, 1 .. 1048576 (16)\n"
		"  --shared-as        one address space for all vCPUs\n"
		"  --huge2m N --huge1g N   huge pages per vCPU\n"
		"  --holes N          every N-th 4 KiB virtual page unmapped, N >= 2 (0: none)\n"
		"  --junk             junk bits in non-present entries\n"
		"  --ad-bits          the MMU sets A/D bits\n"
		"  --compress PCT --zero PCT --untouched PCT   0 .. 100 (50, 0, 0)\n"
		"  --seed N\n"
		"  --backing anon|shared   (run, save; anon)\n"
		"workload options:\n"
		"  --write PCT        share of accesses that write, 0 .. 100 (0)\n"
		"  --pattern seq|random|trace   (seq; trace: run only)\n"
		"  --tlb N            TLB entries per vCPU, 0 .. 1048576 (0: walk every access)\n"
		"  --accesses N       per vCPU, then stop (run, save: else --seconds;\n"
		"                     clone: else forever)\n"
		"  --seconds S        run time without --accesses, 0 .. 86400 (run 5, save 1)\n"
		"run only:\n"
		"  --trace FILE       replay FILE (implies --pattern trace)\n"
		"  --record FILE      record every access to FILE\n"
		"  --loop             replay the trace in a loop\n"
		"  --child            run the guest in a forked child\n"
		"save only:\n"
		"  --out FILE         the snapshot file\n"
		"  --codec NAME       lz4 (default), zlib or zstd\n"
		"clone only:\n"
		"  --mem-file PATH    the template memory; --mem-offset BYTES into it, a\n"
		"                     multiple of 4096 (0)\n"
		"  --anon             private anonymous memory instead of --mem-file\n"
		"  --control SOCKPATH the unix socket the clone serves\n"
		"\n"
		"  -h, --help         this text; --version: the version\n"
		"Exit: 0 ok, 1 the guest or the save failed, 2 usage.\n");
}

enum {
	O_MEM = 256, O_VCPUS, O_WS, O_MAP, O_BACKING, O_LEVELS, O_STRIDE, O_SHARED_AS,
	O_HUGE2M, O_HUGE1G, O_HOLES, O_JUNK, O_AD, O_COMPRESS, O_ZERO, O_UNTOUCHED,
	O_WRITE, O_PATTERN, O_TRACE, O_RECORD, O_LOOP, O_SEED, O_TLB, O_ACCESSES,
	O_SECONDS, O_CHILD, O_OUT, O_CODEC, O_MEM_FILE, O_MEM_OFFSET, O_CONTROL, O_ANON, O_HELP,
	O_VERSION,
};

#define RUN (1u << HS_CMD_RUN)
#define SAVE (1u << HS_CMD_SAVE)
#define CLONE (1u << HS_CMD_CLONE)
#define ALL (RUN | SAVE | CLONE)

/* Which commands take each option, indexed by option - O_MEM. */
static const unsigned opt_cmds[] = {
	[O_MEM - O_MEM] = ALL,		[O_VCPUS - O_MEM] = ALL,
	[O_WS - O_MEM] = ALL,		[O_MAP - O_MEM] = ALL,
	[O_BACKING - O_MEM] = RUN | SAVE, [O_LEVELS - O_MEM] = ALL,
	[O_STRIDE - O_MEM] = ALL,	[O_SHARED_AS - O_MEM] = ALL,
	[O_HUGE2M - O_MEM] = ALL,	[O_HUGE1G - O_MEM] = ALL,
	[O_HOLES - O_MEM] = ALL,	[O_JUNK - O_MEM] = ALL,
	[O_AD - O_MEM] = ALL,		[O_COMPRESS - O_MEM] = ALL,
	[O_ZERO - O_MEM] = ALL,		[O_UNTOUCHED - O_MEM] = ALL,
	[O_WRITE - O_MEM] = ALL,	[O_PATTERN - O_MEM] = ALL,
	[O_TRACE - O_MEM] = RUN,	[O_RECORD - O_MEM] = RUN,
	[O_LOOP - O_MEM] = RUN,		[O_SEED - O_MEM] = ALL,
	[O_TLB - O_MEM] = ALL,		[O_ACCESSES - O_MEM] = ALL,
	[O_SECONDS - O_MEM] = RUN | SAVE, [O_CHILD - O_MEM] = RUN,
	[O_OUT - O_MEM] = SAVE,		[O_CODEC - O_MEM] = SAVE,
	[O_MEM_FILE - O_MEM] = CLONE,	[O_MEM_OFFSET - O_MEM] = CLONE,
	[O_CONTROL - O_MEM] = CLONE,	[O_ANON - O_MEM] = CLONE,
	[O_HELP - O_MEM] = ALL,		[O_VERSION - O_MEM] = ALL,
};

static const struct option long_opts[] = {
	{ "mem", 1, 0, O_MEM },		{ "vcpus", 1, 0, O_VCPUS },
	{ "ws", 1, 0, O_WS },		{ "map", 1, 0, O_MAP },
	{ "backing", 1, 0, O_BACKING },	{ "levels", 1, 0, O_LEVELS },
	{ "stride", 1, 0, O_STRIDE },	{ "shared-as", 0, 0, O_SHARED_AS },
	{ "huge2m", 1, 0, O_HUGE2M },	{ "huge1g", 1, 0, O_HUGE1G },
	{ "holes", 1, 0, O_HOLES },	{ "junk", 0, 0, O_JUNK },
	{ "ad-bits", 0, 0, O_AD },	{ "compress", 1, 0, O_COMPRESS },
	{ "zero", 1, 0, O_ZERO },	{ "untouched", 1, 0, O_UNTOUCHED },
	{ "write", 1, 0, O_WRITE },	{ "pattern", 1, 0, O_PATTERN },
	{ "trace", 1, 0, O_TRACE },	{ "record", 1, 0, O_RECORD },
	{ "loop", 0, 0, O_LOOP },	{ "seed", 1, 0, O_SEED },
	{ "tlb", 1, 0, O_TLB },		{ "accesses", 1, 0, O_ACCESSES },
	{ "seconds", 1, 0, O_SECONDS },	{ "child", 0, 0, O_CHILD },
	{ "out", 1, 0, O_OUT },		{ "codec", 1, 0, O_CODEC },
	{ "mem-file", 1, 0, O_MEM_FILE }, { "mem-offset", 1, 0, O_MEM_OFFSET },
	{ "control", 1, 0, O_CONTROL },	{ "anon", 0, 0, O_ANON },
	{ "help", 0, 0, O_HELP },	{ "version", 0, 0, O_VERSION },
	{ 0 },
};

static const char *const cmd_names[] = { "run", "save", "clone" };

/* MiB as a plain number (as always), or a size with a K, M or G suffix. */
static int parse_mib(const char *s, uint64_t *v)
{
	size_t n = strlen(s);

	if (n && s[n - 1] >= '0' && s[n - 1] <= '9') {
		if (halite_parse_u64(s, v) || *v > (UINT64_MAX >> 20))
			return -1;
		*v <<= 20;
		return 0;
	}
	return halite_parse_size(s, v) ? -1 : 0;
}

/* A number in [min, max]. */
static int parse_uint(const char *s, unsigned min, unsigned max, unsigned *v)
{
	uint64_t x;

	if (halite_parse_u64_range(s, min, max, &x))
		return -1;
	*v = (unsigned)x;
	return 0;
}

/* "halite-synth: CMD: ..." and the pointer at --help, on stderr; -1. */
static int bad(enum hs_cmd cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, HS_PROG ": %s: ", cmd_names[cmd]);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (" HS_PROG " %s --help)\n", cmd_names[cmd]);
	return -1;
}

/* synth_normalize_opts()'s one complaint, kept for the usage error. */
static void keep_msg(void *ctx, int level, const char *msg)
{
	static const char pfx[] = "synth: invalid options: ";

	(void)level;
	if (!strncmp(msg, pfx, sizeof(pfx) - 1))
		msg += sizeof(pfx) - 1;
	snprintf(ctx, 256, "%s", msg);
}

/* What each option takes, as the help says it (and synth_normalize_opts checks). */
static const char *want_of(int c)
{
	switch (c) {
	case O_MEM: return "MiB (or K, M, G), a multiple of 2 MiB from 4 MiB to 1 TiB";
	case O_VCPUS: return "1 to 16";
	case O_WS: case O_MAP: return "MiB (or K, M, G), a multiple of 4 KiB";
	case O_BACKING: return "anon or shared";
	case O_LEVELS: return "4 or 5";
	case O_STRIDE: return "1 to 1048576";
	case O_HOLES: return "0 (none) or 2 and up";
	case O_COMPRESS: case O_ZERO: case O_UNTOUCHED: case O_WRITE: return "percent, 0 to 100";
	case O_PATTERN: return "seq, random or trace (trace: run only)";
	case O_TLB: return "0 to 1048576";
	case O_SECONDS: return "seconds, 0 to 86400";
	case O_CODEC: return "lz4, zlib or zstd";
	case O_MEM_OFFSET: return "bytes, a multiple of 4096";
	default: return "a number";
	}
}

int hs_parse(int argc, char **argv, enum hs_cmd cmd, struct hs_args *a)
{
	struct synth_opts norm;
	char msg[256] = "";
	const char *name;
	int c, ret = 0;

	*a = (struct hs_args){ .o = { .sz = sizeof(struct synth_opts) } };
	a->o.log_fn = halite_log_stderr;
	a->seconds = cmd == HS_CMD_SAVE ? 1 : 5;
	optind = 0; /* glibc: a full reset, so the tests can parse again */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
		const char *v = optarg;
		uint64_t x;

		if (c == 'h')
			c = O_HELP;
		if (c == '?' || c == ':') {
			char cmdname[32];

			snprintf(cmdname, sizeof(cmdname), HS_PROG " %s", cmd_names[cmd]);
			halite_cli_opt_error(msg, sizeof(msg), c, argc, argv, cmdname);
			fprintf(stderr, HS_PROG ": %s: %s\n", cmd_names[cmd], msg);
			return -1;
		}
		name = long_opts[c - O_MEM].name;
		if (!(opt_cmds[c - O_MEM] & (1u << cmd)))
			return bad(cmd, "--%s is not an option of %s", name, cmd_names[cmd]);
		switch (c) {
		case O_HELP: hs_usage(stdout); return 1;
		case O_VERSION: halite_cli_version(HS_PROG); return 1;
		case O_MEM:
			ret = parse_mib(v, &a->o.mem_bytes);
			if (!ret && (a->o.mem_bytes % (2u << 20) || a->o.mem_bytes < (4u << 20) ||
				     a->o.mem_bytes > (1ull << 40)))
				ret = -1;
			break;
		case O_VCPUS: ret = parse_uint(v, 1, SYNTH_MAX_VCPUS, &a->o.nvcpus); break;
		case O_WS:
			ret = parse_mib(v, &a->o.ws_bytes);
			ret = ret || a->o.ws_bytes % 4096 ? -1 : 0;
			break;
		case O_MAP:
			ret = parse_mib(v, &a->o.map_bytes);
			ret = ret || a->o.map_bytes % 4096 ? -1 : 0;
			break;
		case O_BACKING:
			if (!strcmp(v, "anon"))
				a->o.backing = SYNTH_MEM_ANON;
			else if (!strcmp(v, "shared"))
				a->o.backing = SYNTH_MEM_SHARED;
			else
				ret = -1;
			break;
		case O_LEVELS:
			ret = parse_uint(v, 4, 5, &a->o.paging_levels);
			break;
		case O_STRIDE: ret = parse_uint(v, 1, 1u << 20, &a->o.stride); break;
		case O_SHARED_AS: a->o.flags |= SYNTH_F_SHARED_AS; break;
		case O_HUGE2M: ret = parse_uint(v, 0, UINT32_MAX, &a->o.huge_2m); break;
		case O_HUGE1G: ret = parse_uint(v, 0, UINT32_MAX, &a->o.huge_1g); break;
		case O_HOLES:
			ret = parse_uint(v, 0, UINT32_MAX, &a->o.hole_every);
			ret = ret || a->o.hole_every == 1 ? -1 : 0;
			break;
		case O_JUNK: a->o.flags |= SYNTH_F_NP_JUNK; break;
		case O_AD: a->o.flags |= SYNTH_F_AD_BITS; break;
		case O_COMPRESS: ret = parse_uint(v, 0, 100, &a->o.compress_pct); break;
		case O_ZERO: ret = parse_uint(v, 0, 100, &a->o.zero_pct); break;
		case O_UNTOUCHED: ret = parse_uint(v, 0, 100, &a->o.untouched_pct); break;
		case O_WRITE: ret = parse_uint(v, 0, 100, &a->o.write_pct); break;
		case O_PATTERN:
			if (!strcmp(v, "seq"))
				a->o.pattern = SYNTH_PAT_SEQ;
			else if (!strcmp(v, "random"))
				a->o.pattern = SYNTH_PAT_RANDOM;
			else if (!strcmp(v, "trace") && cmd == HS_CMD_RUN)
				a->o.pattern = SYNTH_PAT_TRACE;
			else
				ret = -1;
			break;
		case O_TRACE: a->o.trace_in = v; a->o.pattern = SYNTH_PAT_TRACE; break;
		case O_RECORD: a->o.trace_out = v; break;
		case O_LOOP: a->o.flags |= SYNTH_F_TRACE_LOOP; break;
		case O_SEED: ret = halite_parse_u64(v, &a->o.seed); break;
		case O_TLB: ret = parse_uint(v, 0, 1u << 20, &a->o.tlb_entries); break;
		case O_ACCESSES: ret = halite_parse_u64(v, &a->o.max_accesses); break;
		case O_SECONDS:
			ret = halite_parse_u64(v, &a->seconds) || a->seconds > 86400 ? -1 : 0;
			a->seconds_set = true;
			break;
		case O_CHILD: a->o.flags |= SYNTH_F_CHILD; break;
		case O_OUT: a->out = v; break;
		case O_CODEC:
			a->codec = halite_codec_parse(v);
			if (a->codec < 0 || a->codec == HALITE_CODEC_NONE)
				ret = -1;
			break;
		case O_MEM_FILE: a->mem_file = v; break;
		case O_MEM_OFFSET:
			ret = halite_parse_u64(v, &x) || x % 4096 ? -1 : 0;
			a->mem_offset = x;
			break;
		case O_CONTROL: a->control = v; break;
		case O_ANON: a->anon = true; break;
		}
		if (ret)
			return bad(cmd, "--%s '%s': want %s", name, v, want_of(c));
	}
	if (optind != argc)
		return bad(cmd, "unexpected argument '%s'", argv[optind]);
	/* run always let --accesses win; save says so. */
	if (cmd == HS_CMD_SAVE && a->seconds_set && a->o.max_accesses)
		return bad(cmd, "--accesses and --seconds: one or the other");
	/* What only the options together decide (a working set larger than memory, ...). */
	a->o.log_fn = keep_msg;
	a->o.log_ctx = msg;
	ret = synth_normalize_opts(&norm, &a->o);
	a->o.log_fn = halite_log_stderr;
	a->o.log_ctx = NULL;
	if (ret)
		return bad(cmd, "the guest options do not fit together: %s",
			   msg[0] ? msg : "invalid");
	return 0;
}

/* A size in MiB when it is whole MiB, else in KiB (guest sizes are 4 KiB multiples). */
static int put_size(char *buf, size_t len, uint64_t bytes)
{
	if (bytes % (1u << 20) == 0)
		return snprintf(buf, len, "%llu", (unsigned long long)(bytes >> 20));
	return snprintf(buf, len, "%lluK", (unsigned long long)(bytes >> 10));
}

int hs_synth_args(const struct synth_opts *in, char *buf, size_t len)
{
	struct synth_opts o;
	char mem[32], ws[32], map[32];
	int n;

	/* The defaults resolved as synth_create() resolves them: the record
	 * stands alone, whatever later versions pick as defaults. */
	if (synth_normalize_opts(&o, in))
		return -EINVAL;
	put_size(mem, sizeof(mem), o.mem_bytes);
	put_size(ws, sizeof(ws), o.ws_bytes);
	put_size(map, sizeof(map), o.map_bytes);
	n = snprintf(buf, len,
		     "--mem %s --vcpus %u --levels %u --stride %u%s --huge2m %u --huge1g %u "
		     "--holes %u%s%s --compress %u --zero %u --untouched %u --map %s --ws %s "
		     "--seed %llu",
		     mem, o.nvcpus, o.paging_levels, o.stride,
		     o.flags & SYNTH_F_SHARED_AS ? " --shared-as" : "", o.huge_2m, o.huge_1g,
		     o.hole_every, o.flags & SYNTH_F_NP_JUNK ? " --junk" : "",
		     o.flags & SYNTH_F_AD_BITS ? " --ad-bits" : "", o.compress_pct, o.zero_pct,
		     o.untouched_pct, map, ws, (unsigned long long)o.seed);
	return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
}

char **hs_split_args(const char *name, const char *s, int *argc)
{
	size_t n = strlen(s), words = 1;
	char **argv, *copy;
	int k = 0;

	for (size_t i = 0; i < n; i++)
		words += s[i] == ' ';
	/* The pointers, then the copy of the words they point into. */
	argv = malloc((words + 2) * sizeof(char *) + n + 1);
	if (!argv)
		return NULL;
	copy = (char *)(argv + words + 2);
	memcpy(copy, s, n + 1);
	argv[k++] = (char *)name;
	for (char *sp, *tok = strtok_r(copy, " ", &sp); tok; tok = strtok_r(NULL, " ", &sp))
		argv[k++] = tok;
	argv[k] = NULL;
	*argc = k;
	return argv;
}
