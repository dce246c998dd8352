"""The click CLI: thin commands over ``orchestrator.core``; the one place errors become exit codes."""
