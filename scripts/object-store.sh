#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A real S3 object store for tests: Ceph's radosgw over a throwaway
# one-monitor, one-OSD cluster (Debian's ceph-mon, ceph-osd, radosgw; no
# manager), on loopback, every file in DIR.
#
#   scripts/object-store.sh start DIR   start it (or find it running),
#                                           print the lines to eval, e.g.
#                                           eval "$(scripts/object-store.sh start DIR)"
#   scripts/object-store.sh stop DIR    stop it and wait
#   scripts/object-store.sh status DIR  exit 0 if it runs, 1 if not
#
# start prints AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION and HALITE_TEST_BUCKET as `export K=V` lines: a fresh random key
# and an empty bucket of a random name. The OSD keeps objects in memory
# (memstore), so a stopped store keeps no data: each start makes a new
# cluster. DIR (made 0700) holds ceph.conf, rgw.pid, rgw.log, env (those
# lines) and the cluster's state in cluster/, all 0600 or 0700.
# Environment: HALITE_S3_START_TIMEOUT (seconds to wait for S3 to be ready,
# default 60), HALITE_RGW_MEMORY_MB (the OSD's memory store, default 2048).
set -euo pipefail
umask 077

REGION=us-east-1
NAME=object-store PIDFILE=rgw.pid USAGE=3,20p
. "$(dirname -- "${BASH_SOURCE[0]}")/object-store-lib.sh"

# Two free loopback ports, one per line: the monitor's and S3's. Held both
# at once while picking, so they differ; the daemons bind them a moment
# later. The OSD picks its own in Ceph's range (6800-7300) as it binds.
free_ports() {
	python3 - <<'EOF'
import socket
held = []
for _ in range(2):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
print("\n".join(str(s.getsockname()[1]) for s in held))
EOF
}

# The HTTP status of an S3 request signed with the key being set up.
# radosgw takes a request without x-amz-content-sha256 as UNSIGNED-PAYLOAD,
# while curl 7.88 signs the hash of the body; the header makes them agree.
s3_status() { # method path [curl-args...]
	local method=$1 path=$2
	shift 2
	curl -s -o /dev/null -w '%{http_code}' --max-time 20 -X "$method" "$@" \
		-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
		--aws-sigv4 "aws:amz:$REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
		"$AWS_ENDPOINT_URL/$path" || true
}

# How many processes of group $1 are left, and whether any is; a zombie
# (exited, not yet reaped by whoever inherited it) does not count.
# Whether PID leads, or belongs to, the cluster of DIR: started with its ceph.conf.
leader_serves() { cmdline_has "$1" "$dir/ceph.conf"; }
member_serves() { cmdline_has "$1" "$dir/ceph.conf"; }

