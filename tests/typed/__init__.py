"""Tests of pgpoll.typed."""
