// SPDX-License-Identifier: MIT
/*
 * halite-qemu's command-line rules (halite/qemu/cmdline.c) and host
 * forwards taken out (hostfwd.c), without a QEMU: QEMU 7.2's options and
 * their arguments, QemuOpts and JSON arguments, what matters for a restore
 * and the messages naming a difference, the recorded line made runnable,
 * the device list of "info qtree" (captured from QEMU 7.2 in
 * tests/qemu/hmp-samples/), the hostfwd rules taken out of -nic, -netdev
 * and -net. Exact strings throughout.
 *
 *   test_cmdline SAMPLE-DIR
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"
#include "disks.h"
#include "vmconfig.h"
#include "qemu_test.h"

static const char *dir;

static char *sample(const char *name)
{
	return q_sample(dir, name);
}


static void opts(void)
{
	struct hq_argv a = q_words("-machine q35 -S -nographic disk.img --smp 2 -m 512M -bogus x "
				 "-bogus2 -incoming defer");
	struct hq_opt *o = NULL;
	char err[128] = "";
	int n = 0, ret = hq_opts_parse(a.argv, a.argc, &o, &n, err, sizeof(err));

	CHECK(ret == 0 && n == 9, "%d options: %s", n, err);
	if (n == 9) {
		CHECK(!strcmp(o[0].name, "machine") && !strcmp(o[0].arg, "q35"), "-machine q35");
		CHECK(!strcmp(o[1].name, "S") && !o[1].arg, "-S takes none");
		CHECK(!strcmp(o[2].name, "nographic") && !o[2].arg, "-nographic takes none");
		CHECK(!o[3].name[0] && !strcmp(o[3].arg, "disk.img") && o[3].index == 4, "image");
		CHECK(!strcmp(o[4].name, "smp") && !strcmp(o[4].arg, "2"), "--smp");
		CHECK(!strcmp(o[6].name, "bogus") && !strcmp(o[6].arg, "x"), "unknown with a word");
		CHECK(!strcmp(o[7].name, "bogus2") && !o[7].arg, "unknown before an option");
		CHECK(!strcmp(o[8].name, "incoming") && o[8].index == 12, "-incoming");
	}
	free(o);
	hq_argv_free(&a);
	a = q_words("-m 1G -kernel");
	CHECK(hq_opts_parse(a.argv, a.argc, &o, &n, err, sizeof(err)) == -EINVAL &&
	      !strcmp(err, "QEMU option -kernel needs an argument"), "%s", err);
	hq_argv_free(&a);
	CHECK(hq_opt_takes_arg("daemonize") == 0 && hq_opt_takes_arg("pidfile") == 1 &&
	      hq_opt_takes_arg("nope") == -1, "takes_arg");
}

static void kvs(void)
{
	struct hq_kvs kv;
	char *s;

	CHECK(!hq_kvs_split("user,id=n0,hostfwd=tcp::1-:2,hostfwd=udp::3-:4,x=a,,b,restrict",
			    "type", &kv), "split");
	CHECK(kv.n == 6 && !strcmp(kv.v[0].key, "type") && !strcmp(kv.v[0].val, "user"), "implied");
	CHECK(!strcmp(hq_kvs_get(&kv, "x"), "a,b"), ",, is a comma: %s", hq_kvs_get(&kv, "x"));
	CHECK(hq_kvs_has(&kv, "restrict") && !hq_kvs_get(&kv, "restrict"), "flag");
	CHECK(hq_kvs_del(&kv, "hostfwd") == 2 && kv.n == 4, "del");
	s = hq_kvs_join(&kv, "type");
	CHECK(s && !strcmp(s, "user,id=n0,x=a,,b,restrict"), "join: %s", s);
	free(s);
	hq_kvs_free(&kv);

	CHECK(!hq_kvs_split("{\"type\": \"user\", \"id\": \"n1\", \"ipv6\": false, \"hostfwd\": "
			    "[{\"str\": \"tcp::5-:6\"}]}", "type", &kv) && kv.json && kv.n == 4,
	      "JSON");
	CHECK(!strcmp(hq_kvs_get(&kv, "id"), "n1") && kv.v[2].raw &&
	      !strcmp(kv.v[2].val, "false") && !strcmp(kv.v[3].val, "[{\"str\":\"tcp::5-:6\"}]"),
	      "members: %s %s", kv.v[2].val, kv.v[3].val);
	hq_kvs_del(&kv, "hostfwd");
	s = hq_kvs_join(&kv, "type");
	CHECK(s && !strcmp(s, "{\"type\":\"user\",\"id\":\"n1\",\"ipv6\":false}"), "JSON join: %s", s);
	free(s);
	hq_kvs_free(&kv);
	CHECK(hq_kvs_split("{\"a\"", NULL, &kv) == -EINVAL, "bad JSON");
}

static void sizes(void)
{
	uint64_t v = 0;

	CHECK(!hq_parse_qemu_size("512", 1 << 20, &v) && v == 512ull << 20, "512 MiB default");
	CHECK(!hq_parse_qemu_size("512M", 1, &v) && v == 512ull << 20, "512M");
	CHECK(!hq_parse_qemu_size("0.5G", 1 << 20, &v) && v == 512ull << 20, "0.5G");
	CHECK(!hq_parse_qemu_size("4096", 1, &v) && v == 4096, "bytes");
	CHECK(hq_parse_qemu_size("5X", 1, &v) == -EINVAL && hq_parse_qemu_size("M", 1, &v) == -EINVAL,
	      "not sizes");
}

#define GUEST "qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -smp 2 -m 512M " \
	      "-object memory-backend-memfd,id=mem0,size=512M,share=on -machine memory-backend=mem0 " \
	      "-display none -serial file:/a/console.log -kernel vmlinux -append quiet " \
	      "-nic user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:5555-:80 " \
	      "-qmp unix:/a/qmp.sock,server=on,wait=off"

/* A resolver as QEMU 7.2's -machine help says. */
static int resolve(void *ctx, const char *type, char *out, size_t len)
{
	const char *r = !strcmp(type, "q35") ? "pc-q35-7.2" : !strcmp(type, "pc") || !*type ?
			"pc-i440fx-7.2" : type;

	(*(int *)ctx)++;
	snprintf(out, len, "%s", r);
	return 0;
}

