// SPDX-License-Identifier: MIT
/*
 * System calls run inside another process with ptrace (see inject.h).
 *
 * Where the thread stops. PTRACE_SEIZE (no options) + PTRACE_INTERRUPT stops
 * it without a signal the process could see, in a PTRACE_EVENT_STOP inside
 * get_signal(), on its way back to user mode. If it was in a blocking call,
 * its registers then read: rip just after the `syscall`, orig_rax the call,
 * rax -ERESTARTSYS (or -ERESTARTNOHAND, -ERESTART_RESTARTBLOCK). The kernel
 * decides about restarting *after* the tracer resumes it, from the registers
 * as they are then (arch_do_signal_or_restart: rewind rip by 2, rax =
 * orig_rax, or restart_syscall for nanosleep's restart block). Hence:
 * - injected registers carry orig_rax = -1: no restart logic for them;
 * - the saved registers go back while the thread is still in a stop inside
 *   get_signal(), so the interrupted call restarts as after a signal without
 *   a handler. Our calls leave current->restart_block alone.
 *
 * Between calls the thread is parked in an event stop with its own registers
 * and mask. After the single step it sits in the SIGTRAP signal-delivery-
 * stop; if we died there, the kernel's implicit detach would deliver that
 * SIGTRAP (a core dump for QEMU). So after each call: registers and mask
 * back, PTRACE_INTERRUPT, PTRACE_CONT(0) (SIGTRAP dropped), and the thread
 * takes the pending trap before anything else in get_signal(). Dying between
 * calls is then harmless; only the few microseconds of a call are not.
 *
 * Signals. During the step every signal is blocked but SIGTRAP, SIGSEGV and
 * SIGSYS: a signal dequeued while the registers are the injected ones could
 * not be delivered right (its frame would save them), while a blocked one
 * waits in the queue with its siginfo. The three stay open because
 * force_sig_info_to_task() resets the handler of a *blocked* forced signal
 * to SIG_DFL: the step's own SIGTRAP, a fault of the `syscall` fetch and a
 * seccomp trap are forced. PTRACE_GETSIGMASK returns saved_sigmask when the
 * thread is inside ppoll/pselect/epoll_pwait with a mask, and
 * PTRACE_SETSIGMASK clears the restore flag (both since Linux 5.1), so
 * putting the mask back is what the kernel itself does when such a call
 * restarts without a handler. A foreign signal that does stop the thread
 * before the `syscall` ran (rip unchanged) is delivered for real from the
 * restored registers (PTRACE_CONT with it, a trap pending), then the call
 * is tried again. The step's SIGTRAP is "synchronous", so it is dequeued
 * before any other signal once the call has run.
 *
 * The `syscall` instruction. Any bytes 0f 05 in an executable mapping will
 * do: the CPU decodes from where rip points. rip-2 first (a thread that was
 * in a call sits just after one), if on rip's page and in an executable
 * mapping; else [vdso], then libc, then other executable file mappings.
 * Never [vsyscall]: that page is emulated and only its entry points run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "inject.h"

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

struct hq_inject {
	pid_t pid, tid;
	pid_t owner;			/* our thread that seized it: the only one ptrace obeys */
	int mem;			/* /proc/PID/mem, -1 until needed */
	uint64_t syscall_ip;		/* a 0f 05, 0 until found */
	struct user_regs_struct saved;	/* the thread's own, read at its last event stop */
	uint64_t saved_mask;		/* kernel sigset: bit n-1 is signal n */
	bool mask_saved;		/* PTRACE_GETSIGMASK worked */
	bool dirty;			/* registers or mask are the injected ones */
	bool parked;			/* in an event stop with its own registers and mask */
	bool gone;			/* the thread ended (and was reaped): no ptrace calls */
	int stop_sig;			/* signal of the current signal-delivery-stop to deliver */
};

