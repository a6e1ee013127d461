// SPDX-License-Identifier: MIT
/*
 * halite-qemu's ptrace injection (halite/qemu/inject.c) against a
 * child built to look like QEMU where it matters: several threads, each
 * stopped somewhere else (main thread blocked in read() on a pipe, one in a
 * nanosleep loop, one in ppoll() with a signal mask, one spinning in user
 * code, one in a raw read() with known values in its callee-saved, vector
 * and MXCSR registers, one with AMX tile state around a raw read() where
 * the CPU has AMX, one under a seccomp filter), and guest RAM as a
 * MAP_SHARED memfd mapping it has written. The checks, in order:
 *  1. injected getpid()/gettid() return the right ids, in every thread;
 *  2. an injected userfaultfd() comes here through pidfd_getfd, UFFDIO_API
 *     works on it, and MINOR registration of the child's mapping from here
 *     acts on the child's address space;
 *  3. injected madvise(MADV_DONTNEED) empties the child's mapping (Rss 0)
 *     while the memfd keeps its data;
 *  4. injected close() closes, and reports -EBADF for a bad descriptor;
 *     a signal sent during a session arrives afterwards with its siginfo;
 *     a tracer killed with a session open leaves the child clean;
 *  4d. a tracer killed during a call, in every thread: by SIGKILL while the
 *     injected call (a read nobody feeds yet) blocks, and at each fault
 *     point of inject.c (call armed, entry stop, just resumed from it, exit
 *     stop, parked after it): the thread is let go untraced, finishes the
 *     call, and comes back by itself to its own call (restarted, no EINTR),
 *     mask, general, vector and MXCSR registers;
 *  4e. a call a seccomp filter of the thread traps (SECCOMP_RET_TRAP) fails
 *     with -EPERM, the thread never sees the SIGSYS, the session goes on;
 *  5. the child is intact: read() restarted and answers, the sleeper sleeps
 *     on, ppoll's mask is right, no EINTR, no stray signal, registers kept,
 *     and it exits 0;
 *  6. errors: no such process, no such thread.
 * Exit 0 pass, 1 fail, 77 skip (no ptrace, userfaultfd or MINOR_SHMEM).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <cpuid.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"

#define MAP_LEN (64 * 4096ul)
#define SYS_NR_READ 0
#define SYS_NR_CLOCK_NANOSLEEP 230 /* glibc's nanosleep() */
#define SYS_NR_PPOLL 271
#define SPINNING (-1L) /* in_syscall(): running in user code */

/* Shared with the child (MAP_SHARED, made before fork). */
struct shared {
	_Atomic int sleeper_tid, ppoller_tid, spinner_tid;
	_Atomic int stop_spin, stop_threads;
	_Atomic uint64_t sleeps, spins;
	_Atomic int eintr;	   /* a call returned EINTR: a restart did not happen */
	_Atomic int stray;	   /* a handler of SIGTRAP, SIGSEGV, SIGSYS or SIGUSR2 ran */
	_Atomic int regs_bad;	   /* the spinner's two register copies disagreed */
	_Atomic int ppoll_mask_bad; /* ppoll left the thread with its own mask, not ours */
	_Atomic int ppoll_wakeups;
	_Atomic int usr1;
	_Atomic int bad;
	_Atomic int vector_tid;
	_Atomic int tiles_tid;	   /* 0: no AMX here */
	_Atomic uint64_t tiles_rounds;
	_Atomic int sandbox_tid;   /* its seccomp filter traps getppid(); -errno if none */
	_Atomic int sandbox_rounds;
	_Atomic uint64_t vector_rounds; /* raw reads the vector thread has checked */
	_Atomic int vector_bad;	   /* a register differed after its raw read() */
	int usr1_code, usr1_pid;
	uint64_t map_addr;
	char why[200];
	char scratch[64];	   /* where injected reads land (same address in the child) */
};

static struct shared *sh;
static pid_t child;
static int injp[2];	/* injected read()s in the child wait on injp[0]; we feed injp[1] */
static int vecp[2];	/* the vector thread's raw read() waits on vecp[0] */
static int sbxp[2];	/* the sandboxed thread's read() waits on sbxp[0] */
static int amxp[2];	/* the AMX thread's raw read() waits on amxp[0] */

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stdout, "FAIL: ");
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fprintf(stdout, "\n");
	exit(1); /* the child dies with us (PR_SET_PDEATHSIG) */
}

static void skip(const char *why)
{
	printf("SKIP: %s\n", why);
	exit(77);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
	nanosleep(&(struct timespec){ ms / 1000, (ms % 1000) * 1000000 }, NULL);
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 31 + 7 + i / 4096);
}

/* --- the child --- */

static void child_problem(const char *what)
{
	if (!atomic_fetch_add(&sh->bad, 1))
		snprintf(sh->why, sizeof(sh->why), "%s (errno %d)", what, errno);
}

static void on_usr1(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	sh->usr1_code = si->si_code;
	sh->usr1_pid = si->si_pid;
	atomic_fetch_add(&sh->usr1, 1);
}

static void on_stray(int sig)
{
	(void)sig;
	atomic_fetch_add(&sh->stray, 1);
}

static void *sleeper(void *arg)
{
	(void)arg;
	sh->sleeper_tid = gettid();
	while (!sh->stop_threads) {
		if (nanosleep(&(struct timespec){ 0, 5 * 1000 * 1000 }, NULL)) {
			if (errno == EINTR)
				atomic_fetch_add(&sh->eintr, 1);
			else
				child_problem("nanosleep");
		}
		atomic_fetch_add(&sh->sleeps, 1);
	}
	return NULL;
}

/* Like QEMU's main loop, but ppoll with a mask: SIGUSR2 blocked except inside ppoll. */
static void *ppoller(void *arg)
{
	int fd = (int)(intptr_t)arg;
	sigset_t empty, cur;

	sigemptyset(&empty);
	sh->ppoller_tid = gettid();
	for (;;) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		char c;

		if (ppoll(&pfd, 1, NULL, &empty) < 0) {
			if (errno == EINTR)
				atomic_fetch_add(&sh->eintr, 1);
			else
				child_problem("ppoll");
			continue;
		}
		pthread_sigmask(SIG_BLOCK, NULL, &cur);
		if (!sigismember(&cur, SIGUSR2))
			atomic_fetch_add(&sh->ppoll_mask_bad, 1);
		if (read(fd, &c, 1) != 1) {
			child_problem("read of the poke pipe");
			break;
		}
		if (c == 'q')
			break;
		atomic_fetch_add(&sh->ppoll_wakeups, 1);
	}
	return NULL;
}

