#!/bin/sh
# Installs the Perennial edge agent as a systemd service on this node.
#   sudo ./install.sh --binary ./perennial --cloud-url wss://link.example.com:10000/v1/link \
#        --token-file ./node.token --ca-file ./ca.pem [--node-name NAME] [--bind-port 9100]
set -eu

binary="" cloud_url="" token_file="" ca_file="" node_name="$(hostname)" bind_port=9100
prefix="${PERENNIAL_INSTALL_ROOT:-}"   # tests install under a scratch root

while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --cloud-url) cloud_url="$2"; shift 2 ;;
        --token-file) token_file="$2"; shift 2 ;;
        --ca-file) ca_file="$2"; shift 2 ;;
        --node-name) node_name="$2"; shift 2 ;;
        --bind-port) bind_port="$2"; shift 2 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
for required in binary cloud_url token_file ca_file; do
    eval "value=\$$required"
    if [ -z "$value" ]; then
        echo "install.sh: --$(echo "$required" | tr _ -) is required" >&2
        exit 2
    fi
done
case "$cloud_url" in wss://*) ;; *) echo "install.sh: --cloud-url must be wss:// (the link is TLS only)" >&2; exit 2 ;; esac
[ -s "$token_file" ] || { echo "install.sh: --token-file $token_file is missing or empty" >&2; exit 2; }
[ -s "$ca_file" ] || { echo "install.sh: --ca-file $ca_file is missing or empty" >&2; exit 2; }

here="$(cd "$(dirname "$0")" && pwd)"
install -d -m 0755 "$prefix/usr/local/bin" "$prefix/etc/systemd/system"
install -d -m 0700 "$prefix/etc/perennial" "$prefix/var/lib/perennial"
install -m 0755 "$binary" "$prefix/usr/local/bin/perennial"
install -m 0600 "$token_file" "$prefix/etc/perennial/token"
install -m 0644 "$ca_file" "$prefix/etc/perennial/ca.pem"
umask 077
cat > "$prefix/etc/perennial/edge.env" <<ENV
PERENNIAL_CLOUD_URL=$cloud_url
PERENNIAL_TOKEN_FILE=/etc/perennial/token
PERENNIAL_CA_FILE=/etc/perennial/ca.pem
PERENNIAL_STATE_DIR=/var/lib/perennial
NODENAME=$node_name
BIND_PORT=$bind_port
RUST_LOG=info
ENV
install -m 0644 "$here/perennial-edge.service" "$prefix/etc/systemd/system/perennial-edge.service"
if [ -z "$prefix" ]; then
    systemctl daemon-reload
    systemctl enable --now perennial-edge
    echo "perennial-edge is running: systemctl status perennial-edge"
else
    echo "installed under $prefix (no systemctl)"
fi
