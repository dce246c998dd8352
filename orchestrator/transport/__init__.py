"""Transports: how the controller runs commands and moves files on a host (local or SSH)."""
