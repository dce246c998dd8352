"""GPU and host health (stdlib only; pynvml/psutil optional): probes, verdicts, watchdog
checks, VRAM zombie reaper. Shipped to hosts inside the agent zipapp."""
