-- leafpool's own: a segment tag's guard (see ../mysql/leafpool_tag_guard.sql).
CREATE TABLE IF NOT EXISTS leafpool_tag_guard (
  biz_tag varchar(128) NOT NULL,
  guard_schema varchar(64) DEFAULT NULL,
  guard_table varchar(64) NOT NULL,
  guard_column varchar(64) NOT NULL,
  update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (biz_tag)
);
