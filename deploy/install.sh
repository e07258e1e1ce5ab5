#!/usr/bin/env bash
# Install, upgrade or remove one edgegw gateway on Debian, Ubuntu or Raspberry
# Pi OS (x86_64 or arm64). Run as root; safe to run again (docs/operations.md,
# "Install").
#
#   install.sh --region factory-7               first install: latest edgegw from the index
#   install.sh --version 0.1.0                  upgrade in place (config and data untouched)
#   install.sh --from ./edgegw-0.1.0-py3-none-any.whl --region factory-7   air-gapped site
#   install.sh --uninstall                      remove the program and the unit, keep config and data
#   install.sh --uninstall --purge              remove config, data (the journal!) and the user too
#
# What it does: checks the OS, the architecture and Python (3.11+ with venv);
# creates the system user; creates a venv under the prefix and pip-installs
# edgegw into it; writes a starter config with `edgegw init` unless one exists
# (an existing config is never overwritten, the data directory never touched);
# installs the systemd unit (edgegw.service, next to this script) with the paths
# filled in. A first install stops there (the starter config must be edited
# first); a later run, when systemd runs this machine, enables and starts the
# service, or restarts it if it was running.
set -euo pipefail
# The caller's Python environment must not leak into the venv: with PYTHONPATH
# set, pip counts what it finds there as installed and leaves it out.
unset PYTHONPATH PYTHONHOME PYTHONUSERBASE PIP_TARGET PIP_PREFIX PIP_USER

PROG=${0##*/}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UNIT_TEMPLATE="$HERE/edgegw.service"
UNIT_NAME=edgegw.service

PREFIX=/opt/edgegw
CONFIG_DIR=/etc/edgegw
DATA_DIR=/var/lib/edgegw
UNIT_DIR=/etc/systemd/system
SERVICE_USER=edgegw
PYTHON=python3
VERSION=""
FROM=""
REGION=""
UNINSTALL=0
PURGE=0
NO_START=0

usage() {
    cat <<EOF
usage: $PROG [options]

Install or upgrade edgegw (a venv under the prefix, a system user, a starter
config, the systemd unit). Run again to upgrade; an existing config and data
directory are kept.

  --region NAME       this site's region (required on the first install: edgegw init)
  --version X         install edgegw==X from the package index (default: the latest)
  --from PATH         install from a wheel or a source checkout instead (air-gapped sites)
  --python PATH       the Python 3.11+ to build the venv with (default: python3)
  --prefix DIR        where the venv goes (default: $PREFIX)
  --config-dir DIR    where edgegw.toml and env live (default: $CONFIG_DIR)
  --data-dir DIR      the data directory: journal, state (default: $DATA_DIR)
  --unit-dir DIR      where the systemd unit goes (default: $UNIT_DIR)
  --user NAME         the system user the gateway runs as (default: $SERVICE_USER)
  --no-start          leave systemd alone: no enable, start, stop or daemon-reload
  --uninstall         remove the program and the unit; config and data stay
  --purge             with --uninstall: also remove config, data and the user
  -h, --help          this text
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
need_value() {
    if [ "$#" -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value (see --help)"; fi
}

while [ "$#" -gt 0 ]; do
    case "$1" in
        --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    esac
    case "$1" in
        --region) need_value "$@"; REGION=$2; shift 2 ;;
        --version) need_value "$@"; VERSION=$2; shift 2 ;;
        --from) need_value "$@"; FROM=$2; shift 2 ;;
        --python) need_value "$@"; PYTHON=$2; shift 2 ;;
        --prefix) need_value "$@"; PREFIX=$2; shift 2 ;;
        --config-dir) need_value "$@"; CONFIG_DIR=$2; shift 2 ;;
        --data-dir) need_value "$@"; DATA_DIR=$2; shift 2 ;;
        --unit-dir) need_value "$@"; UNIT_DIR=$2; shift 2 ;;
        --user) need_value "$@"; SERVICE_USER=$2; shift 2 ;;
        --no-start) NO_START=1; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
done

CONFIG="$CONFIG_DIR/edgegw.toml"
UNIT="$UNIT_DIR/$UNIT_NAME"

for dir in "$PREFIX" "$CONFIG_DIR" "$DATA_DIR" "$UNIT_DIR"; do
    case "$dir" in
        /?*) ;;
        *) die "paths must be absolute and not /: $dir" ;;
    esac
