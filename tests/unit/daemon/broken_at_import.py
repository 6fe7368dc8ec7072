"""A handler module that fails at import (the fork server must still start)."""

raise SystemExit("broken on purpose")
