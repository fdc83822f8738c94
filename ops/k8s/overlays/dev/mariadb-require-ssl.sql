-- dev's MariaDB: the user leafpool connects as must use TLS (LEAFPOOL_DATABASE_TLS=true);
-- a client without it is refused. Run once by the image's entrypoint, after it created
-- MARIADB_USER (mariadb.yaml mounts it into /docker-entrypoint-initdb.d).
ALTER USER 'leaf'@'%' REQUIRE SSL;
