"""Use cases as plain functions over hosts, transports and the agent."""
