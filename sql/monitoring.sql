-- pgpoll monitoring: how far each logical slot is behind, how much WAL it holds
-- back, and whether it is about to lose (or has lost) the WAL it needs.
--
--   psql "$DSN" -X -f sql/monitoring.sql
--   psql "$DSN" -X -v risk_bytes=536870912 -f sql/monitoring.sql
--
-- Any role can run it (pg_replication_slots and pg_current_wal_lsn() are public).
-- psql variables:
--   risk_bytes  (optional) report slots with less than this much WAL left before
--               max_slot_wal_keep_size invalidates them; default 1 GB.
--
-- Reading the numbers:
--   lag_bytes       WAL written since the slot's confirmed_flush_lsn: what the next
--                   pgpoll run still has to read.
--   retained_bytes  WAL kept on disk for the slot (from its restart_lsn).
--   wal_status      reserved/extended: fine; unreserved: past max_slot_wal_keep_size,
--                   will be invalidated at the next checkpoint; lost: invalidated,
--                   drop and recreate it and re-snapshot the tables.
--   safe_wal_size   WAL that can still be written before the slot is at risk
--                   (NULL: no max_slot_wal_keep_size limit).
-- pgpoll polls through the SQL interface, so its slots are inactive between runs;
-- an inactive slot with a large lag_bytes is a pgpoll job that stopped running.

\if :{?risk_bytes}
\else
\set risk_bytes 1073741824
\endif

\echo == slot lag: confirmed vs current LSN
SELECT slot_name, plugin, database, active,
       confirmed_flush_lsn, pg_current_wal_lsn() AS current_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag_bytes,
       pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)) AS lag,
       restart_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes,
       wal_status, safe_wal_size, pg_size_pretty(safe_wal_size) AS safe_wal,
       age(catalog_xmin) AS catalog_xmin_age
FROM pg_replication_slots
WHERE slot_type = 'logical'
ORDER BY lag_bytes DESC NULLS FIRST, slot_name;

\echo == inactive slots: no consumer connected, WAL they hold back
SELECT slot_name, plugin, database, wal_status,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes,
       pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) AS retained
FROM pg_replication_slots
WHERE NOT active
ORDER BY retained_bytes DESC NULLS FIRST, slot_name;

\echo == slots at risk: unreserved, lost, or close to max_slot_wal_keep_size
SELECT slot_name, plugin, database, wal_status, safe_wal_size,
       CASE WHEN wal_status = 'lost' THEN 'invalidated: drop, recreate and re-snapshot'
            WHEN wal_status = 'unreserved' THEN 'will be invalidated at the next checkpoint: run its consumer now'
            ELSE 'close to max_slot_wal_keep_size: run its consumer or raise the limit' END AS action
FROM pg_replication_slots
WHERE wal_status IN ('unreserved', 'lost')
   OR (safe_wal_size IS NOT NULL AND safe_wal_size < :risk_bytes)
ORDER BY slot_name;

\echo == settings: slot capacity and WAL retention limits
SELECT name, setting, unit
FROM pg_settings
WHERE name IN ('wal_level', 'max_replication_slots', 'max_wal_senders', 'max_slot_wal_keep_size',
               'wal_keep_size', 'logical_decoding_work_mem')
UNION ALL
SELECT 'slots in use', count(*)::text, NULL FROM pg_replication_slots
ORDER BY name;