done
[ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || die "--purge goes with --uninstall"
[ -z "$VERSION" ] || [ -z "$FROM" ] || die "--version and --from exclude each other"
[ "$(id -u)" = 0 ] || die "run as root (it creates a system user and writes under $PREFIX, $CONFIG_DIR, $DATA_DIR)"

# systemd manages this machine (sd_booted(3)): not so in a chroot or most containers.
systemd_running() { [ -d /run/systemd/system ]; }

# ---------------------------------------------------------------- uninstall

if [ "$UNINSTALL" = 1 ]; then
    if [ "$NO_START" = 0 ] && systemd_running && [ -e "$UNIT" ]; then
        systemctl disable --now "$UNIT_NAME" || true
    fi
    if [ -e "$UNIT" ]; then
        rm -f "$UNIT"
        say "removed $UNIT"
        if [ "$NO_START" = 0 ] && systemd_running; then systemctl daemon-reload; fi
    fi
    if [ -d "$PREFIX" ]; then
        # Only ever delete a directory this script made: a venv with edgegw in it.
        [ -f "$PREFIX/pyvenv.cfg" ] || die "$PREFIX is not a venv (no pyvenv.cfg): not removing it"
        rm -rf "$PREFIX"
        say "removed $PREFIX"
    fi
    if [ "$PURGE" = 1 ]; then
        if [ -d "$DATA_DIR" ]; then
            # A mistyped --data-dir must not cost a directory that is not edgegw's.
            if [ -e "$DATA_DIR/edgegw.lock" ] || [ -d "$DATA_DIR/journal" ] || [ -z "$(ls -A "$DATA_DIR")" ]; then
                rm -rf "$DATA_DIR"
                say "removed $DATA_DIR (journal and state; a bucket kept inside it is gone too)"
            else
                die "$DATA_DIR does not look like an edgegw data directory (no edgegw.lock, no journal/): not removing it"
            fi
        fi
        if [ -d "$CONFIG_DIR" ]; then
            # Only the files this script made; the directory if nothing else is in it.
            rm -f "$CONFIG" "$CONFIG_DIR/env"
            if rmdir "$CONFIG_DIR" 2>/dev/null; then
                say "removed $CONFIG_DIR"
            else
                say "removed $CONFIG and $CONFIG_DIR/env; kept $CONFIG_DIR (other files in it)"
            fi
        fi
        if getent passwd "$SERVICE_USER" >/dev/null; then
            userdel "$SERVICE_USER"
            say "removed user $SERVICE_USER"
        fi
    else
        say "kept $CONFIG_DIR and $DATA_DIR (and user $SERVICE_USER): --uninstall --purge removes them"
    fi
    exit 0
fi

# ---------------------------------------------------------------- checks

[ -f "$UNIT_TEMPLATE" ] || die "$UNIT_TEMPLATE not found: run this script from edgegw's deploy/ directory"
[ -r /etc/os-release ] || die "no /etc/os-release: this script supports Debian, Ubuntu and Raspberry Pi OS"
# shellcheck disable=SC1091
OS_ID=$(. /etc/os-release && printf '%s' "${ID:-}${ID_LIKE:+ $ID_LIKE}")
case " $OS_ID " in
    *" debian "* | *" ubuntu "* | *" raspbian "*) ;;
    *) die "unsupported OS '$OS_ID': this script supports Debian, Ubuntu and Raspberry Pi OS (install by hand: docs/operations.md)" ;;
esac
ARCH=$(uname -m)
case "$ARCH" in
    x86_64 | aarch64 | arm64) ;;
    *) die "unsupported architecture $ARCH: x86_64 or arm64 (on a Raspberry Pi, the 64-bit OS)" ;;
esac
command -v "$PYTHON" >/dev/null || die "$PYTHON not found: apt-get install python3 python3-venv (3.11+), or pass --python"
PYTHON=$(command -v "$PYTHON")
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())'); edgegw needs Python 3.11+ (Debian 12, Ubuntu 24.04 and Raspberry Pi OS 12 have it), or pass --python"
# Reuse the venv unless its interpreter is gone (say, after a Python upgrade).
venv_usable() { [ -x "$PREFIX/bin/python" ] && "$PREFIX/bin/python" -c '' 2>/dev/null; }
if ! venv_usable; then
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$PYTHON cannot create a venv: apt-get install python3-venv"
fi
if [ -n "$FROM" ]; then
    [ -e "$FROM" ] || die "--from $FROM: no such file or directory"
    FROM=$(cd "$(dirname "$FROM")" && pwd)/$(basename "$FROM")
fi
if [ ! -e "$CONFIG" ] && [ -z "$REGION" ]; then
    die "first install: --region NAME is needed to write $CONFIG"
fi
say "$OS_ID on $ARCH, $("$PYTHON" -c 'import platform; print("Python", platform.python_version())')"

# ---------------------------------------------------------------- user

if getent passwd "$SERVICE_USER" >/dev/null; then
    say "user $SERVICE_USER exists"
else
    useradd --system --user-group --home-dir "$DATA_DIR" --no-create-home \
        --shell /usr/sbin/nologin --comment "edgegw gateway" "$SERVICE_USER"
    say "created system user $SERVICE_USER"
fi

# ---------------------------------------------------------------- program

if venv_usable; then
    say "upgrading the venv in $PREFIX"
else
    [ ! -e "$PREFIX" ] || [ -f "$PREFIX/pyvenv.cfg" ] \
        || die "$PREFIX exists and is not a venv: choose another --prefix"
    rm -rf "$PREFIX"
    "$PYTHON" -m venv "$PREFIX"
    say "created a venv in $PREFIX"
fi
if [ -n "$FROM" ]; then
    SPEC=$FROM
elif [ -n "$VERSION" ]; then
    SPEC="edgegw==$VERSION"
else
    SPEC=edgegw
