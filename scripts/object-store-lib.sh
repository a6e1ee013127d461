# SPDX-License-Identifier: MIT
# What the test object stores' scripts share (scripts/object-store.sh,
# radosgw; scripts/object-store-seaweedfs.sh, SeaweedFS): sourced, not run.
#
# The script sets NAME (its messages' prefix), PIDFILE (the file in DIR that
# names its process group's leader) and USAGE (the lines of its top comment
# that say how to use it, for sed -n), and defines:
#   cmd_start          start the store in $dir, print the export lines
#   leader_serves PID  whether PID is the leader of the store serving $dir
#   member_serves PID  whether PID, of the group, serves $dir (its command line)
#   stop_group PID     stop the group PID leads and wait until none of it is left
# then calls store_main "$@".

die() { echo "$NAME: $*" >&2; exit 1; }

# The pid in DIR/$PIDFILE if that process runs and is the leader of the
# store serving DIR (the file may outlive a crash, and the pid be reused).
running_pid() {
	local pid
	[[ -f $dir/$PIDFILE ]] || return 1
	pid=$(<"$dir/$PIDFILE")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	leader_serves "$pid" || return 1
	echo "$pid"
}

# Whether /proc/PID/cmdline has the argument $2 exactly.
cmdline_has() {
	# grep reads to the end (no -q): tr must not die of SIGPIPE under pipefail.
	tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -xF -- "$2" >/dev/null
}

# Random text of $1 characters from the alphabet $2 (tr's classes).
random_text() {
	LC_ALL=C tr -dc "$2" </dev/urandom | head -c "$1" || true
}

group_size() { ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/' | wc -l; }
group_alive() { [[ $(group_size "$1") != 0 ]]; }
# Whether a live process of group $1 serves DIR (member_serves).
group_serves() {
	local p
	for p in $(ps -eo pid=,pgid=,stat= | awk -v g="$1" '$2 == g && $3 !~ /^Z/ { print $1 }'); do
		member_serves "$p" && return 0
	done
	return 1
}
proc_alive() { [[ $(ps -o stat= -p "$1" 2>/dev/null) == [^Z]* ]]; }

# Wait up to $3 tenths of a second for the test "$1 $2" to fail.
wait_gone() { # test arg tenths
	local i
	for ((i = 0; i < $3; i++)); do
		"$1" "$2" || return 0
		sleep 0.1
	done
	! "$1" "$2"
}

# Ready: DIR/env (0600) holds the export lines of the store, and they are
# printed for eval. $1 the bucket, $2 the leader's pid, $3 when start began
# ($SECONDS).
store_ready() {
	cat >"$dir/env" <<EOT
export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL
export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID
export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
export AWS_REGION=$REGION
export HALITE_TEST_BUCKET=$1
EOT
	echo "$NAME: S3 ready on $AWS_ENDPOINT_URL in $((SECONDS - $3)) s (pid $2)" >&2
	cat "$dir/env"
}

cmd_stop() {
	local pid
	if pid=$(running_pid); then
		stop_group "$pid"
	else
		# The leader may have died and left the rest of its group.
		pid=$(cat "$dir/$PIDFILE" 2>/dev/null || true)
		if [[ $pid =~ ^[0-9]+$ ]] && group_serves "$pid"; then
			stop_group "$pid"
		fi
	fi
	rm -f "$dir/$PIDFILE"
}

# start|stop|status DIR, one at a time per DIR: two starts must not make two stores.
store_main() {
	case "${1:-}" in
	-h|--help) sed -n "$USAGE" "$0"; exit 0 ;;
	esac
	[[ $# -eq 2 ]] || { sed -n "$USAGE" "$0" >&2; exit 2; }
	local action=$1
	case $action in
	start)
		# A directory given that exists keeps its mode: what start writes in
		# it is 0600 or 0700 anyway (umask 077).
		[[ -d $2 ]] || mkdir -p -m 0700 -- "$2"
		;;
	stop|status) [[ -d $2 ]] || { [[ $action == stop ]] && exit 0; exit 1; } ;;
	*) echo "$NAME: unknown action '$action' (start, stop or status)" >&2; exit 2 ;;
	esac
	dir=$(cd -- "$2" && pwd -P)
	exec 9>"$dir/lock"
	flock 9
	case $action in
	start) cmd_start ;;
	stop) cmd_stop ;;
	status) running_pid >/dev/null ;;
	esac
}
