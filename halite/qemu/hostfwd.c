// SPDX-License-Identifier: MIT
/*
 * User networking's host forwards at restore (vmconfig.h).
 *
 * Why they are taken out of the command line QEMU starts with and added
 * once the device state is loaded, before the guest runs: with hostfwd,
 * the host kernel completes a client's handshake on QEMU's listening
 * socket, and slirp, in QEMU's main loop, accepts the connection and sends
 * its own SYN to the guest. slirp's ARP table is not migrated, so it sends
 * an ARP request first and parks the SYN with an expiry of 1 s on
 * QEMU_CLOCK_VIRTUAL (libslirp if_encap4, ARP_RESOLVE_TIMEOUT). Until the
 * device state's "timer" section loads, that clock reads 0; then it jumps
 * to the source's value, so a SYN parked before the load has expired and
 * is dropped, and slirp sends it again only after its retransmit timer,
 * 6 s (TCPTV_SRTTDFLT): the client's request waits about 6 s after the
 * guest resumes (measured: 5.55-5.59 s with e1000, e1000e and
 * virtio-net-pci; QEMU's own -incoming restore has the same 6 s for a
 * connection that comes during its load). A SYN parked after the load
 * keeps an expiry on the loaded clock, which does not run while the guest
 * is paused; the ARP request waits in the NIC's queue (QEMU queues what
 * slirp sends while the VM is stopped and flushes it when it runs), the
 * guest answers it once resumed, and the SYN goes: answered in a few
 * hundred milliseconds.
 *
 * So until the rules are added a client is refused (connection refused),
 * as it is by any QEMU before its network is set up: halite-qemu restore
 * adds them some 50 ms after it starts, a plain QEMU binds its forwards
 * some 20 ms after it starts. Their host ports are checked before QEMU
 * starts, so a port taken by another process fails the restore before the
 * guest is touched, as QEMU itself would fail.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qmp.h"
#include "vmconfig.h"

#define HMP_TIMEOUT_MS 10000

void hq_fwds_free(struct hq_fwds *f)
{
	free(f->v);
	f->v = NULL;
	f->n = 0;
}

/* The next field of @p up to @sep into @buf (as libslirp's get_str_sep); false if none. */
static bool field(const char **p, char sep, char *buf, size_t len)
{
	const char *e = strchr(*p, sep);
	size_t n;

	if (!e)
		return false;
	n = (size_t)(e - *p);
	if (n >= len)
		return false;
	memcpy(buf, *p, n);
	buf[n] = '\0';
	*p = e + 1;
	return true;
}

/* "[tcp|udp]:[hostaddr]:hostport-[guestaddr]:guestport", as QEMU's slirp_hostfwd() reads it. */
static int parse_rule(const char *netdev, const char *rule, struct hq_fwd *f)
{
	const char *p = rule;
	char buf[64], *end;
	struct in_addr a;
	long port;

	memset(f, 0, sizeof(*f));
	if (strlen(netdev) >= sizeof(f->netdev) || strlen(rule) >= sizeof(f->rule))
		return -EINVAL;
	strcpy(f->netdev, netdev);
	strcpy(f->rule, rule);
	if (!field(&p, ':', buf, sizeof(buf)))
		return -EINVAL;
	if (!strcmp(buf, "udp"))
		f->udp = true;
	else if (buf[0] && strcmp(buf, "tcp"))
		return -EINVAL;
	if (!field(&p, ':', buf, sizeof(buf)))
		return -EINVAL;
	if (buf[0]) {
		if (!inet_aton(buf, &a))
			return -EINVAL;
		f->host_addr = a.s_addr;
	}
	if (!field(&p, '-', buf, sizeof(buf)))
		return -EINVAL;
	errno = 0;
	port = strtol(buf, &end, 0);
	if (errno || end == buf || *end || port < 0 || port > 65535)
		return -EINVAL;
	f->host_port = (uint16_t)port;
	return strchr(p, ':') ? 0 : -EINVAL;
}

static int add_rule(struct hq_fwds *f, const char *netdev, const char *rule, char *err,
		    size_t errlen)
{
	struct hq_fwd *v = realloc(f->v, sizeof(*v) * ((size_t)f->n + 1));

	if (!v)
		return -ENOMEM;
	f->v = v;
	if (parse_rule(netdev, rule, &v[f->n])) {
		snprintf(err, errlen, "hostfwd=%s: not a host forwarding rule QEMU takes "
			 "([tcp|udp]:[hostaddr]:hostport-[guestaddr]:guestport)", rule);
		return -EINVAL;
	}
	f->n++;
	return 0;
}

/* The rules of a JSON -netdev's "hostfwd": [{"str": RULE}, ...]. */
static int json_rules(struct hq_fwds *f, const char *netdev, const char *json, char *err,
		      size_t errlen)
{
	cJSON *a = cJSON_Parse(json), *e;
	int ret = 0;

	if (!cJSON_IsArray(a)) {
		cJSON_Delete(a);
		snprintf(err, errlen, "-netdev %s: hostfwd is no array", netdev);
		return -EINVAL;
	}
	cJSON_ArrayForEach(e, a) {
		const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(e, "str"));

		ret = s ? add_rule(f, netdev, s, err, errlen) : -EINVAL;
		if (ret)
			break;
	}
	cJSON_Delete(a);
	return ret;
}