static void seterr(char *err, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

/* "ESRCH (No such process)" */
static const char *estr(int e, char *buf, size_t len)
{
	const char *name = strerrorname_np(e);
	char text[128];

	snprintf(buf, len, "%s (%s)", name ? name : "errno", strerror_r(e, text, sizeof(text)));
	return buf;
}

#define ESTR(e) estr((e), (char[192]){ 0 }, 192)

static long xptrace(int req, pid_t tid, uintptr_t addr, uintptr_t data)
{
	return ptrace((enum __ptrace_request)req, tid, (void *)addr, (void *)data);
}

/* A thread killed while we held it reports its exit to us: collect it (bounded). */
static void reap_gone(struct hq_inject *in)
{
	for (int i = 0; i < 100 && !in->gone; i++) {
		int st;
		pid_t r = waitpid(in->tid, &st, __WALL | WNOHANG);

		if (r == in->tid && (WIFEXITED(st) || WIFSIGNALED(st)))
			in->gone = true;
		else if (r < 0 && errno != EINTR)
			in->gone = true; /* ECHILD: not ours to wait for any more */
		else if (r == 0)
			nanosleep(&(struct timespec){ 0, 10 * 1000 * 1000 }, NULL);
	}
}

/* Next stop of the thread into *st; -ESRCH (message) when it ended. */
static int wait_stop(struct hq_inject *in, int *st, char *err, size_t errlen)
{
	for (;;) {
		pid_t r = waitpid(in->tid, st, __WALL);

		if (r == in->tid)
			break;
		if (r < 0 && errno == EINTR)
			continue;
		in->gone = true; /* ECHILD: it is no longer our tracee */
		seterr(err, errlen, "waiting for thread %d of process %d: %s", (int)in->tid,
		       (int)in->pid, ESTR(r < 0 ? errno : ECHILD));
		return -ESRCH;
	}
	if (WIFEXITED(*st) || WIFSIGNALED(*st)) {
		in->gone = true;
		if (WIFSIGNALED(*st))
			seterr(err, errlen, "thread %d of process %d was killed by signal %d (%s) "
			       "during the injection", (int)in->tid, (int)in->pid, WTERMSIG(*st),
			       sigabbrev_np(WTERMSIG(*st)) ?: "?");
		else
			seterr(err, errlen, "thread %d of process %d exited (status %d) during "
			       "the injection", (int)in->tid, (int)in->pid, WEXITSTATUS(*st));
		return -ESRCH;
	}
	return 0; /* WIFSTOPPED: no WCONTINUED asked */
}

/* A ptrace request failed: say which, and notice a thread that died. */
static int ptrace_failed(struct hq_inject *in, const char *what, char *err, size_t errlen)
{
	int e = errno;

	seterr(err, errlen, "ptrace(%s) of thread %d of process %d: %s", what, (int)in->tid,
	       (int)in->pid, ESTR(e));
	if (e == ESRCH) {
		/* Out of its stop while traced: only SIGKILL (or exec) does that. */
		reap_gone(in);
		if (in->gone)
			seterr(err, errlen, "thread %d of process %d was killed during the "
			       "injection", (int)in->tid, (int)in->pid);
	}
	return -e;
}

/*
 * Wait until the thread is in a PTRACE_EVENT_STOP (our interrupt, or a
 * group-stop). Signal-delivery-stops on the way are resumed with their own
 * signal: delivered as if we were not there, siginfo intact, and the trap
 * still pending stops the thread right after.
 */
static int settle(struct hq_inject *in, char *err, size_t errlen)
{
	for (;;) {
		int st, ret = wait_stop(in, &st, err, errlen);

		if (ret)
			return ret;
		if ((st >> 16) == PTRACE_EVENT_STOP) {
			in->stop_sig = 0;
			in->parked = true;
			return 0;
		}
		if (xptrace(PTRACE_CONT, in->tid, 0, (st >> 16) ? 0 : (uintptr_t)WSTOPSIG(st)))
			return ptrace_failed(in, "PTRACE_CONT", err, errlen);
	}
}

/* Registers and mask of the parked thread: what to put back, and the base of a call. */
static int snapshot(struct hq_inject *in, char *err, size_t errlen)
{
	if (xptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&in->saved))
		return ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
	/* The kernel's sigset_t is 8 bytes here; addr must say so. */
	in->mask_saved = !xptrace(PTRACE_GETSIGMASK, in->tid, sizeof(in->saved_mask),
				  (uintptr_t)&in->saved_mask);
	return 0;
}

/* The thread's own registers and mask back (it is in some ptrace-stop). */
static int put_back(struct hq_inject *in, char *err, size_t errlen)
{
	if (!in->dirty || in->gone)
		return 0;
	if (xptrace(PTRACE_SETREGS, in->tid, 0, (uintptr_t)&in->saved))
		return ptrace_failed(in, "PTRACE_SETREGS", err, errlen);
	if (in->mask_saved && xptrace(PTRACE_SETSIGMASK, in->tid, sizeof(in->saved_mask),
				      (uintptr_t)&in->saved_mask))
		return ptrace_failed(in, "PTRACE_SETSIGMASK", err, errlen);
	in->dirty = false;
	return 0;
}

