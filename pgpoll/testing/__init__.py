"""Test support: throwaway PostgreSQL clusters, a real PgBouncer in front of them, and the pytest plugin that serves both."""
