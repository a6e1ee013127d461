#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A real S3 object store for tests: SeaweedFS (its master, volume server and
# filer with the S3 gateway, one process group) on loopback, its data in DIR.
#
#   scripts/object-store-seaweedfs.sh start DIR   start it (or find it running), print
#                                       the lines to eval, e.g.
#                                       eval "$(scripts/object-store-seaweedfs.sh start DIR)"
#   scripts/object-store-seaweedfs.sh stop DIR    stop it and wait; the data stays in DIR
#   scripts/object-store-seaweedfs.sh status DIR  exit 0 if it runs, 1 if not
#
# start prints AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION and HALITE_TEST_BUCKET as `export K=V` lines: a fresh random key
# and an empty bucket of a random name. DIR (made 0700) holds weed.pid,
# weed.log, env (those lines) and s3.json (the key), all 0600.
# Environment: HALITE_WEED (the weed binary, default the one
# scripts/install-object-store.sh installs), HALITE_S3_START_TIMEOUT (seconds
# to wait for S3 to be ready, default 60).
set -euo pipefail
umask 077

REGION=us-east-1
WEED=${HALITE_WEED:-/usr/local/lib/halite/weed}

NAME=object-store-seaweedfs PIDFILE=weed.pid USAGE=3,18p
. "$(dirname -- "${BASH_SOURCE[0]}")/object-store-lib.sh"

# Four free loopback ports P, one per line, each with P + 10000 free too:
# weed's gRPC port for an HTTP port P. `weed filer -s3` tells its S3
# gateway the filer's address without the gRPC port, so the gateway can
# only find the filer's gRPC at P + 10000; every service keeps that rule.
# Held all at once while picking, so they differ; weed binds them again a
# moment later.
free_ports() {
	python3 - <<'EOF'
import random, socket
held, ports = [], []
while len(ports) < 4:
    p = random.randint(20000, 45000)
    try:
        pair = []
        for port in (p, p + 10000):
            s = socket.socket()
            pair.append(s)
            s.bind(("127.0.0.1", port))
    except OSError:
        for s in pair:
            s.close()
        continue
    held += pair
    ports.append(p)
print("\n".join(map(str, ports)))
EOF
}

# The HTTP status of an S3 request signed with the key in DIR/env.
s3_status() { # method path [curl-args...]
	local method=$1 path=$2
	shift 2
	curl -s -o /dev/null -w '%{http_code}' --max-time 20 -X "$method" "$@" \
		--aws-sigv4 "aws:amz:$REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
		"$AWS_ENDPOINT_URL/$path" || true
}

# How many processes of group $1 are left, and whether any is; a zombie
# (exited, not yet reaped by whoever inherited it) does not count.
# Whether PID is the filer of DIR (the group's leader), or any weed with an
# option naming a path in DIR.
leader_serves() { cmdline_has "$1" "-defaultStoreDir=$dir/filer"; }
member_serves() {
	tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" |
		awk -v want="=$dir/" '/^-/ && index($0, want) { found = 1 } END { exit !found }'
}

log_tail() {
	echo "object-store-seaweedfs: the last lines of $dir/weed.log:" >&2
	tail -n 30 "$dir/weed.log" >&2 || true
}

