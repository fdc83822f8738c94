# zkEnv.sh of the zookeeper stand-in (zookeeper/Containerfile): Debian's names
# /etc/zookeeper/conf; this one reads ZOOCFGDIR and ZOO_LOG_DIR as upstream's does, and
# logs through log4j (/conf/log4j.properties) as Debian's ZooKeeper does.
ZOOMAIN=org.apache.zookeeper.server.quorum.QuorumPeerMain
ZOOCFGDIR="${ZOOCFGDIR:-/conf}"
ZOOCFG="${ZOOCFG:-$ZOOCFGDIR/zoo.cfg}"
case "$ZOOCFG" in /*) ;; *) ZOOCFG="$ZOOCFGDIR/$ZOOCFG" ;; esac
ZOO_LOG_DIR="${ZOO_LOG_DIR:-/logs}"
ZOO_LOG_FILE="${ZOO_LOG_FILE:-zookeeper.log}"
JAVA=/usr/bin/java
CLASSPATH="$ZOOCFGDIR:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
GREP=grep
