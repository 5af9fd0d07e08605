#!/usr/bin/env bash
# make image-test: start the image's own entrypoint and command, with the
# image's environment and user, inside the image's root filesystem
# (buildah run --isolation chroot: shares the host's network, so loopback
# works), against bin/opal-devserver serving examples/policy, and ask OPA for
# a decision; then restart it with the server gone and get the decision
# from the offline-mode backup. Bounded: every wait has a deadline, the agent runs under
# `timeout`, and the trap stops what was started and removes the container.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/opal-client:dev}
BUILDAH=${BUILDAH:-buildah}
DEADLINE=${DEADLINE:-45} # seconds for each decision to come

free_port() { # a port nothing listens on now (the kernel's pick)
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
		shuf -i 20000-60000 -n 1
}

work=$(mktemp -d)
ctr=""
dev_pid=""
agent_pid=""
cleanup() {
	set +e
	[ -n "$agent_pid" ] && kill -TERM "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
	[ -n "$dev_pid" ] && kill -TERM "$dev_pid" 2>/dev/null && wait "$dev_pid" 2>/dev/null
	[ -n "$ctr" ] && "$BUILDAH" umount "$ctr" >/dev/null 2>&1
	[ -n "$ctr" ] && "$BUILDAH" rm "$ctr" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "image-test: FAIL: $*" >&2
	echo "--- agent log" >&2; tail -n 40 "${agent_log:-$work/agent.log}" >&2 || true
	echo "--- dev server log" >&2; tail -n 20 "$work/dev.log" >&2 || true
	exit 1
}

dev_port=$(free_port)
api_port=$(free_port)
opa_port=$(free_port)

timeout 120 bin/opal-devserver -addr "127.0.0.1:$dev_port" -policy-dir examples/policy -poll 0 >"$work/dev.log" 2>&1 &
dev_pid=$!

# The image's configuration, read back from the image itself.
entrypoint=$("$BUILDAH" inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$IMAGE")
cmd=$("$BUILDAH" inspect --type image --format '{{range .OCIv1.Config.Cmd}}{{.}} {{end}}' "$IMAGE")
user=$("$BUILDAH" inspect --type image --format '{{.OCIv1.Config.User}}' "$IMAGE")
[ "${user%%:*}" != "0" ] && [ -n "$user" ] || fail "image user is '$user', want non-root"
ctr=$("$BUILDAH" from --pull-never "$IMAGE")
# The container's root filesystem, to see afterwards what the agent wrote.
mnt=$("$BUILDAH" mount "$ctr")
touch "$work/start"
# The backup volume, as a Kubernetes emptyDir with fsGroup would give it:
# a directory the image's user owns.
mkdir -p "$work/backup"
chown "${user%%:*}" "$work/backup"

# Only the server URL and the ports change: the host (0.0.0.0) comes from the
# image's environment. Free ports, because other processes on this machine
# may hold 7000/8181. UVICORN_PORT is the image's API port setting; the
# OPAL_ name is set too for builds that read only that. Offline mode is on,
# with the backup volume, as in deploy/kubernetes.
start_agent() { # $1: log file
	# shellcheck disable=SC2086
	timeout 90 "$BUILDAH" run --isolation chroot \
		--env OPAL_SERVER_URL="http://127.0.0.1:$dev_port" \
		--env OPAL_CLIENT_TOKEN= \
		--env UVICORN_PORT="$api_port" \
		--env OPAL_CLIENT_API_SERVER_PORT="$api_port" \
		--env OPAL_INLINE_OPA_CONFIG="{\"addr\":\"0.0.0.0:$opa_port\"}" \
		--env OPAL_OFFLINE_MODE_ENABLED=true \
		--volume "$work/backup:/opal/backup" \
		"$ctr" -- $entrypoint $cmd >"$1" 2>&1 &
	agent_pid=$!
	agent_log=$1
}

wait_decision() {
	decision=""
	for _ in $(seq $((DEADLINE * 4))); do
		kill -0 "$agent_pid" 2>/dev/null || fail "the agent exited"
		decision=$(curl -s -m 2 -X POST "http://127.0.0.1:$opa_port/v1/data/app/rbac/allow" \
			-d '{"input":{"user":"bob","action":"write","resource":"documents"}}' || true)
		[ "$decision" = '{"result":true}' ] && return
		sleep 0.25
	done
	fail "no decision within ${DEADLINE}s (last answer: '$decision')"
}

# The agent's own process among the descendants of `timeout buildah run`.
descendants() { local c; for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done; }
find_agent() {
	agent_proc=""
	for p in $(descendants "$agent_pid"); do
		case "$(readlink "/proc/$p/exe" 2>/dev/null)" in
		*/opal-client) agent_proc=$p ;;
		esac
	done
	[ -n "$agent_proc" ] || fail "cannot find the agent's process"
}

# The orderly shutdown: SIGTERM to the agent itself (buildah run answers a
# signal by killing its child), which exits 0, and so does buildah run.
stop_agent() {
	find_agent
	kill -TERM "$agent_proc"
	local rc=0
	wait "$agent_pid" || rc=$?
	agent_pid=""
	[ "$rc" = 0 ] || fail "exit $rc after SIGTERM"
	grep -q 'stopped' "$agent_log" || fail "no 'stopped' line after SIGTERM"
}

start_agent "$work/agent.log"
wait_decision

for path in /healthcheck /ready; do
	code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$api_port$path")
	[ "$code" = 200 ] || fail "GET $path answered $code"
done
# Served on every interface, as the image's environment says.
ss -ltn 2>/dev/null | grep -qE "(0\.0\.0\.0|\*|\[::\]):$opa_port\b" || [ ! -x "$(command -v ss)" ] ||
	fail "OPA does not listen on all interfaces"

# The agent runs as the image's user.
find_agent
agent_uid=$(awk '/^Uid:/ {print $2}' "/proc/$agent_proc/status")
[ "$agent_uid" != 0 ] || fail "the agent runs as root"

stop_agent

# Offline mode wrote its backup, as the image's user, into the volume at
# the image's OPAL_STORE_BACKUP_PATH; nothing else on the root filesystem
# changed (what readOnlyRootFilesystem in deploy/kubernetes relies on).
[ -s "$work/backup/opa.json" ] || fail "no backup at /opal/backup/opa.json"
owner=$(stat -c %u "$work/backup/opa.json")
[ "$owner" = "$agent_uid" ] || fail "backup owned by uid $owner"
# buildah run itself provides /etc/{hosts,resolv.conf,hostname} and the
# /proc, /dev, /sys, /run mount points; those are not the agent's.
changed=$(cd "$mnt" && find . -mindepth 1 -xdev -newer "$work/start" \
	! -path ./etc ! -path ./etc/hosts ! -path ./etc/resolv.conf ! -path ./etc/hostname \
	! -path ./proc ! -path ./dev ! -path ./sys ! -path ./run \
	! -path ./opal/backup ! -path './opal/backup/*' -print)
[ -z "$changed" ] || fail "the agent wrote outside /opal/backup: $changed"

# A restart with the OPAL server gone serves the backed-up policy.
kill -TERM "$dev_pid" && wait "$dev_pid" 2>/dev/null || true
dev_pid=""
start_agent "$work/agent-offline.log"
wait_decision
grep -q 'restored' "$work/agent-offline.log" || fail "no restore logged with the server down"
stop_agent

echo "image-test: ok: $IMAGE (uid $agent_uid) answered $decision; /healthcheck and /ready 200; exit 0 on SIGTERM; backup written, nothing else; restored with the server down"