# Whether group $1 still has its leader and the three daemons.
group_whole() {
	local names
	names=$(ps -eo pgid=,stat=,comm= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { print $3 }' | sort | tr '\n' ' ')
	[[ $names == *ceph-mon* && $names == *ceph-osd* && $names == *radosgw* ]]
}
log_tail() {
	local f
	for f in "$dir/rgw.log" "$dir"/cluster/log/*.log; do
		[[ -s $f ]] || continue
		echo "object-store: the last lines of $f:" >&2
		tail -n 15 "$f" >&2 || true
	done
}

write_conf() { # fsid mon-port s3-port
	local c=$dir/cluster
	cat >"$dir/ceph.conf" <<EOF
# A throwaway cluster for tests, written by object-store.sh.
[global]
fsid = $1
mon host = [v2:127.0.0.1:$2]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
# Loopback only, one host, nothing kept: no keys to look after.
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
# A monitor stops when its disk is nearly full; a test machine's may be.
mon data avail warn = 1
mon data avail crit = 1
# radosgw makes about eight pools; 8 placement groups each keep the one
# OSD under its limit of placement groups. No manager: nothing autoscales.
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
# radosgw's start makes its pools one monitor proposal at a time, each
# after the propose interval (1 s by default).
paxos propose interval = 0.05
paxos min wait = 0.01
osd objectstore = memstore
memstore device bytes = $((${HALITE_RGW_MEMORY_MB:-2048} * 1048576))
umask = 077
run dir = $c/run
admin socket = $c/run/\$name.asok
pid file = $c/run/\$name.pid
crash dir = $c/crash
log file = $c/log/\$name.log
mon cluster log file = $c/log/cluster.log
keyring = $c/keyring
mon data = $c/mon
osd data = $c/osd
[client]
# radosgw asks for a secure connection to the monitor by default, which
# auth none cannot give ("get_initial_auth_request returned -13").
ms mon client mode = crc
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$3
rgw data = $c/rgw
rgw thread pool size = 64
EOF
}

cmd_start() {
	local pid
	if pid=$(running_pid); then
		[[ -f $dir/env ]] || die "radosgw's cluster (pid $pid) serves $dir but $dir/env is missing: stop it first"
		cat "$dir/env"
		return
	fi
	local b
	for b in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool; do
		command -v "$b" >/dev/null ||
			die "no $b: install it with apt-get install --no-install-recommends radosgw ceph-mon ceph-osd"
	done
	command -v curl >/dev/null || die "curl is needed"
	# Unix sockets take paths of at most 107 bytes.
	(( ${#dir} <= 70 )) || die "$dir is too long a path for Ceph's admin sockets (at most 70 characters)"
	[[ ${HALITE_RGW_MEMORY_MB:-2048} =~ ^[1-9][0-9]{0,5}$ ]] ||
		die "HALITE_RGW_MEMORY_MB='${HALITE_RGW_MEMORY_MB}' is not a size in MiB"
	# A stopped cluster left no data worth keeping (memstore): start anew.
	cmd_stop
	rm -rf -- "$dir/cluster"
	rm -f -- "$dir/env" "$dir/rgw.log"
	mkdir -p "$dir/cluster/mon" "$dir/cluster/osd" "$dir/cluster/rgw" \
		"$dir/cluster/run" "$dir/cluster/log" "$dir/cluster/crash"

	local ports mon s3
	ports=$(free_ports) || die "could not pick free loopback ports"
	read -r -d '' mon s3 <<<"$ports" || true
	[[ -n $s3 ]] || die "could not pick free loopback ports"
	local fsid osd_uuid
	fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
	osd_uuid=$(python3 -c 'import uuid; print(uuid.uuid4())')
	write_conf "$fsid" "$mon" "$s3"

	AWS_ENDPOINT_URL=http://127.0.0.1:$s3
	AWS_ACCESS_KEY_ID=HAL$(random_text 17 'A-Z0-9')
	AWS_SECRET_ACCESS_KEY=$(random_text 40 'A-Za-z0-9')
	local bucket=halite-test-$(random_text 12 'a-z0-9')

	# One session, so stop can signal the whole group: a shell makes the
	# monitor, starts it, registers and makes the OSD once the monitor
	# answers, starts it and radosgw, and waits. The daemons stay in the
	# foreground (-f) as its children. HOME is DIR, so no configuration of
	# the machine's user is read; every path the daemons write is set in
	# ceph.conf, inside DIR.
	local t0=$SECONDS
	(
		cd "$dir"
		export HOME=$dir TMPDIR=$dir/cluster/run CEPH_CONF=$dir/ceph.conf
		exec setsid bash -c '
			set -e
			conf=$1 d=$2 fsid=$3 mon=$4 uuid=$5
			monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon]" "$d/cluster/monmap" >/dev/null
			ceph-mon -c "$conf" --mkfs -i a --monmap "$d/cluster/monmap"
			chmod 0700 "$d/cluster/mon/store.db"
			ceph-mon -c "$conf" -i a -f &
			for i in $(seq 100); do
				id=$(ceph -c "$conf" --connect-timeout 5 osd new "$uuid" 2>/dev/null) && break
				sleep 0.2
			done
			[[ $id == 0 ]] || { echo "the monitor did not register the OSD"; exit 1; }
			ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$uuid"
			ceph-osd -c "$conf" -i 0 -f &
			radosgw -c "$conf" -n client.rgw -f &
			wait' \
			rgw-store "$dir/ceph.conf" "$dir" "$fsid" "$mon" "$osd_uuid"
	) </dev/null >"$dir/rgw.log" 2>&1 9>&- &
	pid=$!
	echo "$pid" >"$dir/rgw.pid"

	fail() {
		log_tail
		stop_group "$pid"
		rm -f "$dir/rgw.pid"
		die "$@"
	}

	# radosgw answers once it has made its pools on the OSD; then the user
	# and the bucket. Ready means an object can be written: a probe, then
	# deleted.
	local limit=${HALITE_S3_START_TIMEOUT:-60} status=000 want=200 step=listen
	while (( SECONDS - t0 < limit )); do
		proc_alive "$pid" || fail "the cluster's start failed (see $dir/rgw.log)"
		if ((SECONDS - t0 >= 5)) && [[ $step != listen ]] && ! group_whole "$pid"; then
			fail "a Ceph daemon exited during start (see $dir/cluster/log)"
		fi
		case $step in
		listen) status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$AWS_ENDPOINT_URL/" || true) ;;
		user)
			radosgw-admin -c "$dir/ceph.conf" user create --uid halite-test \
				--display-name halite-test --access-key "$AWS_ACCESS_KEY_ID" \
				--secret-key "$AWS_SECRET_ACCESS_KEY" >/dev/null 2>>"$dir/rgw.log" &&
				status=200 || status=000
			;;
		bucket) status=$(s3_status PUT "$bucket") ;;
		probe) status=$(s3_status PUT "$bucket/.start-probe" --data-binary '') ;;
		esac
		if [[ $status == 200 ]]; then
			case $step in
			listen) step=user; continue ;;
			user) step=bucket; continue ;;
			bucket) step=probe; continue ;;
			probe) break ;;
			esac
		fi
		sleep 0.2
	done
	if [[ $status == 200 && $step == probe ]]; then
		status=$(s3_status DELETE "$bucket/.start-probe")
		want=204
	fi
	if [[ $status != "$want" ]]; then
		fail "S3 on $AWS_ENDPOINT_URL was not ready within $limit s (the $step: status $status)"
	fi
	store_ready "$bucket" "$pid" "$t0"
}

# The pids of group $1's live processes named $2, and whether there is one.
group_named() { ps -eo pid=,pgid=,stat=,comm= | awk -v g="$1" -v n="$2" '$2 == g && $3 !~ /^Z/ && $4 == n { print $1 }'; }
named_alive() { [[ -n $(group_named "${1% *}" "${1#* }") ]]; }

# Stop process group $1 (the shell that started the daemons, and them) and
# wait until none of it is left. radosgw first, then the OSD, then the
# monitor: stopped with the OSD, radosgw waits for its last writes, and an
# OSD without its monitor waits 5 s to say goodbye. Nothing is kept, so
# nothing needs a clean shutdown: SIGKILL for what still runs after 10 s.
stop_group() {
	local pid=$1 name pids
	for name in radosgw ceph-osd; do
		pids=$(group_named "$pid" "$name")
		[[ -n $pids ]] || continue
		kill -TERM $pids 2>/dev/null || true
		wait_gone named_alive "$pid $name" 100 || true
	done
	kill -TERM -- "-$pid" 2>/dev/null || true
	if ! wait_gone group_alive "$pid" 100; then
		echo "object-store: process group $pid ignored SIGTERM for 10 s; killing it" >&2
		kill -KILL -- "-$pid" 2>/dev/null || true
		wait_gone group_alive "$pid" 50 || die "process group $pid survived SIGKILL"
	fi
}

store_main "$@"
