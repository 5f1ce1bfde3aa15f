#!/usr/bin/env bash
# Serving certificate for fgpu-controller's admission webhooks, signed by a fresh CA.
#
#   hack/webhook-certs.sh <out dir> [SAN ...]     default SANs: IP:127.0.0.1,
#                                                 DNS:fgpu-controller.fgpu-system.svc
# Writes ca.crt, ca.key, tls.crt, tls.key and ca.b64 (the CA as one base64 line, for a
# webhook configuration's caBundle). openssl is installed with apt-get when missing.
set -euo pipefail
out="${1:?usage: webhook-certs.sh <out dir> [SAN ...]}"; shift
sans=("$@")
[ ${#sans[@]} -gt 0 ] || sans=(IP:127.0.0.1 DNS:fgpu-controller.fgpu-system.svc)
if ! command -v openssl >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >&2
fi
mkdir -p "$out"
san="$(IFS=,; echo "${sans[*]}")"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=fgpu-webhook-ca" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=fgpu-controller" \
  -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' "$san" >"$out/ext.cnf"
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days 30 -extfile "$out/ext.cnf" -out "$out/tls.crt" 2>/dev/null
base64 -w0 "$out/ca.crt" >"$out/ca.b64"
rm -f "$out/tls.csr" "$out/ext.cnf" "$out/ca.srl"
chmod 600 "$out/ca.key" "$out/tls.key"
