// SPDX-License-Identifier: MIT
/*
 * What a clone's QEMU may be told by the snapshot it clones
 * (halite/qemu/clone_policy.c), without a QEMU: every refusal with
 * its exact message, the test guest's recorded lines (scripts/halite_guest.py:
 * q35, tcg, -kernel/-initrd/-append, memfd backend, user netdev with
 * hostfwd, serial file, qmp unix, -drive and -blockdev disks) passing, the
 * recorded binary's check, and the boot files opened beneath --allow-dir
 * only (a temporary tree with a symlink out of it).
 *
 *   test_clone_policy
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "clone_policy.h"
#include "disks.h"
#include "vmconfig.h"
#include "qemu_test.h"

static struct hq_disks ds; /* large: not on the stack */


/* The policy's verdict on @line: "" when it passes, else the message. */
static const char *verdict(const char *line)
{
	static char err[1024];
	struct hq_clone_policy p = { .sz = sizeof(p), .disks = &ds, .cwd = "/img" };
	struct hq_argv a = q_words(line);
	int ret;

	err[0] = '\0';
	ret = hq_clone_policy_check(a.argv, a.argc, &p, err, sizeof(err));
	hq_argv_free(&a);
	if (!ret)
		return "";
	if (ret != -EPERM)
		snprintf(err + strlen(err), sizeof(err) - strlen(err), " (ret %d)", ret);
	return err;
}

#define PASSES(line) CHECK(!strcmp(verdict(line), ""), "%s: %s", line, verdict(line))
#define REFUSED(line, msg) CHECK(!strcmp(verdict(line), msg), "%s:\n  got  %s\n  want %s", line, \
				 verdict(line), msg)

#define Q "qemu-system-x86_64 -m 512M "

static void guest_lines(void)
{
	/* scripts/halite_guest.py's Guest as recorded, each variant */
	static const char base[] =
		"qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -smp 2 -m 512M "
		"-object memory-backend-memfd,id=mem0,size=512M,share=on "
		"-machine memory-backend=mem0 -display none -no-reboot -monitor none "
		"-serial file:/w/g-console.log -kernel /img/vmlinux -initrd /img/initrd.img "
		"-append console=ttyS0,quiet,verifier.mib=64 "
		"-qmp unix:/w/g-qmp.sock,server=on,wait=off";
	char line[2048];

	snprintf(line, sizeof(line), "%s -nic user,model=virtio-net-pci,"
		 "hostfwd=tcp:127.0.0.1:5555-:80,hostfwd=udp:127.0.0.1:5556-:7", base);
	PASSES(line);
	snprintf(line, sizeof(line), "%s -netdev user,id=net0,hostfwd=tcp:127.0.0.1:5555-:80 "
		 "-device e1000e,netdev=net0", base);
	PASSES(line);
	snprintf(line, sizeof(line), "%s -nic user,hostfwd=tcp:127.0.0.1:5555-:80 "
		 "-drive file=/img/disk.qcow2,if=virtio,id=disk0 "
		 "-device vmgenid,guid=c0ffee00-1234-4321-8765-0123456789ab", base);
	PASSES(line);
	snprintf(line, sizeof(line), "%s -nic user -blockdev driver=file,filename=/img/disk.raw,"
		 "node-name=f0 -blockdev driver=raw,file=f0,node-name=d0 "
		 "-device virtio-blk-pci,drive=d0,id=vd0", base);
	PASSES(line);
	/* relative to the recorded cwd, nested forms, JSON */
	PASSES(Q "-drive if=none,id=d1,file.filename=disk.raw,file.driver=file,format=raw");
	PASSES(Q "-blockdev driver=qcow2,node-name=d0,file.driver=file,file.filename=disk.qcow2,"
	       "backing=bk");
	PASSES(Q "-blockdev {\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":"
	       "\"/img/disk.qcow2\"},\"backing\":null}");
	PASSES(Q "-hda disk.qcow2 -cdrom /img/../img/disk.raw");
	/* what halite-qemu gives itself and replay takes out */
	PASSES(Q "-S -incoming defer -pidfile /x/q.pid -D /x/debug.log");
	PASSES(Q "-chardev socket,id=c0,path=/x/c.sock,server=on,wait=off -mon chardev=c0,mode=control "
	       "-chardev file,id=c1,path=/x/f.log -serial chardev:c1 -chardev null,id=c2 "
	       "-chardev ringbuf,id=c3,size=64K -parallel none -serial unix:/x/s.sock,server=on");
	PASSES(Q "-netdev user,id=n0 -object rng-random,id=r0,filename=/dev/urandom "
	       "-object rng-builtin,id=r1 -object secret,id=s0,data=x -object iothread,id=io0 "
	       "-device virtio-rng-pci,rng=r1 -usbdevice tablet -display none -vga std");
	PASSES(Q "-object tls-creds-anon,id=t0,endpoint=client -global e1000e.x=1 -netdev "
	       "{\"type\":\"user\",\"id\":\"n1\",\"hostfwd\":[{\"str\":\"tcp::5-:6\"}]}");
}