/* Two copies of one sequence in registers: a register not put back splits them. */
static void *spinner(void *arg)
{
	uint64_t a = (uint64_t)(uintptr_t)arg, b = a;

	sh->spinner_tid = gettid();
	while (!sh->stop_spin) {
		for (int i = 0; i < 1000; i++) {
			a = a * 6364136223846793005ull + 1442695040888963407ull;
			b = b * 6364136223846793005ull + 1442695040888963407ull;
			__asm__ volatile("" : "+r"(a), "+r"(b));
		}
		if (a != b) {
			atomic_fetch_add(&sh->regs_bad, 1);
			b = a;
		}
		atomic_fetch_add(&sh->spins, 1);
	}
	return NULL;
}

/*
 * The vector thread's raw read(): known values in the registers a syscall
 * must keep (rbx, r12-r15, xmm/ymm0-15, MXCSR) around a `syscall` written
 * here, so that no libc code in between could spill or reload them.
 */
struct vecblk {
	uint8_t in[16][32];	/* 0 */
	uint8_t out[16][32];	/* 512 */
	uint64_t gin[5];	/* 1024: rbx, r12, r13, r14, r15 */
	uint64_t gout[5];	/* 1064 */
	uint32_t mxin, mxout;	/* 1104, 1108 */
	int64_t fd;		/* 1112 */
	uint64_t buf;		/* 1120 */
	int64_t rax;		/* 1128 */
};

_Static_assert(offsetof(struct vecblk, out) == 512 && offsetof(struct vecblk, gin) == 1024 &&
	       offsetof(struct vecblk, gout) == 1064 && offsetof(struct vecblk, mxin) == 1104 &&
	       offsetof(struct vecblk, mxout) == 1108 && offsetof(struct vecblk, fd) == 1112 &&
	       offsetof(struct vecblk, buf) == 1120 && offsetof(struct vecblk, rax) == 1128,
	       "vecblk offsets used by the asm");

#define VREGS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) \
	X(14) X(15)
#define YLOAD(i) "vmovdqu " #i "*32(%%r8), %%ymm" #i "\n\t"
#define YSTORE(i) "vmovdqu %%ymm" #i ", 512+" #i "*32(%%r8)\n\t"
#define XLOAD(i) "movdqu " #i "*32(%%r8), %%xmm" #i "\n\t"
#define XSTORE(i) "movdqu %%xmm" #i ", 512+" #i "*32(%%r8)\n\t"
#define RAW_READ                                                                       \
	"mov 1024(%%r8), %%rbx\n\t"                                                     \
	"mov 1032(%%r8), %%r12\n\t"                                                     \
	"mov 1040(%%r8), %%r13\n\t"                                                     \
	"mov 1048(%%r8), %%r14\n\t"                                                     \
	"mov 1056(%%r8), %%r15\n\t"                                                     \
	"ldmxcsr 1104(%%r8)\n\t"                                                        \
	"xor %%eax, %%eax\n\t"                                                           \
	"mov 1112(%%r8), %%rdi\n\t"                                                     \
	"mov 1120(%%r8), %%rsi\n\t"                                                     \
	"mov $1, %%edx\n\t"                                                              \
	"syscall\n\t"                                                                    \
	"mov %%rax, 1128(%%r8)\n\t"                                                     \
	"stmxcsr 1108(%%r8)\n\t"                                                        \
	"mov %%rbx, 1064(%%r8)\n\t"                                                     \
	"mov %%r12, 1072(%%r8)\n\t"                                                     \
	"mov %%r13, 1080(%%r8)\n\t"                                                     \
	"mov %%r14, 1088(%%r8)\n\t"                                                     \
	"mov %%r15, 1096(%%r8)\n\t"
#define VCLOBBERS                                                                      \
	"rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r11", "r12", "r13", "r14", "r15", "memory", \
	"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",       \
	"xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

static void raw_read(struct vecblk *b, bool avx)
{
	register struct vecblk *p __asm__("r8") = b;
	const uint32_t mxcsr_default = 0x1f80;

	if (avx)
		__asm__ volatile(VREGS(YLOAD) RAW_READ VREGS(YSTORE) "vzeroupper"
				 : : "r"(p) : VCLOBBERS);
	else
		__asm__ volatile(VREGS(XLOAD) RAW_READ VREGS(XSTORE) : : "r"(p) : VCLOBBERS);
	__asm__ volatile("ldmxcsr %0" : : "m"(mxcsr_default));
}

/* Blocked in its raw read() of @arg; each byte read is a round whose registers must hold. */
static void *vector(void *arg)
{
	bool avx = __builtin_cpu_supports("avx");
	size_t width = avx ? 32 : 16;

	sh->vector_tid = gettid();
	for (uint64_t round = 1;; round++) {
		struct vecblk b = { 0 };
		char c = 0;

		for (int i = 0; i < 16; i++)
			for (int j = 0; j < 32; j++)
				b.in[i][j] = (uint8_t)(round * 131 + (uint64_t)i * 17 + (uint64_t)j * 3 + 1);
		for (int k = 0; k < 5; k++)
			b.gin[k] = 0x0123456789abcdefull * (uint64_t)(k + 1) ^ round;
		b.mxin = 0x7f80 | (round & 1) << 15; /* round toward zero; flush-to-zero every other */
		b.fd = (int64_t)(intptr_t)arg;
		b.buf = (uint64_t)(uintptr_t)&c;
		raw_read(&b, avx);
		if (b.rax == 0 || (b.rax == 1 && c == 'q'))
			break;
		if (b.rax != 1) {
			if (b.rax == -EINTR)
				atomic_fetch_add(&sh->eintr, 1);
			else if (!atomic_fetch_add(&sh->bad, 1))
				snprintf(sh->why, sizeof(sh->why), "the vector thread's raw read() "
					 "returned %lld", (long long)b.rax);
			continue;
		}
		for (int i = 0; i < 16; i++)
			if (memcmp(b.in[i], b.out[i], width) &&
			    !atomic_fetch_add(&sh->vector_bad, 1))
				snprintf(sh->why, sizeof(sh->why), "%smm%d changed across a read()",
					 avx ? "y" : "x", i);
		if (memcmp(b.gin, b.gout, sizeof(b.gin)) && !atomic_fetch_add(&sh->vector_bad, 1))
			snprintf(sh->why, sizeof(sh->why), "rbx or r12-r15 changed across a read()");
		if (b.mxin != b.mxout && !atomic_fetch_add(&sh->vector_bad, 1))
			snprintf(sh->why, sizeof(sh->why), "MXCSR 0x%x became 0x%x across a read()",
				 b.mxin, b.mxout);
		sh->vector_rounds = round;
	}
	return NULL;
}

