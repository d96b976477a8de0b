"""The dashboard's files: Jinja2 templates and static CSS and JavaScript, package data
served by service/api/ui.py. The pages are shells; their scripts read the REST API with
the same bearer token as any client."""

from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