/* Compare GUEST with @now: 0, or the message. */
static const char *differ(const char *now)
{
	static char msg[2048];
	struct hq_argv a = q_words(GUEST), b = q_words(now);
	int calls = 0, ret;

	msg[0] = '\0';
	ret = hq_cmdline_compare(a.argv, a.argc, b.argv, b.argc, NULL, resolve, &calls, msg,
				 sizeof(msg));
	hq_argv_free(&a);
	hq_argv_free(&b);
	return ret == 0 ? NULL : ret == -EINVAL ? msg : "(error)";
}

static void compare(void)
{
	const char *m;

	/* What does not matter. */
	CHECK(!differ(GUEST), "the same");
	CHECK(!differ("/usr/bin/qemu-system-x86_64 -machine q35 -accel kvm -smp cpus=2 -m 0.5G "
		      "-object memory-backend-file,id=mem0,size=512M,share=on,mem-path=/dev/shm/x "
		      "-machine memory-backend=mem0 -display gtk -serial file:/b/other.log "
		      "-kernel /boot/other -append other -name vm2 -pidfile /b/pid -S "
		      "-nic user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:6666-:80,hostfwd=udp::7-:7 "
		      "-qmp unix:/b/qmp.sock,server=on,wait=off -monitor stdio -D /b/log "
		      "-chardev socket,id=c,path=/b/c.sock,server=on -rtc base=utc -boot c"),
	      "display, paths, sockets, ports, accel, backend file and size spelling do not matter");
	CHECK(!differ("qemu-system-x86_64 -machine pc-q35-7.2,memory-backend=mem0 -smp 2 -m 512 "
		      "-object memory-backend-memfd,id=mem0,size=536870912,share=on "
		      "-nic user,model=virtio-net-pci"),
	      "an alias resolved, options merged, sizes in other units");
	CHECK(!differ("qemu-system-x86_64 -machine q35 -smp 2 -m 512M "
		      "-nic user,model=virtio-net-pci"),
	      "-m alone: the main RAM as the backend made it, of the same size");
	m = differ("qemu-system-x86_64 -machine q35 -smp 2 -m 512M -object "
		   "memory-backend-ram,id=mem1,size=256M -device pc-dimm,memdev=mem1 "
		   "-nic user,model=virtio-net-pci");
	CHECK(m && !strcmp(m, "memory backend mem1 (size=256M) now, none at save; -device "
			       "pc-dimm,memdev=mem1 now, not at save"),
	      "a backend that is not the main RAM: %s", m);

	/* What does. */
	m = differ("qemu-system-x86_64 -machine q35 -smp 4 -m 512M -object "
		   "memory-backend-memfd,id=mem0,size=512M,share=on -machine memory-backend=mem0 "
		   "-nic user,model=virtio-net-pci");
	CHECK(m && !strcmp(m, "-smp 2 at save, -smp 4 now"), "smp: %s", m);
	m = differ("qemu-system-x86_64 -machine pc -smp 2 -m 768M -object "
		   "memory-backend-memfd,id=mem0,size=768M,share=on -machine memory-backend=mem0 "
		   "-nic user,model=e1000 -device virtio-rng-pci");
	CHECK(m && !strcmp(m, "-machine q35 (pc-q35-7.2) at save, -machine pc (pc-i440fx-7.2) now; "
			       "-m 512M at save, -m 768M now; -nic "
			       "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:5555-:80 at save, "
			       "-nic user,model=e1000 now; -device virtio-rng-pci now, not at save"),
	      "machine, memory, NIC, device: %s", m);
	m = differ("qemu-system-x86_64 -machine q35,memory-backend=mem0 -smp 2 -m 512M "
		   "-object memory-backend-memfd,id=mem0,size=512M,share=on -nographic "
		   "-serial none -netdev user,id=n0 -device virtio-net-pci,netdev=n0");
	CHECK(m && !strcmp(m, "-nic user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:5555-:80 at "
			       "save, not now; serial ports: 1 (-serial file:/a/console.log) at save, "
			       "serial ports: 0 (-serial none) now; -netdev user,id=n0 now, not at "
			       "save; -device virtio-net-pci,netdev=n0 now, not at save"),
	      "the NIC as -netdev/-device, no serial: %s", m);
	m = differ("qemu-system-x86_64 -machine q35 -cpu max -smp 2 -m 512M -object "
		   "memory-backend-memfd,id=mem0,size=512M,share=on -machine memory-backend=mem0 "
		   "-nic user,model=virtio-net-pci -global kvm-pit.lost_tick_policy=discard -vga none "
		   "-drive file=/d.qcow2,if=virtio -nodefaults -serial file:x -parallel none");
	CHECK(m && !strcmp(m, "no -vga (QEMU's default) at save, -vga none now; parallel ports: 1 "
			       "(QEMU's default) at save, parallel ports: 0 (-parallel none) now; -cpu "
			       "max now, none at save; -global kvm-pit.lost_tick_policy=discard now, "
			       "not at save; -drive file=/d.qcow2,if=virtio now, not at save; "
			       "-nodefaults now, none at save"),
	      "cpu, global, vga, drive, nodefaults: %s", m);
	/* Without any -nic, QEMU's default NIC is there: the same as "-nic user". */
	{
		struct hq_argv a = q_words("qemu -m 1G -nic user"), b = q_words("qemu -m 1G");
		char msg[256];

		CHECK(!hq_cmdline_compare(a.argv, a.argc, b.argv, b.argc, NULL, NULL, NULL, msg,
					  sizeof(msg)), "the default NIC: %s", msg);
		hq_argv_free(&a);
		hq_argv_free(&b);
	}
	/*
	 * With the device list: rng0 hot-plugged at the source (listed, not on
	 * its command line) may be given now; balloon unplugged (on its command
	 * line, not listed) may be left out; e1000 for virtio-net may not.
	 */
	{
		struct hq_argv a = q_words("qemu -m 1G -device virtio-balloon-pci -device "
					 "virtio-net-pci,netdev=n -netdev user,id=n"),
			       b = q_words("qemu -m 1G -device virtio-rng-pci,id=rng0 -device "
					 "e1000,netdev=n -netdev user,id=n"),
			       d = q_words("ps2-mouse virtio-net-pci virtio-rng-pci");
		char msg[512] = "";

		CHECK(hq_cmdline_compare(a.argv, a.argc, b.argv, b.argc, &d, NULL, NULL, msg,
					 sizeof(msg)) == -EINVAL &&
		      !strcmp(msg, "-device e1000,netdev=n now, not at save; -device "
			      "virtio-net-pci,netdev=n at save, not now"), "hot-plug: %s", msg);
		hq_argv_free(&a);
		hq_argv_free(&b);
		hq_argv_free(&d);
	}
}