/*
 * AMX: tile data is the one feature a thread's signal frame holds only once
 * it has used it (and asked for it: ARCH_REQ_XCOMP_PERM), so the frame's
 * size differs from the vector thread's. Tile 0 and the tile configuration
 * are loaded around a raw read() and compared after it.
 */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tilecfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} __attribute__((aligned(64)));

static bool amx_usable(void)
{
	unsigned int a, b, c, d;

	/* CPUID.(7,0):EDX[24] AMX-TILE; the kernel says yes to the permission. */
	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) &&
	       !syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

static void *tiles(void *arg)
{
	static struct tilecfg cfg, cfg2;
	static uint8_t in[16 * 64] __attribute__((aligned(64))), out[16 * 64]
		__attribute__((aligned(64)));
	const long stride = 64;

	cfg.palette = 1;
	cfg.colsb[0] = 64;
	cfg.rows[0] = 16;
	sh->tiles_tid = gettid();
	for (uint64_t round = 1;; round++) {
		char c = 0;
		long rax;

		for (size_t i = 0; i < sizeof(in); i++)
			in[i] = (uint8_t)(round * 37 + i * 11 + 5);
		memset(out, 0, sizeof(out));
		__asm__ volatile("ldtilecfg %0" : : "m"(cfg));
		__asm__ volatile("tileloadd (%0,%1,1), %%tmm0" : : "r"(in), "r"(stride) : "memory");
		/*
		 * The registers set right before the syscall: a register variable
		 * holds its value only at the asm that uses it, and a call in
		 * between (memset, a sanitizer's check at -O0) may clobber it.
		 */
		__asm__ volatile("syscall"
				 : "=a"(rax)
				 : "0"((long)SYS_read), "D"((long)(intptr_t)arg), "S"(&c), "d"(1L)
				 : "rcx", "r11", "memory");
		__asm__ volatile("tilestored %%tmm0, (%0,%1,1)" : : "r"(out), "r"(stride) : "memory");
		__asm__ volatile("sttilecfg %0" : "=m"(cfg2));
		__asm__ volatile("tilerelease");
		if (rax == 0 || (rax == 1 && c == 'q'))
			break;
		if (rax != 1) {
			if (rax == -EINTR)
				atomic_fetch_add(&sh->eintr, 1);
			else if (!atomic_fetch_add(&sh->bad, 1))
				snprintf(sh->why, sizeof(sh->why), "the AMX thread's raw read() "
					 "returned %ld", rax);
			continue;
		}
		if ((memcmp(in, out, sizeof(in)) || memcmp(&cfg, &cfg2, sizeof(cfg))) &&
		    !atomic_fetch_add(&sh->vector_bad, 1))
			snprintf(sh->why, sizeof(sh->why), "AMX tile 0 or its configuration changed "
				 "across a read()");
		sh->tiles_rounds = round;
	}
	return NULL;
}

/* A thread whose own seccomp filter traps getppid() (SIGSYS), blocked in read() of @arg. */
static void *sandboxed(void *arg)
{
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(filter) / sizeof(filter[0]), filter };
	char c;

	/* Both act on this thread only (no TSYNC). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		sh->sandbox_tid = -errno;
		return NULL;
	}
	sh->sandbox_tid = gettid();
	for (;;) {
		ssize_t n = read((int)(intptr_t)arg, &c, 1);

		if (n < 0 && errno == EINTR)
			atomic_fetch_add(&sh->eintr, 1);
		else if (n < 0)
			child_problem("read of the sandbox pipe");
		if (n == 0 || (n == 1 && c == 'q'))
			break;
		if (n == 1)
			atomic_fetch_add(&sh->sandbox_rounds, 1);
	}
	return NULL;
}

static void child_main(pid_t parent, int memfd, uint8_t *parent_view, int cmd, int reply,
		       int poke)
{
	struct sigaction sa = { 0 };
	pthread_t t[6];
	bool amx = amx_usable();
	sigset_t usr2;
	uint8_t *map;
	char c;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(3);
	sa.sa_sigaction = on_usr1;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_stray;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTRAP, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGSYS, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &usr2, NULL); /* inherited by the threads */

	/* Our own mapping first, so it cannot land where the parent's view was. */
	map = mmap(NULL, MAP_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (map == MAP_FAILED)
		_exit(4);
	munmap(parent_view, MAP_LEN);
	for (size_t i = 0; i < MAP_LEN; i++)
		map[i] = pattern(i);
	sh->map_addr = (uint64_t)(uintptr_t)map;

	if (pthread_create(&t[0], NULL, sleeper, NULL) ||
	    pthread_create(&t[1], NULL, ppoller, (void *)(intptr_t)poke) ||
	    pthread_create(&t[2], NULL, spinner, (void *)(uintptr_t)0x1234567) ||
	    pthread_create(&t[3], NULL, vector, (void *)(intptr_t)vecp[0]) ||
	    pthread_create(&t[4], NULL, sandboxed, (void *)(intptr_t)sbxp[0]) ||
	    (amx && pthread_create(&t[5], NULL, tiles, (void *)(intptr_t)amxp[0])))
		_exit(5);
	while (!sh->sleeper_tid || !sh->ppoller_tid || !sh->spinner_tid || !sh->vector_tid ||
	       !sh->sandbox_tid || (amx && !sh->tiles_tid))
		sleep_ms(1);
	if (write(reply, "R", 1) != 1)
		_exit(6);

	for (;;) {
		ssize_t n = read(cmd, &c, 1);

		if (n < 0) {
			if (errno == EINTR)
				atomic_fetch_add(&sh->eintr, 1);
			else
				child_problem("read of the command pipe");
			continue;
		}
		if (n == 0)
			_exit(7); /* the parent went away */
		if (c == 'q')
			break;
		c++;
		if (write(reply, &c, 1) != 1)
			child_problem("write of the reply pipe");
	}

	sh->stop_spin = 1;
	sh->stop_threads = 1; /* the parent has sent the ppoll thread its 'q' */
	for (int i = 0; i < (amx ? 6 : 5); i++)
		pthread_join(t[i], NULL);
	if (sigaction(SIGTRAP, NULL, &sa) || sa.sa_handler != on_stray)
		child_problem("SIGTRAP's handler changed");
	_exit(sh->bad || sh->eintr || sh->stray || sh->regs_bad || sh->ppoll_mask_bad ||
	      sh->vector_bad ? 1 : 0);
}

/* --- helpers of the parent --- */

