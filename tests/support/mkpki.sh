#!/usr/bin/env bash
# Makes the certificates of the TLS tests in the directory $1 (which must exist), with the
# openssl command line tool. Every key is an EC P-256 key (fast to make); certificates are valid
# for two days from now unless said otherwise.
#
#   ca.crt ca.key              the test CA
#   other-ca.crt               an unrelated CA (a client trusting only it rejects our servers)
#   server.crt server.key      signed by ca: DNS:localhost, IP:127.0.0.1
#   wrongname.crt wrongname.key  signed by ca: DNS:other.invalid only
#   expired.crt expired.key    signed by ca: localhost and 127.0.0.1, valid only in 2020
#   client.crt client.key      signed by ca, for clientAuth (mutual TLS)
#   client-enc.key             the same key as client.key, encrypted with the pass phrase in
#                              client-enc.pass
#
# Exits non-zero when a step fails.
set -euo pipefail
dir=${1:?usage: mkpki.sh DIR}
cd "$dir"

days=2
newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

newkey ca.key
openssl req -x509 -new -key ca.key -out ca.crt -days "$days" -subj "/CN=wxguard test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
newkey other-ca.key
openssl req -x509 -new -key other-ca.key -out other-ca.crt -days "$days" \
  -subj "/CN=wxguard unrelated CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign"

# sign NAME SAN USAGE: a key and a certificate signed by the test CA.
sign() {
  local name=$1 san=$2 usage=$3
  newkey "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "/CN=$name"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$san" "$usage" \
    >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
    -days "$days" -extfile "$name.ext" 2>/dev/null
}
sign server "DNS:localhost,IP:127.0.0.1" serverAuth
sign wrongname "DNS:other.invalid" serverAuth
sign client "DNS:wxguard-client" clientAuth

# An expired certificate needs explicit dates, which only `openssl ca` takes on OpenSSL 3.0.
newkey expired.key
openssl req -new -key expired.key -out expired.csr -subj "/CN=expired"
mkdir -p ca-db
: >ca-db/index.txt
echo 1000 >ca-db/serial
cat >ca-db/ca.cnf <<EOF
[ca]
default_ca = test_ca
[test_ca]
database = ca-db/index.txt
new_certs_dir = ca-db
serial = ca-db/serial
default_md = sha256
policy = any
[any]
commonName = supplied
[server_ext]
subjectAltName = DNS:localhost,IP:127.0.0.1
extendedKeyUsage = serverAuth
basicConstraints = CA:FALSE
EOF
openssl ca -batch -config ca-db/ca.cnf -cert ca.crt -keyfile ca.key -in expired.csr \
  -out expired.crt -startdate 20200101000000Z -enddate 20200102000000Z -notext \
  -extensions server_ext 2>/dev/null

echo "wxguard-test-pass-$$" >client-enc.pass
openssl pkey -in client.key -out client-enc.key -aes256 -passout file:client-enc.pass
chmod 600 ./*.key
