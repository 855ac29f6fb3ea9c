#!/bin/sh
# Installs the Perennial edge agent as a systemd service on this node; run it again to upgrade.
#   sudo ./install.sh --binary ./perennial --cloud-url wss://link.example.com:10000/v1/link \
#        --token-file ./node.token --ca-file ./ca.pem [--node-name NAME] [--bind-port 9100]
# --binary is this node's build, or a folder of builds named perennial-x86_64, perennial-aarch64
# and perennial-armv7, of which it takes this node's (uname -m); a build for another machine is
# refused. Everything is checked before anything is written: a refused install leaves the node as it was.
set -eu

fail() {
    echo "install.sh: $*" >&2
    exit 2
}

# The machine an ELF file is built for, from its header's e_machine (at byte 18, in the byte
# order of byte 5): x86_64, aarch64, arm, ...; nothing when the file is not ELF.
elf_machine() {
    # shellcheck disable=SC2046 # the 20 bytes, one word each
    set -- $(od -An -v -tu1 -N20 "$1" 2>/dev/null)
    [ $# -eq 20 ] && [ "$1.$2.$3.$4" = 127.69.76.70 ] || return 0
    case "$6" in
        1) set -- "$5" $((${19} + 256 * ${20})) ;;
        2) set -- "$5" $((${19} * 256 + ${20})) ;;
        *) return 0 ;;
    esac
    case "$1.$2" in
        2.62) echo x86_64 ;;
        2.183) echo aarch64 ;;
        1.40) echo arm ;;
        1.3) echo i386 ;;
        2.243) echo riscv64 ;;
        *) echo "ELF machine number $2" ;;
    esac
}

binary="" cloud_url="" token_file="" ca_file="" node_name="" bind_port=9100
prefix="${PERENNIAL_INSTALL_ROOT:-}"   # tests install under a scratch root, without systemctl

while [ $# -gt 0 ]; do
    case "$1" in
        --binary | --cloud-url | --token-file | --ca-file | --node-name | --bind-port)
            [ $# -ge 2 ] || fail "$1 needs a value"
            case "$1" in
                --binary) binary="$2" ;;
                --cloud-url) cloud_url="$2" ;;
                --token-file) token_file="$2" ;;
                --ca-file) ca_file="$2" ;;
                --node-name) node_name="$2" ;;
                --bind-port) bind_port="$2" ;;
            esac
            shift 2
            ;;
        -h | --help)
            sed -n '2,7s/^# \{0,1\}//p' "$0"
            exit 0
            ;;
        *) fail "unknown option $1 (see --help)" ;;
    esac
done

[ -n "$binary" ] || fail "--binary is required"
[ -n "$cloud_url" ] || fail "--cloud-url is required"
[ -n "$token_file" ] || fail "--token-file is required"
[ -n "$ca_file" ] || fail "--ca-file is required"
# This node's machine as an ELF header names it, and the name of its build in a folder of builds.
machine="$(uname -m)"
if [ -n "${PERENNIAL_INSTALL_MACHINE:-}" ]; then
    # The tests' stand-in for another node; never on a real install.
    [ -n "$prefix" ] || fail "PERENNIAL_INSTALL_MACHINE is for tests, with PERENNIAL_INSTALL_ROOT"
    machine="$PERENNIAL_INSTALL_MACHINE"
fi
case "$machine" in
    x86_64 | amd64) arch=x86_64 build=x86_64 ;;
    aarch64 | arm64) arch=aarch64 build=aarch64 ;;
    # A 32-bit ARM userland (armv8l: on a 64-bit core). The armv7 build (ARMv7-A, hard float)
    # does not run on ARMv6 boards (Raspberry Pi 1 and Zero): a folder has no build for them.
    armv7l | armv8l) arch=arm build=armv7 ;;
    armv6l) arch=arm build="" ;;
    i386 | i486 | i586 | i686) arch=i386 build="" ;;
    *) arch="$machine" build="" ;;