static long inject(pid_t pid, pid_t tid, long nr, long a0, long a1, long a2)
{
	const long args[6] = { a0, a1, a2, 0, 0, 0 };
	struct hq_inject *in;
	char err[512] = "";
	long res = 0;
	int ret;

	if (!tid) {
		ret = hq_inject_one(pid, nr, args, &res, err, sizeof(err));
	} else {
		ret = hq_inject_begin(&in, pid, tid, err, sizeof(err));
		if (!ret) {
			ret = hq_inject_syscall(in, nr, args, &res, err, sizeof(err));
			hq_inject_end(in);
		}
	}
	if (ret == -EPERM && nr == SYS_getpid)
		skip(err);
	if (ret)
		fail("injecting syscall %ld into %d/%d: %d: %s", nr, (int)pid, (int)tid, ret, err);
	return res;
}

/*
 * The system call thread @tid is in (from /proc/PID/task/TID/syscall), its
 * first argument in *@arg0 if not NULL; SPINNING when it runs in user code.
 */
static long syscall_of(pid_t tid, long *arg0)
{
	char path[96], buf[256] = "";
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/syscall", (int)child, (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail("%s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		fail("%s: empty", path);
	if (arg0)
		*arg0 = -1;
	if (buf[0] < '0' || buf[0] > '9')
		return SPINNING;
	if (arg0) {
		char *sp = strchr(buf, ' ');

		*arg0 = sp ? strtol(sp + 1, NULL, 16) : -1;
	}
	return strtol(buf, NULL, 10);
}

static long in_syscall(pid_t tid)
{
	return syscall_of(tid, NULL);
}

static void wait_in_syscall(pid_t tid, long nr, const char *what)
{
	uint64_t end = now_ms() + 5000;

	while (in_syscall(tid) != nr) {
		if (now_ms() > end)
			fail("%s (thread %d) is not blocked in syscall %ld", what, (int)tid, nr);
		sleep_ms(1);
	}
}

/* Field @key ("Rss:") in kB, or VmFlags into @flags, of the child's mapping at @addr. */
static long smaps(uint64_t addr, const char *key, char *flags, size_t flen)
{
	char path[64], line[512];
	bool in_map = false;
	long val = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)child);
	f = fopen(path, "re");
	if (!f)
		fail("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s, e;

		if (sscanf(line, "%llx-%llx ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in_map = s == addr;
			continue;
		}
		if (!in_map)
			continue;
		if (key && !strncmp(line, key, strlen(key)))
			val = strtol(line + strlen(key), NULL, 10);
		if (flags && !strncmp(line, "VmFlags:", 8)) {
			snprintf(flags, flen, "%s", line + 8);
			flags[strcspn(flags, "\n")] = 0;
			val = 0;
		}
	}
	fclose(f);
	if (val < 0)
		fail("no mapping at 0x%" PRIx64 " in %s", addr, path);
	return val;
}

static bool has_vmflag(const char *flags, const char *flag)
{
	char padded[600];

	snprintf(padded, sizeof(padded), " %s ", flags);
	return strstr(padded, flag) != NULL;
}

static bool fd_exists(pid_t pid, long fd)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d/fd/%ld", (int)pid, fd);
	return lstat(path, &st) == 0;
}

static char read_byte(int fd, int timeout_ms, const char *what)
{
	struct pollfd pfd = { fd, POLLIN, 0 };
	char c;

	if (poll(&pfd, 1, timeout_ms) != 1)
		fail("no %s within %d ms", what, timeout_ms);
	if (read(fd, &c, 1) != 1)
		fail("read of %s: %s", what, strerror(errno));
	return c;
}

static void write_byte(int fd, char c)
{
	if (write(fd, &c, 1) != 1)
		fail("write to the child: %s", strerror(errno));
}

/* --- the checks --- */

static void check_ids(void)
{
	struct hq_inject *in;
	const long none[6] = { 0 };
	char err[512];
	long res;
	int ret;
	uint64_t spins;

	res = inject(child, 0, SYS_getpid, 0, 0, 0);
	if (res != child)
		fail("injected getpid() = %ld, child is %d", res, (int)child);
	printf("ok 1a - injected getpid() = %ld, the child's pid\n", res);

	ret = hq_inject_begin(&in, child, 0, err, sizeof(err));
	if (ret)
		fail("hq_inject_begin(child, 0): %d: %s", ret, err);
	ret = hq_inject_syscall(in, SYS_gettid, none, &res, err, sizeof(err));
	if (ret || res != child)
		fail("injected gettid() on tid 0: ret %d, %ld, child %d: %s", ret, res, (int)child,
		     ret ? err : "");
	ret = hq_inject_syscall(in, SYS_getppid, none, &res, err, sizeof(err));
	if (ret || res != getpid())
		fail("second call of the session, getppid(): ret %d, %ld, want %d", ret, res,
		     (int)getpid());
	hq_inject_end(in);
	printf("ok 1b - injected gettid() on tid 0 = %d, the child's pid; a second call "
	       "(getppid) in the same session works\n", (int)child);

	wait_in_syscall(sh->sleeper_tid, SYS_NR_CLOCK_NANOSLEEP, "the nanosleep thread");
	res = inject(child, sh->sleeper_tid, SYS_gettid, 0, 0, 0);
	if (res != sh->sleeper_tid)
		fail("gettid() in the nanosleep thread = %ld, want %d", res, sh->sleeper_tid);
	wait_in_syscall(sh->ppoller_tid, SYS_NR_PPOLL, "the ppoll thread");
	res = inject(child, sh->ppoller_tid, SYS_gettid, 0, 0, 0);
	if (res != sh->ppoller_tid)
		fail("gettid() in the ppoll thread = %ld, want %d", res, sh->ppoller_tid);
	spins = sh->spins;
	if (in_syscall(sh->spinner_tid) != -1)
		fail("the spinner is not running in user code");
	res = inject(child, sh->spinner_tid, SYS_gettid, 0, 0, 0);
	if (res != sh->spinner_tid)
		fail("gettid() in the spinning thread = %ld, want %d", res, sh->spinner_tid);
	for (uint64_t end = now_ms() + 2000; sh->spins < spins + 10; sleep_ms(1))
		if (now_ms() > end)
			fail("the spinner stopped after the injection");
	printf("ok 1c - gettid() in the nanosleep, ppoll and spinning (user code) threads "
	       "returns each one's tid; the spinner spins on\n");
}

