#!/usr/bin/env bash
# install.sh on a fresh Debian under a real systemd (systemd-nspawn), by hand:
# tests/deploy runs install.sh on the test machine without systemd; this
# checks what only systemd shows. A first install writes the starter config
# and starts nothing; the next run enables and starts the sandboxed unit, the
# gateway answers /healthz and takes a record; a rerun restarts it and the
# record is still there; exit 2 (bad config) is not restarted, kill -9 is;
# --uninstall stops and removes it, --purge the rest.
#
#   deploy/test-install.sh [--arch ARCH] [ROOT]
#       as root; ROOT default /var/tmp/edgegw-test-root (-ARCH with --arch),
#       kept for the next run. --arch arm64 (or another Debian architecture)
#       installs and boots a Debian of that architecture under qemu-user
#       emulation: the same checks, with the wheels pip picks for it (about
#       8 minutes on x86_64 once the root exists, 10 more to make it).
# Needs debootstrap and systemd-container (apt-get install), the network to
# deb.debian.org and the package index, and python3 with pip to build the wheel;
# with --arch, also qemu-user-static and binfmt-support.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=""
if [ "${1:-}" = --arch ]; then
    ARCH=${2:?--arch needs an architecture, e.g. arm64}
    shift 2
fi
ROOT=${1:-/var/tmp/edgegw-test-root${ARCH:+-$ARCH}}
PORT=18470
LOG=$ROOT.boot.log
PROG=${0##*/}

say() { printf '%s: %s\n' "$PROG" "$*"; }
fail() {
    printf '%s: FAILED: %s\n' "$PROG" "$*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || fail "run as root"
for tool in debootstrap systemd-nspawn nsenter curl; do
    command -v "$tool" >/dev/null || fail "$tool missing (apt-get install debootstrap systemd-container curl)"
done

FOREIGN=()
if [ -n "$ARCH" ] && [ "$ARCH" != "$(dpkg --print-architecture)" ]; then
    # A foreign root runs under qemu-user: binfmt_misc hands its binaries to
    # the emulator (registered with the F flag, so it works inside the root).
    command -v qemu-aarch64-static >/dev/null || fail "qemu-user-static missing (apt-get install qemu-user-static binfmt-support)"
    [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable >/dev/null 2>&1 || true
    FOREIGN=(--arch="$ARCH")
fi
if [ ! -x "$ROOT/lib/systemd/systemd" ]; then
    say "debootstrap Debian 12${ARCH:+ ($ARCH)} into $ROOT (a few minutes; ~10 emulated)"
    debootstrap "${FOREIGN[@]}" --variant=minbase \
        --include=python3,python3-venv,ca-certificates,systemd,systemd-sysv,dbus \
        bookworm "$ROOT" http://deb.debian.org/debian >"$ROOT.debootstrap.log"
fi
# The host's CA bundle: the package index may sit behind a proxy with its own CA.
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
cp -r "$REPO/deploy" "$ROOT/src/"
python3 -m pip wheel --quiet --no-deps -w "$ROOT/src" "$REPO"
WHEEL=$(cd "$ROOT/src" && ls edgegw-*.whl)

say "booting it with systemd-nspawn"
systemd-nspawn -q --register=no --keep-unit -D "$ROOT" -b </dev/null >"$LOG" 2>&1 &
NSPAWN=$!
INIT=""
for _ in $(seq 100); do
    INIT=$(pgrep -P "$NSPAWN" systemd || true)
    [ -n "$INIT" ] && break
    sleep 0.2
done
[ -n "$INIT" ] || fail "the container did not boot: $LOG"
inside() { nsenter -t "$INIT" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
stop_container() {
    inside systemctl poweroff >/dev/null 2>&1 || kill "$NSPAWN" 2>/dev/null || true
    wait "$NSPAWN" 2>/dev/null || true
}
trap stop_container EXIT
for _ in $(seq 150); do
    case "$(inside systemctl is-system-running 2>/dev/null || true)" in
        running | degraded) break ;;
    esac
    sleep 0.2
done
say "inside: Debian $(inside cat /etc/debian_version) on $(inside uname -m)"
install_sh() { inside /src/deploy/install.sh --from "/src/$WHEEL" "$@"; }
healthz() { curl -fsS --max-time 5 "http://127.0.0.1:$PORT/healthz"; }
wait_healthz() {
    for _ in $(seq 100); do
        healthz >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    inside journalctl -u edgegw --no-pager | tail -20 >&2
    fail "no /healthz on port $PORT"
}

inside /src/deploy/install.sh --uninstall --purge >/dev/null

say "1. first install: config written, nothing started"
install_sh --region test-1 | tee "$ROOT.out"
grep -q "not started: first edit" "$ROOT.out" || fail "a first install started the gateway"
[ "$(inside systemctl is-enabled edgegw 2>/dev/null || true)" != enabled ] || fail "enabled on first install"

say "2. second run: enabled and started under systemd"
sed -i "s|^# listen = \"127.0.0.1:8470\".*|listen = \"127.0.0.1:$PORT\"|" "$ROOT/etc/edgegw/edgegw.toml"
install_sh | tee "$ROOT.out"
grep -q "enabled and started" "$ROOT.out" || fail "not started on the second run"
wait_healthz
[ "$(stat -c %a "$ROOT/var/lib/edgegw")" = 750 ] || fail "data directory mode $(stat -c %a "$ROOT/var/lib/edgegw")"
curl -fsS -X POST -H 'content-type: application/json' --data '{"records":[{"value":"kept"}]}' \
    "http://127.0.0.1:$PORT/v1/topics/telemetry/records" >/dev/null || fail "produce failed"

say "3. a rerun restarts it; the record is still there"
install_sh | tee "$ROOT.out"
grep -q "restarted edgegw.service" "$ROOT.out" || fail "not restarted on upgrade"
wait_healthz
curl -fsS "http://127.0.0.1:$PORT/v1/topics/telemetry/partitions/0/records?offset=0" | grep -q '"kept"' \
    || fail "the record is gone after the restart"

say "4. exit 2 (bad config) is not restarted; kill -9 is"
cp "$ROOT/etc/edgegw/edgegw.toml" "$ROOT/edgegw.toml.good"
sed -i 's/^region = "test-1"$/region = "test-1"\nno_such_key = 1/' "$ROOT/etc/edgegw/edgegw.toml"
inside systemctl restart edgegw || true
sleep 8
STATE=$(inside systemctl show edgegw -p ExecMainStatus -p NRestarts | sort | tr '\n' ' ')
[ "$STATE" = "ExecMainStatus=2 NRestarts=0 " ] || fail "after exit 2: $STATE"
cp "$ROOT/edgegw.toml.good" "$ROOT/etc/edgegw/edgegw.toml"
inside systemctl start edgegw
wait_healthz
inside systemctl kill -s KILL edgegw
sleep 7
wait_healthz
inside systemctl show edgegw -p NRestarts | grep -q 'NRestarts=1' || fail "not restarted after kill -9"

say "5. --uninstall stops and removes the service; config and data stay; --purge removes them"
inside /src/deploy/install.sh --uninstall
! healthz >/dev/null 2>&1 || fail "still answering after --uninstall"
if [ ! -f "$ROOT/etc/edgegw/edgegw.toml" ] || [ ! -d "$ROOT/var/lib/edgegw/journal" ]; then
    fail "--uninstall removed config or data"
fi
inside /src/deploy/install.sh --uninstall --purge
if [ -e "$ROOT/etc/edgegw" ] || [ -e "$ROOT/var/lib/edgegw" ]; then fail "--purge left config or data"; fi
say "all checks passed on $(chroot "$ROOT" uname -m)"
