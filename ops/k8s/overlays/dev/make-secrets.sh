#!/bin/sh
# Writes the dev overlay's secret env files (secrets/*.env) with random passwords, unless
# they exist (--force: anew), and the dev MariaDB's TLS files (secrets/db-tls/: a throwaway
# CA, the server certificate for the Service name mariadb; openssl), unless they exist.
# Dev only: production Secrets are created by you (README, "Deploy" > "Kubernetes").
set -eu
cd "$(dirname "$0")/secrets"
pw() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }  # letters and digits: URL-safe
umask 077
if [ -e worker.env ] && [ "${1:-}" != "--force" ]; then
  echo "secrets/*.env exist (--force writes new ones)"
else
worker=$(pw); http=$(pw); admin=$(pw); app=$(pw); monitor=$(pw); db=$(pw)
db_url="mysql+pymysql://leaf:$db@mariadb:3306/leaf"
cat > worker.env <<END
LEAFPOOL_REDIS_URL=redis://leafpool-worker:$worker@redis:6379/0
LEAFPOOL_BROKER_URL=redis://leafpool-worker:$worker@redis:6379/1
LEAFPOOL_DATABASE_URL=$db_url
END
cat > http.env <<END
LEAFPOOL_REDIS_URL=redis://leafpool-http:$http@redis:6379/0
LEAFPOOL_DATABASE_URL=$db_url
END
cat > admin.env <<END
LEAFPOOL_REDIS_URL=redis://leafpool-admin:$admin@redis:6379/0
LEAFPOOL_DATABASE_URL=$db_url
END
cat > flower.env <<END
FLOWER_BASIC_AUTH=admin:$(pw)
END
cat > redis-acl.env <<END
LEAFPOOL_ACL_APP_PASSWORD=$app
LEAFPOOL_ACL_WORKER_PASSWORD=$worker
LEAFPOOL_ACL_MONITOR_PASSWORD=$monitor
LEAFPOOL_ACL_HTTP_PASSWORD=$http
LEAFPOOL_ACL_ADMIN_PASSWORD=$admin
END
cat > mariadb.env <<END
MARIADB_PASSWORD=$db
MARIADB_ROOT_PASSWORD=$(pw)
END
echo "wrote $(pwd)/*.env"
fi
# ZooKeeper's login (a file of its own: dev trees made before it get it too)
if [ ! -e zookeeper.env ] || [ "${1:-}" = "--force" ]; then
  printf 'LEAFPOOL_ZK_USERNAME=leafpool\nLEAFPOOL_ZK_PASSWORD=%s\n' "$(pw)" > zookeeper.env
  echo "wrote $(pwd)/zookeeper.env"
fi
# MariaDB's TLS: the CA's key is not kept (no one signs another certificate with it)
if [ ! -e db-tls/tls.key ] || [ "${1:-}" = "--force" ]; then
  command -v openssl >/dev/null || { echo "make-secrets.sh: openssl is needed" >&2; exit 1; }
  rm -rf db-tls && mkdir db-tls && cd db-tls
  ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  openssl req -x509 $ec -keyout ca.key -out ca.crt -days 3650 \
    -subj "/CN=leafpool dev CA" 2>/dev/null
  openssl req $ec -keyout tls.key -out tls.csr -subj "/CN=mariadb" 2>/dev/null
  printf 'subjectAltName=DNS:mariadb\nbasicConstraints=critical,CA:FALSE\n' > tls.ext
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -out tls.crt -extfile tls.ext 2>/dev/null
  rm -f ca.key ca.srl tls.csr tls.ext
  chmod 644 ca.crt tls.crt
  cd ..
  echo "wrote $(pwd)/db-tls/ (ca.crt, tls.crt, tls.key)"
fi
