"""PostgreSQL side: connections, slots, publications, catalog queries. The only package that talks to the server."""