fi
PIP=("$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade "$SPEC" \
    || die "pip install $SPEC failed (see above); the previous install, if any, is unchanged or partly upgraded: run again"
if [ -n "$FROM" ]; then
    # A rebuilt wheel or checkout keeps its version number: pip would skip it.
    "${PIP[@]}" --no-deps --force-reinstall "$SPEC" || die "pip install $SPEC failed (see above)"
fi
[ -x "$PREFIX/bin/edgegw" ] || die "$PREFIX/bin/edgegw missing after pip install $SPEC"
# The service runs as $SERVICE_USER: a Python under a private directory (a
# pyenv in /root, say) would install fine and then fail to start.
runuser -u "$SERVICE_USER" -- "$PREFIX/bin/python" -c '' 2>/dev/null \
    || die "user $SERVICE_USER cannot run $PREFIX/bin/python (built from $PYTHON): use a Python every user can reach, e.g. --python /usr/bin/python3"
INSTALLED=$("$PREFIX/bin/python" -c 'from importlib.metadata import version; print(version("edgegw"))')
say "installed edgegw $INSTALLED from $SPEC"

# ---------------------------------------------------------------- config and data

install -d -m 0755 "$CONFIG_DIR"
WROTE_CONFIG=0
if [ -e "$CONFIG" ]; then
    say "kept the existing $CONFIG"
else
    "$PREFIX/bin/edgegw" init --region "$REGION" --config "$CONFIG" --data-dir "$DATA_DIR" >/dev/null
    chown "root:$SERVICE_USER" "$CONFIG"
    chmod 0640 "$CONFIG"
    WROTE_CONFIG=1
    say "wrote a starter config $CONFIG for region $REGION: set the bucket and topics in it"
fi
if [ ! -e "$CONFIG_DIR/env" ]; then
    # systemd reads it as root before dropping privileges: secrets stay root-only.
    install -m 0600 /dev/null "$CONFIG_DIR/env"
    printf '# Secrets for edgegw.service, NAME=value lines, e.g.\n# EDGEGW_BUCKET_SECRET_KEY=...\n# EDGEGW_API_TOKEN=...\n' >"$CONFIG_DIR/env"
    say "wrote $CONFIG_DIR/env (secrets, mode 0600)"
fi
if [ -d "$DATA_DIR" ]; then
    say "kept the existing data directory $DATA_DIR"
else
    install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_USER" "$DATA_DIR"
    say "created the data directory $DATA_DIR"
fi

# ---------------------------------------------------------------- unit

install -d -m 0755 "$UNIT_DIR"
UNIT_TMP=$(mktemp "$UNIT_DIR/.$UNIT_NAME.XXXXXX")
trap 'rm -f "$UNIT_TMP"' EXIT
# StateDirectory= only names directories under /var/lib: dropped for another data dir.
sed -e "s|/opt/edgegw|$PREFIX|g" \
    -e "s|/etc/edgegw|$CONFIG_DIR|g" \
    -e "s|/var/lib/edgegw|$DATA_DIR|g" \
    -e "s|^User=edgegw\$|User=$SERVICE_USER|" \
    -e "s|^Group=edgegw\$|Group=$SERVICE_USER|" \
    "$UNIT_TEMPLATE" >"$UNIT_TMP"
if [ "$DATA_DIR" != /var/lib/edgegw ]; then
    sed -i '/^StateDirectory/d' "$UNIT_TMP"
fi
chmod 0644 "$UNIT_TMP"
if [ -e "$UNIT" ] && cmp -s "$UNIT_TMP" "$UNIT"; then
    say "kept $UNIT (unchanged)"
else
    mv "$UNIT_TMP" "$UNIT"
    say "installed $UNIT"
fi

# ---------------------------------------------------------------- start

if [ "$NO_START" = 1 ]; then
    say "not started (--no-start); to start: systemctl daemon-reload && systemctl enable --now $UNIT_NAME"
elif [ "$WROTE_CONFIG" = 1 ]; then
    # Not with the starter config: its first start claims the region in a bucket
    # inside the data directory, and the gateway then refuses the real bucket
    # (exit 4, "bucket lost") until that data directory is emptied.
    if systemd_running; then systemctl daemon-reload; fi
    say "not started: first edit $CONFIG (bucket, topics) and $CONFIG_DIR/env (keys), then: systemctl enable --now $UNIT_NAME"
elif systemd_running; then
    systemctl daemon-reload
    if systemctl is-active --quiet "$UNIT_NAME"; then
        systemctl restart "$UNIT_NAME"
        say "restarted $UNIT_NAME on edgegw $INSTALLED"
    else
        systemctl enable --now "$UNIT_NAME"
        say "enabled and started $UNIT_NAME"
    fi
    say "check it: systemctl status $UNIT_NAME; journalctl -u $UNIT_NAME"
else
    say "systemd is not running here (a chroot or a container): not started. Where systemd runs: systemctl daemon-reload && systemctl enable --now $UNIT_NAME"
    say "or by hand: runuser -u $SERVICE_USER -- $PREFIX/bin/edgegw serve --config $CONFIG"
fi
