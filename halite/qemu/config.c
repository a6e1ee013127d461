// SPDX-License-Identifier: MIT
/*
 * What a save records about the VM's configuration, and what a restore does
 * with it (vmconfig.h).
 *
 * Metadata (halite-inspect info shows it):
 *   qemu.cmdline  QEMU's command line, binary first, each argument ended by
 *                 a NUL as in /proc/PID/cmdline: the user's own, so for a
 *                 QEMU that halite-qemu restore started, the command line
 *                 it was given or replayed (HQ_ENV_CMDLINE in QEMU's
 *                 environment), not the one halite-qemu ran (its -S,
 *                 -incoming, QMP socket and the forwards it took out)
 *   qemu.cwd      QEMU's working directory: relative paths are relative to it
 *   qemu.devices  the devices of info qtree, one per NUL-ended string
 *                 ("e1000 addr=02.0"): what the device state is for
 *
 * A restore without QEMU's command line runs qemu.cmdline again, in
 * qemu.cwd, without halite-qemu's options (hq_cmdline_replay()); one with
 * a command line is compared with it first (hq_cmdline_compare()) and
 * refused, before QEMU starts, where it differs in what matters. Either
 * way, once QEMU runs, its devices are compared with qemu.devices before
 * its RAM is touched.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <halite/halite.h>

#include "proc.h"
#include "vm.h"
#include "vmconfig.h"

/* The user's command line of a QEMU started by halite-qemu restore, as a JSON array. */
#define HQ_ENV_CMDLINE "HALITE_QEMU_CMDLINE"

/* @json (a JSON array of strings) into @a; -EINVAL if it is not one. */
static int argv_from_json(struct hq_argv *a, const char *json)
{
	cJSON *arr = cJSON_Parse(json), *e;
	int ret = cJSON_IsArray(arr) && cJSON_GetArraySize(arr) > 0 ? 0 : -EINVAL;

	cJSON_ArrayForEach(e, arr) {
		if (ret)
			break;
		ret = cJSON_IsString(e) ? hq_argv_push(a, e->valuestring) : -EINVAL;
	}
	cJSON_Delete(arr);
	return ret;
}

int hq_config_user_cmdline(pid_t pid, struct hq_argv *out, bool *from_env)
{
	size_t len = 0;
	char *env = hq_read_proc(pid, "environ", &len), *buf;
	int ret;

	*from_env = false;
	for (size_t i = 0; env && i < len; i += strlen(env + i) + 1)
		if (!strncmp(env + i, HQ_ENV_CMDLINE "=", sizeof(HQ_ENV_CMDLINE))) {
			ret = argv_from_json(out, env + i + sizeof(HQ_ENV_CMDLINE));
			free(env);
			*from_env = !ret;
			return ret;
		}
	free(env);
	buf = hq_read_proc(pid, "cmdline", &len);
	if (!buf)
		return -errno;
	ret = hq_argv_from_nul(out, buf, len);
	free(buf);
	return ret;
}

int hq_config_record(struct hq_vm *vm, struct halite_save *s, char *err, size_t errlen)
{
	struct hq_argv cl = { 0 }, devs = { 0 };
	char cwd[PATH_MAX + 16], path[64], *text = NULL, *nul = NULL;
	bool from_env;
	size_t len = 0;
	ssize_t n;
	int ret;

	ret = hq_config_user_cmdline(vm->pid, &cl, &from_env);
	if (ret) {
		snprintf(err, errlen, "QEMU's command line (/proc/%d/cmdline): %s", (int)vm->pid,
			 strerror(-ret));
		goto out;
	}
	nul = hq_argv_to_nul(&cl, &len);
	ret = nul ? halite_save_set_meta(s, "qemu.cmdline", nul, (uint32_t)len) : -ENOMEM;
	if (ret) {
		snprintf(err, errlen, "recording QEMU's command line: %s", halite_strerror(ret));
		goto out;
	}
	snprintf(path, sizeof(path), "/proc/%d/cwd", (int)vm->pid);
	n = readlink(path, cwd, sizeof(cwd) - 1);
	if (n < 0) {
		ret = -errno;
		snprintf(err, errlen, "QEMU's working directory (%s): %s", path, strerror(errno));
		goto out;
	}
	cwd[n] = '\0';
	ret = halite_save_set_meta(s, "qemu.cwd", cwd, (uint32_t)n);
	if (ret) {
		snprintf(err, errlen, "recording QEMU's working directory: %s", halite_strerror(ret));
		goto out;
	}
	/*
	 * The device list only helps a restore explain a mismatch (QEMU's own
	 * load refuses one anyway): a QEMU whose info qtree is not understood
	 * is saved without it.
	 */
	free(nul);
	nul = NULL;
	if (!hq_qmp_hmp(vm->qmp, "info qtree", &text, HQ_QMP_TIMEOUT_MS) &&
	    !hq_parse_qtree(text, &devs, err, errlen)) {
		nul = hq_argv_to_nul(&devs, &len);
		ret = nul ? halite_save_set_meta(s, "qemu.devices", nul, (uint32_t)len) : -ENOMEM;
		if (ret)
			snprintf(err, errlen, "recording QEMU's devices: %s", halite_strerror(ret));
	}
	if (!ret)
		err[0] = '\0';
out:
	free(text);
	free(nul);
	hq_argv_free(&cl);
	hq_argv_free(&devs);
	return ret;
}

