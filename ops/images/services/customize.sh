#!/bin/sh
# mmdebstrap's --customize-hook for the services root filesystem; $1 is its directory.
set -eu
# zkServer.sh, zkCli.sh and zkEnv.sh from Debian's zookeeper package, without the package
chroot "$1" sh -c 'cd /tmp && apt-get download -q zookeeper >/dev/null &&
  dpkg-deb --fsys-tarfile zookeeper_*.deb | tar -x -C / ./usr/share/zookeeper/bin &&
  rm zookeeper_*.deb'
# the database mariadb-server's postinst initialized: the image's entrypoint makes its own
rm -rf "$1"/var/lib/mysql/*
