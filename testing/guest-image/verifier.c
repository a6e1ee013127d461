// SPDX-License-Identifier: MIT
/*
 * verifier: the test guest's workload. Fills N MiB with data derived from a
 * seed, then loops for ever re-reading it: each 1 MiB chunk's checksum is
 * recomputed and compared with the one computed when the chunk was written.
 * Now and then a chunk is rewritten with new known data (its generation goes
 * up), so memory keeps changing while a snapshot is taken.
 *
 * Every second it prints to the console
 *   verifier: pass N ok, uptime S, digest HEX
 * (N = complete passes over the region, S = CLOCK_BOOTTIME seconds, HEX = the
 * digest of the region: a hash of every chunk's expected checksum, so it is a
 * function of the region's whole content), and on a bad chunk
 *   verifier: MISMATCH chunk K ...
 * followed by what the first bad page holds (zero, a stale generation, another
 * page's data, a few bad words, foreign bytes); a chunk that stays bad is
 * reported once, not on every pass. Once a mismatch is seen the status says
 * FAILED for good.
 *
 * Files (for busybox httpd, written whole and renamed into place):
 *   WWW/status      the last status line, then key value lines
 *   WWW/digest      "pass N digest HEX uptime S" after every pass
 *   WWW/digest-now  written on SIGUSR1: the digest recomputed by reading the
 *                   whole region at that moment, with the request sequence
 *   WWW/verifier.pid
 * SIGUSR2 toggles rewriting (frozen memory gives a digest that stays put);
 * SIGTERM/SIGINT end it with a last status line.
 *
 * Parameters, from /proc/cmdline as verifier.KEY=VALUE, overridden by
 * arguments KEY=VALUE (so it also runs on a host):
 *   mib=64          region size in MiB
 *   seed=1          data seed
 *   fill=50         percent of each page that is random (the rest is a
 *                   constant per page, so the data compresses about 2x)
 *   rewrite_ms=250  rewrite one chunk every so many ms (0: never)
 *   www=/www        directory for the files above ("" or -: none)
 *   console=/dev/ttyS0   where lines go ("-": stdout)
 *   seconds=0       stop after so many seconds (0: run for ever); exit 0
 *                   when no mismatch was seen, 1 otherwise
 *   corrupt=-1      test hook: after the first pass, zero page 3 of chunk K
 *                   and flip a bit in its page 5 (the next pass must say so)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)
#define PAGE 4096u
#define WORDS_PER_PAGE (PAGE / 8)
#define PAGES_PER_CHUNK (CHUNK / PAGE)
#define MAGIC 0x4854ull	/* "HT" in the top 16 bits of each page's first word */
#define MAX_MISMATCH_LINES 8	/* per pass */

static struct {
	unsigned long mib;
	uint64_t seed;
	unsigned fill;
	unsigned long rewrite_ms;
	char www[256];
	char console[256];
	unsigned long seconds;
	long corrupt;
} opt = { 64, 1, 50, 250, "/www", "/dev/ttyS0", 0, -1 };

static int out_fd = 1;
static volatile sig_atomic_t want_digest, want_toggle, want_stop;

static uint64_t *mem;		/* the region */
static uint64_t *expected;	/* per chunk: checksum when written */
static uint32_t *gen;		/* per chunk: generation of its data */
static uint64_t *reported;	/* per chunk: the bad checksum last reported */
static unsigned long nchunks;

static uint64_t passes, mismatches, rewrites, digest_requests;
static int frozen;

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t page_seed(unsigned long chunk, uint32_t g, unsigned page)
{
	return mix64(opt.seed ^ mix64(((uint64_t)chunk << 32) ^ ((uint64_t)g << 12) ^ page) ^
		     0x9e3779b97f4a7c15ull);
}

static uint64_t page_tag(unsigned long chunk, uint32_t g, unsigned page)
{
	uint64_t idx = (uint64_t)chunk * PAGES_PER_CHUNK + page;
	return (MAGIC << 48) | ((uint64_t)(g & 0xffffff) << 24) | (idx & 0xffffff);
}

/* The known content of one page: tag, random words, constant tail. */
static void gen_page(uint64_t *w, unsigned long chunk, uint32_t g, unsigned page)
{
	uint64_t s = page_seed(chunk, g, page);
	unsigned nrand = opt.fill * WORDS_PER_PAGE / 100;
	uint64_t tail = s ^ 0x5555aaaa5555aaaaull;

	w[0] = page_tag(chunk, g, page);
	for (unsigned i = 1; i < WORDS_PER_PAGE; i++) {
		if (i < nrand) {
			s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
			w[i] = s * 0x2545f4914f6cdd1dull;
		} else {
			w[i] = tail;
		}
	}
}