static void refusals(void)
{
	/* programs on the host */
	REFUSED(Q "-netdev tap,id=n0,script=/tmp/x.sh",
		"-netdev tap,script=...: script= runs a program on the host; a clone may not");
	REFUSED(Q "-netdev tap,id=n0,script=no,downscript=/x",
		"-netdev tap,downscript=...: downscript= runs a program on the host; a clone may not");
	REFUSED(Q "-netdev bridge,id=n0,helper=/usr/lib/qemu/qemu-bridge-helper",
		"-netdev bridge,helper=...: helper= runs a program on the host; a clone may not");
	REFUSED(Q "-netdev user,id=n0,smb=/",
		"-netdev user,smb=...: smb= runs smbd on the host; a clone may not");
	REFUSED(Q "-nic user,smb=/srv",
		"-nic user,smb=...: smb= runs smbd on the host; a clone may not");
	REFUSED(Q "-net user,tftp=/srv",
		"-net user,tftp=...: tftp= serves a host directory to the guest; a clone may not");
	REFUSED(Q "-netdev user,id=n0,bootfile=pxe.0",
		"-netdev user,bootfile=...: bootfile= serves a host file to the guest; a clone may not");
	REFUSED(Q "-netdev user,id=n0,guestfwd=tcp:10.0.2.100:1-cmd:sh",
		"-netdev user,guestfwd=...: guestfwd= connects the guest to host addresses or runs a "
		"host command; a clone may not");
	REFUSED(Q "-netdev {\"type\":\"user\",\"id\":\"n0\",\"smb\":\"/\"}",
		"-netdev user,smb=...: smb= runs smbd on the host; a clone may not");
	/* host networks */
	static const char *const types[] = { "tap", "bridge", "vhost-user", "socket", "l2tpv3",
					     "vde", "stream", "dgram", "vhost-vdpa", "hubport", NULL };
	for (int i = 0; types[i]; i++) {
		char line[256], msg[512];

		snprintf(line, sizeof(line), Q "-netdev %s,id=n0", types[i]);
		snprintf(msg, sizeof(msg), "-netdev %s: %s networking reaches the host's network or "
			 "programs; a clone may use user networking only", types[i], types[i]);
		REFUSED(line, msg);
	}
	REFUSED(Q "-nic tap", "-nic tap: tap networking reaches the host's network or programs; "
		"a clone may use user networking only");
	REFUSED(Q "-net socket,listen=:1234", "-net socket: socket networking reaches the host's "
		"network or programs; a clone may use user networking only");
	REFUSED(Q "-netdev user,id=n0,foo=1",
		"-netdev user,foo=...: foo= is not a key a clone may use");
	/* options never */
	REFUSED(Q "-plugin /tmp/evil.so",
		"-plugin: loads a host shared library into QEMU; a clone may not");
	REFUSED(Q "-add-fd fd=3,set=1", "-add-fd: hands QEMU a descriptor of the host's; a clone may not");
	REFUSED(Q "-readconfig /etc/x.cfg",
		"-readconfig: reads more options from a host file; a clone may not");
	REFUSED(Q "-loadvm s1", "-loadvm: loads a state the clone does not give; a clone may not");
	REFUSED(Q "-mem-path /dev/hugepages",
		"-mem-path: puts guest RAM in a host path; a clone's RAM is the template's");
	REFUSED(Q "-fsdev local,id=f,path=/", "-fsdev: shares a host directory with the guest; a clone may not");
	REFUSED(Q "-virtfs local,path=/,mount_tag=h",
		"-virtfs: shares a host directory with the guest; a clone may not");
	REFUSED(Q "-runas root", "-runas: the clone sets its own (--run-as)");
	REFUSED(Q "-chroot /", "-chroot: the clone sets its own confinement");
	REFUSED(Q "-sandbox off", "-sandbox: the clone sets its own (-sandbox on,...)");
	REFUSED(Q "-daemonize", "-daemonize: the clone runs QEMU itself; a clone may not");
	REFUSED(Q "-set netdev.n0.smb=/",
		"-set: changes other options' keys after the clone checked them; a clone may not");
	REFUSED(Q "-gdb tcp::1234", "-gdb: serves a debugger on the host; a clone may not");
	REFUSED(Q "-vnc :0", "-vnc: listens on the host; a clone may not");
	REFUSED(Q "--frobnicate x", "--frobnicate: not an option a clone may use");
	/* devices that pass host devices or name host paths */
	REFUSED(Q "-device vfio-pci,host=01:00.0",
		"-device vfio-pci: passes a host device through; a clone may not");
	REFUSED(Q "-device usb-host,hostbus=1", "-device usb-host: passes a host device through; a clone may not");
	REFUSED(Q "-device vhost-user-fs-pci,chardev=c",
		"-device vhost-user-fs-pci: connects to a host vhost backend; a clone may not");
	REFUSED(Q "-device vhost-vsock-pci,guest-cid=3",
		"-device vhost-vsock-pci: connects to a host vhost backend; a clone may not");
	REFUSED(Q "-device loader,file=/etc/shadow,addr=0x1000",
		"-device loader: loads a host file into the guest; a clone may not");
	REFUSED(Q "-device virtio-9p-pci,fsdev=f", "-device virtio-9p-pci: shares a host directory; a clone may not");
	REFUSED(Q "-device scsi-generic,drive=d", "-device scsi-generic: passes a host device through; a clone may not");
	REFUSED(Q "-device e1000,romfile=/etc/shadow", "-device e1000,romfile=/etc/shadow: romfile= "
		"loads a host file as the device's option ROM; a clone may not");
	REFUSED(Q "-device virtio-balloon", "-device virtio-balloon: gives memory back by punching "
		"the template file every clone maps; a clone may not");
	REFUSED(Q "-global vfio-pci.x-no-mmap=on",
		"-global vfio-pci: passes a host device through; a clone may not");
	REFUSED(Q "-global driver=e1000,property=romfile,value=/etc/passwd", "-global e1000,"
		"romfile=/etc/passwd: romfile= loads a host file as the device's option ROM; a clone "
		"may not");
	/* objects */
	REFUSED(Q "-object filter-dump,id=f,netdev=n0,file=/tmp/x",
		"-object filter-dump: writes the guest's traffic to a host file; a clone may not");
	REFUSED(Q "-object rng-random,id=r,filename=/dev/sda", "-object rng-random,filename=/dev/sda: "
		"a host file other than /dev/urandom; a clone may not");
	REFUSED(Q "-object secret,id=s,file=/etc/shadow",
		"-object secret,file=...: file= reads a host file; a clone may not (data= is fine)");
	REFUSED(Q "-object tls-creds-x509,id=t,dir=/etc/pki",
		"-object tls-creds-x509,dir=...: dir= reads a host directory of credentials; a clone "
		"may not");
	REFUSED(Q "-object input-linux,id=i,evdev=/dev/input/event0", "-object input-linux: not a "
		"type a clone may use (one that names host files, devices or programs, or that the "
		"clone does not know)");
	REFUSED(Q "-object memory-backend-epc,id=e,size=1M", "-object memory-backend-epc: not a type "
		"a clone may use (one that names host files, devices or programs, or that the clone "
		"does not know)");
	/* character devices */
	static const char *const chr[] = { "pty", "pipe", "tty", "serial", "parallel", "udp",
					   "stdio", "spicevmc", NULL };
	for (int i = 0; chr[i]; i++) {
		char line[256], msg[512];

		snprintf(line, sizeof(line), Q "-chardev %s,id=c0,path=/dev/ttyS0", chr[i]);
		snprintf(msg, sizeof(msg), "-chardev %s: reaches a host device, port or program; a "
			 "clone may use unix sockets, files, null and ring buffers", chr[i]);
		REFUSED(line, msg);
	}
	REFUSED(Q "-chardev socket,id=c0,host=0.0.0.0,port=4444,server=on",
		"-chardev socket without path= (tcp: host=, port=) listens on or connects to a host "
		"port; a clone may use unix sockets only");
	REFUSED(Q "-chardev file,id=c0,path=/x,logfile=/etc/cron.d/x",
		"-chardev file,logfile=...: logfile= writes a host file the clone does not make its "
		"own; a clone may not");
	REFUSED(Q "-serial tcp::4444,server", "-serial tcp::4444,server: reaches a host device, port "
		"or file the clone does not make its own; a clone may use none, null, file:, unix: and "
		"chardev:");
	REFUSED(Q "-serial /dev/ttyS0", "-serial /dev/ttyS0: reaches a host device, port or file the "
		"clone does not make its own; a clone may use none, null, file:, unix: and chardev:");
	REFUSED(Q "-monitor pty", "-monitor pty: reaches a host device, port or file the clone does "
		"not make its own; a clone may use none, null, unix: and chardev:");
	REFUSED(Q "-qmp tcp:0:4444,server", "-qmp tcp:0:4444,server: reaches a host device, port or "
		"file the clone does not make its own; a clone may use none, null, unix: and chardev:");
	REFUSED(Q "-monitor file:/etc/x", "-monitor file:/etc/x: reaches a host device, port or file "
		"the clone does not make its own; a clone may use none, null, unix: and chardev:");
	REFUSED(Q "-parallel /dev/parport0", "-parallel /dev/parport0: reaches a host device, port or "
		"file the clone does not make its own; a clone may use none, null and chardev:");
	REFUSED(Q "-debugcon file:/tmp/x", "-debugcon file:/tmp/x: reaches a host device, port or "
		"file the clone does not make its own; a clone may use none, null and chardev:");
	/* disks: only the frozen ones */
	REFUSED(Q "-drive file=/etc/shadow,if=virtio", "-drive file=/etc/shadow: not a frozen disk "
		"of the snapshot; a clone runs only on overlays of the disks its snapshot froze");
	REFUSED(Q "-drive file=/img/ro.iso,media=cdrom", "-drive file=/img/ro.iso: not a frozen disk "
		"of the snapshot; a clone runs only on overlays of the disks its snapshot froze");
	REFUSED(Q "-drive file=nbd:host:10809", "-drive file=nbd:host:10809: not a frozen disk of "
		"the snapshot; a clone runs only on overlays of the disks its snapshot froze");
	REFUSED(Q "-drive file=/img/disk.qcow2,format=vvfat",
		"-drive format=vvfat: a clone's disks are qcow2 or raw");
	REFUSED(Q "-drive file.filename=/dev/sda,file.driver=host_device",
		"-drive file.driver=host_device: reaches host storage other than the frozen disks' "
		"files; a clone may not");
	REFUSED(Q "-blockdev driver=host_device,filename=/dev/sda,node-name=h",
		"-blockdev driver=host_device: reaches host storage other than the frozen disks' "
		"files; a clone may use file, qcow2 and raw");
	REFUSED(Q "-blockdev driver=file,filename=/etc/shadow,node-name=f", "-blockdev driver=file,"
		"filename=/etc/shadow: not a frozen disk of the snapshot; a clone runs only on "
		"overlays of the disks its snapshot froze");
	REFUSED(Q "-blockdev driver=qcow2,node-name=q,file.driver=file,file.filename=/etc/x",
		"-blockdev driver=file,filename=/etc/x: not a frozen disk of the snapshot; a clone "
		"runs only on overlays of the disks its snapshot froze");
	REFUSED(Q "-blockdev {\"driver\":\"qcow2\",\"file\":{\"driver\":\"nbd\",\"server\":{}}}",
		"-blockdev driver=nbd: reaches host storage other than the frozen disks' files; a "
		"clone may use file, qcow2 and raw");
	REFUSED(Q "-blockdev driver=qcow2,node-name=q,file=f,data-file=/etc/x",
		"-blockdev qcow2,data-file=...: data-file= is not a key a clone may use");
	REFUSED(Q "-hdb /dev/sda", "-hdb /dev/sda: not a frozen disk of the snapshot; a clone runs "
		"only on overlays of the disks its snapshot froze");
	REFUSED(Q "/etc/shadow", "-(image) /etc/shadow: not a frozen disk of the snapshot; a clone "
		"runs only on overlays of the disks its snapshot froze");
	/* host files by other names */
	REFUSED(Q "-machine q35,kernel=/boot/vmlinuz", "-machine kernel=...: kernel= names a host "
		"file; a clone takes -kernel, -initrd, -dtb and -bios (from the directories it allows) "
		"instead");
	REFUSED(Q "-machine q35,firmware=/x.fd", "-machine firmware=...: firmware= names a host "
		"file; a clone takes -kernel, -initrd, -dtb and -bios (from the directories it allows) "
		"instead");
	REFUSED(Q "-option-rom /etc/shadow", "-option-rom: loads a host file into the guest; a clone may not");
	REFUSED(Q "-boot menu=on,splash=/etc/shadow",
		"-boot splash=...: splash= reads a host file; a clone may not");
	REFUSED(Q "-fw_cfg name=opt/x,file=/etc/shadow",
		"-fw_cfg file=...: file= reads a host file; a clone may not");
	REFUSED(Q "-smbios file=/etc/shadow", "-smbios file=...: file= reads a host file; a clone may not");
	REFUSED(Q "-trace events=/etc/shadow", "-trace events=...: events= is not a key a clone may use");
	REFUSED(Q "-display gtk", "-display gtk: reaches the host (a display, a sound device, a file "
		"or a device); a clone may use none only");
	REFUSED(Q "-audiodev wav,id=a,path=/tmp/x.wav", "-audiodev wav: reaches the host (a display, "
		"a sound device, a file or a device); a clone may use none only");
	REFUSED(Q "-usbdevice host:1234:5678", "-usbdevice host:1234:5678: a clone may use tablet, "
		"mouse and keyboard only (others reach host devices)");
	REFUSED(Q "-icount shift=7,rr=replay,rrfile=/etc/x",
		"-icount rr=...: record/replay reads or writes a host file; a clone may not");
}

