// SPDX-License-Identifier: MIT
/*
 * Where an injected call runs in the target and how the thread gets back
 * should we die meanwhile (inject.c's top comment, "A way back that needs
 * no tracer" and "Code in the target"): the target's executable mappings
 * searched for `syscall; ret`, glibc's __restore_rt and a bare 0f 05, and
 * the x86-64 signal frame, with the thread's registers, mask and FPU
 * state, written below its red zone before each call.
 */
#define _GNU_SOURCE
#include "inject_int.h"

/* The signal frame of x86-64 (arch/x86/include/asm/sigframe.h, uapi sigcontext.h, ucontext.h) */
struct k_sigcontext {
	uint64_t r8, r9, r10, r11, r12, r13, r14, r15;
	uint64_t di, si, bp, bx, dx, ax, cx, sp, ip, flags;
	uint16_t cs, gs, fs, ss;
	uint64_t err, trapno, oldmask, cr2;
	uint64_t fpstate;	/* the FXSAVE/XSAVE image, or 0 */
	uint64_t reserved1[8];
};

struct k_ucontext {
	uint64_t uc_flags;
	uint64_t uc_link;
	struct {
		uint64_t ss_sp;
		int32_t ss_flags;
		int32_t pad;
		uint64_t ss_size;
	} uc_stack;
	struct k_sigcontext uc_mcontext;
	uint64_t uc_sigmask;	/* the kernel's sigset_t: 8 bytes */
};

struct k_rt_sigframe {
	uint64_t pretcode;	/* popped by the `ret`; rt_sigreturn finds uc right above */
	struct k_ucontext uc;
	uint8_t info[128];	/* siginfo: unused by rt_sigreturn, there for the size it checks */
};

_Static_assert(sizeof(struct k_sigcontext) == 256, "struct sigcontext_64");
_Static_assert(offsetof(struct k_ucontext, uc_mcontext) == 40, "uc_mcontext");
_Static_assert(offsetof(struct k_ucontext, uc_sigmask) == 296, "uc_sigmask");
_Static_assert(offsetof(struct k_rt_sigframe, uc) == 8, "rt_sigframe.uc");

#define UC_FP_XSTATE 0x1
#define UC_SIGCONTEXT_SS 0x2
#define UC_STRICT_RESTORE_SS 0x4	/* ss exactly as saved, no force_valid_ss() */

/* FXSAVE/XSAVE layout (uapi asm/sigcontext.h) */
#define FXSAVE_SIZE 512
#define XSAVE_HDR_SIZE 64
#define SW_RESERVED 464		/* struct _fpx_sw_bytes in the FXSAVE area */
#ifndef FP_XSTATE_MAGIC1	/* glibc's bits/sigcontext.h has them */
#define FP_XSTATE_MAGIC1 0x46505853U
#define FP_XSTATE_MAGIC2 0x46505845U
#define FP_XSTATE_MAGIC2_SIZE 4
#endif
#define XFEATURE_XTILE_DATA 18	/* the one dynamic (XFD) feature: AMX tile data */
#define XSTATE_BUF_SIZE 65536	/* the regset is fpu_user_cfg.max_size: 11008 with AMX */

struct fpx_sw_bytes {
	uint32_t magic1;
	uint32_t extended_size;	/* xstate_size + FP_XSTATE_MAGIC2_SIZE */
	uint64_t xfeatures;
	uint32_t xstate_size;
	uint32_t padding[7];
};

_Static_assert(sizeof(struct fpx_sw_bytes) == 48, "struct _fpx_sw_bytes");

/* syscall; ret. And glibc's __restore_rt: mov $15 (__NR_rt_sigreturn),%rax; syscall */
static const uint8_t syscall_ret[] = { 0x0f, 0x05, 0xc3 };
static const uint8_t restore_rt[] = { 0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05 };

int inj_read_mem(struct hq_inject *in, uint64_t addr, void *buf, size_t len)
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

/* First @pat in [start, end) read in chunks of @size overlapping by the pattern less a byte. */
static uint64_t scan_range(struct hq_inject *in, uint64_t start, uint64_t end, uint8_t *buf,
			   size_t size, const uint8_t *pat, size_t plen)
{
	for (uint64_t a = start; a + plen <= end; a += size - (plen - 1)) {
		size_t n = end - a < size ? (size_t)(end - a) : size;
		const uint8_t *hit;

		if (inj_read_mem(in, a, buf, n))
			return 0;
		hit = memmem(buf, n, pat, plen);
		if (hit)
			return a + (uint64_t)(hit - buf);
		if (n < size)
			break;
	}
	return 0;
}

/* Whether the thread runs with a user shadow stack (CET): a `ret` of ours would not match it. */
bool inj_has_shadow_stack(const struct hq_inject *in)
{
	char path[64], line[256];
	bool on = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)in->pid, (int)in->tid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "x86_Thread_features:", 20))
			on = strstr(line + 20, "shstk") != NULL;
	fclose(f);
	return on;
}