static uint64_t checksum(const uint64_t *w, unsigned long chunk)
{
	uint64_t h = 0x243f6a8885a308d3ull ^ chunk;
	for (size_t i = 0; i < CHUNK / 8; i++)
		h = rotl(h ^ (w[i] * 0x9e3779b97f4a7c15ull), 27) * 0xc2b2ae3d27d4eb4full;
	return mix64(h);
}

static uint64_t *chunk_ptr(unsigned long k) { return mem + (size_t)k * (CHUNK / 8); }

static void write_chunk(unsigned long k, uint32_t g)
{
	uint64_t *c = chunk_ptr(k);
	for (unsigned p = 0; p < PAGES_PER_CHUNK; p++)
		gen_page(c + (size_t)p * WORDS_PER_PAGE, k, g, p);
	gen[k] = g;
	expected[k] = checksum(c, k);
	reported[k] = expected[k];
}

/* The region's digest: its content as the checksums say it must be. */
static uint64_t digest_of(const uint64_t *sums)
{
	uint64_t d = mix64(opt.mib ^ 0x6469676573740000ull);
	for (unsigned long k = 0; k < nchunks; k++)
		d = mix64(d ^ sums[k]) + k;
	return d;
}

static double now_s(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void say(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n > sizeof buf - 2)
		n = sizeof buf - 2;
	buf[n++] = '\n';
	for (int off = 0; off < n;) {
		ssize_t w = write(out_fd, buf + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		off += (int)w;
	}
}

/* Write WWW/name whole, then rename it into place, so httpd never serves half. */
static void put_file(const char *name, const char *text)
{
	if (!opt.www[0])
		return;
	char path[300], tmp[310];
	snprintf(path, sizeof path, "%s/%s", opt.www, name);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	size_t len = strlen(text);
	ssize_t w = write(fd, text, len);
	close(fd);
	if (w == (ssize_t)len)
		rename(tmp, path);
	else
		unlink(tmp);
}

static void status(void)
{
	char line[200], text[1024];
	double up = now_s(CLOCK_BOOTTIME);
	uint64_t d = digest_of(expected);

	if (mismatches == 0)
		snprintf(line, sizeof line, "verifier: pass %" PRIu64 " ok, uptime %.1f, digest %016" PRIx64,
			 passes, up, d);
	else
		snprintf(line, sizeof line,
			 "verifier: pass %" PRIu64 " FAILED (%" PRIu64 " mismatches), uptime %.1f, digest %016" PRIx64,
			 passes, mismatches, up, d);
	say("%s", line);
	snprintf(text, sizeof text,
		 "%s\nok %d\npasses %" PRIu64 "\nmismatches %" PRIu64 "\nuptime %.3f\ndigest %016" PRIx64
		 "\nmib %lu\nseed %" PRIu64 "\nfill %u\nrewrite_ms %lu\nrewrites %" PRIu64 "\nfrozen %d\n",
		 line, mismatches == 0, passes, mismatches, up, d, opt.mib, opt.seed, opt.fill,
		 opt.rewrite_ms, rewrites, frozen);
	put_file("status", text);
}

/* What a bad chunk holds, page by page, against regenerated data. */
static void diagnose(unsigned long k, uint64_t got)
{
	static uint64_t want[WORDS_PER_PAGE];
	const uint64_t *c = chunk_ptr(k);
	unsigned bad = 0, zero = 0, first = PAGES_PER_CHUNK;
	char what[160] = "no page differs (checksum table damaged?)";

	for (unsigned p = 0; p < PAGES_PER_CHUNK; p++) {
		const uint64_t *pg = c + (size_t)p * WORDS_PER_PAGE;
		gen_page(want, k, gen[k], p);
		if (memcmp(pg, want, PAGE) == 0)
			continue;
		bad++;
		int allzero = 1;
		for (unsigned i = 0; i < WORDS_PER_PAGE && allzero; i++)
			allzero = pg[i] == 0;
		zero += (unsigned)allzero;
		if (first != PAGES_PER_CHUNK)
			continue;
		first = p;
		unsigned off = 0;
		while (off < WORDS_PER_PAGE && pg[off] == want[off])
			off++;
		uint64_t t = pg[0];
		if (allzero)
			snprintf(what, sizeof what, "page %u is all zero", p);
		else if (t == want[0])
			snprintf(what, sizeof what, "page %u differs from word %u: %016" PRIx64 " want %016" PRIx64,
				 p, off, pg[off], want[off]);
		else if (t >> 48 == MAGIC && (t & 0xffffff) == (page_tag(k, 0, p) & 0xffffff))
			snprintf(what, sizeof what, "page %u holds generation %" PRIu64 " (want %u), first bad word %u",
				 p, (t >> 24) & 0xffffff, gen[k] & 0xffffff, off);
		else if (t >> 48 == MAGIC)
			snprintf(what, sizeof what, "page %u holds region page %" PRIu64 " generation %" PRIu64
				 " (want page %lu), first bad word %u", p, t & 0xffffff, (t >> 24) & 0xffffff,
				 k * PAGES_PER_CHUNK + p, off);
		else
			snprintf(what, sizeof what, "page %u is foreign from word %u: %016" PRIx64 " want %016" PRIx64,
				 p, off, pg[off], want[off]);
	}
	say("verifier: MISMATCH chunk %lu (pass %" PRIu64 ", generation %u): checksum %016" PRIx64
	    " want %016" PRIx64 "; %u bad pages (%u zero); first: %s",
	    k, passes, gen[k], got, expected[k], bad, zero, what);
}

static void digest_now(void)
{
	char text[300];
	uint64_t *sums = malloc(nchunks * sizeof *sums);
	unsigned long bad = 0;

	if (!sums)
		return;
	digest_requests++;
	for (unsigned long k = 0; k < nchunks; k++) {
		sums[k] = checksum(chunk_ptr(k), k);
		bad += sums[k] != expected[k];
	}
	uint64_t d = digest_of(sums);
	double up = now_s(CLOCK_BOOTTIME);
	say("verifier: digest %016" PRIx64 " (on demand #%" PRIu64 ", pass %" PRIu64 ", uptime %.1f, %s)",
	    d, digest_requests, passes, up, bad ? "DIFFERS from expected" : "as expected");
	snprintf(text, sizeof text,
		 "seq %" PRIu64 " pass %" PRIu64 " digest %016" PRIx64 " uptime %.3f %s\n",
		 digest_requests, passes, d, up, bad ? "differs" : "expected");
	put_file("digest-now", text);
	free(sums);
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		want_digest = 1;
	else if (sig == SIGUSR2)
		want_toggle = 1;
	else
		want_stop = 1;
}

static int set_opt(const char *kv)
{
	const char *eq = strchr(kv, '=');
	if (!eq)
		return -1;
	size_t kl = (size_t)(eq - kv);
	const char *v = eq + 1;
	char *end;
#define KEY(s) (kl == sizeof(s) - 1 && memcmp(kv, s, kl) == 0)
	if (KEY("www") || KEY("console")) {
		char *dst = KEY("www") ? opt.www : opt.console;
		if (strlen(v) >= sizeof opt.www)
			return -1;
		strcpy(dst, strcmp(v, "-") == 0 && KEY("www") ? "" : v);
		return 0;
	}
	errno = 0;
	long long n = strtoll(v, &end, 0);
	if (errno || end == v || *end)
		return -1;
	if (KEY("mib") && n > 0 && n <= 65536)
		opt.mib = (unsigned long)n;
	else if (KEY("seed"))
		opt.seed = (uint64_t)n;
	else if (KEY("fill") && n >= 0 && n <= 100)
		opt.fill = (unsigned)n;
	else if (KEY("rewrite_ms") && n >= 0)
		opt.rewrite_ms = (unsigned long)n;
	else if (KEY("seconds") && n >= 0)
		opt.seconds = (unsigned long)n;
	else if (KEY("corrupt"))
		opt.corrupt = (long)n;
	else
		return -1;
#undef KEY
	return 0;
}

static void read_cmdline(void)
{
	char buf[4096];
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = 0;
	for (char *save, *tok = strtok_r(buf, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
		if (strncmp(tok, "verifier.", 9) == 0 && set_opt(tok + 9) != 0)
			fprintf(stderr, "verifier: ignoring bad kernel parameter %s\n", tok);
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--help") == 0) {
		puts("usage: verifier [mib=N] [seed=N] [fill=PCT] [rewrite_ms=N] [www=DIR|-] "
		     "[console=DEV|-] [seconds=N] [corrupt=K]\n"
		     "(defaults from /proc/cmdline verifier.KEY=VALUE)");
		return 0;
	}
	read_cmdline();
	for (int i = 1; i < argc; i++)
		if (set_opt(argv[i]) != 0) {
			fprintf(stderr, "verifier: bad argument '%s' (see --help)\n", argv[i]);
			return 2;
		}
	if (strcmp(opt.console, "-") != 0) {
		int fd = open(opt.console, O_WRONLY | O_NOCTTY | O_CLOEXEC);
		if (fd >= 0)
			out_fd = fd;
		else
			fprintf(stderr, "verifier: %s: %s; writing to stdout\n", opt.console, strerror(errno));
	}

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	nchunks = opt.mib;
	mem = mmap(NULL, (size_t)nchunks * CHUNK, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	expected = calloc(nchunks, sizeof *expected);
	gen = calloc(nchunks, sizeof *gen);
	reported = calloc(nchunks, sizeof *reported);
	if (mem == MAP_FAILED || !expected || !gen || !reported) {
		say("verifier: cannot allocate %lu MiB: %s", opt.mib, strerror(errno));
		return 1;
	}
	if (opt.www[0]) {
		char pid[32];
		snprintf(pid, sizeof pid, "%d\n", (int)getpid());
		put_file("verifier.pid", pid);
	}

	double t0 = now_s(CLOCK_MONOTONIC);
	for (unsigned long k = 0; k < nchunks; k++)
		write_chunk(k, 0);
	double t1 = now_s(CLOCK_MONOTONIC);
	say("verifier: filled %lu MiB (seed %" PRIu64 ", fill %u%%, rewrite every %lu ms) in %.2f s, "
	    "uptime %.1f, digest %016" PRIx64,
	    opt.mib, opt.seed, opt.fill, opt.rewrite_ms, t1 - t0, now_s(CLOCK_BOOTTIME),
	    digest_of(expected));
	status();

	uint64_t rng = mix64(opt.seed ^ 0x7265777269746500ull);
	double next_status = t1 + 1.0;
	double next_rewrite = t1 + (double)opt.rewrite_ms / 1000.0;
	double end = opt.seconds ? t0 + (double)opt.seconds : 0;

	for (;;) {
		unsigned lines = 0;
		for (unsigned long k = 0; k < nchunks; k++) {
			uint64_t got = checksum(chunk_ptr(k), k);
			if (got != expected[k] && got != reported[k]) {
				/* A new bad content: reported once, not on every pass. */
				mismatches++;
				reported[k] = got;
				if (lines++ < MAX_MISMATCH_LINES)
					diagnose(k, got);
			}
			double now = now_s(CLOCK_MONOTONIC);
			if (opt.rewrite_ms && !frozen && now >= next_rewrite) {
				rng = mix64(rng + 1);
				unsigned long j = (unsigned long)(rng % nchunks);
				write_chunk(j, gen[j] + 1);
				rewrites++;
				next_rewrite += (double)opt.rewrite_ms / 1000.0;
				if (next_rewrite < now)
					next_rewrite = now + (double)opt.rewrite_ms / 1000.0;
			}
			if (want_toggle) {
				want_toggle = 0;
				frozen = !frozen;
				say("verifier: rewrites %s (pass %" PRIu64 ", digest %016" PRIx64 ")",
				    frozen ? "frozen" : "resumed", passes, digest_of(expected));
				next_rewrite = now + (double)opt.rewrite_ms / 1000.0;
				status();
			}
			if (want_digest) {
				want_digest = 0;
				digest_now();
			}
			if (now >= next_status) {
				status();
				next_status += 1.0;
				if (next_status < now)
					next_status = now + 1.0;
			}
			if (want_stop || (end && now >= end)) {
				status();
				say("verifier: stopped after %" PRIu64 " passes, %" PRIu64 " mismatches",
				    passes, mismatches);
				return mismatches ? 1 : 0;
			}
		}
		passes++;
		if (lines > MAX_MISMATCH_LINES)
			say("verifier: MISMATCH ... %u more chunks bad in pass %" PRIu64,
			    lines - MAX_MISMATCH_LINES, passes);
		char text[160];
		snprintf(text, sizeof text, "pass %" PRIu64 " digest %016" PRIx64 " uptime %.3f\n",
			 passes, digest_of(expected), now_s(CLOCK_BOOTTIME));
		put_file("digest", text);
		if (opt.corrupt >= 0 && passes == 1 && (unsigned long)opt.corrupt < nchunks) {
			uint64_t *c = chunk_ptr((unsigned long)opt.corrupt);
			memset(c + 3 * WORDS_PER_PAGE, 0, PAGE);
			c[5 * WORDS_PER_PAGE + 7] ^= 0x10;
			say("verifier: test hook: zeroed page 3 and flipped a bit in page 5 of chunk %ld",
			    opt.corrupt);
		}
	}
}
