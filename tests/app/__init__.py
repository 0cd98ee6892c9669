"""pytest imports this folder as the package `app` (tests/ is its base): its path also lists the
workbench's own app/ of this checkout, so `app.views`, `app.services`… are that code and not the
installed (editable) copy of another checkout."""

from pathlib import Path

__path__.append(str(Path(__file__).resolve().parents[2] / "app"))