/*
 * The executable mappings, and the code in them the calls use (see top).
 * Run before the thread is stopped: reading libc takes a while.
 */
int inj_find_code(struct hq_inject *in, char *err, size_t errlen)
{
	static const uint8_t bare[] = { 0x0f, 0x05 };
	struct xmap *maps = NULL;
	size_t n = 0, cap = 0, linecap = 0;
	char path[64], *line = NULL;
	uint8_t *buf;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)in->pid);
	f = fopen(path, "re");
	if (!f) {
		int e = errno;

		inj_seterr(err, errlen, "%s: %s", path, ESTR(e));
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
		if (!strncmp(name, "[vdso]", 6))
			rank = 2;
		else if (name[0] == '[')
			continue; /* [vsyscall], [uprobes] */
		else if (name[0] == '\n' || !name[0])
			rank = 0; /* anonymous (JIT) code: only for the rip-2 check */
		else if (strstr(name, "/libc.so") || strstr(name, "/libc-"))
			rank = 1;
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

	buf = malloc(65536);
	for (int rank = 1; buf && rank <= 3; rank++)
		for (size_t i = 0; i < n; i++) {
			if (maps[i].rank != rank)
				continue;
			if (!in->gadget_ip)
				in->gadget_ip = scan_range(in, maps[i].start, maps[i].end, buf,
							   65536, syscall_ret, sizeof(syscall_ret));
			if (!in->restorer_ip)
				in->restorer_ip = scan_range(in, maps[i].start, maps[i].end, buf,
							     65536, restore_rt, sizeof(restore_rt));
			if (!in->gadget_ip && !in->syscall_ip)
				in->syscall_ip = scan_range(in, maps[i].start, maps[i].end, buf,
							    65536, bare, sizeof(bare));
		}
	free(buf);
	if (in->gadget_ip)
		in->syscall_ip = in->gadget_ip; /* a 0f 05 too */
	free(in->maps);
	in->maps = maps;
	in->nmaps = n;
	in->shstk = inj_has_shadow_stack(in);
	if (!in->syscall_ip) {
		inj_seterr(err, errlen, "no syscall instruction (0f 05) found in the executable "
		       "mappings of process %d", (int)in->pid);
		return -ENOEXEC;
	}
	return 0;
}

/*
 * For a call without a frame: the thread's own 0f 05 at rip-2 if it sits
 * just after one (it was in a call), on rip's page and in an executable
 * mapping, so it is left where it was if we die; else the one found.
 */
uint64_t inj_bare_syscall_ip(struct hq_inject *in)
{
	uint64_t rip = in->saved.rip;
	uint8_t insn[2];

	if ((rip & 4095) < 2)
		return in->syscall_ip;
	for (size_t i = 0; i < in->nmaps; i++)
		if (rip - 2 >= in->maps[i].start && rip <= in->maps[i].end &&
		    !inj_read_mem(in, rip - 2, insn, 2) && insn[0] == 0x0f && insn[1] == 0x05)
			return rip - 2;
	return in->syscall_ip;
}

/*
 * The thread's FPU state as a signal frame carries it, in in->fpbuf; its
 * length (0: none, the frame then has fpstate NULL) and *xsave whether it is
 * an XSAVE image (else FXSAVE). See the top for the sizes.
 */
size_t inj_read_fpstate(struct hq_inject *in, bool *xsave)
{
	struct iovec iov = { in->fpbuf, XSTATE_BUF_SIZE };
	struct fpx_sw_bytes sw = { 0 };
	uint64_t max, bv, want;
	unsigned int eax, ebx, ecx, edx, top;
	uint32_t size = FXSAVE_SIZE + XSAVE_HDR_SIZE, magic2 = FP_XSTATE_MAGIC2;

	*xsave = false;
	if (!inj_ptrace(PTRACE_GETREGSET, in->tid, NT_X86_XSTATE, (uintptr_t)&iov) &&
	    iov.iov_len >= size) {
		memcpy(&max, in->fpbuf + SW_RESERVED, 8);	/* the user XCR0 */
		memcpy(&bv, in->fpbuf + FXSAVE_SIZE, 8);	/* XSTATE_BV */
		want = (max & ~(1ull << XFEATURE_XTILE_DATA)) | (bv & max) | 3;
		top = 63 - (unsigned int)__builtin_clzll(want);
		if (top >= 2 && __get_cpuid_count(0xd, top, &eax, &ebx, &ecx, &edx) &&
		    ebx + eax > size)
			size = ebx + eax;	/* standard-format offset + size of the top feature */
		/* MAGIC2 after the image: in our buffer, past what the regset filled if need be. */
		if (size <= iov.iov_len && size + FP_XSTATE_MAGIC2_SIZE <= XSTATE_BUF_SIZE) {
			sw.magic1 = FP_XSTATE_MAGIC1;
			sw.extended_size = size + FP_XSTATE_MAGIC2_SIZE;
			sw.xfeatures = want;
			sw.xstate_size = size;
			memcpy(in->fpbuf + SW_RESERVED, &sw, sizeof(sw));
			memcpy(in->fpbuf + size, &magic2, sizeof(magic2));
			*xsave = true;
			return size + FP_XSTATE_MAGIC2_SIZE;
		}
	}
	/* No XSAVE: FP/SSE only, no magic1 (check_xstate_in_sigframe's fx-only path). */
	iov = (struct iovec){ in->fpbuf, FXSAVE_SIZE };
	if (!inj_ptrace(PTRACE_GETREGSET, in->tid, NT_PRFPREG, (uintptr_t)&iov) &&
	    iov.iov_len == FXSAVE_SIZE) {
		memset(in->fpbuf + SW_RESERVED, 0, FXSAVE_SIZE - SW_RESERVED);
		return FXSAVE_SIZE;
	}
	return 0;
}