int hq_fwd_take_out(struct hq_argv *a, struct hq_fwds *f, char *err, size_t errlen)
{
	struct hq_opt *opts = NULL;
	int n = 0, nics = 0, nets = 0, ret;

	if (a->argc < 1)
		return 0;
	ret = hq_opts_parse(a->argv + 1, a->argc - 1, &opts, &n, err, errlen);
	for (int i = 0; i < n && !ret; i++) {
		const char *name = opts[i].name, *type, *id;
		bool nic = !strcmp(name, "nic"), net = !strcmp(name, "net");
		struct hq_kvs kv = { 0 };
		char gen[32];
		char *arg;

		if (!opts[i].arg || (!nic && !net && strcmp(name, "netdev")))
			continue;
		if (nic)
			nics++;
		if (net)
			nets++;
		/* One QEMU would refuse: it will say so itself. */
		if (hq_kvs_split(opts[i].arg, "type", &kv))
			continue;
		type = hq_kvs_get(&kv, "type");
		if (!type || strcmp(type, "user") || !hq_kvs_has(&kv, "hostfwd")) {
			hq_kvs_free(&kv);
			continue;
		}
		/* hostfwd_add finds the netdev by its id (-net: its name first). */
		id = net && hq_kvs_get(&kv, "name") ? hq_kvs_get(&kv, "name") : hq_kvs_get(&kv, "id");
		if (!id) {
			snprintf(gen, sizeof(gen), "halite.%s%d", nic ? "nic" : "net",
				 (nic ? nics : nets) - 1);
			id = gen;
		}
		for (int k = 0; k < kv.n && !ret; k++)
			if (!strcmp(kv.v[k].key, "hostfwd"))
				ret = kv.json ? json_rules(f, id, kv.v[k].val, err, errlen) :
				      kv.v[k].val ? add_rule(f, id, kv.v[k].val, err, errlen) : -EINVAL;
		if (!ret && id == gen)
			ret = hq_kvs_add(&kv, "id", gen);
		hq_kvs_del(&kv, "hostfwd");
		arg = ret ? NULL : hq_kvs_join(&kv, "type");
		if (!ret && !arg)
			ret = -ENOMEM;
		if (!ret) {
			/* The option's argument follows it in @a (whose [0] is the binary). */
			int at = opts[i].index + 2;

			free(a->argv[at]);
			a->argv[at] = arg;
		}
		hq_kvs_free(&kv);
	}
	free(opts);
	return ret;
}

int hq_fwd_check_ports(const struct hq_fwds *f, char *err, size_t errlen)
{
	for (int i = 0; i < f->n; i++) {
		const struct hq_fwd *w = &f->v[i];
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(w->host_port),
					  .sin_addr.s_addr = w->host_addr };
		int one = 1, fd, e = 0;

		if (!w->host_port)
			continue;
		fd = socket(AF_INET, (w->udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		/* As slirp's tcp_listen()/udp_listen() bind it. */
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		/* A QEMU killed a moment ago holds its ports until its last thread exits: 2 s. */
		for (int k = 0; k < 100; k++) {
			e = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? errno : 0;
			if (e != EADDRINUSE)
				break;
			usleep(20000);
		}
		close(fd);
		if (e) {
			snprintf(err, errlen, "hostfwd=%s (netdev %s): host port %u cannot be bound: "
				 "%s%s", w->rule, w->netdev, w->host_port, strerror(e),
				 e == EADDRINUSE ? " (the source QEMU still running?)" : "");
			return -e;
		}
	}
	return 0;
}

/* Whether "info usernet" lists a host forward of @w's protocol on its port. */
static bool forwarded(const char *usernet, const struct hq_fwd *w)
{
	for (const char *p = usernet; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		char proto[8];
		unsigned port;
		int fd;

		/* "  TCP[HOST_FORWARD]  13   127.0.0.1 35533   10.0.2.15    80     0     0" */
		if (sscanf(p, " %7[A-Z][HOST_FORWARD] %d %*s %u", proto, &fd, &port) == 3 &&
		    !strcmp(proto, w->udp ? "UDP" : "TCP") && port == w->host_port)
			return true;
	}
	return false;
}

int hq_fwd_add(struct hq_qmp *q, const struct hq_fwds *f, char *err, size_t errlen)
{
	char *usernet = NULL, cmd[256];
	int ret = 0, added = 0;

	if (!f->n)
		return 0;
	ret = hq_qmp_hmp(q, "info usernet", &usernet, HMP_TIMEOUT_MS);
	if (ret) {
		snprintf(err, errlen, "info usernet: %s", hq_qmp_errmsg(q));
		return ret;
	}
	for (int i = 0; i < f->n && !ret; i++) {
		char *out = NULL;
		size_t n;

		if (forwarded(usernet, &f->v[i]))
			continue;
		snprintf(cmd, sizeof(cmd), "hostfwd_add %s %s", f->v[i].netdev, f->v[i].rule);
		ret = hq_qmp_hmp(q, cmd, &out, HMP_TIMEOUT_MS);
		if (ret) {
			snprintf(err, errlen, "%s: %s", cmd, hq_qmp_errmsg(q));
			break;
		}
		/* HMP says nothing when it worked, and why when it did not. */
		n = strlen(out);
		while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
			out[--n] = '\0';
		if (n) {
			snprintf(err, errlen, "%s: QEMU says: %s", cmd, out);
			ret = -EIO;
		} else {
			added++;
		}
		free(out);
	}
	free(usernet);
	return ret ? ret : added;
}
