/* SPDX-License-Identifier: MIT */
/*
 * Run a system call inside another process with ptrace (x86-64 only), and
 * bring one of its descriptors here with pidfd_getfd. halite-qemu uses it to
 * create a userfaultfd inside QEMU, to drop QEMU's page-table entries of
 * guest RAM (madvise MADV_DONTNEED, mremap, munmap) and to close what it
 * created. Only calls without pointer arguments. The one thing written into
 * the target's memory is, before each call, a signal frame on the thread's
 * stack below its red zone, where a signal could have put one anyway.
 *
 * The target thread is stopped for the session only (PTRACE_SEIZE +
 * PTRACE_INTERRUPT, well under a millisecond per call plus the call itself)
 * and left with its registers and signal mask as they were, so a blocking
 * call it was in (ppoll, read, futex, nanosleep) restarts as after a signal
 * without a handler, and a signal sent to it meanwhile is delivered
 * afterwards with its siginfo. Calls that Linux never restarts (epoll_wait,
 * sigtimedwait, semop: signal(7)) fail with EINTR in the target, as they do
 * under SIGSTOP/SIGCONT or strace. The target is never killed if we die (no
 * PTRACE_O_EXITKILL), at any instant: the kernel then detaches it, parked
 * between calls with its own registers and mask, or during a call with
 * registers that make it finish the call and return through rt_sigreturn
 * and that frame to its own registers, mask and FPU state (inject.c says
 * how, and the few cases without a frame, where dying during a call is not
 * survived). Whether an injected call took effect is then the caller's
 * business (a record, as save --recover keeps); a timed sleep or poll the
 * thread was in starts over with its whole timeout.
 *
 * Rules for the caller:
 * - A session (begin .. end) belongs to the thread that began it: ptrace
 *   tracers are threads. Different sessions may run in different threads,
 *   never two on the same target thread.
 * - While a session is open, no thread of this process may reap children
 *   with wait()/waitpid(-1, ...): that would take the target's stops and the
 *   session would wait forever. Wait for specific pids instead. If the
 *   target is our own child and dies during a session, its exit status is
 *   reaped here.
 * - Calls must not block (or only briefly) and must not use the thread's
 *   restart block (nanosleep, poll): the session waits for the call.
 * - Waits have no timeout: a thread in uninterruptible sleep stops when it
 *   leaves it. If this process is killed meanwhile, the thread is released
 *   untouched.
 * All functions return 0 (or a descriptor) or -errno, with a message in
 * @err (NULL or @errlen 0: no message); out-parameters are written only on
 * success.
 */
#ifndef HALITE_QEMU_INJECT_H
#define HALITE_QEMU_INJECT_H

#include <stddef.h>
#include <sys/types.h>

struct hq_inject;

/*
 * Seize thread @tid of process @pid (0: the main thread, tid = pid) and stop
 * it, ready to run system calls in it; *ip gets the session, which
 * hq_inject_end() frees. -ESRCH: no such process or thread; -EPERM: the
 * message says why (yama ptrace_scope, already traced, ...); -ENOEXEC: the
 * thread runs 32-bit code.
 */
int hq_inject_begin(struct hq_inject **ip, pid_t pid, pid_t tid, char *err, size_t errlen);

/*
 * Run system call @nr with @args (rdi, rsi, rdx, r10, r8, r9; unused ones
 * are passed too, 0 is fine) in the stopped thread; *result gets its raw
 * return (-errno when the call failed in the target). 0, or -errno when the
 * injection itself failed: -ESRCH the thread died, -EFAULT the syscall
 * instruction faulted, -EPERM a seccomp filter trapped the call (the target
 * does not see that signal; the session goes on), -ENOEXEC no syscall
 * instruction found, -EAGAIN too many foreign signals or stops before the
 * call could start, -EPROTO the thread stopped where it should not have,
 * -EINVAL called from another thread than hq_inject_begin(). After a failure
 * the session may still be ended (and must be).
 */
int hq_inject_syscall(struct hq_inject *in, long nr, const long args[6], long *result,
		      char *err, size_t errlen);

/*
 * Put the thread's registers and signal mask back exactly and let it go
 * (PTRACE_DETACH), delivering a signal that our stop took from it. Frees
 * @in; NULL is fine.
 */
void hq_inject_end(struct hq_inject *in);

/* hq_inject_begin() on the main thread of @pid, one call, hq_inject_end(). */
int hq_inject_one(pid_t pid, long nr, const long args[6], long *result, char *err,
		  size_t errlen);

/*
 * Descriptor @remote_fd of process @pid as a new descriptor here (O_CLOEXEC),
 * sharing the open file: pidfd_open + pidfd_getfd (Linux 5.6). The new
 * descriptor, or -errno: -ESRCH no such process, -EBADF @pid has no
 * descriptor @remote_fd, -EPERM not allowed (ptrace access rules).
 */
int hq_fd_from_process(pid_t pid, int remote_fd, char *err, size_t errlen);

#endif
