"""The default SQLite database, and any relative SQLite path, names one file: it is made
absolute against the folder the process starts in, when the settings are read, so an
app and the workers it starts (or that are given its settings) use the same file."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import Settings, child_environment


def test_the_default_is_absolute_against_the_folder_the_process_starts_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTSTATE_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    assert settings.database_url == f"sqlite:///{tmp_path}/agentstate.db"
    monkeypatch.chdir("/")  # a later change of folder changes nothing already read
    assert settings.database_url == f"sqlite:///{tmp_path}/agentstate.db"
    assert child_environment(settings)["AGENTSTATE_DATABASE_URL"] == settings.database_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///data/app.db", "sqlite:///{cwd}/data/app.db"),
        ("sqlite:///../up.db", "sqlite:///{parent}/up.db"),
        ("sqlite:////srv/app.db", "sqlite:////srv/app.db"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite://", "sqlite://"),
        ("sqlite:///file:app.db?mode=ro&uri=true", "sqlite:///file:app.db?mode=ro&uri=true"),
        ("postgresql+psycopg2://u@h/d", "postgresql+psycopg2://u@h/d"),
    ],
)
def test_relative_sqlite_paths_are_made_absolute_and_nothing_else_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, expected: str
) -> None:
    folder = tmp_path / "app"
    folder.mkdir()
    monkeypatch.chdir(folder)
    url = Settings(database_url=given).database_url
    assert url == expected.format(cwd=folder, parent=tmp_path)


def test_a_relative_path_in_a_secret_file_is_made_absolute_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "database_url"
    secret.write_text("sqlite:///state.db\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTSTATE_DATABASE_URL", raising=False)
    settings = Settings(database_url_file=str(secret))
    assert settings.database_url == f"sqlite:///{tmp_path}/state.db"
