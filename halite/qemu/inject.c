// SPDX-License-Identifier: MIT
/*
 * System calls run inside another process with ptrace (see inject.h).
 *
 * Where the thread stops. PTRACE_SEIZE + PTRACE_INTERRUPT stops it without
 * a signal the process could see, in a PTRACE_EVENT_STOP inside
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
 * A way back that needs no tracer. We may be killed (SIGKILL, OOM) at any
 * instant, and the kernel then detaches the thread as it is, with our
 * registers and mask if a call is under way; the calls are not short (an
 * mremap or munmap of 512 MiB takes 2-20 ms). So before each call the
 * thread gets what the return from a signal handler uses: below its red
 * zone (rsp - 128), a struct rt_sigframe as x64_setup_rt_frame() lays it
 * out: the return address, then a ucontext with its registers, its mask and
 * a copy of its FPU/SSE/AVX state (XSAVE user format, 64-byte aligned, with
 * the sw_reserved bytes and FP_XSTATE_MAGIC2 that check_xstate_in_sigframe()
 * wants). The call runs at a `syscall; ret` (0f 05 c3) of the thread's own
 * code with rsp on that frame, whose return address is glibc's __restore_rt
 * (mov $15,%rax; syscall). Let go anywhere before its registers are back,
 * the thread finishes the call, returns into rt_sigreturn, which finds the
 * ucontext at rsp - 8 + 8 (sys_rt_sigreturn: regs->sp - sizeof(long)), and
 * is back in its registers, mask and FPU state. What matters in the frame:
 * - its registers are the saved ones with the restart the kernel would have
 *   done already applied (rip - 2, rax = orig_rax): rt_sigreturn sets
 *   orig_ax to -1, so nothing restarts after it. -ERESTART_RESTARTBLOCK gets
 *   the same, not __NR_restart_syscall, because restore_sigcontext() resets
 *   the restart block to do_no_restart_syscall (restart_syscall would fail
 *   with EINTR): the call is run again from its start, so a timed sleep or
 *   poll waits its whole time again, and a thread already in restart_syscall
 *   gets EINTR. Only if we die during a call, that is.
 * - uc_stack.ss_flags is SS_ONSTACK|SS_DISABLE, a mode do_sigaltstack()
 *   rejects (EINVAL) before it changes anything, and restore_altstack()
 *   ignores all but EFAULT: the altstack stays what it is, whatever it is,
 *   without our having to ask (a frame saying SS_DISABLE would remove one).
 * - the xstate_size it declares is what the thread's own signal frames
 *   carry, fpstate->user_size: the standard-format size up to the highest
 *   default feature, AMX tile data included only once the thread uses it.
 *   Not the regset's size, which counts tile data on AMX machines and is
 *   then larger than user_size: sigreturn would restore FP/SSE only. The
 *   regset's own sw_reserved is not the signal format (its first word is
 *   the user XCR0, which is what we read from it).
 * - without NT_X86_XSTATE (no XSAVE) the FXSAVE image from NT_PRFPREG with
 *   no magic1, which the kernel restores as FP/SSE only; if neither can be
 *   read, fpstate NULL: sigreturn then resets the FPU (last resort).
 * No frame, and then the call runs at any 0f 05 as before, when glibc's
 * two sequences are not in the executable mappings (another libc, a static
 * binary without them), the stack below the red zone cannot be written
 * (process_vm_writev: no FOLL_FORCE, no stack growth, so only memory the
 * thread could write itself), its signal mask cannot be read, or it has a
 * user shadow stack (our `ret` would not match it). Then dying during a
 * call leaves the thread running on after that `syscall` with our registers.
 * The frame is written below the red zone, where a signal could have put
 * one at any moment: nothing of the thread's lives there. Not checked: a
 * thread running in a handler on its altstack with less than the frame's
 * size left below rsp (the kernel would refuse a nested frame there).
 *
 * The stops of a call. From the parked stop, PTRACE_SYSCALL (seized with
 * PTRACE_O_TRACESYSGOOD): syscall-entry stop, PTRACE_SYSCALL, syscall-exit
 * stop with the result in rax, then PTRACE_INTERRUPT + PTRACE_CONT: the
 * thread stops again in get_signal() (do_jobctl_trap comes before any
 * signal is dequeued) before it reaches user mode, that is before the
 * `ret`, and its registers and mask go back there. A dead tracer at a
 * syscall stop only lets the thread go on: ptrace_report_syscall() turns the
 * stop's code into a signal only if nobody collected it with wait, and
 * SIGTRAP|0x80 is not a valid signal, so not even then. No single step: a
 * dead tracer's TF would trap after the call (SIGTRAP, a core dump).
 *
 * Order of the writes. Registers before the mask when a call is set up,
 * mask before registers when they go back: at every point in between the
 * thread either has its own mask or registers that lead to the frame.
 *
 * Signals. During the call every signal is blocked but SIGTRAP, SIGSEGV and
 * SIGSYS: a signal delivered then would find the thread in our call, not in
 * its own (its handler would see our registers, and a call it interrupted
 * would restart where it should have failed with EINTR), while a blocked one
 * waits in the queue with its siginfo. The three stay open because
 * force_sig_info_to_task() resets the handler of a *blocked* forced signal
 * to SIG_DFL: a fault at the `syscall` and a seccomp trap are forced.
 * PTRACE_GETSIGMASK returns saved_sigmask when the thread is inside
 * ppoll/pselect/epoll_pwait with a mask, and PTRACE_SETSIGMASK clears the
 * restore flag (both since Linux 5.1), so putting the mask back is what the
 * kernel itself does when such a call restarts without a handler; the frame
 * carries that same mask. A foreign signal that stops the thread before the
 * call ran (rip unchanged) is delivered for real from the restored
 * registers (PTRACE_CONT with it, a trap pending), then the call is tried
 * again. A seccomp SECCOMP_RET_TRAP still reports the exit stop (-ENOSYS)
 * and leaves a SIGSYS queued: it is taken out (PTRACE_PEEKSIGINFO tells,
 * its signal-delivery-stop drops it) and the call fails with -EPERM.
 *
 * Code in the target. The two sequences, and a 0f 05 if they are not
 * there, in libc, then [vdso], then other executable file mappings, looked
 * for before the thread is stopped: glibc 2.36 has its 14 `syscall; ret`
 * some 390 KiB into its code, so the search reads that much (0.4 ms), which
 * the thread should not wait for. Without a frame, rip-2 first if the thread
 * sits just after a 0f 05 (it was in a call) on rip's page in an executable
 * mapping. Never [vsyscall]: that page is emulated and only its entry points
 * run.
 *
 * Test fault point: HALITE_INJECT_TEST_DIE=armed|entry|during|exit|back
 * kills this process (SIGKILL) once a call's registers and mask are set,
 * at its entry stop, right after resuming from it, at its exit stop, or in
 * the stop after it before the registers go back (tests/qemu/test_inject.c).
 * A variable of its own: HALITE_QEMU_TEST_FAULT (fault.c) rejects names it
 * does not know.
 */