/* --- restore --- */

int hq_config_read(struct hq_config *c, const struct halite_reader *rd, const char *path,
		   char *err, size_t errlen)
{
	const void *v;
	uint32_t len;

	if (!halite_reader_meta_find(rd, "qemu.cmdline", &v, &len) &&
	    hq_argv_from_nul(&c->rec, v, len)) {
		snprintf(err, errlen, "%s: its qemu.cmdline is not a command line", path);
		return -HALITE_E_CORRUPT;
	}
	if (!halite_reader_meta_find(rd, "qemu.cwd", &v, &len)) {
		c->rec_cwd = strndup(v, len);
		if (!c->rec_cwd)
			return -ENOMEM;
	}
	if (!halite_reader_meta_find(rd, "qemu.devices", &v, &len) &&
	    hq_argv_from_nul(&c->rec_devices, v, len)) {
		snprintf(err, errlen, "%s: its qemu.devices is not a device list", path);
		return -HALITE_E_CORRUPT;
	}
	if (!halite_reader_meta_find(rd, "qemu.disks", &v, &len)) {
		c->rec_disks = strndup(v, len);
		if (!c->rec_disks)
			return -ENOMEM;
	}
	c->rec_disks_unfrozen = !halite_reader_meta_find(rd, "qemu.disks-frozen", &v, &len) &&
				len == 2 && !memcmp(v, "no", 2);
	return 0;
}

/* "BIN -machine help", once: the aliases and the default (hq_machine_resolve_fn). */
static int resolve_machine(void *ctx, const char *type, char *out, size_t len)
{
	struct hq_config *c = ctx;
	const char *p;

	if (!c->machines) {
		int pfd[2], st;
		size_t used = 0, cap = 65536;
		pid_t pid;
		ssize_t k;

		c->machines = calloc(1, cap);
		if (!c->machines || pipe2(pfd, O_CLOEXEC))
			return -ENOMEM;
		pid = fork();
		if (pid == 0) {
			dup2(pfd[1], STDOUT_FILENO);
			execlp(c->run.argv[0], c->run.argv[0], "-machine", "help", (char *)NULL);
			_exit(127);
		}
		close(pfd[1]);
		while (pid > 0 && used < cap - 1 &&
		       (k = read(pfd[0], c->machines + used, cap - 1 - used)) > 0)
			used += (size_t)k;
		close(pfd[0]);
		if (pid > 0)
			waitpid(pid, &st, 0);
	}
	/* "q35    Standard PC (Q35 + ICH9, 2009) (alias of pc-q35-7.2)", "... (default)" */
	for (p = c->machines; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
		size_t n = strcspn(p, " \n");
		const char *eol = p + strcspn(p, "\n"), *al = strstr(p, "(alias of ");

		if (!n || n >= len)
			continue;
		if (type[0] ? strlen(type) == n && !strncmp(p, type, n) :
			      eol - p > 9 && !strncmp(eol - 9, "(default)", 9)) {
			if (al && al < eol) {
				al += 10;
				n = strcspn(al, ")\n");
				if (n >= len)
					return -ERANGE;
				memcpy(out, al, n);
			} else {
				memcpy(out, p, n);
			}
			out[n] = '\0';
			return 0;
		}
	}
	return -ENOENT;
}

