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


def test_the_commented_multi_gpu_worker_runs_when_uncommented():
    """The example ``worker-2gpu`` service: valid compose once uncommented, a ``comera worker``
    command line, and a reservation of as many GPUs as it has devices."""
    lines, inside = [], False
    for line in (ROOT / "docker-compose.yml").read_text().splitlines():
        inside = line == "  # worker-2gpu:" or (inside and line.startswith("  #   "))
        lines.append("  " + line[4:] if inside else line)
    svc = yaml.safe_load("\n".join(lines))["services"]["worker-2gpu"]
    cmd = svc["command"]
    result = CliRunner().invoke(app, [cmd[1], "--help"])
    assert cmd[:2] == ["comera", "worker"] and result.exit_code == 0
    assert all(opt in result.output for opt in cmd[2:] if opt.startswith("--"))
    devices = int(cmd[cmd.index("--devices") + 1])
    [gpus] = svc["deploy"]["resources"]["reservations"]["devices"]
    assert len(gpus["device_ids"]) == devices and gpus["capabilities"] == ["gpu"]
    assert svc["environment"]["COMERA_BROKER_URL"].startswith("redis://")


def test_dockerfile_copies_every_package_it_installs():
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("engine", "api_schemas", "service", "worker", "migrations"):
        assert f"COPY {pkg} ./{pkg}" in text
        assert (ROOT / pkg).is_dir()