/*
 * From a signal-delivery-stop, with the thread's own registers back: resume
 * it with @sig (0: drop the stop's signal) and park it in an event stop
 * again, then re-read its state (a delivered signal changes it).
 */
static int repark(struct hq_inject *in, int sig, char *err, size_t errlen)
{
	int ret;

	if (xptrace(PTRACE_INTERRUPT, in->tid, 0, 0))
		return ptrace_failed(in, "PTRACE_INTERRUPT", err, errlen);
	if (xptrace(PTRACE_CONT, in->tid, 0, (uintptr_t)sig))
		return ptrace_failed(in, "PTRACE_CONT", err, errlen);
	ret = settle(in, err, errlen);
	return ret ? ret : snapshot(in, err, errlen);
}

/* After a failed call: own state back and parked if possible; keep the first message. */
static void recover(struct hq_inject *in, int sig)
{
	if (in->gone)
		return;
	if (!put_back(in, NULL, 0) && !in->parked)
		repark(in, sig, NULL, 0);
}

static int read_mem(struct hq_inject *in, uint64_t addr, void *buf, size_t len)
{
	char path[64];

	if (in->mem < 0) {
		snprintf(path, sizeof(path), "/proc/%d/mem", (int)in->pid);
		in->mem = open(path, O_RDONLY | O_CLOEXEC);
		if (in->mem < 0)
			return -errno;
	}
	return pread(in->mem, buf, len, (off_t)addr) == (ssize_t)len ? 0 : -EIO;
}

struct xmap {
	uint64_t start, end;
	int rank; /* 1 [vdso], 2 libc, 3 another executable file mapping */
};

/* First 0f 05 in [start, end), or 0. Chunks overlap by a byte so no pair is split. */
static uint64_t scan_range(struct hq_inject *in, uint64_t start, uint64_t end)
{
	uint8_t buf[65536];

	for (uint64_t a = start; a + 1 < end; a += sizeof(buf) - 1) {
		size_t n = end - a < sizeof(buf) ? (size_t)(end - a) : sizeof(buf);

		if (read_mem(in, a, buf, n))
			return 0;
		for (size_t i = 0; i + 1 < n; i++)
			if (buf[i] == 0x0f && buf[i + 1] == 0x05)
				return a + i;
	}
	return 0;
}

static int find_syscall_insn(struct hq_inject *in, char *err, size_t errlen)
{
	uint64_t rip = in->saved.rip;
	struct xmap *maps = NULL;
	size_t n = 0, cap = 0, linecap = 0;
	char path[64], *line = NULL;
	bool rip_ok = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)in->pid);
	f = fopen(path, "re");
	if (!f) {
		int e = errno;

		seterr(err, errlen, "%s: %s", path, ESTR(e));
		return -e;
	}
	while (getline(&line, &linecap, f) > 0) {
		unsigned long long s, e;
		char perms[8];
		int off = 0, rank;
		const char *name;

		if (sscanf(line, "%llx-%llx %7s %*s %*s %*s %n", &s, &e, perms, &off) < 3 ||
		    perms[2] != 'x')
			continue;
		name = off ? line + off : "";
		if ((rip & 4095) >= 2 && rip - 2 >= s && rip <= e)
			rip_ok = true;
		if (!strncmp(name, "[vdso]", 6))
			rank = 1;
		else if (name[0] == '[' || name[0] == '\n' || !name[0])
			continue; /* [vsyscall], [uprobes], anonymous (JIT) code */
		else if (strstr(name, "/libc.so") || strstr(name, "/libc-"))
			rank = 2;
		else
			rank = 3;
		if (n == cap) {
			struct xmap *m = realloc(maps, (cap = cap ? 2 * cap : 32) * sizeof(*m));

			if (!m)
				break;
			maps = m;
		}
		maps[n++] = (struct xmap){ s, e, rank };
	}
	free(line);
	fclose(f);

	if (rip_ok) {
		uint8_t insn[2];

		if (!read_mem(in, rip - 2, insn, 2) && insn[0] == 0x0f && insn[1] == 0x05)
			in->syscall_ip = rip - 2;
	}
	for (int rank = 1; rank <= 3 && !in->syscall_ip; rank++)
		for (size_t i = 0; i < n && !in->syscall_ip; i++)
			if (maps[i].rank == rank)
				in->syscall_ip = scan_range(in, maps[i].start, maps[i].end);
	free(maps);
	if (!in->syscall_ip) {
		seterr(err, errlen, "no syscall instruction (0f 05) found in the executable "
		       "mappings of process %d", (int)in->pid);
		return -ENOEXEC;
	}
	return 0;
}