static void replay(void)
{
	struct hq_argv a = q_words("/usr/bin/qemu-system-x86_64 -S -machine q35 -daemonize -incoming "
				 "defer -loadvm snap1 -pidfile /run/vm.pid -m 1G disk.img"),
		       out = { 0 };
	unsigned flags = 0;
	char *s;
	size_t len;

	CHECK(!hq_cmdline_replay(a.argv, a.argc, &out, &flags), "replay");
	s = hq_argv_to_nul(&out, &len);
	for (size_t i = 0; s && i + 1 < len; i++)
		if (!s[i])
			s[i] = ' ';
	CHECK(s && !strcmp(s, "/usr/bin/qemu-system-x86_64 -machine q35 -pidfile /run/vm.pid "
			      "-m 1G disk.img"), "replayed: %s", s);
	CHECK(flags == HQ_REPLAY_DAEMONIZE, "-daemonize noted");
	free(s);
	hq_argv_free(&a);
	hq_argv_free(&out);
}

static void qtree(void)
{
	static const struct {
		const char *file;
		int n;
		const char *some[4];
	} samples[] = {
		{ "q35-e1000-qtree.txt", 35, { "e1000 addr=02.0", "VGA addr=01.0", "mch addr=00.0",
					       "isa-serial" } },
		{ "q35-virtio-qtree.txt", 38, { "virtio-net-pci id=nic0 addr=02.0",
						"virtio-balloon-pci addr=03.0", "virtio-net-device",
						"kvmvapic" } },
	};
	struct hq_argv l[2] = { 0 };
	char err[256], msg[1024];

	for (int s = 0; s < 2; s++) {
		char *t = sample(samples[s].file);
		int ret = hq_parse_qtree(t, &l[s], err, sizeof(err));

		CHECK(ret == 0 && l[s].argc == samples[s].n, "%s: %d devices (%s)", samples[s].file,
		      l[s].argc, err);
		CHECK(!strcmp(l[s].argv[0], "ps2-mouse"), "first: %s", l[s].argv[0]);
		for (int k = 0; k < 4; k++) {
			int i;

			for (i = 0; i < l[s].argc && strcmp(l[s].argv[i], samples[s].some[k]); i++)
				;
			CHECK(i < l[s].argc, "%s lists %s", samples[s].file, samples[s].some[k]);
		}
		free(t);
	}
	CHECK(!hq_devices_compare(&l[0], &l[0], msg, sizeof(msg)), "the same");
	CHECK(hq_devices_compare(&l[0], &l[1], msg, sizeof(msg)) == -EINVAL &&
	      !strcmp(msg, "device e1000 addr=02.0 at save, not now; device virtio-balloon-device "
		      "now, not at save; device virtio-balloon-pci addr=03.0 now, not at save; "
		      "device virtio-net-device now, not at save; 1 more"), "%s", msg);
	hq_argv_free(&l[0]);
	hq_argv_free(&l[1]);
	CHECK(hq_parse_qtree("bus: main-system-bus\r\n  type System\r\n", &l[0], err,
			     sizeof(err)) == -EINVAL && !strcmp(err, "info qtree: no device in QEMU's "
								"answer"), "no device: %s", err);
}

