#!/usr/bin/env bash
# make image-test: start the image's own entrypoint and command, with the
# image's environment and user, inside the image's root filesystem
# (buildah run --isolation chroot: shares the host's network, so loopback
# works), against bin/opal-devserver serving examples/policy, and ask OPA for
# a decision. Bounded: every wait has a deadline, the agent runs under
# `timeout`, and the trap stops what was started and removes the container.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/opal-client:dev}
BUILDAH=${BUILDAH:-buildah}
DEADLINE=${DEADLINE:-60} # seconds for the agent to load the policy

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
	[ -n "$ctr" ] && "$BUILDAH" rm "$ctr" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "image-test: FAIL: $*" >&2
	echo "--- agent log" >&2; tail -n 40 "$work/agent.log" >&2 || true
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

# Only the server URL and the ports change: the host (0.0.0.0) comes from the
# image's environment. Free ports, because other processes on this machine
# may hold 7000/8181. UVICORN_PORT is the image's API port setting; the
# OPAL_ name is set too for builds that read only that.
# shellcheck disable=SC2086
timeout 90 "$BUILDAH" run --isolation chroot \
	--env OPAL_SERVER_URL="http://127.0.0.1:$dev_port" \
	--env OPAL_CLIENT_TOKEN= \
	--env UVICORN_PORT="$api_port" \
	--env OPAL_CLIENT_API_SERVER_PORT="$api_port" \
	--env OPAL_INLINE_OPA_CONFIG="{\"addr\":\"0.0.0.0:$opa_port\"}" \
	"$ctr" -- $entrypoint $cmd >"$work/agent.log" 2>&1 &
agent_pid=$!

decision=""
for _ in $(seq $((DEADLINE * 4))); do
	kill -0 "$agent_pid" 2>/dev/null || fail "the agent exited"
	decision=$(curl -s -m 2 -X POST "http://127.0.0.1:$opa_port/v1/data/app/rbac/allow" \
		-d '{"input":{"user":"bob","action":"write","resource":"documents"}}' || true)
	[ "$decision" = '{"result":true}' ] && break
	sleep 0.25
done
[ "$decision" = '{"result":true}' ] || fail "no decision within ${DEADLINE}s (last answer: '$decision')"

for path in /healthcheck /ready; do
	code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$api_port$path")
	[ "$code" = 200 ] || fail "GET $path answered $code"
done
# Served on every interface, as the image's environment says.
ss -ltn 2>/dev/null | grep -qE "(0\.0\.0\.0|\*|\[::\]):$opa_port\b" || [ ! -x "$(command -v ss)" ] ||
	fail "OPA does not listen on all interfaces"

# The agent runs as the image's user: find the opal-client process among
# the descendants of `timeout buildah run` and read its uid.
descendants() { local c; for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done; }
agent_uid=""
agent_proc=""
for p in $(descendants "$agent_pid"); do
	case "$(readlink "/proc/$p/exe" 2>/dev/null)" in
	*/opal-client) agent_proc=$p agent_uid=$(awk '/^Uid:/ {print $2}' "/proc/$p/status") ;;
	esac
done
[ -n "$agent_uid" ] || fail "cannot find the agent's process"
[ "$agent_uid" != 0 ] || fail "the agent runs as root"

# The orderly shutdown: SIGTERM to the agent itself (buildah run answers a
# signal by killing its child), which exits 0, and so does buildah run.
kill -TERM "$agent_proc"
rc=0
wait "$agent_pid" || rc=$?
agent_pid=""
[ "$rc" = 0 ] || fail "exit $rc after SIGTERM"
grep -q 'stopped' "$work/agent.log" || fail "no 'stopped' line after SIGTERM"

echo "image-test: ok: $IMAGE (uid $agent_uid) answered $decision; /healthcheck and /ready 200; exit 0 on SIGTERM"