cmd_start() {
	local pid
	if pid=$(running_pid); then
		[[ -f $dir/env ]] || die "weed (pid $pid) serves $dir but $dir/env is missing: stop it first"
		cat "$dir/env"
		return
	fi
	[[ -x $WEED ]] || die "no weed at $WEED: install it with scripts/install-object-store.sh (or set HALITE_WEED)"
	command -v curl >/dev/null || die "curl is needed"
	# Unix sockets take paths of at most 107 bytes.
	(( ${#dir} <= 90 )) || die "$dir is too long a path for weed's unix sockets (at most 90 characters)"

	local ports master volume filer s3
	ports=$(free_ports) || die "could not pick free loopback ports"
	read -r -d '' master volume filer s3 <<<"$ports" || true
	[[ -n $s3 ]] || die "could not pick free loopback ports"

	AWS_ENDPOINT_URL=http://127.0.0.1:$s3
	AWS_ACCESS_KEY_ID=HAL$(random_text 17 'A-Z0-9')
	AWS_SECRET_ACCESS_KEY=$(random_text 40 'A-Za-z0-9')
	local bucket=halite-test-$(random_text 12 'a-z0-9')
	mkdir -p "$dir/volume" "$dir/master" "$dir/filer" "$dir/tmp"
	rm -f "$dir/env" "$dir/weed.pid"
	cat >"$dir/s3.json" <<EOF
{
  "identities": [
    {
      "name": "halite-test",
      "credentials": [
        { "accessKey": "$AWS_ACCESS_KEY_ID", "secretKey": "$AWS_SECRET_ACCESS_KEY" }
      ],
      "actions": ["Admin", "Read", "List", "Tagging", "Write"]
    }
  ]
}
EOF

	# Three processes (master, volume server, filer with the S3 gateway) in
	# one session, so stop can signal the whole group: the shell starts two
	# and becomes the third. Not `weed server`: it puts gRPC unix sockets at
	# fixed paths in /tmp, which a local user could take first; the separate
	# commands put theirs where they are told, inside DIR. Its own HOME and
	# TMPDIR there too, so no configuration of the machine's user is read
	# and nothing lands in /tmp. No telemetry, no Iceberg or Lance catalog
	# ports; volumes of 64 MiB made on demand, none preallocated; no wait
	# before a volume server stops.
	local t0=$SECONDS
	(
		cd "$dir"
		export HOME=$dir TMPDIR=$dir/tmp
		exec setsid bash -c '
			w=$1 d=$2 m=127.0.0.1:$3
			"$w" -logtostderr=true master -ip=127.0.0.1 -ip.bind=127.0.0.1 \
				-port="$3" -mdir="$d/master" -volumeSizeLimitMB=64 -telemetry=false &
			"$w" -logtostderr=true volume -ip=127.0.0.1 -ip.bind=127.0.0.1 \
				-port="$4" -master="$m" -dir="$d/volume" -max=0 -preStopSeconds=0 &
			exec "$w" -logtostderr=true filer -ip=127.0.0.1 -ip.bind=127.0.0.1 \
				-port="$5" -master="$m" \
				-defaultStoreDir="$d/filer" -localSocket="$d/filer.sock" \
				-s3 -s3.port="$6" -s3.localSocket="$d/s3.sock" \
				-s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$d/s3.json" \
				-s3.autoCreateBucket=false' \
			weed-store "$WEED" "$dir" "$master" "$volume" "$filer" "$s3"
	) </dev/null >"$dir/weed.log" 2>&1 9>&- &
	pid=$!
	echo "$pid" >"$dir/weed.pid"

	# S3 answers once the gateway listens and can make a bucket once the
	# filer is up, but an object write waits for the filer's lock ring,
	# which a fresh filer joins only after confirming for 10 s that it is
	# alone. Ready means an object can be written: a probe, then deleted.
	local limit=${HALITE_S3_START_TIMEOUT:-60} status=000 want=200 step=bucket
	while (( SECONDS - t0 < limit )); do
		# The shell needs a moment to start all three.
		if ! proc_alive "$pid" ||
			{ ((SECONDS - t0 >= 2)) && [[ $(group_size "$pid") != 3 ]]; }; then
			log_tail
			stop_group "$pid"
			rm -f "$dir/weed.pid"
			die "a weed process exited during start (see $dir/weed.log)"
		fi
		case $step in
		bucket) status=$(s3_status PUT "$bucket") ;;
		probe) status=$(s3_status PUT "$bucket/.start-probe" -T /dev/null) ;;
		esac
		if [[ $status == 200 && $step == bucket ]]; then
			step=probe
			continue
		fi
		[[ $status == 200 ]] && break
		sleep 0.3
	done
	if [[ $status == 200 ]]; then
		status=$(s3_status DELETE "$bucket/.start-probe")
		want=204
	fi
	if [[ $status != "$want" ]]; then
		log_tail
		stop_group "$pid"
		rm -f "$dir/weed.pid"
		die "S3 on $AWS_ENDPOINT_URL could not make bucket $bucket and write to it within $limit s (the $step: HTTP status $status)"
	fi
	store_ready "$bucket" "$pid" "$t0"
}

# Stop process group $1 (its leader the filer) and wait until none of it is
# left. The filer first, while the volume server and master it flushes its
# metadata log to still run (stopped together, it waits 15 s for them in
# vain); then the rest. Past 30 s each, weed is stuck, and the group is
# killed.
stop_group() {
	local pid=$1
	if proc_alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		wait_gone proc_alive "$pid" 300 ||
			echo "object-store-seaweedfs: the filer (pid $pid) ignored SIGTERM for 30 s" >&2
	fi
	kill -TERM -- "-$pid" 2>/dev/null || true
	if ! wait_gone group_alive "$pid" 300; then
		echo "object-store-seaweedfs: weed's process group $pid ignored SIGTERM for 30 s; killing it" >&2
		kill -KILL -- "-$pid" 2>/dev/null || true
		wait_gone group_alive "$pid" 50 || die "weed's process group $pid survived SIGKILL"
	fi
}

store_main "$@"