static void forwards(void)
{
	struct hq_argv a = q_words("qemu -m 1G -nic user,model=e1000,hostfwd=tcp:127.0.0.1:8080-:80,"
				 "hostfwd=udp::5353-:53 -netdev user,id=n1,hostfwd=tcp::2222-:22 "
				 "-device e1000,netdev=n1 -nic tap,ifname=t0 -net user,hostfwd=tcp::9-:9 "
				 "-net nic -nic user,id=mine,hostfwd=tcp:10.0.0.1:99-10.0.2.16:98 "
				 "-netdev {\"type\":\"user\",\"id\":\"j\",\"hostfwd\":[{\"str\":\"udp::7-:7\"}]}");
	struct hq_fwds f = { 0 };
	char err[256] = "";
	size_t len;
	char *s;

	CHECK(!hq_fwd_take_out(&a, &f, err, sizeof(err)) && f.n == 6, "%d rules (%s)", f.n, err);
	if (f.n == 6) {
		CHECK(!strcmp(f.v[0].netdev, "halite.nic0") &&
		      !strcmp(f.v[0].rule, "tcp:127.0.0.1:8080-:80") && !f.v[0].udp &&
		      f.v[0].host_port == 8080 && f.v[0].host_addr == 0x0100007f, "rule 0");
		CHECK(!strcmp(f.v[1].netdev, "halite.nic0") && f.v[1].udp && f.v[1].host_port == 5353 &&
		      !f.v[1].host_addr, "rule 1");
		CHECK(!strcmp(f.v[2].netdev, "n1") && f.v[2].host_port == 2222, "rule 2");
		CHECK(!strcmp(f.v[3].netdev, "halite.net0") && f.v[3].host_port == 9, "rule 3");
		CHECK(!strcmp(f.v[4].netdev, "mine") && f.v[4].host_port == 99, "rule 4");
		CHECK(!strcmp(f.v[5].netdev, "j") && f.v[5].udp && f.v[5].host_port == 7, "rule 5");
	}
	s = hq_argv_to_nul(&a, &len);
	for (size_t i = 0; s && i + 1 < len; i++)
		if (!s[i])
			s[i] = ' ';
	CHECK(s && !strcmp(s, "qemu -m 1G -nic user,model=e1000,id=halite.nic0 -netdev user,id=n1 "
			      "-device e1000,netdev=n1 -nic tap,ifname=t0 -net user,id=halite.net0 "
			      "-net nic -nic user,id=mine -netdev {\"type\":\"user\",\"id\":\"j\"}"),
	      "taken out: %s", s);
	free(s);
	hq_fwds_free(&f);
	hq_argv_free(&a);

	a = q_words("qemu -nic user,hostfwd=tcp::http-:80");
	CHECK(hq_fwd_take_out(&a, &f, err, sizeof(err)) == -EINVAL &&
	      strstr(err, "hostfwd=tcp::http-:80: not a host forwarding rule"), "%s", err);
	hq_fwds_free(&f);
	hq_argv_free(&a);
}