esac
if [ -d "$binary" ]; then
    folder="$binary"
    [ -n "$build" ] || fail "--binary $folder: this node is $machine, for which Perennial has no build"
    binary="${folder%/}/perennial-$build"
    if [ ! -f "$binary" ]; then
        builds=""
        for file in "${folder%/}"/perennial-*; do
            [ -e "$file" ] && builds="$builds ${file##*/}"
        done
        fail "--binary $folder has no perennial-$build for this node ($machine); it has:${builds:- no perennial-* file}"
    fi
fi
[ -f "$binary" ] && [ -r "$binary" ] || fail "--binary $binary is not a readable file"
built_for="$(elf_machine "$binary")"
[ -n "$built_for" ] || fail "--binary $binary is not an ELF executable (a Linux build of perennial)"
[ "$built_for" = "$arch" ] || fail "--binary $binary is built for $built_for, this node is $machine\
${build:+: install perennial-$build, its build (docs/src/guides/edge-node.md, \"ARM nodes\"), or give --binary a folder of builds}"
case "$cloud_url" in
    *[[:space:]\"\'\\]*) fail "--cloud-url must not hold spaces, quotes or backslashes" ;;
    wss://?*) ;;
    *) fail "--cloud-url must be wss://host:port/v1/link (the link is TLS only)" ;;
esac
[ -s "$token_file" ] && [ -r "$token_file" ] || fail "--token-file $token_file is missing or empty"
[ -s "$ca_file" ] && [ -r "$ca_file" ] || fail "--ca-file $ca_file is missing or empty"
# The node's name as the operator knows it (the Kubernetes node name); default: the host's.
[ -n "$node_name" ] || node_name="$(uname -n)"
case "$node_name" in
    "" | *[!A-Za-z0-9._-]*) fail "--node-name '$node_name' is not a node name" ;;
esac
case "$bind_port" in
    "" | *[!0-9]* | ??????*) fail "--bind-port $bind_port is not a port" ;;
esac
[ "$bind_port" -ge 1 ] && [ "$bind_port" -le 65535 ] || fail "--bind-port $bind_port is not a port"
here="$(cd "$(dirname "$0")" && pwd)"
unit="$here/perennial-edge.service"
[ -f "$unit" ] || fail "$unit is missing: run install.sh from its folder (deploy/edge/)"

install -d -m 0755 "$prefix/usr/local/bin" "$prefix/etc/systemd/system"
install -d -m 0700 "$prefix/etc/perennial" "$prefix/var/lib/perennial"
install -m 0755 "$binary" "$prefix/usr/local/bin/perennial"
install -m 0600 "$token_file" "$prefix/etc/perennial/token"
install -m 0644 "$ca_file" "$prefix/etc/perennial/ca.pem"
umask 077
# A second run (an upgrade) rewrites the settings it owns and keeps every other line the
# operator added (a trust key, S3 keys, a RUST_LOG of their own).
env_file="$prefix/etc/perennial/edge.env"
owned='^(PERENNIAL_CLOUD_URL|PERENNIAL_TOKEN_FILE|PERENNIAL_CA_FILE|PERENNIAL_STATE_DIR|NODENAME|BIND_PORT)='
kept=""
[ -f "$env_file" ] && kept="$(grep -Ev "$owned" "$env_file" || true)"
{
    cat <<ENV
PERENNIAL_CLOUD_URL=$cloud_url
PERENNIAL_TOKEN_FILE=/etc/perennial/token
PERENNIAL_CA_FILE=/etc/perennial/ca.pem
PERENNIAL_STATE_DIR=/var/lib/perennial
NODENAME=$node_name
BIND_PORT=$bind_port
ENV
    if [ -n "$kept" ]; then printf '%s\n' "$kept"; fi
    if ! printf '%s\n' "$kept" | grep -q '^RUST_LOG='; then echo "RUST_LOG=info"; fi
} >"$env_file.new"
mv -f "$env_file.new" "$env_file"
install -m 0644 "$unit" "$prefix/etc/systemd/system/perennial-edge.service"
if [ -z "$prefix" ]; then
    systemctl daemon-reload
    systemctl enable perennial-edge
    # restart, not start: a second run (an upgrade) runs the new binary and settings.
    systemctl restart perennial-edge
    echo "perennial-edge is running: systemctl status perennial-edge"
else
    echo "installed $binary ($built_for) under $prefix (no systemctl)"
fi