static void check_uffd(long *r1, long *r2, int *u1, int *u2)
{
	struct uffdio_api api = { .api = UFFD_API, .features = 0 };
	struct uffdio_register reg = { 0 };
	char err[512], path[64], link[128] = "", flags[512];
	unsigned char vec;
	ssize_t n;
	int fdf;

	*r1 = inject(child, 0, SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK, 0, 0);
	if (*r1 == -EPERM)
		skip("userfaultfd() not allowed in the child (vm.unprivileged_userfaultfd?)");
	if (*r1 < 0)
		fail("injected userfaultfd() = %ld (%s)", *r1, strerror((int)-*r1));
	snprintf(path, sizeof(path), "/proc/%d/fd/%ld", (int)child, *r1);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0 || strcmp(link, "anon_inode:[userfaultfd]"))
		fail("%s is \"%s\", not a userfaultfd", path, link);
	*u1 = hq_fd_from_process(child, (int)*r1, err, sizeof(err));
	if (*u1 < 0)
		fail("hq_fd_from_process(child, %ld): %d: %s", *r1, *u1, err);
	fdf = fcntl(*u1, F_GETFD);
	if (fdf < 0 || !(fdf & FD_CLOEXEC) || !(fcntl(*u1, F_GETFL) & O_NONBLOCK))
		fail("the descriptor brought here lacks FD_CLOEXEC or O_NONBLOCK");
	if (ioctl(*u1, UFFDIO_API, &api))
		fail("UFFDIO_API(features 0) on the child's userfaultfd: %s", strerror(errno));
	printf("ok 2a - injected userfaultfd(O_CLOEXEC|O_NONBLOCK) = %ld in the child, here as "
	       "fd %d (O_CLOEXEC); UFFDIO_API works here (kernel features 0x%llx)\n", *r1, *u1,
	       (unsigned long long)api.features);

	*r2 = inject(child, 0, SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK, 0, 0);
	if (*r2 < 0)
		fail("second injected userfaultfd() = %ld", *r2);
	*u2 = hq_fd_from_process(child, (int)*r2, err, sizeof(err));
	if (*u2 < 0)
		fail("hq_fd_from_process(child, %ld): %s", *r2, err);
	api = (struct uffdio_api){ .api = UFFD_API, .features = UFFD_FEATURE_MINOR_SHMEM };
	if (ioctl(*u2, UFFDIO_API, &api)) {
		if (errno == EINVAL)
			skip("the kernel has no UFFD_FEATURE_MINOR_SHMEM");
		fail("UFFDIO_API(MINOR_SHMEM): %s", strerror(errno));
	}
	/* Unmapped here: a registration that worked can only have been on the child. */
	if (mincore((void *)(uintptr_t)sh->map_addr, 4096, &vec) == 0 || errno != ENOMEM)
		fail("the child's mapping address 0x%" PRIx64 " is mapped here too", sh->map_addr);
	reg.range.start = sh->map_addr;
	reg.range.len = MAP_LEN;
	reg.mode = UFFDIO_REGISTER_MODE_MINOR;
	if (ioctl(*u2, UFFDIO_REGISTER, &reg))
		fail("UFFDIO_REGISTER(MINOR) of the child's mapping from here: %s", strerror(errno));
	if (!(reg.ioctls & (1ull << _UFFDIO_CONTINUE)))
		fail("registered, but UFFDIO_CONTINUE not offered (ioctls 0x%llx)",
		     (unsigned long long)reg.ioctls);
	smaps(sh->map_addr, NULL, flags, sizeof(flags));
	if (!has_vmflag(flags, " ui "))
		fail("the child's mapping is not minor-registered (VmFlags:%s)", flags);
	printf("ok 2b - a fresh injected userfaultfd with MINOR_SHMEM registers the child's "
	       "shared mapping 0x%" PRIx64 "+%lu from here (unmapped here; the child's VmFlags "
	       "now has \"ui\")\n", sh->map_addr, MAP_LEN);
}

static void check_madvise(const uint8_t *view, int u2)
{
	struct uffdio_range range = { sh->map_addr, MAP_LEN };
	long before, after, res;

	before = smaps(sh->map_addr, "Rss:", NULL, 0);
	if (before != (long)(MAP_LEN / 1024))
		fail("the child's mapping has Rss %ld kB before madvise, want %lu", before,
		     MAP_LEN / 1024);
	res = inject(child, 0, SYS_madvise, (long)sh->map_addr, (long)MAP_LEN, MADV_DONTNEED);
	if (res != 0)
		fail("injected madvise(DONTNEED) = %ld (%s)", res, strerror((int)-res));
	after = smaps(sh->map_addr, "Rss:", NULL, 0);
	if (after != 0)
		fail("the child's mapping has Rss %ld kB after madvise, want 0", after);
	for (size_t i = 0; i < MAP_LEN; i++)
		if (view[i] != pattern(i))
			fail("memfd byte %zu is 0x%02x after madvise, want 0x%02x", i, view[i],
			     pattern(i));
	printf("ok 3 - injected madvise(0x%" PRIx64 ", %lu, MADV_DONTNEED) = 0; the child's Rss "
	       "for it %ld kB -> %ld kB; the memfd's %lu bytes intact\n", sh->map_addr, MAP_LEN,
	       before, after, MAP_LEN);
	/* Nothing may fault on it later with nobody serving. */
	if (ioctl(u2, UFFDIO_UNREGISTER, &range))
		fail("UFFDIO_UNREGISTER: %s", strerror(errno));
}

static void check_close(long r1, long r2, int u1, int u2)
{
	long res;

	res = inject(child, 0, SYS_close, r1, 0, 0);
	if (res != 0 || fd_exists(child, r1))
		fail("injected close(%ld) = %ld, /proc/%d/fd/%ld %s", r1, res, (int)child, r1,
		     fd_exists(child, r1) ? "still there" : "gone");
	res = inject(child, 0, SYS_close, r2, 0, 0);
	if (res != 0 || fd_exists(child, r2))
		fail("injected close(%ld) = %ld", r2, res);
	res = inject(child, 0, SYS_close, r1, 0, 0);
	if (res != -EBADF)
		fail("injected close(%ld) again = %ld, want -EBADF", r1, res);
	if (fcntl(u1, F_GETFD) < 0 || fcntl(u2, F_GETFD) < 0)
		fail("our copies of the descriptors went with the child's");
	close(u1);
	close(u2);
	printf("ok 4 - injected close(%ld), close(%ld) = 0 and /proc/%d/fd/N gone; close(%ld) "
	       "again = -EBADF; our copies stay open\n", r1, r2, (int)child, r1);
}