int hq_config_prepare(struct hq_config *c, char *const *given, int ngiven, const char *bin,
		      bool check, const char *path, char *err, size_t errlen)
{
	char msg[2048] = "";
	struct stat st;
	int ret;

	if (ngiven) {
		/* The user's command line; its binary first, the default one if it starts with an option. */
		ret = given[0][0] == '-' ? hq_argv_push(&c->user, bin) : 0;
		if (!ret)
			ret = hq_argv_copy(&c->user, given, ngiven);
		if (ret)
			return ret;
		c->cwd = NULL;
	} else {
		if (!c->rec.argc) {
			snprintf(err, errlen, "%s records no QEMU command line (saved by an older "
				 "halite-qemu): give QEMU's after '--'", path);
			return -EINVAL;
		}
		ret = hq_cmdline_replay(c->rec.argv, c->rec.argc, &c->user, &c->replay_flags);
		if (ret)
			return ret;
		c->replayed = true;
		c->cwd = c->rec_cwd;
		if (c->cwd && (stat(c->cwd, &st) || !S_ISDIR(st.st_mode))) {
			snprintf(err, errlen, "QEMU's working directory at save, %s, is gone (%s): "
				 "relative paths in its command line would not be found; give QEMU's "
				 "command line after '--'", c->cwd, strerror(errno ? errno : ENOTDIR));
			return -ENOENT;
		}
	}
	ret = hq_argv_copy(&c->run, c->user.argv, c->user.argc);
	if (ret)
		return ret;
	if (ngiven && check && c->rec.argc) {
		ret = hq_cmdline_compare(c->rec.argv, c->rec.argc, c->user.argv, c->user.argc,
					 c->rec_devices.argc ? &c->rec_devices : NULL,
					 resolve_machine, c, msg, sizeof(msg));
		if (ret == -EINVAL) {
			snprintf(err, errlen, "QEMU's command line differs from the one recorded in %s "
				 "where it matters for the restore: %s (give the same; or none, to run "
				 "the recorded one)", path, msg);
			return ret;
		}
		if (ret)
			return ret;
	}
	ret = hq_fwd_take_out(&c->run, &c->fwds, err, errlen);
	if (!ret)
		ret = hq_fwd_check_ports(&c->fwds, err, errlen);
	if (!ret)
		ret = hq_cmdline_check_host(c->run.argv, c->run.argc, c->cwd, err, errlen);
	return ret;
}

char *hq_config_env(const struct hq_config *c)
{
	cJSON *arr = cJSON_CreateArray();
	char *json, *s = NULL;

	for (int i = 0; arr && i < c->user.argc; i++)
		cJSON_AddItemToArray(arr, cJSON_CreateString(c->user.argv[i]));
	json = arr ? cJSON_PrintUnformatted(arr) : NULL;
	cJSON_Delete(arr);
	if (json && asprintf(&s, HQ_ENV_CMDLINE "=%s", json) < 0)
		s = NULL;
	free(json);
	return s;
}

int hq_config_check_devices(struct hq_config *c, struct hq_qmp *q, const char *path, char *err,
			    size_t errlen)
{
	struct hq_argv now = { 0 };
	char *text = NULL, msg[1024];
	int ret;

	if (!c->rec_devices.argc)
		return 0;
	ret = hq_qmp_hmp(q, "info qtree", &text, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		snprintf(err, errlen, "info qtree: %s", hq_qmp_errmsg(q));
		return ret;
	}
	ret = hq_parse_qtree(text, &now, err, errlen);
	free(text);
	if (!ret) {
		ret = hq_devices_compare(&c->rec_devices, &now, msg, sizeof(msg));
		if (ret == -EINVAL)
			snprintf(err, errlen, "this QEMU's devices differ from those recorded in %s, "
				 "whose state the file holds: %s (give QEMU the devices it had at save; "
				 "one hot-plugged there needs its -device on the command line)", path, msg);
	}
	hq_argv_free(&now);
	return ret;
}

int hq_config_forward(struct hq_config *c, struct hq_qmp *q, char *err, size_t errlen)
{
	return hq_fwd_add(q, &c->fwds, err, errlen);
}

int hq_config_forward_pid(pid_t pid, struct hq_qmp *q, char *err, size_t errlen)
{
	struct hq_argv user = { 0 };
	struct hq_fwds f = { 0 };
	bool from_env;
	int ret;

	/* Only a QEMU that a halite-qemu restore started had its forwards taken out. */
	ret = hq_config_user_cmdline(pid, &user, &from_env);
	if (ret || !from_env) {
		hq_argv_free(&user);
		return 0;
	}
	ret = hq_fwd_take_out(&user, &f, err, errlen);
	if (!ret)
		ret = hq_fwd_add(q, &f, err, errlen);
	hq_fwds_free(&f);
	hq_argv_free(&user);
	return ret;
}

void hq_config_free(struct hq_config *c)
{
	hq_argv_free(&c->rec);
	hq_argv_free(&c->rec_devices);
	hq_argv_free(&c->user);
	hq_argv_free(&c->run);
	hq_fwds_free(&c->fwds);
	free(c->rec_cwd);
	free(c->rec_disks);
	free(c->machines);
	memset(c, 0, sizeof(*c));
}