static void binary(void)
{
	char err[512] = "", dir[] = "/tmp/hq-policy-bin.XXXXXX", path[600];
	char *old = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
	int fd;

	CHECK(hq_clone_check_binary("/tmp/evil.sh", err, sizeof(err)) == -EPERM &&
	      !strcmp(err, "the recorded QEMU binary /tmp/evil.sh is not named qemu-system-*; a "
		      "clone runs QEMU only (--qemu-binary names the one to run)"), "%s", err);
	CHECK(hq_clone_check_binary("sh", err, sizeof(err)) == -EPERM &&
	      !strcmp(err, "the recorded QEMU binary sh is not named qemu-system-*; a clone runs "
		      "QEMU only (--qemu-binary names the one to run)"), "%s", err);
	CHECK(hq_clone_check_binary("/nx/qemu-system-x86_64", err, sizeof(err)) == -EPERM &&
	      !strcmp(err, "the recorded QEMU binary /nx/qemu-system-x86_64 is not an executable "
		      "file (--qemu-binary names the one to run)"), "%s", err);
	CHECK(hq_clone_check_binary("./qemu-system-x86_64", err, sizeof(err)) == -EPERM &&
	      !strcmp(err, "the recorded QEMU binary ./qemu-system-x86_64 is a relative path; a "
		      "clone takes a plain name found in $PATH or an absolute path"), "%s", err);
	CHECK(mkdtemp(dir), "mkdtemp");
	snprintf(path, sizeof(path), "%s/qemu-system-x86_64", dir);
	fd = open(path, O_WRONLY | O_CREAT, 0755);
	CHECK(fd >= 0, "create %s", path);
	close(fd);
	CHECK(!hq_clone_check_binary(path, err, sizeof(err)), "absolute: %s", err);
	setenv("PATH", dir, 1);
	CHECK(!hq_clone_check_binary("qemu-system-x86_64", err, sizeof(err)), "in PATH: %s", err);
	CHECK(hq_clone_check_binary("qemu-system-aarch64", err, sizeof(err)) == -EPERM &&
	      !strcmp(err, "the recorded QEMU binary qemu-system-aarch64 is not in $PATH"), "%s", err);
	if (old)
		setenv("PATH", old, 1);
	free(old);
	unlink(path);
	rmdir(dir);
}

