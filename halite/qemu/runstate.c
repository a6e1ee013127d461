// SPDX-License-Identifier: MIT
/*
 * The guest's run state (QMP stop, cont, query-status), kept right whatever
 * QEMU did with earlier commands. A stop whose reply timed out may still
 * take effect later (QEMU runs commands in order, once its main loop gets to
 * them); a cont that timed out may never have reached QEMU, or may have run
 * with only its reply lost. So no exit path trusts what it last sent:
 * hq_vm_settle() asks query-status, sends stop or cont if the state is not
 * the one wanted, and asks again, until query-status says so or its
 * deadline passes. Replies are matched by id (qmp.c), so a late reply to an
 * earlier stop is never taken for the answer to a later query; a connection
 * QEMU closed is opened again (QEMU serves the next client once the old one
 * is closed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "fault.h"
#include "runstate.h"

/*
 * The only place a stop or cont is sent: the test fault points may take it
 * over. vm->run_seen follows what QEMU answered.
 */
static int runstate_cmd(struct hq_vm *vm, const char *cmd, int timeout_ms)
{
	int r;

	vm->run_seen = 0;
	if (!hq_fault_runstate(vm, cmd, &r)) {
		r = hq_qmp_call(vm->qmp, cmd, NULL, NULL, timeout_ms);
		if (r)
			hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
	}
	if (!r)
		vm->run_seen = strcmp(cmd, "cont") ? -1 : 1;
	return r;
}

/* query-status within @timeout_ms into @buf; vm->run_seen follows. */
static int query_status(struct hq_vm *vm, char *buf, size_t len, int timeout_ms)
{
	cJSON *ret = NULL;
	const char *st;
	int r;

	vm->run_seen = 0;
	r = hq_qmp_call(vm->qmp, "query-status", NULL, &ret, timeout_ms);
	if (r) {
		hq_vmsetf(vm, "%s", hq_qmp_errmsg(vm->qmp));
		return r;
	}
	st = cJSON_GetStringValue(cJSON_GetObjectItem(ret, "status"));
	snprintf(buf, len, "%s", st ? st : "?");
	cJSON_Delete(ret);
	vm->run_seen = !strcmp(buf, "running") ? 1 : !strcmp(buf, "paused") ? -1 : 0;
	return 0;
}

int hq_vm_status(struct hq_vm *vm, char *buf, size_t len)
{
	return query_status(vm, buf, len, HQ_QMP_TIMEOUT_MS);
}

int hq_vm_stop(struct hq_vm *vm, int timeout_ms)
{
	return runstate_cmd(vm, "stop", timeout_ms);
}

/* QEMU has exited (a zombie child of a restore included): no point in waiting. */
static bool qemu_gone(pid_t pid)
{
	char st = hq_proc_state(pid);

	return !st || st == 'Z' || st == 'X';
}

/* Worth another try before the deadline: QEMU slow, or the connection lost. */
static bool transient(int r)
{
	return r == -ETIMEDOUT || r == -ECONNRESET || r == -EPIPE || r == -ECONNREFUSED ||
	       r == -ENOENT;
}

int hq_vm_settle(struct hq_vm *vm, bool running, int timeout_ms, uint64_t *t_changed)
{
	const char *want = running ? "running" : "paused";
	uint64_t deadline = hq_now_ns() + (uint64_t)timeout_ms * 1000000;
	/*
	 * From the last answer: 0 unknown, 1 the state wanted (to be confirmed
	 * by query-status), -1 the other one (stop or cont to send).
	 */
	int seen = vm->run_seen * (running ? 1 : -1);
	char st[32], last[sizeof(vm->err)] = "";
	int r = 0;

	for (;;) {
		uint64_t now = hq_now_ns();
		int left = now < deadline ? (int)((deadline - now) / 1000000) : 0;

		if (left <= 0) {
			hq_vmsetf(vm, "QEMU did not confirm the guest %s within %g s%s%s%s", want,
				  timeout_ms / 1000.0, last[0] ? " (" : "", last, last[0] ? ")" : "");
			return -ETIMEDOUT;
		}
		if (!hq_qmp_usable(vm->qmp)) {
			r = hq_qmp_reconnect(vm->qmp, left);
			if (r) {
				snprintf(last, sizeof(last), "%s", hq_qmp_errmsg(vm->qmp));
				if (qemu_gone(vm->pid)) {
					snprintf(last, sizeof(last), "QEMU (pid %d) has exited",
						 (int)vm->pid);
					r = -ESRCH;
					break;
				}
				if (!transient(r) || hq_qmp_aborted(vm->qmp))
					break;
				/* Refused at once (QEMU busy or gone): not a busy loop. */
				usleep(20000);
				continue;
			}
		}
		if (seen < 0) {
			r = runstate_cmd(vm, running ? "cont" : "stop", left);
			if (!r) {
				seen = 1;
				if (t_changed)
					*t_changed = hq_now_ns();
				continue;
			}
			/* Its reply may still come, or it never arrived: ask again. */
			seen = 0;
		} else {
			r = query_status(vm, st, sizeof(st), left);
			seen = vm->run_seen * (running ? 1 : -1);
			if (!r && seen > 0)
				return 0;
			if (!r && seen < 0)
				continue;
			if (!r) {
				hq_vmsetf(vm, "the guest is %s, neither running nor paused", st);
				return -HALITE_E_STATE;
			}
		}
		snprintf(last, sizeof(last), "%s", vm->err);
		if (!transient(r) || hq_qmp_aborted(vm->qmp))
			break;
	}
	hq_vmsetf(vm, "%s", last);
	return r;
}