/* Why PTRACE_SEIZE said EPERM, from what /proc tells about the thread. */
static void explain_eperm(pid_t pid, pid_t tid, char *err, size_t errlen)
{
	char path[64], line[256], state = '?';
	long tracer = 0;
	int scope = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
	f = fopen(path, "re");
	if (f) {
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "State:", 6))
				sscanf(line + 6, " %c", &state);
			else if (!strncmp(line, "TracerPid:", 10))
				tracer = strtol(line + 10, NULL, 10);
		}
		fclose(f);
	}
	f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = -1;
		fclose(f);
	}

	if (pid == getpid())
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: it is this "
		       "process", (int)pid);
	else if (tracer)
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: thread %d "
		       "is already traced by process %ld%s", (int)pid, (int)tid, tracer,
		       tracer == getpid() ? " (this one: an injection session left open?)"
					  : " (a debugger, strace, another halite-qemu?)");
	else if (state == 'Z' || state == 'X')
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: thread %d "
		       "has exited%s", (int)pid, (int)tid, tid == pid ? " (pass another "
		       "thread's id if the process lives on)" : "");
	else if (scope == 3)
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: "
		       "kernel.yama.ptrace_scope is 3 (no attaching until reboot)", (int)pid);
	else if (geteuid() != 0 && scope > 0)
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: run as root "
		       "or set kernel.yama.ptrace_scope to 0 (now %d)", (int)pid, scope);
	else if (geteuid() != 0)
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: run as root "
		       "(or with CAP_SYS_PTRACE), or as its user", (int)pid);
	else
		seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed even for "
		       "root%s: a kernel thread, another user namespace, or a security module "
		       "(SELinux, AppArmor, lockdown)?", (int)pid,
		       scope >= 0 ? "" : " (no yama here)");
}

int hq_inject_begin(struct hq_inject **ip, pid_t pid, pid_t tid, char *err, size_t errlen)
{
	struct hq_inject *in;
	char path[64];
	int ret;

	if (!ip || pid <= 0 || tid < 0) {
		seterr(err, errlen, "hq_inject_begin: bad arguments (pid %d, tid %d)", (int)pid,
		       (int)tid);
		return -EINVAL;
	}
	tid = tid ? tid : pid;
	/* Only a thread of @pid: a stray tid must not send us into another process. */
	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)pid, (int)tid);
	if (access(path, F_OK)) {
		int e = errno;

		snprintf(path, sizeof(path), "/proc/%d", (int)pid);
		if (e == ENOENT && access(path, F_OK))
			seterr(err, errlen, "no process %d", (int)pid);
		else if (e == ENOENT)
			seterr(err, errlen, "no thread %d in process %d", (int)tid, (int)pid);
		else
			seterr(err, errlen, "%s: %s", path, ESTR(e));
		return e == ENOENT ? -ESRCH : -e;
	}

	in = calloc(1, sizeof(*in));
	if (!in) {
		seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	in->pid = pid;
	in->tid = tid;
	in->owner = gettid();
	in->mem = -1;
	/* No PTRACE_O_EXITKILL: QEMU must outlive a crash of ours. */
	if (xptrace(PTRACE_SEIZE, tid, 0, 0)) {
		ret = -errno;
		if (ret == -EPERM)
			explain_eperm(pid, tid, err, errlen);
		else if (ret == -ESRCH)
			seterr(err, errlen, "no process %d (thread %d)", (int)pid, (int)tid);
		else
			seterr(err, errlen, "ptrace(PTRACE_SEIZE) of thread %d of process %d: %s",
			       (int)tid, (int)pid, ESTR(-ret));
		free(in);
		return ret;
	}
	if (xptrace(PTRACE_INTERRUPT, tid, 0, 0))
		ret = ptrace_failed(in, "PTRACE_INTERRUPT", err, errlen);
	else
		ret = settle(in, err, errlen);
	if (!ret)
		ret = snapshot(in, err, errlen);
	if (!ret && in->saved.cs != USER64_CS) {
		seterr(err, errlen, "thread %d of process %d runs 32-bit code (cs 0x%llx): "
		       "not supported", (int)tid, (int)pid, (unsigned long long)in->saved.cs);
		ret = -ENOEXEC;
	}
	if (ret) {
		hq_inject_end(in);
		return ret;
	}
	*ip = in;
	return 0;
}