#define _GNU_SOURCE
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

#include "inject.h"
#include "inject_int.h"

static int die_point(void)
{
	static const char *const names[] = { "", "armed", "entry", "during", "exit", "back" };
	const char *v = getenv("HALITE_INJECT_TEST_DIE");

	for (int i = DIE_ARMED; v && i <= DIE_BACK; i++)
		if (!strcmp(v, names[i]))
			return i;
	return DIE_NONE;
}

/* The test fault point: this whole process dies here, as under kill -9. */
static void test_die(const struct hq_inject *in, int point)
{
	if (in->die == point)
		kill(getpid(), SIGKILL);
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
		inj_seterr(err, errlen, "waiting for thread %d of process %d: %s", (int)in->tid,
		       (int)in->pid, ESTR(r < 0 ? errno : ECHILD));
		return -ESRCH;
	}
	if (WIFEXITED(*st) || WIFSIGNALED(*st)) {
		in->gone = true;
		if (WIFSIGNALED(*st))
			inj_seterr(err, errlen, "thread %d of process %d was killed by signal %d (%s) "
			       "during the injection", (int)in->tid, (int)in->pid, WTERMSIG(*st),
			       sigabbrev_np(WTERMSIG(*st)) ?: "?");
		else
			inj_seterr(err, errlen, "thread %d of process %d exited (status %d) during "
			       "the injection", (int)in->tid, (int)in->pid, WEXITSTATUS(*st));
		return -ESRCH;
	}
	return 0; /* WIFSTOPPED: no WCONTINUED asked */
}

