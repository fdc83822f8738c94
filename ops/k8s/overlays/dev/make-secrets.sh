#!/bin/sh
# Writes the dev overlay's secret env files (secrets/*.env) with random passwords, unless
# they exist (--force: anew). Dev only: production Secrets are created by you
# (README, "Deploy" > "Kubernetes").
set -eu
cd "$(dirname "$0")/secrets"
if [ -e worker.env ] && [ "${1:-}" != "--force" ]; then
  echo "secrets/*.env exist (--force writes new ones)"; exit 0
fi
pw() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }  # letters and digits: URL-safe
umask 077
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