static void boot_files(void)
{
	char top[] = "/tmp/hq-policy-dir.XXXXXX", allow[300], out[300], f[2048], err[1024] = "";
	const char *dirs[1] = { allow };
	struct hq_clone_policy p = { .sz = sizeof(p), .allow_dirs = dirs, .nallow_dirs = 1 };
	struct hq_argv a;
	char line[2048], want[64];
	int fds[8], n = -1, fd, ret;
	struct stat st1, st2;

	CHECK(mkdtemp(top), "mkdtemp");
	snprintf(allow, sizeof(allow), "%s/allowed", top);
	snprintf(out, sizeof(out), "%s/secret", top);
	mkdir(allow, 0755);
	fd = open(out, O_WRONLY | O_CREAT, 0600);
	close(fd);
	snprintf(f, sizeof(f), "%s/vmlinux", allow);
	fd = open(f, O_WRONLY | O_CREAT, 0644);
	close(fd);
	snprintf(f, sizeof(f), "%s/bios", allow);
	mkdir(f, 0755);
	snprintf(f, sizeof(f), "%s/link", allow);
	CHECK(!symlink(out, f), "symlink");

	/* beneath: opened, replaced by /proc/self/fd/N */
	snprintf(line, sizeof(line), "qemu-system-x86_64 -kernel %s/vmlinux -L %s/bios -append x",
		 allow, allow);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	CHECK(!ret && n == 2, "beneath: %d %d %s", ret, n, err);
	if (!ret && n == 2) {
		snprintf(want, sizeof(want), "/proc/self/fd/%d", fds[0]);
		CHECK(!strcmp(a.argv[2], want), "-kernel %s", a.argv[2]);
		snprintf(f, sizeof(f), "%s/vmlinux", allow);
		CHECK(!fstat(fds[0], &st1) && !stat(f, &st2) && st1.st_ino == st2.st_ino,
		      "the kernel's descriptor");
		CHECK(!(fcntl(fds[0], F_GETFD) & FD_CLOEXEC), "inheritable");
		snprintf(want, sizeof(want), "/proc/self/fd/%d", fds[1]);
		CHECK(!strcmp(a.argv[4], want), "-L %s", a.argv[4]);
		close(fds[0]);
		close(fds[1]);
	}
	hq_argv_free(&a);

	/* outside, through "..", through a symlink out */
	snprintf(line, sizeof(line), "qemu-system-x86_64 -initrd %s", out);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	snprintf(f, sizeof(f), "-initrd %s: outside the allowed directories; a clone boots only "
		 "from files beneath the directories it allows (--allow-dir)", out);
	CHECK(ret == -EPERM && n == 0 && !strcmp(err, f), "outside: %d %s", ret, err);
	hq_argv_free(&a);

	snprintf(line, sizeof(line), "qemu-system-x86_64 -bios %s/../secret", allow);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	snprintf(f, sizeof(f), "-bios %s/../secret: outside the allowed directories; a clone boots "
		 "only from files beneath the directories it allows (--allow-dir)", allow);
	CHECK(ret == -EPERM && !strcmp(err, f), "dot-dot: %d %s", ret, err);
	hq_argv_free(&a);

	snprintf(line, sizeof(line), "qemu-system-x86_64 -dtb %s/link", allow);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	snprintf(f, sizeof(f), "-dtb %s/link: not found beneath its allowed directory (a link out "
		 "of it, or gone); a clone boots only from files beneath the directories it allows "
		 "(--allow-dir)", allow);
	CHECK(ret == -EPERM && !strcmp(err, f), "symlink out: %d %s", ret, err);
	hq_argv_free(&a);

	/* a name through a symlink to the allowed directory: its remainder, opened beneath it */
	snprintf(f, sizeof(f), "%s/alias", top);
	CHECK(!symlink(allow, f), "symlink to the directory");
	snprintf(line, sizeof(line), "qemu-system-x86_64 -kernel %s/alias/vmlinux", top);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	CHECK(!ret && n == 1, "through a symlinked directory: %d %s", ret, err);
	if (!ret)
		close(fds[0]);
	hq_argv_free(&a);
	snprintf(line, sizeof(line), "qemu-system-x86_64 -kernel %s/alias/link", top);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	CHECK(ret == -EPERM, "through a symlinked directory to a link out: %d %s", ret, err);
	hq_argv_free(&a);

	/* relative to the recorded cwd */
	p.cwd = allow;
	a = q_words("qemu-system-x86_64 -kernel vmlinux");
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	CHECK(!ret && n == 1, "relative: %d %s", ret, err);
	if (!ret)
		close(fds[0]);
	hq_argv_free(&a);

	/* no --allow-dir: as recorded (the CLI) */
	p.nallow_dirs = 0;
	snprintf(line, sizeof(line), "qemu-system-x86_64 -kernel %s", out);
	a = q_words(line);
	ret = hq_clone_open_paths(&a, &p, fds, 8, &n, err, sizeof(err));
	CHECK(!ret && n == 0 && !strcmp(a.argv[2], out), "no --allow-dir: %d", ret);
	hq_argv_free(&a);

	snprintf(f, sizeof(f), "rm -rf %s", top);
	CHECK(!system(f), "cleanup");
}

int main(void)
{
	static const struct {
		const char *qdev, *image, *overlay;
	} disks[] = {
		{ "vd0", "/img/disk.qcow2", "/c/ov0.qcow2" },
		{ "vd1", "/img/disk.raw", "/c/ov1.qcow2" },
		{ "cd0", "/img/ro.iso", NULL },
	};

	for (size_t i = 0; i < sizeof(disks) / sizeof(disks[0]); i++) {
		struct hq_disk *d = &ds.d[ds.n++];

		snprintf(d->image, sizeof(d->image), "%s", disks[i].image);
		if (disks[i].overlay)
			snprintf(d->overlay, sizeof(d->overlay), "%s", disks[i].overlay);
		d->frozen = disks[i].overlay != NULL;
	}
	guest_lines();
	refusals();
	binary();
	boot_files();
	return check_result();
}