/* A ptrace request failed: say which, and notice a thread that died. */
static int ptrace_failed(struct hq_inject *in, const char *what, char *err, size_t errlen)
{
	int e = errno;

	inj_seterr(err, errlen, "ptrace(%s) of thread %d of process %d: %s", what, (int)in->tid,
	       (int)in->pid, ESTR(e));
	if (e == ESRCH) {
		/* Out of its stop while traced: only SIGKILL (or exec) does that. */
		reap_gone(in);
		if (in->gone)
			inj_seterr(err, errlen, "thread %d of process %d was killed during the "
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
		if (inj_ptrace(PTRACE_CONT, in->tid, 0, (st >> 16) ? 0 : (uintptr_t)WSTOPSIG(st)))
			return ptrace_failed(in, "PTRACE_CONT", err, errlen);
	}
}

/* Registers and mask of the parked thread: what to put back, and the base of a call. */
static int snapshot(struct hq_inject *in, char *err, size_t errlen)
{
	if (inj_ptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&in->saved))
		return ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
	/* The kernel's sigset_t is 8 bytes here; addr must say so. */
	in->mask_saved = !inj_ptrace(PTRACE_GETSIGMASK, in->tid, sizeof(in->saved_mask),
				  (uintptr_t)&in->saved_mask);
	return 0;
}

/*
 * The thread's own registers and mask back (it is in some ptrace-stop). The
 * mask first: killed in between, the thread still has registers that lead
 * to the frame, which brings both back.
 */
