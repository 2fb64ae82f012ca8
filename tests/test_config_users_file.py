"""``:auth: users_file``: API users kept in a file of their own (a mounted Secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmpool.config import ConfigError, load_config
from vmpool.state.tokens import hash_password, verify_password

from clihelp import assert_one_line_error, run

POOLS = """
:pools:
  - {name: deb, template: deb, provider: simulated}
"""


def _config(tmp_path: Path, auth: str) -> Path:
    path = tmp_path / "vmpool.yaml"
    path.write_text(POOLS + ":auth:\n" + auth)
    return path


def test_users_of_the_file_join_those_of_the_config(tmp_path: Path) -> None:
    """Proves: the file's users are loaded (relative to the config's directory) and
    added to :auth: users; their hashes verify the passwords they were made from."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "users.yaml").write_text(
        f"ci: {hash_password('ci-pass', iterations=1000)}\n"
    )
    path = _config(
        tmp_path,
        f"  users: {{admin: {hash_password('a', iterations=1000)}}}\n"
        "  users_file: secret/users.yaml\n",
    )
    auth = load_config(path).auth
    assert auth is not None
    assert sorted(auth.users) == ["admin", "ci"]
    assert verify_password("ci-pass", auth.users["ci"])


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "cannot read"),
        ("ci: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "must map user names"),
        ("ci: plaintext-password\n", "user ci"),
        ("admin: {hash}\n", "also in auth.users: admin"),
    ],
)
def test_a_bad_users_file_is_one_config_error(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    """Proves: a missing, malformed or conflicting file is one line naming the file
    and the problem (`vmpool config check` exits 2), and no password text leaks."""
    digest = hash_password("a", iterations=1000)
    if content is not None:
        (tmp_path / "users.yaml").write_text(content.replace("{hash}", digest))
    path = _config(tmp_path, f"  users: {{admin: {digest}}}\n  users_file: users.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "auth.users_file" in str(err.value) and fragment in str(err.value)
    assert "plaintext-password" not in str(err.value)
    assert_one_line_error(run("config", "check", "--config", str(path)), "users_file", fragment)
