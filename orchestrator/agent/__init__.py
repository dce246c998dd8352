"""The on-host agent: a detached daemon, a SQLite job store and the verbs the CLI calls.

Stdlib only (Python >= 3.8): this package is shipped to GPU boxes inside a zipapp and must
import without click, fabric, yaml or boto3. ``AGENT_VERSION`` changes whenever the agent's
behaviour does; ``ensure`` restarts a daemon whose version differs.
"""

AGENT_VERSION = "0.1.0-a1"