int hq_inject_syscall(struct hq_inject *in, long nr, const long args[6], long *result,
		      char *err, size_t errlen)
{
	/* Blocked during the step: all but SIGTRAP, SIGSEGV, SIGSYS (see top). */
	uint64_t block = ~(1ull << (SIGTRAP - 1) | 1ull << (SIGSEGV - 1) | 1ull << (SIGSYS - 1));
	struct user_regs_struct regs;
	siginfo_t si;
	int ret, sig;

	if (!in || !args || !result || nr < 0) {
		seterr(err, errlen, "hq_inject_syscall: bad arguments");
		return -EINVAL;
	}
	if (in->owner != gettid()) {
		seterr(err, errlen, "the injection session of thread %d belongs to our thread %d, "
		       "not %d (ptrace obeys its tracer thread only)", (int)in->tid,
		       (int)in->owner, (int)gettid());
		return -EINVAL;
	}
	if (in->gone) {
		seterr(err, errlen, "thread %d of process %d is gone", (int)in->tid, (int)in->pid);
		return -ESRCH;
	}
	if (!in->parked) {
		seterr(err, errlen, "the injection session of thread %d is unusable after an "
		       "earlier error", (int)in->tid);
		return -EIO;
	}
	if (!in->syscall_ip) {
		ret = find_syscall_insn(in, err, errlen);
		if (ret)
			return ret;
	}

	for (int tries = 0;; tries++) {
		if (tries >= MAX_RETRIES) {
			seterr(err, errlen, "thread %d of process %d: the call did not complete "
			       "after %d signals or stops", (int)in->tid, (int)in->pid, tries);
			ret = -EAGAIN;
			goto fail;
		}
		regs = in->saved;
		regs.rip = in->syscall_ip;
		regs.orig_rax = (unsigned long long)-1; /* no restart logic for the injected call */
		regs.rax = (unsigned long long)nr;
		regs.rdi = (unsigned long long)args[0];
		regs.rsi = (unsigned long long)args[1];
		regs.rdx = (unsigned long long)args[2];
		regs.r10 = (unsigned long long)args[3];
		regs.r8 = (unsigned long long)args[4];
		regs.r9 = (unsigned long long)args[5];
		in->dirty = true;
		if (in->mask_saved &&
		    xptrace(PTRACE_SETSIGMASK, in->tid, sizeof(block), (uintptr_t)&block)) {
			ret = ptrace_failed(in, "PTRACE_SETSIGMASK", err, errlen);
			goto fail;
		}
		if (xptrace(PTRACE_SETREGS, in->tid, 0, (uintptr_t)&regs)) {
			ret = ptrace_failed(in, "PTRACE_SETREGS", err, errlen);
			goto fail;
		}
		/* Step until a signal-delivery-stop; a stray event stop comes before the call runs. */
		do {
			int st;

			if (xptrace(PTRACE_SINGLESTEP, in->tid, 0, 0)) {
				ret = ptrace_failed(in, "PTRACE_SINGLESTEP", err, errlen);
				goto fail;
			}
			in->parked = false;
			ret = wait_stop(in, &st, err, errlen);
			if (ret)
				goto fail;
			sig = (st >> 16) ? 0 : WSTOPSIG(st);
			in->stop_sig = sig;
		} while (!sig && ++tries < MAX_RETRIES);
		if (!sig)
			continue; /* reports the retry limit */
		if (xptrace(PTRACE_GETSIGINFO, in->tid, 0, (uintptr_t)&si)) {
			ret = ptrace_failed(in, "PTRACE_GETSIGINFO", err, errlen);
			goto fail;
		}
		if (xptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&regs)) {
			ret = ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
			goto fail;
		}
		if (sig == SIGTRAP && si.si_code > 0) {
			in->stop_sig = 0; /* the step's trap: never passed on to the target */
			if (regs.rip == in->syscall_ip + 2)
				break; /* the call ran */
			seterr(err, errlen, "thread %d of process %d trapped at 0x%llx, not after "
			       "the injected call at 0x%llx", (int)in->tid, (int)in->pid,
			       (unsigned long long)regs.rip, (unsigned long long)in->syscall_ip);
			ret = -EPROTO;
			goto fail;
		}
		if (si.si_code > 0 && regs.rip == in->syscall_ip &&
		    (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL)) {
			in->stop_sig = 0; /* ours: the target never sees it */
			seterr(err, errlen, "the syscall instruction at 0x%llx in process %d "
			       "faulted (%s)", (unsigned long long)in->syscall_ip, (int)in->pid,
			       sigabbrev_np(sig) ?: "?");
			ret = -EFAULT;
			goto fail;
		}
		if (sig == SIGSYS && si.si_code == SYS_SECCOMP) {
			in->stop_sig = 0;
			seterr(err, errlen, "a seccomp filter of process %d traps system call %ld",
			       (int)in->pid, nr);
			ret = -EPERM;
			goto fail;
		}
		if (regs.rip != in->syscall_ip) {
			seterr(err, errlen, "thread %d of process %d stopped with signal %d at "
			       "0x%llx, not after the injected call at 0x%llx", (int)in->tid,
			       (int)in->pid, sig, (unsigned long long)regs.rip,
			       (unsigned long long)in->syscall_ip);
			ret = -EPROTO;
			goto fail;
		}
		/* Someone's signal before the call ran: deliver it for real, then again. */
		ret = put_back(in, err, errlen);
		if (!ret)
			ret = repark(in, sig, err, errlen);
		if (ret)
			goto fail;
	}

	/* Own registers and mask back, SIGTRAP dropped, parked for the next call or the end. */
	in->stop_sig = 0;
	ret = put_back(in, err, errlen);
	if (!ret)
		ret = repark(in, 0, err, errlen);
	if (ret)
		goto fail;
	*result = (long)regs.rax;
	return 0;
