"""docker-compose.yml and the Dockerfile name commands and files that exist."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from service.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_every_compose_command_is_a_comera_command():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    runner = CliRunner()
    seen = set()
    for name, svc in compose["services"].items():
        cmd = svc.get("command")
        if not cmd or cmd[0] != "comera":
            continue
        result = runner.invoke(app, [cmd[1], "--help"])
        assert result.exit_code == 0, (name, result.output)
        for opt in (c for c in cmd[2:] if c.startswith("--")):
            assert opt in result.output, (name, opt)
        seen.add(cmd[1])
        if "build" in svc:
            env = svc["environment"]
            assert env["COMERA_DATABASE_URL"].startswith("postgresql://")
            assert env["COMERA_BROKER_URL"].startswith("redis://")
    assert seen == {"migrate", "api", "worker"}


def test_dockerfile_copies_every_package_it_installs():
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("engine", "api_schemas", "service", "worker", "migrations"):
        assert f"COPY {pkg} ./{pkg}" in text
        assert (ROOT / pkg).is_dir()