/* A signal sent while the thread is ours is delivered after, as sent; a second seizer is refused. */
static void check_signal_during_session(void)
{
	const long none[6] = { 0 };
	struct hq_inject *in, *in2;
	char err[512], err2[512] = "";
	long res;
	int ret;

	wait_in_syscall(child, SYS_NR_READ, "the main thread");
	ret = hq_inject_begin(&in, child, 0, err, sizeof(err));
	if (ret)
		fail("hq_inject_begin: %s", err);
	if (syscall(SYS_tgkill, child, child, SIGUSR1))
		fail("tgkill: %s", strerror(errno));
	ret = hq_inject_syscall(in, SYS_getpid, none, &res, err, sizeof(err));
	if (ret || res != child)
		fail("getpid() with a signal pending: ret %d res %ld: %s", ret, res, err);
	if (sh->usr1)
		fail("SIGUSR1 was delivered while the thread was held");
	ret = hq_inject_begin(&in2, child, 0, err2, sizeof(err2));
	if (ret != -EPERM || !strstr(err2, "already traced"))
		fail("a second hq_inject_begin on a held thread: %d, \"%s\"", ret, err2);
	hq_inject_end(in);
	for (uint64_t end = now_ms() + 2000; !sh->usr1; sleep_ms(1))
		if (now_ms() > end)
			fail("SIGUSR1 sent during the session never arrived");
	if (sh->usr1 != 1 || sh->usr1_code != SI_TKILL || sh->usr1_pid != getpid())
		fail("SIGUSR1 arrived %d times with si_code %d si_pid %d, want once, SI_TKILL, %d",
		     sh->usr1, sh->usr1_code, sh->usr1_pid, (int)getpid());
	printf("ok 4b - SIGUSR1 sent during a session arrives once, after it, with its siginfo "
	       "(SI_TKILL from %d); a second seizer gets -EPERM: \"%s\"\n", (int)getpid(), err2);
}

/* A tracer killed between two calls of a session: the kernel detaches; nothing must show. */
static void check_tracer_death(void)
{
	char path[64], line[128];
	long tracer = -1;
	pid_t helper;
	FILE *f;
	int st;

	wait_in_syscall(child, SYS_NR_READ, "the main thread");
	helper = fork();
	if (helper < 0)
		fail("fork: %s", strerror(errno));
	if (!helper) {
		const long none[6] = { 0 };
		struct hq_inject *in;
		char err[512];
		long res = 0;

		if (hq_inject_begin(&in, child, 0, err, sizeof(err)) ||
		    hq_inject_syscall(in, SYS_getpid, none, &res, err, sizeof(err)) || res != child)
			_exit(2);
		raise(SIGKILL); /* with the session open */
		_exit(3);
	}
	if (waitpid(helper, &st, 0) != helper || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		fail("the helper tracer ended with status 0x%x, not by SIGKILL", st);
	wait_in_syscall(child, SYS_NR_READ, "the main thread after its tracer died");
	snprintf(path, sizeof(path), "/proc/%d/status", (int)child);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "TracerPid:", 10))
			tracer = strtol(line + 10, NULL, 10);
	if (f)
		fclose(f);
	if (tracer != 0)
		fail("the child is still traced by %ld after its tracer died", tracer);
	printf("ok 4c - a tracer killed between calls of a session: the child is untraced and "
	       "back in read() (check 5 shows nothing leaked)\n");
}

/* Field @key ("SigBlk:", "TracerPid:") of the child's thread @tid, as text. */
static void task_status(pid_t tid, const char *key, char *val, size_t len)
{
	char path[96], line[256];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)child, (int)tid);
	f = fopen(path, "re");
	if (!f)
		fail("%s: %s", path, strerror(errno));
	snprintf(val, len, "?");
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key))) {
			snprintf(val, len, "%s", line + strlen(key) + strspn(line + strlen(key), " \t"));
			val[strcspn(val, "\n")] = 0;
		}
	fclose(f);
}

struct victim {
	const char *name;
	pid_t tid;
	long nr;	/* its own call, or SPINNING */
};

/*
 * Wait until @v is back where it was, untraced, with signal mask @mask if
 * not NULL. For the spinner the mask is what tells: "running" is true of
 * it before it has run its way back through rt_sigreturn, which sets the
 * mask and the registers at once.
 */
static void wait_home(const struct victim *v, const char *mask, const char *when)
{
	uint64_t end = now_ms() + 5000;
	char tracer[32], now[64] = "";

	for (;;) {
		task_status(v->tid, "TracerPid:", tracer, sizeof(tracer));
		if (mask)
			task_status(v->tid, "SigBlk:", now, sizeof(now));
		if (!strcmp(tracer, "0") && in_syscall(v->tid) == v->nr &&
		    (!mask || !strcmp(mask, now)))
			return;
		if (now_ms() > end)
			fail("%s (thread %d) not back in %s %ld, untraced%s%s %s (TracerPid %s, in "
			     "%ld, signal mask %s)", v->name, (int)v->tid, v->nr == SPINNING ?
			     "user code" : "syscall", v->nr, mask ? ", signal mask " : "",
			     mask ? mask : "", when, tracer, in_syscall(v->tid), now);
		sleep_ms(1);
	}
}

/* Make @v leave its call once and see it did its work: its call restarted and works. */
static void nudge(const struct victim *v, int cmd, int reply, int poke)
{
	uint64_t end = now_ms() + 3000, before;
	char c;

	if (v->tid == child) {
		write_byte(cmd, 'a');
		c = read_byte(reply, 3000, "reply of the main thread");
		if (c != 'b')
			fail("the child answered '%c' to 'a', want 'b'", c);
		return;
	}
	if (v->tid == sh->sleeper_tid) {
		for (before = sh->sleeps; sh->sleeps < before + 3; sleep_ms(1))
			if (now_ms() > end)
				fail("the nanosleep thread stopped counting");
	} else if (v->tid == sh->ppoller_tid) {
		before = (uint64_t)sh->ppoll_wakeups;
		write_byte(poke, 'p');
		while ((uint64_t)sh->ppoll_wakeups <= before)
			if (now_ms() > end)
				fail("the ppoll thread did not wake up");
			else
				sleep_ms(1);
	} else if (v->tid == sh->tiles_tid) {
		before = sh->tiles_rounds;
		write_byte(amxp[1], 't');
		while (sh->tiles_rounds <= before)
			if (now_ms() > end)
				fail("the AMX thread did not finish its read() (%s)", sh->why);
			else
				sleep_ms(1);
	} else if (v->tid == sh->vector_tid) {
		before = sh->vector_rounds;
		write_byte(vecp[1], 'v');
		while (sh->vector_rounds <= before)
			if (now_ms() > end)
				fail("the vector thread did not finish its read() (%s)", sh->why);
			else
				sleep_ms(1);
	} else {
		for (before = sh->spins; sh->spins < before + 10; sleep_ms(1))
			if (now_ms() > end)
				fail("the spinner stopped spinning");
	}
}

/*
 * A tracer dies while a call it injected into @v is under way: at fault
 * point @point of inject.c, or (@point "kill") by SIGKILL from here while
 * the call, a read() of injp nobody feeds yet, blocks in @v.
 */
