-- pgpoll least-privilege set-up: a capture role that can use logical replication
-- slots and read the captured tables, and an example publication for pgoutput.
--
-- Run it as a superuser, connected to the database whose tables pgpoll captures:
--
--   psql "postgresql://postgres@db.example.com/appdb" -X \
--        -v role=pgpoll_capture -v password='change-me' -v schema=app \
--        -f sql/least_privilege.sql
--
-- psql variables:
--   role         (required) the login role pgpoll connects as; created, or updated
--                when it exists (running the script again is safe)
--   password     (required) its password
--   schema       (required) the schema whose tables pgpoll captures: the role gets
--                USAGE on it and SELECT on its tables, now and - through default
--                privileges of the schema's owner - on tables created later
--   publication  (optional) the publication pgoutput reads, created here
--                FOR TABLES IN SCHEMA :schema; default pgpoll_<schema>.
--                test_decoding needs no publication.
--
-- Who does what:
--   * Creating a role with REPLICATION needs a superuser (PostgreSQL 16+: also a
--     role with CREATEROLE that has REPLICATION itself).
--   * REPLICATION lets the capture role create, peek, advance and drop logical
--     slots (pgpoll slot ...). It is not a superuser and owns no tables.
--   * The capture role cannot create publications, on purpose: CREATE PUBLICATION
--     ... FOR TABLE needs ownership of every listed table and CREATE on the
--     database; FOR TABLES IN SCHEMA and FOR ALL TABLES need a superuser. So the
--     publication is created here by the superuser, or later by the tables' owner:
--       pgpoll publication create NAME --table 'app.orders (id, total)' ...
--   * Tables published for UPDATE and DELETE need a primary key or another
--     REPLICA IDENTITY, or PostgreSQL refuses those statements on them.
--   * Check the result as the capture role: pgpoll check --dsn 'postgresql://pgpoll_capture@...'

\set ON_ERROR_STOP on

\if :{?role}
\else
DO $$ BEGIN RAISE EXCEPTION 'least_privilege.sql: set the capture role: psql -v role=NAME ...'; END $$;
\endif
\if :{?password}
\else
DO $$ BEGIN RAISE EXCEPTION 'least_privilege.sql: set its password: psql -v password=SECRET ...'; END $$;
\endif
\if :{?schema}
\else
DO $$ BEGIN RAISE EXCEPTION 'least_privilege.sql: set the captured schema: psql -v schema=NAME ...'; END $$;
\endif
\if :{?publication}
\else
\set publication 'pgpoll_' :schema
\endif

BEGIN;

-- The capture role: LOGIN and REPLICATION, nothing else.
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') AS pgpoll_new_role \gset
\if :pgpoll_new_role
CREATE ROLE :"role" LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'password';
\else
ALTER ROLE :"role" LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'password';
\endif

-- Read access to the captured tables (pgpoll's snapshot and catalog queries).
GRANT CONNECT ON DATABASE :"DBNAME" TO :"role";
GRANT USAGE ON SCHEMA :"schema" TO :"role";
GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"role";
SELECT r.rolname AS pgpoll_schema_owner
FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
WHERE n.nspname = :'schema' \gset
ALTER DEFAULT PRIVILEGES FOR ROLE :"pgpoll_schema_owner" IN SCHEMA :"schema" GRANT SELECT ON TABLES TO :"role";

-- The publication pgoutput decodes (made by this superuser; see above).
SELECT NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = :'publication') AS pgpoll_new_publication \gset
\if :pgpoll_new_publication
CREATE PUBLICATION :"publication" FOR TABLES IN SCHEMA :"schema";
\endif

COMMIT;

\echo capture role :role: LOGIN REPLICATION, SELECT on :schema, publication :publication
