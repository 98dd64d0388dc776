"""Write a JSON file whole: a reader (or a run stopped mid-write) never sees half of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any, **options: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file renamed over it.

    ``options`` go to ``json.dumps`` (default ``indent=2``).
    """
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, **{"indent": 2, **options}))
    os.replace(temporary, path)