static void die_during_call(const struct victim *v, const char *point, int cmd, int reply,
			    int poke)
{
	bool blocking = !strcmp(point, "kill") || !strcmp(point, "during");
	char mask0[64];
	int usr1 = sh->usr1, st;
	pid_t helper;
	long arg0;

	wait_home(v, NULL, "before the test");
	task_status(v->tid, "SigBlk:", mask0, sizeof(mask0));
	memset(sh->scratch, 0, sizeof(sh->scratch));
	helper = fork();
	if (helper < 0)
		fail("fork: %s", strerror(errno));
	if (!helper) {
		const long getpid_args[6] = { 0 };
		const long read_args[6] = { injp[0], (long)(uintptr_t)sh->scratch, 1 };
		struct hq_inject *in;
		char err[512];
		long res = 0;

		if (strcmp(point, "kill"))
			setenv("HALITE_INJECT_TEST_DIE", point, 1);
		if (hq_inject_begin(&in, child, v->tid, err, sizeof(err))) {
			printf("helper: %s\n", err);
			_exit(2);
		}
		if (hq_inject_syscall(in, blocking ? SYS_read : SYS_getpid,
				      blocking ? read_args : getpid_args, &res, err, sizeof(err)))
			printf("helper: %s\n", err);
		_exit(3); /* it should have died before */
	}
	if (!strcmp(point, "kill")) {
		/* The injected read() blocks in @v: now. */
		uint64_t end = now_ms() + 5000;

		while (syscall_of(v->tid, &arg0) != SYS_NR_READ || arg0 != injp[0])
			if (now_ms() > end)
				fail("the injected read() never blocked in %s", v->name);
			else
				sleep_ms(1);
		kill(helper, SIGKILL);
	}
	if (waitpid(helper, &st, 0) != helper || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		fail("the tracer of %s at \"%s\" ended with status 0x%x, not by SIGKILL", v->name,
		     point, st);
	if (blocking) {
		uint64_t end = now_ms() + 5000;
		char tracer[32] = "";

		/* Untraced and still in the injected call: it finishes it without us. */
		while (syscall_of(v->tid, &arg0) != SYS_NR_READ || arg0 != injp[0] ||
		       (task_status(v->tid, "TracerPid:", tracer, sizeof(tracer)),
			strcmp(tracer, "0")))
			if (now_ms() > end)
				fail("%s is not untraced in the injected read() after its tracer "
				     "died (in %ld, TracerPid %s)", v->name, in_syscall(v->tid),
				     tracer);
			else
				sleep_ms(1);
		write_byte(injp[1], 'i');
		for (end = now_ms() + 3000; sh->scratch[0] != 'i'; sleep_ms(1))
			if (now_ms() > end)
				fail("the injected read() in %s did not complete", v->name);
	}
	wait_home(v, mask0, "after its tracer died");
	nudge(v, cmd, reply, poke);
	if (sh->eintr || sh->stray || sh->regs_bad || sh->ppoll_mask_bad || sh->bad ||
	    sh->vector_bad || sh->usr1 != usr1)
		fail("tracer of %s dead at \"%s\": the child saw %d EINTR, %d stray signals, %d "
		     "spinner register mismatches, %d wrong ppoll masks, %d vector thread "
		     "register mismatches, %d SIGUSR1, %d other problems (%s)", v->name, point,
		     sh->eintr, sh->stray, sh->regs_bad, sh->ppoll_mask_bad, sh->vector_bad,
		     sh->usr1 - usr1, sh->bad, sh->why);
}

static void check_tracer_death_in_call(int cmd, int reply, int poke)
{
	static const char *const points[] = { "kill", "armed", "entry", "during", "exit",
					      "back" };
	const struct victim victims[] = {
		{ "the main thread (read)", child, SYS_NR_READ },
		{ "the nanosleep thread", sh->sleeper_tid, SYS_NR_CLOCK_NANOSLEEP },
		{ "the ppoll thread", sh->ppoller_tid, SYS_NR_PPOLL },
		{ "the vector thread (raw read)", sh->vector_tid, SYS_NR_READ },
		{ "the spinning thread", sh->spinner_tid, SPINNING },
		{ "the AMX thread (raw read)", sh->tiles_tid, SYS_NR_READ },
	};
	size_t nvictims = sizeof(victims) / sizeof(victims[0]) - !sh->tiles_tid;
	uint64_t rounds = sh->vector_rounds;

	for (size_t p = 0; p < sizeof(points) / sizeof(points[0]); p++)
		for (size_t v = 0; v < nvictims; v++)
			die_during_call(&victims[v], points[p], cmd, reply, poke);
	sh->stop_spin = 1;
	printf("ok 4d - a tracer killed during an injected call (SIGKILL while it blocks; at "
	       "armed, entry, during, exit, back): each of the %zu threads was let go "
	       "untraced, finished the call and came back by itself: its read/nanosleep/ppoll "
	       "restarted and works, same signal mask, rbx r12-r15 %s MXCSR kept over %" PRIu64
	       " raw reads, %s, the spinner's registers kept, no EINTR, no stray signal\n",
	       nvictims, __builtin_cpu_supports("avx") ? "ymm0-15" : "xmm0-15",
	       sh->vector_rounds - rounds, sh->tiles_tid ? "AMX tile 0 and its configuration "
	       "kept" : "no AMX here (not checked)");
}

/* A call the thread's seccomp filter traps: -EPERM, no SIGSYS for the thread, session usable. */
static void check_seccomp(void)
{
	const long none[6] = { 0 };
	struct hq_inject *in;
	char err[512] = "";
	int ret, rounds = sh->sandbox_rounds, stray = sh->stray;
	long res = 0;
	uint64_t end;

	if (sh->sandbox_tid < 0) {
		printf("ok 4e - skipped: no seccomp filter in the child (%s)\n",
		       strerror(-sh->sandbox_tid));
		return;
	}
	wait_in_syscall(sh->sandbox_tid, SYS_NR_READ, "the sandboxed thread");
	ret = hq_inject_begin(&in, child, sh->sandbox_tid, err, sizeof(err));
	if (ret)
		fail("hq_inject_begin(sandboxed thread): %s", err);
	ret = hq_inject_syscall(in, SYS_getppid, none, &res, err, sizeof(err));
	if (ret != -EPERM || !strstr(err, "seccomp"))
		fail("getppid() trapped by seccomp: ret %d res %ld, want -EPERM: \"%s\"", ret, res,
		     err);
	ret = hq_inject_syscall(in, SYS_gettid, none, &res, err, sizeof(err));
	if (ret || res != sh->sandbox_tid)
		fail("gettid() after the trapped call: ret %d res %ld: %s", ret, res, err);
	hq_inject_end(in);
	wait_in_syscall(sh->sandbox_tid, SYS_NR_READ, "the sandboxed thread after the session");
	write_byte(sbxp[1], 's');
	for (end = now_ms() + 3000; sh->sandbox_rounds <= rounds; sleep_ms(1))
		if (now_ms() > end)
			fail("the sandboxed thread did not read its byte");
	sleep_ms(20);
	if (sh->stray != stray || sh->eintr)
		fail("the sandboxed thread saw %d stray signals (SIGSYS?), %d EINTR",
		     sh->stray - stray, sh->eintr);
	printf("ok 4e - getppid() trapped by the thread's seccomp filter: -EPERM (\"%s\"), no "
	       "SIGSYS in the thread, gettid() works after it in the session, its read() "
	       "restarted\n", err);
}

static void check_intact(int cmd, int reply, int poke)
{
	uint64_t s1, s2;
	char c;
	int st;

	wait_in_syscall(child, SYS_NR_READ, "the main thread");
	write_byte(cmd, 'a');
	c = read_byte(reply, 5000, "reply of the main thread");
	if (c != 'b')
		fail("the child answered '%c' to 'a', want 'b'", c);
	write_byte(poke, 'p');
	for (uint64_t end = now_ms() + 2000; sh->ppoll_wakeups < 1; sleep_ms(1))
		if (now_ms() > end)
			fail("the ppoll thread did not wake up");
	s1 = sh->sleeps;
	sleep_ms(100);
	s2 = sh->sleeps;
	if (s2 <= s1)
		fail("the nanosleep thread stopped counting (%" PRIu64 ")", s2);
	if (sh->eintr || sh->stray || sh->regs_bad || sh->ppoll_mask_bad || sh->bad ||
	    sh->vector_bad)
		fail("the child saw: %d EINTR, %d stray signals, %d register mismatches, %d wrong "
		     "ppoll masks, %d vector register mismatches, %d other problems (%s)",
		     sh->eintr, sh->stray, sh->regs_bad, sh->ppoll_mask_bad, sh->vector_bad,
		     sh->bad, sh->why);
	write_byte(poke, 'q');
	write_byte(vecp[1], 'q');
	write_byte(sbxp[1], 'q');
	if (sh->tiles_tid)
		write_byte(amxp[1], 'q');
	write_byte(cmd, 'q');
	if (waitpid(child, &st, 0) != child)
		fail("waitpid(child): %s", strerror(errno));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail("the child ended with status 0x%x (%s)", st, sh->why);
	printf("ok 5 - the child is intact: its blocked read() restarted and answered 'b'; "
	       "ppoll woke with its mask right; nanosleep counts on (%" PRIu64 " -> %" PRIu64
	       " in 100 ms); no EINTR, no stray signal, registers kept, SIGTRAP handler kept; "
	       "exit 0\n", s1, s2);
}

static void check_errors(void)
{
	struct hq_inject *in = NULL;
	char err[512] = "";
	pid_t dead;
	int ret;

	dead = fork();
	if (dead < 0)
		fail("fork: %s", strerror(errno));
	if (!dead)
		_exit(0);
	waitpid(dead, NULL, 0);
	ret = hq_inject_begin(&in, dead, 0, err, sizeof(err));
	if (ret != -ESRCH || !err[0] || in)
		fail("hq_inject_begin(%d, no such process) = %d, \"%s\"", (int)dead, ret, err);
	printf("ok 6 - hq_inject_begin(%d, a pid that exited) = -ESRCH: \"%s\"\n", (int)dead, err);
	err[0] = 0;
	ret = hq_fd_from_process(dead, 0, err, sizeof(err));
	if (ret != -ESRCH || !err[0])
		fail("hq_fd_from_process(%d) = %d, \"%s\"", (int)dead, ret, err);
	printf("ok 6b - hq_fd_from_process(%d, 0) = -ESRCH: \"%s\"\n", (int)dead, err);
	err[0] = 0;
	ret = hq_inject_begin(&in, getpid(), 1, err, sizeof(err));
	if (ret != -ESRCH || !err[0] || in)
		fail("hq_inject_begin(self, tid 1) = %d, \"%s\"", ret, err);
	printf("ok 6c - hq_inject_begin(%d, tid 1 of another process) = -ESRCH: \"%s\"\n",
	       (int)getpid(), err);
	hq_inject_end(NULL);
}

int main(void)
{
	int cmd[2], reply[2], poke[2], memfd, u1, u2;
	uint8_t *view;
	long r1, r2;

	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(60); /* a hang fails the test; the child goes with us */

	memfd = memfd_create("hq-test-inject", MFD_CLOEXEC);
	if (memfd < 0 || ftruncate(memfd, MAP_LEN))
		fail("memfd: %s", strerror(errno));
	view = mmap(NULL, MAP_LEN, PROT_READ, MAP_SHARED, memfd, 0);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (view == MAP_FAILED || sh == MAP_FAILED)
		fail("mmap: %s", strerror(errno));
	if (pipe2(cmd, O_CLOEXEC) || pipe2(reply, O_CLOEXEC) || pipe2(poke, O_CLOEXEC) ||
	    pipe2(injp, O_CLOEXEC) || pipe2(vecp, O_CLOEXEC) || pipe2(sbxp, O_CLOEXEC) ||
	    pipe2(amxp, O_CLOEXEC))
		fail("pipe2: %s", strerror(errno));

	child = fork();
	if (child < 0)
		fail("fork: %s", strerror(errno));
	if (!child) {
		close(injp[1]);
		close(vecp[1]);
		close(sbxp[1]);
		close(amxp[1]);
		child_main(getppid(), memfd, view, cmd[0], reply[1], poke[0]);
	}
	close(vecp[0]);
	close(sbxp[0]);
	close(amxp[0]);
	close(cmd[0]);
	close(reply[1]);
	close(poke[0]);
	if (read_byte(reply[0], 10000, "start-up of the child") != 'R')
		fail("the child did not start");
	printf("child %d: main thread in read(), threads nanosleep %d, ppoll %d, spin %d, "
	       "vector %d; memfd mapping at 0x%" PRIx64 "\n", (int)child, sh->sleeper_tid,
	       sh->ppoller_tid, sh->spinner_tid, sh->vector_tid, sh->map_addr);

	wait_in_syscall(child, SYS_NR_READ, "the main thread");
	check_ids();
	check_uffd(&r1, &r2, &u1, &u2);
	check_madvise(view, u2);
	check_close(r1, r2, u1, u2);
	check_signal_during_session();
	check_tracer_death();
	check_tracer_death_in_call(cmd[1], reply[0], poke[1]);
	check_seccomp();
	check_intact(cmd[1], reply[0], poke[1]);
	check_errors();
	printf("PASS\n");
	return 0;
}
