-- leafpool's own: a segment tag's guard, the application's column holding the IDs it
-- stored (`leafpool tag add TAG --guard TABLE.COLUMN`, `leafpool tag guard`). Read as
-- SELECT MAX(guard_column) FROM guard_schema.guard_table when Redis holds no mark for
-- the tag and before a heal: the next range starts above it. Names, never SQL text.
CREATE TABLE IF NOT EXISTS `leafpool_tag_guard` (
  `biz_tag` varchar(128) NOT NULL,
  `guard_schema` varchar(64) DEFAULT NULL,
  `guard_table` varchar(64) NOT NULL,
  `guard_column` varchar(64) NOT NULL,
  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
  PRIMARY KEY (`biz_tag`)
) ENGINE=InnoDB;
