/* SPDX-License-Identifier: MIT */
/*
 * The ptrace injection's insides, shared by inject.c (the session and its
 * calls), inject_code.c (the code a call runs at and the signal frame that
 * gets the thread back) and inject_util.c (messages, ptrace itself): not
 * for any other file.
 */
#ifndef HALITE_QEMU_INJECT_INT_H
#define HALITE_QEMU_INJECT_INT_H

#include <cpuid.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1 /* si_code of a seccomp SECCOMP_RET_TRAP (asm-generic/siginfo.h) */
#endif

#define USER64_CS 0x33	/* __USER_CS: a thread in 64-bit code; compat code has other numbers */
#define MAX_RETRIES 16	/* foreign signal stops or stray traps tolerated per call */
#define SYSCALL_STOP (SIGTRAP | 0x80)	/* WSTOPSIG of a syscall stop (PTRACE_O_TRACESYSGOOD) */
#define RED_ZONE 128	/* x86-64 ABI: below rsp, the thread's own */

/* Kernel restart codes (include/linux/errno.h) */
#define ERESTARTSYS 512
#define ERESTARTNOINTR 513
#define ERESTARTNOHAND 514
#define ERESTART_RESTARTBLOCK 516

struct xmap {
	uint64_t start, end;
	int rank; /* 1 libc, 2 [vdso], 3 another executable file mapping, 0 other executable */
};

enum { DIE_NONE, DIE_ARMED, DIE_ENTRY, DIE_DURING, DIE_EXIT, DIE_BACK };

struct hq_inject {
	pid_t pid, tid;
	pid_t owner;			/* our thread that seized it: the only one ptrace obeys */
	int mem;			/* /proc/PID/mem, -1 until needed */
	struct xmap *maps;		/* the executable mappings, found with the code */
	size_t nmaps;
	uint64_t syscall_ip;		/* a 0f 05: the call without a frame */
	uint64_t gadget_ip;		/* 0f 05 c3, 0 if none */
	uint64_t restorer_ip;		/* __restore_rt, 0 if none */
	bool shstk;			/* the thread has a user shadow stack: no frame */
	uint8_t *fpbuf;			/* the frame's FPU image, XSTATE_BUF_SIZE */
	struct user_regs_struct saved;	/* the thread's own, read at its last event stop */
	uint64_t saved_mask;		/* kernel sigset: bit n-1 is signal n */
	bool mask_saved;		/* PTRACE_GETSIGMASK worked */
	bool dirty;			/* registers or mask are the injected ones */
	bool parked;			/* in an event stop with its own registers and mask */
	bool gone;			/* the thread ended (and was reaped): no ptrace calls */
	int stop_sig;			/* signal of the current signal-delivery-stop to deliver */
	int die;			/* test fault point, DIE_* */
};

/* --- inject_util.c --- */

/* A message into @err (NULL or @len 0: none). */
void inj_seterr(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "ESRCH (No such process)" into @buf. */
const char *inj_estr(int e, char *buf, size_t len);
#define ESTR(e) inj_estr((e), (char[192]){ 0 }, 192)
long inj_ptrace(int req, pid_t tid, uintptr_t addr, uintptr_t data);

/* --- inject_code.c --- */

/* @len bytes of the target at @addr (/proc/PID/mem, opened once): 0 or -errno. */
int inj_read_mem(struct hq_inject *in, uint64_t addr, void *buf, size_t len);
/* Whether the thread runs with a user shadow stack (CET): a `ret` of ours would not match it. */
bool inj_has_shadow_stack(const struct hq_inject *in);
/*
 * The executable mappings, and the code in them the calls use (inject.c's
 * top comment). Run before the thread is stopped: reading libc takes a while.
 */
int inj_find_code(struct hq_inject *in, char *err, size_t errlen);
/* Where a call without a frame runs: a 0f 05, rip - 2 first when the thread sits after one. */
uint64_t inj_bare_syscall_ip(struct hq_inject *in);
/* The thread's FPU image into in->fpbuf; its size (0: none), *xsave when XSAVE format. */
size_t inj_read_fpstate(struct hq_inject *in, bool *xsave);
/* The signal frame below the red zone; its address, or 0 when there is none. */
uint64_t inj_write_frame(struct hq_inject *in);

#endif