/* @a joined with spaces, malloc'd. */
static char *joined(const struct hq_argv *a)
{
	size_t len;
	char *s = hq_argv_to_nul(a, &len);

	for (size_t i = 0; s && i + 1 < len; i++)
		if (!s[i])
			s[i] = ' ';
	return s;
}

/* hq_disks_rewrite() on @line; its result (or "ERR <errno> <message>") in @out. */
static void rewrite(const struct hq_disks *ds, const char *line, const char *cwd, char *out,
		    size_t len)
{
	struct hq_argv a = q_words(line);
	char err[512] = "";
	int ret = hq_disks_rewrite(ds, &a, cwd, err, sizeof(err));
	char *s = joined(&a);

	if (ret)
		snprintf(out, len, "ERR %d %s", -ret, err);
	else
		snprintf(out, len, "%s", s);
	free(s);
	hq_argv_free(&a);
}

static void disk(struct hq_disks *ds, const char *qdev, const char *image, const char *overlay,
		 const char *below)
{
	struct hq_disk *d = &ds->d[ds->n++];

	snprintf(d->qdev, sizeof(d->qdev), "/machine/peripheral/%s/virtio-backend", qdev);
	hq_disk_name(d);
	snprintf(d->image, sizeof(d->image), "%s", image);
	snprintf(d->overlay, sizeof(d->overlay), "%s", overlay);
	if (below)
		snprintf(d->chain[d->nchain++], HQ_PATH_MAX, "%s", below);
	d->frozen = overlay != NULL;
}