/*
 * Write the frame that brings the thread back to in->saved by itself (see
 * the top) below its red zone; its address, or 0 when there cannot be one.
 */
uint64_t inj_write_frame(struct hq_inject *in)
{
	const struct user_regs_struct *r = &in->saved;
	struct k_rt_sigframe f = { 0 };
	struct k_sigcontext *sc = &f.uc.uc_mcontext;
	uint64_t top, fp = 0, frame, ax = r->rax, ip = r->rip;
	size_t fplen = 0, len;
	bool xsave = false;
	struct iovec local[3], remote;
	uint8_t gap[64] = { 0 };
	int nl = 0;

	if (!in->gadget_ip || !in->restorer_ip || in->shstk || !in->mask_saved)
		return 0;
	if (r->rsp < RED_ZONE + sizeof(f) + XSTATE_BUF_SIZE + 4096)
		return 0; /* not a stack */
	if (!in->fpbuf && !(in->fpbuf = malloc(XSTATE_BUF_SIZE)))
		return 0;
	fplen = inj_read_fpstate(in, &xsave);

	top = r->rsp - RED_ZONE;
	/* As get_sigframe(): fpstate 64-byte aligned, the frame 16-byte aligned less 8. */
	if (fplen)
		fp = (top - fplen) & ~63ull;
	frame = (((fplen ? fp : top) - sizeof(f)) & ~15ull) - 8;

	/*
	 * What arch_do_signal_or_restart() would do next without a handler,
	 * but the call itself again for the restart block too (see top).
	 */
	if (r->orig_rax != (unsigned long long)-1) {
		switch ((long)r->rax) {
		case -ERESTARTSYS:
		case -ERESTARTNOINTR:
		case -ERESTARTNOHAND:
		case -ERESTART_RESTARTBLOCK:
			ax = r->orig_rax;
			ip = r->rip - 2;
			break;
		}
	}

	f.pretcode = in->restorer_ip;
	f.uc.uc_flags = UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS | (xsave ? UC_FP_XSTATE : 0);
	f.uc.uc_stack.ss_flags = SS_ONSTACK | SS_DISABLE; /* an invalid mode: altstack untouched */
	sc->r8 = r->r8;
	sc->r9 = r->r9;
	sc->r10 = r->r10;
	sc->r11 = r->r11;
	sc->r12 = r->r12;
	sc->r13 = r->r13;
	sc->r14 = r->r14;
	sc->r15 = r->r15;
	sc->di = r->rdi;
	sc->si = r->rsi;
	sc->bp = r->rbp;
	sc->bx = r->rbx;
	sc->dx = r->rdx;
	sc->ax = ax;
	sc->cx = r->rcx;
	sc->sp = r->rsp;
	sc->ip = ip;
	sc->flags = r->eflags;
	sc->cs = (uint16_t)r->cs;
	sc->ss = (uint16_t)r->ss;
	sc->oldmask = in->saved_mask;
	sc->fpstate = fp;
	f.uc.uc_sigmask = in->saved_mask;

	/* One write: the frame, zeros up to fpstate, the FPU image. */
	local[nl++] = (struct iovec){ &f, sizeof(f) };
	len = sizeof(f);
	if (fplen) {
		size_t between = fp - (frame + sizeof(f));

		if (between > sizeof(gap))
			return 0;	/* cannot happen: both are aligned to at most 64 */
		if (between)
			local[nl++] = (struct iovec){ gap, between };
		local[nl++] = (struct iovec){ in->fpbuf, fplen };
		len += between + fplen;
	}
	remote = (struct iovec){ (void *)(uintptr_t)frame, len };
	if (process_vm_writev(in->pid, local, (unsigned long)nl, &remote, 1, 0) != (ssize_t)len)
		return 0;
	return frame;
}