fail:
	recover(in, in->stop_sig);
	return ret;
}

void hq_inject_end(struct hq_inject *in)
{
	if (!in)
		return;
	if (!in->gone) {
		/* Normally parked and clean: a plain detach, the kernel restarts what we interrupted. */
		put_back(in, NULL, 0);
		if (xptrace(PTRACE_DETACH, in->tid, 0, (uintptr_t)in->stop_sig) && errno == ESRCH)
			reap_gone(in);
	}
	if (in->mem >= 0)
		close(in->mem);
	free(in);
}

int hq_inject_one(pid_t pid, long nr, const long args[6], long *result, char *err,
		  size_t errlen)
{
	struct hq_inject *in;
	int ret;

	ret = hq_inject_begin(&in, pid, 0, err, errlen);
	if (ret)
		return ret;
	ret = hq_inject_syscall(in, nr, args, result, err, errlen);
	hq_inject_end(in);
	return ret;
}

int hq_fd_from_process(pid_t pid, int remote_fd, char *err, size_t errlen)
{
	int pidfd, fd, e;

	if (pid <= 0 || remote_fd < 0) {
		seterr(err, errlen, "hq_fd_from_process: bad arguments (pid %d, fd %d)", (int)pid,
		       remote_fd);
		return -EINVAL;
	}
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0) {
		e = errno;
		if (e == ESRCH)
			seterr(err, errlen, "pidfd_open(%d): no process %d", (int)pid, (int)pid);
		else if (e == EINVAL)
			seterr(err, errlen, "pidfd_open(%d): %s: not a process id (a thread id?)",
			       (int)pid, ESTR(e));
		else
			seterr(err, errlen, "pidfd_open(%d): %s%s", (int)pid, ESTR(e),
			       e == ENOSYS ? ": the kernel is older than 5.3" : "");
		return -e;
	}
	/* The new descriptor always has O_CLOEXEC (flags must be 0). */
	fd = (int)syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
	e = errno;
	close(pidfd);
	if (fd >= 0)
		return fd;
	if (e == EBADF)
		seterr(err, errlen, "pidfd_getfd: process %d has no descriptor %d", (int)pid,
		       remote_fd);
	else if (e == EPERM)
		seterr(err, errlen, "pidfd_getfd of descriptor %d of process %d not allowed "
		       "(ptrace access rules: run as root)", remote_fd, (int)pid);
	else
		seterr(err, errlen, "pidfd_getfd(process %d, descriptor %d): %s%s", (int)pid,
		       remote_fd, ESTR(e), e == ENOSYS ? ": the kernel is older than 5.6" : "");
	return -e;
}