static void disk_args(void)
{
	static struct hq_disks ds; /* large: not on the stack */
	char out[2048];

	/* Paths that do not exist are compared as written, ".." resolved. */
	disk(&ds, "vd0", "/nx/img/a.qcow2", "/nx/ov/a.r1.qcow2", NULL);
	disk(&ds, "vd1", "/nx/img/b.raw", "/nx/ov/b,x.qcow2", NULL);
	disk(&ds, "cd0", "/nx/img/c.iso", NULL, NULL);

	rewrite(&ds, "qemu -m 1G -drive file=/nx/img/a.qcow2,if=virtio,format=qcow2,cache=none "
		"-drive if=none,id=d1,file.filename=b.raw,file.driver=file,format=raw "
		"-device virtio-blk,drive=d1 -cdrom /nx/img/c.iso", "/nx/img", out, sizeof(out));
	/* auto-read-only=off: opened read-write at start, never reopened (diskargs.c) */
	CHECK(!strcmp(out, "qemu -m 1G -drive file=/nx/ov/a.r1.qcow2,if=virtio,format=qcow2,"
		      "cache=none,auto-read-only=off -drive if=none,id=d1,file.filename="
		      "/nx/ov/b,,x.qcow2,file.driver=file,format=qcow2,auto-read-only=off "
		      "-device virtio-blk,drive=d1 -cdrom "
		      "/nx/img/c.iso"), "-drive: %s", out);

	rewrite(&ds, "qemu -blockdev driver=file,filename=/nx/img/b.raw,node-name=f1 "
		"-blockdev driver=raw,file=f1,node-name=d1 -device virtio-blk,drive=d1 "
		"-blockdev driver=qcow2,node-name=d0,file.driver=file,"
		"file.filename=/nx/img/a.qcow2,backing=bk", NULL, out, sizeof(out));
	CHECK(!strcmp(out, "qemu -blockdev driver=file,filename=/nx/ov/b,,x.qcow2,node-name=f1,"
		      "auto-read-only=off -blockdev driver=qcow2,file=f1,node-name=d1 "
		      "-device virtio-blk,drive=d1 -blockdev driver=qcow2,node-name=d0,"
		      "file.driver=file,file.filename=/nx/ov/a.r1.qcow2,auto-read-only=off"),
	      "-blockdev: %s", out);

	rewrite(&ds, "qemu -blockdev {\"driver\":\"file\",\"filename\":\"/nx/img/b.raw\","
		"\"node-name\":\"f1\"} -blockdev {\"node-name\":\"d1\",\"driver\":\"raw\","
		"\"file\":\"f1\"} -blockdev {\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\","
		"\"filename\":\"/nx/img/a.qcow2\"},\"backing\":null}", NULL, out, sizeof(out));
	CHECK(!strcmp(out, "qemu -blockdev {\"driver\":\"file\",\"filename\":\"/nx/ov/b,x.qcow2\","
		      "\"node-name\":\"f1\",\"auto-read-only\":false} -blockdev {\"node-name\":"
		      "\"d1\",\"driver\":\"qcow2\",\"file\":\"f1\"} -blockdev {\"driver\":"
		      "\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"/nx/ov/a.r1.qcow2\"},"
		      "\"auto-read-only\":false}"), "JSON: %s", out);

	rewrite(&ds, "qemu /nx/img/a.qcow2 -hdb ../img/b.raw", "/nx/x", out, sizeof(out));
	CHECK(!strcmp(out, "qemu /nx/ov/a.r1.qcow2 -hdb /nx/ov/b,x.qcow2"), "-hdb: %s", out);

	rewrite(&ds, "qemu -drive file=/nx/img/a.qcow2", NULL, out, sizeof(out));
	CHECK(!strcmp(out, "ERR 2 disk vd1: this command line names neither its frozen image "
		      "/nx/img/b.raw nor an image below it (give it as at save, or --no-disks to "
		      "run on the disks as they are)"), "not named: %s", out);

	/*
	 * A snapshot of a restored VM: its frozen image is the overlay its
	 * restore made, which the command line never names; the image below is.
	 */
	memset(&ds, 0, sizeof(ds));
	disk(&ds, "vd0", "/nx/ov/a.r1.qcow2", "/nx/ov/a.r2.qcow2", "/nx/img/a.qcow2");
	rewrite(&ds, "qemu -drive file=/nx/img/a.qcow2,format=qcow2", NULL, out, sizeof(out));
	CHECK(!strcmp(out, "qemu -drive file=/nx/ov/a.r2.qcow2,format=qcow2,auto-read-only=off"),
	      "chain: %s", out);
	/* Both named (a chain of -blockdev nodes): the top one gets the overlay. */
	rewrite(&ds, "qemu -blockdev driver=file,filename=/nx/img/a.qcow2,node-name=b0 "
		"-blockdev driver=qcow2,file=b0,node-name=base "
		"-blockdev driver=file,filename=/nx/ov/a.r1.qcow2,node-name=t0 "
		"-blockdev driver=qcow2,file=t0,backing=base,node-name=top", NULL, out, sizeof(out));
	CHECK(!strcmp(out, "qemu -blockdev driver=file,filename=/nx/img/a.qcow2,node-name=b0 "
		      "-blockdev driver=qcow2,file=b0,node-name=base "
		      "-blockdev driver=file,filename=/nx/ov/a.r2.qcow2,node-name=t0,"
		      "auto-read-only=off -blockdev driver=qcow2,file=t0,node-name=top"),
	      "chain of nodes: %s", out);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_cmdline SAMPLE-DIR\n");
		return 2;
	}
	dir = argv[1];
	opts();
	kvs();
	sizes();
	compare();
	replay();
	qtree();
	forwards();
	disk_args();
	return check_result();
}