static int put_back(struct hq_inject *in, char *err, size_t errlen)
{
	if (!in->dirty || in->gone)
		return 0;
	if (in->mask_saved && inj_ptrace(PTRACE_SETSIGMASK, in->tid, sizeof(in->saved_mask),
				      (uintptr_t)&in->saved_mask))
		return ptrace_failed(in, "PTRACE_SETSIGMASK", err, errlen);
	if (inj_ptrace(PTRACE_SETREGS, in->tid, 0, (uintptr_t)&in->saved))
		return ptrace_failed(in, "PTRACE_SETREGS", err, errlen);
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

	if (inj_ptrace(PTRACE_INTERRUPT, in->tid, 0, 0))
		return ptrace_failed(in, "PTRACE_INTERRUPT", err, errlen);
	if (inj_ptrace(PTRACE_CONT, in->tid, 0, (uintptr_t)sig))
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
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: it is this "
		       "process", (int)pid);
	else if (tracer)
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: thread %d "
		       "is already traced by process %ld%s", (int)pid, (int)tid, tracer,
		       tracer == getpid() ? " (this one: an injection session left open?)"
					  : " (a debugger, strace, another halite-qemu?)");
	else if (state == 'Z' || state == 'X')
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: thread %d "
		       "has exited%s", (int)pid, (int)tid, tid == pid ? " (pass another "
		       "thread's id if the process lives on)" : "");
	else if (scope == 3)
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: "
		       "kernel.yama.ptrace_scope is 3 (no attaching until reboot)", (int)pid);
	else if (geteuid() != 0 && scope > 0)
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: run as root "
		       "or set kernel.yama.ptrace_scope to 0 (now %d)", (int)pid, scope);
	else if (geteuid() != 0)
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed: run as root "
		       "(or with CAP_SYS_PTRACE), or as its user", (int)pid);
	else
		inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of process %d not allowed even for "
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
		inj_seterr(err, errlen, "hq_inject_begin: bad arguments (pid %d, tid %d)", (int)pid,
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
			inj_seterr(err, errlen, "no process %d", (int)pid);
		else if (e == ENOENT)
			inj_seterr(err, errlen, "no thread %d in process %d", (int)tid, (int)pid);
		else
			inj_seterr(err, errlen, "%s: %s", path, ESTR(e));
		return e == ENOENT ? -ESRCH : -e;
	}

	in = calloc(1, sizeof(*in));
	if (!in) {
		inj_seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	in->pid = pid;
	in->tid = tid;
	in->owner = gettid();
	in->mem = -1;
	in->die = die_point();
	/* While the thread runs; a failure is reported by the first call, which tries again. */
	inj_find_code(in, NULL, 0);
	/*
	 * No PTRACE_O_EXITKILL: QEMU must outlive a crash of ours. TRACESYSGOOD:
	 * syscall stops report SIGTRAP|0x80, which cannot become a signal (top).
	 */
	if (inj_ptrace(PTRACE_SEIZE, tid, 0, PTRACE_O_TRACESYSGOOD)) {
		ret = -errno;
		if (ret == -EPERM)
			explain_eperm(pid, tid, err, errlen);
		else if (ret == -ESRCH)
			inj_seterr(err, errlen, "no process %d (thread %d)", (int)pid, (int)tid);
		else
			inj_seterr(err, errlen, "ptrace(PTRACE_SEIZE) of thread %d of process %d: %s",
			       (int)tid, (int)pid, ESTR(-ret));
		free(in->maps);
		free(in);
		return ret;
	}
	if (inj_ptrace(PTRACE_INTERRUPT, tid, 0, 0))
		ret = ptrace_failed(in, "PTRACE_INTERRUPT", err, errlen);
	else
		ret = settle(in, err, errlen);
	if (!ret)
		ret = snapshot(in, err, errlen);
	if (!ret && in->saved.cs != USER64_CS) {
		inj_seterr(err, errlen, "thread %d of process %d runs 32-bit code (cs 0x%llx): "
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

/* Resume with @req (0 signal) and wait for the next stop. */
static int resume(struct hq_inject *in, int req, const char *what, int *st, char *err,
		  size_t errlen)
{
	if (inj_ptrace(req, in->tid, 0, 0))
		return ptrace_failed(in, what, err, errlen);
	in->parked = false;
	return wait_stop(in, st, err, errlen);
}

/* Whether a seccomp SIGSYS is queued for the thread (PTRACE_PEEKSIGINFO, Linux 3.10). */
static bool seccomp_trap_queued(struct hq_inject *in)
{
	struct __ptrace_peeksiginfo_args pa = { .off = 0, .flags = 0, .nr = 8 };
	siginfo_t si[8];
	long n = inj_ptrace(PTRACE_PEEKSIGINFO, in->tid, (uintptr_t)&pa, (uintptr_t)si);

	for (long i = 0; i < n; i++)
		if (si[i].si_signo == SIGSYS && si[i].si_code == SYS_SECCOMP)
			return true;
	return false;
}

/*
 * Parked after a call a seccomp filter trapped: let the thread dequeue the
 * forced SIGSYS and drop it at its signal-delivery-stop, delivering others
 * met on the way for real. Own registers and parked again after.
 */
static int drop_seccomp_trap(struct hq_inject *in, char *err, size_t errlen)
{
	for (int tries = 0; tries < MAX_RETRIES && seccomp_trap_queued(in); tries++) {
		siginfo_t si;
		int st, ret, sig;

		ret = resume(in, PTRACE_CONT, "PTRACE_CONT", &st, err, errlen);
		if (ret)
			return ret;
		if (st >> 16) {
			in->parked = true; /* a group stop: an event stop too */
			continue;
		}
		sig = WSTOPSIG(st);
		in->stop_sig = sig;
		if (inj_ptrace(PTRACE_GETSIGINFO, in->tid, 0, (uintptr_t)&si))
			return ptrace_failed(in, "PTRACE_GETSIGINFO", err, errlen);
		if (sig == SIGSYS && si.si_code == SYS_SECCOMP)
			sig = 0;
		in->stop_sig = 0;
		ret = put_back(in, err, errlen);
		if (!ret)
			ret = repark(in, sig, err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

int hq_inject_syscall(struct hq_inject *in, long nr, const long args[6], long *result,
		      char *err, size_t errlen)
{
	/* Blocked during the call: all but SIGTRAP, SIGSEGV, SIGSYS (see top). */
	uint64_t block = ~(1ull << (SIGTRAP - 1) | 1ull << (SIGSEGV - 1) | 1ull << (SIGSYS - 1));
	struct user_regs_struct regs;
	uint64_t ip = 0, frame = 0;
	siginfo_t si;
	int ret, sig, st;
	long res;

	if (!in || !args || !result || nr < 0) {
		inj_seterr(err, errlen, "hq_inject_syscall: bad arguments");
		return -EINVAL;
	}
	if (in->owner != gettid()) {
		inj_seterr(err, errlen, "the injection session of thread %d belongs to our thread %d, "
		       "not %d (ptrace obeys its tracer thread only)", (int)in->tid,
		       (int)in->owner, (int)gettid());
		return -EINVAL;
	}
	if (in->gone) {
		inj_seterr(err, errlen, "thread %d of process %d is gone", (int)in->tid, (int)in->pid);
		return -ESRCH;
	}
	if (!in->parked) {
		inj_seterr(err, errlen, "the injection session of thread %d is unusable after an "
		       "earlier error", (int)in->tid);
		return -EIO;
	}
	if (!in->syscall_ip) {
		ret = inj_find_code(in, err, errlen);
		if (ret)
			return ret;
	}

	/* Up to the syscall-entry stop; a foreign signal first is delivered, then again. */
	for (int tries = 0;; tries++) {
		if (tries >= MAX_RETRIES) {
			inj_seterr(err, errlen, "thread %d of process %d: the call did not start "
			       "after %d signals or stops", (int)in->tid, (int)in->pid, tries);
			ret = -EAGAIN;
			goto fail;
		}
		/* A new frame each time: a delivered signal changes what the thread is. */
		frame = inj_write_frame(in);
		ip = frame ? in->gadget_ip : inj_bare_syscall_ip(in);
		regs = in->saved;
		regs.rip = ip;
		if (frame)
			regs.rsp = frame;
		regs.orig_rax = (unsigned long long)-1; /* no restart logic for the injected call */
		regs.rax = (unsigned long long)nr;
		regs.rdi = (unsigned long long)args[0];
		regs.rsi = (unsigned long long)args[1];
		regs.rdx = (unsigned long long)args[2];
		regs.r10 = (unsigned long long)args[3];
		regs.r8 = (unsigned long long)args[4];
		regs.r9 = (unsigned long long)args[5];
		in->dirty = true;
		if (inj_ptrace(PTRACE_SETREGS, in->tid, 0, (uintptr_t)&regs)) {
			ret = ptrace_failed(in, "PTRACE_SETREGS", err, errlen);
			goto fail;
		}
		if (in->mask_saved &&
		    inj_ptrace(PTRACE_SETSIGMASK, in->tid, sizeof(block), (uintptr_t)&block)) {
			ret = ptrace_failed(in, "PTRACE_SETSIGMASK", err, errlen);
			goto fail;
		}
		test_die(in, DIE_ARMED);
		/* A stray event stop (group stop) comes before the call runs: on. */
		do {
			ret = resume(in, PTRACE_SYSCALL, "PTRACE_SYSCALL", &st, err, errlen);
			if (ret)
				goto fail;
		} while ((st >> 16) && ++tries < MAX_RETRIES);
		if (st >> 16) {
			in->parked = true;
			continue; /* reports the retry limit */
		}
		sig = WSTOPSIG(st);
		if (sig == SYSCALL_STOP)
			break;
		in->stop_sig = sig;
		if (inj_ptrace(PTRACE_GETSIGINFO, in->tid, 0, (uintptr_t)&si)) {
			ret = ptrace_failed(in, "PTRACE_GETSIGINFO", err, errlen);
			goto fail;
		}
		if (inj_ptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&regs)) {
			ret = ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
			goto fail;
		}
		if (si.si_code > 0 && regs.rip == ip &&
		    (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL)) {
			in->stop_sig = 0; /* ours: the target never sees it */
			inj_seterr(err, errlen, "the syscall instruction at 0x%llx in process %d "
			       "faulted (%s)", (unsigned long long)ip, (int)in->pid,
			       sigabbrev_np(sig) ?: "?");
			ret = -EFAULT;
			goto fail;
		}
		if (regs.rip != ip) {
			inj_seterr(err, errlen, "thread %d of process %d stopped with signal %d at "
			       "0x%llx, not at the injected call at 0x%llx", (int)in->tid,
			       (int)in->pid, sig, (unsigned long long)regs.rip,
			       (unsigned long long)ip);
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

	/* The entry stop: the call runs once we resume, and ends in the exit stop. */
	test_die(in, DIE_ENTRY);
	if (inj_ptrace(PTRACE_SYSCALL, in->tid, 0, 0)) {
		ret = ptrace_failed(in, "PTRACE_SYSCALL", err, errlen);
		goto fail;
	}
	test_die(in, DIE_DURING);
	ret = wait_stop(in, &st, err, errlen);
	if (ret)
		goto fail;
	if ((st >> 16) || WSTOPSIG(st) != SYSCALL_STOP) {
		in->stop_sig = (st >> 16) ? 0 : WSTOPSIG(st);
		inj_seterr(err, errlen, "thread %d of process %d: stop 0x%x, not the end of the "
		       "injected call", (int)in->tid, (int)in->pid, st);
		ret = -EPROTO;
		goto fail;
	}
	if (inj_ptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&regs)) {
		ret = ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
		goto fail;
	}
	res = (long)regs.rax;
	test_die(in, DIE_EXIT);

	/* Parked again before user mode, so before the `ret`: own registers back there. */
	if (inj_ptrace(PTRACE_INTERRUPT, in->tid, 0, 0)) {
		ret = ptrace_failed(in, "PTRACE_INTERRUPT", err, errlen);
		goto fail;
	}
	if (inj_ptrace(PTRACE_CONT, in->tid, 0, 0)) {
		ret = ptrace_failed(in, "PTRACE_CONT", err, errlen);
		goto fail;
	}
	ret = settle(in, err, errlen);
	if (ret)
		goto fail;
	test_die(in, DIE_BACK);
	if (inj_ptrace(PTRACE_GETREGS, in->tid, 0, (uintptr_t)&regs)) {
		ret = ptrace_failed(in, "PTRACE_GETREGS", err, errlen);
		goto fail;
	}
	if (regs.rip != ip + 2) {
		inj_seterr(err, errlen, "thread %d of process %d stopped at 0x%llx after the "
		       "injected call at 0x%llx, not right after it", (int)in->tid, (int)in->pid,
		       (unsigned long long)regs.rip, (unsigned long long)ip);
		ret = -EPROTO;
		goto fail;
	}
	if (seccomp_trap_queued(in)) {
		ret = drop_seccomp_trap(in, err, errlen);
		if (!ret) {
			inj_seterr(err, errlen, "a seccomp filter of process %d traps system call %ld",
			       (int)in->pid, nr);
			ret = -EPERM;
		}
		goto fail;
	}
	ret = put_back(in, err, errlen);
	if (ret)
		goto fail;
	*result = res;
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
		if (inj_ptrace(PTRACE_DETACH, in->tid, 0, (uintptr_t)in->stop_sig) && errno == ESRCH)
			reap_gone(in);
	}
	if (in->mem >= 0)
		close(in->mem);
	free(in->fpbuf);
	free(in->maps);
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
		inj_seterr(err, errlen, "hq_fd_from_process: bad arguments (pid %d, fd %d)", (int)pid,
		       remote_fd);
		return -EINVAL;
	}
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0) {
		e = errno;
		if (e == ESRCH)
			inj_seterr(err, errlen, "pidfd_open(%d): no process %d", (int)pid, (int)pid);
		else if (e == EINVAL)
			inj_seterr(err, errlen, "pidfd_open(%d): %s: not a process id (a thread id?)",
			       (int)pid, ESTR(e));
		else
			inj_seterr(err, errlen, "pidfd_open(%d): %s%s", (int)pid, ESTR(e),
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
		inj_seterr(err, errlen, "pidfd_getfd: process %d has no descriptor %d", (int)pid,
		       remote_fd);
	else if (e == EPERM)
		inj_seterr(err, errlen, "pidfd_getfd of descriptor %d of process %d not allowed "
		       "(ptrace access rules: run as root)", remote_fd, (int)pid);
	else
		inj_seterr(err, errlen, "pidfd_getfd(process %d, descriptor %d): %s%s", (int)pid,
		       remote_fd, ESTR(e), e == ENOSYS ? ": the kernel is older than 5.6" : "");
	return -e;
}
