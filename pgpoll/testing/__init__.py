"""Test support: throwaway PostgreSQL clusters and the pytest plugin that serves them."""
