-- Snowflake worker IDs for LEAFPOOL_SNOWFLAKE_MODE=mysql.
-- The columns, types and index are those of NotFound9's Leaf fork
-- (scripts/leaf_workerid_alloc.sql), so a table that fork already uses works unchanged.
-- Its DROP TABLE is left out on purpose: the table holds the high-water timestamps
-- that keep restarted or recycled worker IDs from repeating IDs.
--
--   id            the worker ID (1..1023; leafpool inserts explicit ids, never above 1023)
--   ip_port       the generator identity (host:celery-node:index), unique
--   ip            its host part
--   port          the claim token of the current holder (every write checks it)
--   max_timestamp the high-water timestamp (ms) of the worker ID
--   update_time   the lease: renewed by the holder, NULL after a clean release;
--                 older than LEAFPOOL_SNOWFLAKE_LEASE_SECONDS means recyclable
CREATE TABLE IF NOT EXISTS `leaf_workerid_alloc` (
  `id` bigint(20) NOT NULL AUTO_INCREMENT,
  `ip` varchar(127) DEFAULT NULL,
  `port` varchar(127) DEFAULT NULL,
  `ip_port` varchar(127) NOT NULL,
  `max_timestamp` bigint(20) DEFAULT NULL,
  `create_time` timestamp NULL DEFAULT NULL,
  `update_time` timestamp NULL DEFAULT NULL ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (`id`),
  UNIQUE KEY `idx_ipport` (`ip_port`) USING BTREE
) ENGINE=InnoDB AUTO_INCREMENT=0;
