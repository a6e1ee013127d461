// SPDX-License-Identifier: MIT
/*
 * halite-qemu's test fault points (STYLE.md: named, reachable from tests):
 * a QEMU that hangs or a command or reply lost at the moment that matters,
 * which a real QEMU does too rarely to test by waiting. All of them live in
 * this file and do nothing unless the environment variable
 * HALITE_QEMU_TEST_FAULT names one (tests/qemu, case runstate):
 *
 *   stop-reply-lost   the pause's stop is sent and its reply not awaited,
 *                     as if it had timed out (QEMU does pause the guest)
 *   hang-at-stop:MS   QEMU is stopped (SIGSTOP) before the pause's stop,
 *                     which then times out after 200 ms; QEMU gets SIGCONT
 *                     MS ms later and only then runs the stop
 *   cont-lost         the first cont never reaches QEMU; the caller sees a
 *                     timeout
 *   cont-reply-lost   the first cont is sent and its reply not awaited, as
 *                     if it had timed out (QEMU does resume the guest)
 *   fail-before-arm   save: a failure after the pause, the roots and the
 *                     device state, before copy-on-access is armed
 *   hold-after-arm:MS save: once armed and resumed, MS ms before the save is
 *                     let finish (its registration held, whatever the
 *                     engine does: a second save or a balloon meets it)
 *   die-before-load   restore: SIGKILL to itself once the engine runs,
 *                     before the device state is sent (restore --attach
 *                     must load it)
 *
 * Each fires once per run. The state is this file's own (the environment
 * is the process's anyway); nothing else in halite-qemu keeps any.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"

#define HANG_STOP_TIMEOUT_MS 200

static const char *const names[] = { "stop-reply-lost", "hang-at-stop", "cont-lost",
				     "cont-reply-lost", "fail-before-arm", "hold-after-arm",
				     "die-before-load" };
#define HANG_AT_STOP 1
#define HOLD_AFTER_ARM 5

static struct {
	int point;	/* index in names, or -1 */
	unsigned ms;	/* hang-at-stop, hold-after-arm */
	bool fired;
	bool thread;	/* the SIGCONT thread runs */
	pthread_t tid;
	pid_t pid;
} fault = { .point = -1 };

int hq_fault_init(char *err, size_t len)
{
	const char *v = getenv("HALITE_QEMU_TEST_FAULT");
	size_t n;

	if (!v || !*v)
		return 0;
	n = strcspn(v, ":");
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i]) == n && !strncmp(v, names[i], n))
			fault.point = (int)i;
	if (fault.point == HANG_AT_STOP || fault.point == HOLD_AFTER_ARM) {
		char *end;
		unsigned long ms = v[n] == ':' ? strtoul(v + n + 1, &end, 10) : 0;

		if (v[n] != ':' || *end || !ms || ms > 600000) {
			snprintf(err, len, "HALITE_QEMU_TEST_FAULT=%s: %s:MS, MS 1..600000", v,
				 names[fault.point]);
			return -EINVAL;
		}
		fault.ms = (unsigned)ms;
	} else if (fault.point < 0 || v[n]) {
		snprintf(err, len, "HALITE_QEMU_TEST_FAULT=%s: not a fault point (stop-reply-lost, "
			 "hang-at-stop:MS, cont-lost, cont-reply-lost, fail-before-arm, "
			 "hold-after-arm:MS, die-before-load)", v);
		return -EINVAL;
	}
	return 0;
}

/* Whether fault point @name is set and has not fired yet; it fires now. */
bool hq_fault(const char *name)
{
	if (fault.point < 0 || fault.fired || strcmp(names[fault.point], name))
		return false;
	fault.fired = true;
	return true;
}

unsigned hq_fault_ms(const char *name)
{
	return hq_fault(name) ? fault.ms : 0;
}

static void *sigcont_later(void *arg)
{
	struct timespec ts = { fault.ms / 1000, (long)(fault.ms % 1000) * 1000000 };

	(void)arg;
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	kill(fault.pid, SIGCONT);
	return NULL;
}

bool hq_fault_runstate(struct hq_vm *vm, const char *cmd, int *ret)
{
	bool stop = !strcmp(cmd, "stop");

	if (stop && hq_fault("stop-reply-lost")) {
		*ret = hq_qmp_send(vm->qmp, cmd);
	} else if (stop && hq_fault("hang-at-stop")) {
		fault.pid = vm->pid;
		if (kill(vm->pid, SIGSTOP)) {
			*ret = -errno;
			hq_vmsetf(vm, "stop: test fault hang-at-stop: kill: %s", strerror(errno));
			return true;
		}
		fault.thread = !pthread_create(&fault.tid, NULL, sigcont_later, NULL);
		if (!fault.thread)
			kill(vm->pid, SIGCONT);
		*ret = hq_qmp_call(vm->qmp, cmd, NULL, NULL, HANG_STOP_TIMEOUT_MS);
		if (*ret)
			hq_vmsetf(vm, "%s (test fault hang-at-stop:%u)", hq_qmp_errmsg(vm->qmp),
				  fault.ms);
		return true;
	} else if (!stop && hq_fault("cont-lost")) {
		*ret = 0;
	} else if (!stop && hq_fault("cont-reply-lost")) {
		*ret = hq_qmp_send(vm->qmp, cmd);
	} else {
		return false;
	}
	if (!*ret) {
		*ret = -ETIMEDOUT;
		hq_vmsetf(vm, "%s: no answer from QEMU (test fault %s)", cmd, names[fault.point]);
	} else {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
	}
	return true;
}

void hq_fault_end(void)
{
	/* A QEMU stopped by hang-at-stop gets its SIGCONT before we go, always. */
	if (fault.thread)
		pthread_join(fault.tid, NULL);
	fault.thread = false;
}
